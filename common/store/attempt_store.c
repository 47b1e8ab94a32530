#include "attempt_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "db.h"
#include "log.h"
#include "store_conn.h"

struct attempt_store {
    store_conn_t *db;
    char *actor;
};

/* Rows are skipped when locked, but an insert's unique index (and a
 * foreign-key check) waits for another session's uncommitted change to a
 * conflicting row: let that cost one item 100 ms, never the loop its 10 s
 * statement_timeout. Our own statements hold their locks for milliseconds. */
#define ATTEMPT_LOCK_TIMEOUT "100ms"

attempt_store_t *attempt_store_new(const char *database_url, const char *actor,
                                   struct store_error *err)
{
    attempt_store_t *st = calloc(1, sizeof(*st));
    if (!st || !(st->actor = strdup(actor))) {
        free(st);
        store_error_set(err, "out of memory");
        return NULL;
    }
    /* Only the syntax is checked now; the server may come up later. */
    if (!(st->db = store_conn_new(database_url, ATTEMPT_LOCK_TIMEOUT, err))) {
        attempt_store_free(st);
        return NULL;
    }
    return st;
}

void attempt_store_free(attempt_store_t *st)
{
    if (!st)
        return;
    store_conn_free(st->db);
    free(st->actor);
    free(st);
}

enum store_rc attempt_store_ping(attempt_store_t *st, struct store_error *err)
{
    store_error_clear(err);
    if (store_conn_open(st->db, NULL, err) != STORE_OK ||
        store_conn_exec(st->db, "SELECT 1", 0, NULL, NULL, err) != STORE_OK)
        return STORE_RETRY;
    return STORE_OK;
}

/* A set of array parameters built together. */
struct arrays {
    db_array_t *a[16];
    int n;
};

static int arrays_init(struct arrays *ar, int n)
{
    ar->n = n;
    for (int i = 0; i < n; i++)
        if (!(ar->a[i] = db_array_new()))
            return -1;
    return 0;
}

static void arrays_release(struct arrays *ar)
{
    for (int i = 0; i < ar->n; i++)
        db_array_free(ar->a[i]);
}

/* ---- record ---- */

/* Rows go in in the order of the arrays (ordinality): the first of two
 * messages for one attempt in a batch is the one stored. */
/* clang-format off */
static const char *SQL_INSERT_PENDING =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::bigint[], $6::text[], $7::text[], $8::text[], $9::jsonb[])"
    "  WITH ORDINALITY AS v(id, order_id, idempotency_key, fp, amount, currency,"
    "       payment_method, customer_id, metadata, n)),"
    " ins AS ("
    "  INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,"
    "    amount, currency, payment_method, customer_id, metadata, status)"
    "  SELECT id, order_id, idempotency_key, fp, amount, currency, payment_method,"
    "    nullif(customer_id, ''), metadata, " ATTEMPT_SQL(PENDING) " FROM v ORDER BY n"
    "  ON CONFLICT DO NOTHING RETURNING id),"
    " tr AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason)"
    "  SELECT id, NULL, " ATTEMPT_SQL(PENDING) ", 'worker', $10, 'recorded' FROM ins)"
    "SELECT id FROM ins";
/* clang-format on */

/* The stored rows every message of the batch is compared with, whether this
 * batch inserted them or not. */
/* clang-format off */
static const char *SQL_FIND_EXISTING =
    "SELECT id, idempotency_key, request_fingerprint FROM payment_attempts"
    " WHERE id = ANY($1::uuid[]) OR idempotency_key = ANY($2::text[])";
/* clang-format on */

/* clang-format off */
static const char *SQL_FIND_LIVE =
    "SELECT order_id, id, status FROM payment_attempts"
    " WHERE order_id = ANY($1::uuid[]) AND status = ANY($2::text[])";
/* clang-format on */

/* clang-format off */
static const char *SQL_INSERT_REJECTED =
    "WITH v AS ("
    "  SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::text[], $4::text[],"
    "    $5::bigint[], $6::text[], $7::text[], $8::text[], $9::jsonb[], $10::text[])"
    "  WITH ORDINALITY AS v(id, order_id, idempotency_key, fp, amount, currency,"
    "       payment_method, customer_id, metadata, reason, n)),"
    " ins AS ("
    "  INSERT INTO payment_attempts (id, order_id, idempotency_key, request_fingerprint,"
    "    amount, currency, payment_method, customer_id, metadata, status, reason)"
    "  SELECT id, order_id, idempotency_key, fp, amount, currency, payment_method,"
    "    nullif(customer_id, ''), metadata, " ATTEMPT_SQL(REJECTED) ", reason FROM v"
    "  ORDER BY n ON CONFLICT DO NOTHING"
    "  RETURNING id, order_id, amount, currency, provider_payment_id, status, reason,"
    "    updated_at, $12::text AS event_type),"
    " tr AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason)"
    "  SELECT id, NULL, status, 'worker', $11, reason FROM ins),"
    SQL_OUTBOX_EVENTS("ins")
    "SELECT id FROM ins";
