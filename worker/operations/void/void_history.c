/* An authorization's voids in its attempt's story (op.h's history,
 * attempt_history.h): `chargectl attempt show` and the console's
 * timeline. */
#include "void.h"

#include "attempt_history.h"

#define TS(col) ATTEMPT_HISTORY_TS(col)

/* clang-format off */
static const char SQL_VOIDS[] =
    "SELECT coalesce(json_agg(v ORDER BY v.c, v.void_id), '[]')::text FROM (SELECT"
    " x.id AS void_id, x.status, x.void_reason, x.released_amount, x.reason,"
    " x.idempotency_key, x.payment_intent, x.holds, " TS("x.created_at") " AS created_at,"
    " " TS("x.updated_at") " AS updated_at, x.created_at AS c,"
    ATTEMPT_HISTORY_STEP_TRANSITIONS("void_transitions", "void_id")
    " FROM void_attempts x WHERE x.payment_attempt_id = $1::uuid) v";

static const char SQL_TIMELINE[] =
    ATTEMPT_HISTORY_TIMELINE_PART("'void'", "t.void_id", "void_transitions",
                                  "JOIN void_attempts x ON x.id = t.void_id"
                                  " WHERE x.payment_attempt_id = $1::uuid");
/* clang-format on */

static const char *const void_history_heads[] = {"RELEASED", "VOID_REASON", NULL};
static const char *const void_history_members[] = {"released_amount@currency",
                                                   "void_reason", NULL};

static const char *const void_history_reasons[] = {"void_reason", "reason", NULL};

const struct attempt_history_steps void_history = {
    .key = "voids",
    .noun = "void",
    .whose = "an authorization's",
    .id_key = "void_id",
    .call_column = "void_id",
    .sql = SQL_VOIDS,
    .timeline = SQL_TIMELINE,
    .heads = void_history_heads,
    .members = void_history_members,
    .reason_members = void_history_reasons,
};
