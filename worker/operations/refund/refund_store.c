#include "refund_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "lease_sql.h"
#include "refund_sql.h"
#include "store_conn.h"
#include "step_sql.h"
#include "store_stmt.h"

struct refund_store {
    store_conn_t *db;
    char *actor;
};

/* As the attempt store's: an insert's unique index, and a reservation on
 * the charge's row, wait at most this long for another session. */
#define REFUND_LOCK_TIMEOUT "100ms"

/* How long a refund waits for an earlier refund of its charge that is
 * still PENDING: long enough for any worker to claim it, and a bound, so
 * that a refund left PENDING (refused by the database, say) never holds
 * the charge's later refunds for good. */
#define REFUND_ORDER_WINDOW "5 minutes"

/* refund_store_new, _free and _ping. */
STMT_STORE_SESSION(refund_store, REFUND_LOCK_TIMEOUT)
STMT_STORE_WAIT(refund_store, "refund_attempts")

static const char *or_null(const char *s)
{
    return s && *s ? s : NULL;
}

/* What the provider is called with, from five columns starting at first:
 * idempotency_key, payment_intent, payment_attempt_id, amount, reason. */
static void col_params(const PGresult *r, int row, int first, struct refund_params *pa)
{
    CHARGED_ASSERT(r && pa && row >= 0 && first >= 0);
    stmt_col_copy(r, row, first, pa->idempotency_key, sizeof(pa->idempotency_key));
    stmt_col_copy(r, row, first + 1, pa->payment_intent, sizeof(pa->payment_intent));
    stmt_col_copy(r, row, first + 2, pa->payment_attempt_id,
                  sizeof(pa->payment_attempt_id));
    pa->amount = stmt_col_int(r, row, first + 3);
    stmt_col_copy(r, row, first + 4, pa->reason, sizeof(pa->reason));
}

/* ---- record ---- */

/* clang-format off */
/* A key a charge already uses is never taken by a refund: the provider
 * keeps one namespace of keys. The charge's order and currency are copied
 * when the charge is known. */
static const char *SQL_INSERT_PENDING =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::bigint[], $6::text[], $7::jsonb[])"
    "  WITH ORDINALITY AS v(id, attempt, idempotency_key, fp, amount, reason, metadata, n)),"
    " ins AS ("
    "  INSERT INTO refund_attempts (id, payment_attempt_id, order_id, idempotency_key,"
    "    request_fingerprint, amount, currency, refund_reason, metadata, status)"
    "  SELECT v.id, v.attempt, p.order_id, v.idempotency_key, v.fp, v.amount, p.currency,"
    "    v.reason, v.metadata, " ATTEMPT_SQL(PENDING)
    "  FROM v LEFT JOIN payment_attempts p ON p.id = v.attempt"
    "  WHERE NOT EXISTS (SELECT 1 FROM payment_attempts k"
    "    WHERE k.idempotency_key = v.idempotency_key)"
    "  ORDER BY v.n ON CONFLICT DO NOTHING RETURNING id),"
    " tr AS ("
    "  INSERT INTO refund_transitions (refund_id, old_status, new_status, cause, actor,"
    "    reason)"
    "  SELECT id, NULL, " ATTEMPT_SQL(PENDING) ", 'worker', $8, 'recorded' FROM ins)"
    "SELECT id FROM ins";

/* The stored rows every message is compared with: refunds by id or key,
 * and charges by key. */
static const char *SQL_FIND_EXISTING =
    "SELECT id, idempotency_key, request_fingerprint, 'refund' FROM refund_attempts"
    " WHERE id = ANY($1::uuid[]) OR idempotency_key = ANY($2::text[])"
    " UNION ALL SELECT id, idempotency_key, '', 'charge' FROM payment_attempts"
    " WHERE idempotency_key = ANY($2::text[])";
/* clang-format on */

