#include "capture_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "capture_sql.h"
#include "charged_assert.h"
#include "lease_sql.h"
#include "op_shared.h"
#include "store_conn.h"
#include "step_sql.h"
#include "store_stmt.h"

struct capture_store {
    store_conn_t *db;
    char *actor;
};

/* As the refund store's: an insert's unique index, and the hold on the
 * authorization's row, wait at most this long for another session. */
#define CAPTURE_LOCK_TIMEOUT "100ms"

/* How long a capture waits for its authorization still PENDING or
 * PROCESSING (its call in flight, ahead of it in the partition): long
 * enough for it to settle, and a bound. */
#define CAPTURE_ORDER_WINDOW "5 minutes"

/* capture_store_new, _free and _ping. */
STMT_STORE_SESSION(capture_store, CAPTURE_LOCK_TIMEOUT)
STMT_STORE_WAIT(capture_store, "capture_attempts")

const char *capture_status_event_type(enum attempt_status status)
{
    switch (status) {
    case ATTEMPT_STATUS_SUCCEEDED:
        return "capture.succeeded";
    case ATTEMPT_STATUS_FAILED:
        return "capture.failed";
    case ATTEMPT_STATUS_UNKNOWN:
        return "capture.unknown";
    case ATTEMPT_STATUS_REJECTED:
        return "capture.rejected";
    case ATTEMPT_STATUS_REQUIRES_REVIEW:
        return "capture.requires_review";
    default:
        return NULL;
    }
}

/* What the provider is called with, from four columns starting at first:
 * idempotency_key, payment_intent, payment_attempt_id, amount (0: all). */
static void col_params(const PGresult *r, int row, int first, struct capture_params *pa)
{
    CHARGED_ASSERT(r && pa && row >= 0 && first >= 0);
    stmt_col_copy(r, row, first, pa->idempotency_key, sizeof(pa->idempotency_key));
    stmt_col_copy(r, row, first + 1, pa->payment_intent, sizeof(pa->payment_intent));
    stmt_col_copy(r, row, first + 2, pa->payment_attempt_id,
                  sizeof(pa->payment_attempt_id));
    pa->amount = stmt_col_int(r, row, first + 3);
    CHARGED_ASSERT(pa->amount >= 0);
}

/* A transaction's end: COMMIT when rc is CHARGED_OK, else ROLLBACK (its
 * failure ignored: the session is then broken, and re-opened). */
static enum charged_rc tx_end(store_conn_t *db, enum charged_rc rc,
                              struct charged_error *err)
{
    struct charged_error ignore;
    if (rc == CHARGED_OK)
        return store_conn_exec(db, "COMMIT", 0, NULL, NULL, err);
    store_conn_exec(db, "ROLLBACK", 0, NULL, NULL, &ignore);
    return rc;
}

/* ---- record ---- */

/* clang-format off */
/* A key any operation already holds (idempotency_keys: charges, refunds,
 * captures, voids) is never taken by a capture. The authorization's order
 * and currency are copied when it is known. */
static const char *SQL_INSERT_PENDING =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::bigint[], $6::jsonb[])"
    "  WITH ORDINALITY AS v(id, attempt, idempotency_key, fp, amount, metadata, n)),"
    " ins AS ("
    "  INSERT INTO capture_attempts (id, payment_attempt_id, order_id, idempotency_key,"
    "    request_fingerprint, amount, currency, metadata, status)"
    "  SELECT v.id, v.attempt, p.order_id, v.idempotency_key, v.fp, v.amount, p.currency,"
    "    v.metadata, " ATTEMPT_SQL(PENDING)
    "  FROM v LEFT JOIN payment_attempts p ON p.id = v.attempt"
    "  WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k"
    "    WHERE k.idempotency_key = v.idempotency_key)"
    "  ORDER BY v.n ON CONFLICT DO NOTHING RETURNING id),"
    " tr AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason)"
    "  SELECT id, NULL, " ATTEMPT_SQL(PENDING) ", 'worker', $7, 'recorded' FROM ins)"
    "SELECT id FROM ins";

/* The stored rows every message is compared with: captures by id, and
 * every operation's key. */
static const char *SQL_FIND_EXISTING =
    "SELECT c.id, c.idempotency_key, c.request_fingerprint, 'capture'"
    " FROM capture_attempts c WHERE c.id = ANY($1::uuid[])"
    " UNION ALL SELECT k.owner_id, k.idempotency_key,"
    "  coalesce(c.request_fingerprint, ''), k.kind FROM idempotency_keys k"
    "  LEFT JOIN capture_attempts c ON k.kind = 'capture' AND c.id = k.owner_id"
    " WHERE k.idempotency_key = ANY($2::text[])";
/* clang-format on */

