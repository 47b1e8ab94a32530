#include "attempt_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "charged_assert.h"
#include "db.h"
#include "store_conn.h"
#include "lease_sql.h"
#include "store_stmt.h"

struct attempt_store {
    store_conn_t *db;
    char *actor;
    /* The reconciler's look of one operation (attempt_store_new_of): the
     * capture method it claims (NULL: any), and the age of a lapsed hold
     * (<= 0: none claimed). */
    const char *capture_method;
    long long lapse_ms;
};

/* Rows are skipped when locked, but an insert's unique index (and a
 * foreign-key check) waits for another session's uncommitted change to a
 * conflicting row: let that cost one item 100 ms, never the loop its
 * statement_timeout (DATABASE_TIMEOUT_MS). Our own statements hold their
 * locks for milliseconds. */
#define ATTEMPT_LOCK_TIMEOUT "100ms"

/* attempt_store_new, _free and _ping. */
STMT_STORE_SESSION(attempt_store, ATTEMPT_LOCK_TIMEOUT)
STMT_STORE_WAIT(attempt_store, "payment_attempts")

attempt_store_t *attempt_store_new_of(const char *database_url, const char *actor,
                                      const char *capture_method, long long lapse_ms,
                                      struct charged_error *err)
{
    /* One of the column's two values, as the CHECK has them; only an
     * authorization is held, so only its look claims lapsed holds. */
    CHARGED_ASSERT(capture_method && (!strcmp(capture_method, "automatic") ||
                                      !strcmp(capture_method, "manual")));
    CHARGED_ASSERT(lapse_ms <= 0 || !strcmp(capture_method, "manual"));
    attempt_store_t *st = attempt_store_new(database_url, actor, err);
    if (st) {
        st->capture_method = capture_method;
        st->lapse_ms = lapse_ms;
    }
    return st;
}

/* ---- one statement: its parameters, then its rows ---- */

/* What the provider is called with, from seven columns starting at `first`:
 * idempotency_key, order_id, amount, currency, payment_method, customer_id,
 * capture_method. */
static void col_params(const PGresult *r, int row, int first, struct attempt_params *pa)
{
    CHARGED_ASSERT(r && pa && row >= 0 && first >= 0);
    stmt_col_copy(r, row, first, pa->idempotency_key, sizeof(pa->idempotency_key));
    stmt_col_copy(r, row, first + 1, pa->order_id, sizeof(pa->order_id));
    pa->amount = stmt_col_int(r, row, first + 2);
    stmt_col_copy(r, row, first + 3, pa->currency, sizeof(pa->currency));
    stmt_col_copy(r, row, first + 4, pa->payment_method, sizeof(pa->payment_method));
    stmt_col_copy(r, row, first + 5, pa->customer_id, sizeof(pa->customer_id));
    pa->manual = !strcmp(PQgetvalue(r, row, first + 6), "manual");
}

/* A provider's id as a parameter: "" is none. */
static const char *or_null(const char *s)
{
    return s && *s ? s : NULL;
}

/* ---- record ---- */

/* Rows go in in the order of the arrays (ordinality): the first of two
 * messages for one attempt in a batch is the one stored. With a lease ($11
 * ms > 0) a new row goes in PROCESSING, claimed: the claim's columns as
 * SQL_CLAIM sets them, first_sent_at included (the call follows at once).
 * Then the stored rows every message of the batch is compared with: those
 * this statement inserted, and those that were there before it (its
 * snapshot). A row another session committed meanwhile is in neither; its
 * message matches nothing and record_rejected() reads afresh. */
/* clang-format off */
#define RECORD_CLAIMS "$11::bigint > 0"
static const char *SQL_RECORD =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::bigint[], $6::text[], $7::text[], $8::text[], $9::jsonb[], $12::text[])"
    "  WITH ORDINALITY AS v(id, order_id, idempotency_key, fp, amount, currency,"
    "       payment_method, customer_id, metadata, capture_method, n)),"
    " ins AS ("
    "  INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,"
    "    amount, currency, payment_method, customer_id, metadata, capture_method, status,"
    "    lease_owner, lease_expires_at, lease_epoch, first_sent_at)"
    "  SELECT id, order_id, idempotency_key, fp, amount, currency, payment_method,"
    "    nullif(customer_id, ''), metadata, capture_method,"
    "    CASE WHEN " RECORD_CLAIMS " THEN " ATTEMPT_SQL(PROCESSING)
    "         ELSE " ATTEMPT_SQL(PENDING) " END,"
    "    CASE WHEN " RECORD_CLAIMS " THEN $10 END,"
    "    CASE WHEN " RECORD_CLAIMS
    "         THEN now() + make_interval(secs => $11::double precision / 1000) END,"
    "    CASE WHEN " RECORD_CLAIMS " THEN 1 ELSE 0 END,"
    "    CASE WHEN " RECORD_CLAIMS " THEN now() END"
    "  FROM v"
    /* A refund's key is never a charge's: the provider keeps one namespace. */
    "  WHERE NOT EXISTS (SELECT 1 FROM refund_attempts r"
    "    WHERE r.idempotency_key = v.idempotency_key)"
    "  ORDER BY n ON CONFLICT DO NOTHING"
    "  RETURNING id, idempotency_key, request_fingerprint, status, lease_epoch, order_id,"
    "    amount, currency, payment_method, coalesce(customer_id, '') AS customer_id,"
    "    capture_method),"
    " tr AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason)"
    "  SELECT id, NULL, status, 'worker', $10,"
    "    CASE WHEN status = " ATTEMPT_SQL(PENDING) " THEN 'recorded'"
    "         ELSE 'recorded and claimed' END FROM ins),"
    " old AS ("
    "  SELECT id, idempotency_key, request_fingerprint, 'attempt' AS kind"
    "  FROM payment_attempts WHERE id = ANY($1::uuid[]) OR idempotency_key = ANY($3::text[])"
    "  UNION ALL SELECT id, idempotency_key, '', 'refund' FROM refund_attempts"
    "  WHERE idempotency_key = ANY($3::text[]))"
    "SELECT id, idempotency_key, request_fingerprint, 'attempt',"
    "  status = " ATTEMPT_SQL(PROCESSING) ", lease_epoch, idempotency_key, order_id, amount,"
    "  currency, payment_method, customer_id, capture_method FROM ins"
    " UNION ALL SELECT id, idempotency_key, request_fingerprint, kind, false, NULL, NULL,"
    "  NULL, NULL, NULL, NULL, NULL, NULL FROM old";