/* clang-format on */

/* Fills the nine command columns for item i. */
static int add_command(struct arrays *ar, const struct charge_command *c)
{
    return db_array_add(ar->a[0], c->payment_attempt_id) ||
           db_array_add(ar->a[1], c->order_id) ||
           db_array_add(ar->a[2], c->idempotency_key) ||
           db_array_add(ar->a[3], c->fingerprint) ||
           db_array_add_int(ar->a[4], c->amount) ||
           db_array_add(ar->a[5], c->currency) ||
           db_array_add(ar->a[6], c->payment_method) ||
           db_array_add(ar->a[7], c->customer_id) ||
           db_array_add(ar->a[8], c->metadata_json ? c->metadata_json : "{}");
}

static int in_result(PGresult *r, int col, const char *value)
{
    for (int i = 0; i < PQntuples(r); i++)
        if (!strcmp(PQgetvalue(r, i, col), value))
            return 1;
    return 0;
}

/* Attempt-id order, and batch order among messages of one attempt. */
static int by_attempt_id(const void *a, const void *b)
{
    const struct attempt_record_item *x = *(const struct attempt_record_item *const *)a,
                                     *y = *(const struct attempt_record_item *const *)b;
    int c = strcmp(x->cmd->payment_attempt_id, y->cmd->payment_attempt_id);
    return c ? c : (x < y ? -1 : x > y);
}

