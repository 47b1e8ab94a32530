#include "store_stmt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"

/* Reserves the next parameter: its index, or -1 when there is no room. */
static int stmt_next(struct stmt *s)
{
    if (s->n >= STMT_PARAMS_MAX) {
        s->failed = 1;
        return -1;
    }
    return s->n++;
}

/* A text parameter, or SQL NULL for NULL. */
void stmt_text(struct stmt *s, const char *value)
{
    int i = stmt_next(s);
    if (i >= 0)
        s->p[i] = value;
}

void stmt_int(struct stmt *s, long long value)
{
    int i = stmt_next(s);
    if (i < 0)
        return;
    snprintf(s->nums[i], sizeof(s->nums[i]), "%lld", value);
    s->p[i] = s->nums[i];
}

/* value, or SQL NULL when it is negative ("none"). */
void stmt_int_or_null(struct stmt *s, long long value)
{
    if (value < 0)
        stmt_text(s, NULL);
    else
        stmt_int(s, value);
}

/* `count` array parameters, empty: the index of the first, which
 * stmt_add() fills item by item. */
int stmt_arrays(struct stmt *s, int count)
{
    int first = s->n;
    for (int k = 0; k < count; k++) {
        int i = stmt_next(s);
        if (i >= 0 && !(s->arrays[i] = db_array_new()))
            s->failed = 1;
    }
    return first;
}

/* Appends one element to array parameter `param`; NULL appends SQL NULL. */
void stmt_add(struct stmt *s, int param, const char *value)
{
    if (param < 0 || param >= s->n || !s->arrays[param] ||
        db_array_add(s->arrays[param], value) != 0)
        s->failed = 1;
}

void stmt_add_int(struct stmt *s, int param, long long value)
{
    char num[24];
    snprintf(num, sizeof(num), "%lld", value);
    stmt_add(s, param, num);
}

/* Runs sql with s's parameters on the call's session: CHARGED_OK and, when
 * res is not NULL, the rows in *res (the caller PQclear()s them); or the
 * failure, classified (store_conn_exec), and err. */
enum charged_rc stmt_run(store_conn_t *db, struct stmt *s, const char *sql,
                         PGresult **res, struct charged_error *err)
{
    if (res)
        *res = NULL;
    for (int i = 0; i < s->n && !s->failed; i++)
        if (s->arrays[i] && !(s->p[i] = db_array_text(s->arrays[i])))
            s->failed = 1;
    if (s->failed) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    return store_conn_exec(db, sql, s->n, s->p, res, err);
}

enum charged_rc stmt_run_keyed(store_conn_t *db, struct stmt *s, const char *sql,
                               PGresult **res, struct charged_error *err)
{
    enum charged_rc rc = stmt_run(db, s, sql, res, err);
    if (rc == CHARGED_BAD_ITEM && !strcmp(err->code, "23505"))
        rc = stmt_run(db, s, sql, res, err);
    return rc;
}

void stmt_release(struct stmt *s)
{
    for (int i = 0; i < s->n; i++)
        db_array_free(s->arrays[i]);
}

/* Column c of a row: copied as text into out (cut to its size), as a
 * number, as a boolean. */
void stmt_col_copy(const PGresult *r, int row, int c, char *out, size_t size)
{
    snprintf(out, size, "%s", PQgetvalue(r, row, c));
}

long long stmt_col_int(const PGresult *r, int row, int c)
{
    return strtoll(PQgetvalue(r, row, c), NULL, 10);
}

int stmt_col_true(const PGresult *r, int row, int c)
{
    return PQgetvalue(r, row, c)[0] == 't';
}

enum charged_rc stmt_lease(store_conn_t *db, const char *actor, const char *sql,
                           const char *const *ids, const int64_t *epochs, size_t n,
                           const long long *lease_ms, PGresult **res,
                           struct charged_error *err)
{
    struct stmt s = {0};
    enum charged_rc rc;

