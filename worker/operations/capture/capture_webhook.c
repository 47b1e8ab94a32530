/* The capture's half of applying a provider's event (op.h's struct
 * op_webhook, for webhook_store): payment_intent.succeeded of a manual
 * intent is a capture done. It applies only to the capture that holds (or
 * holds captured) the authorization whose intent we recorded
 * (payment_attempts.provider_payment_id): an intent not recorded as ours
 * never settles anything, whatever its metadata names. An UNKNOWN or
 * PROCESSING capture is booked and moved to SUCCEEDED as the worker's
 * answer would (capture_store_book, then the capture with its transition
 * and event), inside the store's transaction, only when the intent received
 * exactly what the capture asked (all is the authorization's amount,
 * resolved at the capture's claim): money moved once, for what we asked,
 * on our own intent, so it is our capture's even if another key took it.
 * Another amount is no capture of ours: the capture goes to
 * REQUIRES_REVIEW, keeping the hold, nothing booked. One already
 * SUCCEEDED is a duplicate, changed by nothing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_status.h"
#include "capture.h"
#include "capture_sql.h"
#include "capture_store.h"
#include "charged_assert.h"
#include "webhook_apply.h"

/* clang-format off */
/* The authorization of our recorded intent $1, locked until the commit.
 * Alone: a row joined to it here would be read as of before a wait for
 * the lock (READ COMMITTED re-reads only the locked row), so a capture
 * a worker or another delivery settled meanwhile would look unsettled
 * and its hold released under it. */
static const char *SQL_LOCK =
    "SELECT p.id, coalesce(p.order_id::text, '')"
    " FROM payment_attempts p"
    " WHERE p.provider_payment_id = $1 AND p.capture_method = 'manual'"
    " FOR NO KEY UPDATE OF p";

/* The capture that holds the locked authorization $1 (or captured it), in
 * a statement of its own: seen as whoever held the lock left it. Locked
 * too, without waiting: a worker booking it locks the capture before the
 * authorization, so waiting here for it would be a deadlock; locked is
 * being settled, and the event is delivered again (lock_not_available:
 * not stored, 503). */
static const char *SQL_HOLDER =
    "SELECT c.id, c.status FROM payment_attempts p JOIN capture_attempts c"
    "  ON c.payment_attempt_id = p.id AND c.holds"
    "  AND (p.held_by_id = c.id OR c.status = " ATTEMPT_SQL(SUCCEEDED) ")"
    " WHERE p.id = $1::uuid"
    " ORDER BY c.status = " ATTEMPT_SQL(SUCCEEDED) " DESC, c.id LIMIT 1"
    " FOR NO KEY UPDATE OF c NOWAIT";

/* The capture's success, after its authorization was booked: its lease is
 * ended and its epoch bumped, so that a worker or reconciler whose call is
 * still in flight is fenced out and finds it settled here. */
static const char *SQL_SETTLE =
    "WITH u AS ("
    "  UPDATE capture_attempts c SET status = " ATTEMPT_SQL(SUCCEEDED) ","
    "    captured_amount = $2::bigint, reason = NULL,"
    "    lease_owner = NULL, lease_expires_at = NULL, lease_epoch = c.lease_epoch + 1,"
    "    next_check_at = NULL, updated_at = " SQL_CHANGED_AT("c")
    "  WHERE c.id = $1::uuid AND c.status = $3"
    "  RETURNING c.id, c.payment_attempt_id, c.order_id, c.captured_amount AS amount,"
    "    c.currency, c.payment_intent, c.status, c.reason, c.updated_at,"
    "    'capture.succeeded'::text AS event_type),"
    " t AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, $3, status, 'webhook', $4, 'captured', $5::jsonb, updated_at FROM u),"
    SQL_CAPTURE_OUTBOX_EVENTS("u")
    "SELECT id FROM u";

/* The capture's review: the intent received another amount than it asked.
 * The hold stays (no void may release it, no other capture take it), its
 * lease ended and epoch bumped as SQL_SETTLE's. */
static const char *SQL_REVIEW =
    "WITH u AS ("
    "  UPDATE capture_attempts c SET status = " ATTEMPT_SQL(REQUIRES_REVIEW) ","
    "    reason = $2, lease_owner = NULL, lease_expires_at = NULL,"
    "    lease_epoch = c.lease_epoch + 1, next_check_at = NULL,"
    "    updated_at = " SQL_CHANGED_AT("c")
    "  WHERE c.id = $1::uuid AND c.status = $3"
    "  RETURNING c.id, c.payment_attempt_id, c.order_id,"
    "    " SQL_CAPTURE_AMOUNT("c", "(SELECT a.amount FROM payment_attempts a"
    "      WHERE a.id = c.payment_attempt_id)") " AS amount,"
    "    c.currency, c.payment_intent, c.status, c.reason, c.updated_at,"
    "    'capture.requires_review'::text AS event_type),"
    " t AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, $3, status, 'webhook', $4, reason, $5::jsonb, updated_at FROM u),"
    SQL_CAPTURE_OUTBOX_EVENTS("u")
    "SELECT id FROM u";
/* clang-format on */

static int capture_takes(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
    return !strcmp(ev->type, "payment_intent.succeeded") &&
           !strcmp(ev->capture_method, "manual");
}