enum store_rc attempt_store_record(attempt_store_t *st,
                                   struct attempt_record_item *items, size_t n,
                                   struct store_error *err)
{
    struct arrays ar = {0}, rj = {0};
    PGresult *ins = NULL, *found = NULL, *live = NULL, *rej = NULL;
    db_array_t *orders = NULL;
    struct attempt_record_item **sorted = NULL;
    const char *p[13];
    size_t nblocked = 0;
    enum store_rc rc = STORE_RETRY;

    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        return STORE_RETRY;
    if (arrays_init(&ar, 9) != 0 || arrays_init(&rj, 10) != 0 ||
        !(orders = db_array_new()) || !(sorted = calloc(n, sizeof(*sorted))))
        goto oom;
    for (size_t i = 0; i < n; i++)
        sorted[i] = &items[i];
    qsort(sorted, n, sizeof(*sorted), by_attempt_id);
    for (size_t i = 0; i < n; i++)
        if (add_command(&ar, sorted[i]->cmd) != 0)
            goto oom;
    for (int i = 0; i < 9; i++)
        p[i] = db_array_text(ar.a[i]);
    p[9] = st->actor;
    if ((rc = store_conn_exec(st->db, SQL_INSERT_PENDING, 10, p, &ins, err)) !=
        STORE_OK) {
        goto out;
    }
    /* Every message is compared with the stored attempt, whatever batch
     * stored it: a conflicting resend in the same batch as its original is
     * a conflict like any other. */
    p[1] = p[2];
    if ((rc = store_conn_exec(st->db, SQL_FIND_EXISTING, 2, p, &found, err)) !=
        STORE_OK) {
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct charge_command *c = items[i].cmd;
        items[i].result = ATTEMPT_RECORDED;
        items[i].reason[0] = '\0';
        int by_id = 0, by_key = 0;
        for (int r = 0; r < PQntuples(found); r++) {
            const char *id = PQgetvalue(found, r, 0), *key = PQgetvalue(found, r, 1),
                       *fp = PQgetvalue(found, r, 2);
            if (!strcmp(id, c->payment_attempt_id)) {
                by_id = 1;
                if (strcmp(key, c->idempotency_key) != 0) {
                    items[i].result = ATTEMPT_CONFLICT;
                    snprintf(items[i].reason, sizeof(items[i].reason),
                             "attempt %s is already recorded under another idempotency "
                             "key",
                             id);
                } else if (strcmp(fp, c->fingerprint) != 0) {
                    items[i].result = ATTEMPT_CONFLICT;
                    snprintf(
                        items[i].reason, sizeof(items[i].reason),
                        "idempotency key reused with other parameters than attempt "
                        "%s",
                        id);
                }
            } else if (!strcmp(key, c->idempotency_key)) {
                by_key = 1;
                items[i].result = ATTEMPT_CONFLICT;
                snprintf(items[i].reason, sizeof(items[i].reason),
                         "idempotency key already belongs to attempt %s", id);
            }
        }
        if (!by_id && !by_key) {
            /* Only the one-live-attempt-per-order index refused it. */
            items[i].result = ATTEMPT_REJECTED;
            if (db_array_add(orders, c->order_id) != 0)
                goto oom;
            nblocked++;
        }
    }
    if (nblocked == 0) {
        rc = STORE_OK;
        goto out;
    }
    p[0] = db_array_text(orders);
    p[1] = attempt_status_live_array();
    if ((rc = store_conn_exec(st->db, SQL_FIND_LIVE, 2, p, &live, err)) != STORE_OK) {
        goto out;
    }
    size_t nrej = 0;
    for (size_t i = 0; i < n; i++) {
        const struct charge_command *c = items[i].cmd;
        int row = -1;
        if (items[i].result != ATTEMPT_REJECTED)
            continue;
        for (int r = 0; r < PQntuples(live); r++)
            if (!strcmp(PQgetvalue(live, r, 0), c->order_id) &&
                strcmp(PQgetvalue(live, r, 1), c->payment_attempt_id) != 0)
                row = r;
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
        if (add_command(&rj, c) != 0 || db_array_add(rj.a[9], items[i].reason) != 0)
            goto oom;
        nrej++;
    }
    if (nrej > 0) {
        for (int i = 0; i < 10; i++)
            p[i] = db_array_text(rj.a[i]);
        p[10] = st->actor;
        p[11] = attempt_status_event_type(ATTEMPT_STATUS_REJECTED);
        if ((rc = store_conn_exec(st->db, SQL_INSERT_REJECTED, 12, p, &rej, err)) !=
            STORE_OK) {
            goto out;
        }
        /* Only the first message of an attempt in this batch is the one
         * stored REJECTED; any other (a copy, or a conflicting resend) is
         * recorded again, and then compared with the stored row like any
         * message. So is one whose row a concurrent duplicate wrote. */
        for (size_t i = 0; i < n; i++) {
            if (items[i].result != ATTEMPT_REJECTED)
                continue;
            int first = in_result(rej, 0, items[i].cmd->payment_attempt_id);
            for (size_t k = 0; first && k < i; k++)
                if (items[k].result != ATTEMPT_RETRY &&
                    !strcmp(items[k].cmd->payment_attempt_id,
                            items[i].cmd->payment_attempt_id))
                    first = 0;
            if (!first)
                items[i].result = ATTEMPT_RETRY;
        }
    }
    rc = STORE_OK;
    goto out;
oom:
    rc = STORE_RETRY;
    store_error_set(err, "out of memory");
out:
    free(sorted);
    PQclear(ins);
    PQclear(found);
    PQclear(live);
    PQclear(rej);
    db_array_free(orders);
    arrays_release(&ar);
    arrays_release(&rj);
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
    "  SELECT p.id, p.status FROM payment_attempts p JOIN q ON p.id = q.id"
    "  WHERE p.status = " ATTEMPT_SQL(PENDING)
    "     OR (p.status = " ATTEMPT_SQL(PROCESSING) " AND p.next_check_at IS NULL"
    "         AND p.lease_owner IS NOT NULL"
    "         AND p.lease_expires_at < now())"
    "  ORDER BY p.id FOR NO KEY UPDATE OF p SKIP LOCKED),"
    " u AS ("
    "  UPDATE payment_attempts p SET status = " ATTEMPT_SQL(PROCESSING) ", lease_owner = $2,"
    "    lease_expires_at = now() + make_interval(secs => $3::double precision / 1000),"
    "    lease_epoch = p.lease_epoch + 1,"
    "    first_sent_at = coalesce(p.first_sent_at, now()),"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM c WHERE p.id = c.id"
    "  RETURNING p.id, c.status AS old_status, p.lease_epoch, p.attempt_count, p.updated_at,"
    "    (extract(epoch FROM now() - p.first_sent_at) * 1000)::bigint AS key_age_ms,"
    "    p.idempotency_key, p.order_id, p.amount, p.currency, p.payment_method,"
    "    coalesce(p.customer_id, '') AS customer_id),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, created_at)"
    "  SELECT id, old_status, " ATTEMPT_SQL(PROCESSING) ", 'worker', $2,"
    "    CASE WHEN old_status = " ATTEMPT_SQL(PENDING) " THEN 'claimed'"
    "         ELSE 'lease expired; taken over' END, updated_at FROM u)"
    "SELECT a.id, a.status, a.lease_owner IS NOT NULL, u.lease_epoch, u.attempt_count,"
    "  u.key_age_ms, u.idempotency_key, u.order_id, u.amount, u.currency,"
    "  u.payment_method, u.customer_id"
    " FROM payment_attempts a JOIN q ON a.id = q.id LEFT JOIN u ON u.id = a.id";
/* clang-format on */

enum store_rc attempt_store_claim(attempt_store_t *st, struct attempt_claim_item *items,
                                  size_t n, long long lease_ms, struct store_error *err)
{
    db_array_t *ids = NULL;
    char lease[32];
    const char *p[3];
    PGresult *r = NULL;
    enum store_rc rc;

    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        return STORE_RETRY;
    rc = STORE_RETRY;
    if (!(ids = db_array_new()))
        goto oom;
    for (size_t i = 0; i < n; i++)
        if (db_array_add(ids, items[i].attempt_id) != 0)
            goto oom;
    snprintf(lease, sizeof(lease), "%lld", lease_ms);
    p[0] = db_array_text(ids);
    p[1] = st->actor;
    p[2] = lease;
    if ((rc = store_conn_exec(st->db, SQL_CLAIM, 3, p, &r, err)) != STORE_OK) {
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        struct attempt_claim_item *it = &items[i];
        int row = -1;
        it->result = ATTEMPT_BUSY;
        it->status[0] = '\0';
        for (int k = 0; k < PQntuples(r); k++)
            if (!strcmp(PQgetvalue(r, k, 0), it->attempt_id))
                row = k;
        if (row < 0)
            continue;
        snprintf(it->status, sizeof(it->status), "%s", PQgetvalue(r, row, 1));
        int leased = PQgetvalue(r, row, 2)[0] == 't';
        if (!PQgetisnull(r, row, 3)) {
            /* Claimed by this statement. Two items of one attempt in a batch:
             * only the first takes it; the other waits like any peer. */
            int dup = 0;
            for (size_t j = 0; j < i; j++)
                if (items[j].result == ATTEMPT_CLAIMED &&
                    !strcmp(items[j].attempt_id, it->attempt_id))
                    dup = 1;
            if (dup)
                continue;
            struct attempt_params *pa = &it->params;
            it->result = ATTEMPT_CLAIMED;
            it->lease_epoch = strtoll(PQgetvalue(r, row, 3), NULL, 10);
            it->attempt_count = atoi(PQgetvalue(r, row, 4));
            it->key_age_ms = strtoll(PQgetvalue(r, row, 5), NULL, 10);
            snprintf(pa->idempotency_key, sizeof(pa->idempotency_key), "%s",
                     PQgetvalue(r, row, 6));
            snprintf(pa->order_id, sizeof(pa->order_id), "%s", PQgetvalue(r, row, 7));
            pa->amount = strtoll(PQgetvalue(r, row, 8), NULL, 10);
            snprintf(pa->currency, sizeof(pa->currency), "%s", PQgetvalue(r, row, 9));
            snprintf(pa->payment_method, sizeof(pa->payment_method), "%s",
                     PQgetvalue(r, row, 10));
            snprintf(pa->customer_id, sizeof(pa->customer_id), "%s",
                     PQgetvalue(r, row, 11));
        } else if (strcmp(it->status, ATTEMPT_S_PENDING) != 0 &&
                   (strcmp(it->status, ATTEMPT_S_PROCESSING) != 0 || !leased)) {
            it->result = ATTEMPT_SETTLED;
        }
    }
    rc = STORE_OK;
    goto out;
oom:
    rc = STORE_RETRY;
    store_error_set(err, "out of memory");
out:
    PQclear(r);
    db_array_free(ids);
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

static const char *SQL_LOG_CALLS =
    SQL_PROVIDER_CALLS("$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", "$10", "");
/* clang-format on */

/* Fills nine arrays (from ar->a[first]) with the calls. 0 / -1. */
static int add_calls(struct arrays *ar, int first, const struct attempt_call *calls,
                     size_t n)
{
    db_array_t **a = ar->a + first;
    for (size_t i = 0; i < n; i++) {
        const struct provider_result *r = calls[i].res;
        if (db_array_add(a[0], calls[i].attempt_id) ||
            db_array_add(a[1], calls[i].operation ? calls[i].operation : "charge") ||
            db_array_add_int(a[2], calls[i].started_ms) ||
            db_array_add_int(a[3], r->latency_ms) ||
            db_array_add(a[4], provider_outcome_name(r->outcome)) ||
            db_array_add_int(a[5], r->http_status) ||
            db_array_add(a[6], r->replayed ? "t" : "f") ||
            db_array_add(a[7], r->provider_payment_id) ||
            db_array_add(a[8], r->outcome == PROVIDER_SUCCEEDED ? "" : r->error))
            return -1;
    }
    return 0;
}

enum store_rc attempt_store_log_calls(attempt_store_t *st,
                                      const struct attempt_call *calls, size_t n,
                                      struct store_error *err)
{
    struct arrays ar = {0};
    const char *p[10];
    enum store_rc rc;

    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        return STORE_RETRY;
    rc = STORE_RETRY;
    if (arrays_init(&ar, 9) != 0 || add_calls(&ar, 0, calls, n) != 0)
        goto oom;
    for (int i = 0; i < 9; i++)
        p[i] = db_array_text(ar.a[i]);
    p[9] = st->actor;
    rc = store_conn_exec(st->db, SQL_LOG_CALLS, 10, p, NULL, err);
    goto out;
oom:
    rc = STORE_RETRY;
    store_error_set(err, "out of memory");
out:
    arrays_release(&ar);
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
    " lk AS (SELECT p.id FROM payment_attempts p JOIN v ON p.id = v.id"
    "  ORDER BY p.id FOR NO KEY UPDATE OF p SKIP LOCKED),"
    " u AS ("
    "  UPDATE payment_attempts p SET status = v.status, reason = v.reason,"
    "    provider_payment_id = coalesce(v.ppid, p.provider_payment_id),"
    "    lease_owner = NULL, lease_expires_at = NULL,"
    "    attempt_count = p.attempt_count + v.calls, last_error = v.last_error,"
    "    next_check_at = CASE WHEN v.next_check_ms IS NULL THEN NULL"
    "      ELSE now() + make_interval(secs => v.next_check_ms / 1000.0) END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  FROM v JOIN lk ON lk.id = v.id"
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
    /* Per item: persisted, or busy (another session holds its row: nothing
     * was written, and nothing else waited for it). */
    "SELECT v.id, u.id IS NOT NULL, lk.id IS NULL AND a.id IS NOT NULL"
    " FROM v LEFT JOIN u ON u.id = v.id LEFT JOIN lk ON lk.id = v.id"
    " LEFT JOIN payment_attempts a ON a.id = v.id";
/* clang-format on */

enum store_rc attempt_store_persist(attempt_store_t *st, struct attempt_outcome *items,
                                    size_t n, struct store_error *err)
{
    struct arrays ar = {0};
    const char *p[11];
    PGresult *r = NULL;
    enum store_rc rc;

    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        return STORE_RETRY;
    rc = STORE_RETRY;
    if (arrays_init(&ar, 10) != 0)
        goto oom;
    for (size_t i = 0; i < n; i++) {
        struct attempt_outcome *o = &items[i];
        int to = attempt_status_parse(o->status);
        if (to < 0 ||
            !attempt_status_transition_allowed(ATTEMPT_STATUS_PROCESSING, to)) {
            /* A bug of ours; the caller isolates it like a refused value. */
            store_error_set(err, "status '%s' may not follow PROCESSING",
                            o->status ? o->status : "(null)");
            rc = STORE_DATA;
            goto out;
        }
        if (db_array_add(ar.a[0], o->attempt_id) ||
            db_array_add_int(ar.a[1], o->lease_epoch) ||
            db_array_add(ar.a[2], o->status) || db_array_add(ar.a[3], o->reason) ||
            db_array_add(ar.a[4], o->provider_payment_id && *o->provider_payment_id
                                      ? o->provider_payment_id
                                      : NULL) ||
            db_array_add(ar.a[5], o->event_type) ||
            db_array_add(ar.a[6], o->evidence_json ? o->evidence_json : "{}") ||
            db_array_add_int(ar.a[7], o->calls) || db_array_add(ar.a[8], o->last_error))
            goto oom;
        if (o->next_check_ms < 0 ? db_array_add(ar.a[9], NULL)
                                 : db_array_add_int(ar.a[9], o->next_check_ms))
            goto oom;
    }
    for (int i = 0; i < 10; i++)
        p[i] = db_array_text(ar.a[i]);
    p[10] = st->actor;
    if ((rc = store_conn_exec(st->db, SQL_PERSIST, 11, p, &r, err)) != STORE_OK) {
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        items[i].persisted = items[i].busy = 0;
        for (int row = 0; row < PQntuples(r); row++)
            if (!strcmp(PQgetvalue(r, row, 0), items[i].attempt_id)) {
                items[i].persisted = PQgetvalue(r, row, 1)[0] == 't';
                items[i].busy = PQgetvalue(r, row, 2)[0] == 't';
            }
    }
    rc = STORE_OK;
    goto out;
oom:
    rc = STORE_RETRY;
    store_error_set(err, "out of memory");
out:
    PQclear(r);
    arrays_release(&ar);
    return rc;
}

/* ---- reconciliation ---- */

/* clang-format off */
static const char *SQL_CLAIM_DUE =
    "WITH c AS ("
    "  SELECT p.id FROM payment_attempts p"
    "  WHERE (p.next_check_at IS NULL OR p.next_check_at <= now())"
    "    AND ((p.status IN (" ATTEMPT_SQL(UNKNOWN) ", " ATTEMPT_SQL(PROCESSING) ")"
    "          AND p.lease_owner IS NULL)"
    "      OR (p.status = " ATTEMPT_SQL(UNKNOWN) " AND p.lease_expires_at < now())"
    "      OR (p.status = " ATTEMPT_SQL(PROCESSING) " AND p.lease_expires_at <"
    "          now() - make_interval(secs => $4::double precision / 1000)))"
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
    "  coalesce(p.customer_id, ''),"
    "  coalesce((extract(epoch FROM p.first_sent_at) * 1000)::bigint, -1)";

/* One settlement: fenced on the claim (or, without a lease, on no lease at
 * all), on the status it must still have. */
static const char *SQL_SETTLE =
    "WITH lk AS ("
    "  SELECT id, status AS old_status FROM payment_attempts"
    "  WHERE id = $1::uuid AND status = $2"
    "    AND CASE WHEN $3::bigint IS NULL THEN lease_owner IS NULL"
    "             ELSE lease_owner = $4 AND lease_epoch = $3::bigint END"
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
    "    CASE WHEN p.status <> lk.old_status THEN $12::text END AS event_type),"
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

enum store_rc attempt_store_claim_due(attempt_store_t *st, struct attempt_due *out,
                                      size_t max, size_t *n, long long lease_ms,
                                      long long stale_ms, struct store_error *err)
{
    char lease[32], limit[32], stale[32];
    const char *p[4] = {st->actor, lease, limit, stale};

    store_error_clear(err);
    *n = 0;
    if (max == 0)
        return STORE_OK;
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        return STORE_RETRY;
    snprintf(lease, sizeof(lease), "%lld", lease_ms);
    snprintf(limit, sizeof(limit), "%zu", max);
    snprintf(stale, sizeof(stale), "%lld", stale_ms);
    PGresult *r;
    enum store_rc rc = store_conn_exec(st->db, SQL_CLAIM_DUE, 4, p, &r, err);
    if (rc != STORE_OK)
        return rc;
    for (int i = 0; i < PQntuples(r) && *n < max; i++) {
        struct attempt_due *d = &out[(*n)++];
        struct attempt_params *pa = &d->params;
        memset(d, 0, sizeof(*d));
        snprintf(d->id, sizeof(d->id), "%s", PQgetvalue(r, i, 0));
        d->lease_epoch = strtoll(PQgetvalue(r, i, 1), NULL, 10);
        d->status = (enum attempt_status)attempt_status_parse(PQgetvalue(r, i, 2));
        snprintf(d->provider_payment_id, sizeof(d->provider_payment_id), "%s",
                 PQgetvalue(r, i, 3));
        d->key_age_ms = strtoll(PQgetvalue(r, i, 4), NULL, 10);
        d->age_ms = strtoll(PQgetvalue(r, i, 5), NULL, 10);
        d->checks = atoi(PQgetvalue(r, i, 6));
        snprintf(pa->idempotency_key, sizeof(pa->idempotency_key), "%s",
                 PQgetvalue(r, i, 7));
        snprintf(pa->order_id, sizeof(pa->order_id), "%s", PQgetvalue(r, i, 8));
        pa->amount = strtoll(PQgetvalue(r, i, 9), NULL, 10);
        snprintf(pa->currency, sizeof(pa->currency), "%s", PQgetvalue(r, i, 10));
        snprintf(pa->payment_method, sizeof(pa->payment_method), "%s",
                 PQgetvalue(r, i, 11));
        snprintf(pa->customer_id, sizeof(pa->customer_id), "%s", PQgetvalue(r, i, 12));
        d->first_sent_ms = strtoll(PQgetvalue(r, i, 13), NULL, 10);
    }
    PQclear(r);
    return STORE_OK;
}

static enum store_rc settle_one(attempt_store_t *st, struct attempt_settlement *it,
                                struct store_error *err)
{
    struct arrays ar = {0};
    char epoch[32], charges[16], next[32];
    const char *p[22];
    enum store_rc rc = STORE_RETRY;
    int ncharges = 0;

    if (it->status != it->expected &&
        !attempt_status_transition_allowed((int)it->expected, it->status)) {
        store_error_set(err, "status %s may not follow %s",
                        attempt_status_name(it->status),
                        attempt_status_name(it->expected));
        return STORE_DATA;
    }
    if (arrays_init(&ar, 9) != 0 || add_calls(&ar, 0, it->calls, it->ncalls) != 0)
        goto oom;
    for (size_t i = 0; i < it->ncalls; i++)
        if (!it->calls[i].operation || !strcmp(it->calls[i].operation, "charge"))
            ncharges++;
    snprintf(epoch, sizeof(epoch), "%lld", (long long)it->lease_epoch);
    snprintf(charges, sizeof(charges), "%d", ncharges);
    snprintf(next, sizeof(next), "%lld", it->next_check_ms);
    p[0] = it->attempt_id;
    p[1] = attempt_status_name(it->expected);
    p[2] = it->lease_epoch < 0 ? NULL : epoch;
    p[3] = it->actor ? it->actor : st->actor;
    p[4] = attempt_status_name(it->status);
    p[5] = it->reason;
    p[6] = it->provider_payment_id && *it->provider_payment_id ? it->provider_payment_id
                                                               : NULL;
    p[7] = it->evidence_json ? it->evidence_json : "{}";
    p[8] = charges;
    p[9] = it->cause && !strcmp(it->cause, "reconciler") ? "1" : "0";
    p[10] = it->next_check_ms < 0 ? NULL : next;
    p[11] = attempt_status_event_type(it->status);
    p[12] = it->cause ? it->cause : "reconciler";
    for (int i = 0; i < 9; i++)
        p[13 + i] = db_array_text(ar.a[i]);
    PGresult *r;
    if ((rc = store_conn_exec(st->db, SQL_SETTLE, 22, p, &r, err)) != STORE_OK)
        goto out;
    it->settled = strcmp(PQgetvalue(r, 0, 0), "1") == 0;
    it->busy = PQgetvalue(r, 0, 1)[0] == 't';
    PQclear(r);
    rc = STORE_OK;
    goto out;
oom:
    rc = STORE_RETRY;
    store_error_set(err, "out of memory");
out:
    arrays_release(&ar);
    return rc;
}

/* clang-format off */
static const char *SQL_BACKLOG =
    "SELECT status, count(*),"
    "  (extract(epoch FROM now() - min(created_at)) * 1000)::bigint"
    " FROM payment_attempts WHERE status = ANY($1::text[]) GROUP BY status";
/* clang-format on */

enum store_rc attempt_store_backlog(attempt_store_t *st,
                                    const enum attempt_status *statuses, size_t n,
                                    long long *counts, long long *oldest_ms,
                                    struct store_error *err)
{
    db_array_t *names = db_array_new();
    PGresult *r = NULL;
    enum store_rc rc = STORE_RETRY;

    store_error_clear(err);
    for (size_t i = 0; i < n; i++)
        counts[i] = oldest_ms[i] = 0;
    if (!names) {
        store_error_set(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        if (db_array_add(names, attempt_status_name(statuses[i])) != 0) {
            store_error_set(err, "out of memory");
            goto out;
        }
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        goto out;
    const char *p[1] = {db_array_text(names)};
    if ((rc = store_conn_exec(st->db, SQL_BACKLOG, 1, p, &r, err)) != STORE_OK) {
        goto out;
    }
    for (int row = 0; row < PQntuples(r); row++)
        for (size_t i = 0; i < n; i++)
            if (!strcmp(PQgetvalue(r, row, 0), attempt_status_name(statuses[i]))) {
                counts[i] = atoll(PQgetvalue(r, row, 1));
                oldest_ms[i] = atoll(PQgetvalue(r, row, 2));
            }
    rc = STORE_OK;
out:
    PQclear(r);
    db_array_free(names);
    return rc;
}

enum store_rc attempt_store_settle(attempt_store_t *st,
                                   struct attempt_settlement *items, size_t n,
                                   struct store_error *err)
{
    enum store_rc rc;
    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        return STORE_RETRY;
    for (size_t i = 0; i < n; i++) {
        items[i].settled = items[i].busy = 0;
        if ((rc = settle_one(st, &items[i], err)) != STORE_OK)
            return rc;
    }
    return STORE_OK;
}

/* ---- leases ---- */

/* clang-format off */
/* The rows of `v` no other session holds: a lease is let go without waiting
 * on a peer's lock (a session hung in a transaction would hold us with it);
 * one held elsewhere simply expires. */
#define SQL_LEASES_UNLOCKED \
    " lk AS (SELECT p.id FROM payment_attempts p JOIN v ON p.id = v.id" \
    "  ORDER BY p.id FOR NO KEY UPDATE OF p SKIP LOCKED)"

static const char *SQL_RENEW =
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[]) AS v(id, epoch)),"
    " lk AS (SELECT p.id FROM payment_attempts p JOIN v ON p.id = v.id"
    "  ORDER BY p.id FOR NO KEY UPDATE OF p SKIP LOCKED),"
    " u AS (UPDATE payment_attempts p"
    "  SET lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)"
    "  FROM v JOIN lk ON lk.id = v.id"
    "  WHERE p.id = v.id AND p.lease_epoch = v.epoch AND p.lease_owner = $4"
    "  RETURNING p.id)"
    "SELECT id FROM u"
    /* A row another session holds is not extended now, and nothing waits
     * for it: still ours if its last committed lease is. */
    " UNION ALL SELECT p.id FROM payment_attempts p JOIN v ON p.id = v.id"
    " WHERE p.id NOT IN (SELECT id FROM lk) AND p.lease_epoch = v.epoch"
    "   AND p.lease_owner = $4";
/* clang-format on */

/* clang-format off */
static const char *SQL_RELEASE =
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[]) AS v(id, epoch)),"
    SQL_LEASES_UNLOCKED
    "UPDATE payment_attempts p SET lease_expires_at = now()"
    " FROM v JOIN lk ON lk.id = v.id"
    " WHERE p.id = v.id AND p.lease_epoch = v.epoch AND p.lease_owner = $3"
    " RETURNING p.id";
/* clang-format on */

/* clang-format off */
static const char *SQL_HAND_BACK =
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[]) AS v(id, epoch)),"
    SQL_LEASES_UNLOCKED
    "UPDATE payment_attempts p SET lease_owner = NULL, lease_expires_at = NULL"
    " FROM v JOIN lk ON lk.id = v.id"
    " WHERE p.id = v.id AND p.lease_epoch = v.epoch AND p.lease_owner = $3"
    " RETURNING p.id";
