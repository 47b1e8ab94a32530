#include "audit_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "store_conn.h"
#include "store_stmt.h"

/* The auditor's advisory lock: one leader of the scheduled windows. */
#define AUDIT_LOCK_KEY "7216493035014220802"

/* The auditor reads what others write and writes only its own tables: a
 * lock another session holds there (an operator's) is waited for briefly. */
#define AUDIT_LOCK_TIMEOUT "5s"

struct audit_store {
    store_conn_t *db;
    int leading;
};

audit_store_t *audit_store_new(const char *database_url, struct charged_error *err)
{
    audit_store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    if (!(st->db = store_conn_new(database_url, AUDIT_LOCK_TIMEOUT, err))) {
        free(st);
        return NULL;
    }
    return st;
}

void audit_store_free(audit_store_t *st)
{
    if (!st)
        return;
    store_conn_free(st->db);
    free(st);
}

static enum charged_rc session(audit_store_t *st, struct charged_error *err)
{
    int fresh = 0;
    enum charged_rc rc = store_conn_open(st->db, &fresh, err);
    /* A new session holds no lock: the lead was lost with the old one. */
    if (rc != CHARGED_OK || fresh)
        st->leading = 0;
    return rc;
}

static enum charged_rc run(audit_store_t *st, struct stmt *s, const char *sql,
                           PGresult **res, struct charged_error *err)
{
    enum charged_rc rc;
    charged_error_clear(err);
    if ((rc = session(st, err)) == CHARGED_OK)
        rc = stmt_run(st->db, s, sql, res, err);
    stmt_release(s);
    return rc;
}

enum charged_rc audit_store_lead(audit_store_t *st, struct charged_error *err)
{
    PGresult *r;
    struct stmt s = {0};
    enum charged_rc rc;
    charged_error_clear(err);
    if ((rc = session(st, err)) != CHARGED_OK)
        return rc;
    if (st->leading)
        return CHARGED_OK;
    /* The lead is a session lock: only where the session is ours alone. */
    stmt_int(&s, store_conn_pid(st->db));
    if ((rc = run(st, &s, SQL_LEAD(AUDIT_LOCK_KEY), &r, err)) != CHARGED_OK)
        return rc;
    if (PQgetisnull(r, 0, 0)) {
        PQclear(r);
        charged_error_set(err, LEAD_POOLED("auditor"));
        return CHARGED_RETRY;
    }
    st->leading = stmt_col_true(r, 0, 0);
    PQclear(r);
    return st->leading ? CHARGED_OK : CHARGED_NOT_LEADER;
}

/* clang-format off */
#define UUID_RE "'^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'"
/* Metadata is the provider's text, anything at all: cast only what is a uuid. */
#define AS_UUID(col) "(CASE WHEN " col " ~ " UUID_RE " THEN " col "::uuid END)"
/* Metadata ids of the copy compared with each other or with the ledger's:
 * a UUID in either case as its lower case, anything else as given, never
 * an error (0015; the twin indexes are on it). */
#define META_ID(col) "audit_meta_id(" col ")"

/* The first scheduled window starts where the audit was told to, or where
 * charged began (the first attempt: nothing of ours is older), or now. */
static const char *SQL_NEXT =
    "SELECT (extract(epoch FROM now()) * 1000)::bigint,"
    "  (SELECT extract(epoch FROM max(window_end))::bigint FROM audit_windows WHERE scheduled),"
    "  CASE WHEN $1::bigint > 0 THEN $1::bigint"
    "   ELSE coalesce((SELECT floor(extract(epoch FROM min(created_at)))::bigint"
    "                    FROM payment_attempts),"
    "                 floor(extract(epoch FROM now()) - $2::bigint / 1000.0)::bigint) END";

/* The provider's word replaces what was copied before. DISTINCT ON: a page
 * that names one object twice must not fail the statement. */
static const char *SQL_COPY_INTENTS =
    "INSERT INTO audit_intents AS t (id, status, amount, currency, created,"
    "  payment_attempt_id, order_id, capture_method, amount_capturable, amount_received,"
    "  cancellation_reason)"
    " SELECT DISTINCT ON (id) * FROM unnest($1::text[], $2::text[], $3::bigint[],"
    "   $4::text[], $5::bigint[], $6::text[], $7::text[], $8::text[], $9::bigint[],"
    "   $10::bigint[], $11::text[])"
    "   AS p(id, status, amount, currency, created, attempt, ord, how, capturable,"
    "        received, cancel)"
    " ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status, amount = EXCLUDED.amount,"
    "  currency = EXCLUDED.currency, created = EXCLUDED.created,"
    "  payment_attempt_id = EXCLUDED.payment_attempt_id, order_id = EXCLUDED.order_id,"
    "  capture_method = EXCLUDED.capture_method,"
    "  amount_capturable = EXCLUDED.amount_capturable,"
    "  amount_received = EXCLUDED.amount_received,"
    "  cancellation_reason = EXCLUDED.cancellation_reason, seen_at = now()";

