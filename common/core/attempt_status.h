/* attempt_status: the one vocabulary of payment attempt states.
 *
 * Names, the live set (what the one-live-attempt-per-order index counts)
 * and the transitions that are allowed are defined here and nowhere else:
 * SQL texts splice the names in with ATTEMPT_SQL(NAME) (a misspelt name does
 * not compile) and pass the live set as an array parameter; programs print
 * and parse names through attempt_status_name / _parse. A test compares
 * this with the migration's CHECK list and index predicate. */
#ifndef CHARGED_ATTEMPT_STATUS_H
#define CHARGED_ATTEMPT_STATUS_H

enum attempt_status {
    ATTEMPT_STATUS_PENDING = 0,     /* recorded, not sent */
    ATTEMPT_STATUS_PROCESSING,      /* claimed, call in flight, or the provider
                                       said processing */
    ATTEMPT_STATUS_UNKNOWN,         /* sent, outcome not known */
    ATTEMPT_STATUS_SUCCEEDED,       /* the provider confirmed the charge */
    ATTEMPT_STATUS_FAILED,          /* refused, or certainly never happened */
    ATTEMPT_STATUS_REJECTED,        /* refused before any provider call */
    ATTEMPT_STATUS_REQUIRES_REVIEW, /* a human decides */
    ATTEMPT_STATUS_AUTHORIZED,      /* an authorization (capture_method manual):
                                       the provider holds the money until one
                                       capture takes it or a void releases it */
    ATTEMPT_STATUS_VOIDED,          /* an authorization released: by a void, or
                                       by its expiry at the provider */
    ATTEMPT_STATUS__COUNT
};

/* The names as SQL literals: "'" ATTEMPT_S_PENDING "'" == ATTEMPT_SQL(PENDING). */
#define ATTEMPT_S_PENDING         "PENDING"
#define ATTEMPT_S_PROCESSING      "PROCESSING"
#define ATTEMPT_S_UNKNOWN         "UNKNOWN"
#define ATTEMPT_S_SUCCEEDED       "SUCCEEDED"
#define ATTEMPT_S_FAILED          "FAILED"
#define ATTEMPT_S_REJECTED        "REJECTED"
#define ATTEMPT_S_REQUIRES_REVIEW "REQUIRES_REVIEW"
#define ATTEMPT_S_AUTHORIZED      "AUTHORIZED"
#define ATTEMPT_S_VOIDED          "VOIDED"
#define ATTEMPT_SQL(name)         "'" ATTEMPT_S_##name "'"

/* The result event an attempt entering s publishes ("charge.succeeded",
 * "charge.failed", "charge.unknown", "charge.rejected",
 * "charge.requires_review"), or NULL: PENDING and PROCESSING publish none. */
const char *attempt_status_event_type(enum attempt_status s);
/* The same for a refund attempt, which has the same states:
 * "refund.succeeded", ... "refund.requires_review", or NULL. */
const char *attempt_status_refund_event_type(enum attempt_status s);
/* The event an authorization (an attempt with capture_method manual)
 * entering s publishes of its own outcome: AUTHORIZED
 * "authorization.succeeded", and "authorization.failed", ".unknown",
 * ".rejected", ".requires_review"; NULL for the rest: SUCCEEDED and VOIDED
 * are a capture's and a void's doing, published by their steps. (A charge
 * never enters AUTHORIZED or VOIDED: attempt_status_event_type is NULL
 * there.) */
const char *attempt_status_authorization_event_type(enum attempt_status s);

/* "PENDING", ...; NULL for a value out of range. */
const char *attempt_status_name(enum attempt_status s);
/* The status named s (exact, upper case), or -1. */
int attempt_status_parse(const char *s);

/* Live: the order may not get another attempt while one is in this state
 * (PENDING, PROCESSING, UNKNOWN, SUCCEEDED, REQUIRES_REVIEW, AUTHORIZED: money
 * held is the order's as much as money taken). */
int attempt_status_is_live(enum attempt_status s);
/* Final for automation: no call is sent for it again; only the provider's
 * evidence, a human or (AUTHORIZED) one capture or void step moves it.
 * SUCCEEDED, FAILED, REJECTED, REQUIRES_REVIEW, AUTHORIZED, VOIDED. */
int attempt_status_is_settled(enum attempt_status s);

/* The live set as a PostgreSQL text array literal, for `status = ANY($n)`. */
const char *attempt_status_live_array(void);

/* May an attempt move from `from` to `to`? from < 0 means "not recorded
 * yet". The rules: a new attempt is PENDING, PROCESSING (recorded and
 * claimed at once) or REJECTED; only PROCESSING
 * calls the provider; SUCCEEDED and FAILED change only to REQUIRES_REVIEW
 * (contradicting evidence); REQUIRES_REVIEW is settled by a human;
 * REJECTED never changes. An authorization enters AUTHORIZED as a charge
 * enters SUCCEEDED (from PROCESSING, UNKNOWN or REQUIRES_REVIEW), and
 * leaves it for SUCCEEDED (a capture), VOIDED (a void, an expiry) or
 * REQUIRES_REVIEW; VOIDED, like FAILED, only for REQUIRES_REVIEW. */
int attempt_status_transition_allowed(int from, enum attempt_status to);

#endif
