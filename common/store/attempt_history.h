/* attempt_history: what happened to a payment attempt, as JSON the database
 * builds: for `chargectl attempt show|list` and the console alike, so that
 * the queries are written once.
 *
 * Every call takes a connection of the caller's (db_connect) and returns
 * CHARGED_OK with a new JSON value (the caller owns it), CHARGED_NOT_FOUND, or
 * CHARGED_RETRY with err (CHARGED_BAD_ITEM with err when the database refuses a
 * value given: a filter's). Times are RFC 3339 UTC strings with
 * milliseconds. */
#ifndef CHARGED_ATTEMPT_HISTORY_H
#define CHARGED_ATTEMPT_HISTORY_H

#include <jansson.h>
#include <libpq-fe.h>

#include "store.h"

/* The attempt (its row, with provider_calls counted) and every part of its
 * story: {"attempt", "transitions", "provider_calls", "ledger_entries",
 * "result_events", "refunds", "captures", "voids", "timeline"}: an
 * authorization's captures and voids each with its own transitions, and
 * the timeline the attempt's transitions and its steps' in time order
 * (each with "step": attempt, capture or void, and "step_id"); each list
 * oldest first, all read in one
 * snapshot (a transaction of its own unless conn is inside one already).
 * CHARGED_NOT_FOUND also for an id that is not a UUID. */
enum charged_rc attempt_history_read(PGconn *conn, const char *attempt_id, json_t **out,
                                     struct charged_error *err);

struct attempt_history_filter {
    const char *order_id;      /* NULL: any */
    const char *status;        /* NULL: any */
    const char *older_than_ms; /* decimal; NULL: any age */
    const char *limit;         /* decimal, required */
};

/* Attempts, most recently updated first: an array of {payment_attempt_id,
 * order_id, status, amount, currency, provider_payment_id, reason,
 * updated_at}. */
enum charged_rc attempt_history_list(PGconn *conn,
                                     const struct attempt_history_filter *f,
                                     json_t **out, struct charged_error *err);

/* The attempts an id names: an attempt id, an order id (a UUID is looked
 * for as both) or a provider's intent id (pi_...: letters, digits, '_'):
 * an array as attempt_history_list's, at most 100. CHARGED_OK with an empty
 * array when none, and for an id of neither kind (nothing is asked). */
enum charged_rc attempt_history_find(PGconn *conn, const char *id, json_t **out,
                                     struct charged_error *err);

#endif
