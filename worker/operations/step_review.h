/* step_review: an operator's decision on a step of an authorization (a
 * capture or a void, issue 37) that automation left in REQUIRES_REVIEW:
 * it did what it was asked (SUCCEEDED) or it did not (FAILED). Written once
 * for both kinds; each kind says how to read its row, what the provider's
 * evidence must show for each decision and how a decision is written
 * (capture/capture_review.h, void/void_review.h), and what holds the
 * intent; what the kinds write alike (the load's key age, the lists,
 * --help's words) is the authorization's (authorize/authorization_steps.h):
 * this file names no operation (issue 37).
 *
 * As an attempt's and a refund's review: the request is checked as
 * attempt_review_check does; the provider is asked first, outside any
 * transaction, for the authorization's intent by the id charged recorded
 * (never metadata): its status, amount_received, amount_capturable and
 * cancellation_reason. A decision the evidence contradicts, or that the
 * provider did not answer, is refused and nothing is written, unless
 * forced; the evidence then says so. A resolution is one transaction on
 * the step's locked row (2 s lock_timeout): the look-up as a provider
 * call of the step, the step, its authorization (moved or given back its
 * hold, through the kind's shared writers), the transitions with cause
 * operator and the actor, the result events. */
#ifndef CHARGED_STEP_REVIEW_H
#define CHARGED_STEP_REVIEW_H

#include <stddef.h>

#include <jansson.h>

#include "attempt_status.h"
#include "provider_client.h"
#include "store.h"
#include "store_conn.h"

#define STEP_REVIEW_MAX_REASON 1000

enum step_review_outcome {
    STEP_REVIEW_RESOLVED = 0,
    STEP_REVIEW_NOT_FOUND,     /* no such step */
    STEP_REVIEW_NOT_IN_REVIEW, /* not REQUIRES_REVIEW: status says what */
    STEP_REVIEW_REFUSED,       /* the provider contradicts or did not answer:
                                  verdict and provider_says; force overrides */
    STEP_REVIEW_BUSY,          /* leased, or another session holds the row:
                                  nothing written, run again */
    STEP_REVIEW_CHANGED,       /* the step, or its authorization, is not what
                                  the decision needs any more: message says
                                  what; nothing written */
    STEP_REVIEW_ERROR,         /* bad request, database unreachable or
                                  refusing, out of memory: message */
    STEP_REVIEW_WITHDRAWN,     /* still_allowed said no once the provider
                                  had answered: nothing written */
};

struct step_review_request {
    const char *id;               /* the step's UUID, in either case */
    enum attempt_status decision; /* one of the kind's decisions */
    const char *reason;           /* required: why */
    const char *actor;            /* who decides */
    int force;                    /* resolve although the provider objects */
    /* How long after the last call under a key the provider may still
     * execute it (WORKER_KEY_RETENTION_MS): no decision before, unless
     * forced, as a refund's review. 0: no wait. */
    long long key_kept_ms;
    /* Asked after the provider answered, right before the decision is
     * written: whether the actor may still decide (a console session not
     * revoked meanwhile). NULL: yes. */
    int (*still_allowed)(void *ctx);
    void *ctx;
};

/* The step as read before the provider is asked. */
struct step_review_row {
    char id[37];
    char attempt_id[37];
    char status[20];
    char attempt_status[20]; /* its authorization's */
    char payment_intent[PROVIDER_ID_MAX];
    long long asked;      /* a capture's amount asked; 0: all (void: 0) */
    long long authorized; /* the authorization's amount */
    int holds;            /* the step holds its authorization */
    int leased;           /* a live lease: someone may be calling now */
    long long key_age_ms; /* since its newest call under its key; -1 none */
};

struct step_review_result {
    enum step_review_outcome outcome;
    const char *verdict; /* "agrees", "contradicts", "no_answer"; NULL:
                            not asked */
    char provider_says[640];
    int forced;
    char status[20];  /* the step's new status, or as last read */
    json_t *evidence; /* resolved: the transitions' evidence */
    char message[1024];
};

