#include "void_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "charged_assert.h"
#include "lease_sql.h"
#include "step_sql.h"
#include "op_shared.h"
#include "store_stmt.h"
#include "void_command.h"

struct void_store {
    store_conn_t *db;
    char *actor;
};

/* As the refund store's: a lock another session holds is waited for this
 * long at most. */
#define VOID_LOCK_TIMEOUT "100ms"
/* How long a void waits for its authorization's own call to settle (it may
 * follow the authorization in the partition while that call is in flight)
 * before it is rejected for it. */
#define VOID_ORDER_WINDOW "5 minutes"

/* void_store_new, _free and _ping. */
STMT_STORE_SESSION(void_store, VOID_LOCK_TIMEOUT)
STMT_STORE_WAIT(void_store, "void_attempts")

const char *void_store_event_type(enum attempt_status s)
{
    static const char *const types[ATTEMPT_STATUS__COUNT] = {
        [ATTEMPT_STATUS_UNKNOWN] = "void.unknown",
        [ATTEMPT_STATUS_SUCCEEDED] = "void.succeeded",
        [ATTEMPT_STATUS_FAILED] = "void.failed",
        [ATTEMPT_STATUS_REJECTED] = "void.rejected",
        [ATTEMPT_STATUS_REQUIRES_REVIEW] = "void.requires_review",
    };
    return (unsigned)s < ATTEMPT_STATUS__COUNT ? types[s] : NULL;
}

/* The params from five columns from `first`: idempotency_key,
 * payment_intent, payment_attempt_id, void_reason, amount. */
static void read_params(const PGresult *r, int row, int first, struct void_params *p)
{
    CHARGED_ASSERT(r && p && row >= 0 && first >= 0);
    stmt_col_copy(r, row, first, p->idempotency_key, sizeof(p->idempotency_key));
    stmt_col_copy(r, row, first + 1, p->payment_intent, sizeof(p->payment_intent));
    stmt_col_copy(r, row, first + 2, p->payment_attempt_id,
                  sizeof(p->payment_attempt_id));
    stmt_col_copy(r, row, first + 3, p->reason, sizeof(p->reason));
    p->amount = stmt_col_int(r, row, first + 4);
}

/* ---- record ---- */

/* clang-format off */
/* A key any operation holds (idempotency_keys, 0011) is never taken by a
 * void: the provider keeps one namespace of keys. */
static const char *SQL_RECORD =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::text[], $6::jsonb[])"
    "  WITH ORDINALITY AS v(id, attempt, key, fp, reason, metadata, n)),"
    " ins AS ("
    "  INSERT INTO void_attempts (id, payment_attempt_id, order_id, idempotency_key,"
    "    request_fingerprint, void_reason, metadata, status)"
    "  SELECT v.id, v.attempt, p.order_id, v.key, v.fp, v.reason, v.metadata, "
    ATTEMPT_SQL(PENDING)
    "  FROM v LEFT JOIN payment_attempts p ON p.id = v.attempt"
    "  WHERE NOT EXISTS (SELECT 1 FROM idempotency_keys k WHERE k.idempotency_key = v.key)"
    "  ORDER BY v.n ON CONFLICT DO NOTHING RETURNING id),"
    " tr AS ("
    "  INSERT INTO void_transitions (void_id, old_status, new_status, cause, actor, reason)"
    "  SELECT id, NULL, " ATTEMPT_SQL(PENDING) ", 'worker', $7, 'recorded' FROM ins)"
    "SELECT w.id, w.idempotency_key, w.request_fingerprint, 'void' FROM void_attempts w"
    " WHERE w.id = ANY($1::uuid[]) OR w.idempotency_key = ANY($3::text[])"
    " UNION ALL SELECT k.owner_id, k.idempotency_key, '', k.kind FROM idempotency_keys k"
    " WHERE k.idempotency_key = ANY($3::text[]) AND k.kind <> 'void'";
/* clang-format on */

/* The item against every stored row of its id or key: the same void, or a
 * conflict. (Rows of this statement's insert are not read by its own
 * SELECT: a new void finds nothing, and is recorded.) */
static void record_verdict(struct engine_record *it, const PGresult *found)
{
    const struct void_command *c = it->command;
    CHARGED_ASSERT(c && found);
    it->result = ENGINE_RECORDED;
    it->reason[0] = '\0';
    for (int r = 0; r < PQntuples(found); r++) {
        const char *id = PQgetvalue(found, r, 0), *key = PQgetvalue(found, r, 1),
                   *fp = PQgetvalue(found, r, 2), *kind = PQgetvalue(found, r, 3);
        int same_id = !strcmp(id, c->void_id),
            same_key = !strcmp(key, c->idempotency_key);
        if (strcmp(kind, "void") != 0 && same_key)
            snprintf(it->reason, sizeof(it->reason),
                     "idempotency key already belongs to a %s (%s)", kind, id);
        else if (same_id && (!same_key || strcmp(fp, c->fingerprint) != 0))
            snprintf(it->reason, sizeof(it->reason),
                     "void %s is already recorded with another key or other parameters",
                     id);
        else if (!same_id && same_key)
            snprintf(it->reason, sizeof(it->reason),
                     "idempotency key already belongs to void %s", id);
        if (it->reason[0])
            it->result = ENGINE_CONFLICT;
    }
}

