/* attempt_sql: SQL fragments shared by every writer of payment attempts
 * (the worker's and reconciler's attempt_store, the api's webhook_store), so
 * that a result event is built in exactly one place. Private to the store
 * library: its internal/ folder is on no other target's include path. */
#ifndef CHARGED_ATTEMPT_SQL_H
#define CHARGED_ATTEMPT_SQL_H

#include "attempt_status.h"

/* clang-format off */

/* The time of an attempt's change, for its updated_at, its transition and
 * its event's occurred_at: read when the statement has locked the row (not
 * now(), the time the transaction began, which a writer that waited for the
 * lock would stamp before the change it waited for), and never earlier than
 * the attempt's previous change, whatever the clock did. `p` is the alias of
 * the attempt's row in the UPDATE. */
#define SQL_CHANGED_AT(p) "greatest(clock_timestamp(), " p ".updated_at)"

/* RFC 3339 UTC with milliseconds, for event payloads. */
#define SQL_RFC3339(ts) \
    "to_char((" ts ") AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* The one place result events are written to the outbox: two CTEs that
 * publish one event per row of `src` whose event_type is not NULL, in the
 * statement that changed the attempt. `src` has the columns id, order_id,
 * amount, currency, provider_payment_id, status, reason, updated_at (the
 * change's time), event_type. event_id is new here and never changes: a
 * re-published event keeps it. The row's seq (the relay's order) is drawn
 * by this insert, after the attempt's row was locked. No topic is written:
 * the relay publishes to its own. */
#define SQL_OUTBOX_EVENTS(src) \
    " ev AS (SELECT gen_random_uuid() AS eid, " src ".* FROM " src \
    "  WHERE event_type IS NOT NULL)," \
    " ob AS (" \
    "  INSERT INTO outbox (event_id, payment_attempt_id, event_type, event_key, payload)" \
    "  SELECT eid, id, event_type, id::text, jsonb_strip_nulls(jsonb_build_object(" \
    "    'event_id', eid, 'type', event_type, 'payment_attempt_id', id," \
    "    'order_id', order_id, 'amount', amount, 'currency', currency," \
    "    'provider_payment_id', provider_payment_id," \
    "    'reason', CASE WHEN status = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE reason END," \
    "    'occurred_at', " SQL_RFC3339("updated_at") ")) FROM ev)"

/* The one place a charge is booked: a CTE `l` that books each row of `src`
 * (columns id, order_id, amount, currency, provider_payment_id, status)
 * that is SUCCEEDED. ledger_entries_one_charge_per_attempt makes a repeat a
 * no-op: an attempt is booked as charged at most once. */
#define SQL_LEDGER_CHARGE(src) \
    " l AS (" \
    "  INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount, currency," \
    "    provider_payment_id)" \
    "  SELECT id, order_id, 'charge', amount, currency, provider_payment_id FROM " src \
    "  WHERE status = " ATTEMPT_SQL(SUCCEEDED) \
    "  ON CONFLICT (payment_attempt_id) WHERE kind = 'charge' DO NOTHING)"

/* clang-format on */

#endif
