#include "outbox_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "store_conn.h"

/* The relay's advisory lock: one leader per database. */
#define RELAY_LOCK_KEY "7216493035014220801"

/* Outbox rows are changed by the leading relay alone: a lock another
 * session holds on one (an operator's, say) is waited for this long at
 * most, and the step is tried again after a back-off. */
#define OUTBOX_LOCK_TIMEOUT "5s"

struct outbox_store {
    store_conn_t *db;
    int leading;
};

struct outbox_batch {
    PGresult *res;
    struct outbox_event *events;
    size_t n;
};

outbox_store_t *outbox_store_new(const char *database_url, struct charged_error *err)
{
    outbox_store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    if (!(st->db = store_conn_new(database_url, OUTBOX_LOCK_TIMEOUT, err))) {
        free(st);
        return NULL;
    }
    return st;
}

void outbox_store_free(outbox_store_t *st)
{
    if (!st)
        return;
    store_conn_free(st->db);
    free(st);
}

/* The session for one call: CHARGED_OK, or CHARGED_RETRY (err filled) when
 * the database cannot be reached. */
static enum charged_rc session(outbox_store_t *st, struct charged_error *err)
{
    int fresh = 0;
    enum charged_rc rc = store_conn_open(st->db, &fresh, err);
    /* A new session holds no lock: leadership was lost with the old one. */
    if (rc != CHARGED_OK || fresh)
        st->leading = 0;
    return rc;
}

enum charged_rc outbox_store_lead(outbox_store_t *st, struct charged_error *err)
{
    PGresult *r;
    enum charged_rc rc;
    charged_error_clear(err);
    if ((rc = session(st, err)) != CHARGED_OK)
        return rc;
    if (st->leading)
        return CHARGED_OK;
    /* The lead is a session lock: only where the session is ours alone. */
    char pid[16];
    const char *p[1] = {pid};
    snprintf(pid, sizeof(pid), "%d", store_conn_pid(st->db));
    rc = store_conn_exec(st->db, SQL_LEAD(RELAY_LOCK_KEY), 1, p, &r, err);
    if (rc != CHARGED_OK)
        return rc;
    if (PQgetisnull(r, 0, 0)) {
        PQclear(r);
        charged_error_set(err, LEAD_POOLED("relay"));
        return CHARGED_RETRY;
    }
    st->leading = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return st->leading ? CHARGED_OK : CHARGED_NOT_LEADER;
}

/* clang-format off */
/* In seq order, the order each attempt's events were written in; an event
 * waiting out a failure holds back the later events of its attempt, and no
 * other. */
static const char *SQL_FETCH =
    "SELECT o.event_id, o.event_key, o.payload::text FROM outbox o"
    " WHERE o.published_at IS NULL"
    "   AND NOT EXISTS (SELECT 1 FROM outbox b"
    "     WHERE b.payment_attempt_id = o.payment_attempt_id AND b.published_at IS NULL"
    "       AND b.seq <= o.seq AND b.retry_at > now())"
    " ORDER BY o.seq LIMIT $1::int";

/* The next try after 1 s, 2 s, 4 s ... at most a minute. */
static const char *SQL_FAILED =
    "UPDATE outbox o SET publish_failures = o.publish_failures + 1,"
    "  last_error = v.error,"
    "  retry_at = now() + make_interval(secs => least(60, 2 ^ least(o.publish_failures, 6)))"
    " FROM unnest($1::uuid[], $2::text[]) AS v(id, error)"
    " WHERE o.event_id = v.id AND o.published_at IS NULL";

static const char *SQL_MARK =
    "UPDATE outbox SET published_at = now()"
    " WHERE event_id = ANY($1::uuid[]) AND published_at IS NULL";

static const char *SQL_PURGE =
    "DELETE FROM outbox WHERE published_at < now() - make_interval(secs => $1::bigint / 1000.0)";

static const char *SQL_BACKLOG =
    "SELECT count(*), coalesce((extract(epoch FROM now() - min(created_at)) * 1000)::bigint, 0)"
    " FROM outbox WHERE published_at IS NULL";
/* clang-format on */