enum charged_rc void_store_record(void_store_t *st, struct engine_record *items,
                                  size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st && (items || n == 0));
    struct stmt s = {0};
    PGresult *r = NULL;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int a = stmt_arrays(&s, 6);
    for (size_t i = 0; i < n; i++) {
        const struct void_command *c = items[i].command;
        CHARGED_ASSERT(c && c->fingerprint[0]); /* only a parsed void is recorded */
        stmt_add(&s, a, c->void_id);
        stmt_add(&s, a + 1, c->payment_attempt_id);
        stmt_add(&s, a + 2, c->idempotency_key);
        stmt_add(&s, a + 3, c->fingerprint);
        stmt_add(&s, a + 4, c->reason);
        stmt_add(&s, a + 5, c->metadata_json ? c->metadata_json : "{}");
    }
    stmt_text(&s, st->actor);
    enum charged_rc rc = stmt_run_keyed(st->db, &s, SQL_RECORD, &r, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++)
        record_verdict(&items[i], r);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* ---- claim: lease, and take the hold ---- */

/* clang-format off */
/* A PENDING void is leased only with the hold of its authorization, taken
 * in this statement from AUTHORIZED and unheld (one void an authorization a
 * statement: an UPDATE touches a row once; the others wait for a later
 * claim). A void whose authorization's own call is still in flight waits
 * for it (VOID_ORDER_WINDOW). Otherwise it is REJECTED here, with its
 * reason code and event. A PROCESSING void whose lease expired keeps its
 * hold and is taken over. */
