/* refund_sql: SQL fragments shared by every writer of refund attempts (the
 * worker's and reconciler's refund_store, the api's webhook_store,
 * chargectl), so that a refund's event is built in exactly one place. The
 * money of a refund's change (reservation, refunded total, ledger row) is
 * not here: the refund_attempts_money trigger applies it to every writer's
 * UPDATE alike (migrations/0006_refunds.sql). Private to the store
 * library. */
#ifndef CHARGED_REFUND_SQL_H
#define CHARGED_REFUND_SQL_H

#include "attempt_sql.h"

/* clang-format off */

/* Two CTEs that publish one event per row of `src` whose event_type is not
 * NULL, keyed by (and ordered with) the charge's attempt. `src` has the
 * columns id (the refund's), payment_attempt_id, order_id, amount,
 * currency, provider_refund_id, status, reason, updated_at, event_type. */
#define SQL_REFUND_OUTBOX_EVENTS(src) \
    " rev AS (SELECT gen_random_uuid() AS eid, " src ".* FROM " src \
    "  WHERE event_type IS NOT NULL)," \
    " rob AS (" \
    "  INSERT INTO outbox (event_id, payment_attempt_id, refund_id, event_type, event_key," \
    "    payload)" \
    "  SELECT eid, payment_attempt_id, id, event_type, payment_attempt_id::text," \
    "    jsonb_strip_nulls(jsonb_build_object(" \
    "    'event_id', eid, 'type', event_type, 'refund_id', id," \
    "    'payment_attempt_id', payment_attempt_id, 'order_id', order_id," \
    "    'amount', amount, 'currency', currency," \
    "    'provider_refund_id', provider_refund_id," \
    "    'reason', CASE WHEN status = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE reason END," \
    "    'occurred_at', " SQL_RFC3339("updated_at") ")) FROM rev)"

/* The refund's event type for the status column `st`, as
 * attempt_status_refund_event_type() names it. */
#define SQL_REFUND_EVENT_TYPE(st) \
    "CASE " st " WHEN " ATTEMPT_SQL(SUCCEEDED) " THEN 'refund.succeeded'" \
    " WHEN " ATTEMPT_SQL(FAILED) " THEN 'refund.failed'" \
    " WHEN " ATTEMPT_SQL(UNKNOWN) " THEN 'refund.unknown'" \
    " WHEN " ATTEMPT_SQL(REJECTED) " THEN 'refund.rejected'" \
    " WHEN " ATTEMPT_SQL(REQUIRES_REVIEW) " THEN 'refund.requires_review' END"

/* clang-format on */

#endif