static void compare_with_stored(struct engine_record *it, const PGresult *found)
{
    CHARGED_ASSERT(it && it->command && found);
    const struct capture_command *c = it->command;
    it->result = ENGINE_RECORDED;
    it->reason[0] = '\0';
    for (int r = 0; r < PQntuples(found); r++) {
        const char *id = PQgetvalue(found, r, 0), *key = PQgetvalue(found, r, 1),
                   *fp = PQgetvalue(found, r, 2), *kind = PQgetvalue(found, r, 3);
        int same_key = !strcmp(key, c->idempotency_key);
        if (strcmp(kind, "capture") != 0) {
            if (same_key) {
                it->result = ENGINE_CONFLICT;
                snprintf(it->reason, sizeof(it->reason),
                         "idempotency key already belongs to %s %s", kind, id);
            }
        } else if (!strcmp(id, c->capture_id)) {
            if (!same_key || strcmp(fp, c->fingerprint) != 0) {
                it->result = ENGINE_CONFLICT;
                snprintf(it->reason, sizeof(it->reason),
                         "capture %s is already recorded with another key or other "
                         "parameters",
                         id);
            }
        } else if (same_key) {
            it->result = ENGINE_CONFLICT;
            snprintf(it->reason, sizeof(it->reason),
                     "idempotency key already belongs to capture %s", id);
        }
    }
}