static const char *SQL_CLAIM =
    "WITH q AS (SELECT DISTINCT id FROM unnest($1::uuid[]) AS q(id)),"
    " lk AS ("
    "  SELECT w.id, w.status, w.payment_attempt_id, w.created_at FROM void_attempts w"
    "  JOIN q ON w.id = q.id"
    "  WHERE w.status = " ATTEMPT_SQL(PENDING)
    "     OR (w.status = " ATTEMPT_SQL(PROCESSING) " AND w.next_check_at IS NULL"
    "         AND w.lease_owner IS NOT NULL AND w.lease_expires_at < now())"
    "  ORDER BY w.id FOR NO KEY UPDATE OF w SKIP LOCKED),"
    " c AS (SELECT DISTINCT ON (payment_attempt_id) * FROM lk"
    "  WHERE lk.status <> " ATTEMPT_SQL(PENDING) " OR NOT EXISTS ("
    "    SELECT 1 FROM payment_attempts x WHERE x.id = lk.payment_attempt_id"
    "    AND x.status IN (" ATTEMPT_SQL(PENDING) ", " ATTEMPT_SQL(PROCESSING) ")"
    "    AND lk.created_at > now() - interval '" VOID_ORDER_WINDOW "')"
    "  ORDER BY payment_attempt_id, id),"
    " h AS ("
    "  UPDATE payment_attempts p SET held_by = 'void', held_by_id = c.id FROM c"
    "  WHERE c.status = " ATTEMPT_SQL(PENDING) " AND p.id = c.payment_attempt_id"
    "    AND p.status = " ATTEMPT_SQL(AUTHORIZED) " AND p.held_by IS NULL"
    "  RETURNING c.id AS void_id),"
    " d AS ("
    "  SELECT c.id, c.status AS old_status,"
    "    CASE WHEN c.status <> " ATTEMPT_SQL(PENDING) " OR h.void_id IS NOT NULL THEN NULL"
    "      WHEN p.id IS NULL THEN 'attempt_unknown: payment attempt ' ||"
    "        c.payment_attempt_id || ' is not recorded'"
    "      WHEN p.capture_method <> 'manual' THEN 'not_authorized: payment attempt ' ||"
    "        p.id || ' is a charge, not an authorization'"
    "      WHEN p.status = " ATTEMPT_SQL(SUCCEEDED) " THEN 'void_after_capture: payment"
    " attempt ' || p.id || ' is captured (' || coalesce(p.captured_amount::text, '?') || ')'"
    "      WHEN p.status = " ATTEMPT_SQL(VOIDED) " THEN 'authorization_voided: payment"
    " attempt ' || p.id || ' is VOIDED'"
    "      WHEN p.held_by IS NOT NULL THEN 'authorization_held: payment attempt ' ||"
    "        p.id || ' is held by ' || p.held_by || ' ' || p.held_by_id"
    /* Seen AUTHORIZED and unheld, yet h did not take it: a step claimed at
     * the same time took it first (h waited for its commit and re-read the
     * row; this statement's snapshot is older). */
    "      WHEN p.status = " ATTEMPT_SQL(AUTHORIZED) " THEN 'authorization_held: payment"
    " attempt ' || p.id || ' was taken by a step claimed at the same time'"
    "      ELSE 'not_authorized: payment attempt ' || p.id || ' is ' || p.status END"
    "      AS rejected,"
    "    p.provider_payment_id, p.order_id"
    "  FROM c LEFT JOIN h ON h.void_id = c.id"
    "  LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id),"
    " u AS ("
    "  UPDATE void_attempts w SET"
    "    status = CASE WHEN d.rejected IS NULL THEN " ATTEMPT_SQL(PROCESSING)
    "      ELSE " ATTEMPT_SQL(REJECTED) " END,"
    "    reason = d.rejected, holds = d.rejected IS NULL,"
    "    payment_intent = coalesce(w.payment_intent, d.provider_payment_id),"
    "    order_id = coalesce(w.order_id, d.order_id),"
    "    lease_owner = CASE WHEN d.rejected IS NULL THEN $2 END,"
    "    lease_expires_at = CASE WHEN d.rejected IS NULL THEN"
    "      now() + make_interval(secs => $3::double precision / 1000) END,"
    "    lease_epoch = w.lease_epoch + 1,"
    "    first_sent_at = CASE WHEN d.rejected IS NULL"
    "      THEN coalesce(w.first_sent_at, now()) END,"
    "    updated_at = " SQL_CHANGED_AT("w")
    "  FROM d WHERE w.id = d.id"
    "  RETURNING w.id, w.payment_attempt_id, w.order_id, w.payment_intent AS"
    "    provider_payment_id, w.status, w.reason, w.updated_at, d.old_status,"
    "    CASE WHEN w.status = " ATTEMPT_SQL(REJECTED) " THEN 'void.rejected' END AS"
    "    event_type, w.lease_epoch,"
    "    (extract(epoch FROM now() - w.first_sent_at) * 1000)::bigint AS key_age_ms,"
    "    w.idempotency_key, w.void_reason),"
    " t AS ("
    "  INSERT INTO void_transitions (void_id, old_status, new_status, cause, actor,"
    "    reason, created_at)"
    "  SELECT id, old_status, status, 'worker', $2,"
    "    CASE WHEN status = " ATTEMPT_SQL(REJECTED) " THEN reason"
    "         WHEN old_status = " ATTEMPT_SQL(PENDING) " THEN 'claimed'"
    "         ELSE 'lease expired; taken over' END, updated_at FROM u),"
    SQL_VOID_OUTBOX_EVENTS("u")
    "SELECT a.id, a.status, a.lease_owner IS NOT NULL, u.status, u.reason,"
    "  u.lease_epoch, u.key_age_ms, u.idempotency_key, u.provider_payment_id,"
    "  u.payment_attempt_id, u.void_reason,"
    "  (SELECT amount FROM payment_attempts p WHERE p.id = u.payment_attempt_id)"
    " FROM void_attempts a JOIN q ON a.id = q.id LEFT JOIN u ON u.id = a.id";
/* clang-format on */

/* Item i from the claim's rows (a duplicate id in the batch is claimed once:
 * the first; the rest are busy). */
static void claim_verdict(struct engine_claim *items, size_t i, const PGresult *r,
                          const str_index_t *rows)
{
    struct engine_claim *it = &items[i];
    int row = stmt_row_in(rows, r, 0, it->id);
    it->result = ENGINE_BUSY;
    it->status[0] = it->rejected[0] = '\0';
    if (row < 0)
        return;
    stmt_col_copy(r, row, 1, it->status, sizeof(it->status));
    for (size_t j = 0; j < i; j++)
        if (items[j].result != ENGINE_BUSY && !strcmp(items[j].id, it->id))
            return;
    if (PQgetisnull(r, row, 3)) {
        int leased = stmt_col_true(r, row, 2);
        if (strcmp(it->status, ATTEMPT_S_PENDING) != 0 &&
            (strcmp(it->status, ATTEMPT_S_PROCESSING) != 0 || !leased))
            it->result = ENGINE_SETTLED;
        return;
    }
    if (!strcmp(PQgetvalue(r, row, 3), ATTEMPT_S_REJECTED)) {
        it->result = ENGINE_SETTLED;
        stmt_col_copy(r, row, 4, it->rejected, sizeof(it->rejected));
        return;
    }
    struct void_params p;
    char before[sizeof(it->status)];
    memset(&p, 0, sizeof(p));
    read_params(r, row, 7, &p);
    snprintf(before, sizeof(before), "%s", it->status);
    /* Claimed, it holds its authorization: there is an intent to cancel. */
    CHARGED_ASSERT(p.payment_intent[0] && p.idempotency_key[0]);
    op_batch_claimed(it, ENGINE_CLAIMED, stmt_col_int(r, row, 5),
                     stmt_col_int(r, row, 6), before, &p, sizeof(p));
}

