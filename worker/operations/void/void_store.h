/* void_store: the void attempts in PostgreSQL (void_attempts of migration
 * 0018, this folder's migrations/), for the worker, the reconciler and (its statements)
 * the webhook.
 *
 * A void is leased, fenced and settled like a refund (refund_store.h says
 * how; the same rules hold: a batch per round trip, every statement safe to
 * repeat, no statement waiting on a row another session holds for more
 * than 100 ms). Its claim takes the authorization's hold (payment_attempts
 * held_by 'void', only from AUTHORIZED and unheld) in the statement that
 * leases it, before any provider call; a void that cannot take it is
 * REJECTED there with its reason code (attempt_unknown, not_authorized,
 * void_after_capture, authorization_voided, authorization_held) and its
 * void.rejected event. A void's end moves its authorization in the same
 * transaction (void_store_move_sql): SUCCEEDED makes the attempt VOIDED
 * (reason the void's), FAILED void_after_capture makes it REQUIRES_REVIEW
 * (money moved that no capture of ours recorded); the hold's triggers (0016) give
 * the hold back on FAILED and refuse a SUCCEEDED void of an attempt that is
 * not VOIDED. No ledger row: a void moves no money. */
#ifndef CHARGED_VOID_STORE_H
#define CHARGED_VOID_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "op.h"
#include "provider_outcome.h"
#include "store.h"
#include "store_conn.h"

typedef struct void_store void_store_t;

/* What the provider is called with: the stored void's own parameters and
 * its authorization's intent (the id charged recorded, never metadata). */
struct void_params {
    char idempotency_key[129];
    char payment_intent[PROVIDER_ID_MAX];
    char payment_attempt_id[37];
    char reason[24];
    long long amount; /* the authorization's: what the void releases */
};

void_store_t *void_store_new(const char *database_url, const char *actor,
                             struct charged_error *err);
void void_store_free(void_store_t *st);
enum charged_rc void_store_ping(void_store_t *st, struct charged_error *err);

/* Records the engine's items (commands: struct void_command) PENDING, or
 * finds them recorded: ENGINE_RECORDED, or ENGINE_CONFLICT and its reason
 * (the id or key reused with other parameters, the key another
 * operation's). */
enum charged_rc void_store_record(void_store_t *st, struct engine_record *items,
                                  size_t n, struct charged_error *err);
/* Leases PENDING voids (and PROCESSING ones whose lease expired) with the
 * hold: ENGINE_CLAIMED (params: struct void_params), ENGINE_SETTLED
 * (rejected now: its reason in rejected; or settled before), ENGINE_BUSY. */
enum charged_rc void_store_claim(void_store_t *st, struct engine_claim *items, size_t n,
                                 long long lease_ms, struct charged_error *err);

/* A call, written under the authorization's attempt and marked with the
 * void. */
struct void_call {
    const char *void_id;
    const char *operation; /* "void", "retrieve" */
    int64_t started_ms;
    const struct provider_result *res;
    int written_maybe; /* as engine_call's */
};
enum charged_rc void_store_log_calls(void_store_t *st, const struct void_call *calls,
                                     size_t n, struct charged_error *err);

/* The worker's outcomes, fenced on their leases, each with its transition,
 * its event and its authorization's move. */
enum charged_rc void_store_persist(void_store_t *st, struct engine_outcome *items,
                                   size_t n, struct charged_error *err);

enum charged_rc void_store_renew(void_store_t *st, const char *const *ids,
                                 const int64_t *epochs, size_t n, long long lease_ms,
                                 int *still_ours, struct charged_error *err);
enum charged_rc void_store_release(void_store_t *st, const char *const *ids,
                                   const int64_t *epochs, size_t n,
                                   struct charged_error *err);
/* Says that claims of ours wait before their call, or that the wait
 * ended (store.h's struct store_wait): one UPDATE, fenced on each claim;
 * a row another session holds is left as it is. */
enum charged_rc void_store_wait(void_store_t *st, const struct store_wait *w, size_t n,
                                struct charged_error *err);
enum charged_rc void_store_hand_back(void_store_t *st, const char *const *ids,
                                     const int64_t *epochs, size_t n,
                                     struct charged_error *err);

/* ---- the reconciler ---- */

struct void_due {
    char id[37];
    int64_t lease_epoch;
    enum attempt_status status; /* UNKNOWN or PROCESSING */
    int64_t key_age_ms;         /* -1: never sent */
    int64_t age_ms;
    int checks;
    struct void_params params;
};

enum charged_rc void_store_claim_due(void_store_t *st, struct void_due *out, size_t max,
                                     size_t *n, long long lease_ms, long long stale_ms,
                                     struct charged_error *err);
/* A look's settlement (op.h), fenced on its lease, with its calls. */
enum charged_rc void_store_settle(void_store_t *st, struct op_settlement *s,
                                  struct charged_error *err);
enum charged_rc void_store_backlog(void_store_t *st,
                                   const enum attempt_status *statuses, size_t n,
                                   long long *counts, long long *oldest_ms,
                                   struct charged_error *err);

/* ---- every writer's ---- */

/* The statement that moves the authorizations of voids that end: arrays $1
 * void ids, $2 lease epochs (NULL: no lease fence, the webhook's), $3 the
 * status each void is expected in, $4 the status it ends in, $5 its reason;
 * $6 the actor, $7 the cause ('worker', 'reconciler', 'webhook'). Run in
 * the transaction that then moves the voids, before them. */
extern const char *const void_store_move_sql;

/* The event CTEs of a void's change (rows of `src`: id, payment_attempt_id,
 * order_id, provider_payment_id, status, reason, updated_at, event_type;
 * the amount and currency are the authorization's). */
/* clang-format off */
#define SQL_VOID_OUTBOX_EVENTS(src) \
    " vev AS (SELECT gen_random_uuid() AS eid, s.*, a.amount, a.currency FROM " src " s" \
    "  LEFT JOIN payment_attempts a ON a.id = s.payment_attempt_id" \
    "  WHERE s.event_type IS NOT NULL)," \
    " vob AS (" \
    "  INSERT INTO outbox (event_id, payment_attempt_id, event_type, event_key, payload)" \
    "  SELECT eid, payment_attempt_id, event_type, payment_attempt_id::text," \
    "    jsonb_strip_nulls(jsonb_build_object(" \
    "    'event_id', eid, 'type', event_type, 'void_id', id," \
    "    'payment_attempt_id', payment_attempt_id, 'order_id', order_id," \
    "    'amount', amount, 'currency', currency," \
    "    'provider_payment_id', provider_payment_id," \
    "    'reason', CASE WHEN status = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE reason END," \
    "    'occurred_at', " SQL_RFC3339("updated_at") ")) FROM vev)"
/* clang-format on */

/* The event a void entering s publishes: void.succeeded, .failed,
 * .unknown, .rejected, .requires_review; NULL for PENDING, PROCESSING. */
const char *void_store_event_type(enum attempt_status s);

#endif