#undef RECORD_CLAIMS

static const char *SQL_FIND_LIVE =
    "SELECT order_id, id, status FROM payment_attempts"
    " WHERE order_id = ANY($1::uuid[]) AND status = ANY($2::text[])";

static const char *SQL_INSERT_REJECTED =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::bigint[], $6::text[], $7::text[], $8::text[], $9::jsonb[], $10::text[],"
    "    $13::text[])"
    "  WITH ORDINALITY AS v(id, order_id, idempotency_key, fp, amount, currency,"
    "       payment_method, customer_id, metadata, reason, capture_method, n)),"
    " ins AS ("
    "  INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,"
    "    amount, currency, payment_method, customer_id, metadata, capture_method,"
    "    status, reason)"
    "  SELECT id, order_id, idempotency_key, fp, amount, currency, payment_method,"
    "    nullif(customer_id, ''), metadata, capture_method, " ATTEMPT_SQL(REJECTED) ","
    "    reason FROM v"
    "  WHERE NOT EXISTS (SELECT 1 FROM refund_attempts r"
    "    WHERE r.idempotency_key = v.idempotency_key)"
    "  ORDER BY n ON CONFLICT DO NOTHING"
    "  RETURNING id, order_id, amount, currency, provider_payment_id, status, reason,"
    "    updated_at, CASE capture_method WHEN 'manual' THEN $14::text ELSE $12::text END"
    "    AS event_type),"
    " tr AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason)"
    "  SELECT id, NULL, status, 'worker', $11, reason FROM ins),"
    SQL_OUTBOX_EVENTS("ins")
    "SELECT id FROM ins";
/* clang-format on */

/* The capture_method column of a command's attempt. */
static const char *capture_method_of(const struct charge_command *c)
{
    CHARGED_ASSERT(c);
    return c->manual ? "manual" : "automatic";
}

/* Appends one command to the nine array parameters from `first`, in the
 * column order of SQL_INSERT_PENDING and SQL_INSERT_REJECTED. */
static void add_command(struct stmt *s, int first, const struct charge_command *c)
{
    CHARGED_ASSERT(s && c && first >= 0);
    stmt_add(s, first, c->payment_attempt_id);
    stmt_add(s, first + 1, c->order_id);
    stmt_add(s, first + 2, c->idempotency_key);
    stmt_add(s, first + 3, c->fingerprint);
    stmt_add_int(s, first + 4, c->amount);
    stmt_add(s, first + 5, c->currency);
    stmt_add(s, first + 6, c->payment_method);
    stmt_add(s, first + 7, c->customer_id);
    stmt_add(s, first + 8, c->metadata_json ? c->metadata_json : "{}");
}

/* Attempt-id order, and batch order among messages of one attempt. */
static int by_attempt_id(const void *a, const void *b)
{
    const struct attempt_record_item *x = *(const struct attempt_record_item *const *)a,
                                     *y = *(const struct attempt_record_item *const *)b;
    int c = strcmp(x->cmd->payment_attempt_id, y->cmd->payment_attempt_id);
    return c ? c : (x < y ? -1 : x > y);
}

/* One stored row r of `found` against item's message: by its attempt id
 * (the stored attempt: a conflict if its key or parameters differ) or by
 * its idempotency key (another object's: a conflict). */
static void compare_row(struct attempt_record_item *item, const PGresult *found, int r,
                        int *by_id, int *by_key)
{
    const struct charge_command *c = item->cmd;
    const char *id = PQgetvalue(found, r, 0), *key = PQgetvalue(found, r, 1),
               *fp = PQgetvalue(found, r, 2);
    if (!strcmp(id, c->payment_attempt_id) &&
        !strcmp(PQgetvalue(found, r, 3), "attempt")) {
        *by_id = 1;
        if (strcmp(key, c->idempotency_key) != 0) {
            item->result = ATTEMPT_CONFLICT;
            snprintf(item->reason, sizeof(item->reason),
                     "attempt %s is already recorded under another idempotency key",
                     id);
        } else if (strcmp(fp, c->fingerprint) != 0) {
            item->result = ATTEMPT_CONFLICT;
            snprintf(item->reason, sizeof(item->reason),
                     "idempotency key reused with other parameters than attempt %s",
                     id);
        }
    } else if (!strcmp(key, c->idempotency_key)) {
        *by_key = 1;
        item->result = ATTEMPT_CONFLICT;
        snprintf(item->reason, sizeof(item->reason),
                 "idempotency key already belongs to %s %s", PQgetvalue(found, r, 3),
                 id);
    }
}

