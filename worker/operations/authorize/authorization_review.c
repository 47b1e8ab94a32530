#include "authorization_review.h"

#include <stdio.h>
#include <string.h>

#include "attempt_sql.h"
#include "attempt_store.h"
#include "authorization_steps.h"
#include "charged_assert.h"
#include "step_review.h"
#include "store_stmt.h"

/* clang-format off */
/* The authorization as a step of its own: its status twice, the intent
 * charged recorded, its amount; only an attempt of capture_method manual. */
static const char SQL_LOAD[] =
    "SELECT a.id, a.id, a.status, a.status, coalesce(a.provider_payment_id, ''), 0,"
    "  a.amount, a.held_by IS NOT NULL,"
    "  (a.lease_owner IS NOT NULL AND a.lease_expires_at > now()),"
    "  " SQL_STEP_KEY_AGE("payment_attempt_id", "a.id")
    " FROM payment_attempts a WHERE a.id = $1::uuid AND a.capture_method = 'manual'";

/* The move from review, its transition, its event, and a capture's ledger
 * row. $1 id, $2 status, $3 the attempt's reason, $4 actor, $5 captured
 * amount (SUCCEEDED), $6 evidence, $7 event type, $8 the transition's
 * reason. */
static const char *SQL_MOVE =
    "WITH lk AS ("
    "  SELECT id, status AS old_status FROM payment_attempts"
    "  WHERE id = $1::uuid AND status = " ATTEMPT_SQL(REQUIRES_REVIEW)
    "    AND capture_method = 'manual'"
    "    AND (lease_owner IS NULL OR lease_expires_at <= now())"
    "  FOR NO KEY UPDATE),"
    " u AS ("
    "  UPDATE payment_attempts a SET status = $2, reason = $3,"
    "    captured_amount = CASE WHEN $2 = " ATTEMPT_SQL(SUCCEEDED) " THEN $5::bigint"
    "      ELSE a.captured_amount END,"
    "    lease_owner = NULL, lease_expires_at = NULL, next_check_at = NULL,"
    "    updated_at = " SQL_CHANGED_AT("a")
    "  FROM lk WHERE a.id = lk.id"
    "  RETURNING a.id, a.order_id,"
    "    CASE WHEN a.status = " ATTEMPT_SQL(SUCCEEDED) " THEN a.captured_amount"
    "      ELSE a.amount END AS amount, a.currency, a.provider_payment_id, a.status,"
    "    a.reason, a.updated_at, lk.old_status, $7::text AS event_type),"
    " t AS ("
    "  INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
    "    cause, actor, reason, evidence, created_at)"
    "  SELECT id, old_status, status, 'operator', $4, $8, $6::jsonb, updated_at FROM u),"
    SQL_LEDGER_CHARGE("u") ","
    SQL_OUTBOX_EVENTS("u")
    "SELECT (SELECT count(*) FROM u), a.status, coalesce(a.held_by, 'no step')"
    " FROM payment_attempts a WHERE a.id = $1::uuid";
/* clang-format on */

const char *authorization_review_judge(const struct provider_result *r,
                                       enum attempt_status decision,
                                       const struct step_review_row *row, char *says,
                                       size_t size)
{
    CHARGED_ASSERT(r && row && says);
    const char *st = r->intent_status;
    long long got = r->amount_received;
    int nothing = got <= 0;
    int ok = 0;
    switch (decision) {
    case ATTEMPT_STATUS_SUCCEEDED:
        ok = !strcmp(st, "succeeded") && got >= 1 && got <= row->authorized;
        break;
    case ATTEMPT_STATUS_AUTHORIZED:
        ok = !strcmp(st, "requires_capture") && r->amount_capturable >= 1 && nothing;
        break;
    case ATTEMPT_STATUS_VOIDED:
        ok = !strcmp(st, "canceled") && nothing;
        break;
    default:
        CHARGED_ASSERT(decision == ATTEMPT_STATUS_FAILED);
        ok = (!strcmp(st, "requires_payment_method") || !strcmp(st, "canceled")) &&
             nothing;
        break;
    }
    if (ok)
        return "agrees";
    snprintf(
        says, size,
        "the provider says %s is %s (amount_received %lld, amount_capturable %lld, "
        "authorized %lld): not %s",
        row->payment_intent, st, got, r->amount_capturable, row->authorized,
        attempt_status_name(decision));
    return "contradicts";
}

/* The attempt's reason after the move: NULL when it holds or took money;
 * a released one's code (docs/messages.md), a failed one's the operator's. */
static void reason_of(const struct step_review_request *rq,
                      const struct provider_result *r, char *out, size_t size)
{
    if (rq->decision == ATTEMPT_STATUS_VOIDED)
        snprintf(out, size, "%s",
                 !strcmp(r->cancellation_reason, "automatic") ? "expired" : "voided");
    else if (rq->decision == ATTEMPT_STATUS_FAILED)
        snprintf(out, size, "%s", rq->reason);
    else
        out[0] = '\0';
}

