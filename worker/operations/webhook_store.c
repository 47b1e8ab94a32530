#include "webhook_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "db.h"
#include "op.h"
#include "store_conn.h"
#include "webhook_apply.h"

/* A webhook waits this long at most for the attempt's row (a worker's
 * statement holds it for milliseconds), then is answered 503 and delivered
 * again. */
#define WEBHOOK_LOCK_TIMEOUT "5s"

struct webhook_store {
    store_conn_t *db;
};

/* An order lists at most this many attempts: enough for any real order,
 * and a bound on what one query can make us hold. */
#define ORDER_ATTEMPTS_MAX "1000"

/* clang-format off */
static const char *SQL_RECORD_EVENT =
    "INSERT INTO processed_webhook_events (provider, event_id, event_type,"
    "  payment_attempt_id, outcome, payload)"
    " VALUES ($1, $2, $3, nullif($4, '')::uuid, 'received', $5::jsonb)"
    " ON CONFLICT (provider, event_id) DO NOTHING RETURNING event_id";

static const char *SQL_EVENT_OUTCOME =
    "UPDATE processed_webhook_events SET outcome = $3, reason = nullif($5, ''),"
    "  payment_attempt_id = coalesce(nullif($4, '')::uuid, payment_attempt_id)"
    " WHERE provider = $1 AND event_id = $2";

/* An attempt's wait (migration 0021) is read only while the claim that
 * said it holds: a worker that died waiting said nothing more. */
#define SQL_VIEW \
    "SELECT id, order_id, status, amount, currency, provider_payment_id, reason," \
    "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')," \
    "  refunded_amount, capture_method, captured_amount," \
    "  CASE WHEN lease_expires_at > now() THEN waiting_reason END," \
    "  to_char(waiting_since AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')" \
    " FROM payment_attempts "

static const char *SQL_VIEW_ATTEMPT = SQL_VIEW "WHERE id = $1::uuid";
static const char *SQL_VIEW_ORDER =
    SQL_VIEW "WHERE order_id = $1::uuid ORDER BY created_at, id LIMIT " ORDER_ATTEMPTS_MAX;
/* clang-format on */

webhook_store_t *webhook_store_new(const char *database_url, struct charged_error *err)
{
    webhook_store_t *st = calloc(1, sizeof(*st));
    if (!st) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    if (!(st->db = store_conn_new(database_url, WEBHOOK_LOCK_TIMEOUT, err))) {
        free(st);
        return NULL;
    }
    return st;
}

void webhook_store_free(webhook_store_t *st)
{
    if (!st)
        return;
    store_conn_free(st->db);
    free(st);
}

/* ---- what an operation's half of an event may use (webhook_apply.h) ---- */

enum charged_rc webhook_apply_later_failed(enum charged_rc rc)
{
    return rc == CHARGED_BAD_ITEM ? CHARGED_RETRY : rc;
}

enum charged_rc webhook_apply_check_now(store_conn_t *db, const char *sql,
                                        const char *id, struct charged_error *err)
{
    CHARGED_ASSERT(db && sql && id);
    const char *p[1] = {id};
    enum charged_rc x = store_conn_exec(db, sql, 1, p, NULL, err);
    return x == CHARGED_OK ? CHARGED_OK : webhook_apply_later_failed(x);
}

/* ---- one delivery ---- */

static void rollback(webhook_store_t *st)
{
    struct charged_error ignore;
    store_conn_exec(st->db, "ROLLBACK", 0, NULL, NULL, &ignore);
}

/* Records the event as received, inside the open transaction: CHARGED_OK
 * and *fresh when it is new; CHARGED_OK alone when it was seen before and
 * committed (its effect is already there); else the failure. */
static enum charged_rc record_event(webhook_store_t *st, const char *provider,
                                    const struct webhook_event *ev, const char *payload,
                                    struct webhook_store_result *out, int *fresh,
                                    struct charged_error *err)
{
    CHARGED_ASSERT(st && provider && ev && out && fresh);
    PGresult *r = NULL;
    enum charged_rc x;
    const char *rec[5] = {provider, ev->id, ev->type, ev->attempt_id, payload};
    *fresh = 0;
    /* The event itself refused (CHARGED_BAD_ITEM): no delivery of it will ever do. */
    if ((x = store_conn_exec(st->db, SQL_RECORD_EVENT, 5, rec, &r, err)) != CHARGED_OK)
        return x;
    if (PQntuples(r) == 0) {
        out->outcome = "duplicate";
        out->reason = "event already processed";
    } else
        *fresh = 1;
    PQclear(r);
    return CHARGED_OK;
}

/* The event applied by the first operation of the table that takes it
 * (op.h's struct op_webhook); one no operation takes stays recorded as
 * it is (unmatched). */
