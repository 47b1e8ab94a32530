/* The void's half of applying a provider's event (op.h's struct
 * op_webhook, for webhook_store): payment_intent.canceled of a manual
 * intent whose cancellation_reason is not "automatic" (the provider's own
 * expiry is the authorization's event, authorize's half).
 *
 * Only the intent charged recorded for an authorization settles anything
 * (ownership.h): the void that holds that authorization, UNKNOWN or
 * PROCESSING, becomes SUCCEEDED and the attempt VOIDED, in the store's
 * transaction, with the transitions and void.succeeded, as the worker's
 * and the reconciler's settlement (void_store_move_sql). A duplicate, or
 * the event of a void settled already, is a no-op; an intent that merely
 * names one of our attempts in its metadata settles nothing (flagged,
 * foreign_intent, for the auditor). A cancel of our AUTHORIZED intent with
 * no void of ours holding it (another client of the account canceled it)
 * will be settled by no step of ours: the money is no longer held for the
 * order, so the authorization is VOIDED `canceled_elsewhere: <reason>` and
 * published authorization.failed, as the provider's expiry is (the
 * payment attempt's move, attempt_webhook.h); the order may then
 * authorize again. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_sql.h"
#include "attempt_webhook.h"
#include "charged_assert.h"
#include "void.h"
#include "webhook_apply.h"

/* clang-format off */
/* The authorization whose recorded intent is $1, locked until the commit.
 * Alone: a row joined to it would be read as of before a wait for the
 * lock (READ COMMITTED re-reads only the locked row). */
static const char *SQL_LOCK =
    "SELECT p.id, coalesce(p.order_id::text, ''), p.status"
    " FROM payment_attempts p"
    " WHERE p.provider_payment_id = $1 AND p.capture_method = 'manual'"
    " FOR NO KEY UPDATE OF p";

/* The void holding the locked authorization $1, read after the lock and
 * locked without waiting: the worker moving it locks the void before the
 * authorization (void_store_move_sql), so waiting here would be a
 * deadlock; locked is being settled, and the event is delivered again
 * (lock_not_available: CHARGED_WAIT, not stored). */
static const char *SQL_HOLDER =
    "SELECT w.id, w.status FROM payment_attempts p"
    " JOIN void_attempts w ON w.id = p.held_by_id AND p.held_by = 'void'"
    "   AND w.payment_intent = p.provider_payment_id"
    " WHERE p.id = $1::uuid FOR NO KEY UPDATE OF w NOWAIT";

/* Does an attempt of ours exist that the event's metadata names? */
static const char *SQL_NAMED =
    "SELECT 1 FROM payment_attempts WHERE id = $1::uuid";

/* The void's success, once its authorization is VOIDED (the move before
 * it): lease ended and its epoch bumped, as a refund's webhook does. */
static const char *SQL_SETTLE =
    "WITH u AS ("
    "  UPDATE void_attempts w SET status = " ATTEMPT_SQL(SUCCEEDED) ", reason = NULL,"
    "    released_amount = (SELECT amount FROM payment_attempts a"
    "      WHERE a.id = w.payment_attempt_id),"
    "    lease_owner = NULL, lease_expires_at = NULL, lease_epoch = w.lease_epoch + 1,"
    "    next_check_at = NULL, updated_at = " SQL_CHANGED_AT("w")
    "  WHERE w.id = $1::uuid AND w.status = $2"
    "  RETURNING w.id, w.payment_attempt_id, w.order_id,"
    "    w.payment_intent AS provider_payment_id, w.status, w.reason, w.updated_at,"
    "    'void.succeeded'::text AS event_type),"
    " t AS ("
    "  INSERT INTO void_transitions (void_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, $2, status, 'webhook', $3, 'payment_intent.canceled', $4::jsonb,"
    "    updated_at FROM u),"
    SQL_VOID_OUTBOX_EVENTS("u")
    "SELECT id FROM u";
/* clang-format on */

static int void_takes(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
    return !strcmp(ev->type, "payment_intent.canceled") &&
           !strcmp(ev->capture_method, "manual") &&
           strcmp(ev->cancellation_reason, "automatic") != 0;
}

/* No authorization of ours recorded the event's intent: a foreign intent
 * when its metadata names an attempt of ours, else unmatched. */
static enum charged_rc not_recorded(store_conn_t *db, const struct webhook_event *ev,
                                    struct webhook_store_result *out,
                                    struct charged_error *err)
{
    PGresult *r = NULL;
    const char *p[1] = {ev->attempt_id};
    out->outcome = "unmatched";
    out->reason = "no authorization of ours recorded this intent";
    if (!ev->attempt_id[0])
        return CHARGED_OK;
    enum charged_rc rc = store_conn_exec(db, SQL_NAMED, 1, p, &r, err);
    if (rc == CHARGED_OK && PQntuples(r) == 1) {
        out->outcome = "flagged";
        out->reason = "foreign_intent: a canceled intent names the attempt; not ours, "
                      "settles nothing";
        snprintf(out->attempt_id, sizeof(out->attempt_id), "%s", ev->attempt_id);
    }
    PQclear(r);
    return rc == CHARGED_OK ? CHARGED_OK : webhook_apply_later_failed(rc);
}

/* The void `id`, `from` UNKNOWN or PROCESSING, settled SUCCEEDED with its
 * authorization VOIDED. */
