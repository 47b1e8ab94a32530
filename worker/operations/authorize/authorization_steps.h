/* authorization_steps: what the reviews of an authorization and of its
 * steps (a capture, a void: capture/capture_review.c, void/void_review.c,
 * authorization_review.c) write alike over step_review (step_review.h):
 * the key age of the load, --help's words on the look-up, and the lists'
 * columns and SQL. The authorization's, since its steps are its own; kept
 * here so that step_review names no operation (issue 37). */
#ifndef CHARGED_AUTHORIZATION_STEPS_H
#define CHARGED_AUTHORIZATION_STEPS_H

#include "step_review.h"

/* The load's last column: ms since the database recorded the newest call
 * under the key of the row whose id is `id` in provider_calls' column
 * `col` (the step's own calls: not the look-ups), NULL when none. For an
 * authorization (col payment_attempt_id) its own calls, not its steps'. */
/* clang-format off */
#define SQL_STEP_KEY_AGE(col, id) \
    "(SELECT (extract(epoch FROM now() - max(coalesce(k.recorded_at, k.started_at)))" \
    "   * 1000)::bigint FROM provider_calls k WHERE k." col " = " id \
    "   AND k.operation NOT IN ('retrieve', 'search', 'list')" \
    "   AND k.capture_id IS NOT DISTINCT FROM CASE WHEN '" col "' = 'capture_id'" \
    "     THEN k.capture_id END" \
    "   AND k.void_id IS NOT DISTINCT FROM CASE WHEN '" col "' = 'void_id'" \
    "     THEN k.void_id END)"
/* clang-format on */

/* --help's words on the look-up of an authorization's step. */
#define STEP_REVIEW_CLI_ASKS                                                           \
    "The provider is asked first (PROVIDER_API_KEY) for the authorization's\n"         \
    "intent by the id charged recorded; a decision it contradicts or does not\n"       \
    "answer is refused (exit 1, nothing written) unless --force. --actor\n"            \
    "defaults to the OS user. Exit 0 resolved, 1 refused or failed, 2 bad\n"           \
    "usage.\n"

/* The columns of a list of an authorization's steps or of authorizations
 * (id: its id's member). */
#define STEP_REVIEW_LIST_HEADS                                                         \
    {                                                                                  \
        "ID", "ATTEMPT", "STATUS", "AMOUNT", "AUTHORIZATION", "REASON", "UPDATED_AT",  \
            NULL                                                                       \
    }
#define STEP_REVIEW_LIST_MEMBERS(id)                                                   \
    {                                                                                  \
        id, "payment_attempt_id", "status", "amount@currency", "authorization_status", \
            "reason", "updated_at", NULL                                               \
    }

/* A list of an authorization's steps of table, each with its
 * authorization's status (amount: the step's amount). */
/* clang-format off */
#define STEP_REVIEW_LIST_SQL(table, id_key, amount) \
    "SELECT coalesce(json_agg(r), '[]')::text FROM (SELECT s.id AS " id_key "," \
    " s.payment_attempt_id, s.status, " amount " AS amount, p.currency," \
    " p.status AS authorization_status, s.reason," \
    " " STEP_REVIEW_TS("s.updated_at") " AS updated_at FROM " table " s" \
    " LEFT JOIN payment_attempts p ON p.id = s.payment_attempt_id" \
    " WHERE ($1::text IS NULL OR s.status = $1)" \
    " ORDER BY s.updated_at DESC, s.id LIMIT $2::int) r"
/* clang-format on */

#endif