static int by_row(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* The rows of `found` whose id is the message's attempt id or whose key is
 * its key, in row order and each once (the rows compare_row may match):
 * how many, or -1 when more than max (the caller scans every row then). */
static int candidate_rows(const str_index_t *ids, const str_index_t *keys,
                          const struct charge_command *c, int *rows, int max)
{
    int n = 0;
    for (int e = str_index_find(ids, c->payment_attempt_id); e >= 0;
         e = str_index_next(ids, e))
        if (n < max)
            rows[n++] = str_index_value(ids, e);
        else
            return -1;
    for (int e = str_index_find(keys, c->idempotency_key); e >= 0;
         e = str_index_next(keys, e))
        if (n < max)
            rows[n++] = str_index_value(keys, e);
        else
            return -1;
    qsort(rows, (size_t)n, sizeof(*rows), by_row);
    int k = 0;
    for (int i = 0; i < n; i++)
        if (k == 0 || rows[k - 1] != rows[i])
            rows[k++] = rows[i];
    return k;
}

/* Compares each message with the stored rows `found` (SQL_RECORD):
 * recorded, a conflict, or, matching no row at all, ATTEMPT_REJECTED for
 * now: only the one-live-attempt-per-order index refused it. The rows
 * each message may match are found by id and key (an index of each);
 * without memory for them, by a scan of all. Returns how many are. */
static size_t compare_with_stored(struct attempt_record_item *items, size_t n,
                                  const PGresult *found)
{
    CHARGED_ASSERT(items || n == 0);
    CHARGED_ASSERT(found);
    size_t nblocked = 0;
    str_index_t *ids = stmt_index_rows(found, 0), *keys = stmt_index_rows(found, 1);
    for (size_t i = 0; i < n; i++) {
        int rows[16], nrows = -1, by_id = 0, by_key = 0;
        items[i].result = ATTEMPT_RECORDED;
        items[i].reason[0] = '\0';
        if (ids && keys)
            nrows = candidate_rows(ids, keys, items[i].cmd, rows, 16);
        if (nrows >= 0)
            for (int k = 0; k < nrows; k++)
                compare_row(&items[i], found, rows[k], &by_id, &by_key);
        else
            for (int r = 0; r < PQntuples(found); r++)
                compare_row(&items[i], found, r, &by_id, &by_key);
        if (!by_id && !by_key) {
            items[i].result = ATTEMPT_REJECTED;
            nblocked++;
        }
    }
    str_index_free(ids);
    str_index_free(keys);
    CHARGED_ASSERT(nblocked <= n);
    return nblocked;
}

/* The row of `live` (SQL_FIND_LIVE) of another attempt of c's order, or -1:
 * the live attempt settled meanwhile. */
static int live_row(const PGresult *live, const struct charge_command *c)
{
    CHARGED_ASSERT(live && c);
    int row = -1;
    for (int r = 0; r < PQntuples(live); r++)
        if (!strcmp(PQgetvalue(live, r, 0), c->order_id) &&
            strcmp(PQgetvalue(live, r, 1), c->payment_attempt_id) != 0)
            row = r;
    return row;
}

/* The messages still ATTEMPT_REJECTED, which only the one-live-attempt-per-
 * order index refused: recorded REJECTED, with the live attempt as the
 * reason, or ATTEMPT_RETRY (the live attempt settled meanwhile, or the
 * message is not the first of its attempt in this batch). */
static enum charged_rc record_rejected(attempt_store_t *st,
                                       struct attempt_record_item *items, size_t n,
                                       struct charged_error *err)
{
    struct stmt find = {0}, rej = {0};
    PGresult *live = NULL, *ins = NULL;
    size_t nrej = 0;
    enum charged_rc rc;

    int orders = stmt_arrays(&find, 1);
    for (size_t i = 0; i < n; i++)
        if (items[i].result == ATTEMPT_REJECTED)
            stmt_add(&find, orders, items[i].cmd->order_id);
    stmt_text(&find, attempt_status_live_array());
    if ((rc = stmt_run(st->db, &find, SQL_FIND_LIVE, &live, err)) != CHARGED_OK)
        goto out;
    int cmds = stmt_arrays(&rej, 10);
    for (size_t i = 0; i < n; i++) {
        const struct charge_command *c = items[i].cmd;
        if (items[i].result != ATTEMPT_REJECTED)
            continue;
        int row = live_row(live, c);
        if (row < 0) {
            /* The live attempt settled meanwhile: try again from the top. */
            items[i].result = ATTEMPT_RETRY;
            continue;
        }
        const char *status = PQgetvalue(live, row, 2);
        if (!strcmp(status, ATTEMPT_S_SUCCEEDED))
            snprintf(items[i].reason, sizeof(items[i].reason),
                     "order_already_paid: attempt %s succeeded",
                     PQgetvalue(live, row, 1));
        else
            snprintf(items[i].reason, sizeof(items[i].reason),
                     "order_has_live_attempt: attempt %s is %s",
                     PQgetvalue(live, row, 1), status);
        add_command(&rej, cmds, c);
        stmt_add(&rej, cmds + 9, items[i].reason);
        nrej++;
    }
    if (nrej == 0)
        goto out;
    stmt_text(&rej, st->actor);
    stmt_text(&rej, attempt_status_event_type(ATTEMPT_STATUS_REJECTED));
    int methods = stmt_arrays(&rej, 1);
    for (size_t i = 0; i < n; i++)
        if (items[i].result == ATTEMPT_REJECTED)
            stmt_add(&rej, methods, capture_method_of(items[i].cmd));
    stmt_text(&rej, attempt_status_authorization_event_type(ATTEMPT_STATUS_REJECTED));
    if ((rc = stmt_run_keyed(st->db, &rej, SQL_INSERT_REJECTED, &ins, err)) !=
        CHARGED_OK)
        goto out;
    /* Only the first message of an attempt in this batch is the one
     * stored REJECTED; any other (a copy, or a conflicting resend) is
     * recorded again, and then compared with the stored row like any
     * message. So is one whose row a concurrent duplicate wrote. */
    for (size_t i = 0; i < n; i++) {
        if (items[i].result != ATTEMPT_REJECTED)
            continue;
        int first = stmt_row_of(ins, 0, items[i].cmd->payment_attempt_id) >= 0;
        for (size_t k = 0; first && k < i; k++)
            if (items[k].result != ATTEMPT_RETRY &&
                !strcmp(items[k].cmd->payment_attempt_id,
                        items[i].cmd->payment_attempt_id))
                first = 0;
        if (!first)
            items[i].result = ATTEMPT_RETRY;
    }
out:
    PQclear(live);
    PQclear(ins);
    stmt_release(&find);
    stmt_release(&rej);
    return rc;
}

/* The first message (batch order) of attempt `id` still RECORDED, or -1:
 * by the index of the batch's attempt ids, or a scan without one. */
static int first_recorded(const struct attempt_record_item *items, size_t n,
                          const str_index_t *by_id, const char *id)
{
    int first = -1;
    if (!by_id) {
        for (size_t i = 0; first < 0 && i < n; i++)
            if (items[i].result == ATTEMPT_RECORDED &&
                !strcmp(items[i].cmd->payment_attempt_id, id))
                first = (int)i;
        return first;
    }
    for (int e = str_index_find(by_id, id); e >= 0; e = str_index_next(by_id, e)) {
        int i = str_index_value(by_id, e);
        if (items[i].result == ATTEMPT_RECORDED && (first < 0 || i < first))
            first = i;
    }
    return first;
}

/* The first message of each attempt this statement claimed (rows of
 * SQL_RECORD): ATTEMPT_RECORDED_CLAIMED, with the claim. */
static void take_claims(struct attempt_record_item *items, size_t n, const PGresult *r)
{
    CHARGED_ASSERT(items && r);
    str_index_t *by_id = str_index_new(n);
    for (size_t i = 0; by_id && i < n; i++) {
        int full = str_index_add(by_id, items[i].cmd->payment_attempt_id, (int)i);
        CHARGED_ASSERT(!full); /* sized to the batch */
    }
    for (int row = 0; row < PQntuples(r); row++) {
        if (!stmt_col_true(r, row, 4))
            continue;
        int i = first_recorded(items, n, by_id, PQgetvalue(r, row, 0));
        if (i < 0)
            continue;
        items[i].result = ATTEMPT_RECORDED_CLAIMED;
        items[i].lease_epoch = stmt_col_int(r, row, 5);
        /* Claimed by this statement: a lease's first epoch is 1. */
        CHARGED_ASSERT(items[i].lease_epoch > 0);
        col_params(r, row, 6, &items[i].params);
    }
    str_index_free(by_id);
}

enum charged_rc attempt_store_record(attempt_store_t *st,
                                     struct attempt_record_item *items, size_t n,
                                     long long lease_ms, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    struct stmt ins = {0};
    PGresult *found = NULL;
    struct attempt_record_item **sorted = NULL;
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
    qsort(sorted, n, sizeof(*sorted), by_attempt_id);
    int cmds = stmt_arrays(&ins, 9);
    for (size_t i = 0; i < n; i++)
        add_command(&ins, cmds, sorted[i]->cmd);
    stmt_text(&ins, st->actor);
    stmt_int(&ins, lease_ms > 0 ? lease_ms : 0);
    int methods = stmt_arrays(&ins, 1);
    for (size_t i = 0; i < n; i++)
        stmt_add(&ins, methods, capture_method_of(sorted[i]->cmd));
    if ((rc = stmt_run_keyed(st->db, &ins, SQL_RECORD, &found, err)) != CHARGED_OK)
        goto out;
    /* Every message is compared with the stored attempt, whatever batch
     * stored it: a conflicting resend in the same batch as its original is
     * a conflict like any other. */
    size_t nblocked = compare_with_stored(items, n, found);
    take_claims(items, n, found);
    if (nblocked > 0)
        rc = record_rejected(st, items, n, err);
out:
    free(sorted);
    PQclear(found);
    stmt_release(&ins);
    return rc;
}

/* ---- claim ---- */

/* Locks in id order (SKIP LOCKED never waits, but the order keeps the
 * statement's own lock set predictable). Returns, for every asked id, the
 * row's status and, when this statement claimed it, the lease and what the
 * provider is to be called with. The key's age is read on the database's
 * clock, the one first_sent_at was written with. */
/* clang-format off */
static const char *SQL_CLAIM =
    "WITH q AS (SELECT DISTINCT id FROM unnest($1::uuid[]) AS q(id)),"
    " c AS ("
    "  SELECT p.id, p.status, p.lease_owner FROM payment_attempts p JOIN q ON p.id = q.id"
    "  WHERE p.status = " ATTEMPT_SQL(PENDING)
    "     OR (p.status = " ATTEMPT_SQL(PROCESSING) " AND p.next_check_at IS NULL"
    "         AND p.lease_owner IS NOT NULL"
    /* A lease of ours that no job of ours holds (the engine asks for no
     * other): a claim whose answer we lost (a record-and-claim given up at
     * its deadline that committed later, or whose batch failed after it
     * committed). Taken again at once, under a new epoch. */
    "         AND (p.lease_expires_at < now() OR p.lease_owner = $2))"
    "  ORDER BY p.id FOR NO KEY UPDATE OF p SKIP LOCKED),"
    " u AS ("
    "  UPDATE payment_attempts p SET status = " ATTEMPT_SQL(PROCESSING) ", lease_owner = $2,"
    "    lease_expires_at = now() + make_interval(secs => $3::double precision / 1000),"
    "    lease_epoch = p.lease_epoch + 1,"
    "    first_sent_at = coalesce(p.first_sent_at, now()),"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM c WHERE p.id = c.id"
    "  RETURNING p.id, c.status AS old_status, c.lease_owner AS old_owner, p.lease_epoch,"
    "    p.attempt_count, p.updated_at,"
    "    (extract(epoch FROM now() - p.first_sent_at) * 1000)::bigint AS key_age_ms,"
    "    p.idempotency_key, p.order_id, p.amount, p.currency, p.payment_method,"
    "    coalesce(p.customer_id, '') AS customer_id, p.capture_method),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, created_at)"
    "  SELECT id, old_status, " ATTEMPT_SQL(PROCESSING) ", 'worker', $2,"
    "    CASE WHEN old_status = " ATTEMPT_SQL(PENDING) " THEN 'claimed'"
    "         WHEN old_owner = $2 THEN 'our lost claim taken again'"
    "         ELSE 'lease expired; taken over' END, updated_at FROM u)"
    /* Those claimed, then the others as the statement found them: no join
     * of u with q (see SQL_LEASES_UNLOCKED on such joins). */
    "SELECT id, old_status, true, lease_epoch, attempt_count, key_age_ms,"
    "  idempotency_key, order_id, amount, currency, payment_method, customer_id,"
    "  capture_method FROM u"
    " UNION ALL SELECT a.id, a.status, a.lease_owner IS NOT NULL, NULL, NULL, NULL, NULL,"
    "  NULL, NULL, NULL, NULL, NULL, NULL"
    " FROM payment_attempts a JOIN q ON a.id = q.id WHERE a.id NOT IN (SELECT id FROM u)";
/* clang-format on */

/* Item i's result, from the rows of SQL_CLAIM (rows: by attempt id);
 * claimed: the items claimed so far, by attempt id (NULL: scanned). */
static void read_claim(struct attempt_claim_item *items, size_t i, const PGresult *r,
                       const str_index_t *rows, str_index_t *claimed)
{
    CHARGED_ASSERT(items && r);
    struct attempt_claim_item *it = &items[i];
    int row = stmt_row_in(rows, r, 0, it->attempt_id);
    it->result = ATTEMPT_BUSY;
    it->status[0] = '\0';
    if (row < 0)
        return;
    stmt_col_copy(r, row, 1, it->status, sizeof(it->status));
    int leased = stmt_col_true(r, row, 2);
    if (!PQgetisnull(r, row, 3)) {
        /* Claimed by this statement. Two items of one attempt in a batch:
         * only the first takes it; the other waits like any peer. */
        if (claimed && str_index_find(claimed, it->attempt_id) >= 0)
            return;
        for (size_t j = 0; !claimed && j < i; j++)
            if (items[j].result == ATTEMPT_CLAIMED &&
                !strcmp(items[j].attempt_id, it->attempt_id))
                return;
        if (claimed) {
            int full = str_index_add(claimed, it->attempt_id, (int)i);
            CHARGED_ASSERT(!full); /* one entry an item at most */
        }
        it->result = ATTEMPT_CLAIMED;
        it->lease_epoch = stmt_col_int(r, row, 3);
        CHARGED_ASSERT(it->lease_epoch > 0);
        it->attempt_count = (int)stmt_col_int(r, row, 4);
        it->key_age_ms = stmt_col_int(r, row, 5);
        col_params(r, row, 6, &it->params);
    } else if (strcmp(it->status, ATTEMPT_S_PENDING) != 0 &&
               (strcmp(it->status, ATTEMPT_S_PROCESSING) != 0 || !leased)) {
        it->result = ATTEMPT_SETTLED;
    }
}

enum charged_rc attempt_store_claim(attempt_store_t *st,
                                    struct attempt_claim_item *items, size_t n,
                                    long long lease_ms, struct charged_error *err)
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
        stmt_add(&s, ids, items[i].attempt_id);
    stmt_text(&s, st->actor);
    stmt_int(&s, lease_ms);
    if ((rc = stmt_run(st->db, &s, SQL_CLAIM, &r, err)) == CHARGED_OK) {
        str_index_t *rows = stmt_index_rows(r, 0), *claimed = str_index_new(n);
        for (size_t i = 0; i < n; i++)
            read_claim(items, i, r, rows, claimed);
        str_index_free(rows);
        str_index_free(claimed);
    }
    /* Claimed, the params to send are the stored attempt's. */
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++)
        CHARGED_ASSERT(items[i].result != ATTEMPT_CLAIMED ||
                       items[i].params.amount > 0);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