/* clang-format on */

static PGresult *lease_update(attempt_store_t *st, const char *sql,
                              const char *const *attempt_ids, const int64_t *epochs,
                              size_t n, const char *lease_ms, enum store_rc *rc,
                              struct store_error *err)
{
    db_array_t *ids = db_array_new(), *eps = db_array_new();
    PGresult *r = NULL;
    const char *p[4];

    *rc = STORE_RETRY;
    if (!ids || !eps) {
        store_error_set(err, "out of memory");
        goto out;
    }
    if (store_conn_open(st->db, NULL, err) != STORE_OK)
        goto out;
    for (size_t i = 0; i < n; i++) {
        if (db_array_add(ids, attempt_ids[i]) || db_array_add_int(eps, epochs[i])) {
            store_error_set(err, "out of memory");
            goto out;
        }
    }
    p[0] = db_array_text(ids);
    p[1] = db_array_text(eps);
    if (lease_ms) {
        p[2] = lease_ms;
        p[3] = st->actor;
        *rc = store_conn_exec(st->db, sql, 4, p, &r, err);
    } else {
        p[2] = st->actor;
        *rc = store_conn_exec(st->db, sql, 3, p, &r, err);
    }
out:
    db_array_free(ids);
    db_array_free(eps);
    return r;
}

