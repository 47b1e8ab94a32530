/* lease_sql: the lease statements every leased table shares (payment and
 * refund attempts: columns id, lease_owner, lease_expires_at, lease_epoch).
 * Private to the store library. */
#ifndef CHARGED_LEASE_SQL_H
#define CHARGED_LEASE_SQL_H

/* clang-format off */

/* The rows of `v`, all its columns, whose row no other session holds:
 * persist and the leases' statements never wait on a peer's lock (a session
 * hung in a transaction would hold us with it); a row held elsewhere is
 * busy, or its lease simply expires.
 *
 * The statements read lk alone (FROM lk AS v), never joined with v: the
 * planner knows neither CTE's size, and its guess for a join of the two (a
 * nested loop, lease_owner = $n looking rare on a large table) rescanned
 * one for every row of the other: 5,000 leases took 11 s. Membership is
 * tested with IN (SELECT ...), which is hashed. */
#define SQL_LEASES_UNLOCKED(table) \
    " lk AS (SELECT v.* FROM " table " p JOIN v ON p.id = v.id" \
    "  ORDER BY p.id FOR NO KEY UPDATE OF p SKIP LOCKED)"

/* What a persist statement (a worker's outcomes, from `v`, written in `u`)
 * answers per item: persisted, or busy (another session holds its row:
 * nothing was written, and nothing else waited for it). */
#define SQL_PERSIST_RESULT(table) \
    "SELECT v.id, v.id IN (SELECT id FROM u)," \
    "  v.id NOT IN (SELECT id FROM lk) AND EXISTS (SELECT 1 FROM " table " a" \
    "    WHERE a.id = v.id)" \
    " FROM v"

/* The rows of a lease statement: $1 their ids, $2 their epochs. */
#define SQL_LEASES_V \
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[]) AS v(id, epoch)),"

/* Extends our leases by $3 ms; $4 the actor. The rows still ours. */
#define SQL_LEASE_RENEW(table) \
    SQL_LEASES_V \
    SQL_LEASES_UNLOCKED(table) "," \
    " u AS (UPDATE " table " p" \
    "  SET lease_expires_at = now() + make_interval(secs => $3::double precision / 1000)" \
    "  FROM lk AS v" \
    "  WHERE p.id = v.id AND p.lease_epoch = v.epoch AND p.lease_owner = $4" \
    "  RETURNING p.id)" \
    "SELECT id FROM u" \
    /* A row another session holds is not extended now, and nothing waits \
     * for it: still ours if its last committed lease is. */ \
    " UNION ALL SELECT p.id FROM " table " p JOIN v ON p.id = v.id" \
    " WHERE p.id NOT IN (SELECT id FROM lk) AND p.lease_epoch = v.epoch" \
    "   AND p.lease_owner = $4"

/* Ends the leases of ours no other session holds, by `set`; $3 the actor. */
#define SQL_LEASE_END(table, set) \
    SQL_LEASES_V \
    SQL_LEASES_UNLOCKED(table) \
    "UPDATE " table " p SET " set \
    " FROM lk AS v" \
    " WHERE p.id = v.id AND p.lease_epoch = v.epoch AND p.lease_owner = $3" \
    " RETURNING p.id"

/* Says that our claims wait before their call ($1 ids, $2 epochs, $3
 * reasons, $4 since in epoch ms, $5 the actor), or, a reason NULL, that the
 * wait ended. A row another session holds is left as it is: what it shows
 * is a hint, and whatever ends the claim clears it (migration 0021's
 * trigger). */
#define SQL_LEASE_WAITING(table) \
    "WITH v AS (SELECT * FROM unnest($1::uuid[], $2::bigint[], $3::text[]," \
    "  $4::bigint[]) AS v(id, epoch, reason, since_ms))," \
    SQL_LEASES_UNLOCKED(table) \
    "UPDATE " table " p SET waiting_reason = v.reason," \
    "  waiting_since = CASE WHEN v.reason IS NOT NULL" \
    "    THEN to_timestamp(v.since_ms / 1000.0) END" \
    " FROM lk AS v" \
    " WHERE p.id = v.id AND p.lease_epoch = v.epoch AND p.lease_owner = $5" \
    " RETURNING p.id"

/* clang-format on */

#endif
