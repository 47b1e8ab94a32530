#include "attempt_history.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charge_command.h"
#include "charged_assert.h"
#include "db.h"
#include "provider_outcome.h"
#include "store_conn.h"

#define TS(col) ATTEMPT_HISTORY_TS(col)
#define WAITING ATTEMPT_HISTORY_WAITING

/* How many attempts one id may name: an order's few, an intent's one. */
#define FIND_MAX "100"

/* clang-format off */
/* provider_calls counts the rows the call log lists: attempt_count counts
 * charges only, not the reconciler's or an operator's look-ups. */
static const char *SQL_ATTEMPT =
    "SELECT row_to_json(a)::text FROM (SELECT id AS payment_attempt_id, order_id,"
    " idempotency_key, status, reason, amount, currency, payment_method, customer_id,"
    " provider_payment_id, refunded_amount, refund_reserved,"
    " capture_method, captured_amount, held_by, held_by_id,"
    " (SELECT count(*) FROM provider_calls c WHERE c.payment_attempt_id = p.id)"
    "   AS provider_calls,"
    " last_error, lease_owner, " TS("lease_expires_at") " AS lease_expires_at,"
    " lease_epoch, " WAITING " " TS("first_sent_at") " AS first_sent_at,"
    " " TS("next_check_at") " AS next_check_at,"
    " " TS("created_at") " AS created_at, " TS("updated_at") " AS updated_at"
    " FROM payment_attempts p WHERE id = $1::uuid) a";

static const char *SQL_TRANSITIONS =
    "SELECT coalesce(json_agg(t ORDER BY t.id), '[]')::text FROM (SELECT id,"
    " " TS("created_at") " AS at, old_status, new_status, cause, actor, reason,"
    " evidence FROM attempt_transitions WHERE payment_attempt_id = $1::uuid) t";

/* The call log: SQL_CALLS_HEAD, each step's call column, SQL_CALLS_TAIL. */
static const char *SQL_CALLS_HEAD =
    "SELECT coalesce(json_agg(c ORDER BY c.id), '[]')::text FROM (SELECT id,"
    " " TS("started_at") " AS started_at, operation, outcome, http_status, replayed,"
    " latency_ms, provider_payment_id, error, actor";
static const char *SQL_CALLS_TAIL =
    " FROM provider_calls WHERE payment_attempt_id = $1::uuid) c";

static const char *SQL_LEDGER =
    "SELECT coalesce(json_agg(l ORDER BY l.id), '[]')::text FROM (SELECT id, kind,"
    " amount, currency, provider_payment_id, " TS("created_at") " AS created_at"
    " FROM ledger_entries WHERE payment_attempt_id = $1::uuid) l";

/* c: the time itself, to order by; taken out of the answer below. */
static const char *SQL_EVENTS =
    "SELECT coalesce(json_agg(e ORDER BY e.created_at), '[]')::text FROM (SELECT"
    " event_id, event_type, topic, " TS("created_at") " AS created_at,"
    " " TS("published_at") " AS published_at, payload, created_at AS c"
    " FROM outbox WHERE payment_attempt_id = $1::uuid) e";

static const char *SQL_REFUNDS =
    "SELECT coalesce(json_agg(r ORDER BY r.c, r.refund_id), '[]')::text FROM (SELECT"
    " id AS refund_id, status, amount, currency, refund_reason, reason,"
    " provider_refund_id, " TS("updated_at") " AS updated_at, " WAITING
    " created_at AS c FROM refund_attempts WHERE payment_attempt_id = $1::uuid) r";

/* The attempt's transitions and its steps', in time order (the attempt's
 * first within one instant: a step's move follows the claim it made):
 * SQL_TIMELINE_HEAD, " UNION ALL" and each step's part, ") e". */
static const char *SQL_TIMELINE_HEAD =
    "SELECT coalesce(json_agg(e ORDER BY e.c, e.step = 'attempt' DESC, e.id), '[]')::text"
    " FROM (" ATTEMPT_HISTORY_TIMELINE_PART("'attempt'", "t.payment_attempt_id",
                                            "attempt_transitions",
                                            "WHERE t.payment_attempt_id = $1::uuid");