enum charged_rc void_store_claim(void_store_t *st, struct engine_claim *items, size_t n,
                                 long long lease_ms, struct charged_error *err)
{
    CHARGED_ASSERT(st && (items || n == 0));
    struct stmt s = {0};
    PGresult *r = NULL;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int ids = stmt_arrays(&s, 1);
    for (size_t i = 0; i < n; i++)
        stmt_add(&s, ids, items[i].id);
    stmt_text(&s, st->actor);
    stmt_int(&s, lease_ms);
    enum charged_rc rc = stmt_run(st->db, &s, SQL_CLAIM, &r, err);
    str_index_t *rows = rc == CHARGED_OK ? stmt_index_rows(r, 0) : NULL;
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++)
        claim_verdict(items, i, r, rows);
    str_index_free(rows);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* ---- provider calls ---- */

/* clang-format off */
/* A call whose earlier write may have committed ($11 of its row) is
 * written only when no row of the same call is there. */
static const char *SQL_LOG_CALLS =
    "INSERT INTO provider_calls (payment_attempt_id, void_id, operation, started_at,"
    "  latency_ms, outcome, http_status, replayed, provider_payment_id, error, actor)"
    " SELECT w.payment_attempt_id, v.id, v.op, to_timestamp(v.started_ms / 1000.0),"
    "  v.latency, v.outcome, nullif(v.http, 0), v.replayed, nullif(v.ppid, ''),"
    "  nullif(v.err, ''), $10"
    " FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::int[], $5::text[],"
    "  $6::int[], $7::bool[], $8::text[], $9::text[])"
    "  AS v(id, op, started_ms, latency, outcome, http, replayed, ppid, err)"
    " JOIN void_attempts w ON w.id = v.id"
    " JOIN payment_attempts p ON p.id = w.payment_attempt_id"
    " WHERE NOT ($11::bool AND EXISTS (SELECT 1 FROM provider_calls c"
    "  WHERE c.void_id = v.id AND c.operation = v.op"
    "  AND c.started_at = to_timestamp(v.started_ms / 1000.0)"
    "  AND c.outcome = v.outcome AND c.latency_ms = v.latency))";
/* clang-format on */

/* Calls of one kind of write (maybe: written only if absent). */
static enum charged_rc log_some(void_store_t *st, const struct void_call *calls,
                                size_t n, int maybe, struct charged_error *err)
{
    struct stmt s = {0};
    size_t k = 0;
    int a = stmt_arrays(&s, 9);
    CHARGED_ASSERT(calls || n == 0);
    for (size_t i = 0; i < n; i++) {
        const struct provider_result *r = calls[i].res;
        if (!!calls[i].written_maybe != maybe)
            continue;
        CHARGED_ASSERT(r && calls[i].void_id);
        k++;
        stmt_add(&s, a, calls[i].void_id);
        stmt_add(&s, a + 1, calls[i].operation ? calls[i].operation : "void");
        stmt_add_int(&s, a + 2, calls[i].started_ms);
        stmt_add_int(&s, a + 3, r->latency_ms);
        stmt_add(&s, a + 4, provider_outcome_name(r->outcome));
        stmt_add_int(&s, a + 5, r->http_status);
        stmt_add(&s, a + 6, r->replayed ? "t" : "f");
        stmt_add(&s, a + 7, r->provider_payment_id);
        stmt_add(&s, a + 8, r->outcome == PROVIDER_SUCCEEDED ? "" : r->error);
    }
    stmt_text(&s, st->actor);
    stmt_text(&s, maybe ? "t" : "f");
    enum charged_rc rc =
        k ? stmt_run(st->db, &s, SQL_LOG_CALLS, NULL, err) : CHARGED_OK;
    stmt_release(&s);
    return rc;
}

enum charged_rc void_store_log_calls(void_store_t *st, const struct void_call *calls,
                                     size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st && (calls || n == 0));
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    enum charged_rc rc = log_some(st, calls, n, 0, err);
    return rc == CHARGED_OK ? log_some(st, calls, n, 1, err) : rc;
}

/* ---- the authorization's move, every writer's ---- */

