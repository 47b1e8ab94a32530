/* attempt_store: the worker's payment attempts in PostgreSQL.
 *
 * Every operation takes a batch and costs one round trip per step; each
 * statement is atomic on its own (CTEs write the attempt, its transition,
 * its result event and its ledger row together), so no transaction is ever
 * open while a provider call is in flight. Unique constraints settle races:
 * nothing here checks and then inserts.
 *
 * The connection is opened lazily and re-opened on the next call after it
 * breaks, so a daemon started while the database is down keeps running. A
 * failed call returns an enum charged_rc (store.h) other than CHARGED_OK, with
 * err filled, and changes nothing the caller has to undo, because every
 * step is safe to repeat.
 *
 * Multi-row statements take their rows in attempt-id order, so that two
 * workers with overlapping batches do not deadlock (and a deadlock that
 * happens anyway is CHARGED_RETRY). No statement waits for a row
 * another session holds locked (SKIP LOCKED): a session hung inside a
 * transaction (a frozen api pod, a partition) costs the attempts it holds,
 * which come out `busy`, never the rest of the batch. Rows are locked FOR
 * NO KEY UPDATE (no key ever changes): a lock of ours never holds up the
 * foreign-key check of a row written for the attempt (a provider call, a
 * transition), which FOR UPDATE would. */
#ifndef CHARGED_ATTEMPT_STORE_H
#define CHARGED_ATTEMPT_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "charge_command.h"
#include "provider_outcome.h"
#include "store.h"

typedef struct attempt_store attempt_store_t;

/* Every fallible call returns CHARGED_OK, CHARGED_RETRY (transient: repeat the
 * same batch after a back-off), CHARGED_BAD_ITEM (the database refused a value of
 * the batch: repeat item by item to find the bad one) or CHARGED_WAIT
 * (another session's uncommitted change held the statement past its
 * lock_timeout of 100 ms, which a unique index waits for and SKIP LOCKED
 * cannot skip: nothing was written; repeat item by item, and the item that
 * meets it later). */

/* `actor` names this process in leases and transitions (the worker id).
 * Copies both. Does not connect: NULL and err only when database_url
 * cannot be parsed (or out of memory). */
attempt_store_t *attempt_store_new(const char *database_url, const char *actor,
                                   struct charged_error *err);
/* The same, for the reconciler's look of one operation over attempts: its
 * claim_due claims only attempts of capture_method ("automatic": a
 * charge's, "manual": an authorization's), and, with lapse_ms > 0, also
 * the AUTHORIZED ones first sent more than lapse_ms ago (the provider's
 * expiry of a hold whose webhook never came), once per look's schedule. */
attempt_store_t *attempt_store_new_of(const char *database_url, const char *actor,
                                      const char *capture_method, long long lapse_ms,
                                      struct charged_error *err);
void attempt_store_free(attempt_store_t *st);

/* Connects if needed and runs an empty statement: whether the database
 * answers now, for readiness while no other step runs. CHARGED_OK, or
 * CHARGED_RETRY and err. */
enum charged_rc attempt_store_ping(attempt_store_t *st, struct charged_error *err);

/* ---- record: insert or read, never check-then-insert ---- */

enum attempt_record_result {
    ATTEMPT_RECORDED = 0,     /* the same attempt again (or new, not claimed):
                                 go on to claim */
    ATTEMPT_CONFLICT,         /* key or attempt id reused with other parameters */
    ATTEMPT_REJECTED,         /* recorded REJECTED: the order is paid or busy */
    ATTEMPT_RETRY,            /* a race moved under us: record again later */
    ATTEMPT_RECORDED_CLAIMED, /* new, and claimed by the same statement */
};

/* What the provider is called with: always the stored attempt's own
 * parameters, never a message's. */
struct attempt_params {
    char idempotency_key[129];
    char order_id[37];
    long long amount;
    char currency[4];
    char payment_method[1024];
    char customer_id[1024]; /* "" when none */
    int manual;             /* capture_method manual: an authorization, sent as one by
                               every role that sends under the key */
};

struct attempt_record_item {
    const struct charge_command *cmd;  /* in */
    enum attempt_record_result result; /* out */
    char reason[160];                  /* out: conflict or rejection */
    int64_t lease_epoch;               /* out, when claimed */
    struct attempt_params params;      /* out, when claimed */
};