/* ---- provider calls ---- */

/* clang-format off */
/* The rows of provider calls, from nine arrays at $a..$a+8, the actor at
 * `actor`; `where` limits them (to settled attempts, say). */
#define SQL_PROVIDER_CALLS(a0, a1, a2, a3, a4, a5, a6, a7, a8, actor, where) \
    "INSERT INTO provider_calls (payment_attempt_id, operation, started_at, latency_ms," \
    "  outcome, http_status, replayed, provider_payment_id, error, actor)" \
    " SELECT id, op, to_timestamp(started_ms / 1000.0), latency, outcome," \
    "  nullif(http, 0), replayed, nullif(ppid, ''), nullif(err, ''), " actor \
    " FROM unnest(" a0 "::uuid[], " a1 "::text[], " a2 "::bigint[], " a3 "::int[]," \
    "  " a4 "::text[], " a5 "::int[], " a6 "::bool[], " a7 "::text[], " a8 "::text[])" \
    " AS v(id, op, started_ms, latency, outcome, http, replayed, ppid, err) " where

/* The worker's own: a call whose earlier write may have committed ($11) is
 * written only when no row of the same call (attempt, start, outcome,
 * status, latency, error) is there. One statement, one snapshot: two equal
 * rows of one batch (lost answers of one call) are both written. */
