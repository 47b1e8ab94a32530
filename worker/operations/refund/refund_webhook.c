/* The refund's half of applying a provider's event (op.h's struct
 * op_webhook, for webhook_store): each refund the event names (refund.*,
 * and charge.refunded for each refund it lists) is found by its metadata
 * refund_id, else by its provider refund id, locked, decided
 * (webhook_refund_decide) and, when it moves, moved with its
 * refund_transitions row and its result event, inside the store's
 * transaction; the refund_attempts_money trigger applies the money. An
 * event of several refunds records the worst outcome of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "charged_assert.h"
#include "db.h"
#include "refund.h"
#include "refund_sql.h"
#include "webhook_apply.h"

/* clang-format off */
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

/* An UNKNOWN refund named by an object not proven its own: due for the
 * reconciler at once. */
static const char *SQL_REFUND_CHECK_NOW =
    "UPDATE refund_attempts SET next_check_at = least(next_check_at, now())"
    " WHERE id = $1::uuid AND status = " ATTEMPT_SQL(UNKNOWN);
/* clang-format on */

/* What a refund's transition records as the provider's evidence. */
static char *refund_evidence_json(const struct webhook_event *ev,
                                  const struct webhook_refund *r)
{
    CHARGED_ASSERT(ev && r);
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
    CHARGED_ASSERT(r && out && size > 0);
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

/* How bad an outcome is: an event of several refunds records its worst. */
static int outcome_rank(const char *o)
{
    CHARGED_ASSERT(o);
    static const char *order[] = {"ignored", "applied", "unproven", "unmatched",
                                  "needs_review"};
    for (int i = (int)(sizeof(order) / sizeof(order[0])) - 1; i >= 0; i--)
        if (!strcmp(o, order[i]))
            return i;
    return 0;
}

static void refund_outcome(struct webhook_store_result *out, const char *outcome,
                           const char *reason)
{
    CHARGED_ASSERT(out && outcome);
    if (out->refunds_seen++ == 0 ||
        outcome_rank(outcome) > outcome_rank(out->outcome)) {
        out->outcome = outcome;
        out->reason = reason;
    }
}

/* One refund of the event, inside its transaction: locked, decided and,
 * when it moves, moved with its transition and event. */
static enum charged_rc apply_refund(store_conn_t *db, const struct webhook_event *ev,
                                    const struct webhook_refund *rf,
                                    struct webhook_store_result *out,
                                    struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && rf && out);
    PGresult *r = NULL;
    char *evidence = NULL;
    char reason[256], actor[300];
    enum charged_rc rc = CHARGED_RETRY, x;
    struct webhook_refund_row row;
    struct webhook_refund_decision d;
    const char *lock[3] = {rf->refund_id[0] ? rf->refund_id : NULL, rf->id,
                           rf->payment_intent};

    if ((x = store_conn_exec(db,
                             rf->refund_id[0] ? SQL_LOCK_REFUND_BY_ID
                                              : SQL_LOCK_REFUND_BY_PROVIDER_ID,
                             3, lock, &r, err)) != CHARGED_OK) {
        rc = webhook_apply_later_failed(x);
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
    if (d.check_now && (x = webhook_apply_check_now(db, SQL_REFUND_CHECK_NOW, refund_id,
                                                    err)) != CHARGED_OK) {
        rc = x;
        goto out;
    }
    if (d.action != WEBHOOK_REFUND_APPLY) {
        refund_outcome(out,
                       d.action == WEBHOOK_REFUND_NEEDS_REVIEW ? "needs_review"
                       : d.action == WEBHOOK_REFUND_UNPROVEN   ? "unproven"
                                                               : "ignored",
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
    if ((x = store_conn_exec(db, SQL_SETTLE_REFUND, 7, p, &r, err)) != CHARGED_OK) {
        rc = webhook_apply_later_failed(x);
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

/* An event about refunds: each of them, the worst outcome recorded. */
static enum charged_rc apply_refunds(store_conn_t *db, const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && out);
    enum charged_rc rc = CHARGED_OK;
    out->outcome = "ignored";
    out->reason = "the charge lists no refund";
    for (size_t i = 0; i < ev->nrefunds && rc == CHARGED_OK; i++)
        rc = apply_refund(db, ev, &ev->refunds[i], out, err);
    /* Each refund decided once: the worst outcome is of those seen. */
    CHARGED_ASSERT(rc != CHARGED_OK || out->refunds_seen <= ev->nrefunds);
    return rc;
}

/* An event about refunds. */
static int refund_takes(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
    return ev->evidence == WEBHOOK_EVIDENCE_REFUND;
}

const struct op_webhook refund_webhook = {
    .takes = refund_takes,
    .apply = apply_refunds,
};