enum charged_rc outbox_store_fetch(outbox_store_t *st, size_t max, outbox_batch_t **out,
                                   struct charged_error *err)
{
    char limit[32];
    const char *p[1] = {limit};
    PGresult *r;
    enum charged_rc rc;
    charged_error_clear(err);
    *out = NULL;
    snprintf(limit, sizeof(limit), "%zu", max);
    if ((rc = session(st, err)) != CHARGED_OK ||
        (rc = store_conn_exec(st->db, SQL_FETCH, 1, p, &r, err)) != CHARGED_OK)
        return rc;
    outbox_batch_t *b = calloc(1, sizeof(*b));
    size_t n = (size_t)PQntuples(r);
    if (!b || !(b->events = calloc(n + 1, sizeof(*b->events)))) {
        free(b);
        PQclear(r);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    b->res = r;
    b->n = n;
    for (size_t i = 0; i < n; i++) {
        b->events[i].event_id = PQgetvalue(r, (int)i, 0);
        b->events[i].key = PQgetvalue(r, (int)i, 1);
        b->events[i].payload = PQgetvalue(r, (int)i, 2);
    }
    *out = b;
    return CHARGED_OK;
}

size_t outbox_batch_count(const outbox_batch_t *b)
{
    return b ? b->n : 0;
}

const struct outbox_event *outbox_batch_get(const outbox_batch_t *b, size_t i)
{
    return b && i < b->n ? &b->events[i] : NULL;
}

void outbox_batch_free(outbox_batch_t *b)
{
    if (!b)
        return;
    PQclear(b->res);
    free(b->events);
    free(b);
}

/* Runs an UPDATE or DELETE of ours; *affected (when not NULL) says how many
 * rows it changed. */
static enum charged_rc change(outbox_store_t *st, const char *sql, int nparams,
                              const char *const *params, long long *affected,
                              struct charged_error *err)
{
    PGresult *r;
    enum charged_rc rc;
    if ((rc = session(st, err)) != CHARGED_OK ||
        (rc = store_conn_exec(st->db, sql, nparams, params, &r, err)) != CHARGED_OK)
        return rc;
    if (affected)
        *affected = strtoll(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc outbox_store_mark_published(outbox_store_t *st,
                                            const char *const *event_ids, size_t n,
                                            struct charged_error *err)
{
    enum charged_rc rc = CHARGED_RETRY;
    db_array_t *ids = db_array_new();
    charged_error_clear(err);
    if (!ids)
        goto oom;
    for (size_t i = 0; i < n; i++)
        if (db_array_add(ids, event_ids[i]) != 0)
            goto oom;
    const char *p[1] = {db_array_text(ids)};
    rc = change(st, SQL_MARK, 1, p, NULL, err);
    goto out;
oom:
    charged_error_set(err, "out of memory");
out:
    db_array_free(ids);
    return rc;
}

enum charged_rc outbox_store_mark_failed(outbox_store_t *st,
                                         const char *const *event_ids,
                                         const char *const *errors, size_t n,
                                         struct charged_error *err)
{
    enum charged_rc rc = CHARGED_RETRY;
    db_array_t *ids = db_array_new(), *errs = db_array_new();
    charged_error_clear(err);
    if (!ids || !errs)
        goto oom;
    for (size_t i = 0; i < n; i++)
        if (db_array_add(ids, event_ids[i]) != 0 || db_array_add(errs, errors[i]) != 0)
            goto oom;
    const char *p[2] = {db_array_text(ids), db_array_text(errs)};
    rc = change(st, SQL_FAILED, 2, p, NULL, err);
    goto out;
oom:
    charged_error_set(err, "out of memory");
out:
    db_array_free(ids);
    db_array_free(errs);
    return rc;
}

enum charged_rc outbox_store_purge(outbox_store_t *st, long long retention_ms,
                                   long long *deleted, struct charged_error *err)
{
    char ms[32];
    const char *p[1] = {ms};
    charged_error_clear(err);
    *deleted = 0;
    snprintf(ms, sizeof(ms), "%lld", retention_ms);
    return change(st, SQL_PURGE, 1, p, deleted, err);
}

enum charged_rc outbox_store_backlog(outbox_store_t *st, long long *count,
                                     long long *oldest_ms, struct charged_error *err)
{
    PGresult *r;
    enum charged_rc rc;
    charged_error_clear(err);
    if ((rc = session(st, err)) != CHARGED_OK ||
        (rc = store_conn_exec(st->db, SQL_BACKLOG, 0, NULL, &r, err)) != CHARGED_OK)
        return rc;
    *count = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    *oldest_ms = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return CHARGED_OK;
}
