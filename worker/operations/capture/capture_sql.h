/* capture_sql: the SQL fragments every writer of captures shares (the
 * worker's and reconciler's capture_store, the api's capture_webhook), so
 * that a capture's event is built in one place. */
#ifndef CHARGED_CAPTURE_SQL_H
#define CHARGED_CAPTURE_SQL_H

#include "attempt_sql.h"

/* clang-format off */

/* Two CTEs that publish one event per row of `src` whose event_type is not
 * NULL, keyed by (and ordered with) the authorization's attempt. `src` has
 * the columns id (the capture's), payment_attempt_id, order_id, amount
 * (captured, else asked, else the authorization's), currency,
 * payment_intent, status, reason, updated_at, event_type. */
#define SQL_CAPTURE_OUTBOX_EVENTS(src) \
    " cev AS (SELECT gen_random_uuid() AS eid, " src ".* FROM " src \
    "  WHERE event_type IS NOT NULL)," \
    " cob AS (" \
    "  INSERT INTO outbox (event_id, payment_attempt_id, event_type, event_key, payload)" \
    "  SELECT eid, payment_attempt_id, event_type, payment_attempt_id::text," \
    "    jsonb_strip_nulls(jsonb_build_object(" \
    "    'event_id', eid, 'type', event_type, 'capture_id', id," \
    "    'payment_attempt_id', payment_attempt_id, 'order_id', order_id," \
    "    'amount', amount, 'currency', currency," \
    "    'provider_payment_id', payment_intent," \
    "    'reason', CASE WHEN status = " ATTEMPT_SQL(SUCCEEDED) " THEN NULL ELSE reason END," \
    "    'occurred_at', " SQL_RFC3339("updated_at") ")) FROM cev)"

/* The capture's event type for the status column `st`
 * (capture_status_event_type). */
#define SQL_CAPTURE_EVENT_TYPE(st) \
    "CASE " st " WHEN " ATTEMPT_SQL(SUCCEEDED) " THEN 'capture.succeeded'" \
    " WHEN " ATTEMPT_SQL(FAILED) " THEN 'capture.failed'" \
    " WHEN " ATTEMPT_SQL(UNKNOWN) " THEN 'capture.unknown'" \
    " WHEN " ATTEMPT_SQL(REJECTED) " THEN 'capture.rejected'" \
    " WHEN " ATTEMPT_SQL(REQUIRES_REVIEW) " THEN 'capture.requires_review' END"

/* The amount a capture's event says, from the capture's row `c` and its
 * authorization's amount, the expression `authorized` (NULL when not
 * recorded): captured, else asked, else all that was held. */
#define SQL_CAPTURE_AMOUNT(c, authorized) \
    "coalesce(" c ".captured_amount, " c ".amount, " authorized ")"

/* clang-format on */

#endif
