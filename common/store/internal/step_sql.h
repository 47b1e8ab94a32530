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

/* The reconciler's claim of a step's records due for a look ($1 actor,
 * $2 lease ms, $3 batch, $4 stale ms): UNKNOWN or PROCESSING unleased or
 * leased to $1 (a look of ours whose settlement found the row busy; a
 * reconciler ends a batch before it claims the next), an UNKNOWN lease
 * expired, a PROCESSING one stale; leased, fenced (epoch), due at once. Returns id, lease_epoch, status, then the caller's columns
 * of `p` (the step's row). */
#define SQL_STEP_CLAIM_DUE(table) \
    "WITH c AS (" \
    "  SELECT p.id FROM " table " p" \
    "  WHERE (p.next_check_at IS NULL OR p.next_check_at <= now())" \
    "    AND ((p.status IN (" ATTEMPT_SQL(UNKNOWN) ", " ATTEMPT_SQL(PROCESSING) ")" \
    "          AND (p.lease_owner IS NULL OR p.lease_owner = $1))" \
    "      OR (p.status = " ATTEMPT_SQL(UNKNOWN) " AND p.lease_expires_at < now())" \
    "      OR (p.status = " ATTEMPT_SQL(PROCESSING) " AND p.lease_expires_at <" \
    "          now() - make_interval(secs => $4::double precision / 1000)))" \
    "  ORDER BY p.next_check_at NULLS FIRST, p.id LIMIT $3::int" \
    "  FOR NO KEY UPDATE OF p SKIP LOCKED)" \
    "UPDATE " table " p SET lease_owner = $1," \
    "  lease_expires_at = now() + make_interval(secs => $2::double precision / 1000)," \
    "  lease_epoch = p.lease_epoch + 1," \
    "  next_check_at = coalesce(p.next_check_at, now())" \
    " FROM c WHERE p.id = c.id" \
    " RETURNING p.id, p.lease_epoch, p.status, "

/* clang-format on */

#endif