static enum charged_rc apply_to_operation(webhook_store_t *st,
                                          const struct webhook_event *ev,
                                          struct webhook_store_result *out,
                                          struct charged_error *err)
{
    CHARGED_ASSERT(st && ev && out);
    for (size_t k = 0; k < payment_operations_count; k++) {
        const struct op_webhook *w = payment_op_of(k)->webhook;
        if (w && w->takes(ev))
            return w->apply(st->db, ev, out, err);
    }
    /* Not looked up at all (apply_once's "no such attempt" would say we
     * had): an event of a manual intent that no step applies, say. */
    out->reason = payment_ops_unmatched_reason;
    return CHARGED_OK;
}

/* Records the event's outcome and commits. */
static enum charged_rc finish(webhook_store_t *st, const char *provider,
                              const struct webhook_event *ev,
                              const struct webhook_store_result *out,
                              struct charged_error *err)
{
    CHARGED_ASSERT(st && provider && ev && out && out->outcome);
    enum charged_rc x;
    const char *o[5] = {provider, ev->id, out->outcome, out->attempt_id,
                        out->reason ? out->reason : ""};
    if ((x = store_conn_exec(st->db, SQL_EVENT_OUTCOME, 5, o, NULL, err)) !=
            CHARGED_OK ||
        (x = store_conn_exec(st->db, "COMMIT", 0, NULL, NULL, err)) != CHARGED_OK)
        return webhook_apply_later_failed(x);
    return CHARGED_OK;
}

/* One delivery in one transaction: the event recorded, applied to its
 * attempt or its refunds, its outcome recorded, committed; rolled back on
 * any failure, and for a duplicate. */
static enum charged_rc apply_once(webhook_store_t *st, const char *provider,
                                  const struct webhook_event *ev, const char *payload,
                                  struct webhook_store_result *out,
                                  struct charged_error *err)
{
    CHARGED_ASSERT(st && provider && ev && out);
    enum charged_rc rc;
    int fresh = 0, committed = 0;

    charged_error_clear(err);
    memset(out, 0, sizeof(*out));
    out->outcome = "unmatched";
    out->reason = "no such attempt";
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    if ((rc = store_conn_exec(st->db, "BEGIN", 0, NULL, NULL, err)) != CHARGED_OK)
        return webhook_apply_later_failed(rc);
    rc = record_event(st, provider, ev, payload, out, &fresh, err);
    if (rc == CHARGED_OK && fresh)
        rc = apply_to_operation(st, ev, out, err);
    if (rc == CHARGED_OK && fresh)
        committed = (rc = finish(st, provider, ev, out, err)) == CHARGED_OK;
    if (!committed)
        rollback(st);
    return rc;
}

/* A connection the server closed while idle (a restart, a pooler, an
 * administrator) is only found broken by the next statement: that
 * statement is repeated once on a new connection, so that a healthy
 * database never costs a client a 503. */
enum charged_rc webhook_store_apply(webhook_store_t *st, const char *provider,
                                    const struct webhook_event *ev, const char *payload,
                                    struct webhook_store_result *out,
                                    struct charged_error *err)
{
    enum charged_rc rc = apply_once(st, provider, ev, payload, out, err);
    if (rc == CHARGED_RETRY && store_conn_broken(st->db))
        rc = apply_once(st, provider, ev, payload, out, err);
    return rc;
}

/* One row of SQL_VIEW as the contract's attempt object (a new reference). */
static json_t *view_row(PGresult *r, int row)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    /* json_object_set_new steals each value's reference. */
    json_object_set_new(o, "payment_attempt_id", json_string(PQgetvalue(r, row, 0)));
    json_object_set_new(o, "order_id", json_string(PQgetvalue(r, row, 1)));
    json_object_set_new(o, "status", json_string(PQgetvalue(r, row, 2)));
    json_object_set_new(o, "amount",
                        json_integer(strtoll(PQgetvalue(r, row, 3), NULL, 10)));
    json_object_set_new(o, "currency", json_string(PQgetvalue(r, row, 4)));
    json_object_set_new(o, "provider_payment_id",
                        PQgetisnull(r, row, 5) ? json_null()
                                               : json_string(PQgetvalue(r, row, 5)));
    json_object_set_new(o, "reason",
                        PQgetisnull(r, row, 6) ? json_null()
                                               : json_string(PQgetvalue(r, row, 6)));
    json_object_set_new(o, "updated_at", json_string(PQgetvalue(r, row, 7)));
    json_object_set_new(o, "refunded_amount",
                        json_integer(strtoll(PQgetvalue(r, row, 8), NULL, 10)));
    /* An authorization's (issue 37): "manual", and what its capture took
     * (null until then); a charge's is "automatic", null. */
    json_object_set_new(o, "capture_method", json_string(PQgetvalue(r, row, 9)));
    json_object_set_new(o, "captured_amount",
                        PQgetisnull(r, row, 10)
                            ? json_null()
                            : json_integer(strtoll(PQgetvalue(r, row, 10), NULL, 10)));
    /* Held back before its call (the provider's budget, or 429s): queued,
     * not failed; null otherwise (docs/api.md). */
    json_object_set_new(o, "queued",
                        PQgetisnull(r, row, 11)
                            ? json_null()
                            : json_pack("{s:s, s:s}", "reason", PQgetvalue(r, row, 11),
                                        "since", PQgetvalue(r, row, 12)));
    return o;
}