/* clang-format off */
/* Locks each void that ends, fenced as its writer's statement will be, and
 * moves its authorization while the void still holds it: SUCCEEDED ->
 * VOIDED (the void's reason), FAILED void_after_capture -> REQUIRES_REVIEW
 * (published authorization.requires_review). Before the voids' own
 * statement, in its transaction: the 0016 trigger lets a void succeed only
 * once its authorization is VOIDED. */
const char *const void_store_move_sql =
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[],"
    "  $5::text[]) AS v(id, epoch, expected, status, reason)),"
    " w AS (SELECT w.id, w.payment_attempt_id, w.void_reason, v.status, v.reason"
    "  FROM void_attempts w JOIN v ON w.id = v.id"
    "  WHERE w.status = v.expected AND w.holds"
    "    AND (v.epoch IS NULL OR (w.lease_owner = $6 AND w.lease_epoch = v.epoch))"
    "    AND (v.status = " ATTEMPT_SQL(SUCCEEDED) " OR (v.status = " ATTEMPT_SQL(FAILED)
    "      AND v.reason LIKE 'void\\_after\\_capture%'))"
    "  ORDER BY w.id FOR NO KEY UPDATE OF w SKIP LOCKED),"
    " pa AS ("
    "  UPDATE payment_attempts p SET"
    "    status = CASE WHEN w.status = " ATTEMPT_SQL(SUCCEEDED) " THEN "
    ATTEMPT_SQL(VOIDED) " ELSE " ATTEMPT_SQL(REQUIRES_REVIEW) " END,"
    "    reason = CASE WHEN w.status = " ATTEMPT_SQL(SUCCEEDED) " THEN w.void_reason"
    "      ELSE w.reason END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM w WHERE p.id = w.payment_attempt_id AND p.held_by_id = w.id"
    "    AND p.status = " ATTEMPT_SQL(AUTHORIZED)
    "  RETURNING p.id, p.order_id, p.amount, p.currency, p.provider_payment_id, p.status,"
    "    p.reason, p.updated_at, w.id AS void_id,"
    "    CASE WHEN p.status = " ATTEMPT_SQL(REQUIRES_REVIEW)
    "      THEN 'authorization.requires_review' END AS event_type),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, evidence, created_at)"
    "  SELECT id, " ATTEMPT_SQL(AUTHORIZED) ", status, $7, $6, reason,"
    "    jsonb_build_object('void_id', void_id), updated_at FROM pa),"
    SQL_OUTBOX_EVENTS("pa")
    "SELECT count(*) FROM pa";
/* clang-format on */

/* Runs void_store_move_sql for n voids, in the transaction move_begin
 * began, before the voids' own statement. */
struct void_end {
    const char *id;
    int64_t epoch; /* < 0: no lease fence */
    const char *expected, *status, *reason;
};

static enum charged_rc move_run(void_store_t *st, const struct void_end *ends, size_t n,
                                const char *cause, struct charged_error *err)
{
    struct stmt s = {0};
    CHARGED_ASSERT(st && ends && cause);
    enum charged_rc rc;
    int a = stmt_arrays(&s, 5);
    for (size_t i = 0; i < n; i++) {
        CHARGED_ASSERT(ends[i].id && ends[i].expected && ends[i].status);
        stmt_add(&s, a, ends[i].id);
        if (ends[i].epoch < 0)
            stmt_add(&s, a + 1, NULL);
        else
            stmt_add_int(&s, a + 1, ends[i].epoch);
        stmt_add(&s, a + 2, ends[i].expected);
        stmt_add(&s, a + 3, ends[i].status);
        stmt_add(&s, a + 4, ends[i].reason);
    }
    stmt_text(&s, st->actor);
    stmt_text(&s, cause);
    rc = stmt_run(st->db, &s, void_store_move_sql, NULL, err);
    stmt_release(&s);
    return rc;
}

/* The persist's and the settlement's first statement: the voids' rows no
 * other session holds, ours until the transaction ends. */
static const char *SQL_LOCK = "SELECT id FROM void_attempts WHERE id = ANY($1::uuid[])"
                              " ORDER BY id FOR NO KEY UPDATE SKIP LOCKED";

/* Begins a void's transaction: the move and the void's own statement
 * decide on one view of who holds its row (locked first, as the
 * capture's persist does: op_outcomes_lock). */
static enum charged_rc move_begin(void_store_t *st, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    return store_conn_exec(st->db, "BEGIN", 0, NULL, NULL, err);
}

/* Ends the transaction move_begin began: COMMIT when rc is CHARGED_OK,
 * else ROLLBACK (rc kept). */
static enum charged_rc move_end(void_store_t *st, enum charged_rc rc,
                                struct charged_error *err)
{
    struct charged_error ignore = {0};
    if (rc == CHARGED_OK)
        return store_conn_exec(st->db, "COMMIT", 0, NULL, NULL, err);
    store_conn_exec(st->db, "ROLLBACK", 0, NULL, NULL, &ignore);
    return rc;
}