const char attempt_store_log_calls_sql[] =
    "INSERT INTO provider_calls (payment_attempt_id, operation, started_at, latency_ms,"
    "  outcome, http_status, replayed, provider_payment_id, error, actor)"
    " SELECT id, op, to_timestamp(started_ms / 1000.0), latency, outcome,"
    "  nullif(http, 0), replayed, nullif(ppid, ''), nullif(err, ''), $10"
    " FROM unnest($1::uuid[], $2::text[], $3::bigint[], $4::int[], $5::text[],"
    "  $6::int[], $7::bool[], $8::text[], $9::text[], $11::bool[])"
    " AS v(id, op, started_ms, latency, outcome, http, replayed, ppid, err, again)"
    " WHERE NOT (v.again AND EXISTS (SELECT 1 FROM provider_calls c"
    "  WHERE c.payment_attempt_id = v.id AND c.operation = v.op"
    "  AND c.started_at = to_timestamp(v.started_ms / 1000.0)"
    "  AND c.outcome = v.outcome AND c.latency_ms = v.latency"
    "  AND c.http_status IS NOT DISTINCT FROM nullif(v.http, 0)"
    "  AND c.error IS NOT DISTINCT FROM nullif(v.err, '')))";
/* clang-format on */

/* Appends the calls to the nine array parameters from `first`, in the
 * column order of SQL_PROVIDER_CALLS. */
