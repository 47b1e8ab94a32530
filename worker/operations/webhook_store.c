#include "webhook_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "db.h"
#include "refund_sql.h"
#include "store_conn.h"

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

/* The attempt an event is about, locked until the commit, and what the
 * database knows of the event's intent ($2): whether the attempt has
 * another one, whether it is another attempt's (named by it, or booked
 * for it), and whether the order has another live attempt. */
#define SQL_LOCK_ATTEMPT(where) \
    "SELECT p.id, p.order_id, p.status, p.amount, p.currency," \
    "  floor(extract(epoch FROM p.updated_at))::bigint," \
    "  coalesce(p.provider_payment_id <> $2, false)," \
    "  EXISTS (SELECT 1 FROM payment_attempts o WHERE o.provider_payment_id = $2" \
    "    AND o.id <> p.id)" \
    "  OR EXISTS (SELECT 1 FROM ledger_entries l WHERE l.kind = 'charge'" \
    "    AND l.provider_payment_id = $2 AND l.payment_attempt_id <> p.id)," \
    "  EXISTS (SELECT 1 FROM payment_attempts o WHERE o.order_id = p.order_id" \
    "    AND o.id <> p.id AND o.status = ANY ($3::text[]))," \
    "  p.provider_payment_id IS NOT NULL" \
    " FROM payment_attempts p WHERE " where " ORDER BY p.id LIMIT 1 FOR NO KEY UPDATE OF p"

static const char *SQL_LOCK_BY_ID = SQL_LOCK_ATTEMPT("p.id = $1::uuid");
static const char *SQL_LOCK_BY_INTENT =
    SQL_LOCK_ATTEMPT("$1::text IS NULL AND p.provider_payment_id = $2");

/* The status change an event causes. The lease is ended and its epoch
 * bumped: a worker or reconciler whose call is still in flight is fenced
 * out and finds the provider's answer settled here. */
static const char *SQL_SETTLE =
    "WITH u AS ("
    "  UPDATE payment_attempts p SET status = $2, reason = $3::text,"
    "    provider_payment_id = coalesce(p.provider_payment_id, $4::text),"
    "    lease_owner = NULL, lease_expires_at = NULL, lease_epoch = p.lease_epoch + 1,"
    "    next_check_at = CASE WHEN $2 = " ATTEMPT_SQL(PROCESSING)
    "      THEN coalesce(p.next_check_at, now()) END,"
    "    updated_at = " SQL_CHANGED_AT("p")
    "  WHERE p.id = $1::uuid AND p.status = $7"
    "  RETURNING p.id, p.order_id, p.amount, p.currency, p.provider_payment_id,"
    "    p.status, p.reason, p.updated_at, $5::text AS event_type),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, evidence, created_at)"
    "  SELECT id, $7, status, 'webhook', $8, reason, $6::jsonb, updated_at FROM u),"
    SQL_LEDGER_CHARGE("u") ","
    SQL_OUTBOX_EVENTS("u")
    "SELECT id FROM u";

/* An UNKNOWN attempt or refund named by an object not proven its own: due
 * for the reconciler at once, whose call again under its own key proves
 * what the event cannot. */
static const char *SQL_CHECK_NOW =
    "UPDATE payment_attempts SET next_check_at = least(next_check_at, now())"
    " WHERE id = $1::uuid AND status = " ATTEMPT_SQL(UNKNOWN);
static const char *SQL_REFUND_CHECK_NOW =
    "UPDATE refund_attempts SET next_check_at = least(next_check_at, now())"
    " WHERE id = $1::uuid AND status = " ATTEMPT_SQL(UNKNOWN);

static const char *SQL_EVENT_OUTCOME =
    "UPDATE processed_webhook_events SET outcome = $3, reason = nullif($5, ''),"
    "  payment_attempt_id = coalesce(nullif($4, '')::uuid, payment_attempt_id)"
    " WHERE provider = $1 AND event_id = $2";

#define SQL_VIEW \
    "SELECT id, order_id, status, amount, currency, provider_payment_id, reason," \
    "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')," \
    "  refunded_amount" \
    " FROM payment_attempts "

