#include "outbox_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"

/* The relay's advisory lock: one leader per database. */
#define RELAY_LOCK_KEY "7216493035014220801"

struct outbox_store {
    char *url;
    PGconn *conn;
    int leading;
};

struct outbox_batch {
    PGresult *res;
    struct outbox_event *events;
    size_t n;
};

outbox_store_t *outbox_store_new(const char *database_url, char *errbuf,
                                 size_t errbuf_size)
{
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(database_url, &perr);
    if (!opts) {
        snprintf(errbuf, errbuf_size,
                 "bad database url: libpq cannot parse it (not shown: it may hold a "
                 "password)");
        PQfreemem(perr);
        return NULL;
    }
    PQconninfoFree(opts);
    outbox_store_t *st = calloc(1, sizeof(*st));
    if (!st || !(st->url = strdup(database_url))) {
        free(st);
        snprintf(errbuf, errbuf_size, "out of memory");
        return NULL;
    }
    return st;
}

void outbox_store_free(outbox_store_t *st)
{
    if (!st)
        return;
    PQfinish(st->conn);
    free(st->url);
    free(st);
}

static int ensure_conn(outbox_store_t *st, char *errbuf, size_t errbuf_size)
{
    int rc = db_ensure(&st->conn, st->url, errbuf, errbuf_size);
    /* A new session holds no lock: leadership was lost with the old one. */
    if (rc != 0)
        st->leading = 0;
    return rc < 0 ? -1 : 0;
}

int outbox_store_lead(outbox_store_t *st, char *errbuf, size_t errbuf_size)
{
    if (ensure_conn(st, errbuf, errbuf_size) != 0)
        return -1;
    if (st->leading)
        return 1;
    PGresult *r = db_exec(st->conn, "SELECT pg_try_advisory_lock(" RELAY_LOCK_KEY ")",
                          0, NULL, errbuf, errbuf_size);
    if (!r)
        return -1;
    st->leading = PQgetvalue(r, 0, 0)[0] == 't';
    PQclear(r);
    return st->leading;
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

outbox_batch_t *outbox_store_fetch(outbox_store_t *st, size_t max, char *errbuf,
                                   size_t errbuf_size)
{
    char limit[32];
    const char *p[1] = {limit};
    if (ensure_conn(st, errbuf, errbuf_size) != 0)
        return NULL;
    snprintf(limit, sizeof(limit), "%zu", max);
    PGresult *r = db_exec(st->conn, SQL_FETCH, 1, p, errbuf, errbuf_size);
    if (!r)
        return NULL;
    outbox_batch_t *b = calloc(1, sizeof(*b));
    size_t n = (size_t)PQntuples(r);
    if (!b || !(b->events = calloc(n + 1, sizeof(*b->events)))) {
        free(b);
        PQclear(r);
        snprintf(errbuf, errbuf_size, "out of memory");
        return NULL;
    }
    b->res = r;
    b->n = n;
    for (size_t i = 0; i < n; i++) {
        b->events[i].event_id = PQgetvalue(r, (int)i, 0);
        b->events[i].key = PQgetvalue(r, (int)i, 1);
        b->events[i].payload = PQgetvalue(r, (int)i, 2);
    }
    return b;
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

int outbox_store_mark_published(outbox_store_t *st, const char *const *event_ids,
                                size_t n, char *errbuf, size_t errbuf_size)
{
    int rc = -1;
    db_array_t *ids = db_array_new();
    if (!ids) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (db_array_add(ids, event_ids[i]) != 0) {
            snprintf(errbuf, errbuf_size, "out of memory");
            goto out;
        }
    if (ensure_conn(st, errbuf, errbuf_size) != 0)
        goto out;
    const char *p[1] = {db_array_text(ids)};
    rc = db_run(st->conn, SQL_MARK, 1, p, errbuf, errbuf_size);
out:
    db_array_free(ids);
    return rc;
}

int outbox_store_mark_failed(outbox_store_t *st, const char *const *event_ids,
                             const char *const *errors, size_t n, char *errbuf,
                             size_t errbuf_size)
{
    int rc = -1;
    db_array_t *ids = db_array_new(), *errs = db_array_new();
    if (!ids || !errs)
        goto oom;
    for (size_t i = 0; i < n; i++)
        if (db_array_add(ids, event_ids[i]) != 0 || db_array_add(errs, errors[i]) != 0)
            goto oom;
    if (ensure_conn(st, errbuf, errbuf_size) != 0)
        goto out;
    const char *p[2] = {db_array_text(ids), db_array_text(errs)};
    rc = db_run(st->conn, SQL_FAILED, 2, p, errbuf, errbuf_size);
    goto out;
oom:
    snprintf(errbuf, errbuf_size, "out of memory");
out:
    db_array_free(ids);
    db_array_free(errs);
    return rc;
}

int outbox_store_purge(outbox_store_t *st, long long retention_ms, long long *deleted,
                       char *errbuf, size_t errbuf_size)
{
    char ms[32];
    const char *p[1] = {ms};
    *deleted = 0;
    if (ensure_conn(st, errbuf, errbuf_size) != 0)
        return -1;
    snprintf(ms, sizeof(ms), "%lld", retention_ms);
    PGresult *r = db_exec(st->conn, SQL_PURGE, 1, p, errbuf, errbuf_size);
    if (!r)
        return -1;
    *deleted = strtoll(PQcmdTuples(r), NULL, 10);
    PQclear(r);
    return 0;
}

int outbox_store_backlog(outbox_store_t *st, long long *count, long long *oldest_ms,
                         char *errbuf, size_t errbuf_size)
{
    if (ensure_conn(st, errbuf, errbuf_size) != 0)
        return -1;
    PGresult *r = db_exec(st->conn, SQL_BACKLOG, 0, NULL, errbuf, errbuf_size);
    if (!r)
        return -1;
    *count = strtoll(PQgetvalue(r, 0, 0), NULL, 10);
    *oldest_ms = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    PQclear(r);
    return 0;
}