/* What an intent of the copy took: a manual one's amount_received, else its
 * amount (0019). */
#define TAKEN(t) \
    "(CASE WHEN " t ".capture_method = 'manual' THEN coalesce(" t ".amount_received, 0)" \
    " ELSE " t ".amount END)"

/* For each manual intent of a page, its steps: the attempt that recorded
 * the intent as its own (payment_attempts_provider_payment_id) as `r`;
 * recorded by none, whether the attempt its metadata names is unsettled
 * with no intent recorded yet; then the columns of the operations' rules
 * (struct audit_steps), each over r (SQL_STEP_FACTS_HEAD, the columns,
 * SQL_STEP_FACTS_TAIL). */
#define SQL_STEP_FACTS_BASE 7 /* columns before the operations' */
static const char *SQL_STEP_FACTS_HEAD =
    "SELECT p.i, coalesce(r.id::text, ''), coalesce(r.status, ''), coalesce(r.amount, 0),"
    "  coalesce(r.order_id::text, ''), coalesce(r.currency, ''),"
    "  r.id IS NULL AND a.id IS NOT NULL AND a.provider_payment_id IS NULL"
    "    AND a.status IN ('PENDING', 'PROCESSING', 'UNKNOWN')";
static const char *SQL_STEP_FACTS_TAIL =
    " FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS p(id, attempt, i)"
    " LEFT JOIN LATERAL (SELECT x.* FROM payment_attempts x WHERE x.provider_payment_id = p.id"
    "   ORDER BY x.created_at, x.id LIMIT 1) r ON true"
    " LEFT JOIN payment_attempts a ON a.id = " AS_UUID("p.attempt")
    " ORDER BY p.i";

/* For each intent: the charge booked on it; the attempt its metadata
 * names, and that attempt's booked charge; another SUCCEEDED attempt of
 * its order; another succeeded intent of the same attempt or order in the
 * copy, the oldest; for a booked one, whether an unbooked succeeded intent
 * in the copy names only its order (judged before this one was booked,
 * perhaps before its attempt existed: SQL_ORDER_STRAYS lists them all);
 * whose it is (the attempt's recorded intent, another attempt recording
 * it, metadata naming another attempt or order than the booking's, or
 * than the named attempt's order); an unsettled attempt of its order. Not
 * only an earlier one: the list is newest first, so a twin on a later
 * page of the window is copied after this one is judged, and that twin
 * has only a later one. Metadata ids are compared as ids, in either case
 * (META_ID). Each look-up is one index probe (0015's indexes are on
 * META_ID, in the ORDER BY's order). */
static const char *SQL_INTENT_FACTS =
    "SELECT p.i, l.payment_attempt_id IS NOT NULL, coalesce(l.amount, 0),"
    "  coalesce(l.currency, ''), coalesce(l.payment_attempt_id::text, ''),"
    "  coalesce(a.status, ''),"
    "  coalesce(la.provider_payment_id <> p.id, false), coalesce(la.provider_payment_id, ''),"
    "  o.provider_payment_id IS NOT NULL, coalesce(o.provider_payment_id, ''),"
    "  coalesce(tw.id, two.id) IS NOT NULL, coalesce(tw.id, two.id, ''),"
    "  coalesce(a.provider_payment_id, la.provider_payment_id, ''),"
    "  EXISTS (SELECT 1 FROM payment_attempts r WHERE r.provider_payment_id = p.id"
    "    AND r.id <> coalesce(l.payment_attempt_id, a.id)),"
    "  CASE WHEN l.payment_attempt_id IS NOT NULL"
    "   THEN (m.payment_attempt_id IS NOT NULL"
    "         AND " AS_UUID("m.payment_attempt_id") " IS DISTINCT FROM l.payment_attempt_id)"
    "     OR (m.order_id IS NOT NULL AND " AS_UUID("m.order_id") " IS DISTINCT FROM l.order_id)"
    "   ELSE a.id IS NOT NULL AND m.order_id IS NOT NULL"
    "     AND " AS_UUID("m.order_id") " IS DISTINCT FROM a.order_id END,"
    "  EXISTS (SELECT 1 FROM payment_attempts u WHERE u.order_id = " AS_UUID("m.order_id")
    "    AND u.status IN ('PENDING', 'PROCESSING', 'UNKNOWN', 'REQUIRES_REVIEW')),"
    "  l.payment_attempt_id IS NOT NULL AND EXISTS (SELECT 1 FROM audit_intents t"
    "    WHERE t.status = 'succeeded' AND " META_ID("t.order_id") " = l.order_id::text"
    "      AND t.payment_attempt_id IS NULL AND t.id <> p.id"
    "      AND NOT EXISTS (SELECT 1 FROM ledger_entries x"
    "        WHERE x.kind = 'charge' AND x.provider_payment_id = t.id)),"
    "  coalesce(l.order_id::text, '')"
    " FROM unnest($1::text[]) WITH ORDINALITY AS p(id, i)"
    " JOIN audit_intents m ON m.id = p.id"
    " LEFT JOIN ledger_entries l ON l.kind = 'charge' AND l.provider_payment_id = p.id"
    " LEFT JOIN payment_attempts a ON a.id = " AS_UUID("m.payment_attempt_id")
    " LEFT JOIN ledger_entries la ON la.kind = 'charge' AND la.payment_attempt_id = a.id"
    " LEFT JOIN LATERAL (SELECT a2.provider_payment_id FROM payment_attempts a2"
    "   WHERE a2.order_id = " AS_UUID("m.order_id")
    "     AND a2.status = 'SUCCEEDED' AND a2.provider_payment_id <> p.id LIMIT 1) o ON true"
    " LEFT JOIN LATERAL (SELECT t.id FROM audit_intents t"
    "   WHERE t.status = 'succeeded'"
    "     AND " META_ID("t.payment_attempt_id") " = " META_ID("m.payment_attempt_id")
    "     AND t.id <> m.id ORDER BY t.created, t.id"
    "   LIMIT 1) tw ON true"
    " LEFT JOIN LATERAL (SELECT t.id FROM audit_intents t"
    "   WHERE t.status = 'succeeded' AND " META_ID("t.order_id") " = " META_ID("m.order_id")
    "     AND t.id <> m.id ORDER BY t.created, t.id"
    "   LIMIT 1) two ON true"
    " ORDER BY p.i";