static const char *SQL_VIEW_ATTEMPT = SQL_VIEW "WHERE id = $1::uuid";
static const char *SQL_VIEW_REFUND =
    "SELECT id, payment_attempt_id, order_id, status, amount, currency, refund_reason,"
    "  reason, provider_refund_id,"
    "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
    " FROM refund_attempts WHERE id = $1::uuid";

/* The refund one refund of an event names ($1 its metadata refund_id, $2
 * its re_ id, $3 the charge's intent it names), locked until the commit,
 * and what the database knows of its provider ids. */
#define SQL_LOCK_REFUND(where) \
    "SELECT r.id, r.payment_attempt_id, coalesce(r.order_id::text, ''), r.status," \
    "  r.amount, coalesce(r.currency, '')," \
    "  coalesce(r.payment_intent <> nullif($3, ''), false)," \
    "  coalesce(r.provider_refund_id <> $2, false)," \
    "  EXISTS (SELECT 1 FROM refund_attempts o WHERE o.provider_refund_id = $2" \
    "    AND o.id <> r.id)," \
    "  r.provider_refund_id IS NOT NULL" \
    " FROM refund_attempts r WHERE " where " FOR NO KEY UPDATE OF r"

static const char *SQL_LOCK_REFUND_BY_ID =
    SQL_LOCK_REFUND("r.id = $1::uuid AND $2::text IS NOT NULL AND $3::text IS NOT NULL");
static const char *SQL_LOCK_REFUND_BY_PROVIDER_ID = SQL_LOCK_REFUND(
    "$1::text IS NULL AND r.provider_refund_id = $2 AND $3::text IS NOT NULL");

/* A refund's status change: the money follows by the refund_attempts_money
 * trigger. The lease is ended and its epoch bumped, as for an attempt. */
static const char *SQL_SETTLE_REFUND =
    "WITH u AS ("
    "  UPDATE refund_attempts r SET status = $2, reason = $3::text,"
    "    provider_refund_id = coalesce(r.provider_refund_id, $4::text),"
    "    lease_owner = NULL, lease_expires_at = NULL, lease_epoch = r.lease_epoch + 1,"
    "    next_check_at = CASE WHEN $2 = " ATTEMPT_SQL(PROCESSING)
    "      THEN coalesce(r.next_check_at, now()) END,"
    "    updated_at = " SQL_CHANGED_AT("r")
    "  WHERE r.id = $1::uuid AND r.status = $5"
    "  RETURNING r.id, r.payment_attempt_id, r.order_id, r.amount, r.currency,"
    "    r.provider_refund_id, r.status, r.reason, r.updated_at,"
    "    " SQL_REFUND_EVENT_TYPE("r.status") " AS event_type),"
    " t AS ("
    "  INSERT INTO refund_transitions (refund_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, $5, status, 'webhook', $6, reason, $7::jsonb, updated_at FROM u),"
    SQL_REFUND_OUTBOX_EVENTS("u")
    "SELECT id FROM u";
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