static void add_calls(struct stmt *s, int first, const struct attempt_call *calls,
                      size_t n)
{
    CHARGED_ASSERT(s && (calls || n == 0));
    for (size_t i = 0; i < n; i++) {
        const struct provider_result *r = calls[i].res;
        stmt_add(s, first, calls[i].attempt_id);
        CHARGED_ASSERT(r && calls[i].attempt_id);
        stmt_add(s, first + 1, calls[i].operation ? calls[i].operation : "charge");
        stmt_add_int(s, first + 2, calls[i].started_ms);
        stmt_add_int(s, first + 3, r->latency_ms);
        stmt_add(s, first + 4, provider_outcome_name(r->outcome));
        stmt_add_int(s, first + 5, r->http_status);
        stmt_add(s, first + 6, r->replayed ? "t" : "f");
        stmt_add(s, first + 7, r->provider_payment_id);
        stmt_add(s, first + 8, r->outcome == PROVIDER_SUCCEEDED ? "" : r->error);
    }
}

enum charged_rc attempt_store_log_calls(attempt_store_t *st,
                                        const struct attempt_call *calls, size_t n,
                                        struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(calls || n == 0);
    struct stmt s = {0};
    enum charged_rc rc;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    add_calls(&s, stmt_arrays(&s, 9), calls, n);
    stmt_text(&s, st->actor);
    int again = stmt_arrays(&s, 1);
    for (size_t i = 0; i < n; i++)
        stmt_add(&s, again, calls[i].written_maybe ? "t" : "f");
    rc = stmt_run(st->db, &s, attempt_store_log_calls_sql, NULL, err);
    stmt_release(&s);
    return rc;
}

/* ---- persist ---- */

/* clang-format off */
static const char *SQL_PERSIST =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[], $4::text[],"
    "    $5::text[], $6::text[], $7::jsonb[], $8::int[], $9::text[], $10::bigint[])"
    "  AS v(id, epoch, status, reason, ppid, event_type, evidence, calls, last_error,"
    "       next_check_ms)),"
    SQL_LEASES_UNLOCKED("payment_attempts") ","
    " u AS ("
    "  UPDATE payment_attempts p SET status = v.status, reason = v.reason,"
    "    provider_payment_id = coalesce(v.ppid, p.provider_payment_id),"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = p.attempt_count + v.calls, last_error = v.last_error,"
    "    next_check_at = CASE WHEN v.next_check_ms IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => v.next_check_ms / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM lk AS v"
    "  WHERE p.id = v.id AND p.lease_owner = $11 AND p.lease_epoch = v.epoch"
    "    AND p.status = " ATTEMPT_SQL(PROCESSING)
    "  RETURNING p.id, p.order_id, p.amount, p.currency, p.status, p.reason,"
    "    p.provider_payment_id, p.updated_at, v.event_type, v.evidence),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, evidence, created_at)"
    "  SELECT id, " ATTEMPT_SQL(PROCESSING) ", status, 'worker', $11, reason, evidence,"
    "    updated_at FROM u),"
    SQL_LEDGER_CHARGE("u") ","
    SQL_OUTBOX_EVENTS("u")
    SQL_PERSIST_RESULT("payment_attempts");
/* clang-format on */

/* Item i of a batch of struct attempt_outcome, for stmt_persist. */
static void outcome_of(void *items, size_t i, struct stmt_outcome *o)
{
    CHARGED_ASSERT(items);
    struct attempt_outcome *it = &((struct attempt_outcome *)items)[i];
    /* In struct stmt_outcome's order. */
    *o = (struct stmt_outcome){
        it->attempt_id,          it->lease_epoch,   it->status,        it->reason,
        it->provider_payment_id, it->event_type,    it->evidence_json, it->calls,
        it->last_error,          it->next_check_ms, &it->persisted,    &it->busy};
}

enum charged_rc attempt_store_persist(attempt_store_t *st,
                                      struct attempt_outcome *items, size_t n,
                                      struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    return stmt_persist(st->db, st->actor, SQL_PERSIST, items, n, outcome_of, err);
}

/* ---- reconciliation ---- */

/* clang-format off */
/* $5: the capture method claimed (NULL: any); $6: the age of a lapsed hold
 * (NULL: none), an AUTHORIZED attempt first sent longer ago, unleased (or
 * its lease expired). */