enum store_rc attempt_store_renew(attempt_store_t *st, const char *const *attempt_ids,
                                  const int64_t *epochs, size_t n, long long lease_ms,
                                  int *still_ours, struct store_error *err)
{
    char lease[32];
    enum store_rc rc;
    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    snprintf(lease, sizeof(lease), "%lld", lease_ms);
    PGresult *r = lease_update(st, SQL_RENEW, attempt_ids, epochs, n, lease, &rc, err);
    if (!r)
        return rc;
    for (size_t i = 0; i < n; i++)
        still_ours[i] = in_result(r, 0, attempt_ids[i]);
    PQclear(r);
    return STORE_OK;
}

/* Ends leases of ours by `sql` (release or hand back); the result is not
 * needed: a lease no longer ours is simply not touched. */
static enum store_rc lease_end(attempt_store_t *st, const char *sql,
                               const char *const *attempt_ids, const int64_t *epochs,
                               size_t n, struct store_error *err)
{
    enum store_rc rc;
    store_error_clear(err);
    if (n == 0)
        return STORE_OK;
    PGresult *r = lease_update(st, sql, attempt_ids, epochs, n, NULL, &rc, err);
    if (!r)
        return rc;
    PQclear(r);
    return STORE_OK;
}

enum store_rc attempt_store_hand_back(attempt_store_t *st,
                                      const char *const *attempt_ids,
                                      const int64_t *epochs, size_t n,
                                      struct store_error *err)
{
    return lease_end(st, SQL_HAND_BACK, attempt_ids, epochs, n, err);
}

enum store_rc attempt_store_release(attempt_store_t *st, const char *const *attempt_ids,
                                    const int64_t *epochs, size_t n,
                                    struct store_error *err)
{
    return lease_end(st, SQL_RELEASE, attempt_ids, epochs, n, err);
}
