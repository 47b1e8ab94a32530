#include "capture_review.h"

#include <stdio.h>
#include <string.h>

#include "capture_sql.h"
#include "capture_store.h"
#include "authorization_steps.h"
#include "charged_assert.h"
#include "step_sql.h"
#include "store_stmt.h"

/* clang-format off */
/* The capture, its authorization, and the intent charged recorded on it
 * (never metadata). */
static const char SQL_LOAD[] =
    "SELECT c.id, c.payment_attempt_id, c.status, coalesce(p.status, ''),"
    "  coalesce(p.provider_payment_id, c.payment_intent, ''), coalesce(c.amount, 0),"
    "  coalesce(p.amount, 0), c.holds,"
    "  (c.lease_owner IS NOT NULL AND c.lease_expires_at > now()),"
    "  " SQL_STEP_KEY_AGE("capture_id", "c.id")
    " FROM capture_attempts c LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id"
    " WHERE c.id = $1::uuid";

/* The capture's move, after its authorization's (capture_store_book, in
 * the same transaction): SUCCEEDED only onto an authorization booked with
 * this amount and while the capture holds it (the 0016 trigger's rule too),
 * FAILED from review whatever the authorization is. $1 id, $2 status, $3
 * reason, $4 actor, $5 amount captured, $6 evidence, $7 event type. */
static const char *SQL_MOVE =
    "WITH lk AS ("
    "  SELECT c.id, c.status AS old_status, p.amount AS authorized"
    "  FROM capture_attempts c LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id"
    "  WHERE c.id = $1::uuid AND c.status = " ATTEMPT_SQL(REQUIRES_REVIEW)
    "    AND (c.lease_owner IS NULL OR c.lease_expires_at <= now())"
    "    AND ($2 <> " ATTEMPT_SQL(SUCCEEDED) " OR (c.holds"
    "      AND p.status = " ATTEMPT_SQL(SUCCEEDED) " AND p.captured_amount = $5::bigint))"
    "  FOR NO KEY UPDATE OF c),"
    " u AS ("
    "  UPDATE capture_attempts c SET status = $2,"
    "    reason = CASE WHEN $2 = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE $3 END,"
    "    captured_amount = CASE WHEN $2 = " ATTEMPT_SQL(SUCCEEDED) " THEN $5::bigint"
    "      ELSE c.captured_amount END,"
    "    lease_owner = NULL, lease_expires_at = NULL, next_check_at = NULL,"
    "    updated_at = " SQL_CHANGED_AT("c")
    "  FROM lk WHERE c.id = lk.id"
    "  RETURNING c.id, c.payment_attempt_id, c.order_id,"
    "    " SQL_CAPTURE_AMOUNT("c", "lk.authorized") " AS amount, c.currency,"
    "    c.payment_intent, c.status, c.reason, c.updated_at, lk.old_status,"
    "    $7::text AS event_type),"
    " t AS ("
    "  INSERT INTO capture_transitions (capture_id, old_status, new_status, cause, actor,"
    "    reason, evidence, created_at)"
    "  SELECT id, old_status, status, 'operator', $4, $3, $6::jsonb, updated_at FROM u),"
    SQL_CAPTURE_OUTBOX_EVENTS("u")
    "SELECT (SELECT count(*) FROM u), coalesce(p.status, 'unknown'),"
    "  coalesce(p.captured_amount::text, 'nothing'), c.status, c.holds"
    " FROM capture_attempts c LEFT JOIN payment_attempts p ON p.id = c.payment_attempt_id"
    " WHERE c.id = $1::uuid";
/* A look-up, written as a call of the capture (step_sql.h). */
static const char SQL_LOG_CALLS[] = SQL_STEP_LOG_CALLS("capture_attempts", "capture_id");
/* clang-format on */

const char *capture_review_judge(const struct provider_result *r,
                                 enum attempt_status decision,
                                 const struct step_review_row *row, char *says,
                                 size_t size)
{
    CHARGED_ASSERT(r && row && says);
    long long got = r->amount_received;
    int captured = !strcmp(r->intent_status, "succeeded");
    if (decision == ATTEMPT_STATUS_SUCCEEDED) {
        if (!captured)
            snprintf(says, size, "the provider says %s is %s, not captured",
                     row->payment_intent, r->intent_status);
        else if (got < 1 || (row->asked > 0 && got != row->asked) ||
                 got > row->authorized)
            snprintf(says, size,
                     "the provider says %s received %lld; the capture asked %lld of "
                     "%lld authorized",
                     row->payment_intent, got, row->asked, row->authorized);
        else
            return "agrees";
        return "contradicts";
    }
    CHARGED_ASSERT(decision == ATTEMPT_STATUS_FAILED);
    if ((!strcmp(r->intent_status, "requires_capture") ||
         !strcmp(r->intent_status, "canceled")) &&
        got <= 0)
        return "agrees";
    snprintf(says, size, "the provider says %s is %s (amount_received %lld): money %s",
             row->payment_intent, r->intent_status, got,
             captured ? "was captured" : "may still be captured");
    return "contradicts";
}