/* The unbooked succeeded intents in the copy that name only the order $1
 * (the ledger's: lower case), but $2, after ($3, $4) in (created, id)
 * order: every one is a second charge of a paid order, not the oldest
 * only. One index probe a page (0015). */
static const char *SQL_ORDER_STRAYS =
    "SELECT t.id, t.created, t.amount, t.currency FROM audit_intents t"
    " WHERE t.status = 'succeeded' AND " META_ID("t.order_id") " = $1"
    "   AND (t.created, t.id) > ($3::bigint, $4) AND t.payment_attempt_id IS NULL"
    "   AND t.id <> $2 AND NOT EXISTS (SELECT 1 FROM ledger_entries x"
    "     WHERE x.kind = 'charge' AND x.provider_payment_id = t.id)"
    " ORDER BY t.created, t.id LIMIT $5::int";

static const char *SQL_COPY_REFUNDS =
    "INSERT INTO audit_refunds AS t (id, payment_intent, status, amount, currency, created,"
    "  refund_id)"
    " SELECT DISTINCT ON (id) * FROM unnest($1::text[], $2::text[], $3::text[],"
    "   $4::bigint[], $5::text[], $6::bigint[], $7::text[])"
    "   AS p(id, payment_intent, status, amount, currency, created, refund_id)"
    " ON CONFLICT (id) DO UPDATE SET payment_intent = EXCLUDED.payment_intent,"
    "  status = EXCLUDED.status, amount = EXCLUDED.amount, currency = EXCLUDED.currency,"
    "  created = EXCLUDED.created, refund_id = EXCLUDED.refund_id, seen_at = now()";

/* For each refund: the refund attempt booked on it (SUCCEEDED: its ledger
 * row exists, the trigger wrote it); the refund attempt its metadata names;
 * what the copy holds as refunded of its intent, and the charge; the
 * intent the booked refund attempt's charge is on, and whether the
 * metadata names another refund than the booked one. */
static const char *SQL_REFUND_FACTS =
    "SELECT p.i, coalesce(r.status = 'SUCCEEDED', false), coalesce(r.amount, 0),"
    "  coalesce(rm.status, ''), coalesce(rm.id::text, ''),"
    "  (SELECT coalesce(sum(x.amount), 0) FROM audit_refunds x"
    "    WHERE x.payment_intent = m.payment_intent AND x.status = 'succeeded'),"
    "  coalesce(lc.amount, " TAKEN("mi") ", -1),"
    "  coalesce(lc.payment_attempt_id::text, ''), coalesce(lc.order_id::text, ''),"
    "  coalesce(r.payment_intent, ''),"
    "  r.id IS NOT NULL AND m.refund_id IS NOT NULL"
    "    AND " AS_UUID("m.refund_id") " IS DISTINCT FROM r.id"
    " FROM unnest($1::text[]) WITH ORDINALITY AS p(id, i)"
    " JOIN audit_refunds m ON m.id = p.id"
    " LEFT JOIN refund_attempts r ON r.provider_refund_id = p.id"
    " LEFT JOIN refund_attempts rm ON rm.id = " AS_UUID("m.refund_id")
    " LEFT JOIN ledger_entries lc ON lc.kind = 'charge' AND lc.provider_payment_id = m.payment_intent"
    " LEFT JOIN audit_intents mi ON mi.id = m.payment_intent"
    " ORDER BY p.i";

static const char *SQL_LEDGER_COUNT =
    "SELECT count(*) FROM ledger_entries"
    " WHERE created_at >= to_timestamp($1::bigint) AND created_at < to_timestamp($2::bigint)";

