/* sim_store: a model of charged's PostgreSQL store, written from
 * migrations/0001, 0002, 0006, 0016 and the statements of common/store
 * and of the capture's and void's stores
 * (attempt_store.c's SQL_RECORD, SQL_CLAIM, SQL_PERSIST, SQL_CLAIM_DUE,
 * SQL_SETTLE; lease_sql.h's renew and release; webhook_store.c's settle;
 * refund_store.c's claim with its reservation, and the trigger
 * refund_attempts_money). One statement is one call here: the simulation
 * is single-threaded, so a row lock lasts no longer than a call and SKIP
 * LOCKED reduces to "a row leased to a live holder is not taken". The
 * structs are open: the checker reads them. */
#ifndef CHARGED_SIM_STORE_H
#define CHARGED_SIM_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "sim_world.h"

#define SIM_NO_OWNER (-1)
#define SIM_NULL     (-1) /* a NULL timestamp or id */

struct sim_attempt {
    int recorded;
    int id, order, key;
    long long amount;
    enum attempt_status status;
    int lease_owner;
    int64_t lease_expires, lease_epoch;
    int64_t first_sent_at, next_check_at, created_at, updated_at;
    int intent; /* provider_payment_id; SIM_NULL */
    long long refund_reserved, refunded_amount;
    int reconcile_checks;
    int in_due; /* on the reconciler's queue (UNKNOWN, PROCESSING) */
    /* Migration 0016: an authorization (capture_method manual), what its
     * capture took (0: NULL), and the step holding it (held_by: a
     * SIM_STEP_CAPTURE or SIM_STEP_VOID, 0 none; held_by_id). */
    int manual;
    long long captured_amount;
    int held_kind, held_id;
    int captures_succeeded; /* capture_attempts_one_per_authorization */
};

/* A refund's row, or a capture's or void's (kind): each names a payment
 * attempt (charge) and has the charge's discipline of its own. */
struct sim_refund_row {
    int recorded;
    int kind; /* enum sim_step_kind */
    int id, charge, key;
    long long amount;
    enum attempt_status status;
    int reserved;
    int lease_owner;
    int64_t lease_expires, lease_epoch;
    int64_t first_sent_at, next_check_at, created_at;
    int intent;  /* payment_intent, the charge's */
    int prefund; /* provider_refund_id; SIM_NULL */
    int reconcile_checks;
    int in_due;
    long long captured; /* a capture's captured_amount (0: NULL) */
    const char *reason; /* a REJECTED step's reason code (static) */
};

struct sim_store {
    unsigned breaks;
    struct sim_violation *viol;
    int64_t now;
    struct sim_attempt *a; /* by attempt id */
    size_t na;
    int *key_owner; /* by charge key: the attempt holding it, or -1 */
    size_t nkeys;
    int *live_count; /* by order: its live attempts */
    size_t norders;
    struct sim_refund_row *r; /* by refund id */
    size_t nr;
    int *rkey_owner; /* by refund key */
    size_t nrkeys;
    struct sim_refund_row *s; /* captures and voids, by step id */
    size_t ns;
    int *due, *rdue, *sdue; /* the reconciler's queues (ids; lazily pruned) */
    size_t ndue, capdue, nrdue, caprdue, nsdue, capsdue;
    uint64_t writes; /* status changes, for the hash */
    /* Called on every status change of an attempt, and of a refund (the
     * checker's hooks). */
    void (*on_status)(void *ctx, int attempt);
    void (*on_refund_status)(void *ctx, int refund);
    void (*on_step_status)(void *ctx, int step);
    void *ctx;
};

struct sim_store *sim_store_new(unsigned breaks, struct sim_violation *viol);
void sim_store_free(struct sim_store *st);

/* The attempt's row, or NULL when not recorded. */
struct sim_attempt *sim_store_attempt(struct sim_store *st, int id);
struct sim_refund_row *sim_store_refund(struct sim_store *st, int id);
struct sim_refund_row *sim_store_step(struct sim_store *st, int id);

enum sim_record {
    SIM_RECORDED_CLAIMED, /* new, PROCESSING under our lease (epoch in *epoch) */
    SIM_RECORDED,         /* there before, same parameters: claim it */
    SIM_RECORD_CONFLICT,  /* the id or key is taken with other parameters */
    SIM_RECORD_REJECTED,  /* the order has another live attempt: REJECTED row */
};

/* SQL_RECORD (with a lease) and SQL_INSERT_REJECTED. */
enum sim_record sim_store_record(struct sim_store *st, int id, int order, int key,
                                 long long amount, int manual, int owner,
                                 int64_t lease_ms, int64_t *epoch);

