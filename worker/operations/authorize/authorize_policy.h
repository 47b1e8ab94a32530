/* authorize_policy: the authorization's pure decisions. Its reconciler
 * look is the charge's order of evidence (reconcile_policy) with the
 * hold's meanings: an intent in requires_capture holds the money where a
 * charge's takes it, so it is AUTHORIZED, never SUCCEEDED; and a hold
 * recorded AUTHORIZED is looked at, by its id, for the provider's expiry.
 * And what the provider's events about its intent do to its attempt.
 *
 * Pure: no database, no network, no clock. The reconciler
 * (authorize_look.c) and the simulation (tests/sim) run it alike. */
#ifndef CHARGED_AUTHORIZE_POLICY_H
#define CHARGED_AUTHORIZE_POLICY_H

#include "reconcile_look.h"
#include "reconcile_policy.h"
#include "webhook_event.h"

/* The authorization's own rows of its order of evidence
 * (reconcile_meaning.rows), as decision.rule carries them. */
#define AUTHORIZE_RULE(n) ((enum reconcile_rule)(RECONCILE_RULE__COUNT + (n)))
/* Its intent holds the money (requires_capture). */
#define AUTHORIZE_FOUND_AUTHORIZED AUTHORIZE_RULE(0)
/* Succeeded: taken where a hold was asked. */
#define AUTHORIZE_FOUND_CAPTURED AUTHORIZE_RULE(1)
/* Canceled before we knew of the hold. */
#define AUTHORIZE_FOUND_CANCELED AUTHORIZE_RULE(2)
/* An AUTHORIZED one canceled by the provider on its own
 * (cancellation_reason automatic). */
#define AUTHORIZE_FOUND_EXPIRED AUTHORIZE_RULE(3)
/* An AUTHORIZED one not expired: look later. */
#define AUTHORIZE_HOLD_STANDS AUTHORIZE_RULE(4)
/* An AUTHORIZED one canceled, not automatic, no void of ours holding it:
 * another's cancel. */
#define AUTHORIZE_FOUND_CANCELED_ELSEWHERE AUTHORIZE_RULE(5)
/* requires_capture again under the key (a replay proves the intent ours,
 * not its state); its retrieve failed: the id kept. */
#define AUTHORIZE_HELD_LOOKUP_FAILED AUTHORIZE_RULE(6)
#define AUTHORIZE_RULES              7

/* The authorization's meanings of its own intent (a->step_holds: a void
 * of ours holds the hold, its cancel the void's to settle). */
extern const struct reconcile_meaning authorize_meaning;

/* The next step of a look at an authorization (reconcile_policy_decide's
 * shape): reconcile_policy_decide_as with authorize_meaning. */
void authorize_look_decide(const struct reconcile_limits *lim,
                           const struct reconcile_attempt *a,
                           const struct reconcile_evidence *e,
                           struct reconcile_decision *out);

/* Its order of evidence, for reconcile_look_begin_order: the charge's
 * calls (the create again under its key is a "charge" call of the
 * attempt, as the worker's). */
extern const struct reconcile_order authorize_look_order;

/* "found_authorized", ...: the name of one of its own rows; NULL for
 * another. */
const char *authorize_rule_name(enum reconcile_rule rule);

/* What an authorization's event does to its attempt (capture_method
 * manual), on webhook_event_decide_as's shared rules (only its own intent
 * moves it; one not proven ours is recorded and ignored, an UNKNOWN
 * attempt made due for the reconciler at once: its create again under its
 * own key is the proof). Ours:
 *   - the hold (WEBHOOK_EVIDENCE_AUTHORIZED) settles PROCESSING or UNKNOWN
 *     as AUTHORIZED; for a FAILED attempt it is a contradiction (REVIEW);
 *     for any other state, older news (ignored);
 *   - the expiry (webhook_event_is_expiry) makes AUTHORIZED VOIDED, and
 *     PROCESSING or UNKNOWN (the hold never recorded) FAILED; of a
 *     SUCCEEDED (captured) attempt it is a contradiction (REVIEW);
 *   - a failure (payment_failed) is decided as a charge's
 *     (webhook_event_decide).
 * A hold or expiry of another amount or currency is flagged, never
 * applied. */
void authorize_event_decide(const struct webhook_event *ev,
                            const struct webhook_attempt *a,
                            struct webhook_decision *d);

#endif
