/* capture: the capture's parts, for its line of the table (capture.c).
 *
 * A capture takes part or all of what an authorization holds, once
 * (contract: "Authorizations, captures and voids"): capture.requested is
 * recorded (capture_store), claimed with the authorization's hold, sent as
 * the provider's capture under its own key (capture_op), and settled on
 * the answer; a lost answer is UNKNOWN, never FAILED, and the reconciler
 * (capture_reconcile) or the provider's payment_intent.succeeded
 * (capture_webhook) settles it on evidence. */
#ifndef CHARGED_CAPTURE_H
#define CHARGED_CAPTURE_H

#include "op.h"
#include "reconcile_policy.h"

/* The reconciler's look at a capture (capture_reconcile.c). */
extern const struct op_reconcile capture_reconcile;
/* The api's webhook events about captures (capture_webhook.c). */
extern const struct op_webhook capture_webhook;
/* The auditor's rules about what its authorization's capture took
 * (capture_audit.c). */
extern const struct audit_steps capture_audit;
/* Its captures in an attempt's story (capture_history.c). */
extern const struct attempt_history_steps capture_history;

/* A capture's order of evidence (reconcile_look's shape; pure). a's
 * provider_payment_id is the authorization's intent as we recorded it, its
 * amount the amount asked (0: all). While the provider keeps the key, the
 * capture again under it first (CHARGE, operation "capture"): its answer
 * or replay is ours. Else, or when it told nothing, the intent by our id
 * (RETRIEVE): succeeded with amount_received is SUCCEEDED (amount), its
 * refusal or the intent canceled is FAILED (authorization_expired,
 * voided, invalid_request), still requires_capture is FAILED
 * never_executed only past the key's window (no call of ours can still
 * take it), otherwise looked at again; anything it cannot place, and
 * whatever stays unsettled past max_age_ms, REQUIRES_REVIEW. */
void capture_look_decide(const struct reconcile_limits *lim,
                         const struct reconcile_attempt *a,
                         const struct reconcile_evidence *e,
                         struct reconcile_decision *out);

#endif