/* With lease_ms > 0, a new attempt is recorded PROCESSING and claimed for
 * lease_ms in the same statement (one row version, one transition, one
 * commit fewer than a record and a claim; its key was never sent, so its
 * key age is 0). The first message of an attempt in the batch takes the
 * claim; a copy, or an attempt recorded before, is ATTEMPT_RECORDED and
 * goes through the claim like any redelivery. With lease_ms 0 a new attempt
 * is recorded PENDING, for a claim later. */
enum charged_rc attempt_store_record(attempt_store_t *st,
                                     struct attempt_record_item *items, size_t n,
                                     long long lease_ms, struct charged_error *err);

/* ---- claim: SELECT ... FOR UPDATE SKIP LOCKED, then lease ---- */

enum attempt_claim_result {
    ATTEMPT_CLAIMED = 0, /* ours: call the provider under lease_epoch */
    ATTEMPT_SETTLED,     /* nothing to call: the outcome is durable */
    ATTEMPT_BUSY,        /* leased or locked by someone else: wait */
};

struct attempt_claim_item {
    const char *attempt_id;           /* in */
    enum attempt_claim_result result; /* out */
    int64_t lease_epoch;              /* out, when claimed */
    int64_t key_age_ms;               /* out, when claimed: now - first_sent_at on
                                         the database's clock */
    int attempt_count;                /* out: provider calls so far */
    char status[20];                  /* out: status before the claim */
    struct attempt_params params;     /* out, when claimed */
};

/* A PENDING attempt, one whose lease expired, or one under a lease of this
 * store's actor: the caller asks only for attempts none of its own work
 * holds, so such a lease is a claim whose answer it lost (a statement given
 * up that committed later). The actor must name one process. */
enum charged_rc attempt_store_claim(attempt_store_t *st,
                                    struct attempt_claim_item *items, size_t n,
                                    long long lease_ms, struct charged_error *err);

/* ---- provider calls, for support ---- */

struct attempt_call {
    const char *attempt_id;
    const char *operation; /* "charge", "retrieve", "search"; NULL: charge */
    int64_t started_ms;    /* epoch ms */
    const struct provider_result *res;
    /* An earlier write of this very call failed, and may still have
     * committed (a statement given up at its deadline can run later): it is
     * written only if no row of the same call is there yet. */
    int written_maybe;
};

enum charged_rc attempt_store_log_calls(attempt_store_t *st,
                                        const struct attempt_call *calls, size_t n,
                                        struct charged_error *err);

/* ---- persist an outcome, fenced on the lease ---- */

struct attempt_outcome {
    const char *attempt_id;          /* in */
    int64_t lease_epoch;             /* in: the claim this result belongs to */
    const char *status;              /* in: SUCCEEDED, FAILED, UNKNOWN, ... */
    const char *reason;              /* in, may be NULL */
    const char *provider_payment_id; /* in, may be NULL */
    const char *event_type;          /* in: result event, NULL for none */
    const char *evidence_json;       /* in: the provider's answer, summarised */
    int calls;                       /* in: provider calls made under this claim */
    const char *last_error;          /* in, may be NULL */
    long long next_check_ms;         /* in: reconciler's next look; < 0 none */
    int persisted;                   /* out: 0 when the lease was lost or busy */
    int busy; /* out: another session holds the row: nothing written, try again */
};

enum charged_rc attempt_store_persist(attempt_store_t *st,
                                      struct attempt_outcome *items, size_t n,
                                      struct charged_error *err);

/* ---- leases ---- */

/* ---- reconciliation: claims of unsettled attempts, settlements ---- */

/* An attempt due for a look, claimed under a fenced lease. */
struct attempt_due {
    char id[37];
    int64_t lease_epoch;
    enum attempt_status status; /* UNKNOWN or PROCESSING; AUTHORIZED: a hold
                                   looked at for its expiry (lapse_ms) */
    /* "" when none is known */
    char provider_payment_id[PROVIDER_ID_MAX];
    int64_t key_age_ms;    /* now - first_sent_at, database clock; -1:
                              never sent */
    int64_t first_sent_ms; /* first_sent_at, ms since the epoch on the
                              database clock; -1: never sent */
    int64_t age_ms;        /* now - created_at */
    int checks;            /* looks so far */
    int void_holds;        /* a void of ours holds the authorization */
    struct attempt_params params;
};