/* A row of a list, for list and find alike: up to the WHERE. */
#define SQL_ROWS                                                                       \
    "SELECT coalesce(json_agg(a), '[]')::text FROM (SELECT id AS payment_attempt_id,"  \
    " order_id, status, amount, currency, provider_payment_id, reason,"                \
    " " TS("updated_at") " AS updated_at FROM payment_attempts"

static const char *SQL_LIST =
    SQL_ROWS
    " WHERE ($1::uuid IS NULL OR order_id = $1::uuid)"
    "   AND ($2::text IS NULL OR status = $2)"
    "   AND ($3::bigint IS NULL OR updated_at < now() - make_interval(secs => $3 / 1000.0))"
    " ORDER BY updated_at DESC LIMIT $4::int) a";

/* Both the primary key and payment_attempts_order answer it. */
static const char *SQL_FIND_UUID =
    SQL_ROWS
    " WHERE id = $1::uuid OR order_id = $1::uuid"
    " ORDER BY updated_at DESC LIMIT " FIND_MAX ") a";

/* payment_attempts_provider_payment_id answers it. */
static const char *SQL_FIND_INTENT =
    SQL_ROWS
    " WHERE provider_payment_id = $1"
    " ORDER BY updated_at DESC LIMIT " FIND_MAX ") a";
/* clang-format on */

/* db_query_json, its failure as the stores say it. */
static enum charged_rc query(PGconn *conn, const char *sql, int n, const char *const *p,
                             json_t **out, struct charged_error *err)
{
    enum charged_rc rc = db_query_json(conn, sql, n, p, out, err);
    return rc == CHARGED_RETRY ? store_conn_failed(err) : rc;
}

/* The statements of the story's parts that the steps add to: the call
 * log's and the timeline's (one allocation each, freed by the caller). */
struct composed {
    char *calls, *timeline;
};

/* s and more, s reallocated (freed when that fails: NULL); *len its length. */
static char *concat(char *s, size_t *len, const char *more)
{
    size_t n = strlen(more);
    char *t = s ? realloc(s, *len + n + 1) : NULL;
    if (!t) {
        free(s);
        return NULL;
    }
    memcpy(t + *len, more, n + 1);
    *len += n;
    return t;
}

/* Both statements of steps into c: 0 out of memory. */
static int compose(const struct attempt_history_table *steps, struct composed *c)
{
    size_t nc = 0, nt = 0;
    CHARGED_ASSERT(steps && steps->n <= ATTEMPT_HISTORY_STEPS_MAX);
    c->calls = concat(calloc(1, 1), &nc, SQL_CALLS_HEAD);
    c->timeline = concat(calloc(1, 1), &nt, SQL_TIMELINE_HEAD);
    for (size_t i = 0; i < steps->n; i++) {
        const struct attempt_history_steps *st = steps->steps[i];
        CHARGED_ASSERT(st->key && st->sql && st->timeline && st->call_column);
        c->calls = concat(concat(c->calls, &nc, ", "), &nc, st->call_column);
        c->timeline = concat(concat(c->timeline, &nt, " UNION ALL"), &nt, st->timeline);
    }
    c->calls = concat(c->calls, &nc, SQL_CALLS_TAIL);
    c->timeline = concat(c->timeline, &nt, ") e");
    return c->calls && c->timeline;
}

/* Each a list that always has its row ("[]" when empty); strip: a member
 * the SQL orders by and the answer does without. */
struct part {
    const char *key, *sql, *strip;
};

/* The story's parts in its order: the attempt's own, its steps', the
 * timeline. parts holds 6 + ATTEMPT_HISTORY_STEPS_MAX + 1. */
static size_t story_parts(const struct attempt_history_table *steps,
                          const struct composed *c, struct part *parts)
{
    const struct part own[] = {
        {"transitions", SQL_TRANSITIONS, NULL}, {"provider_calls", c->calls, NULL},
        {"ledger_entries", SQL_LEDGER, NULL},   {"result_events", SQL_EVENTS, "c"},
        {"refunds", SQL_REFUNDS, "c"},
    };
    size_t n = 0;
    for (; n < sizeof(own) / sizeof(own[0]); n++)
        parts[n] = own[n];
    for (size_t i = 0; i < steps->n; i++)
        parts[n++] = (struct part){steps->steps[i]->key, steps->steps[i]->sql, "c"};
    parts[n++] = (struct part){"timeline", c->timeline, "c"};
    return n;
}

