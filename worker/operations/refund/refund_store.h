/* refund_store: the worker's refund attempts in PostgreSQL.
 *
 * A refund is leased, fenced and settled like a payment attempt
 * (attempt_store.h says how, and the same rules hold: a batch per round
 * trip, every statement atomic and safe to repeat, rows in id order, no
 * statement waiting on a row another session holds but the charge's row of
 * a reservation, for at most 100 ms).
 *
 * One guard more: a refund never takes the refunded total past its charge.
 * The claim reserves the refund's amount on the charge's row in the same
 * statement that leases it, and only while the charge is SUCCEEDED and its
 * reserved total plus this amount stays within the charge; otherwise the
 * refund is REJECTED (not_refundable, exceeds_charge) before any provider
 * call. Nothing checks and then inserts: two refunds of one charge claimed
 * at once on two workers serialize on the charge's row, and the second
 * re-reads the first's reservation. The money of every later change (book
 * a success once, give a failure's reservation back) is applied by the
 * database itself for every writer (migrations/0006_refunds.sql). */
#ifndef CHARGED_REFUND_STORE_H
#define CHARGED_REFUND_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "provider_outcome.h"
#include "refund_command.h"
#include "store.h"

typedef struct refund_store refund_store_t;

/* `actor` names this process in leases and transitions. Copies both. Does
 * not connect. */
refund_store_t *refund_store_new(const char *database_url, const char *actor,
                                 struct charged_error *err);
void refund_store_free(refund_store_t *st);

enum charged_rc refund_store_ping(refund_store_t *st, struct charged_error *err);

/* ---- record: insert or read ---- */

enum refund_record_result {
    REFUND_RECORDED = 0, /* new or the same refund again: go on to claim */
    REFUND_CONFLICT,     /* key or refund id reused with other parameters, or
                            the key is a charge's */
};

struct refund_record_item {
    const struct refund_command *cmd; /* in */
    enum refund_record_result result; /* out */
    char reason[160];                 /* out: the conflict */
};

enum charged_rc refund_store_record(refund_store_t *st,
                                    struct refund_record_item *items, size_t n,
                                    struct charged_error *err);

/* ---- claim: lease, and reserve on the charge ---- */

enum refund_claim_result {
    REFUND_CLAIMED = 0, /* ours and reserved: call the provider */
    REFUND_SETTLED,     /* nothing to call: settled (or rejected just now) */
    REFUND_BUSY,        /* leased or locked by someone else: wait */
};

/* What the provider is called with: the stored refund's own parameters. */
struct refund_params {
    char idempotency_key[129];
    char payment_intent[PROVIDER_ID_MAX]; /* the charge's provider id */
    char payment_attempt_id[37];
    long long amount;
    char reason[24];
};

struct refund_claim_item {
    const char *refund_id;           /* in */
    enum refund_claim_result result; /* out */
    int64_t lease_epoch;             /* out, when claimed */
    int64_t key_age_ms;              /* out, when claimed (database clock) */
    char status[20];                 /* out: status before the claim */
    char rejected[160];              /* out: the reason, when this claim
                                        rejected it ("" otherwise) */
    struct refund_params params;     /* out, when claimed */
};

enum charged_rc refund_store_claim(refund_store_t *st, struct refund_claim_item *items,
                                   size_t n, long long lease_ms,
                                   struct charged_error *err);

/* ---- provider calls (written with the charge's, marked with the refund) ---- */

struct refund_call {
    const char *refund_id;
    const char *operation; /* "refund", "retrieve_refund", "list_refunds" */
    int64_t started_ms;
    const struct provider_result *res;
    int written_maybe; /* as attempt_call's */
};

enum charged_rc refund_store_log_calls(refund_store_t *st,
                                       const struct refund_call *calls, size_t n,
                                       struct charged_error *err);

/* ---- persist an outcome, fenced on the lease ---- */

struct refund_outcome {
    const char *refund_id;          /* in */
    int64_t lease_epoch;            /* in */
    const char *status;             /* in: SUCCEEDED, FAILED, UNKNOWN, ... */
    const char *reason;             /* in, may be NULL */
    const char *provider_refund_id; /* in, may be NULL */
    const char *event_type;         /* in: refund.* or NULL */
    const char *evidence_json;      /* in */
    int calls;                      /* in */
    const char *last_error;         /* in, may be NULL */
    long long next_check_ms;        /* in: < 0 none */
    int persisted;                  /* out */
    int busy;                       /* out */
};

enum charged_rc refund_store_persist(refund_store_t *st, struct refund_outcome *items,
                                     size_t n, struct charged_error *err);

/* ---- leases ---- */

enum charged_rc refund_store_renew(refund_store_t *st, const char *const *refund_ids,
                                   const int64_t *epochs, size_t n, long long lease_ms,
                                   int *still_ours, struct charged_error *err);
enum charged_rc refund_store_release(refund_store_t *st, const char *const *refund_ids,
                                     const int64_t *epochs, size_t n,
                                     struct charged_error *err);
/* Says that claims of ours wait before their call, or that the wait
 * ended (store.h's struct store_wait): one UPDATE, fenced on each claim;
 * a row another session holds is left as it is. */
enum charged_rc refund_store_wait(refund_store_t *st, const struct store_wait *w,
                                  size_t n, struct charged_error *err);

/* Ends our leases at once (the reconciler's batch cut short): the refunds
 * are due to any reconciler again, PROCESSING ones too. */
enum charged_rc refund_store_hand_back(refund_store_t *st,
                                       const char *const *refund_ids,
                                       const int64_t *epochs, size_t n,
                                       struct charged_error *err);

/* ---- reconciliation ---- */

/* A refund due for a look, claimed under a fenced lease. */
struct refund_due {
    char id[37];
    int64_t lease_epoch;
    enum attempt_status status; /* UNKNOWN or PROCESSING */
    /* "" when none is known */
    char provider_refund_id[PROVIDER_ID_MAX];
    int64_t key_age_ms; /* -1: never sent */
    int64_t age_ms;     /* now - created_at */
    int checks;
    struct refund_params params;
};

/* Claims up to `max` refunds whose next look is due, as
 * attempt_store_claim_due does for attempts. */
enum charged_rc refund_store_claim_due(refund_store_t *st, struct refund_due *out,
                                       size_t max, size_t *n, long long lease_ms,
                                       long long stale_ms, struct charged_error *err);

/* One decision on evidence, fenced on the reconciler's lease: a status
 * change (with its transition, event and calls), or (status == expected)
 * a look again after next_check_ms. *settled: 0 when the lease was lost. */
struct refund_settlement {
    const char *refund_id;
    int64_t lease_epoch;
    enum attempt_status expected;
    enum attempt_status status;
    const char *reason;             /* may be NULL */
    const char *provider_refund_id; /* may be NULL */
    const char *evidence_json;      /* NULL: {} */
    long long next_check_ms;        /* < 0: none */
    int throttled; /* a look a 429 ended: not counted among the checks */
    const struct refund_call *calls;
    size_t ncalls;
    int settled; /* out */
    int busy;    /* out: as expected, but held by another session (nothing
                    written, nothing waited) */
};

enum charged_rc refund_store_settle(refund_store_t *st, struct refund_settlement *it,
                                    struct charged_error *err);

/* How many refunds are in each of statuses, and how old (ms since
 * created) the oldest is; 0 and 0 for none. */
enum charged_rc refund_store_backlog(refund_store_t *st,
                                     const enum attempt_status *statuses, size_t n,
                                     long long *counts, long long *oldest_ms,
                                     struct charged_error *err);

#endif