/* One of a kind's decisions as the console offers it: "SUCCEEDED: the
 * provider captured it". */
struct step_review_choice {
    enum attempt_status decision;
    const char *says; /* after the status's name */
};

/* What one kind does. load_sql: $1 the id; one row of id,
 * payment_attempt_id, status, the authorization's status, payment_intent,
 * asked, authorized, holds, leased. judge: pure, the verdict on the
 * provider's answer r (answered) for decision, says filled when not
 * "agrees". write: inside the open transaction, the decision with the
 * amount the provider showed captured (r->amount_received, or what a forced
 * decision takes when it showed nothing); *moved 1 when the step moved,
 * else why names what stood in the way. */
struct step_review_kind {
    const char *noun; /* "capture", "void", "authorization": chargectl's command */
    /* What holds the intent the provider is asked about ("authorization":
     * a step's, or the authorization's own), in the message when none is
     * recorded; and the evidence's member of its status at the decision
     * ("authorization_status"). */
    const char *holder;
    const char *holder_status_key;
    unsigned decisions; /* the statuses it may be resolved to: bit 1u << status */
    const char *load_sql;
    /* stmt_log_calls' statement writing a look-up as a call of the step
     * (SQL_STEP_LOG_CALLS, attempt_store_log_calls_sql): with the
     * decision, in its transaction; a refusal writes nothing. */
    const char *log_calls_sql;
    const char *(*judge)(const struct provider_result *r, enum attempt_status decision,
                         const struct step_review_row *row, char *says, size_t size);
    enum charged_rc (*write)(store_conn_t *db, const struct step_review_request *rq,
                             const struct step_review_row *row,
                             const struct provider_result *r, const char *evidence,
                             int *moved, char *why, size_t why_size,
                             struct charged_error *err);

    /* `chargectl <noun> list|resolve` (worker/chargectl/ctl_step.c). */
    const char *id_key;  /* its id's name: "capture_id" */
    const char *summary; /* its line of `chargectl --help` */
    /* Its place among the reviews' lines of `chargectl --help` (the order
     * they were added in, not the table's). */
    int cli_rank;
    /* What --help says of the provider's look-up, after the decisions. */
    const char *cli_asks;
    /* list: $1 a status (NULL: any), $2 the limit; one row, a JSON array
     * of rows most recently updated first, shown as the columns heads and
     * members (NULL-ended; STEP_REVIEW_LIST_HEADS). */
    const char *list_sql;
    const char *const *heads;
    const char *const *members;

    /* The console's review queue (worker/roles/console_views.c): its part,
     * a SELECT of its records in REQUIRES_REVIEW as (kind, id,
     * payment_attempt_id, status, amount, currency, authorization_status,
     * provider_payment_id, reason, updated_at), joined to the others' by
     * UNION ALL; and whether its records are payment attempts (the
     * attempts' queue leaves those to it). */
    const char *queue_sql;
    int attempts;
    /* The console's choices of a decision, in the order it offers them
     * (each one of decisions), ended by one whose says is NULL. */
    const struct step_review_choice *choices;
};

/* An RFC 3339 UTC time of a column. */
#define STEP_REVIEW_TS(col)                                                            \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* Resolves rq on database_url (a session of its own, closed after) through
 * pc. Returns 0 with *out filled (every outcome has a message), -1 only
 * when out is NULL; call step_review_result_clear after. */
int step_review_resolve(const struct step_review_kind *k, const char *database_url,
                        provider_client_t *pc, const struct step_review_request *rq,
                        struct step_review_result *out);

void step_review_result_clear(struct step_review_result *r);

/* The kind's decisions, named: "SUCCEEDED or FAILED" (static or in buf). */
const char *step_review_decisions(const struct step_review_kind *k, char *buf,
                                  size_t size);

/* Whether the answer r is one the provider gave about the intent (not a
 * refused, lost or not-found look-up). */
int step_review_answered(const struct provider_result *r);

#endif