/* What the transition records as the provider's evidence. Caller frees. */
static char *evidence_json(const struct webhook_event *ev)
{
    json_t *e =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:I}", "webhook_event_id", ev->id, "type",
                  ev->type, "created", (json_int_t)ev->created, "payment_intent",
                  ev->intent_id, "intent_status", ev->intent_status, "amount_received",
                  (json_int_t)ev->amount_received);
    char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return s;
}

static void said(struct webhook_store_result *out, const char *outcome,
                 const char *reason)
{
    out->outcome = outcome;
    out->reason = reason;
}

/* Runs SQL_SETTLE or SQL_REVIEW (p: capture_id, amount or reason,
 * old_status, actor, evidence), which must change the capture. */
static enum charged_rc settle_as(store_conn_t *db, const char *sql, const char *p[5],
                                 struct charged_error *err)
{
    PGresult *r = NULL;
    enum charged_rc rc = store_conn_exec(db, sql, 5, p, &r, err);
    if (rc == CHARGED_OK && PQntuples(r) != 1) {
        /* Impossible under the lock; never commit half a decision. */
        charged_error_set(err, "capture %s changed under its lock", p[0]);
        rc = CHARGED_RETRY;
    }
    PQclear(r);
    return rc;
}

/* The capture c of our intent, UNKNOWN or PROCESSING: booked and settled. */
static enum charged_rc settle(store_conn_t *db, const struct webhook_event *ev,
                              const char *capture_id, const char *old_status,
                              struct webhook_store_result *out,
                              struct charged_error *err)
{
    char actor[300], amount[24], why[400];
    size_t booked = 0;
    enum charged_rc rc;
    char *evidence = evidence_json(ev);
    const struct capture_booking b = {capture_id, -1, ev->amount_received, old_status};

    snprintf(actor, sizeof(actor), "webhook %s", ev->id);
    snprintf(amount, sizeof(amount), "%lld", ev->amount_received);
    if (!evidence) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    rc = capture_store_book(db, actor, "webhook", &b, 1, &booked, err);
    if (rc == CHARGED_OK && booked == 0) {
        /* Another amount than asked (another client's capture of our
         * intent), or past the authorization: never ours, a person. */
        snprintf(why, sizeof(why),
                 "requires_review: intent %s captured %lld, not what this capture "
                 "asked; not booked",
                 ev->intent_id, ev->amount_received);
        const char *p[5] = {capture_id, why, old_status, actor, evidence};
        if ((rc = settle_as(db, SQL_REVIEW, p, err)) == CHARGED_OK) {
            said(out, "review", "captured, but not as this capture asked");
            snprintf(out->new_status, sizeof(out->new_status), "%s",
                     ATTEMPT_S_REQUIRES_REVIEW);
        }
    } else if (rc == CHARGED_OK) {
        const char *p[5] = {capture_id, amount, old_status, actor, evidence};
        if ((rc = settle_as(db, SQL_SETTLE, p, err)) == CHARGED_OK) {
            said(out, "applied", "captured");
            snprintf(out->new_status, sizeof(out->new_status), "%s",
                     ATTEMPT_S_SUCCEEDED);
        }
    }
    free(evidence);
    return rc == CHARGED_OK ? rc : webhook_apply_later_failed(rc);
}

static enum charged_rc capture_apply(store_conn_t *db, const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && out);
    PGresult *r = NULL;
    const char *p[1] = {ev->intent_id};
    char capture_id[37], status[20];
    enum charged_rc rc = store_conn_exec(db, SQL_LOCK, 1, p, &r, err);

    if (rc != CHARGED_OK)
        return webhook_apply_later_failed(rc);
    if (PQntuples(r) != 1) {
        /* Not an intent we recorded: metadata is anyone's to write. */
        said(out, "unmatched", "foreign_intent: no authorization recorded this intent");
        PQclear(r);
        return CHARGED_OK;
    }
    snprintf(out->attempt_id, sizeof(out->attempt_id), "%s", PQgetvalue(r, 0, 0));
    snprintf(out->order_id, sizeof(out->order_id), "%s", PQgetvalue(r, 0, 1));
    PQclear(r);
    r = NULL;
    const char *a[1] = {out->attempt_id};
    if ((rc = store_conn_exec(db, SQL_HOLDER, 1, a, &r, err)) != CHARGED_OK)
        return webhook_apply_later_failed(rc);
    capture_id[0] = status[0] = '\0';
    if (PQntuples(r) == 1) {
        snprintf(capture_id, sizeof(capture_id), "%s", PQgetvalue(r, 0, 0));
        snprintf(status, sizeof(status), "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    snprintf(out->old_status, sizeof(out->old_status), "%s", status);
    snprintf(out->new_status, sizeof(out->new_status), "%s", status);
    if (!capture_id[0]) {
        said(out, "review", "captured, but no capture of ours holds the authorization");
        return CHARGED_OK;
    }
    if (!strcmp(status, ATTEMPT_S_SUCCEEDED)) {
        said(out, "ignored", "the capture is already SUCCEEDED");
        return CHARGED_OK;
    }
    if (strcmp(status, ATTEMPT_S_UNKNOWN) != 0 &&
        strcmp(status, ATTEMPT_S_PROCESSING) != 0) {
        said(out, "ignored", "the capture is settled");
        return CHARGED_OK;
    }
    if (ev->amount_received < 1) {
        said(out, "review", "succeeded without an amount received");
        return CHARGED_OK;
    }
    return settle(db, ev, capture_id, status, out, err);
}

const struct op_webhook capture_webhook = {
    .takes = capture_takes,
    .apply = capture_apply,
};