static const char *SQL_CLAIM_DUE =
    "WITH c AS ("
    "  SELECT p.id FROM payment_attempts p"
    "  WHERE (p.next_check_at IS NULL OR p.next_check_at <= now())"
    "    AND ($5::text IS NULL OR p.capture_method = $5::text)"
    /* Our own lease too: a look of ours whose settlement found the row
     * busy kept it (a reconciler settles or hands back a batch before it
     * claims the next, so a lease of ours is never a look in progress). */
    "    AND ((p.status IN (" ATTEMPT_SQL(UNKNOWN) ", " ATTEMPT_SQL(PROCESSING) ")"
    "          AND (p.lease_owner IS NULL OR p.lease_owner = $1))"
    "      OR (p.status = " ATTEMPT_SQL(UNKNOWN) " AND p.lease_expires_at < now())"
    "      OR (p.status = " ATTEMPT_SQL(PROCESSING) " AND p.lease_expires_at <"
    "          now() - make_interval(secs => $4::double precision / 1000))"
    "      OR ($6::bigint IS NOT NULL AND p.status = " ATTEMPT_SQL(AUTHORIZED)
    "          AND (p.lease_owner IS NULL OR p.lease_owner = $1"
    "               OR p.lease_expires_at < now())"
    "          AND coalesce(p.first_sent_at, p.created_at) <"
    "              now() - make_interval(secs => $6::double precision / 1000)))"
    "  ORDER BY p.next_check_at NULLS FIRST, p.id LIMIT $3::int"
    "  FOR NO KEY UPDATE OF p SKIP LOCKED)"
    "UPDATE payment_attempts p SET lease_owner = $1,"
    "  lease_expires_at = now() + make_interval(secs => $2::double precision / 1000),"
    "  lease_epoch = p.lease_epoch + 1,"
    /* Set, so that a worker never takes this claim over as its own. */
    "  next_check_at = coalesce(p.next_check_at, now())"
    " FROM c WHERE p.id = c.id"
    " RETURNING p.id, p.lease_epoch, p.status, coalesce(p.provider_payment_id, ''),"
    "  coalesce((extract(epoch FROM now() - p.first_sent_at) * 1000)::bigint, -1),"
    "  (extract(epoch FROM now() - p.created_at) * 1000)::bigint, p.reconcile_checks,"
    "  p.idempotency_key, p.order_id, p.amount, p.currency, p.payment_method,"
    "  coalesce(p.customer_id, ''), p.capture_method,"
    "  coalesce((extract(epoch FROM p.first_sent_at) * 1000)::bigint, -1),"
    "  coalesce(p.held_by = 'void', false)";

/* One settlement: fenced on the claim (or, without a lease, on no lease at
 * all), on the status it must still have. */
static const char *SQL_SETTLE =
    "WITH lk AS ("
    "  SELECT id, status AS old_status FROM payment_attempts"
    "  WHERE id = $1::uuid AND status = $2"
    "    AND CASE WHEN $3::bigint IS NULL THEN lease_owner IS NULL"
    "             ELSE lease_owner = $4 AND lease_epoch = $3::bigint END"
    /* A hold canceled elsewhere is VOIDED only while no void of ours holds
     * it: one that took it since the claim settles its own cancel. */
    "    AND ($5 <> " ATTEMPT_SQL(VOIDED) " OR held_by IS DISTINCT FROM 'void'"
    "      OR $6::text NOT LIKE 'canceled\\_elsewhere:%')"
    "  FOR NO KEY UPDATE SKIP LOCKED),"
    " u AS ("
    "  UPDATE payment_attempts p SET status = $5,"
    "    reason = CASE WHEN $5 = lk.old_status THEN p.reason ELSE $6::text END,"
    "    last_error = CASE WHEN $5 = lk.old_status THEN coalesce($6::text, p.last_error)"
    "      ELSE p.last_error END,"
    "    provider_payment_id = coalesce($7::text, p.provider_payment_id),"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = p.attempt_count + $9::int,"
    "    reconcile_checks = p.reconcile_checks + $10::int,"
    "    next_check_at = CASE WHEN $11::bigint IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => $11::bigint / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM lk WHERE p.id = lk.id"
    "  RETURNING p.id, p.order_id, p.amount, p.currency, p.provider_payment_id,"
    "    p.status, p.reason, p.updated_at, lk.old_status, $8::jsonb AS evidence,"
    "    CASE WHEN p.status = lk.old_status THEN NULL"
    "         WHEN p.capture_method = 'manual' THEN $23::text ELSE $12::text END"
    "    AS event_type),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, evidence, created_at)"
    "  SELECT id, old_status, status, $13, $4, reason, evidence, updated_at FROM u"
    "  WHERE status <> old_status),"
    SQL_LEDGER_CHARGE("u") ","
    SQL_OUTBOX_EVENTS("u") ","
    " pc AS ("
    SQL_PROVIDER_CALLS("$14", "$15", "$16", "$17", "$18", "$19", "$20", "$21", "$22",
                       "$4", "") ")"
    /* Settled, or busy: the row is what the settlement expects, but another
     * session holds it locked (nothing was written; nothing waited). */
    "SELECT (SELECT count(*) FROM u),"
    "  NOT EXISTS (SELECT 1 FROM lk) AND EXISTS (SELECT 1 FROM payment_attempts"
    "    WHERE id = $1::uuid AND status = $2"
    "    AND CASE WHEN $3::bigint IS NULL THEN lease_owner IS NULL"
    "             ELSE lease_owner = $4 AND lease_epoch = $3::bigint END)";
/* clang-format on */

/* A row of SQL_CLAIM_DUE. */
static void read_due(const PGresult *r, int row, struct attempt_due *d)
{
    CHARGED_ASSERT(r && d && row >= 0);
    memset(d, 0, sizeof(*d));
    stmt_col_copy(r, row, 0, d->id, sizeof(d->id));
    d->lease_epoch = stmt_col_int(r, row, 1);
    d->status = (enum attempt_status)attempt_status_parse(PQgetvalue(r, row, 2));
    stmt_col_copy(r, row, 3, d->provider_payment_id, sizeof(d->provider_payment_id));
    d->key_age_ms = stmt_col_int(r, row, 4);
    d->age_ms = stmt_col_int(r, row, 5);
    d->checks = (int)stmt_col_int(r, row, 6);
    col_params(r, row, 7, &d->params);
    d->first_sent_ms = stmt_col_int(r, row, 14);
    d->void_holds = stmt_col_true(r, row, 15);
    /* Claimed by SQL_CLAIM_DUE: under a lease, in a status a look settles. */
    CHARGED_ASSERT(d->lease_epoch > 0);
}