/* Row 0's column col as kind says (a new reference), or NULL when memory
 * ran out or the query's own JSON did not parse. */
static json_t *field_value(const PGresult *r, int col,
                           enum webhook_store_field_kind kind)
{
    if (PQgetisnull(r, 0, col))
        return json_null();
    const char *text = PQgetvalue(r, 0, col);
    switch (kind) {
    case WEBHOOK_FIELD_INTEGER:
        return json_integer(strtoll(text, NULL, 10));
    case WEBHOOK_FIELD_JSON:
        return json_loads(text, 0, NULL);
    case WEBHOOK_FIELD_TEXT:
        break;
    }
    return json_string(text);
}

/* Row 0 of r as the object fields name (a new reference), or NULL when
 * memory ran out. */
static json_t *fields_object(const PGresult *r,
                             const struct webhook_store_field *fields, size_t nfields)
{
    CHARGED_ASSERT(r && fields && (size_t)PQnfields(r) >= nfields);
    json_t *o = json_object();
    for (size_t i = 0; o && i < nfields; i++) {
        const int col = (int)i;
        json_t *v = field_value(r, col, fields[i].kind);
        /* json_object_set_new steals v's reference, also when it fails. */
        if (!v || json_object_set_new(o, fields[i].name, v) != 0) {
            json_decref(o);
            o = NULL;
        }
    }
    return o;
}

/* Reads the rows of one id; a broken connection is replaced and the query
 * asked once more, as a webhook's transaction is. */
static enum charged_rc view(webhook_store_t *st, const char *sql, const char *id,
                            PGresult **res, struct charged_error *err)
{
    CHARGED_ASSERT(st && sql && id && res);
    enum charged_rc rc;
    charged_error_clear(err);
    *res = NULL;
    if ((rc = store_conn_open(st->db, NULL, err)) != CHARGED_OK)
        return rc;
    rc = store_conn_exec(st->db, sql, 1, &id, res, err);
    if (rc != CHARGED_OK && store_conn_broken(st->db) &&
        store_conn_open(st->db, NULL, err) == CHARGED_OK)
        rc = store_conn_exec(st->db, sql, 1, &id, res, err);
    if (rc != CHARGED_OK)
        return rc;
    return PQntuples(*res) == 0 ? CHARGED_NOT_FOUND : CHARGED_OK;
}

enum charged_rc webhook_store_attempt(webhook_store_t *st, const char *attempt_id,
                                      json_t **out, struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc rc = view(st, SQL_VIEW_ATTEMPT, attempt_id, &r, err);
    *out = NULL;
    if (rc == CHARGED_OK && !(*out = view_row(r, 0))) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
    }
    PQclear(r);
    return rc;
}

enum charged_rc webhook_store_one(webhook_store_t *st, const char *sql, const char *id,
                                  const struct webhook_store_field *fields,
                                  size_t nfields, json_t **out,
                                  struct charged_error *err)
{
    CHARGED_ASSERT(sql && fields && nfields > 0 && out);
    PGresult *r = NULL;
    enum charged_rc rc = view(st, sql, id, &r, err);
    *out = NULL;
    if (rc == CHARGED_OK && !(*out = fields_object(r, fields, nfields))) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
    }
    PQclear(r);
    return rc;
}

enum charged_rc webhook_store_order(webhook_store_t *st, const char *order_id,
                                    json_t **out, struct charged_error *err)
{
    PGresult *r = NULL;
    json_t *list = NULL;
    enum charged_rc rc = view(st, SQL_VIEW_ORDER, order_id, &r, err);
    *out = NULL;
    if (rc != CHARGED_OK)
        goto out;
    rc = CHARGED_RETRY;
    if (!(list = json_array()))
        goto oom;
    for (int i = 0; i < PQntuples(r); i++)
        if (json_array_append_new(list, view_row(r, i)) != 0)
            goto oom;
    /* json_pack's "o" steals the list's reference. */
    if (!(*out =
              json_pack("{s:s, s:o}", "order_id", order_id, "payment_attempts", list)))
        goto oom_stolen;
    rc = CHARGED_OK;
    goto out;
oom:
    json_decref(list);
oom_stolen:
    charged_error_set(err, "out of memory");
out:
    PQclear(r);
    return rc;
}

enum charged_rc webhook_store_ping(webhook_store_t *st, struct charged_error *err)
{
    charged_error_clear(err);
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK ||
        store_conn_exec(st->db, "SELECT 1", 0, NULL, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    return CHARGED_OK;
}
