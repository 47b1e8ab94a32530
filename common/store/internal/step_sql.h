/* step_sql: the SQL every step over a payment attempt (a refund, a
 * capture: a table of its own whose rows name payment_attempt_id) writes
 * its provider calls with, so that the statement is written once. Private
 * to the store library and the operations' stores. */
#ifndef CHARGED_STEP_SQL_H
#define CHARGED_STEP_SQL_H

/* clang-format off */

/* The calls, from nine arrays at $a.., with the actor at `actor`: written
 * under the step's attempt and marked with the step (`col`, the
 * provider_calls column of its id; `table`, its table). `where` limits
 * them; a call is written only under a recorded attempt. */
#define SQL_STEP_CALLS(table, col, a0, a1, a2, a3, a4, a5, a6, a7, a8, actor, where) \
    "INSERT INTO provider_calls (payment_attempt_id, " col ", operation, started_at," \
    "  latency_ms, outcome, http_status, replayed, provider_payment_id, error, actor)" \
    " SELECT r.payment_attempt_id, v.id, v.op, to_timestamp(v.started_ms / 1000.0)," \
    "  v.latency, v.outcome, nullif(v.http, 0), v.replayed, nullif(v.ppid, '')," \
    "  nullif(v.err, ''), " actor \
    " FROM unnest(" a0 "::uuid[], " a1 "::text[], " a2 "::bigint[], " a3 "::int[]," \
    "  " a4 "::text[], " a5 "::int[], " a6 "::bool[], " a7 "::text[], " a8 "::text[])" \
    " AS v(id, op, started_ms, latency, outcome, http, replayed, ppid, err)" \
    " JOIN " table " r ON r.id = v.id" \
    " JOIN payment_attempts p ON p.id = r.payment_attempt_id " where

/* stmt_log_calls' statement for a step: a call whose earlier write may
 * have committed ($11 of its row) is written only when no row of the same
 * call is there. */
#define SQL_STEP_LOG_CALLS(table, col) \
    SQL_STEP_CALLS(table, col, "$1", "$2", "$3", "$4", "$5", "$6", "$7", "$8", "$9", \
                   "$10", \
    "WHERE NOT ((($11::bool[])[1]) AND EXISTS (SELECT 1 FROM provider_calls c" \
    "  WHERE c." col " = v.id AND c.operation = v.op" \
    "  AND c.started_at = to_timestamp(v.started_ms / 1000.0)" \
    "  AND c.outcome = v.outcome AND c.latency_ms = v.latency" \
    "  AND c.http_status IS NOT DISTINCT FROM nullif(v.http, 0)" \
    "  AND c.error IS NOT DISTINCT FROM nullif(v.err, '')))")

/* clang-format on */

#endif