enum sim_claim { SIM_CLAIMED, SIM_SETTLED, SIM_BUSY };
/* SQL_CLAIM: *epoch and *key_age_ms when claimed. */
enum sim_claim sim_store_claim(struct sim_store *st, int id, int owner,
                               int64_t lease_ms, int64_t *epoch, int64_t *key_age_ms);
/* SQL_PERSIST: 1 persisted, 0 fenced out. next_check_ms < 0: NULL. */
int sim_store_persist(struct sim_store *st, int id, int owner, int64_t epoch,
                      enum attempt_status to, int intent, int64_t next_check_ms);
/* SQL_LEASE_RENEW: 1 still ours. */
int sim_store_renew(struct sim_store *st, int id, int owner, int64_t epoch,
                    int64_t lease_ms);
/* SQL_LEASE_END: release (expires now) or hand back (no lease at all). */
void sim_store_release(struct sim_store *st, int id, int owner, int64_t epoch,
                       int hand_back);

/* SQL_CLAIM_DUE for one attempt: its id, or -1. */
int sim_store_claim_due(struct sim_store *st, int owner, int64_t lease_ms,
                        int64_t stale_ms, int64_t *epoch);
/* SQL_SETTLE: 1 settled. */
int sim_store_settle(struct sim_store *st, int id, enum attempt_status expected,
                     int owner, int64_t epoch, enum attempt_status to, int intent,
                     int64_t next_check_ms);
/* webhook_store's SQL_SETTLE (under the row lock, no lease: it ends any
 * lease and bumps the epoch). 0 when the store refuses it. */
int sim_store_webhook_settle(struct sim_store *st, int id, enum attempt_status to,
                             int intent);

/* Refunds: record (PENDING), claim with the reservation, persist (the
 * trigger's money), renew/release, and the reconciler's claim and settle. */
enum sim_record sim_store_refund_record(struct sim_store *st, int id, int charge,
                                        int key, long long amount);
/* SIM_CLAIMED, SIM_SETTLED (REJECTED now, or settled), SIM_BUSY. */
enum sim_claim sim_store_refund_claim(struct sim_store *st, int id, int owner,
                                      int64_t lease_ms, int64_t *epoch,
                                      int64_t *key_age_ms, int *intent);
int sim_store_refund_persist(struct sim_store *st, int id, int owner, int64_t epoch,
                             enum attempt_status to, int prefund,
                             int64_t next_check_ms);
/* webhook_store's SQL_SETTLE_REFUND: the trigger's money follows. */
int sim_store_refund_webhook_settle(struct sim_store *st, int id,
                                    enum attempt_status to, int prefund);
int sim_store_refund_renew(struct sim_store *st, int id, int owner, int64_t epoch,
                           int64_t lease_ms);
void sim_store_refund_release(struct sim_store *st, int id, int owner, int64_t epoch,
                              int hand_back);
int sim_store_refund_claim_due(struct sim_store *st, int owner, int64_t lease_ms,
                               int64_t stale_ms, int64_t *epoch);
int sim_store_refund_settle(struct sim_store *st, int id, enum attempt_status expected,
                            int owner, int64_t epoch, enum attempt_status to,
                            int prefund, int64_t next_check_ms);

/* Captures and voids (capture_store.c's and void_store.c's statements over
 * 0016's rules): record PENDING; the claim takes the authorization's hold
 * (only from AUTHORIZED and unheld; the loser REJECTED with its reason
 * code; a step behind its authorization's first answer waits); a success
 * only while it holds the authorization, and with the authorization moved
 * (a capture's SUCCEEDED with captured_amount, a void's VOIDED); a failure
 * or rejection gives the hold back; UNKNOWN and REQUIRES_REVIEW keep it.
 * Persist and settle take the captured amount (0: none). */
enum sim_record sim_store_step_record(struct sim_store *st, int id, int kind,
                                      int attempt, int key, long long amount);
enum sim_claim sim_store_step_claim(struct sim_store *st, int id, int owner,
                                    int64_t lease_ms, int64_t *epoch,
                                    int64_t *key_age_ms, int *intent);
int sim_store_step_persist(struct sim_store *st, int id, int owner, int64_t epoch,
                           enum attempt_status to, long long captured,
                           int64_t next_check_ms);
int sim_store_step_renew(struct sim_store *st, int id, int owner, int64_t epoch,
                         int64_t lease_ms);
void sim_store_step_release(struct sim_store *st, int id, int owner, int64_t epoch,
                            int hand_back);
int sim_store_step_claim_due(struct sim_store *st, int owner, int64_t lease_ms,
                             int64_t stale_ms, int64_t *epoch);
int sim_store_step_settle(struct sim_store *st, int id, enum attempt_status expected,
                          int owner, int64_t epoch, enum attempt_status to,
                          long long captured, int64_t next_check_ms);

uint64_t sim_store_hash(const struct sim_store *st, uint64_t h);

#endif