/* A ledger row as struct audit_ledger_row holds it (read_ledger_row). */
#define LEDGER_ROW \
    "SELECT l.id, l.kind = 'refund'," \
    "  CASE l.kind WHEN 'refund' THEN l.provider_refund_id" \
    "   ELSE l.provider_payment_id END," \
    "  l.amount, l.currency, l.payment_attempt_id::text, l.order_id::text," \
    "  coalesce(l.refund_id::text, ''), floor(extract(epoch FROM l.created_at))::bigint" \
    " FROM ledger_entries l"

/* The row booked on one provider object, by the unique indexes: a charge's
 * on its intent, a refund's through the refund attempt that holds it. */
static const char *SQL_LEDGER_OF_INTENT =
    LEDGER_ROW " WHERE l.kind = 'charge' AND l.provider_payment_id = $1";
static const char *SQL_LEDGER_OF_REFUND =
    LEDGER_ROW " JOIN refund_attempts r ON r.provider_refund_id = $1 AND l.refund_id = r.id"
    " WHERE l.kind = 'refund' AND l.provider_refund_id = $1";

static const char *SQL_LEDGER_UNMATCHED =
    LEDGER_ROW
    " LEFT JOIN audit_intents m ON l.kind = 'charge' AND m.id = l.provider_payment_id"
    " LEFT JOIN audit_refunds mr ON l.kind = 'refund' AND mr.id = l.provider_refund_id"
    " WHERE l.created_at >= to_timestamp($1::bigint) AND l.created_at < to_timestamp($2::bigint)"
    "   AND l.id > $3::bigint"
    "   AND (CASE l.kind WHEN 'charge'"
    "        THEN m.status = 'succeeded' AND " TAKEN("m") " = l.amount"
    "          AND upper(m.currency) = l.currency"
    "        ELSE mr.status = 'succeeded' AND mr.amount = l.amount AND upper(mr.currency) = l.currency"
    "        END) IS NOT TRUE"
    " ORDER BY l.id LIMIT $4::int";

static const char *SQL_FINDING =
    "INSERT INTO audit_findings (kind, object_id, payment_attempt_id, order_id, refund_id,"
    "  other_object_id, provider_amount, provider_currency, ledger_amount, ledger_currency,"
    "  detail, window_start, window_end)"
    " VALUES ($1, $2, nullif($3, ''), nullif($4, ''), nullif($5, ''), nullif($6, ''),"
    "  $7::bigint, nullif($8, ''), $9::bigint, nullif($10, ''), $11,"
    "  to_timestamp($12::bigint), to_timestamp($13::bigint))"
    " ON CONFLICT (kind, object_id) DO NOTHING RETURNING id";

static const char *SQL_PENDING =
    "WITH gone AS (DELETE FROM audit_pending WHERE object_id = ANY($1::text[]))"
    " INSERT INTO audit_pending (object_id, object_kind)"
    " SELECT DISTINCT unnest($2::text[]), $3"
    " ON CONFLICT (object_id) DO UPDATE SET checked_at = now()";

static const char *SQL_PENDING_DUE =
    "UPDATE audit_pending p SET checked_at = now()"
    " FROM (SELECT object_id FROM audit_pending ORDER BY checked_at LIMIT $1::int"
    "       FOR UPDATE SKIP LOCKED) d"
    " WHERE p.object_id = d.object_id RETURNING p.object_id, p.object_kind = 'refund'";

static const char *SQL_PENDING_COUNT = "SELECT count(*) FROM audit_pending";

static const char *SQL_FINDINGS_BY_KIND =
    "SELECT kind, count(*) FROM audit_findings GROUP BY kind";

static const char *SQL_FINISH =
    "INSERT INTO audit_windows (window_start, window_end, scheduled, auditor, intents_seen,"
    "  refunds_seen, ledger_rows_seen, pending, findings, started_at)"
    " VALUES (to_timestamp($1::bigint), to_timestamp($2::bigint), $3::boolean, $4,"
    "  $5::bigint, $6::bigint, $7::bigint, $8::bigint, $9::jsonb,"
    "  to_timestamp($10::bigint / 1000.0))"
    " ON CONFLICT (window_start) WHERE scheduled DO NOTHING RETURNING id";
/* clang-format on */

