/* refund_review: an operator's decision on a refund that automation could
 * not settle (REQUIRES_REVIEW, or UNKNOWN past what the reconciler can
 * tell): it was refunded (SUCCEEDED, under the provider's refund id) or it
 * was not (FAILED). Written as every writer of refunds writes (the row
 * locked and moved from the status it was read in, a refund_transitions
 * row with cause operator and the actor, its result event through the
 * shared refund SQL); the refund_attempts_money trigger applies the money.
 * A SUCCEEDED decision for a refund whose amount is no longer reserved on
 * its charge (a review after a refusal) reserves it first, in the same
 * transaction, and only while the charge's refunds stay within it.
 *
 * A SUCCEEDED decision books the provider's refund for this refund, so it
 * must be proven this refund's (common/core/ownership, under the row
 * lock): on this refund's charge's intent, not recorded for another
 * refund, and (unless forced) the id recorded from the refund's own call
 * or the answer to it under its key. One that only names this refund in
 * its metadata is unproven: anyone may have made it, and the refund's own
 * call may have refunded the charge too; only force books it, on the
 * operator's word. A refund on another charge's intent is that charge's
 * money: force never books it.
 *
 * Either decision is refused (unless forced) while a call under the
 * refund's key may still execute: while its lease is live (a worker or
 * reconciler may be calling now), or while the last call under the key is
 * younger than key_kept_ms (the provider may still execute a request it
 * holds; the reconciler settles those on evidence). Both on the database's
 * clock. */
#ifndef CHARGED_REFUND_REVIEW_H
#define CHARGED_REFUND_REVIEW_H

#include <libpq-fe.h>

#include "attempt_status.h"
#include "store.h"

struct refund_review_decision {
    const char *refund_id;        /* a UUID, in either case */
    enum attempt_status expected; /* the status it was read in */
    enum attempt_status status;   /* SUCCEEDED or FAILED */
    const char *actor;
    const char *reason;             /* why: the transition's, and a FAILED
                                       refund's own */
    const char *provider_refund_id; /* re_...: required for SUCCEEDED; NULL */
    const char *evidence_json;      /* the transition's evidence */
    /* SUCCEEDED: the provider's refund as the provider shows it: the intent
     * it is on, its metadata[refund_id] and metadata[payment_attempt_id]
     * (NULL or "": none, or not shown). Without the intent only a forced
     * decision books it. */
    const char *object_payment_intent;
    const char *object_refund_meta;
    const char *object_attempt_meta;
    /* How long after the last call under a key the provider may still
     * execute it (WORKER_KEY_RETENTION_MS): no decision is taken before,
     * unless forced. */
    long long key_kept_ms;
    int force;
};

/* What REFUND_REVIEW_EXCEEDS says a refund's bound is, in an operator's
 * words: a charge's amount, an authorization's captured amount (issue 37;
 * here, so that chargectl names no operation). */
#define REFUND_REVIEW_EXCEEDS_BOUND "amount (an authorization's: what its capture took)"

enum refund_review_outcome {
    REFUND_REVIEW_RESOLVED = 0,
    REFUND_REVIEW_NOT_FOUND,     /* no such refund */
    REFUND_REVIEW_CHANGED,       /* not in `expected` any more: nothing written */
    REFUND_REVIEW_EXCEEDS,       /* SUCCEEDED would refund past the charge */
    REFUND_REVIEW_OTHER_REFUND,  /* another provider refund id is recorded on
                                    it, or this one is another refund's */
    REFUND_REVIEW_LEASED,        /* while someone holds its lease */
    REFUND_REVIEW_MAY_EXECUTE,   /* while its key is young */
    REFUND_REVIEW_FOREIGN,       /* SUCCEEDED with a refund on another intent
                                    than the charge's: force cannot book it */
    REFUND_REVIEW_NAMES_ANOTHER, /* SUCCEEDED with a refund whose metadata
                                    names another refund or attempt; force
                                    overrides */
    REFUND_REVIEW_UNPROVEN,      /* SUCCEEDED, not forced, with a refund not
                                    proven this refund's: it only names it, or
                                    nothing shows the intent it is on */
};

/* Applies d in one transaction on conn (which is left outside any
 * transaction). CHARGED_OK with *out (FOREIGN, NAMES_ANOTHER and UNPROVEN
 * with one line in why, which must hold a byte at least); CHARGED_WAIT when another
 * session held the refund or its charge past a 2 s lock_timeout; anything else with err
 * (nothing written). */
enum charged_rc refund_review_resolve(PGconn *conn,
                                      const struct refund_review_decision *d,
                                      enum refund_review_outcome *out, char *why,
                                      size_t why_size, struct charged_error *err);

#endif
