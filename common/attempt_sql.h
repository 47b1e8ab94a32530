/* attempt_sql: SQL fragments shared by every writer of payment attempts
 * (the worker's and reconciler's attempt_store, the api's api_store), so
 * that a result event is built in exactly one place. Internal to common/. */
#ifndef CHARGED_ATTEMPT_SQL_H
#define CHARGED_ATTEMPT_SQL_H

#include "attempt_status.h"

/* clang-format off */

/* RFC 3339 UTC with milliseconds, for event payloads. */
#define SQL_NOW_RFC3339 \
    "to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* The one place result events are written to the outbox: two CTEs that
 * publish one event per row of `src` whose event_type is not NULL, in the
 * statement that changed the attempt. `src` has the columns id, order_id,
 * amount, currency, provider_payment_id, status, reason, event_type; `topic`
 * is the parameter holding the results topic. event_id is new here and
 * never changes: a re-published event keeps it. */
#define SQL_OUTBOX_EVENTS(src, topic) \
    " ev AS (SELECT gen_random_uuid() AS eid, " src ".* FROM " src \
    "  WHERE event_type IS NOT NULL)," \
    " ob AS (" \
    "  INSERT INTO outbox (event_id, payment_attempt_id, event_type, topic, event_key," \
    "    payload)" \
    "  SELECT eid, id, event_type, " topic ", id::text, jsonb_strip_nulls(jsonb_build_object(" \
    "    'event_id', eid, 'type', event_type, 'payment_attempt_id', id," \
    "    'order_id', order_id, 'amount', amount, 'currency', currency," \
    "    'provider_payment_id', provider_payment_id," \
    "    'reason', CASE WHEN status = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE reason END," \
    "    'occurred_at', " SQL_NOW_RFC3339 ")) FROM ev)"

/* The one place a charge is booked: a CTE `l` that books each row of `src`
 * (columns id, order_id, amount, currency, provider_payment_id, status)
 * that is SUCCEEDED. UNIQUE (payment_attempt_id, kind) makes a repeat a
 * no-op: an attempt is booked as charged at most once. */
#define SQL_LEDGER_CHARGE(src) \
    " l AS (" \
    "  INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount, currency," \
    "    provider_payment_id)" \
    "  SELECT id, order_id, 'charge', amount, currency, provider_payment_id FROM " src \
    "  WHERE status = " ATTEMPT_SQL(SUCCEEDED) \
    "  ON CONFLICT (payment_attempt_id, kind) DO NOTHING)"

/* clang-format on */

#endif