/* ---- persist an outcome, fenced on the lease ---- */

/* clang-format off */
static const char *SQL_PERSIST =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[],"
    "    $5::text[], $6::text[], $7::jsonb[], $8::int[], $9::text[], $10::bigint[])"
    "  AS v(id, epoch, status, reason, prid, event_type, evidence, calls, last_error,"
    "       next_check_ms)),"
    SQL_LEASES_UNLOCKED("void_attempts") ","
    " u AS ("
    "  UPDATE void_attempts w SET status = v.status, reason = v.reason,"
    "    released_amount = CASE WHEN v.status = " ATTEMPT_SQL(SUCCEEDED) " THEN"
    "      (SELECT amount FROM payment_attempts a WHERE a.id = w.payment_attempt_id) END,"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = w.attempt_count + v.calls, last_error = v.last_error,"
    "    next_check_at = CASE WHEN v.next_check_ms IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => v.next_check_ms / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("w")
    "  FROM lk AS v"
    "  WHERE w.id = v.id AND w.lease_owner = $11 AND w.lease_epoch = v.epoch"
    "    AND w.status = " ATTEMPT_SQL(PROCESSING)
    "  RETURNING w.id, w.payment_attempt_id, w.order_id,"
    "    w.payment_intent AS provider_payment_id, w.status, w.reason, w.updated_at,"
    "    v.event_type, v.evidence),"
    " t AS ("
    "  INSERT INTO void_transitions (void_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, " ATTEMPT_SQL(PROCESSING) ", status, 'worker', $11, reason, evidence,"
    "    updated_at FROM u),"
    SQL_VOID_OUTBOX_EVENTS("u")
    SQL_PERSIST_RESULT("void_attempts");
/* clang-format on */

/* Item i of a batch of the engine's outcomes, for stmt_persist. */
static void outcome_of(void *items, size_t i, struct stmt_outcome *o)
{
    struct engine_outcome *it = &((struct engine_outcome *)items)[i];
    CHARGED_ASSERT(items && it->id);
    *o = (struct stmt_outcome){.id = it->id,
                               .lease_epoch = it->lease_epoch,
                               .status = it->status,
                               .reason = it->reason,
                               .provider_id = it->provider_id,
                               .event_type = it->event_type,
                               .evidence_json = it->evidence_json,
                               .calls = it->calls,
                               .last_error = it->last_error,
                               .next_check_ms = it->next_check_ms,
                               .persisted = &it->persisted,
                               .busy = &it->busy};
}

enum charged_rc void_store_persist(void_store_t *st, struct engine_outcome *items,
                                   size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st && (items || n == 0));
    struct void_end *ends = NULL;
    struct engine_outcome *ours = NULL;
    size_t nours = 0;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    enum charged_rc rc = move_begin(st, err);
    if (rc != CHARGED_OK)
        return rc;
    rc = op_outcomes_lock(st->db, SQL_LOCK, items, n, &ours, &nours, err);
    if (rc == CHARGED_OK && !(ends = op_batch_new(n, sizeof(*ends), err)))
        rc = CHARGED_RETRY;
    for (size_t i = 0; rc == CHARGED_OK && i < nours; i++)
        ends[i] =
            (struct void_end){ours[i].id, ours[i].lease_epoch, ATTEMPT_S_PROCESSING,
                              ours[i].status, ours[i].reason};
    if (rc == CHARGED_OK && nours > 0)
        rc = move_run(st, ends, nours, "worker", err);
    if (rc == CHARGED_OK && nours > 0)
        rc = stmt_persist(st->db, st->actor, SQL_PERSIST, ours, nours, outcome_of, err);
    if ((rc = move_end(st, rc, err)) == CHARGED_OK)
        op_outcomes_unpack(items, n, ours, nours);
    free(ends);
    free(ours);
    return rc;
}

/* ---- leases ---- */

static const char *SQL_RENEW = SQL_LEASE_RENEW("void_attempts");
static const char *SQL_RELEASE =
    SQL_LEASE_END("void_attempts", "lease_expires_at = now()");
static const char *SQL_HAND_BACK =
    SQL_LEASE_END("void_attempts", "lease_owner = NULL, lease_expires_at = NULL");

enum charged_rc void_store_renew(void_store_t *st, const char *const *ids,
                                 const int64_t *epochs, size_t n, long long lease_ms,
                                 int *still_ours, struct charged_error *err)
{
    PGresult *r = NULL;
    CHARGED_ASSERT(st && (n == 0 || (ids && epochs && still_ours)));
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    enum charged_rc rc =
        stmt_lease(st->db, st->actor, SQL_RENEW, ids, epochs, n, &lease_ms, &r, err);
    str_index_t *rows = rc == CHARGED_OK ? stmt_index_rows(r, 0) : NULL;
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++)
        still_ours[i] = stmt_row_in(rows, r, 0, ids[i]) >= 0;
    str_index_free(rows);
    PQclear(r);
    return rc;
}