/* What the capture books: what the provider received, or (forced without
 * it) what the capture asked, else all that was authorized. */
static long long amount_of(const struct step_review_row *row,
                           const struct provider_result *r)
{
    if (r->amount_received >= 1)
        return r->amount_received;
    return row->asked > 0 ? row->asked : row->authorized;
}

static enum charged_rc capture_review_write(store_conn_t *db,
                                            const struct step_review_request *rq,
                                            const struct step_review_row *row,
                                            const struct provider_result *r,
                                            const char *evidence, int *moved, char *why,
                                            size_t why_size, struct charged_error *err)
{
    CHARGED_ASSERT(db && rq && row && r && evidence && moved);
    long long amount = amount_of(row, r);
    enum charged_rc rc = CHARGED_OK;
    size_t booked = 0;
    struct stmt s = {0};
    PGresult *res = NULL;
    *moved = 0;
    if (rq->decision == ATTEMPT_STATUS_SUCCEEDED && amount >= 1) {
        const struct capture_booking b = {
            row->id, -1, amount, attempt_status_name(ATTEMPT_STATUS_REQUIRES_REVIEW)};
        rc = capture_store_book(db, rq->actor, "operator", &b, 1, &booked, err);
    }
    if (rc != CHARGED_OK)
        return rc;
    stmt_text(&s, row->id);
    stmt_text(&s, attempt_status_name(rq->decision));
    stmt_text(&s, rq->reason);
    stmt_text(&s, rq->actor);
    stmt_int(&s, amount);
    stmt_text(&s, evidence);
    stmt_text(&s, capture_status_event_type(rq->decision));
    rc = stmt_run(db, &s, SQL_MOVE, &res, err);
    if (rc == CHARGED_OK && PQntuples(res) == 1) {
        *moved = stmt_col_int(res, 0, 0) == 1;
        snprintf(why, why_size,
                 "capture %s is %s (holds its authorization: %s) and its authorization "
                 "%s (captured %s): it cannot be %s as this capture's %lld",
                 row->id, PQgetvalue(res, 0, 3),
                 stmt_col_true(res, 0, 4) ? "yes" : "no", PQgetvalue(res, 0, 1),
                 PQgetvalue(res, 0, 2), attempt_status_name(rq->decision), amount);
    }
    PQclear(res);
    stmt_release(&s);
    return rc;
}

static const char *const capture_review_heads[] = STEP_REVIEW_LIST_HEADS;
static const char *const capture_review_members[] =
    STEP_REVIEW_LIST_MEMBERS("capture_id");

static const struct step_review_choice capture_choices[] = {
    {ATTEMPT_STATUS_SUCCEEDED, "the provider captured it"},
    {ATTEMPT_STATUS_FAILED, "nothing was captured"},
    {0, NULL},
};

const struct step_review_kind capture_review_kind = {
    .noun = "capture",
    .holder = "authorization",
    .holder_status_key = "authorization_status",
    .decisions = 1u << ATTEMPT_STATUS_SUCCEEDED | 1u << ATTEMPT_STATUS_FAILED,
    .load_sql = SQL_LOAD,
    .log_calls_sql = SQL_LOG_CALLS,
    .judge = capture_review_judge,
    .write = capture_review_write,
    .id_key = "capture_id",
    .summary = "list captures, resolve their reviews",
    .cli_rank = 0,
    .cli_asks = STEP_REVIEW_CLI_ASKS,
    .list_sql = STEP_REVIEW_LIST_SQL("capture_attempts", "capture_id",
                                     "coalesce(s.captured_amount, s.amount, p.amount)"),
    .heads = capture_review_heads,
    .members = capture_review_members,
    .queue_sql =
        " SELECT 'capture' AS kind, c.id, c.payment_attempt_id, c.status,"
        "  coalesce(c.captured_amount, c.amount, p.amount) AS amount, p.currency,"
        "  p.status AS authorization_status, p.provider_payment_id, c.reason,"
        "  " STEP_REVIEW_TS(
            "c.updated_at") " AS updated_at"
                            " FROM capture_attempts c LEFT JOIN payment_attempts p ON "
                            "p.id = c.payment_attempt_id"
                            " WHERE c.status = 'REQUIRES_REVIEW'",
    .choices = capture_choices,
};