enum charged_rc attempt_history_read(PGconn *conn, const char *attempt_id,
                                     const struct attempt_history_table *steps,
                                     json_t **out, struct charged_error *err)
{
    struct part parts[6 + ATTEMPT_HISTORY_STEPS_MAX + 1];
    struct composed c = {0};
    const char *p[1] = {attempt_id};
    json_t *story = NULL, *v = NULL;
    enum charged_rc rc;
    int in_tx = 0;

    *out = NULL;
    charged_error_clear(err);
    if (!charge_command_is_uuid(attempt_id))
        return CHARGED_NOT_FOUND; /* names no attempt: nothing to ask */
    if (!compose(steps, &c)) {
        free(c.calls);
        free(c.timeline);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    size_t nparts = story_parts(steps, &c, parts);
    /* One snapshot, so that the parts agree: a settlement committed
     * between two reads would show a SUCCEEDED attempt without its ledger
     * row. Inside the caller's transaction, that one's. */
    if (PQtransactionStatus(conn) == PQTRANS_IDLE) {
        if (db_run(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL,
                   err) != 0) {
            rc = store_conn_failed(err);
            goto out;
        }
        in_tx = 1;
    }
    if ((rc = query(conn, SQL_ATTEMPT, 1, p, &v, err)) != CHARGED_OK)
        goto out;
    rc = CHARGED_RETRY;
    if (!(story = json_object()) || json_object_set_new(story, "attempt", v) != 0) {
        if (!story)
            json_decref(v); /* set_new frees it itself when it fails */
        charged_error_set(err, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nparts; i++) {
        if ((rc = query(conn, parts[i].sql, 1, p, &v, err)) != CHARGED_OK) {
            if (rc == CHARGED_NOT_FOUND) {
                rc = CHARGED_RETRY;
                charged_error_set(err, "the database gave no %s", parts[i].key);
            }
            goto out;
        }
        if (parts[i].strip) {
            size_t j;
            json_t *e;
            json_array_foreach(v, j, e) json_object_del(e, parts[i].strip);
        }
        if (json_object_set_new(story, parts[i].key, v) != 0) {
            rc = CHARGED_RETRY;
            charged_error_set(err, "out of memory");
            goto out;
        }
    }
    if (in_tx) {
        in_tx = 0; /* over, whatever COMMIT says */
        if (db_run(conn, "COMMIT", 0, NULL, err) != 0) {
            rc = store_conn_failed(err);
            goto out;
        }
    }
    rc = CHARGED_OK;
out:
    if (in_tx) {
        struct charged_error ignore;
        db_run(conn, "ROLLBACK", 0, NULL, &ignore);
    }
    if (rc == CHARGED_OK)
        *out = story;
    else
        json_decref(story);
    free(c.calls);
    free(c.timeline);
    return rc;
}

enum charged_rc attempt_history_list(PGconn *conn,
                                     const struct attempt_history_filter *f,
                                     json_t **out, struct charged_error *err)
{
    const char *p[4] = {f->order_id, f->status, f->older_than_ms, f->limit};
    charged_error_clear(err);
    return query(conn, SQL_LIST, 4, p, out, err);
}

enum charged_rc attempt_history_find(PGconn *conn, const char *id, json_t **out,
                                     struct charged_error *err)
{
    const char *p[1] = {id};
    const char *sql = charge_command_is_uuid(id)   ? SQL_FIND_UUID
                      : provider_outcome_id_ok(id) ? SQL_FIND_INTENT
                                                   : NULL;
    *out = NULL;
    charged_error_clear(err);
    if (sql)
        return query(conn, sql, 1, p, out, err);
    /* Neither kind of id: it names nothing, and no statement could say
     * more (a cast of it would only fail). */
    if (!(*out = json_array())) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    return CHARGED_OK;
}