enum charged_rc audit_store_now(audit_store_t *st, long long *now_ms,
                                struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc =
        run(st, &s, "SELECT (extract(epoch FROM now()) * 1000)::bigint", &r, err);
    if (rc != CHARGED_OK)
        return rc;
    *now_ms = stmt_col_int(r, 0, 0);
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_next_window(audit_store_t *st, long long from_unix,
                                        long long window_s, long long lag_ms,
                                        struct audit_window *w,
                                        struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    memset(w, 0, sizeof(*w));
    stmt_int(&s, from_unix);
    stmt_int(&s, lag_ms);
    if ((rc = run(st, &s, SQL_NEXT, &r, err)) != CHARGED_OK)
        return rc;
    w->now_ms = stmt_col_int(r, 0, 0);
    w->start = PQgetisnull(r, 0, 1) ? stmt_col_int(r, 0, 2) : stmt_col_int(r, 0, 1);
    PQclear(r);
    w->end = w->start + window_s;
    w->due = w->end * 1000 + lag_ms <= w->now_ms;
    w->watermark_age_ms = w->now_ms - w->start * 1000;
    return CHARGED_OK;
}

static const char *or_null(int present, const char *s)
{
    return present ? s : NULL;
}

/* A number of the provider's, SQL NULL when it did not say (< 0). */
static void add_int_or_null(struct stmt *s, int param, long long v)
{
    if (v < 0)
        stmt_add(s, param, NULL);
    else
        stmt_add_int(s, param, v);
}

static int is_manual(const struct provider_listed *it)
{
    return !strcmp(it->capture_method, "manual");
}

/* The step statement of the operations' rules into buf: its head, their
 * columns in the table's order, its tail. 0 when it does not fit. */
static int step_sql(const struct audit_step_table *t, char *buf, size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "%s", SQL_STEP_FACTS_HEAD);
    CHARGED_ASSERT(t && t->n <= AUDIT_STEP_SETS_MAX);
    for (size_t s = 0; s < t->n && used < size; s++)
        for (size_t c = 0; c < t->sets[s]->ncolumns && used < size; c++)
            used += (size_t)snprintf(buf + used, size - used, ",  %s",
                                     t->sets[s]->columns[c]);
    if (used < size)
        used += (size_t)snprintf(buf + used, size - used, "%s", SQL_STEP_FACTS_TAIL);
    return used < size;
}

/* rows[i].steps for items[i], and what the money rules take of them
 * (audit_intent_facts' manual, amount_received, steps_ours). One statement
 * for a page that holds a manual intent, none otherwise. */