    if (store_conn_open(db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int a = stmt_arrays(&s, 2);
    for (size_t i = 0; i < n; i++) {
        stmt_add(&s, a, ids[i]);
        stmt_add_int(&s, a + 1, epochs[i]);
    }
    if (lease_ms)
        stmt_int(&s, *lease_ms);
    stmt_text(&s, actor);
    rc = stmt_run(db, &s, sql, res, err);
    stmt_release(&s);
    return rc;
}

enum charged_rc stmt_waiting(store_conn_t *db, const char *actor, const char *sql,
                             const struct store_wait *w, size_t n,
                             struct charged_error *err)
{
    CHARGED_ASSERT(db && actor && sql);
    CHARGED_ASSERT(w || n == 0);
    struct stmt s = {0};
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int a = stmt_arrays(&s, 4);
    for (size_t i = 0; i < n; i++) {
        /* A wait said has its start; an ended one none. */
        CHARGED_ASSERT(!w[i].reason || w[i].since_ms > 0);
        stmt_add(&s, a, w[i].id);
        stmt_add_int(&s, a + 1, w[i].lease_epoch);
        stmt_add(&s, a + 2, w[i].reason);
        stmt_add_int(&s, a + 3, w[i].since_ms);
    }
    stmt_text(&s, actor);
    enum charged_rc rc = stmt_run(db, &s, sql, NULL, err);
    stmt_release(&s);
    return rc;
}

enum charged_rc stmt_lock_ids(store_conn_t *db, const char *sql, const char *const *ids,
                              size_t n, int *locked, struct charged_error *err)
{
    CHARGED_ASSERT(db && sql);
    CHARGED_ASSERT(n == 0 || (ids && locked));
    struct stmt s = {0};
    PGresult *r = NULL;
    int a = stmt_arrays(&s, 1);
    for (size_t i = 0; i < n; i++)
        stmt_add(&s, a, ids[i]);
    enum charged_rc rc = stmt_run(db, &s, sql, &r, err);
    str_index_t *rows = rc == CHARGED_OK ? stmt_index_rows(r, 0) : NULL;
    for (size_t i = 0; i < n; i++)
        locked[i] = rc == CHARGED_OK && stmt_row_in(rows, r, 0, ids[i]) >= 0;
    str_index_free(rows);
    PQclear(r);
    stmt_release(&s);
    return rc;
}

int stmt_row_of(const PGresult *r, int c, const char *value)
{
    for (int row = PQntuples(r) - 1; row >= 0; row--)
        if (!strcmp(PQgetvalue(r, row, c), value))
            return row;
    return -1;
}

str_index_t *stmt_index_rows(const PGresult *r, int c)
{
    int n = r ? PQntuples(r) : 0;
    str_index_t *ix = str_index_new((size_t)n);
    /* In row order: the last row of a value is found first. */
    for (int row = 0; ix && row < n; row++) {
        int full = str_index_add(ix, PQgetvalue(r, row, c), row);
        CHARGED_ASSERT(!full); /* sized to its rows */
    }
    return ix;
}

int stmt_row_in(const str_index_t *ix, const PGresult *r, int c, const char *value)
{
    if (!ix)
        return stmt_row_of(r, c, value);
    int e = str_index_find(ix, value);
    return e < 0 ? -1 : str_index_value(ix, e);
}

/* Appends one outcome to the ten arrays from `first`, in the column order
 * of the persist statements: 0, or -1 (err) when its status may not
 * follow PROCESSING. */
static int add_outcome(struct stmt *s, int first, const struct stmt_outcome *o,
                       struct charged_error *err)
{
    int to = attempt_status_parse(o->status);
    if (to < 0 || !attempt_status_transition_allowed(ATTEMPT_STATUS_PROCESSING, to)) {
        charged_error_set(err, "status '%s' may not follow PROCESSING",
                          o->status ? o->status : "(null)");
        return -1;
    }
    stmt_add(s, first, o->id);
    stmt_add_int(s, first + 1, o->lease_epoch);
    stmt_add(s, first + 2, o->status);
    stmt_add(s, first + 3, o->reason);
    stmt_add(s, first + 4, o->provider_id && *o->provider_id ? o->provider_id : NULL);
    stmt_add(s, first + 5, o->event_type);
    stmt_add(s, first + 6, o->evidence_json ? o->evidence_json : "{}");
    stmt_add_int(s, first + 7, o->calls);
    stmt_add(s, first + 8, o->last_error);
    if (o->next_check_ms < 0)
        stmt_add(s, first + 9, NULL);
    else
        stmt_add_int(s, first + 9, o->next_check_ms);
    return 0;
}

enum charged_rc stmt_persist(store_conn_t *db, const char *actor, const char *sql,
                             void *items, size_t n, stmt_outcome_fn get,
                             struct charged_error *err)
{
    struct stmt s = {0};
    struct stmt_outcome o;
    PGresult *r = NULL;
    enum charged_rc rc = CHARGED_BAD_ITEM;

    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int a = stmt_arrays(&s, 10);
    for (size_t i = 0; i < n; i++) {
        get(items, i, &o);
        if (add_outcome(&s, a, &o, err) != 0)
            goto out;
    }
    stmt_text(&s, actor);
    if ((rc = stmt_run(db, &s, sql, &r, err)) != CHARGED_OK)
        goto out;
    str_index_t *rows = stmt_index_rows(r, 0);
    for (size_t i = 0; i < n; i++) {
        get(items, i, &o);
        int row = stmt_row_in(rows, r, 0, o.id);
        *o.persisted = row >= 0 && stmt_col_true(r, row, 1);
        *o.busy = row >= 0 && stmt_col_true(r, row, 2);
    }
    str_index_free(rows);
out:
    PQclear(r);
    stmt_release(&s);
    return rc;
}

enum charged_rc stmt_backlog(store_conn_t *db, const char *sql,
                             const enum attempt_status *statuses, size_t n,
                             long long *counts, long long *oldest_ms,
                             struct charged_error *err)
{
    struct stmt s = {0};
    PGresult *r = NULL;
    enum charged_rc rc;

    charged_error_clear(err);
    for (size_t i = 0; i < n; i++)
        counts[i] = oldest_ms[i] = 0;
    if (store_conn_open(db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    int names = stmt_arrays(&s, 1);
    for (size_t i = 0; i < n; i++)
        stmt_add(&s, names, attempt_status_name(statuses[i]));
    if ((rc = stmt_run(db, &s, sql, &r, err)) == CHARGED_OK)
        for (size_t i = 0; i < n; i++) {
            int row = stmt_row_of(r, 0, attempt_status_name(statuses[i]));
            if (row >= 0) {
                counts[i] = stmt_col_int(r, row, 1);
                oldest_ms[i] = stmt_col_int(r, row, 2);
            }
        }
    PQclear(r);
    stmt_release(&s);
    return rc;
}

int stmt_session_new(const char *database_url, const char *lock_timeout,
                     const char *actor, store_conn_t **db, char **actor_copy,
                     struct charged_error *err)
{
    if (!(*actor_copy = strdup(actor))) {
        charged_error_set(err, "out of memory");
        return -1;
    }
    if (!(*db = store_conn_new(database_url, lock_timeout, err))) {
        free(*actor_copy);
        *actor_copy = NULL;
        return -1;
    }
    return 0;
}

void stmt_session_free(store_conn_t *db, char *actor_copy)
{
    store_conn_free(db);
    free(actor_copy);
}

enum charged_rc stmt_ping(store_conn_t *db, struct charged_error *err)
{
    charged_error_clear(err);
    if (store_conn_open(db, NULL, err) != CHARGED_OK ||
        store_conn_exec(db, "SELECT 1", 0, NULL, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    return CHARGED_OK;
}

void stmt_add_calls(struct stmt *s, int first, const void *items, size_t n,
                    stmt_call_fn get, const char *own_op)
{
    CHARGED_ASSERT(s && get && own_op && (items || n == 0));
    for (size_t i = 0; i < n; i++) {
        struct stmt_call c;
        get(items, i, &c);
        const struct provider_result *r = c.res;
        /* A call is written only with its step's id and its answer. */
        CHARGED_ASSERT(r && c.id);
        stmt_add(s, first, c.id);
        stmt_add(s, first + 1, c.operation ? c.operation : own_op);
        stmt_add_int(s, first + 2, c.started_ms);
        stmt_add_int(s, first + 3, r->latency_ms);
        stmt_add(s, first + 4, provider_outcome_name(r->outcome));
        stmt_add_int(s, first + 5, r->http_status);
        stmt_add(s, first + 6, r->replayed ? "t" : "f");
        stmt_add(s, first + 7, r->provider_payment_id);
        stmt_add(s, first + 8, r->outcome == PROVIDER_SUCCEEDED ? "" : r->error);
    }
}

/* The one call of a batch at `index` (get's items offset). */
struct one_call {
    const void *items;
    size_t index;
    stmt_call_fn get;
};

static void one_call(const void *items, size_t i, struct stmt_call *c)
{
    const struct one_call *o = items;
    CHARGED_ASSERT(o && i == 0);
    o->get(o->items, o->index, c);
}

enum charged_rc stmt_log_calls(store_conn_t *db, const char *actor, const char *sql,
                               const void *items, size_t n, stmt_call_fn get,
                               const char *own_op, struct charged_error *err)
{
    CHARGED_ASSERT(db && actor && sql && get);
    CHARGED_ASSERT(items || n == 0);
    enum charged_rc rc = CHARGED_OK;
    charged_error_clear(err);
    if (n == 0)
        return CHARGED_OK;
    if (store_conn_open(db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    for (int maybe = 0; maybe < 2 && rc == CHARGED_OK; maybe++) {
        struct stmt s = {0};
        size_t k = 0;
        int a = stmt_arrays(&s, 9);
        for (size_t i = 0; i < n; i++) {
            struct stmt_call c;
            get(items, i, &c);
            if (!!c.written_maybe != maybe)
                continue;
            const struct one_call o = {items, i, get};
            stmt_add_calls(&s, a, &o, 1, one_call, own_op);
            k++;
        }
        stmt_text(&s, actor);
        stmt_text(&s, maybe ? "{t}" : "{f}");
        if (k > 0)
            rc = stmt_run(db, &s, sql, NULL, err);
        stmt_release(&s);
    }
    return rc;
}

enum charged_rc stmt_claim_due(store_conn_t *db, const char *actor, const char *sql,
                               size_t max, long long lease_ms, long long stale_ms,
                               PGresult **res, struct charged_error *err)
{
    CHARGED_ASSERT(db && actor && sql && res && max > 0);
    struct stmt s = {0};
    *res = NULL;
    if (store_conn_open(db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    stmt_text(&s, actor);
    stmt_int(&s, lease_ms);
    stmt_int(&s, (long long)max);
    stmt_int(&s, stale_ms);
    enum charged_rc rc = stmt_run(db, &s, sql, res, err);
    stmt_release(&s);
    return rc;
}
