#include "void_review.h"

#include <stdio.h>
#include <string.h>

#include "attempt_sql.h"
#include "authorization_steps.h"
#include "charged_assert.h"
#include "step_sql.h"
#include "store_stmt.h"
#include "void_store.h"

/* clang-format off */
/* The void, its authorization, and the intent charged recorded on it
 * (never metadata). */
static const char SQL_LOAD[] =
    "SELECT w.id, w.payment_attempt_id, w.status, coalesce(p.status, ''),"
    "  coalesce(p.provider_payment_id, w.payment_intent, ''), 0,"
    "  coalesce(p.amount, 0), w.holds,"
    "  (w.lease_owner IS NOT NULL AND w.lease_expires_at > now()),"
    "  " SQL_STEP_KEY_AGE("void_id", "w.id")
    " FROM void_attempts w LEFT JOIN payment_attempts p ON p.id = w.payment_attempt_id"
    " WHERE w.id = $1::uuid";

/* The void's move, after its authorization's (void_store_move_sql, in the
 * same transaction): SUCCEEDED only onto a VOIDED authorization while the
 * void holds it (the 0016 trigger's rule too), FAILED from review whatever
 * the authorization is. $1 id, $2 status, $3 reason, $4 actor, $5
 * evidence, $6 event type. */
static const char *SQL_MOVE =
    "WITH lk AS ("
    "  SELECT w.id, w.status AS old_status, p.amount AS authorized"
    "  FROM void_attempts w LEFT JOIN payment_attempts p ON p.id = w.payment_attempt_id"
    "  WHERE w.id = $1::uuid AND w.status = " ATTEMPT_SQL(REQUIRES_REVIEW)
    "    AND (w.lease_owner IS NULL OR w.lease_expires_at <= now())"
    "    AND ($2 <> " ATTEMPT_SQL(SUCCEEDED) " OR (w.holds"
    "      AND p.status = " ATTEMPT_SQL(VOIDED) "))"
    "  FOR NO KEY UPDATE OF w),"
    " u AS ("
    "  UPDATE void_attempts w SET status = $2,"
    "    reason = CASE WHEN $2 = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE $3 END,"
    "    released_amount = CASE WHEN $2 = " ATTEMPT_SQL(SUCCEEDED) " THEN lk.authorized"
    "      ELSE w.released_amount END,"
    "    lease_owner = NULL, lease_expires_at = NULL, next_check_at = NULL,"
    "    updated_at = " SQL_CHANGED_AT("w")
    "  FROM lk WHERE w.id = lk.id"
    "  RETURNING w.id, w.payment_attempt_id, w.order_id,"
    "    w.payment_intent AS provider_payment_id, w.status, w.reason, w.updated_at,"
    "    lk.old_status, $6::text AS event_type),"
    " t AS ("
    "  INSERT INTO void_transitions (void_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, old_status, status, 'operator', $4, $3, $5::jsonb, updated_at FROM u),"
    SQL_VOID_OUTBOX_EVENTS("u")
    "SELECT (SELECT count(*) FROM u), coalesce(p.status, 'unknown'), w.status, w.holds"
    " FROM void_attempts w LEFT JOIN payment_attempts p ON p.id = w.payment_attempt_id"
    " WHERE w.id = $1::uuid";
/* A look-up, written as a call of the void (step_sql.h). */
static const char SQL_LOG_CALLS[] = SQL_STEP_LOG_CALLS("void_attempts", "void_id");
/* clang-format on */

const char *void_review_judge(const struct provider_result *r,
                              enum attempt_status decision,
                              const struct step_review_row *row, char *says,
                              size_t size)
{
    CHARGED_ASSERT(r && row && says);
    int canceled = !strcmp(r->intent_status, "canceled");
    int expired = canceled && !strcmp(r->cancellation_reason, "automatic");
    if (decision == ATTEMPT_STATUS_SUCCEEDED) {
        if (canceled && !expired && r->amount_received <= 0)
            return "agrees";
        snprintf(says, size, "the provider says %s is %s%s%s (amount_received %lld)%s",
                 row->payment_intent, r->intent_status, canceled ? ", " : "",
                 r->cancellation_reason, r->amount_received,
                 expired ? ": its own expiry released it, not this void" : "");
        return "contradicts";
    }
    CHARGED_ASSERT(decision == ATTEMPT_STATUS_FAILED);
    if (!strcmp(r->intent_status, "requires_capture") || expired ||
        !strcmp(r->intent_status, "succeeded"))
        return "agrees";
    snprintf(says, size, "the provider says %s is %s%s%s: %s", row->payment_intent,
             r->intent_status, canceled ? ", " : "", r->cancellation_reason,
             canceled ? "released by a request" : "not settled");
    return "contradicts";
}