enum charged_rc capture_store_record(capture_store_t *st, struct engine_record *items,
                                     size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    struct stmt ins = {0}, find = {0};
    PGresult *found = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int a = stmt_arrays(&ins, 6);
    for (size_t i = 0; i < n; i++) {
        const struct capture_command *c = items[i].command;
        stmt_add(&ins, a, c->capture_id);
        stmt_add(&ins, a + 1, c->payment_attempt_id);
        stmt_add(&ins, a + 2, c->idempotency_key);
        stmt_add(&ins, a + 3, c->fingerprint);
        if (c->amount > 0)
            stmt_add_int(&ins, a + 4, c->amount);
        else
            stmt_add(&ins, a + 4, NULL); /* all that is held */
        stmt_add(&ins, a + 5, c->metadata_json ? c->metadata_json : "{}");
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
    PQclear(found);
    stmt_release(&ins);
    stmt_release(&find);
    return rc;
}

/* ---- claim: the hold, then the lease ---- */

/* clang-format off */
/* The race's one decision, before any call: of the PENDING captures of an
 * authorization in this batch, the first recorded takes the hold, only
 * from AUTHORIZED and unheld, and only for an amount within it. Committed
 * on its own: the claim below reads it, and a capture that holds and was
 * not yet leased (a crash between the two) is leased by its next claim. */
static const char *SQL_HOLD =
    "WITH c AS (SELECT DISTINCT ON (r.payment_attempt_id) r.id, r.payment_attempt_id,"
    "  r.amount FROM capture_attempts r"
    "  WHERE r.id = ANY($1::uuid[]) AND r.status = " ATTEMPT_SQL(PENDING)
    "  ORDER BY r.payment_attempt_id, r.recorded_seq)"
    "UPDATE payment_attempts p SET held_by = 'capture', held_by_id = c.id FROM c"
    " WHERE p.id = c.payment_attempt_id AND p.status = " ATTEMPT_SQL(AUTHORIZED)
    "   AND p.held_by IS NULL AND p.capture_method = 'manual'"
    "   AND coalesce(c.amount, p.amount) <= p.amount";

/* A PENDING capture that holds its authorization is leased (PROCESSING),
 * and a capture of "all" (amount NULL) becomes a definite amount there,
 * the authorization's, before any call: every writer then books it only
 * for that amount (capture_store_book), and the request names it
 * (amount_to_capture). A takeover keeps the amount as it is, so that a
 * capture claimed without one is still sent as it first was under its key.
 * One that cannot hold it is REJECTED with its reason code and event; one
 * whose authorization is still to be decided (its call in flight, or free
 * but taken by another capture of this batch) waits (busy). A PROCESSING
 * one whose lease expired before any look is taken over. */
static const char *SQL_CLAIM =
    "WITH q AS (SELECT DISTINCT id FROM unnest($1::uuid[]) AS q(id)),"
    " lk AS ("
    "  SELECT r.id, r.status, r.payment_attempt_id, r.amount, r.created_at"
    "  FROM capture_attempts r JOIN q ON r.id = q.id"
    "  WHERE r.status = " ATTEMPT_SQL(PENDING)
    "     OR (r.status = " ATTEMPT_SQL(PROCESSING) " AND r.next_check_at IS NULL"
    "         AND r.lease_owner IS NOT NULL AND r.lease_expires_at < now())"
    "  ORDER BY r.id FOR NO KEY UPDATE OF r SKIP LOCKED),"
    " d AS ("
    "  SELECT lk.id, lk.status AS old_status, p.provider_payment_id, p.order_id,"
    "    p.currency, p.amount AS authorized,"
    "    CASE WHEN lk.status <> " ATTEMPT_SQL(PENDING) " OR p.held_by_id = lk.id"
    "      THEN NULL"
    "      WHEN p.id IS NULL THEN 'attempt_unknown: payment attempt ' ||"
    "        lk.payment_attempt_id || ' is not recorded'"
    "      WHEN p.capture_method <> 'manual' THEN 'not_authorized: payment attempt ' ||"
    "        p.id || ' is a charge, not an authorization'"
    "      WHEN p.status = " ATTEMPT_SQL(SUCCEEDED) " THEN 'already_captured: payment"
    " attempt ' || p.id || ' captured ' || p.captured_amount"
    "      WHEN p.status = " ATTEMPT_SQL(VOIDED) " AND EXISTS (SELECT 1 FROM void_attempts"
    "        v WHERE v.payment_attempt_id = p.id AND v.status = " ATTEMPT_SQL(SUCCEEDED) ")"
    "        THEN 'capture_after_void: payment attempt ' || p.id || ' was voided'"
    "      WHEN p.status = " ATTEMPT_SQL(VOIDED) " THEN 'authorization_voided: payment"
    " attempt ' || p.id || ' is VOIDED: ' || coalesce(p.reason, 'released')"
    "      WHEN p.held_by = 'void' THEN 'capture_after_void: void ' || p.held_by_id ||"
    "        ' holds payment attempt ' || p.id"
    "      WHEN p.held_by = 'capture' THEN 'authorization_held: capture ' ||"
    "        p.held_by_id || ' holds payment attempt ' || p.id"
    "      WHEN p.status IN (" ATTEMPT_SQL(PENDING) ", " ATTEMPT_SQL(PROCESSING) ")"
    "        AND lk.created_at > now() - interval '" CAPTURE_ORDER_WINDOW "' THEN ''"
    "      WHEN p.status <> " ATTEMPT_SQL(AUTHORIZED) " THEN 'not_authorized: payment"
    " attempt ' || p.id || ' is ' || p.status"
    "      WHEN lk.amount > p.amount THEN 'amount_over_authorized: ' || lk.amount ||"
    "        ' is more than the authorization of ' || p.amount"
    "      ELSE '' END AS rejected"
    "  FROM lk LEFT JOIN payment_attempts p ON p.id = lk.payment_attempt_id),"
    " u AS ("
    "  UPDATE capture_attempts r SET"
    "    status = CASE WHEN d.rejected IS NULL THEN " ATTEMPT_SQL(PROCESSING)
    "      ELSE " ATTEMPT_SQL(REJECTED) " END,"
    "    reason = d.rejected,"
    "    holds = r.holds OR d.rejected IS NULL,"
    "    amount = CASE WHEN d.rejected IS NULL AND d.old_status = " ATTEMPT_SQL(PENDING)
    "      THEN coalesce(r.amount, d.authorized) ELSE r.amount END,"
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
    "  FROM d WHERE r.id = d.id AND (d.rejected IS NULL OR d.rejected <> '')"
    "  RETURNING r.id, r.payment_attempt_id, r.order_id,"
    "    " SQL_CAPTURE_AMOUNT("r", "d.authorized") " AS amount, r.currency,"
    "    r.payment_intent, r.status, r.reason, r.updated_at, d.old_status,"
    "    CASE WHEN r.status = " ATTEMPT_SQL(REJECTED) " THEN 'capture.rejected' END"
    "      AS event_type, r.lease_epoch,"
    "    (extract(epoch FROM now() - r.first_sent_at) * 1000)::bigint AS key_age_ms,"
    "    r.idempotency_key, coalesce(r.amount, 0) AS asked),"
    " t AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason, created_at)"
    "  SELECT id, old_status, status, 'worker', $2,"
    "    CASE WHEN status = " ATTEMPT_SQL(REJECTED) " THEN reason"
    "         WHEN old_status = " ATTEMPT_SQL(PENDING) " THEN 'claimed'"
    "         ELSE 'lease expired; taken over' END, updated_at FROM u),"
    SQL_CAPTURE_OUTBOX_EVENTS("u")
    "SELECT a.id, a.status, a.lease_owner IS NOT NULL, u.status, u.reason,"
    "  u.lease_epoch, u.key_age_ms, u.idempotency_key, u.payment_intent,"
    "  u.payment_attempt_id, u.asked"
    " FROM capture_attempts a JOIN q ON a.id = q.id LEFT JOIN u ON u.id = a.id";
/* clang-format on */

static void read_claim(struct engine_claim *items, size_t i, const PGresult *r,
                       const str_index_t *rows)
{
    CHARGED_ASSERT(items && r);
    struct engine_claim *it = &items[i];
    struct capture_params pa;
    int row = stmt_row_in(rows, r, 0, it->id);
    it->result = ENGINE_BUSY;
    it->status[0] = it->rejected[0] = '\0';
    if (row < 0)
        return;
    stmt_col_copy(r, row, 1, it->status, sizeof(it->status));
    int leased = stmt_col_true(r, row, 2);
    if (!PQgetisnull(r, row, 3)) {
        for (size_t j = 0; j < i; j++)
            if (items[j].result != ENGINE_BUSY && !strcmp(items[j].id, it->id))
                return;
        if (!strcmp(PQgetvalue(r, row, 3), ATTEMPT_S_REJECTED)) {
            it->result = ENGINE_SETTLED;
            stmt_col_copy(r, row, 4, it->rejected, sizeof(it->rejected));
            return;
        }
        memset(&pa, 0, sizeof(pa));
        col_params(r, row, 7, &pa);
        /* Claimed by this statement: a lease's first epoch is 1. */
        op_batch_claimed(it, ENGINE_CLAIMED, stmt_col_int(r, row, 5),
                         stmt_col_int(r, row, 6), it->status, &pa, sizeof(pa));
        CHARGED_ASSERT(it->lease_epoch > 0);
    } else if (strcmp(it->status, ATTEMPT_S_PENDING) != 0 &&
               (strcmp(it->status, ATTEMPT_S_PROCESSING) != 0 || !leased)) {
        it->result = ENGINE_SETTLED;
    }
}

enum charged_rc capture_store_claim(capture_store_t *st, struct engine_claim *items,
                                    size_t n, long long lease_ms,
                                    struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    struct stmt h = {0}, s = {0};
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int hids = stmt_arrays(&h, 1), ids = stmt_arrays(&s, 1);
    for (size_t i = 0; i < n; i++) {
        stmt_add(&h, hids, items[i].id);
        stmt_add(&s, ids, items[i].id);
    }
    stmt_text(&s, st->actor);
    stmt_int(&s, lease_ms);
    if ((rc = stmt_run(st->db, &h, SQL_HOLD, NULL, err)) == CHARGED_OK &&
        (rc = stmt_run(st->db, &s, SQL_CLAIM, &r, err)) == CHARGED_OK) {
        str_index_t *rows = stmt_index_rows(r, 0);
        for (size_t i = 0; i < n; i++)
            read_claim(items, i, r, rows);
        str_index_free(rows);
    }
    PQclear(r);
    stmt_release(&h);
    stmt_release(&s);
    return rc;
}

/* ---- provider calls ---- */

/* clang-format off */
static const char *SQL_LOG_CALLS = SQL_STEP_LOG_CALLS("capture_attempts", "capture_id");
/* clang-format on */

/* Call i of a batch of struct capture_call, for stmt_add_calls. */
static void call_of(const void *items, size_t i, struct stmt_call *c)
{
    const struct capture_call *k = &((const struct capture_call *)items)[i];
    *c = (struct stmt_call){k->capture_id, k->operation, k->started_ms, k->res,
                            k->written_maybe};
}

enum charged_rc capture_store_log_calls(capture_store_t *st,
                                        const struct capture_call *calls, size_t n,
                                        struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(calls || n == 0);
    return stmt_log_calls(st->db, st->actor, SQL_LOG_CALLS, calls, n, call_of,
                          "capture", err);
}

/* ---- the authorization's side of a success ---- */

/* clang-format off */
/* The captures still holding their authorization as the caller expects
 * (locked; one another session holds is skipped, and so not booked), for
 * exactly the amount each asked (a capture of "all" asked the
 * authorization's amount: resolved at its claim, or here for one claimed
 * before that was so; another amount taken is never booked as it), and
 * their authorizations moved to SUCCEEDED with what was captured, a
 * transition and the ledger's charge row (the amount captured). The
 * capture's own row is the caller's next statement: the
 * authorization_steps_hold trigger sees this one's change. */
static const char *SQL_BOOK =
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::bigint[],"
    "  $4::text[]) AS v(id, epoch, amount, expected)),"
    " c AS (SELECT c.id, c.payment_attempt_id, v.amount FROM capture_attempts c"
    "  JOIN v ON c.id = v.id"
    "  WHERE c.holds AND (c.status = v.expected OR (v.expected IS NULL AND c.status IN ("
    "    " ATTEMPT_SQL(UNKNOWN) ", " ATTEMPT_SQL(PROCESSING) ")))"
    "    AND (v.epoch IS NULL OR (c.lease_owner = $5 AND c.lease_epoch = v.epoch))"
    "    AND coalesce(c.amount, (SELECT a.amount FROM payment_attempts a"
    "      WHERE a.id = c.payment_attempt_id)) = v.amount"
    "  ORDER BY c.id FOR NO KEY UPDATE OF c SKIP LOCKED),"
    " u AS ("
    "  UPDATE payment_attempts p SET status = " ATTEMPT_SQL(SUCCEEDED) ","
    "    captured_amount = c.amount, reason = NULL,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM c WHERE p.id = c.payment_attempt_id AND p.status = " ATTEMPT_SQL(AUTHORIZED)
    "    AND p.held_by = 'capture' AND p.held_by_id = c.id"
    "    AND c.amount BETWEEN 1 AND p.amount"
    "  RETURNING p.id, p.order_id, p.captured_amount AS amount, p.currency,"
    "    p.provider_payment_id, p.status, p.updated_at, c.id AS capture_id),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, evidence, created_at)"
    "  SELECT id, " ATTEMPT_SQL(AUTHORIZED) ", status, $6, $5, 'captured',"
    "    jsonb_build_object('capture_id', capture_id, 'captured_amount', amount),"
    "    updated_at FROM u),"
    SQL_LEDGER_CHARGE("u")
    "SELECT capture_id FROM u";
/* clang-format on */

enum charged_rc capture_store_book(store_conn_t *db, const char *actor,
                                   const char *cause, const struct capture_booking *b,
                                   size_t n, size_t *booked, struct charged_error *err)
{
    CHARGED_ASSERT(db && actor && cause && booked);
    CHARGED_ASSERT(b || n == 0);
    struct stmt s = {0};
    PGresult *r = NULL;
    *booked = 0;
    if (n == 0)
        return CHARGED_OK;
    int a = stmt_arrays(&s, 4);
    for (size_t i = 0; i < n; i++) {
        /* Money moved: a capture books what it took, never nothing. */
        CHARGED_ASSERT(b[i].capture_id && b[i].amount >= 1);
        stmt_add(&s, a, b[i].capture_id);
        if (b[i].lease_epoch >= 0)
            stmt_add_int(&s, a + 1, b[i].lease_epoch);
        else
            stmt_add(&s, a + 1, NULL);
        stmt_add_int(&s, a + 2, b[i].amount);
        stmt_add(&s, a + 3, b[i].expected);
    }
    stmt_text(&s, actor);
    stmt_text(&s, cause);
    enum charged_rc rc = stmt_run(db, &s, SQL_BOOK, &r, err);
    if (rc == CHARGED_OK)
        *booked = (size_t)PQntuples(r);
    CHARGED_ASSERT(*booked <= n);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* ---- persist ---- */

/* clang-format off */
/* A SUCCEEDED outcome whose authorization was not booked as this capture
 * (capture_store_book, just before, in the same transaction) goes to
 * review: the provider took money the database cannot say is this
 * capture's. So does a refusal because the intent is captured already
 * (`taken`): our own call would have been replayed under its key, so
 * money moved that no capture of ours took; the capture keeps the hold
 * (no void may release it, no other capture take it) and a person looks,
 * as the reconciler's look decides on the same answer (capture_look.c).
 * The event follows the status written. */
static const char *SQL_PERSIST =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[],"
    "    $5::text[], $6::text[], $7::jsonb[], $8::int[], $9::text[], $10::bigint[])"
    "  AS v(id, epoch, status, reason, prid, event_type, evidence, calls, last_error,"
    "       next_check_ms)),"
    SQL_LEASES_UNLOCKED("capture_attempts") ","
    " s AS (SELECT v.*, p.amount AS authorized,"
    "    CASE WHEN p.status = " ATTEMPT_SQL(SUCCEEDED) " AND p.captured_amount ="
    "      (v.evidence->>'amount_received')::bigint THEN p.captured_amount END AS got,"
    "    v.status = " ATTEMPT_SQL(FAILED) " AND v.reason LIKE 'already\\_captured:%'"
    "      AS taken"
    "  FROM lk AS v JOIN capture_attempts c ON c.id = v.id"
    "  LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id),"
    " u AS ("
    "  UPDATE capture_attempts c SET"
    "    status = CASE WHEN (s.status = " ATTEMPT_SQL(SUCCEEDED) " AND s.got IS NULL)"
    "      OR s.taken THEN " ATTEMPT_SQL(REQUIRES_REVIEW) " ELSE s.status END,"
    "    reason = CASE WHEN s.status = " ATTEMPT_SQL(SUCCEEDED) " AND s.got IS NULL"
    "      THEN 'requires_review: captured at the provider; the authorization could"
    " not be booked as this capture''s'"
    "      WHEN s.taken THEN 'requires_review: captured, not under this key' ||"
    "        substr(s.reason, length('already_captured') + 1) ELSE s.reason END,"
    "    captured_amount = CASE WHEN s.status = " ATTEMPT_SQL(SUCCEEDED) " THEN s.got END,"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = c.attempt_count + s.calls, last_error = s.last_error,"
    "    next_check_at = CASE WHEN s.next_check_ms IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => s.next_check_ms / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("c")
    "  FROM s WHERE c.id = s.id AND c.lease_owner = $11 AND c.lease_epoch = s.epoch"
    "    AND c.status = " ATTEMPT_SQL(PROCESSING)
    "  RETURNING c.id, c.payment_attempt_id, c.order_id,"
    "    " SQL_CAPTURE_AMOUNT("c", "s.authorized") " AS amount, c.currency,"
    "    c.payment_intent, c.status, c.reason, c.updated_at,"
    "    " SQL_CAPTURE_EVENT_TYPE("c.status") " AS event_type, s.evidence),"
    " t AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, " ATTEMPT_SQL(PROCESSING) ", status, 'worker', $11, reason, evidence,"
    "    updated_at FROM u),"
    SQL_CAPTURE_OUTBOX_EVENTS("u")
    SQL_PERSIST_RESULT("capture_attempts");
/* clang-format on */

/* The persist's first statement: the captures' rows no other session
 * holds, ours until the transaction ends. */
static const char *SQL_LOCK =
    "SELECT id FROM capture_attempts WHERE id = ANY($1::uuid[])"
    " ORDER BY id FOR NO KEY UPDATE SKIP LOCKED";

/* Item i of a batch of struct engine_outcome, for stmt_persist. */
static void outcome_of(void *items, size_t i, struct stmt_outcome *o)
{
    CHARGED_ASSERT(items);
    struct engine_outcome *it = &((struct engine_outcome *)items)[i];
    /* In struct stmt_outcome's order. */
    *o = (struct stmt_outcome){
        it->id,          it->lease_epoch,   it->status,        it->reason,
        it->provider_id, it->event_type,    it->evidence_json, it->calls,
        it->last_error,  it->next_check_ms, &it->persisted,    &it->busy};
}

/* The amount a SUCCEEDED outcome's evidence says was captured; 0 none. */
static long long received_of(const char *evidence_json)
{
    json_t *e = evidence_json ? json_loads(evidence_json, 0, NULL) : NULL;
    json_t *v = json_object_get(e, "amount_received");
    long long amount = json_is_integer(v) ? (long long)json_integer_value(v) : 0;
    json_decref(e);
    return amount > 0 ? amount : 0;
}

enum charged_rc capture_store_persist(capture_store_t *st, struct engine_outcome *items,
                                      size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    struct capture_booking *b = NULL;
    struct engine_outcome *ours = NULL;
    size_t nb = 0, nours = 0, booked;
    enum charged_rc rc;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if ((rc = store_conn_open(st->db, NULL, err)) != CHARGED_OK ||
        (rc = store_conn_exec(st->db, "BEGIN", 0, NULL, NULL, err)) != CHARGED_OK)
        return rc == CHARGED_OK ? CHARGED_RETRY : rc;
    /* The rows first, for the transaction: the booking and the capture's
     * own row decide on one view of who holds them. */
    rc = op_outcomes_lock(st->db, SQL_LOCK, items, n, &ours, &nours, err);
    if (rc == CHARGED_OK && !(b = op_batch_new(n, sizeof(*b), err)))
        rc = CHARGED_RETRY;
    for (size_t i = 0; rc == CHARGED_OK && i < nours; i++) {
        long long got = received_of(ours[i].evidence_json);
        if (!strcmp(ours[i].status, ATTEMPT_S_SUCCEEDED) && got > 0)
            b[nb++] = (struct capture_booking){ours[i].id, ours[i].lease_epoch, got,
                                               ATTEMPT_S_PROCESSING};
    }
    if (rc == CHARGED_OK)
        rc = capture_store_book(st->db, st->actor, "worker", b, nb, &booked, err);
    if (rc == CHARGED_OK && nours > 0)
        rc = stmt_persist(st->db, st->actor, SQL_PERSIST, ours, nours, outcome_of, err);
    if ((rc = tx_end(st->db, rc, err)) == CHARGED_OK)
        op_outcomes_unpack(items, n, ours, nours);
    free(b);
    free(ours);
    return rc;
}

/* ---- leases ---- */

static const char *SQL_RENEW = SQL_LEASE_RENEW("capture_attempts");
static const char *SQL_RELEASE =
    SQL_LEASE_END("capture_attempts", "lease_expires_at = now()");
static const char *SQL_HAND_BACK =
    SQL_LEASE_END("capture_attempts", "lease_owner = NULL, lease_expires_at = NULL");

enum charged_rc capture_store_renew(capture_store_t *st, const char *const *ids,
                                    const int64_t *epochs, size_t n, long long lease_ms,
                                    int *still_ours, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(n == 0 || (ids && epochs && still_ours));
    PGresult *r;
    enum charged_rc rc;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if ((rc = stmt_lease(st->db, st->actor, SQL_RENEW, ids, epochs, n, &lease_ms, &r,
                         err)) != CHARGED_OK)
        return rc;
    str_index_t *rows = stmt_index_rows(r, 0);
    for (size_t i = 0; i < n; i++)
        still_ours[i] = stmt_row_in(rows, r, 0, ids[i]) >= 0;
    str_index_free(rows);
    PQclear(r);
    return CHARGED_OK;
}

/* Ends leases by sql (SQL_RELEASE: due again when they expire now;
 * SQL_HAND_BACK: due to any reconciler at once). */
static enum charged_rc lease_end(capture_store_t *st, const char *sql,
                                 const char *const *ids, const int64_t *epochs,
                                 size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st && sql);
    CHARGED_ASSERT(n == 0 || (ids && epochs));
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    return stmt_lease(st->db, st->actor, sql, ids, epochs, n, NULL, NULL, err);
}

enum charged_rc capture_store_release(capture_store_t *st, const char *const *ids,
                                      const int64_t *epochs, size_t n,
                                      struct charged_error *err)
{
    return lease_end(st, SQL_RELEASE, ids, epochs, n, err);
}

enum charged_rc capture_store_hand_back(capture_store_t *st, const char *const *ids,
                                        const int64_t *epochs, size_t n,
                                        struct charged_error *err)
{
    return lease_end(st, SQL_HAND_BACK, ids, epochs, n, err);
}

/* ---- reconciliation ---- */

/* clang-format off */
static const char *SQL_CLAIM_DUE =
    SQL_STEP_CLAIM_DUE("capture_attempts")
    "  coalesce((extract(epoch FROM now() - p.first_sent_at) * 1000)::bigint, -1),"
    "  (extract(epoch FROM now() - p.created_at) * 1000)::bigint, p.reconcile_checks,"
    "  coalesce((SELECT a.amount FROM payment_attempts a"
    "    WHERE a.id = p.payment_attempt_id), 0),"
    "  p.idempotency_key, coalesce(p.payment_intent, ''), p.payment_attempt_id,"
    "  coalesce(p.amount, 0)";

/* A settlement: SUCCEEDED only when the authorization was booked as this
 * capture (capture_store_book, just before, in the same transaction), else
 * to review. */
static const char *SQL_SETTLE =
    "WITH lk AS ("
    "  SELECT id, status AS old_status FROM capture_attempts"
    "  WHERE id = $1::uuid AND status = $2 AND lease_owner = $4"
    "    AND lease_epoch = $3::bigint"
    "  FOR NO KEY UPDATE SKIP LOCKED),"
    " s AS (SELECT lk.*, p.amount AS authorized,"
    "    CASE WHEN p.status = " ATTEMPT_SQL(SUCCEEDED) " AND p.captured_amount ="
    "      $10::bigint THEN p.captured_amount END AS got"
    "  FROM lk JOIN capture_attempts c ON c.id = lk.id"
    "  LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id),"
    " u AS ("
    "  UPDATE capture_attempts c SET"
    "    status = CASE WHEN $5 = " ATTEMPT_SQL(SUCCEEDED) " AND s.got IS NULL"
    "      THEN " ATTEMPT_SQL(REQUIRES_REVIEW) " ELSE $5 END,"
    "    reason = CASE WHEN $5 = s.old_status THEN c.reason"
    "      WHEN $5 = " ATTEMPT_SQL(SUCCEEDED) " AND s.got IS NULL THEN 'requires_review:"
    " captured at the provider; the authorization could not be booked as this"
    " capture''s' ELSE $6::text END,"
    "    last_error = CASE WHEN $5 = s.old_status THEN coalesce($6::text, c.last_error)"
    "      ELSE c.last_error END,"
    "    captured_amount = coalesce(s.got, c.captured_amount),"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = c.attempt_count + $8::int,"
    "    reconcile_checks = c.reconcile_checks + $20::int,"
    "    next_check_at = CASE WHEN $9::bigint IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => $9::bigint / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("c")
    "  FROM s WHERE c.id = s.id"
    "  RETURNING c.id, c.payment_attempt_id, c.order_id,"
    "    " SQL_CAPTURE_AMOUNT("c", "s.authorized") " AS amount, c.currency,"
    "    c.payment_intent, c.status, c.reason, c.updated_at, s.old_status,"
    "    $7::jsonb AS evidence,"
    "    CASE WHEN c.status <> s.old_status THEN " SQL_CAPTURE_EVENT_TYPE("c.status")
    "    END AS event_type),"
    " t AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, old_status, status, 'reconciler', $4, reason, evidence, updated_at"
    "  FROM u WHERE status <> old_status),"
    SQL_CAPTURE_OUTBOX_EVENTS("u") ","
    " pc AS ("
    SQL_STEP_CALLS("capture_attempts", "capture_id",
                   "$11", "$12", "$13", "$14", "$15", "$16", "$17", "$18", "$19",
                   "$4", "") ")"
    /* Settled, or busy: the row is what the settlement expects, but another
     * session holds it locked (nothing was written; nothing waited). */
    "SELECT (SELECT count(*) FROM u),"
    "  NOT EXISTS (SELECT 1 FROM lk) AND EXISTS (SELECT 1 FROM capture_attempts"
    "    WHERE id = $1::uuid AND status = $2 AND lease_owner = $4"
    "    AND lease_epoch = $3::bigint)";

static const char *SQL_BACKLOG =
    "SELECT status, count(*),"
    "  (extract(epoch FROM now() - min(created_at)) * 1000)::bigint"
    " FROM capture_attempts WHERE status = ANY($1::text[]) GROUP BY status";
/* clang-format on */

enum charged_rc capture_store_claim_due(capture_store_t *st, struct capture_due *out,
                                        size_t max, size_t *n, long long lease_ms,
                                        long long stale_ms, struct charged_error *err)
{
    CHARGED_ASSERT(st && n);
    CHARGED_ASSERT(out || max == 0);
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    *n = 0;
    if (max == 0)
        return CHARGED_OK;
    rc = stmt_claim_due(st->db, st->actor, SQL_CLAIM_DUE, max, lease_ms, stale_ms, &r,
                        err);
    for (int i = 0; rc == CHARGED_OK && i < PQntuples(r) && *n < max; i++) {
        struct capture_due *d = &out[(*n)++];
        memset(d, 0, sizeof(*d));
        stmt_col_copy(r, i, 0, d->id, sizeof(d->id));
        d->lease_epoch = stmt_col_int(r, i, 1);
        d->status = (enum attempt_status)attempt_status_parse(PQgetvalue(r, i, 2));
        d->key_age_ms = stmt_col_int(r, i, 3);
        d->age_ms = stmt_col_int(r, i, 4);
        d->checks = (int)stmt_col_int(r, i, 5);
        d->authorized = stmt_col_int(r, i, 6);
        col_params(r, i, 7, &d->params);
        /* Claimed by SQL_CLAIM_DUE, under a lease. */
        CHARGED_ASSERT(d->lease_epoch > 0);
    }
    CHARGED_ASSERT(*n <= max);
    PQclear(r);
    return rc;
}

/* The settlement's statement on the open transaction. */
static enum charged_rc settle_row(capture_store_t *st, struct op_settlement *it,
                                  struct charged_error *err)
{
    struct capture_call calls[OP_LOOK_ROWS_MAX];
    struct stmt s = {0};
    PGresult *r = NULL;
    int ncaptures = 0;

    CHARGED_ASSERT(it->nrows <= OP_LOOK_ROWS_MAX);
    for (size_t i = 0; i < it->nrows; i++) {
        calls[i] = (struct capture_call){.capture_id = it->id,
                                         .operation = it->rows[i].operation,
                                         .started_ms = it->rows[i].started_ms,
                                         .res = it->rows[i].res};
        if (!calls[i].operation || !strcmp(calls[i].operation, "capture"))
            ncaptures++;
    }
    stmt_text(&s, it->id);
    stmt_text(&s, attempt_status_name(it->expected));
    stmt_int(&s, it->lease_epoch);
    stmt_text(&s, st->actor);
    stmt_text(&s, attempt_status_name(it->status));
    stmt_text(&s, it->reason);
    stmt_text(&s, it->evidence_json ? it->evidence_json : "{}");
    stmt_int(&s, ncaptures);
    stmt_int_or_null(&s, it->next_check_ms);
    stmt_int(&s, it->amount);
    stmt_add_calls(&s, stmt_arrays(&s, 9), calls, it->nrows, call_of, "capture");
    stmt_int(&s, it->throttled ? 0 : 1); /* a throttled look is no look */
    enum charged_rc rc = stmt_run(st->db, &s, SQL_SETTLE, &r, err);
    if (rc == CHARGED_OK) {
        it->settled = stmt_col_int(r, 0, 0) == 1;
        it->busy = stmt_col_true(r, 0, 1);
    }
    PQclear(r);
    stmt_release(&s);
    return rc;
}

enum charged_rc capture_store_settle(capture_store_t *st, struct op_settlement *it,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(st && it && it->id);
    CHARGED_ASSERT(it->rows || it->nrows == 0);
    size_t booked;
    enum charged_rc rc;

    charged_error_clear(err);
    it->settled = it->busy = 0;
    if (it->status != it->expected &&
        !attempt_status_transition_allowed((int)it->expected, it->status)) {
        charged_error_set(err, "status %s may not follow %s",
                          attempt_status_name(it->status),
                          attempt_status_name(it->expected));
        return CHARGED_BAD_ITEM;
    }
    /* A success says what it captured: the authorization is booked with it. */
    CHARGED_ASSERT(it->status != ATTEMPT_STATUS_SUCCEEDED || it->amount >= 1);
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    if ((rc = store_conn_exec(st->db, "BEGIN", 0, NULL, NULL, err)) != CHARGED_OK)
        return rc;
    /* As the persist's: the row first, or busy (another session holds it;
     * the look is settled again later), never the booking skipping it and
     * the settlement not. */
    int locked = 0;
    const char *id = it->id;
    rc = stmt_lock_ids(st->db, SQL_LOCK, &id, 1, &locked, err);
    if (rc == CHARGED_OK && !locked) {
        it->busy = 1;
        return tx_end(st->db, rc, err);
    }
    if (rc == CHARGED_OK && it->status == ATTEMPT_STATUS_SUCCEEDED) {
        const struct capture_booking b = {it->id, it->lease_epoch, it->amount,
                                          attempt_status_name(it->expected)};
        rc = capture_store_book(st->db, st->actor, "reconciler", &b, 1, &booked, err);
    }
    if (rc == CHARGED_OK)
        rc = settle_row(st, it, err);
    return tx_end(st->db, rc, err);
}

enum charged_rc capture_store_backlog(capture_store_t *st,
                                      const enum attempt_status *statuses, size_t n,
                                      long long *counts, long long *oldest_ms,
                                      struct charged_error *err)
{
    CHARGED_ASSERT(st && statuses && counts && oldest_ms);
    return stmt_backlog(st->db, SQL_BACKLOG, statuses, n, counts, oldest_ms, err);
}