/* Claims up to `max` attempts whose next look is due (next_check_at passed):
 * UNKNOWN ones, PROCESSING ones the provider said were processing (no
 * lease), and PROCESSING ones whose worker's lease expired more than
 * stale_ms ago (no worker came back); of the store's capture method only,
 * and its lapsed holds (attempt_store_new_of). FOR UPDATE SKIP LOCKED and a fenced
 * lease, as the worker's claim, so reconcilers and workers run side by
 * side. The status is not changed. *n says how many were claimed. */
enum charged_rc attempt_store_claim_due(attempt_store_t *st, struct attempt_due *out,
                                        size_t max, size_t *n, long long lease_ms,
                                        long long stale_ms, struct charged_error *err);

/* How many attempts are in each of statuses[0..n-1] (say UNKNOWN and
 * PROCESSING, which payment_attempts_to_check indexes), and the age of the
 * oldest of each since it was recorded (now - created_at, database clock;
 * 0 when none): counts[i], oldest_ms[i]. One statement. */
enum charged_rc attempt_store_backlog(attempt_store_t *st,
                                      const enum attempt_status *statuses, size_t n,
                                      long long *counts, long long *oldest_ms,
                                      struct charged_error *err);

/* One decision on evidence: a status change, or (status == expected) a
 * look again later. Written in one statement: the status, a transition with
 * its cause and evidence, the result event, the ledger row of a success,
 * and the provider calls made for it. */
struct attempt_settlement {
    const char *attempt_id;
    int64_t lease_epoch;             /* the claim's; < 0: no lease (an operator) */
    enum attempt_status expected;    /* the status it must still have */
    enum attempt_status status;      /* the new one; == expected: look later */
    const char *cause;               /* "reconciler", "operator", "webhook" */
    const char *actor;               /* NULL: the store's actor */
    const char *reason;              /* may be NULL */
    const char *provider_payment_id; /* may be NULL */
    const char *evidence_json;       /* what the provider said; NULL: {} */
    long long next_check_ms;         /* next look; < 0: none */
    int throttled; /* the reconciler's look a 429 ended: not counted as one */
    /* The result event of an authorization's move, when not its status's
     * own (attempt_status_authorization_event_type): NULL for that. */
    const char *event_type;
    const struct attempt_call *calls; /* provider calls made for it */
    size_t ncalls;
    int settled; /* out: 0 when fenced out, moved on or busy */
    int busy;    /* out: another session holds the row: nothing written */
};

enum charged_rc attempt_store_settle(attempt_store_t *st,
                                     struct attempt_settlement *items, size_t n,
                                     struct charged_error *err);

/* Extends the leases still ours; still_ours[i] says which (one another
 * session holds locked is not extended now, and is still ours if its last
 * committed lease is). */
enum charged_rc attempt_store_renew(attempt_store_t *st, const char *const *attempt_ids,
                                    const int64_t *epochs, size_t n, long long lease_ms,
                                    int *still_ours, struct charged_error *err);
/* Gives claims of the reconciler back as they were before it claimed them:
 * no lease at all, so that a peer reconciler looks at once (and a worker,
 * which takes over only a worker's expired lease, does not). */
enum charged_rc attempt_store_hand_back(attempt_store_t *st,
                                        const char *const *attempt_ids,
                                        const int64_t *epochs, size_t n,
                                        struct charged_error *err);
/* Lets the leases expire now, so that a peer may take over at once. */
enum charged_rc attempt_store_release(attempt_store_t *st,
                                      const char *const *attempt_ids,
                                      const int64_t *epochs, size_t n,
                                      struct charged_error *err);
/* Says that claims of ours wait before their call, or that the wait
 * ended (store.h's struct store_wait): one UPDATE, fenced on each claim;
 * a row another session holds is left as it is. */
enum charged_rc attempt_store_wait(attempt_store_t *st, const struct store_wait *w,
                                   size_t n, struct charged_error *err);

/* The statement the attempts' calls are written with (stmt_log_calls'
 * shape: nine arrays $1..$9, the actor $10, $11 whether an earlier write
 * may have committed), for a writer of its own session: an authorization's
 * review writes its look-up with its decision. */
extern const char attempt_store_log_calls_sql[];

#endif
