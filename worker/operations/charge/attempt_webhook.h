/* attempt_webhook: a provider's event applied to the payment attempt it is
 * about, for each operation over attempts (charge_webhook.c, an
 * authorization's authorize_webhook.c): the attempt locked, and moved as
 * the operation's decision says, inside webhook_store's transaction
 * (webhook_apply.h). */
#ifndef CHARGED_ATTEMPT_WEBHOOK_H
#define CHARGED_ATTEMPT_WEBHOOK_H

#include "store.h"
#include "store_conn.h"
#include "webhook_event.h"
#include "webhook_store.h"

/* Locks the attempt ev is about (by its metadata's id, else by its
 * intent) until the commit: *found, and, found, the attempt as the
 * database holds it in *a and its ids and status in out. CHARGED_OK, or
 * the failure as webhook_apply_later_failed answers it. */
enum charged_rc attempt_webhook_lock(store_conn_t *db, const struct webhook_event *ev,
                                     struct webhook_store_result *out,
                                     struct webhook_attempt *a, int *found,
                                     struct charged_error *err);
/* Moves the locked attempt (out's) as d decided (APPLY or REVIEW), with
 * reason (NULL or "": none), its transition with the event's evidence, a
 * SUCCEEDED charge's ledger entry, and event_type's result event (NULL:
 * none). */
enum charged_rc attempt_webhook_move(store_conn_t *db, const struct webhook_event *ev,
                                     const struct webhook_decision *d,
                                     const char *reason, const char *event_type,
                                     struct webhook_store_result *out,
                                     struct charged_error *err);
/* Makes the UNKNOWN attempt due for the reconciler now. */
enum charged_rc attempt_webhook_check_now(store_conn_t *db, const char *attempt_id,
                                          struct charged_error *err);

#endif