/* What the transition records as the provider's evidence. Caller frees. */
static char *evidence_json(const struct webhook_event *ev)
{
    json_t *e =
        json_pack("{s:s, s:s, s:I, s:s, s:s}", "webhook_event_id", ev->id, "type",
                  ev->type, "created", (json_int_t)ev->created, "payment_intent",
                  ev->intent_id, "intent_status", ev->intent_status);
    if (!e)
        return NULL;
    /* json_object_set_new steals the new values' references. */
    if (ev->amount >= 0)
        json_object_set_new(e, "amount", json_integer(ev->amount));
    if (ev->currency[0])
        json_object_set_new(e, "currency", json_string(ev->currency));
    if (ev->decline_code[0])
        json_object_set_new(e, "decline_code", json_string(ev->decline_code));
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

/* What a refund's transition records as the provider's evidence. */
static char *refund_evidence_json(const struct webhook_event *ev,
                                  const struct webhook_refund *r)
{
    json_t *e = json_pack("{s:s, s:s, s:I, s:s, s:s}", "webhook_event_id", ev->id,
                          "type", ev->type, "created", (json_int_t)ev->created,
                          "provider_refund_id", r->id, "refund_status", r->status);
    if (!e)
        return NULL;
    /* json_object_set_new steals the new values' references. */
    if (r->payment_intent[0])
        json_object_set_new(e, "payment_intent", json_string(r->payment_intent));
    if (r->amount >= 0)
        json_object_set_new(e, "amount", json_integer(r->amount));
    if (r->currency[0])
        json_object_set_new(e, "currency", json_string(r->currency));
    if (r->failure_reason[0])
        json_object_set_new(e, "failure_reason", json_string(r->failure_reason));
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

/* The refund's reason after it moved to `st`. */
static void refund_reason_for(const struct webhook_refund *r, enum attempt_status st,
                              char *out, size_t size)
{
    if (st == ATTEMPT_STATUS_FAILED)
        snprintf(out, size, "refund failed: %s",
                 r->failure_reason[0]             ? r->failure_reason
                 : !strcmp(r->status, "canceled") ? "refund_canceled"
                                                  : "refund_failed");
    else if (st == ATTEMPT_STATUS_PROCESSING)
        snprintf(out, size, "provider_processing");
    else
        out[0] = '\0';
}

/* The attempt's reason after the decision. */
static void reason_for(const struct webhook_event *ev, const struct webhook_decision *d,
                       char *out, size_t size)
{
    switch (d->status) {
    case ATTEMPT_STATUS_SUCCEEDED:
        out[0] = '\0';
        break;
    case ATTEMPT_STATUS_FAILED:
        snprintf(out, size, "declined: %s",
                 ev->decline_code[0] ? ev->decline_code : "reported by webhook");
        break;
    case ATTEMPT_STATUS_PROCESSING:
        snprintf(out, size, "provider_processing");
        break;
    default:
        snprintf(out, size, "requires_review: %s", d->reason);
        break;
    }
}

static void rollback(webhook_store_t *st)
{
    struct charged_error ignore;
    store_conn_exec(st->db, "ROLLBACK", 0, NULL, NULL, &ignore);
}

/* A statement after the event was recorded failed (rc): the event itself
 * was taken, so a refused value is not the event's (a bug, or a constraint
 * the decision missed) and the delivery is answered "again", as for an
 * outage. */
static enum charged_rc later_failed(enum charged_rc rc)
{
    return rc == CHARGED_BAD_ITEM ? CHARGED_RETRY : rc;
}

/* How bad an outcome is: an event of several refunds records its worst. */
static int outcome_rank(const char *o)
{
    static const char *order[] = {"ignored", "applied", "unmatched", "needs_review"};
    for (int i = 3; i >= 0; i--)
        if (!strcmp(o, order[i]))
            return i;
    return 0;
}

static void refund_outcome(struct webhook_store_result *out, const char *outcome,
                           const char *reason)
{
    if (out->refunds_seen++ == 0 ||
        outcome_rank(outcome) > outcome_rank(out->outcome)) {
        out->outcome = outcome;
        out->reason = reason;
    }
}

/* Makes the UNKNOWN attempt or refund `id` due for the reconciler now (sql:
 * SQL_CHECK_NOW or SQL_REFUND_CHECK_NOW). */
static enum charged_rc check_now(webhook_store_t *st, const char *sql, const char *id,
                                 struct charged_error *err)
{
    const char *p[1] = {id};
    enum charged_rc x = store_conn_exec(st->db, sql, 1, p, NULL, err);
    return x == CHARGED_OK ? CHARGED_OK : later_failed(x);
}

/* One refund of the event, inside its transaction: locked, decided and,
 * when it moves, moved with its transition and event. */
static enum charged_rc apply_refund(webhook_store_t *st, const struct webhook_event *ev,
                                    const struct webhook_refund *rf,
                                    struct webhook_store_result *out,
                                    struct charged_error *err)
{
    PGresult *r = NULL;
    char *evidence = NULL;
    char reason[256], actor[300];
    enum charged_rc rc = CHARGED_RETRY, x;
    struct webhook_refund_row row;
    struct webhook_refund_decision d;
    const char *lock[3] = {rf->refund_id[0] ? rf->refund_id : NULL, rf->id,
                           rf->payment_intent};

    if ((x = store_conn_exec(st->db,
                             rf->refund_id[0] ? SQL_LOCK_REFUND_BY_ID
                                              : SQL_LOCK_REFUND_BY_PROVIDER_ID,
                             3, lock, &r, err)) != CHARGED_OK) {
        rc = later_failed(x);
        goto out;
    }
    if (PQntuples(r) != 1) {
        refund_outcome(out, "unmatched", "no such refund");
        rc = CHARGED_OK;
        goto out;
    }
    memset(&row, 0, sizeof(row));
    char refund_id[37], old_status[20];
    snprintf(refund_id, sizeof(refund_id), "%s", PQgetvalue(r, 0, 0));
    snprintf(old_status, sizeof(old_status), "%s", PQgetvalue(r, 0, 3));
    if (!out->refund_id[0]) {
        snprintf(out->refund_id, sizeof(out->refund_id), "%s", refund_id);
        snprintf(out->attempt_id, sizeof(out->attempt_id), "%s", PQgetvalue(r, 0, 1));
        snprintf(out->order_id, sizeof(out->order_id), "%s", PQgetvalue(r, 0, 2));
        snprintf(out->old_status, sizeof(out->old_status), "%s", old_status);
        snprintf(out->new_status, sizeof(out->new_status), "%s", old_status);
    }
    row.status = (enum attempt_status)attempt_status_parse(old_status);
    row.amount = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
    snprintf(row.currency, sizeof(row.currency), "%s", PQgetvalue(r, 0, 5));
    row.intent_differs = PQgetvalue(r, 0, 6)[0] == 't';
    row.provider_id_differs = PQgetvalue(r, 0, 7)[0] == 't';
    row.provider_id_elsewhere = PQgetvalue(r, 0, 8)[0] == 't';
    row.provider_id_recorded = PQgetvalue(r, 0, 9)[0] == 't';
    PQclear(r);
    r = NULL;
    webhook_refund_decide(rf, &row, &d);
    if (d.check_now &&
        (x = check_now(st, SQL_REFUND_CHECK_NOW, refund_id, err)) != CHARGED_OK) {
        rc = x;
        goto out;
    }
    if (d.action != WEBHOOK_REFUND_APPLY) {
        refund_outcome(
            out, d.action == WEBHOOK_REFUND_NEEDS_REVIEW ? "needs_review" : "ignored",
            d.reason);
        rc = CHARGED_OK;
        goto out;
    }
    if (!(evidence = refund_evidence_json(ev, rf))) {
        charged_error_set(err, "out of memory");
        goto out;
    }
    refund_reason_for(rf, d.status, reason, sizeof(reason));
    snprintf(actor, sizeof(actor), "webhook %s", ev->id);
    const char *p[7] = {refund_id,
                        attempt_status_name(d.status),
                        reason[0] ? reason : NULL,
                        rf->id,
                        old_status,
                        actor,
                        evidence};
    if ((x = store_conn_exec(st->db, SQL_SETTLE_REFUND, 7, p, &r, err)) != CHARGED_OK) {
        rc = later_failed(x);
        goto out;
    }
    if (PQntuples(r) != 1) {
        /* Impossible under the row lock; never commit half a decision. */
        charged_error_set(err, "refund %s changed under its lock", refund_id);
        goto out;
    }
    if (!strcmp(out->refund_id, refund_id))
        snprintf(out->new_status, sizeof(out->new_status), "%s",
                 attempt_status_name(d.status));
    refund_outcome(out, "applied", d.reason);
    rc = CHARGED_OK;
out:
    PQclear(r);
    free(evidence);
    return rc;
}

/* Records the event as received, inside the open transaction: CHARGED_OK
 * and *fresh when it is new; CHARGED_OK alone when it was seen before and
 * committed (its effect is already there); else the failure. */
static enum charged_rc record_event(webhook_store_t *st, const char *provider,
                                    const struct webhook_event *ev, const char *payload,
                                    struct webhook_store_result *out, int *fresh,
                                    struct charged_error *err)
{
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

/* The attempt's locked row (SQL_LOCK_ATTEMPT) into out and *a. */
static void read_attempt_row(PGresult *r, struct webhook_store_result *out,
                             struct webhook_attempt *a)
{
    memset(a, 0, sizeof(*a));
    snprintf(out->attempt_id, sizeof(out->attempt_id), "%s", PQgetvalue(r, 0, 0));
    snprintf(out->order_id, sizeof(out->order_id), "%s", PQgetvalue(r, 0, 1));
    snprintf(out->old_status, sizeof(out->old_status), "%s", PQgetvalue(r, 0, 2));
    snprintf(out->new_status, sizeof(out->new_status), "%s", out->old_status);
    a->status = (enum attempt_status)attempt_status_parse(PQgetvalue(r, 0, 2));
    a->amount = strtoll(PQgetvalue(r, 0, 3), NULL, 10);
    snprintf(a->currency, sizeof(a->currency), "%s", PQgetvalue(r, 0, 4));
    a->updated_at = strtoll(PQgetvalue(r, 0, 5), NULL, 10);
    a->intent_differs = PQgetvalue(r, 0, 6)[0] == 't';
    a->intent_elsewhere = PQgetvalue(r, 0, 7)[0] == 't';
    a->order_has_other_live = PQgetvalue(r, 0, 8)[0] == 't';
    a->intent_recorded = PQgetvalue(r, 0, 9)[0] == 't';
}

/* Locks the attempt the event is about (by its metadata's id, else by its
 * intent) and decides what the event does to it, into *d and out. */
static enum charged_rc lock_and_decide(webhook_store_t *st,
                                       const struct webhook_event *ev,
                                       struct webhook_store_result *out,
                                       struct webhook_decision *d,
                                       struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc x;
    struct webhook_attempt a;
    const char *lock[3] = {ev->attempt_id[0] ? ev->attempt_id : NULL, ev->intent_id,
                           attempt_status_live_array()};
    if ((x = store_conn_exec(st->db,
                             ev->attempt_id[0] ? SQL_LOCK_BY_ID : SQL_LOCK_BY_INTENT, 3,
                             lock, &r, err)) != CHARGED_OK)
        return later_failed(x);
    if (ev->evidence == WEBHOOK_EVIDENCE_NONE) {
        out->outcome = "ignored";
        out->reason = "event type not acted on";
    } else if (PQntuples(r) == 1) {
        read_attempt_row(r, out, &a);
        webhook_event_decide(ev, &a, d);
        out->outcome = webhook_action_name(d->action);
        out->reason = d->reason;
    }
    PQclear(r);
    return CHARGED_OK;
}

/* Moves the locked attempt as decided, with its transition, ledger entry
 * and event. */
static enum charged_rc settle_attempt(webhook_store_t *st,
                                      const struct webhook_event *ev,
                                      const struct webhook_decision *d,
                                      struct webhook_store_result *out,
                                      struct charged_error *err)
{
    PGresult *r = NULL;
    char reason[256], actor[300];
    enum charged_rc rc = CHARGED_RETRY, x;
    char *evidence = evidence_json(ev);
    if (!evidence) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    reason_for(ev, d, reason, sizeof(reason));
    snprintf(actor, sizeof(actor), "webhook %s", ev->id);
    const char *p[8] = {out->attempt_id,
                        attempt_status_name(d->status),
                        reason[0] ? reason : NULL,
                        d->action == WEBHOOK_APPLY ? ev->intent_id : NULL,
                        attempt_status_event_type(d->status),
                        evidence,
                        out->old_status,
                        actor};
    if ((x = store_conn_exec(st->db, SQL_SETTLE, 8, p, &r, err)) != CHARGED_OK) {
        rc = later_failed(x);
    } else if (PQntuples(r) != 1) {
        /* Impossible under the row lock; never commit half a decision. */
        charged_error_set(err, "attempt %s changed under its lock", out->attempt_id);
    } else {
        snprintf(out->new_status, sizeof(out->new_status), "%s",
                 attempt_status_name(d->status));
        rc = CHARGED_OK;
    }
    PQclear(r);
    free(evidence);
    return rc;
}

/* An event about a charge: the attempt locked, decided and, when the
 * decision moves it, moved. */
static enum charged_rc apply_attempt(webhook_store_t *st,
                                     const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct charged_error *err)
{
    struct webhook_decision d = {WEBHOOK_IGNORE, ATTEMPT_STATUS_PENDING, "", 0};
    enum charged_rc rc = lock_and_decide(st, ev, out, &d, err);
    if (rc == CHARGED_OK && d.check_now)
        rc = check_now(st, SQL_CHECK_NOW, out->attempt_id, err);
    if (rc == CHARGED_OK && (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW))
        rc = settle_attempt(st, ev, &d, out, err);
    return rc;
}

/* An event about refunds: each of them, the worst outcome recorded. */
static enum charged_rc apply_refunds(webhook_store_t *st,
                                     const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    out->outcome = "ignored";
    out->reason = "the charge lists no refund";
    for (size_t i = 0; i < ev->nrefunds && rc == CHARGED_OK; i++)
        rc = apply_refund(st, ev, &ev->refunds[i], out, err);
    return rc;
}

/* Records the event's outcome and commits. */
static enum charged_rc finish(webhook_store_t *st, const char *provider,
                              const struct webhook_event *ev,
                              const struct webhook_store_result *out,
                              struct charged_error *err)
{
    enum charged_rc x;
    const char *o[5] = {provider, ev->id, out->outcome, out->attempt_id,
                        out->reason ? out->reason : ""};
    if ((x = store_conn_exec(st->db, SQL_EVENT_OUTCOME, 5, o, NULL, err)) !=
            CHARGED_OK ||
        (x = store_conn_exec(st->db, "COMMIT", 0, NULL, NULL, err)) != CHARGED_OK)
        return later_failed(x);
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
    enum charged_rc rc;
    int fresh = 0, committed = 0;

    charged_error_clear(err);
    memset(out, 0, sizeof(*out));
    out->outcome = "unmatched";
    out->reason = "no such attempt";
    if (store_conn_open(st->db, NULL, err) != CHARGED_OK)
        return CHARGED_RETRY;
    if ((rc = store_conn_exec(st->db, "BEGIN", 0, NULL, NULL, err)) != CHARGED_OK)
        return later_failed(rc);
    rc = record_event(st, provider, ev, payload, out, &fresh, err);
    if (rc == CHARGED_OK && fresh)
        rc = ev->evidence == WEBHOOK_EVIDENCE_REFUND ? apply_refunds(st, ev, out, err)
                                                     : apply_attempt(st, ev, out, err);
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
    return o;
}

static json_t *text_or_null(PGresult *r, int col)
{
    return PQgetisnull(r, 0, col) ? json_null() : json_string(PQgetvalue(r, 0, col));
}

/* The one row of SQL_VIEW_REFUND as the api's refund object. */
static json_t *refund_row(PGresult *r)
{
    json_t *o = json_object();
    if (!o)
        return NULL;
    /* json_object_set_new steals each value's reference. */
    json_object_set_new(o, "refund_id", json_string(PQgetvalue(r, 0, 0)));
    json_object_set_new(o, "payment_attempt_id", json_string(PQgetvalue(r, 0, 1)));
    json_object_set_new(o, "order_id", text_or_null(r, 2));
    json_object_set_new(o, "status", json_string(PQgetvalue(r, 0, 3)));
    json_object_set_new(o, "amount",
                        json_integer(strtoll(PQgetvalue(r, 0, 4), NULL, 10)));
    json_object_set_new(o, "currency", text_or_null(r, 5));
    json_object_set_new(o, "refund_reason", json_string(PQgetvalue(r, 0, 6)));
    json_object_set_new(o, "reason", text_or_null(r, 7));
    json_object_set_new(o, "provider_refund_id", text_or_null(r, 8));
    json_object_set_new(o, "updated_at", json_string(PQgetvalue(r, 0, 9)));
    return o;
}

/* Reads the rows of one id; a broken connection is replaced and the query
 * asked once more, as a webhook's transaction is. */
static enum charged_rc view(webhook_store_t *st, const char *sql, const char *id,
                            PGresult **res, struct charged_error *err)
{
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

enum charged_rc webhook_store_refund(webhook_store_t *st, const char *refund_id,
                                     json_t **out, struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc rc = view(st, SQL_VIEW_REFUND, refund_id, &r, err);
    *out = NULL;
    if (rc == CHARGED_OK && !(*out = refund_row(r))) {
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