enum charged_rc attempt_store_claim_due(attempt_store_t *st, struct attempt_due *out,
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
    stmt_text(&s, st->capture_method);
    stmt_int_or_null(&s, st->lapse_ms > 0 ? st->lapse_ms : -1);
    if ((rc = stmt_run(st->db, &s, SQL_CLAIM_DUE, &r, err)) == CHARGED_OK)
        for (int i = 0; i < PQntuples(r) && *n < max; i++)
            read_due(r, i, &out[(*n)++]);
    CHARGED_ASSERT(*n <= max);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

static enum charged_rc settle_one(attempt_store_t *st, struct attempt_settlement *it,
                                  struct charged_error *err)
{
    CHARGED_ASSERT(st && it && it->attempt_id);
    CHARGED_ASSERT(it->calls || it->ncalls == 0);
    struct stmt s = {0};
    PGresult *r = NULL;
    enum charged_rc rc;
    int ncharges = 0;

    if (it->status != it->expected &&
        !attempt_status_transition_allowed((int)it->expected, it->status)) {
        charged_error_set(err, "status %s may not follow %s",
                          attempt_status_name(it->status),
                          attempt_status_name(it->expected));
        return CHARGED_BAD_ITEM;
    }
    for (size_t i = 0; i < it->ncalls; i++)
        if (!it->calls[i].operation || !strcmp(it->calls[i].operation, "charge"))
            ncharges++;
    stmt_text(&s, it->attempt_id);
    stmt_text(&s, attempt_status_name(it->expected));
    stmt_int_or_null(&s, it->lease_epoch);
    stmt_text(&s, it->actor ? it->actor : st->actor);
    stmt_text(&s, attempt_status_name(it->status));
    stmt_text(&s, it->reason);
    stmt_text(&s, or_null(it->provider_payment_id));
    stmt_text(&s, it->evidence_json ? it->evidence_json : "{}");
    stmt_int(&s, ncharges);
    /* A reconciler's look counts, but one the provider throttled: no look. */
    stmt_text(&s, it->cause && !strcmp(it->cause, "reconciler") && !it->throttled
                      ? "1"
                      : "0");
    stmt_int_or_null(&s, it->next_check_ms);
    stmt_text(&s, attempt_status_event_type(it->status));
    stmt_text(&s, it->cause ? it->cause : "reconciler");
    add_calls(&s, stmt_arrays(&s, 9), it->calls, it->ncalls);
    /* An authorization's own outcomes are authorization.*. */
    stmt_text(&s, it->event_type ? it->event_type
                                 : attempt_status_authorization_event_type(it->status));
    if ((rc = stmt_run(st->db, &s, SQL_SETTLE, &r, err)) == CHARGED_OK) {
        it->settled = stmt_col_int(r, 0, 0) == 1;
        it->busy = stmt_col_true(r, 0, 1);
    }
    PQclear(r);
    stmt_release(&s);
    return rc;
}

enum charged_rc attempt_store_settle(attempt_store_t *st,
                                     struct attempt_settlement *items, size_t n,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(items || n == 0);
    enum charged_rc rc;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++) {
        items[i].settled = items[i].busy = 0;
        if ((rc = settle_one(st, &items[i], err)) != CHARGED_OK)
            return rc;
    }
    return CHARGED_OK;
}

/* clang-format off */
static const char *SQL_BACKLOG =
    "SELECT status, count(*),"
    "  (extract(epoch FROM now() - min(created_at)) * 1000)::bigint"
    " FROM payment_attempts WHERE status = ANY($1::text[]) GROUP BY status";
/* clang-format on */

enum charged_rc attempt_store_backlog(attempt_store_t *st,
                                      const enum attempt_status *statuses, size_t n,
                                      long long *counts, long long *oldest_ms,
                                      struct charged_error *err)
{
    CHARGED_ASSERT(st && statuses && counts && oldest_ms);
    return stmt_backlog(st->db, SQL_BACKLOG, statuses, n, counts, oldest_ms, err);
}

/* ---- leases ---- */

/* clang-format off */
static const char *SQL_RENEW = SQL_LEASE_RENEW("payment_attempts");
static const char *SQL_RELEASE = SQL_LEASE_END("payment_attempts", "lease_expires_at = now()");
static const char *SQL_HAND_BACK =
    SQL_LEASE_END("payment_attempts", "lease_owner = NULL, lease_expires_at = NULL");
/* clang-format on */

enum charged_rc attempt_store_renew(attempt_store_t *st, const char *const *attempt_ids,
                                    const int64_t *epochs, size_t n, long long lease_ms,
                                    int *still_ours, struct charged_error *err)
{
    CHARGED_ASSERT(st);
    CHARGED_ASSERT(n == 0 || (attempt_ids && epochs && still_ours));
    PGresult *r;
    enum charged_rc rc;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if ((rc = stmt_lease(st->db, st->actor, SQL_RENEW, attempt_ids, epochs, n,
                         &lease_ms, &r, err)) != CHARGED_OK)
        return rc;
    str_index_t *rows = stmt_index_rows(r, 0);
    for (size_t i = 0; i < n; i++)
        still_ours[i] = stmt_row_in(rows, r, 0, attempt_ids[i]) >= 0;
    str_index_free(rows);
    PQclear(r);
    return CHARGED_OK;
}

/* Ends leases of ours by `sql` (release or hand back); the result is not
 * needed: a lease no longer ours is simply not touched. */
static enum charged_rc lease_end(attempt_store_t *st, const char *sql,
                                 const char *const *attempt_ids, const int64_t *epochs,
                                 size_t n, struct charged_error *err)
{
    CHARGED_ASSERT(st && sql);
    CHARGED_ASSERT(n == 0 || (attempt_ids && epochs));
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    return stmt_lease(st->db, st->actor, sql, attempt_ids, epochs, n, NULL, NULL, err);
}

enum charged_rc attempt_store_hand_back(attempt_store_t *st,
                                        const char *const *attempt_ids,
                                        const int64_t *epochs, size_t n,
                                        struct charged_error *err)
{
    return lease_end(st, SQL_HAND_BACK, attempt_ids, epochs, n, err);
}

enum charged_rc attempt_store_release(attempt_store_t *st,
                                      const char *const *attempt_ids,
                                      const int64_t *epochs, size_t n,
                                      struct charged_error *err)
{
    return lease_end(st, SQL_RELEASE, attempt_ids, epochs, n, err);
}