static enum charged_rc settle(store_conn_t *db, const struct webhook_event *ev,
                              const char *id, const char *from,
                              struct charged_error *err)
{
    char actor[300];
    PGresult *r = NULL;
    CHARGED_ASSERT(db && ev && id && from);
    snprintf(actor, sizeof(actor), "webhook %s", ev->id);
    json_t *e = json_pack("{s:s, s:s, s:s}", "webhook_event_id", ev->id, "type",
                          ev->type, "provider_payment_id", ev->intent_id);
    char *evidence = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    if (!evidence) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    const char *move[7] = {NULL,     "{NULL}", NULL,     "{SUCCEEDED}",
                           "{NULL}", actor,    "webhook"};
    char ids[48], froms[32];
    snprintf(ids, sizeof(ids), "{%s}", id);
    snprintf(froms, sizeof(froms), "{%s}", from);
    move[0] = ids;
    move[2] = froms;
    enum charged_rc rc = store_conn_exec(db, void_store_move_sql, 7, move, NULL, err);
    const char *p[4] = {id, from, actor, evidence};
    if (rc == CHARGED_OK)
        rc = store_conn_exec(db, SQL_SETTLE, 4, p, &r, err);
    if (rc == CHARGED_OK && PQntuples(r) != 1) {
        /* Impossible under the row lock; never commit half a decision. */
        charged_error_set(err, "void %s changed under its lock", id);
        rc = CHARGED_RETRY;
    }
    PQclear(r);
    free(evidence);
    return rc == CHARGED_OK ? CHARGED_OK : webhook_apply_later_failed(rc);
}

/* Our AUTHORIZED intent canceled with no void of ours holding it: VOIDED,
 * its reason naming the cancellation, published as the authorization's
 * failure (the money no longer held for the order). A capture holding it
 * loses its hold, as on the expiry; its call then fails (voided). */
static enum charged_rc canceled_elsewhere(store_conn_t *db,
                                          const struct webhook_event *ev,
                                          struct webhook_store_result *out,
                                          struct charged_error *err)
{
    char reason[160];
    const struct webhook_decision d = {WEBHOOK_APPLY, ATTEMPT_STATUS_VOIDED, "", 0};
    CHARGED_ASSERT(!strcmp(out->old_status, ATTEMPT_S_AUTHORIZED));
    snprintf(reason, sizeof(reason), "canceled_elsewhere: %s",
             ev->cancellation_reason[0] ? ev->cancellation_reason : "no reason");
    enum charged_rc rc = attempt_webhook_move(
        db, ev, &d, reason,
        attempt_status_authorization_event_type(ATTEMPT_STATUS_FAILED), out, err);
    if (rc == CHARGED_OK) {
        out->outcome = "applied";
        out->reason = "our recorded intent canceled by no void of ours: the "
                      "authorization VOIDED";
    }
    return rc;
}

static enum charged_rc void_apply(store_conn_t *db, const struct webhook_event *ev,
                                  struct webhook_store_result *out,
                                  struct charged_error *err)
{
    PGresult *r = NULL;
    const char *p[1] = {ev->intent_id};
    char void_id[37], from[20];
    CHARGED_ASSERT(db && ev && out);
    enum charged_rc rc = store_conn_exec(db, SQL_LOCK, 1, p, &r, err);
    if (rc != CHARGED_OK)
        return webhook_apply_later_failed(rc);
    if (PQntuples(r) != 1) {
        PQclear(r);
        return not_recorded(db, ev, out, err);
    }
    snprintf(out->attempt_id, sizeof(out->attempt_id), "%s", PQgetvalue(r, 0, 0));
    snprintf(out->order_id, sizeof(out->order_id), "%s", PQgetvalue(r, 0, 1));
    snprintf(out->old_status, sizeof(out->old_status), "%s", PQgetvalue(r, 0, 2));
    snprintf(out->new_status, sizeof(out->new_status), "%s", PQgetvalue(r, 0, 2));
    PQclear(r);
    r = NULL;
    const char *a[1] = {out->attempt_id};
    if ((rc = store_conn_exec(db, SQL_HOLDER, 1, a, &r, err)) != CHARGED_OK)
        return webhook_apply_later_failed(rc);
    void_id[0] = from[0] = '\0';
    if (PQntuples(r) == 1) {
        snprintf(void_id, sizeof(void_id), "%s", PQgetvalue(r, 0, 0));
        snprintf(from, sizeof(from), "%s", PQgetvalue(r, 0, 1));
    }
    PQclear(r);
    if (!void_id[0] && !strcmp(out->old_status, ATTEMPT_S_AUTHORIZED))
        return canceled_elsewhere(db, ev, out, err);
    out->outcome = "ignored";
    out->reason = void_id[0] ? "the void holding the authorization is settled already"
                             : "no void of ours holds the authorization";
    if (strcmp(from, ATTEMPT_S_UNKNOWN) != 0 && strcmp(from, ATTEMPT_S_PROCESSING) != 0)
        return CHARGED_OK;
    if ((rc = settle(db, ev, void_id, from, err)) != CHARGED_OK)
        return rc;
    out->outcome = "applied";
    out->reason = "our recorded intent canceled: the void that holds it succeeded";
    snprintf(out->new_status, sizeof(out->new_status), "%s", ATTEMPT_S_VOIDED);
    /* Applied only on our own recorded intent, to the void that holds it. */
    CHARGED_ASSERT(void_id[0] && out->attempt_id[0]);
    return CHARGED_OK;
}

const struct op_webhook void_webhook = {
    .takes = void_takes,
    .apply = void_apply,
};
