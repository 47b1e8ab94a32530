/* attempt_review: an operator's decision on an attempt that automation left
 * in REQUIRES_REVIEW: it was charged (SUCCEEDED, as intent PI) or it was not
 * (FAILED). The provider is asked first; nothing is written unless it agrees
 * or the operator overrides it with force, and what it said goes into the
 * transition's evidence. A SUCCEEDED decision also asks whose intent it is
 * (common/core/ownership): it books unforced only an intent proven the
 * attempt's (the id recorded from its own call, or the answer to that call
 * under its key). One charged recorded for another attempt, or whose
 * metadata names another attempt or another order, is foreign; one that
 * only names the attempt is unproven (anyone may have made it, and the
 * attempt's own call may have charged too): both refused unless forced.
 * One booked for another attempt is refused even then. The attempt id is
 * taken in either case and used in lower case, as charged writes it into
 * the provider's metadata. `chargectl attempt resolve` and the console
 * both decide through here, so that a review settles the same way wherever
 * an operator sits. An authorization (capture_method manual) is refused
 * (NOT_IN_REVIEW, its message naming its own review,
 * authorize/authorization_review.h).
 *
 *   struct attempt_review_request rq = {.attempt_id = id, .intent_id = pi,
 *                                       .reason = why, .actor = who};
 *   struct attempt_review_result res;
 *   attempt_review_resolve(conn, st, pc, lag_ms, retention_ms, &rq, &res);
 *   ... res.outcome, res.message ...
 *   attempt_review_result_clear(&res);
 */
#ifndef CHARGED_ATTEMPT_REVIEW_H
#define CHARGED_ATTEMPT_REVIEW_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "attempt_store.h"
#include "provider_client.h"

#define ATTEMPT_REVIEW_MAX_ACTOR  128
#define ATTEMPT_REVIEW_MAX_REASON 1000
/* The reason of a SUCCEEDED decision given none. */
#define ATTEMPT_REVIEW_DEFAULT_REASON "resolved by operator"

enum attempt_review_outcome {
    ATTEMPT_REVIEW_RESOLVED = 0,
    ATTEMPT_REVIEW_NOT_FOUND,        /* no such attempt */
    ATTEMPT_REVIEW_NOT_IN_REVIEW,    /* not REQUIRES_REVIEW: status says what */
    ATTEMPT_REVIEW_BOOKED_ELSEWHERE, /* the intent pays another attempt:
                                        other_attempt says which (force
                                        cannot override it) */
    ATTEMPT_REVIEW_REFUSED,          /* the provider contradicts, does not
                                        answer or may not be up to date, or
                                        the intent is another's (verdict
                                        "foreign") or not proven the
                                        attempt's ("unproven"): verdict and
                                        provider_says; force overrides it */
    ATTEMPT_REVIEW_BUSY,             /* another session holds the row now:
                                        nothing written, run again */
    ATTEMPT_REVIEW_CHANGED,          /* resolved or moved by someone else while
                                        the provider was asked: status says
                                        what it is now; nothing written */
    ATTEMPT_REVIEW_ERROR,            /* database unreachable, out of memory,
                                        the database refused: message */
    ATTEMPT_REVIEW_WITHDRAWN,        /* still_allowed said no once the provider
                                        had answered: nothing written */
};

struct attempt_review_request {
    const char *attempt_id; /* a UUID, in either case */
    const char *intent_id;  /* SUCCEEDED as this intent; NULL: FAILED */
    const char *reason;     /* required for FAILED; NULL: "resolved by operator"
                               (ATTEMPT_REVIEW_DEFAULT_REASON) */
    const char *actor;      /* who decides: the transition's actor */
    int force;              /* resolve although the provider objects */
    /* Asked after the provider answered, right before the decision is
     * written (the provider may take seconds): whether the actor may still
     * decide, say a console session not revoked meanwhile. NULL: yes. */
    int (*still_allowed)(void *ctx);
    void *ctx;
};

struct attempt_review_result {
    enum attempt_review_outcome outcome;
    const char *verdict;     /* "agrees", "search_may_lag", "no_answer",
                                "unproven", "foreign", "contradicts"
                                (static); NULL when the provider was not
                                asked */
    char provider_says[512]; /* what the provider says when it objects, or "" */
    int forced;              /* resolved over the provider's objection */
    char status[20];         /* resolved: the new status; otherwise the
                                attempt's status as last read ("" unknown) */
    /* The intent of a resolution, or the one recorded on the attempt. */
    char provider_payment_id[PROVIDER_ID_MAX];
    char other_attempt[40]; /* BOOKED_ELSEWHERE: that attempt */
    json_t *evidence;       /* resolved: the transition's evidence */
    char message[768];      /* one line for people, whatever the outcome
                               (REFUSED: "refused: " and what the
                               provider says) */
};

/* Checks a request before anything is asked: a UUID attempt id, an intent id
 * of letters, digits and '_', a reason for FAILED, reason and actor 1..max
 * bytes of UTF-8 on one line. 0, or -1 with one line in why, which begins
 * with the field it faults ("attempt id ", "intent id ", "reason ",
 * "actor "), so that a caller may name the field in its own terms. */
int attempt_review_check(const struct attempt_review_request *rq, char *why,
                         size_t why_size);

/* Whether the provider's look-up r of intent PI (answered: not UNKNOWN,
 * NOT_EXECUTED or INVALID) shows PI paying an attempt of amount and
 * currency: succeeded, of exactly that amount (0, or none given, is not
 * it), in that currency (when the look-up carries one), its metadata
 * naming no other attempt than attempt_id (in either case). 0, or -1 with
 * what the provider says in says. Pure. */
int attempt_review_intent_pays(const struct provider_result *r, const char *intent,
                               const char *attempt_id, long long amount,
                               const char *currency, char *says, size_t says_size);

/* Reads the attempt on conn, asks the provider through pc, and settles
 * through st (attempt_store_settle: expected REQUIRES_REVIEW, cause
 * operator, no lease), the look-ups logged as provider calls (with the
 * settlement: a refusal writes nothing). A search is no evidence of
 * absence until the attempt's last call is search_lag_ms old
 * (RECONCILER_SEARCH_LAG_MS; on the database's clock), and not alone even
 * then: FAILED also walks the provider's consistent list of intents over
 * the window the attempt's key could have been used in (key_retention_ms,
 * WORKER_KEY_RETENTION_MS), as the reconciler does before it calls an
 * attempt never executed. No transaction is open while the provider is
 * asked: conn must be outside one (else ERROR). The request is checked as
 * attempt_review_check does (ERROR with its why). Returns 0 with *out
 * filled (every outcome, ERROR too, has a message), -1 only when out is
 * NULL; call attempt_review_result_clear after. */
int attempt_review_resolve(PGconn *conn, attempt_store_t *st, provider_client_t *pc,
                           long long search_lag_ms, long long key_retention_ms,
                           const struct attempt_review_request *rq,
                           struct attempt_review_result *out);

/* Frees what a result holds; a no-op on a cleared one. */
void attempt_review_result_clear(struct attempt_review_result *r);

#endif
