#include "attempt_history.h"

#include <stddef.h>
#include <stdio.h>

#include "charge_command.h"
#include "db.h"
#include "provider_outcome.h"
#include "store_conn.h"

#define TS(col)                                                                        \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

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
    " lease_epoch, " TS("first_sent_at") " AS first_sent_at,"
    " " TS("next_check_at") " AS next_check_at,"
    " " TS("created_at") " AS created_at, " TS("updated_at") " AS updated_at"
    " FROM payment_attempts p WHERE id = $1::uuid) a";

static const char *SQL_TRANSITIONS =
    "SELECT coalesce(json_agg(t ORDER BY t.id), '[]')::text FROM (SELECT id,"
    " " TS("created_at") " AS at, old_status, new_status, cause, actor, reason,"
    " evidence FROM attempt_transitions WHERE payment_attempt_id = $1::uuid) t";

static const char *SQL_CALLS =
    "SELECT coalesce(json_agg(c ORDER BY c.id), '[]')::text FROM (SELECT id,"
    " " TS("started_at") " AS started_at, operation, outcome, http_status, replayed,"
    " latency_ms, provider_payment_id, error, actor, capture_id, void_id FROM provider_calls"
    " WHERE payment_attempt_id = $1::uuid) c";

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
    " provider_refund_id, " TS("updated_at") " AS updated_at, created_at AS c"
    " FROM refund_attempts WHERE payment_attempt_id = $1::uuid) r";

/* A step's transitions, oldest first (x: the step's row). */
#define STEP_TRANSITIONS(table, col)                                                    \
    " (SELECT coalesce(json_agg(t ORDER BY t.id), '[]') FROM (SELECT id,"             \
    " " TS("created_at") " AS at, old_status, new_status, cause, actor, reason,"       \
    " evidence FROM " table " WHERE " col " = x.id) t) AS transitions"

/* An authorization's captures and voids, oldest first, each with its
 * transitions. */
static const char *SQL_CAPTURES =
    "SELECT coalesce(json_agg(k ORDER BY k.c, k.capture_id), '[]')::text FROM (SELECT"
    " x.id AS capture_id, x.status, x.amount, x.captured_amount, x.currency, x.reason,"
    " x.idempotency_key, x.payment_intent, x.holds, " TS("x.created_at") " AS created_at,"
    " " TS("x.updated_at") " AS updated_at, x.created_at AS c,"
    STEP_TRANSITIONS("capture_transitions", "capture_id")
    " FROM capture_attempts x WHERE x.payment_attempt_id = $1::uuid) k";

static const char *SQL_VOIDS =
    "SELECT coalesce(json_agg(v ORDER BY v.c, v.void_id), '[]')::text FROM (SELECT"
    " x.id AS void_id, x.status, x.void_reason, x.released_amount, x.reason,"
    " x.idempotency_key, x.payment_intent, x.holds, " TS("x.created_at") " AS created_at,"
    " " TS("x.updated_at") " AS updated_at, x.created_at AS c,"
    STEP_TRANSITIONS("void_transitions", "void_id")
    " FROM void_attempts x WHERE x.payment_attempt_id = $1::uuid) v";

/* The attempt's transitions and its steps', in time order (the attempt's
 * first within one instant: a step's move follows the claim it made). */
#define TIMELINE_PART(step, id, table, join)                                            \
    " SELECT " step " AS step, " id " AS step_id, t.id, " TS("t.created_at") " AS at,"   \
    " t.old_status, t.new_status, t.cause, t.actor, t.reason, t.evidence,"             \
    " t.created_at AS c FROM " table " t " join
static const char *SQL_TIMELINE =
    "SELECT coalesce(json_agg(e ORDER BY e.c, e.step = 'attempt' DESC, e.id), '[]')::text"
    " FROM (" TIMELINE_PART("'attempt'", "t.payment_attempt_id", "attempt_transitions",
                            "WHERE t.payment_attempt_id = $1::uuid")
    " UNION ALL" TIMELINE_PART("'capture'", "t.capture_id", "capture_transitions",
                               "JOIN capture_attempts x ON x.id = t.capture_id"
                               " WHERE x.payment_attempt_id = $1::uuid")
    " UNION ALL" TIMELINE_PART("'void'", "t.void_id", "void_transitions",
                               "JOIN void_attempts x ON x.id = t.void_id"
                               " WHERE x.payment_attempt_id = $1::uuid")
    ") e";

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

enum charged_rc attempt_history_read(PGconn *conn, const char *attempt_id, json_t **out,
                                     struct charged_error *err)
{
    /* Each a list that always has its row ("[]" when empty); strip: a
     * member the SQL orders by and the answer does without. */
    const struct {
        const char *key, *sql, *strip;
    } parts[] = {
        {"transitions", SQL_TRANSITIONS, NULL},
        {"provider_calls", SQL_CALLS, NULL},
        {"ledger_entries", SQL_LEDGER, NULL},
        {"result_events", SQL_EVENTS, "c"},
        {"refunds", SQL_REFUNDS, "c"},
        {"captures", SQL_CAPTURES, "c"},
        {"voids", SQL_VOIDS, "c"},
        {"timeline", SQL_TIMELINE, "c"},
    };
    const char *p[1] = {attempt_id};
    json_t *story = NULL, *v = NULL;
    enum charged_rc rc;
    int in_tx = 0;

    *out = NULL;
    charged_error_clear(err);
    if (!charge_command_is_uuid(attempt_id))
        return CHARGED_NOT_FOUND; /* names no attempt: nothing to ask */
    /* One snapshot, so that the parts agree: a settlement committed
     * between two reads would show a SUCCEEDED attempt without its ledger
     * row. Inside the caller's transaction, that one's. */
    if (PQtransactionStatus(conn) == PQTRANS_IDLE) {
        if (db_run(conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", 0, NULL,
                   err) != 0)
            return store_conn_failed(err);
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
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
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