/* Ends leases by sql (release: due again at once to the worker; hand
 * back: to any reconciler). */
static enum charged_rc lease_end(void_store_t *st, const char *sql,
                                 const char *const *ids, const int64_t *epochs,
                                 size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st && sql && (n == 0 || (ids && epochs)));
    charged_error_clear(err);
    return n ? stmt_lease(st->db, st->actor, sql, ids, epochs, n, NULL, NULL, err)
             : CHARGED_OK;
}

enum charged_rc void_store_release(void_store_t *st, const char *const *ids,
                                   const int64_t *epochs, size_t n,
                                   struct charged_error *err)
{
    return lease_end(st, SQL_RELEASE, ids, epochs, n, err);
}

enum charged_rc void_store_hand_back(void_store_t *st, const char *const *ids,
                                     const int64_t *epochs, size_t n,
                                     struct charged_error *err)
{
    return lease_end(st, SQL_HAND_BACK, ids, epochs, n, err);
}

/* ---- reconciliation ---- */

/* clang-format off */
static const char *SQL_CLAIM_DUE =
    SQL_STEP_CLAIM_DUE("void_attempts")
    "  coalesce((extract(epoch FROM now() - p.first_sent_at) * 1000)::bigint, -1),"
    "  (extract(epoch FROM now() - p.created_at) * 1000)::bigint, p.reconcile_checks,"
    "  p.idempotency_key, coalesce(p.payment_intent, ''), p.payment_attempt_id,"
    "  p.void_reason,"
    "  coalesce((SELECT amount FROM payment_attempts a WHERE a.id = p.payment_attempt_id),"
    "    0)";

/* The look's settlement: the void's change with its transition, event and
 * calls ($11..$19), fenced on the lease; or (the same status) the next
 * look. $20: 1 when the look counts among the checks (0: throttled). */
static const char *SQL_SETTLE =
    "WITH lk AS ("
    "  SELECT id, status AS old_status FROM void_attempts"
    "  WHERE id = $1::uuid AND status = $2 AND lease_owner = $4"
    "    AND lease_epoch = $3::bigint"
    "  FOR NO KEY UPDATE SKIP LOCKED),"
    " u AS ("
    "  UPDATE void_attempts w SET status = $5,"
    "    reason = CASE WHEN $5 = lk.old_status THEN w.reason ELSE $6::text END,"
    "    last_error = CASE WHEN $5 = lk.old_status THEN coalesce($6::text, w.last_error)"
    "      ELSE w.last_error END,"
    "    released_amount = CASE WHEN $5 = " ATTEMPT_SQL(SUCCEEDED) " THEN"
    "      (SELECT amount FROM payment_attempts a WHERE a.id = w.payment_attempt_id) END,"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = w.attempt_count + $8::int,"
    "    reconcile_checks = w.reconcile_checks + $20::int,"
    "    next_check_at = CASE WHEN $9::bigint IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => $9::bigint / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("w")
    "  FROM lk WHERE w.id = lk.id"
    "  RETURNING w.id, w.payment_attempt_id, w.order_id,"
    "    w.payment_intent AS provider_payment_id, w.status, w.reason, w.updated_at,"
    "    lk.old_status, $7::jsonb AS evidence,"
    "    CASE WHEN w.status <> lk.old_status THEN $10::text END AS event_type),"
    " t AS ("
    "  INSERT INTO void_transitions (void_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, old_status, status, 'reconciler', $4, reason, evidence, updated_at"
    "  FROM u WHERE status <> old_status),"
    SQL_VOID_OUTBOX_EVENTS("u") ","
    " pc AS ("
    "  INSERT INTO provider_calls (payment_attempt_id, void_id, operation, started_at,"
    "    latency_ms, outcome, http_status, replayed, provider_payment_id, error, actor)"
    "  SELECT w.payment_attempt_id, v.id, v.op, to_timestamp(v.started_ms / 1000.0),"
    "    v.latency, v.outcome, nullif(v.http, 0), v.replayed, nullif(v.ppid, ''),"
    "    nullif(v.err, ''), $4"
    "  FROM unnest($11::uuid[], $12::text[], $13::bigint[], $14::int[], $15::text[],"
    "    $16::int[], $17::bool[], $18::text[], $19::text[])"
    "    AS v(id, op, started_ms, latency, outcome, http, replayed, ppid, err)"
    "  JOIN void_attempts w ON w.id = v.id)"
    "SELECT (SELECT count(*) FROM u),"
    "  NOT EXISTS (SELECT 1 FROM lk) AND EXISTS (SELECT 1 FROM void_attempts"
    "    WHERE id = $1::uuid AND status = $2 AND lease_owner = $4"
    "    AND lease_epoch = $3::bigint)";