/* The insert's order, which recorded_seq follows: a charge's refunds in
 * their batch (message) order, the charges by id. Two sessions inserting
 * the same refunds so take their rows' locks in one order (a charge's
 * refunds are in the same order in every consumer's partition). */
static int by_charge_then_batch(const void *a, const void *b)
{
    const struct refund_record_item *x = *(const struct refund_record_item *const *)a,
                                    *y = *(const struct refund_record_item *const *)b;
    int c = strcmp(x->cmd->payment_attempt_id, y->cmd->payment_attempt_id);
    return c ? c : (x < y ? -1 : x > y);
}

static void compare_with_stored(struct refund_record_item *it, const PGresult *found)
{
    CHARGED_ASSERT(it && it->cmd && found);
    const struct refund_command *c = it->cmd;
    it->result = REFUND_RECORDED;
    it->reason[0] = '\0';
    for (int r = 0; r < PQntuples(found); r++) {
        const char *id = PQgetvalue(found, r, 0), *key = PQgetvalue(found, r, 1),
                   *fp = PQgetvalue(found, r, 2), *kind = PQgetvalue(found, r, 3);
        int same_key = !strcmp(key, c->idempotency_key);
        if (!strcmp(kind, "charge")) {
            if (same_key) {
                it->result = REFUND_CONFLICT;
                snprintf(it->reason, sizeof(it->reason),
                         "idempotency key already belongs to payment attempt %s", id);
            }
        } else if (!strcmp(id, c->refund_id)) {
            if (!same_key || strcmp(fp, c->fingerprint) != 0) {
                it->result = REFUND_CONFLICT;
                snprintf(it->reason, sizeof(it->reason),
                         "refund %s is already recorded with another key or other "
                         "parameters",
                         id);
            }
        } else if (same_key) {
            it->result = REFUND_CONFLICT;
            snprintf(it->reason, sizeof(it->reason),
                     "idempotency key already belongs to refund %s", id);
        }
    }
}