static enum charged_rc step_facts(audit_store_t *st,
                                  const struct provider_listed *items, size_t n,
                                  const struct audit_step_table *t,
                                  struct audit_intent_row *rows,
                                  struct charged_error *err)
{
    struct stmt q = {0};
    PGresult *r = NULL;
    enum charged_rc rc;
    size_t manual = 0, ncols = 0;
    char sql[8192];
    CHARGED_ASSERT(items != NULL && rows != NULL && n > 0);
    for (size_t i = 0; i < n; i++) {
        const struct provider_listed *it = &items[i];
        struct audit_intent_row *o = &rows[i];
        o->steps = (struct audit_step_facts){
            .manual = is_manual(it),
            .status = it->status,
            .amount = it->amount,
            .amount_received = it->amount_received,
            .cancellation_reason = it->cancellation_reason,
            .attempt_status = o->step_status,
        };
        o->facts.manual = o->steps.manual;
        o->facts.amount_received = it->amount_received;
        manual += (size_t)o->steps.manual;
    }
    if (manual == 0)
        return CHARGED_OK;
    for (size_t s = 0; s < t->n; s++)
        ncols += t->sets[s]->ncolumns;
    /* The rules' columns are ours, and fit (audit_policy.h's maxima). */
    CHARGED_ASSERT(ncols <= AUDIT_STEP_COLUMNS_MAX && step_sql(t, sql, sizeof(sql)));
    int a = stmt_arrays(&q, 2);
    for (size_t i = 0; i < n; i++) {
        stmt_add(&q, a, items[i].id);
        stmt_add(&q, a + 1,
                 or_null(items[i].has_attempt_metadata, items[i].payment_attempt_id));
    }
    if ((rc = run(st, &q, sql, &r, err)) != CHARGED_OK)
        return rc;
    for (int row = 0; row < PQntuples(r); row++) {
        long long i = stmt_col_int(r, row, 0) - 1;
        if (i < 0 || (size_t)i >= n || !rows[i].steps.manual)
            continue;
        struct audit_intent_row *o = &rows[i];
        stmt_col_copy(r, row, 1, o->step_attempt, sizeof(o->step_attempt));
        stmt_col_copy(r, row, 2, o->step_status, sizeof(o->step_status));
        stmt_col_copy(r, row, 4, o->step_order, sizeof(o->step_order));
        stmt_col_copy(r, row, 5, o->step_currency, sizeof(o->step_currency));
        o->steps.attempt_amount = stmt_col_int(r, row, 3);
        o->steps.named_unsettled = stmt_col_true(r, row, 6);
        for (size_t c = 0; c < ncols; c++)
            o->steps.columns[c] = stmt_col_int(r, row, SQL_STEP_FACTS_BASE + (int)c);
        o->facts.steps_ours = *o->step_status != '\0';
    }
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_intents(audit_store_t *st,
                                    const struct provider_listed *items, size_t n,
                                    const struct audit_step_table *steps,
                                    struct audit_intent_row *rows,
                                    struct charged_error *err)
{
    struct stmt c = {0}, q = {0};
    PGresult *r = NULL;
    enum charged_rc rc;
    if (n == 0)
        return CHARGED_OK;
    int a = stmt_arrays(&c, 11), ids = stmt_arrays(&q, 1);
    for (size_t i = 0; i < n; i++) {
        const struct provider_listed *it = &items[i];
        stmt_add(&c, a, it->id);
        stmt_add(&c, a + 1, it->status);
        stmt_add_int(&c, a + 2, it->amount);
        stmt_add(&c, a + 3, it->currency);
        stmt_add_int(&c, a + 4, it->created);
        stmt_add(&c, a + 5, or_null(it->has_attempt_metadata, it->payment_attempt_id));
        stmt_add(&c, a + 6, or_null(*it->order_id != '\0', it->order_id));
        stmt_add(&c, a + 7, or_null(*it->capture_method != '\0', it->capture_method));
        add_int_or_null(&c, a + 8, it->amount_capturable);
        add_int_or_null(&c, a + 9, it->amount_received);
        stmt_add(&c, a + 10,
                 or_null(*it->cancellation_reason != '\0', it->cancellation_reason));
        stmt_add(&q, ids, it->id);
    }
    if ((rc = run(st, &c, SQL_COPY_INTENTS, NULL, err)) != CHARGED_OK) {
        stmt_release(&q);
        return rc;
    }
    if ((rc = run(st, &q, SQL_INTENT_FACTS, &r, err)) != CHARGED_OK)
        return rc;
    memset(rows, 0, n * sizeof(*rows));
    for (int row = 0; row < PQntuples(r); row++) {
        long long i = stmt_col_int(r, row, 0) - 1;
        if (i < 0 || (size_t)i >= n)
            continue;
        struct audit_intent_row *o = &rows[i];
        const struct provider_listed *it = &items[i];
        stmt_col_copy(r, row, 3, o->booked_currency, sizeof(o->booked_currency));
        stmt_col_copy(r, row, 4, o->booked_attempt, sizeof(o->booked_attempt));
        stmt_col_copy(r, row, 5, o->attempt_status, sizeof(o->attempt_status));
        stmt_col_copy(r, row, 12, o->recorded, sizeof(o->recorded));
        stmt_col_copy(r, row, 17, o->booked_order, sizeof(o->booked_order));
        int other_attempt = stmt_col_true(r, row, 6);
        int other_order = stmt_col_true(r, row, 8);
        int twin = stmt_col_true(r, row, 10);
        stmt_col_copy(r, row,
                      other_attempt ? 7
                      : other_order ? 9
                                    : 11,
                      o->other_object, sizeof(o->other_object));
        o->facts = (struct audit_intent_facts){
            .status = it->status,
            .amount = it->amount,
            .currency = it->currency,
            .has_attempt_metadata = it->has_attempt_metadata,
            .booked = stmt_col_true(r, row, 1),
            .booked_amount = stmt_col_int(r, row, 2),
            .booked_currency = o->booked_currency,
            .attempt_status = o->attempt_status,
            .attempt_booked_other = other_attempt,
            .order_booked_other = other_order,
            .earlier_twin = twin,
            .object_id = it->id,
            .attempt_recorded_id = o->recorded,
            .recorded_elsewhere = stmt_col_true(r, row, 13),
            .names_another = stmt_col_true(r, row, 14),
            .order_unsettled = stmt_col_true(r, row, 15),
            .order_only_twin = stmt_col_true(r, row, 16),
        };
    }
    PQclear(r);
    /* Every item has its row (the copy was written first); one missing
     * would be judged on no facts at all. */
    for (size_t i = 0; i < n; i++)
        if (!rows[i].facts.status) {
            charged_error_set(err, "audit: no facts for intent %zu of the page", i);
            return CHARGED_RETRY;
        }
    return step_facts(st, items, n, steps, rows, err);
}

enum charged_rc audit_store_order_strays(audit_store_t *st, const char *order,
                                         const char *booked, long long after_created,
                                         const char *after_id,
                                         struct audit_order_stray *out, size_t max,
                                         size_t *n, struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    *n = 0;
    stmt_text(&s, order);
    stmt_text(&s, booked);
    stmt_int(&s, after_created);
    stmt_text(&s, after_id);
    stmt_int(&s, (long long)max);
    if ((rc = run(st, &s, SQL_ORDER_STRAYS, &r, err)) != CHARGED_OK)
        return rc;
    for (int row = 0; row < PQntuples(r) && (size_t)row < max; row++) {
        struct audit_order_stray *o = &out[row];
        stmt_col_copy(r, row, 0, o->id, sizeof(o->id));
        o->created = stmt_col_int(r, row, 1);
        o->amount = stmt_col_int(r, row, 2);
        stmt_col_copy(r, row, 3, o->currency, sizeof(o->currency));
        (*n)++;
    }
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_refunds(audit_store_t *st,
                                    const struct provider_listed *items, size_t n,
                                    struct audit_refund_row *rows,
                                    struct charged_error *err)
{
    struct stmt c = {0}, q = {0};
    PGresult *r = NULL;
    enum charged_rc rc;
    if (n == 0)
        return CHARGED_OK;
    int a = stmt_arrays(&c, 7), ids = stmt_arrays(&q, 1);
    for (size_t i = 0; i < n; i++) {
        const struct provider_listed *it = &items[i];
        stmt_add(&c, a, it->id);
        stmt_add(&c, a + 1, it->payment_intent);
        stmt_add(&c, a + 2, it->status);
        stmt_add_int(&c, a + 3, it->amount);
        stmt_add(&c, a + 4, it->currency);
        stmt_add_int(&c, a + 5, it->created);
        stmt_add(&c, a + 6, or_null(*it->refund_id != '\0', it->refund_id));
        stmt_add(&q, ids, it->id);
    }
    if ((rc = run(st, &c, SQL_COPY_REFUNDS, NULL, err)) != CHARGED_OK) {
        stmt_release(&q);
        return rc;
    }
    if ((rc = run(st, &q, SQL_REFUND_FACTS, &r, err)) != CHARGED_OK)
        return rc;
    memset(rows, 0, n * sizeof(*rows));
    for (int row = 0; row < PQntuples(r); row++) {
        long long i = stmt_col_int(r, row, 0) - 1;
        if (i < 0 || (size_t)i >= n)
            continue;
        struct audit_refund_row *o = &rows[i];
        const struct provider_listed *it = &items[i];
        stmt_col_copy(r, row, 3, o->refund_status, sizeof(o->refund_status));
        stmt_col_copy(r, row, 4, o->refund_attempt, sizeof(o->refund_attempt));
        o->refunded_total = stmt_col_int(r, row, 5);
        o->charge_amount = stmt_col_int(r, row, 6);
        stmt_col_copy(r, row, 7, o->payment_attempt_id, sizeof(o->payment_attempt_id));
        stmt_col_copy(r, row, 8, o->order_id, sizeof(o->order_id));
        stmt_col_copy(r, row, 9, o->booked_intent, sizeof(o->booked_intent));
        o->facts = (struct audit_refund_facts){
            .status = it->status,
            .amount = it->amount,
            .currency = it->currency,
            .booked = stmt_col_true(r, row, 1),
            .booked_amount = stmt_col_int(r, row, 2),
            .refund_status = o->refund_status,
            .booked_intent = o->booked_intent,
            .object_intent = it->payment_intent,
            .names_another = stmt_col_true(r, row, 10),
        };
    }
    PQclear(r);
    for (size_t i = 0; i < n; i++)
        if (!rows[i].facts.status) {
            charged_error_set(err, "audit: no facts for refund %zu of the page", i);
            return CHARGED_RETRY;
        }
    return CHARGED_OK;
}

static enum charged_rc one_number(audit_store_t *st, struct stmt *s, const char *sql,
                                  long long *out, struct charged_error *err)
{
    PGresult *r;
    enum charged_rc rc = run(st, s, sql, &r, err);
    if (rc != CHARGED_OK)
        return rc;
    *out = stmt_col_int(r, 0, 0);
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_ledger_count(audit_store_t *st, long long start,
                                         long long end, long long *count,
                                         struct charged_error *err)
{
    struct stmt s = {0};
    stmt_int(&s, start);
    stmt_int(&s, end);
    return one_number(st, &s, SQL_LEDGER_COUNT, count, err);
}

static void read_ledger_row(PGresult *r, int row, struct audit_ledger_row *o)
{
    memset(o, 0, sizeof(*o));
    o->id = stmt_col_int(r, row, 0);
    o->refund = stmt_col_true(r, row, 1);
    stmt_col_copy(r, row, 2, o->object_id, sizeof(o->object_id));
    o->amount = stmt_col_int(r, row, 3);
    stmt_col_copy(r, row, 4, o->currency, sizeof(o->currency));
    stmt_col_copy(r, row, 5, o->payment_attempt_id, sizeof(o->payment_attempt_id));
    stmt_col_copy(r, row, 6, o->order_id, sizeof(o->order_id));
    stmt_col_copy(r, row, 7, o->refund_id, sizeof(o->refund_id));
    o->created = stmt_col_int(r, row, 8);
}

enum charged_rc audit_store_ledger_unmatched(audit_store_t *st, long long start,
                                             long long end, long long after_id,
                                             struct audit_ledger_row *rows, size_t max,
                                             size_t *n, struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    *n = 0;
    stmt_int(&s, start);
    stmt_int(&s, end);
    stmt_int(&s, after_id);
    stmt_int(&s, (long long)max);
    if ((rc = run(st, &s, SQL_LEDGER_UNMATCHED, &r, err)) != CHARGED_OK)
        return rc;
    for (int row = 0; row < PQntuples(r) && (size_t)row < max; row++) {
        read_ledger_row(r, row, &rows[row]);
        (*n)++;
    }
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_ledger_of(audit_store_t *st, const char *object_id,
                                      int refund, struct audit_ledger_row *row,
                                      int *found, struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    *found = 0;
    stmt_text(&s, object_id);
    if ((rc = run(st, &s, refund ? SQL_LEDGER_OF_REFUND : SQL_LEDGER_OF_INTENT, &r,
                  err)) != CHARGED_OK)
        return rc;
    if (PQntuples(r) > 0) {
        read_ledger_row(r, 0, row);
        *found = 1;
    }
    PQclear(r);
    return CHARGED_OK;
}

static const char *str(const char *s)
{
    return s ? s : "";
}

enum charged_rc audit_store_add_finding(audit_store_t *st,
                                        const struct audit_finding *f, int *fresh,
                                        struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    *fresh = 0;
    stmt_text(&s, audit_kind_name(f->kind));
    stmt_text(&s, f->object_id);
    stmt_text(&s, str(f->payment_attempt_id));
    stmt_text(&s, str(f->order_id));
    stmt_text(&s, str(f->refund_id));
    stmt_text(&s, str(f->other_object_id));
    stmt_int_or_null(&s, f->provider_amount);
    stmt_text(&s, str(f->provider_currency));
    stmt_int_or_null(&s, f->ledger_amount);
    stmt_text(&s, str(f->ledger_currency));
    stmt_text(&s, str(f->detail));
    stmt_int(&s, f->window_start);
    stmt_int(&s, f->window_end);
    if ((rc = run(st, &s, SQL_FINDING, &r, err)) != CHARGED_OK)
        return rc;
    *fresh = PQntuples(r) == 1;
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_pending(audit_store_t *st, const char *kind,
                                    const char *const *done, size_t ndone,
                                    const char *const *wait, size_t nwait,
                                    struct charged_error *err)
{
    struct stmt s = {0};
    if (ndone == 0 && nwait == 0)
        return CHARGED_OK;
    int a = stmt_arrays(&s, 2);
    for (size_t i = 0; i < ndone; i++)
        stmt_add(&s, a, done[i]);
    for (size_t i = 0; i < nwait; i++)
        stmt_add(&s, a + 1, wait[i]);
    stmt_text(&s, kind);
    return run(st, &s, SQL_PENDING, NULL, err);
}

enum charged_rc audit_store_pending_due(audit_store_t *st, size_t max,
                                        char (*ids)[PROVIDER_ID_MAX], int *is_refund,
                                        size_t *n, struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    *n = 0;
    stmt_int(&s, (long long)max);
    if ((rc = run(st, &s, SQL_PENDING_DUE, &r, err)) != CHARGED_OK)
        return rc;
    for (int row = 0; row < PQntuples(r) && (size_t)row < max; row++) {
        stmt_col_copy(r, row, 0, ids[row], sizeof(ids[row]));
        is_refund[row] = stmt_col_true(r, row, 1);
        (*n)++;
    }
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_pending_count(audit_store_t *st, long long *count,
                                          struct charged_error *err)
{
    struct stmt s = {0};
    return one_number(st, &s, SQL_PENDING_COUNT, count, err);
}

enum charged_rc audit_store_findings_by_kind(audit_store_t *st,
                                             long long counts[AUDIT_KIND__COUNT],
                                             struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc = run(st, &s, SQL_FINDINGS_BY_KIND, &r, err);
    if (rc != CHARGED_OK)
        return rc;
    memset(counts, 0, AUDIT_KIND__COUNT * sizeof(*counts));
    for (int row = 0; row < PQntuples(r); row++) {
        int k = audit_kind_parse(PQgetvalue(r, row, 0));
        if (k >= 0)
            counts[k] = stmt_col_int(r, row, 1);
    }
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc audit_store_finish(audit_store_t *st, const struct audit_verdict *v,
                                   int *recorded, long long *id,
                                   struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r;
    enum charged_rc rc;
    char findings[1024];
    size_t len = 0;
    *recorded = 0;
    *id = 0;
    findings[len++] = '{';
    for (int k = 0; k < AUDIT_KIND__COUNT; k++)
        len += (size_t)snprintf(findings + len, sizeof(findings) - len, "%s\"%s\":%lld",
                                k ? "," : "", audit_kind_name((enum audit_kind)k),
                                v->findings[k]);
    snprintf(findings + len, sizeof(findings) - len, "}");
    stmt_int(&s, v->start);
    stmt_int(&s, v->end);
    stmt_text(&s, v->scheduled ? "true" : "false");
    stmt_text(&s, v->auditor);
    stmt_int(&s, v->intents);
    stmt_int(&s, v->refunds);
    stmt_int(&s, v->ledger_rows);
    stmt_int(&s, v->pending);
    stmt_text(&s, findings);
    stmt_int(&s, v->started_ms);
    if ((rc = run(st, &s, SQL_FINISH, &r, err)) != CHARGED_OK)
        return rc;
    if (PQntuples(r) == 1) {
        *recorded = 1;
        *id = stmt_col_int(r, 0, 0);
    }
    PQclear(r);
    return CHARGED_OK;
}