static const char *SQL_BACKLOG =
    "SELECT status, count(*),"
    "  (extract(epoch FROM now() - min(created_at)) * 1000)::bigint"
    " FROM void_attempts WHERE status = ANY($1::text[]) GROUP BY status";
/* clang-format on */

static void read_due(const PGresult *r, int i, struct void_due *d)
{
    CHARGED_ASSERT(r && d);
    memset(d, 0, sizeof(*d));
    stmt_col_copy(r, i, 0, d->id, sizeof(d->id));
    d->lease_epoch = stmt_col_int(r, i, 1);
    d->status = (enum attempt_status)attempt_status_parse(PQgetvalue(r, i, 2));
    d->key_age_ms = stmt_col_int(r, i, 3);
    d->age_ms = stmt_col_int(r, i, 4);
    d->checks = (int)stmt_col_int(r, i, 5);
    read_params(r, i, 6, &d->params);
    /* Claimed just now, under a lease: its first epoch is 1. */
    CHARGED_ASSERT(d->lease_epoch > 0);
}

enum charged_rc void_store_claim_due(void_store_t *st, struct void_due *out, size_t max,
                                     size_t *n, long long lease_ms, long long stale_ms,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(st && n && (out || max == 0));
    struct stmt s = {0};
    PGresult *r = NULL;
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
    enum charged_rc rc = stmt_run(st->db, &s, SQL_CLAIM_DUE, &r, err);
    for (int i = 0; rc == CHARGED_OK && i < PQntuples(r) && *n < max; i++)
        read_due(r, i, &out[(*n)++]);
    CHARGED_ASSERT(*n <= max);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* The settlement's own statement, after the authorization's move. */
static enum charged_rc settle_void(void_store_t *st, struct op_settlement *it,
                                   struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r = NULL;
    int ncancels = 0;
    for (size_t i = 0; i < it->nrows; i++)
        ncancels += !strcmp(it->rows[i].operation, "void");
    stmt_text(&s, it->id);
    stmt_text(&s, attempt_status_name(it->expected));
    stmt_int(&s, it->lease_epoch);
    stmt_text(&s, st->actor);
    stmt_text(&s, attempt_status_name(it->status));
    stmt_text(&s, it->reason);
    stmt_text(&s, it->evidence_json ? it->evidence_json : "{}");
    stmt_int(&s, ncancels);
    stmt_int_or_null(&s, it->next_check_ms);
    stmt_text(&s, void_store_event_type(it->status));
    int a = stmt_arrays(&s, 9);
    for (size_t i = 0; i < it->nrows; i++) {
        const struct provider_result *res = it->rows[i].res;
        stmt_add(&s, a, it->id);
        stmt_add(&s, a + 1, it->rows[i].operation);
        stmt_add_int(&s, a + 2, it->rows[i].started_ms);
        stmt_add_int(&s, a + 3, res->latency_ms);
        stmt_add(&s, a + 4, provider_outcome_name(res->outcome));
        stmt_add_int(&s, a + 5, res->http_status);
        stmt_add(&s, a + 6, res->replayed ? "t" : "f");
        stmt_add(&s, a + 7, res->provider_payment_id);
        stmt_add(&s, a + 8, res->outcome == PROVIDER_SUCCEEDED ? "" : res->error);
    }
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

enum charged_rc void_store_settle(void_store_t *st, struct op_settlement *it,
                                  struct charged_error *err)
{
    CHARGED_ASSERT(st && it && it->id && (it->rows || it->nrows == 0));
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
    const struct void_end end = {it->id, it->lease_epoch,
                                 attempt_status_name(it->expected),
                                 attempt_status_name(it->status), it->reason};
    int locked = 0;
    enum charged_rc rc = move_begin(st, err);
    if (rc != CHARGED_OK)
        return rc;
    rc = stmt_lock_ids(st->db, SQL_LOCK, &it->id, 1, &locked, err);
    if (rc == CHARGED_OK && !locked)
        it->busy = 1; /* another session holds it: settled again later */
    else if (rc == CHARGED_OK &&
             (rc = move_run(st, &end, 1, "reconciler", err)) == CHARGED_OK)
        rc = settle_void(st, it, err);
    return move_end(st, rc, err);
}

enum charged_rc void_store_backlog(void_store_t *st,
                                   const enum attempt_status *statuses, size_t n,
                                   long long *counts, long long *oldest_ms,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(st && statuses && counts && oldest_ms);
    return stmt_backlog(st->db, SQL_BACKLOG, statuses, n, counts, oldest_ms, err);
}
