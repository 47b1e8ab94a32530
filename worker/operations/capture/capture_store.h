/* capture_store: the worker's, reconciler's and api's captures in
 * PostgreSQL (migration 0017 (migrations/ of this folder): capture_attempts,
 * capture_transitions, and the triggers that make the hold a rule).
 *
 * A capture is leased, fenced and settled as a refund is (refund_store.h:
 * a batch per round trip, every statement atomic and safe to repeat, rows
 * in id order, no statement waiting long on a row another session holds).
 * One guard more: the hold. A capture is claimed only together with its
 * authorization: the hold statement (UPDATE payment_attempts SET held_by
 * ... WHERE status = 'AUTHORIZED' AND held_by IS NULL, its amount within
 * the authorization) decides the winner before any provider call; the
 * claim then leases the capture that holds, and REJECTS, with its reason
 * code, one that cannot hold (already_captured, capture_after_void,
 * authorization_voided, authorization_held, not_authorized,
 * amount_over_authorized, attempt_unknown). A capture's success is booked
 * in one transaction: the authorization SUCCEEDED with captured_amount,
 * its attempt transition and its ledger 'charge' row (capture_store_book),
 * then the capture SUCCEEDED with its event. */
#ifndef CHARGED_CAPTURE_STORE_H
#define CHARGED_CAPTURE_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "capture_command.h"
#include "engine.h"
#include "op.h"
#include "provider_outcome.h"
#include "store.h"
#include "store_conn.h"

typedef struct capture_store capture_store_t;

/* `actor` names this process in leases and transitions. Copies both. Does
 * not connect. */
capture_store_t *capture_store_new(const char *database_url, const char *actor,
                                   struct charged_error *err);
void capture_store_free(capture_store_t *st);
enum charged_rc capture_store_ping(capture_store_t *st, struct charged_error *err);

/* What the provider is called with: the stored capture's own parameters. */
struct capture_params {
    char idempotency_key[129];
    char payment_intent[PROVIDER_ID_MAX]; /* the authorization's provider id */
    char payment_attempt_id[37];
    long long amount; /* asked; 0: all that is held */
};

/* Records the commands (items[i].command: struct capture_command): new or
 * the same capture again is ENGINE_RECORDED; its id or key reused with
 * other parameters, or the key another operation's, is ENGINE_CONFLICT
 * with the reason. */
enum charged_rc capture_store_record(capture_store_t *st, struct engine_record *items,
                                     size_t n, struct charged_error *err);

/* Takes the hold for the PENDING captures of items, then leases those that
 * hold (params: struct capture_params), rejects those that cannot hold
 * (SETTLED, rejected says why), and leaves the others (BUSY). */
enum charged_rc capture_store_claim(capture_store_t *st, struct engine_claim *items,
                                    size_t n, long long lease_ms,
                                    struct charged_error *err);

/* A call, written with its authorization's and marked with the capture. */
struct capture_call {
    const char *capture_id;
    const char *operation; /* "capture", "retrieve" */
    int64_t started_ms;
    const struct provider_result *res;
    int written_maybe; /* as attempt_call's */
};

enum charged_rc capture_store_log_calls(capture_store_t *st,
                                        const struct capture_call *calls, size_t n,
                                        struct charged_error *err);

/* The worker's outcomes, fenced on the lease: a SUCCEEDED one (the amount
 * captured is its evidence's amount_received) books its authorization in
 * the same transaction, or goes to REQUIRES_REVIEW when it cannot. */
enum charged_rc capture_store_persist(capture_store_t *st, struct engine_outcome *items,
                                      size_t n, struct charged_error *err);

enum charged_rc capture_store_renew(capture_store_t *st, const char *const *ids,
                                    const int64_t *epochs, size_t n, long long lease_ms,
                                    int *still_ours, struct charged_error *err);
enum charged_rc capture_store_release(capture_store_t *st, const char *const *ids,
                                      const int64_t *epochs, size_t n,
                                      struct charged_error *err);
/* Says that claims of ours wait before their call, or that the wait
 * ended (store.h's struct store_wait): one UPDATE, fenced on each claim;
 * a row another session holds is left as it is. */
enum charged_rc capture_store_wait(capture_store_t *st, const struct store_wait *w,
                                   size_t n, struct charged_error *err);
enum charged_rc capture_store_hand_back(capture_store_t *st, const char *const *ids,
                                        const int64_t *epochs, size_t n,
                                        struct charged_error *err);

/* ---- the authorization's side of a success, for every writer ---- */

/* One capture to book: captured `amount` (>= 1) on its authorization, when
 * the capture is `expected` (NULL: UNKNOWN or PROCESSING) and holds it,
 * under the lease epoch (< 0: no lease fence, a webhook's). */
struct capture_booking {
    const char *capture_id;
    int64_t lease_epoch;
    long long amount;
    const char *expected;
};

/* Inside the caller's transaction on db: the authorization SUCCEEDED with
 * captured_amount, its transition (cause, actor) and its ledger row, for
 * each booking that may; *booked: how many did. */
enum charged_rc capture_store_book(store_conn_t *db, const char *actor,
                                   const char *cause, const struct capture_booking *b,
                                   size_t n, size_t *booked, struct charged_error *err);

/* ---- reconciliation ---- */

/* A capture due for a look, claimed under a fenced lease. */
struct capture_due {
    char id[37];
    int64_t lease_epoch;
    enum attempt_status status; /* UNKNOWN or PROCESSING */
    int64_t key_age_ms;         /* -1: never sent */
    int64_t age_ms;             /* now - created_at */
    int checks;
    long long authorized; /* the authorization's amount */
    struct capture_params params;
};

enum charged_rc capture_store_claim_due(capture_store_t *st, struct capture_due *out,
                                        size_t max, size_t *n, long long lease_ms,
                                        long long stale_ms, struct charged_error *err);

/* One decision on evidence, fenced on the reconciler's lease: a status
 * change with its transition, event and calls (SUCCEEDED: booked first,
 * s->amount captured), or (status == expected) a look again later. */
enum charged_rc capture_store_settle(capture_store_t *st, struct op_settlement *s,
                                     struct charged_error *err);

enum charged_rc capture_store_backlog(capture_store_t *st,
                                      const enum attempt_status *statuses, size_t n,
                                      long long *counts, long long *oldest_ms,
                                      struct charged_error *err);

/* The event a capture entering `status` publishes ("capture.succeeded",
 * ...), or NULL. */
const char *capture_status_event_type(enum attempt_status status);

#endif