enum charged_rc refund_store_record(refund_store_t *st,
                                    struct refund_record_item *items, size_t n,
                                    struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    struct stmt ins = {0}, find = {0};
    PGresult *found = NULL;
    struct refund_record_item **sorted = NULL;
    enum charged_rc rc = CHARGED_RETRY;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    if (!(sorted = calloc(n, sizeof(*sorted)))) {
        charged_error_set(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        sorted[i] = &items[i];
    qsort(sorted, n, sizeof(*sorted), by_charge_then_batch);
    int a = stmt_arrays(&ins, 7);
    for (size_t i = 0; i < n; i++) {
        const struct refund_command *c = sorted[i]->cmd;
        stmt_add(&ins, a, c->refund_id);
        stmt_add(&ins, a + 1, c->payment_attempt_id);
        stmt_add(&ins, a + 2, c->idempotency_key);
        stmt_add(&ins, a + 3, c->fingerprint);
        stmt_add_int(&ins, a + 4, c->amount);
        stmt_add(&ins, a + 5, c->reason);
        stmt_add(&ins, a + 6, c->metadata_json ? c->metadata_json : "{}");
    }
    stmt_text(&ins, st->actor);
    if ((rc = stmt_run_keyed(st->db, &ins, SQL_INSERT_PENDING, NULL, err)) !=
        CHARGED_OK)
        goto out;
    stmt_text(&find, ins.p[a]);
    stmt_text(&find, ins.p[a + 2]);
    if ((rc = stmt_run(st->db, &find, SQL_FIND_EXISTING, &found, err)) != CHARGED_OK)
        goto out;
    for (size_t i = 0; i < n; i++)
        compare_with_stored(&items[i], found);
out:
    free(sorted);
    PQclear(found);
    stmt_release(&ins);
    stmt_release(&find);
    return rc;
}

/* ---- claim ---- */

/* clang-format off */
/* What a charge's refunds are bound by: its amount, or what the capture
 * took of an authorization (migration 0016's refunds_within_charge). */
#define SQL_REFUNDABLE(p) \
    "CASE " p ".capture_method WHEN 'manual' THEN coalesce(" p ".captured_amount, 0)" \
    " ELSE " p ".amount END"

/* A PENDING refund is leased only together with its reservation: the
 * charge's row is updated only while it is SUCCEEDED and the reservation
 * stays within its amount, re-read after any concurrent reservation
 * committed (the UPDATE waits for the row, then re-checks its WHERE on the
 * row's newest version). Else the refund is REJECTED here, with its event.
 * Refunds of one charge reserve in the order they were recorded (their
 * messages' order in the charge's partition): one per statement (DISTINCT
 * ON; an UPDATE touches a row once), and none while an earlier one of the
 * last REFUND_ORDER_WINDOW is still PENDING elsewhere; those wait (busy)
 * for a later claim. A refund already reserved (a lease that expired) is
 * taken over without reserving again. A refund of a charge still PENDING or
 * PROCESSING waits for it (as long as REFUND_ORDER_WINDOW); one of a charge
 * UNKNOWN is not_refundable. A refund of an authorization waits the same
 * while a capture is to take it (recorded, in flight or UNKNOWN); one that
 * no capture holds, or that a void holds, is not_refundable at once: no
 * capture before it can take money (a capture behind a void is refused).
 * A refund recorded before its charge
 * takes the charge's order and currency here: its ledger row needs them. */
static const char *SQL_CLAIM =
    "WITH q AS (SELECT DISTINCT id FROM unnest($1::uuid[]) AS q(id)),"
    " lk AS ("
    "  SELECT r.id, r.status, r.payment_attempt_id, r.amount, r.recorded_seq,"
    "    r.created_at FROM refund_attempts r"
    "  JOIN q ON r.id = q.id"
    "  WHERE r.status = " ATTEMPT_SQL(PENDING)
    "     OR (r.status = " ATTEMPT_SQL(PROCESSING) " AND r.next_check_at IS NULL"
    "         AND r.lease_owner IS NOT NULL AND r.lease_expires_at < now())"
    "  ORDER BY r.id FOR NO KEY UPDATE OF r SKIP LOCKED),"
    " c AS (SELECT DISTINCT ON (payment_attempt_id) * FROM lk"
    "  WHERE lk.status <> " ATTEMPT_SQL(PENDING) " OR NOT EXISTS ("
    "    SELECT 1 FROM refund_attempts e WHERE e.payment_attempt_id = lk.payment_attempt_id"
    "    AND e.status = " ATTEMPT_SQL(PENDING) " AND e.recorded_seq < lk.recorded_seq"
    "    AND e.created_at > now() - interval '" REFUND_ORDER_WINDOW "'"
    "    AND e.id NOT IN (SELECT id FROM lk))"
    /* Behind its charge in the partition, a refund may reach the claim
     * while the charge's call is still in flight: it waits for the charge
     * to settle rather than be rejected for it. Behind its capture, the
     * same: while a capture holds the authorization (its call in flight,
     * or UNKNOWN: not one a person must review), or one is recorded and not yet claimed (the claims of a
     * batch run refunds first), the refund waits for what it will take. */
    "  AND (lk.status <> " ATTEMPT_SQL(PENDING) " OR NOT EXISTS ("
    "    SELECT 1 FROM payment_attempts w WHERE w.id = lk.payment_attempt_id"
    "    AND (w.status IN (" ATTEMPT_SQL(PENDING) ", " ATTEMPT_SQL(PROCESSING) ")"
    "      OR (w.status = " ATTEMPT_SQL(AUTHORIZED) " AND ((w.held_by = 'capture'"
    "        AND EXISTS (SELECT 1 FROM capture_attempts h WHERE h.id = w.held_by_id"
    "          AND h.status IN (" ATTEMPT_SQL(PROCESSING) ", " ATTEMPT_SQL(UNKNOWN) ")))"
    "        OR (w.held_by IS NULL AND EXISTS (SELECT 1 FROM capture_attempts k"
    "          WHERE k.payment_attempt_id = w.id"
    "          AND k.status = " ATTEMPT_SQL(PENDING) ")))))"
    "    AND lk.created_at > now() - interval '" REFUND_ORDER_WINDOW "'))"
    "  ORDER BY payment_attempt_id, recorded_seq),"
    " res AS ("
    "  UPDATE payment_attempts p SET refund_reserved = p.refund_reserved + c.amount"
    "  FROM c WHERE c.status = " ATTEMPT_SQL(PENDING) " AND p.id = c.payment_attempt_id"
    "    AND p.status = " ATTEMPT_SQL(SUCCEEDED)
    "    AND p.refund_reserved + c.amount <= " SQL_REFUNDABLE("p")
    "  RETURNING c.id AS refund_id, p.provider_payment_id),"
    " d AS ("
    "  SELECT c.id, c.status AS old_status,"
    "    CASE WHEN c.status <> " ATTEMPT_SQL(PENDING) " OR res.refund_id IS NOT NULL"
    "      THEN NULL"
    "      WHEN p.id IS NULL THEN 'not_refundable: payment attempt ' ||"
    "        c.payment_attempt_id || ' is not recorded'"
    "      WHEN p.status <> " ATTEMPT_SQL(SUCCEEDED) " THEN 'not_refundable: payment"
    " attempt ' || p.id || ' is ' || p.status ||"
    "        CASE WHEN p.status <> " ATTEMPT_SQL(AUTHORIZED) " THEN ''"
    "          WHEN p.held_by = 'void' THEN ' (void ' || p.held_by_id || ' releases it)'"
    "          WHEN p.held_by = 'capture' THEN ' (capture ' || p.held_by_id ||"
    "            ' not settled)'"
    "          ELSE ' (nothing captured)' END"
    "      ELSE 'exceeds_charge: ' || c.amount || ' more would pass the charge of ' ||"
    "        " SQL_REFUNDABLE("p") " || ' (' || p.refund_reserved ||"
    "        ' refunded or in flight)' END"
    "      AS rejected,"
    "    res.provider_payment_id, p.order_id, p.currency"
    "  FROM c LEFT JOIN res ON res.refund_id = c.id"
    "  LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id),"
    " u AS ("
    "  UPDATE refund_attempts r SET"
    "    status = CASE WHEN d.rejected IS NULL THEN " ATTEMPT_SQL(PROCESSING)
    "      ELSE " ATTEMPT_SQL(REJECTED) " END,"
    "    reason = d.rejected,"
    "    reserved = r.reserved OR d.provider_payment_id IS NOT NULL,"
    "    payment_intent = coalesce(r.payment_intent, d.provider_payment_id),"
    "    order_id = coalesce(r.order_id, d.order_id),"
    "    currency = coalesce(r.currency, d.currency),"
    "    lease_owner = CASE WHEN d.rejected IS NULL THEN $2 END,"
    "    lease_expires_at = CASE WHEN d.rejected IS NULL THEN"
    "      now() + make_interval(secs => $3::double precision / 1000) END,"
    "    lease_epoch = r.lease_epoch + 1,"
    "    first_sent_at = CASE WHEN d.rejected IS NULL"
    "      THEN coalesce(r.first_sent_at, now()) END,"
    "    updated_at = " SQL_CHANGED_AT("r")
    "  FROM d WHERE r.id = d.id"
    "  RETURNING r.id, r.payment_attempt_id, r.order_id, r.amount, r.currency,"
    "    r.provider_refund_id, r.status, r.reason, r.updated_at, d.old_status,"
    "    CASE WHEN r.status = " ATTEMPT_SQL(REJECTED) " THEN $4::text END AS event_type,"
    "    r.lease_epoch,"
    "    (extract(epoch FROM now() - r.first_sent_at) * 1000)::bigint AS key_age_ms,"
    "    r.idempotency_key, r.payment_intent, r.refund_reason),"
    " t AS ("
    "  INSERT INTO refund_transitions (refund_id, old_status, new_status, cause, actor,"
    "    reason, created_at)"
    "  SELECT id, old_status, status, 'worker', $2,"
    "    CASE WHEN status = " ATTEMPT_SQL(REJECTED) " THEN reason"
    "         WHEN old_status = " ATTEMPT_SQL(PENDING) " THEN 'claimed'"
    "         ELSE 'lease expired; taken over' END, updated_at FROM u),"
    SQL_REFUND_OUTBOX_EVENTS("u")
    "SELECT a.id, a.status, a.lease_owner IS NOT NULL, u.status, u.reason,"
    "  u.lease_epoch, u.key_age_ms, u.idempotency_key, u.payment_intent,"
    "  u.payment_attempt_id, u.amount, u.refund_reason"
    " FROM refund_attempts a JOIN q ON a.id = q.id LEFT JOIN u ON u.id = a.id";
/* clang-format on */

static void read_claim(struct refund_claim_item *items, size_t i, const PGresult *r,
                       const str_index_t *rows)
{
    CHARGED_ASSERT(items && r);
    struct refund_claim_item *it = &items[i];
    int row = stmt_row_in(rows, r, 0, it->refund_id);
    it->result = REFUND_BUSY;
    it->status[0] = it->rejected[0] = '\0';
    if (row < 0)
        return;
    stmt_col_copy(r, row, 1, it->status, sizeof(it->status));
    int leased = stmt_col_true(r, row, 2);
    if (!PQgetisnull(r, row, 3)) {
        for (size_t j = 0; j < i; j++)
            if (items[j].result != REFUND_BUSY &&
                !strcmp(items[j].refund_id, it->refund_id))
                return;
        if (!strcmp(PQgetvalue(r, row, 3), ATTEMPT_S_REJECTED)) {
            it->result = REFUND_SETTLED;
            stmt_col_copy(r, row, 4, it->rejected, sizeof(it->rejected));
            return;
        }
        it->result = REFUND_CLAIMED;
        it->lease_epoch = stmt_col_int(r, row, 5);
        /* Claimed by this statement: a lease's first epoch is 1. */
        CHARGED_ASSERT(it->lease_epoch > 0);
        it->key_age_ms = stmt_col_int(r, row, 6);
        col_params(r, row, 7, &it->params);
    } else if (strcmp(it->status, ATTEMPT_S_PENDING) != 0 &&
               (strcmp(it->status, ATTEMPT_S_PROCESSING) != 0 || !leased)) {
        it->result = REFUND_SETTLED;
    }
}

enum charged_rc refund_store_claim(refund_store_t *st, struct refund_claim_item *items,
                                   size_t n, long long lease_ms,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    struct stmt s = {0};
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int ids = stmt_arrays(&s, 1);
    for (size_t i = 0; i < n; i++)
        stmt_add(&s, ids, items[i].refund_id);
    stmt_text(&s, st->actor);
    stmt_int(&s, lease_ms);
    stmt_text(&s, attempt_status_refund_event_type(ATTEMPT_STATUS_REJECTED));
    if ((rc = stmt_run(st->db, &s, SQL_CLAIM, &r, err)) == CHARGED_OK) {
        str_index_t *rows = stmt_index_rows(r, 0);
        for (size_t i = 0; i < n; i++)
            read_claim(items, i, r, rows);
        str_index_free(rows);
    }
    /* Claimed, the params to send are the stored refund's, reserved. */
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++)
        CHARGED_ASSERT(items[i].result != REFUND_CLAIMED || items[i].params.amount > 0);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* ---- provider calls ---- */

/* clang-format off */
static const char *SQL_LOG_CALLS = SQL_STEP_LOG_CALLS("refund_attempts", "refund_id");
/* clang-format on */

/* Call i of a batch of struct refund_call, for stmt_add_calls. */
static void call_of(const void *items, size_t i, struct stmt_call *c)
{
    const struct refund_call *r = &((const struct refund_call *)items)[i];
    *c = (struct stmt_call){r->refund_id, r->operation, r->started_ms, r->res,
                            r->written_maybe};
}

enum charged_rc refund_store_log_calls(refund_store_t *st,
                                       const struct refund_call *calls, size_t n,
                                       struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(calls || n == 0);
    return stmt_log_calls(st->db, st->actor, SQL_LOG_CALLS, calls, n, call_of, "refund",
                          err);
}

/* ---- persist ---- */

/* clang-format off */
static const char *SQL_PERSIST =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[],"
    "    $5::text[], $6::text[], $7::jsonb[], $8::int[], $9::text[], $10::bigint[])"
    "  AS v(id, epoch, status, reason, prid, event_type, evidence, calls, last_error,"
    "       next_check_ms)),"
    SQL_LEASES_UNLOCKED("refund_attempts") ","
    " u AS ("
    "  UPDATE refund_attempts p SET status = v.status, reason = v.reason,"
    "    provider_refund_id = coalesce(v.prid, p.provider_refund_id),"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = p.attempt_count + v.calls, last_error = v.last_error,"
    "    next_check_at = CASE WHEN v.next_check_ms IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => v.next_check_ms / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM lk AS v"
    "  WHERE p.id = v.id AND p.lease_owner = $11 AND p.lease_epoch = v.epoch"
    "    AND p.status = " ATTEMPT_SQL(PROCESSING)
    "  RETURNING p.id, p.payment_attempt_id, p.order_id, p.amount, p.currency,"
    "    p.provider_refund_id, p.status, p.reason, p.updated_at, v.event_type,"
    "    v.evidence),"
    " t AS ("
    "  INSERT INTO refund_transitions (refund_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, " ATTEMPT_SQL(PROCESSING) ", status, 'worker', $11, reason, evidence,"
    "    updated_at FROM u),"
    SQL_REFUND_OUTBOX_EVENTS("u")
    SQL_PERSIST_RESULT("refund_attempts");
/* clang-format on */

/* Item i of a batch of struct refund_outcome, for stmt_persist. */
static void outcome_of(void *items, size_t i, struct stmt_outcome *o)
{
    CHARGED_ASSERT(items);
    struct refund_outcome *it = &((struct refund_outcome *)items)[i];
    /* In struct stmt_outcome's order. */
    *o = (struct stmt_outcome){
        it->refund_id,          it->lease_epoch,   it->status,        it->reason,
        it->provider_refund_id, it->event_type,    it->evidence_json, it->calls,
        it->last_error,         it->next_check_ms, &it->persisted,    &it->busy};
}

enum charged_rc refund_store_persist(refund_store_t *st, struct refund_outcome *items,
                                     size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    return stmt_persist(st->db, st->actor, SQL_PERSIST, items, n, outcome_of, err);
}

/* ---- leases ---- */

static const char *SQL_RENEW = SQL_LEASE_RENEW("refund_attempts");
static const char *SQL_RELEASE =
    SQL_LEASE_END("refund_attempts", "lease_expires_at = now()");
static const char *SQL_HAND_BACK =
    SQL_LEASE_END("refund_attempts", "lease_owner = NULL, lease_expires_at = NULL");

enum charged_rc refund_store_renew(refund_store_t *st, const char *const *refund_ids,
                                   const int64_t *epochs, size_t n, long long lease_ms,
                                   int *still_ours, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(n == 0 || (refund_ids && epochs && still_ours));
    PGresult *r;
    enum charged_rc rc;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if ((rc = stmt_lease(st->db, st->actor, SQL_RENEW, refund_ids, epochs, n, &lease_ms,
                         &r, err)) != CHARGED_OK)
        return rc;
    str_index_t *rows = stmt_index_rows(r, 0);
    for (size_t i = 0; i < n; i++)
        still_ours[i] = stmt_row_in(rows, r, 0, refund_ids[i]) >= 0;
    str_index_free(rows);
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc refund_store_release(refund_store_t *st, const char *const *refund_ids,
                                     const int64_t *epochs, size_t n,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(n == 0 || (refund_ids && epochs));
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    return stmt_lease(st->db, st->actor, SQL_RELEASE, refund_ids, epochs, n, NULL, NULL,
                      err);
}

enum charged_rc refund_store_hand_back(refund_store_t *st,
                                       const char *const *refund_ids,
                                       const int64_t *epochs, size_t n,
                                       struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(n == 0 || (refund_ids && epochs));
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    return stmt_lease(st->db, st->actor, SQL_HAND_BACK, refund_ids, epochs, n, NULL,
                      NULL, err);
}

/* ---- reconciliation ---- */

/* clang-format off */
static const char *SQL_CLAIM_DUE =
    SQL_STEP_CLAIM_DUE("refund_attempts")
    "coalesce(p.provider_refund_id, ''),"
    "  coalesce((extract(epoch FROM now() - p.first_sent_at) * 1000)::bigint, -1),"
    "  (extract(epoch FROM now() - p.created_at) * 1000)::bigint, p.reconcile_checks,"
    "  p.idempotency_key, coalesce(p.payment_intent, ''), p.payment_attempt_id,"
    "  p.amount, p.refund_reason";

static const char *SQL_SETTLE =
    "WITH lk AS ("
    "  SELECT id, status AS old_status FROM refund_attempts"
    "  WHERE id = $1::uuid AND status = $2 AND lease_owner = $4"
    "    AND lease_epoch = $3::bigint"
    "  FOR NO KEY UPDATE SKIP LOCKED),"
    " u AS ("
    "  UPDATE refund_attempts p SET status = $5,"
    "    reason = CASE WHEN $5 = lk.old_status THEN p.reason ELSE $6::text END,"
    "    last_error = CASE WHEN $5 = lk.old_status THEN coalesce($6::text, p.last_error)"
    "      ELSE p.last_error END,"
    "    provider_refund_id = coalesce($7::text, p.provider_refund_id),"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = p.attempt_count + $9::int,"
    "    reconcile_checks = p.reconcile_checks + $21::int,"
    "    next_check_at = CASE WHEN $10::bigint IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => $10::bigint / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM lk WHERE p.id = lk.id"
    "  RETURNING p.id, p.payment_attempt_id, p.order_id, p.amount, p.currency,"
    "    p.provider_refund_id, p.status, p.reason, p.updated_at, lk.old_status,"
    "    $8::jsonb AS evidence,"
    "    CASE WHEN p.status <> lk.old_status THEN $11::text END AS event_type),"
    " t AS ("
    "  INSERT INTO refund_transitions (refund_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, old_status, status, 'reconciler', $4, reason, evidence, updated_at"
    "  FROM u WHERE status <> old_status),"
    SQL_REFUND_OUTBOX_EVENTS("u") ","
    " pc AS ("
    SQL_STEP_CALLS("refund_attempts", "refund_id",
                   "$12", "$13", "$14", "$15", "$16", "$17", "$18", "$19", "$20",
                   "$4", "") ")"
    /* Settled, or busy: the row is what the settlement expects, but another
     * session holds it locked (nothing was written; nothing waited). */
    "SELECT (SELECT count(*) FROM u),"
    "  NOT EXISTS (SELECT 1 FROM lk) AND EXISTS (SELECT 1 FROM refund_attempts"
    "    WHERE id = $1::uuid AND status = $2 AND lease_owner = $4"
    "    AND lease_epoch = $3::bigint)";
/* clang-format on */

enum charged_rc refund_store_claim_due(refund_store_t *st, struct refund_due *out,
                                       size_t max, size_t *n, long long lease_ms,
                                       long long stale_ms, struct charged_error *err)
{
    CHARGED_ASSERT(st && n);
    CHARGED_ASSERT(out || max == 0);
    struct stmt s = {0};
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    *n = 0;
    if (max == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    stmt_text(&s, st->actor);
    stmt_int(&s, lease_ms);
    stmt_int(&s, (long long)max);
    stmt_int(&s, stale_ms);
    if ((rc = stmt_run(st->db, &s, SQL_CLAIM_DUE, &r, err)) == CHARGED_OK)
        for (int i = 0; i < PQntuples(r) && *n < max; i++) {
            struct refund_due *d = &out[(*n)++];
            memset(d, 0, sizeof(*d));
            stmt_col_copy(r, i, 0, d->id, sizeof(d->id));
            d->lease_epoch = stmt_col_int(r, i, 1);
            d->status = (enum attempt_status)attempt_status_parse(PQgetvalue(r, i, 2));
            stmt_col_copy(r, i, 3, d->provider_refund_id,
                          sizeof(d->provider_refund_id));
            d->key_age_ms = stmt_col_int(r, i, 4);
            d->age_ms = stmt_col_int(r, i, 5);
            d->checks = (int)stmt_col_int(r, i, 6);
            col_params(r, i, 7, &d->params);
        }
    /* Claimed by SQL_CLAIM_DUE, under a lease; never more than asked. */
    for (size_t i = 0; i < *n; i++)
        CHARGED_ASSERT(out[i].lease_epoch > 0);
    CHARGED_ASSERT(*n <= max);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

enum charged_rc refund_store_settle(refund_store_t *st, struct refund_settlement *it,
                                    struct charged_error *err)
{
    CHARGED_ASSERT(st && it && it->refund_id);
    CHARGED_ASSERT(it->calls || it->ncalls == 0);
    struct stmt s = {0};
    PGresult *r = NULL;
    enum charged_rc rc;
    int nrefunds = 0;

    charged_error_clear(err);
    it->settled = it->busy = 0;
    if (it->status != it->expected &&
        !attempt_status_transition_allowed((int)it->expected, it->status)) {
        charged_error_set(err, "status %s may not follow %s",
                          attempt_status_name(it->status),
                          attempt_status_name(it->expected));
        return CHARGED_BAD_ITEM;
    }
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    for (size_t i = 0; i < it->ncalls; i++)
        if (!it->calls[i].operation || !strcmp(it->calls[i].operation, "refund"))
            nrefunds++;
    stmt_text(&s, it->refund_id);
    stmt_text(&s, attempt_status_name(it->expected));
    stmt_int(&s, it->lease_epoch);
    stmt_text(&s, st->actor);
    stmt_text(&s, attempt_status_name(it->status));
    stmt_text(&s, it->reason);
    stmt_text(&s, or_null(it->provider_refund_id));
    stmt_text(&s, it->evidence_json ? it->evidence_json : "{}");
    stmt_int(&s, nrefunds);
    stmt_int_or_null(&s, it->next_check_ms);
    stmt_text(&s, attempt_status_refund_event_type(it->status));
    stmt_add_calls(&s, stmt_arrays(&s, 9), it->calls, it->ncalls, call_of, "refund");
    stmt_int(&s, it->throttled ? 0 : 1); /* a throttled look is no look */
    if ((rc = stmt_run(st->db, &s, SQL_SETTLE, &r, err)) == CHARGED_OK) {
        it->settled = stmt_col_int(r, 0, 0) == 1;
        it->busy = stmt_col_true(r, 0, 1);
    }
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* clang-format off */
static const char *SQL_BACKLOG =
    "SELECT status, count(*),"
    "  (extract(epoch FROM now() - min(created_at)) * 1000)::bigint"
    " FROM refund_attempts WHERE status = ANY($1::text[]) GROUP BY status";
/* clang-format on */

enum charged_rc refund_store_backlog(refund_store_t *st,
                                     const enum attempt_status *statuses, size_t n,
                                     long long *counts, long long *oldest_ms,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(st && statuses && counts && oldest_ms);
    return stmt_backlog(st->db, SQL_BACKLOG, statuses, n, counts, oldest_ms, err);
}
