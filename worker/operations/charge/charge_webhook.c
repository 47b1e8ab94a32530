/* The charge's half of applying a provider's event (op.h's struct
 * op_webhook, for webhook_store): an event about a charge locks the
 * attempt it names (by its metadata's id, else by its intent), decides
 * (webhook_event_decide) and, when the decision moves it, moves it with
 * its transition, ledger entry and event, inside the store's transaction.
 * The lock and the move are an authorization's too (attempt_webhook.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "attempt_webhook.h"
#include "charge.h"
#include "charged_assert.h"
#include "db.h"
#include "webhook_apply.h"

/* clang-format off */
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

/* An UNKNOWN attempt named by an object not proven its own: due for the
 * reconciler at once, whose call again under its own key proves what the
 * event cannot. */
static const char *SQL_CHECK_NOW =
    "UPDATE payment_attempts SET next_check_at = least(next_check_at, now())"
    " WHERE id = $1::uuid AND status = " ATTEMPT_SQL(UNKNOWN);
/* clang-format on */

/* What the transition records as the provider's evidence. Caller frees. */
static char *evidence_json(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
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
    /* An authorization's: what it holds, why it was canceled. */
    if (ev->amount_capturable >= 0)
        json_object_set_new(e, "amount_capturable",
                            json_integer(ev->amount_capturable));
    if (ev->cancellation_reason[0])
        json_object_set_new(e, "cancellation_reason",
                            json_string(ev->cancellation_reason));
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

/* The attempt's reason after the decision. */
static void reason_for(const struct webhook_event *ev, const struct webhook_decision *d,
                       char *out, size_t size)
{
    CHARGED_ASSERT(ev && d && out && size > 0);
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

/* The attempt's locked row (SQL_LOCK_ATTEMPT) into out and *a. */
static void read_attempt_row(PGresult *r, struct webhook_store_result *out,
                             struct webhook_attempt *a)
{
    CHARGED_ASSERT(r && out && a);
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

enum charged_rc attempt_webhook_lock(store_conn_t *db, const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct webhook_attempt *a, int *found,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && out && a && found);
    PGresult *r = NULL;
    enum charged_rc x;
    const char *lock[3] = {ev->attempt_id[0] ? ev->attempt_id : NULL, ev->intent_id,
                           attempt_status_live_array()};
    *found = 0;
    if ((x = store_conn_exec(db,
                             ev->attempt_id[0] ? SQL_LOCK_BY_ID : SQL_LOCK_BY_INTENT, 3,
                             lock, &r, err)) != CHARGED_OK)
        return webhook_apply_later_failed(x);
    if (PQntuples(r) == 1) {
        read_attempt_row(r, out, a);
        *found = 1;
    }
    PQclear(r);
    return CHARGED_OK;
}

enum charged_rc attempt_webhook_check_now(store_conn_t *db, const char *attempt_id,
                                          struct charged_error *err)
{
    return webhook_apply_check_now(db, SQL_CHECK_NOW, attempt_id, err);
}

enum charged_rc attempt_webhook_move(store_conn_t *db, const struct webhook_event *ev,
                                     const struct webhook_decision *d,
                                     const char *reason, const char *event_type,
                                     struct webhook_store_result *out,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && d && out);
    /* Only a decision that moves the attempt is written. */
    CHARGED_ASSERT(d->action == WEBHOOK_APPLY || d->action == WEBHOOK_REVIEW);
    PGresult *r = NULL;
    char actor[300];
    enum charged_rc rc = CHARGED_RETRY, x;
    char *evidence = evidence_json(ev);
    if (!evidence) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    snprintf(actor, sizeof(actor), "webhook %s", ev->id);
    const char *p[8] = {out->attempt_id,
                        attempt_status_name(d->status),
                        reason && reason[0] ? reason : NULL,
                        d->action == WEBHOOK_APPLY ? ev->intent_id : NULL,
                        event_type,
                        evidence,
                        out->old_status,
                        actor};
    if ((x = store_conn_exec(db, SQL_SETTLE, 8, p, &r, err)) != CHARGED_OK) {
        rc = webhook_apply_later_failed(x);
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
 * decision moves it, moved. A hold is an authorization's evidence, not a
 * charge's: as today's events of other types, not acted on. */
static enum charged_rc apply_attempt(store_conn_t *db, const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && out);
    struct webhook_decision d = {WEBHOOK_IGNORE, ATTEMPT_STATUS_PENDING, "", 0};
    struct webhook_attempt a;
    char reason[256];
    int found = 0;
    if (ev->evidence == WEBHOOK_EVIDENCE_NONE ||
        ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED) {
        out->outcome = "ignored";
        out->reason = "event type not acted on";
        return CHARGED_OK;
    }
    enum charged_rc rc = attempt_webhook_lock(db, ev, out, &a, &found, err);
    if (rc != CHARGED_OK || !found)
        return rc;
    webhook_event_decide(ev, &a, &d);
    out->outcome = webhook_action_name(d.action);
    out->reason = d.reason;
    if (d.check_now)
        rc = attempt_webhook_check_now(db, out->attempt_id, err);
    if (rc == CHARGED_OK && (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW)) {
        reason_for(ev, &d, reason, sizeof(reason));
        rc = attempt_webhook_move(db, ev, &d, reason,
                                  attempt_status_event_type(d.status), out, err);
    }
    return rc;
}

/* An event about a charge: every event but a refund's and an
 * authorization's (a manual intent's, or its hold): a hold is not money
 * taken, and those events are the authorize, capture and void
 * operations' (op.h's table). */
static int charge_takes(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
    return ev->evidence != WEBHOOK_EVIDENCE_REFUND &&
           ev->evidence != WEBHOOK_EVIDENCE_AUTHORIZED &&
           strcmp(ev->capture_method, "manual") != 0;
}

const struct op_webhook charge_webhook = {
    .takes = charge_takes,
    .apply = apply_attempt,
};
