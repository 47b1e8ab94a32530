/* An authorization's captures in its attempt's story (op.h's history,
 * attempt_history.h): `chargectl attempt show` and the console's
 * timeline. */
#include "capture.h"

#include "attempt_history.h"

#define TS(col) ATTEMPT_HISTORY_TS(col)

/* clang-format off */
static const char SQL_CAPTURES[] =
    "SELECT coalesce(json_agg(k ORDER BY k.c, k.capture_id), '[]')::text FROM (SELECT"
    " x.id AS capture_id, x.status, x.amount, x.captured_amount, x.currency, x.reason,"
    " x.idempotency_key, x.payment_intent, x.holds, " TS("x.created_at") " AS created_at,"
    " " TS("x.updated_at") " AS updated_at, x.created_at AS c,"
    ATTEMPT_HISTORY_STEP_TRANSITIONS("capture_transitions", "capture_id")
    " FROM capture_attempts x WHERE x.payment_attempt_id = $1::uuid) k";

static const char SQL_TIMELINE[] =
    ATTEMPT_HISTORY_TIMELINE_PART("'capture'", "t.capture_id", "capture_transitions",
                                  "JOIN capture_attempts x ON x.id = t.capture_id"
                                  " WHERE x.payment_attempt_id = $1::uuid");
/* clang-format on */

static const char *const capture_history_heads[] = {"CAPTURED", NULL};
static const char *const capture_history_members[] = {"captured_amount@currency", NULL};

static const char *const capture_history_reasons[] = {"reason", NULL};

const struct attempt_history_steps capture_history = {
    .key = "captures",
    .noun = "capture",
    .whose = "an authorization's",
    .id_key = "capture_id",
    .call_column = "capture_id",
    .sql = SQL_CAPTURES,
    .timeline = SQL_TIMELINE,
    .heads = capture_history_heads,
    .members = capture_history_members,
    .asked_member = "amount",
    .asked_whole = "all",
    .taken_member = "captured_amount",
    .taken_head = "Captured",
    .reason_members = capture_history_reasons,
};
