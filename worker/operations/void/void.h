/* void: the void of an authorization (issue 37) in every role (op.h), its
 * line of the table (void.c).
 *
 * A void.requested (void_command.h) is recorded as a void attempt, claimed
 * with its authorization's hold (void_store.h), and sent as the cancel of
 * the intent charged recorded for the authorization
 * (POST /v1/payment_intents/<id>/cancel, cancellation_reason the void's,
 * under the void's own key). Canceled: the void SUCCEEDED and the attempt
 * VOIDED in one transaction, void.succeeded, nothing booked. Refused
 * because the intent was captured: the void FAILED void_after_capture, its
 * hold back, and the attempt REQUIRES_REVIEW (money moved that no capture
 * of ours recorded). A lost answer is UNKNOWN (never FAILED), the hold
 * kept, for the reconciler's look (void_reconcile.c); the provider's
 * payment_intent.canceled of our recorded intent settles it too
 * (void_webhook.c). */
#ifndef CHARGED_VOID_H
#define CHARGED_VOID_H

#include "op.h"
#include "provider_client.h"
#include "void_store.h"

/* The worker's stages (void_op.c). */
extern const struct engine_op void_engine_op;
/* The reconciler's look at a void (void_reconcile.c). */
extern const struct op_reconcile void_reconcile;
/* The api's webhook events about voids (void_webhook.c). */
extern const struct op_webhook void_webhook;
/* The auditor's rules about its authorization's cancel (void_audit.c). */
extern const struct audit_steps void_audit;
/* Its voids in an attempt's story (void_history.c). */
extern const struct attempt_history_steps void_history;

/* What a void sends under its key for every role that sends one (the
 * worker's call and its retries, the reconciler's cancel again): the
 * stored void p, never the message's copy. Points into p. */
struct provider_void void_op_request(const struct void_params *p);

#endif
