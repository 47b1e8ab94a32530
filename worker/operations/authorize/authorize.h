/* authorize: the authorization's parts, for its line of the table
 * (authorize.c). */
#ifndef CHARGED_AUTHORIZE_H
#define CHARGED_AUTHORIZE_H

#include "op.h"

/* The result event of an authorization the provider canceled on its own
 * (its expiry): VOIDED `expired`, published as the authorization's
 * failure (docs/messages.md: the money is no longer held for the order).
 * A void's VOIDED is the void's own event (void.succeeded). */
#define AUTHORIZE_EXPIRED_EVENT  "authorization.failed"
#define AUTHORIZE_EXPIRED_REASON "expired"

/* The reason code of a hold answered when the answer may be a replay
 * (engine_decide_fn's may_replay): the provider's stored answer is as old
 * as the first execution, so it proves the intent ours (its id is
 * recorded), not that it is held now (captured or canceled since by
 * anyone): UNKNOWN, for the look to retrieve the intent by that id. */
#define AUTHORIZE_REPLAYED_HOLD                                                        \
    "outcome_unknown: requires_capture answered again under the key (a replay: the "   \
    "intent is ours, its state now for the reconciler to retrieve)"

/* The reconciler's look at an authorization (authorize_look.c). */
extern const struct op_reconcile authorize_reconcile;
/* The api's webhook events about an authorization (authorize_webhook.c). */
extern const struct op_webhook authorize_webhook;
/* RECONCILER_AUTHORIZATION_EXPIRY_MS: a hold this old is looked at for the
 * provider's expiry (authorize_look.c: its store claims it). */
extern const struct config_setting authorize_expiry_setting;

#endif