/* The void's reason: a FAILED void of a captured intent is
 * void_after_capture (void_store_move_sql then sends its authorization to
 * review), else the operator's. */
static void reason_of(const struct step_review_request *rq,
                      const struct provider_result *r, char *out, size_t size)
{
    if (rq->decision == ATTEMPT_STATUS_FAILED && !strcmp(r->intent_status, "succeeded"))
        snprintf(out, size, "void_after_capture: %s", rq->reason);
    else
        snprintf(out, size, "%s", rq->reason);
}

/* void_store_move_sql for this one void, cause operator. */
static enum charged_rc move_authorization(store_conn_t *db,
                                          const struct step_review_request *rq,
                                          const char *id, const char *reason,
                                          struct charged_error *err)
{
    struct stmt s = {0};
    int a = stmt_arrays(&s, 5);
    stmt_add(&s, a, id);
    stmt_add(&s, a + 1, NULL);
    stmt_add(&s, a + 2, attempt_status_name(ATTEMPT_STATUS_REQUIRES_REVIEW));
    stmt_add(&s, a + 3, attempt_status_name(rq->decision));
    stmt_add(&s, a + 4, reason);
    stmt_text(&s, rq->actor);
    stmt_text(&s, "operator");
    enum charged_rc rc = stmt_run(db, &s, void_store_move_sql, NULL, err);
    stmt_release(&s);
    return rc;
}

static enum charged_rc void_review_write(store_conn_t *db,
                                         const struct step_review_request *rq,
                                         const struct step_review_row *row,
                                         const struct provider_result *r,
                                         const char *evidence, int *moved, char *why,
                                         size_t why_size, struct charged_error *err)
{
    CHARGED_ASSERT(db && rq && row && r && evidence && moved);
    char reason[STEP_REVIEW_MAX_REASON + 32];
    struct stmt s = {0};
    PGresult *res = NULL;
    *moved = 0;
    reason_of(rq, r, reason, sizeof(reason));
    enum charged_rc rc = move_authorization(db, rq, row->id, reason, err);
    if (rc != CHARGED_OK)
        return rc;
    stmt_text(&s, row->id);
    stmt_text(&s, attempt_status_name(rq->decision));
    stmt_text(&s, reason);
    stmt_text(&s, rq->actor);
    stmt_text(&s, evidence);
    stmt_text(&s, void_store_event_type(rq->decision));
    rc = stmt_run(db, &s, SQL_MOVE, &res, err);
    if (rc == CHARGED_OK && PQntuples(res) == 1) {
        *moved = stmt_col_int(res, 0, 0) == 1;
        snprintf(
            why, why_size,
            "void %s is %s (holds its authorization: %s) and its authorization %s: "
            "it cannot be %s",
            row->id, PQgetvalue(res, 0, 2), stmt_col_true(res, 0, 3) ? "yes" : "no",
            PQgetvalue(res, 0, 1), attempt_status_name(rq->decision));
    }
    PQclear(res);
    stmt_release(&s);
    return rc;
}

static const char *const void_review_heads[] = STEP_REVIEW_LIST_HEADS;
static const char *const void_review_members[] = STEP_REVIEW_LIST_MEMBERS("void_id");

static const struct step_review_choice void_choices[] = {
    {ATTEMPT_STATUS_SUCCEEDED, "the provider released it"},
    {ATTEMPT_STATUS_FAILED, "it was not released"},
    {0, NULL},
};

const struct step_review_kind void_review_kind = {
    .noun = "void",
    .holder = "authorization",
    .holder_status_key = "authorization_status",
    .decisions = 1u << ATTEMPT_STATUS_SUCCEEDED | 1u << ATTEMPT_STATUS_FAILED,
    .load_sql = SQL_LOAD,
    .log_calls_sql = SQL_LOG_CALLS,
    .judge = void_review_judge,
    .write = void_review_write,
    .id_key = "void_id",
    .summary = "list voids, resolve their reviews",
    .cli_rank = 1,
    .cli_asks = STEP_REVIEW_CLI_ASKS,
    .list_sql = STEP_REVIEW_LIST_SQL("void_attempts", "void_id",
                                     "coalesce(s.released_amount, p.amount)"),
    .heads = void_review_heads,
    .members = void_review_members,
    .queue_sql = " SELECT 'void' AS kind, w.id, w.payment_attempt_id, w.status, "
                 "p.amount AS amount,"
                 "  p.currency, p.status AS authorization_status, "
                 "p.provider_payment_id, w.reason,"
                 "  " STEP_REVIEW_TS(
                     "w.updated_at") " AS updated_at"
                                     " FROM void_attempts w LEFT JOIN payment_attempts "
                                     "p ON p.id = w.payment_attempt_id"
                                     " WHERE w.status = 'REQUIRES_REVIEW'",
    .choices = void_choices,
};