/* The event of the move: the authorization's own (AUTHORIZED, FAILED);
 * a release is authorization.failed, as its expiry is; a capture none. */
static const char *event_of(enum attempt_status decision)
{
    if (decision == ATTEMPT_STATUS_VOIDED)
        return attempt_status_authorization_event_type(ATTEMPT_STATUS_FAILED);
    return attempt_status_authorization_event_type(decision);
}

static enum charged_rc authorization_review_write(store_conn_t *db,
                                                  const struct step_review_request *rq,
                                                  const struct step_review_row *row,
                                                  const struct provider_result *r,
                                                  const char *evidence, int *moved,
                                                  char *why, size_t why_size,
                                                  struct charged_error *err)
{
    CHARGED_ASSERT(db && rq && row && r && evidence && moved);
    char reason[STEP_REVIEW_MAX_REASON + 32];
    struct stmt s = {0};
    PGresult *res = NULL;
    /* Forced without the provider's figure: all that was authorized. */
    long long captured = r->amount_received >= 1 ? r->amount_received : row->authorized;
    CHARGED_ASSERT(rq->decision != ATTEMPT_STATUS_SUCCEEDED || captured >= 1);
    *moved = 0;
    reason_of(rq, r, reason, sizeof(reason));
    stmt_text(&s, row->id);
    stmt_text(&s, attempt_status_name(rq->decision));
    stmt_text(&s, reason[0] ? reason : NULL);
    stmt_text(&s, rq->actor);
    stmt_int(&s, captured);
    stmt_text(&s, evidence);
    stmt_text(&s, event_of(rq->decision));
    stmt_text(&s, rq->reason);
    enum charged_rc rc = stmt_run(db, &s, SQL_MOVE, &res, err);
    if (rc == CHARGED_OK && PQntuples(res) == 1) {
        *moved = stmt_col_int(res, 0, 0) == 1;
        snprintf(why, why_size, "authorization %s is %s (held by %s): it cannot be %s",
                 row->id, PQgetvalue(res, 0, 1), PQgetvalue(res, 0, 2),
                 attempt_status_name(rq->decision));
    }
    PQclear(res);
    stmt_release(&s);
    return rc;
}

/* An authorization is listed as the attempt it is, with the step that
 * holds it. */
/* clang-format off */
static const char SQL_AUTHORIZATION_LIST[] =
    "SELECT coalesce(json_agg(r), '[]')::text FROM (SELECT s.id AS payment_attempt_id,"
    " s.status, s.amount, s.currency, s.captured_amount,"
    " s.held_by || ' ' || s.held_by_id AS held_by, s.reason,"
    " " STEP_REVIEW_TS("s.updated_at") " AS updated_at FROM payment_attempts s"
    " WHERE s.capture_method = 'manual' AND ($1::text IS NULL OR s.status = $1)"
    " ORDER BY s.updated_at DESC, s.id LIMIT $2::int) r";
/* clang-format on */

static const char *const authorization_review_heads[] = STEP_REVIEW_LIST_HEADS;
static const char *const authorization_review_members[] =
    STEP_REVIEW_LIST_MEMBERS("payment_attempt_id");

static const struct step_review_choice authorization_choices[] = {
    {ATTEMPT_STATUS_SUCCEEDED, "the provider captured it"},
    {ATTEMPT_STATUS_AUTHORIZED, "still held"},
    {ATTEMPT_STATUS_VOIDED, "released"},
    {ATTEMPT_STATUS_FAILED, "never held"},
    {0, NULL},
};

const struct step_review_kind authorization_review_kind = {
    .noun = "authorization",
    .holder = "authorization",
    .holder_status_key = "authorization_status",
    .decisions = 1u << ATTEMPT_STATUS_SUCCEEDED | 1u << ATTEMPT_STATUS_AUTHORIZED |
                 1u << ATTEMPT_STATUS_VOIDED | 1u << ATTEMPT_STATUS_FAILED,
    .load_sql = SQL_LOAD,
    .log_calls_sql = attempt_store_log_calls_sql,
    .judge = authorization_review_judge,
    .write = authorization_review_write,
    .id_key = "payment_attempt_id",
    .summary = "list authorizations, resolve their reviews",
    .cli_rank = 2,
    .cli_asks = STEP_REVIEW_CLI_ASKS,
    .list_sql = SQL_AUTHORIZATION_LIST,
    .heads = authorization_review_heads,
    .members = authorization_review_members,
    .queue_sql =
        " SELECT 'authorization' AS kind, a.id, a.id AS payment_attempt_id, a.status,"
        "  a.amount, a.currency, a.status AS authorization_status, "
        "a.provider_payment_id,"
        "  a.reason, " STEP_REVIEW_TS(
            "a.updated_at") " AS updated_at"
                            " FROM payment_attempts a"
                            " WHERE a.status = 'REQUIRES_REVIEW' AND a.capture_method "
                            "= 'manual'",
    .attempts = 1,
    .choices = authorization_choices,
};
