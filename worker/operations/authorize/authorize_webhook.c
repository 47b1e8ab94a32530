/* The authorization's half of applying a provider's event (op.h's struct
 * op_webhook, for webhook_store): the hold (amount_capturable_updated), a
 * manual intent's failure, and the provider's own cancel of a hold (its
 * expiry, cancellation_reason automatic). The attempt is locked and moved
 * as the charge's is (attempt_webhook.h), on the decision for an
 * authorization (authorize_policy.h's authorize_event_decide): only our recorded
 * intent moves it; one that merely names it in its metadata makes an
 * UNKNOWN attempt due for the reconciler, whose create again under our own
 * key is the proof. A captured intent's events are the capture's, a
 * void's cancel the void's. */
#include <stdio.h>
#include <string.h>

#include "attempt_status.h"
#include "attempt_webhook.h"
#include "authorize.h"
#include "authorize_policy.h"
#include "charged_assert.h"
#include "op.h"

/* The attempt's reason after the decision. */
static const char *reason_for(const struct webhook_event *ev,
                              const struct webhook_decision *d, char *out, size_t size)
{
    CHARGED_ASSERT(ev && d && out && size > 0);
    out[0] = '\0';
    if (d->status == ATTEMPT_STATUS_VOIDED)
        snprintf(out, size, "%s", AUTHORIZE_EXPIRED_REASON);
    else if (d->status == ATTEMPT_STATUS_FAILED && webhook_event_is_expiry(ev))
        snprintf(out, size, "canceled: %s", ev->cancellation_reason);
    else if (d->status == ATTEMPT_STATUS_FAILED)
        snprintf(out, size, "declined: %s",
                 ev->decline_code[0] ? ev->decline_code : "reported by webhook");
    else if (d->status == ATTEMPT_STATUS_REQUIRES_REVIEW)
        snprintf(out, size, "requires_review: %s", d->reason);
    /* AUTHORIZED: none, as a success has none. */
    return out;
}

static enum charged_rc authorize_apply(store_conn_t *db, const struct webhook_event *ev,
                                       struct webhook_store_result *out,
                                       struct charged_error *err)
{
    CHARGED_ASSERT(db && ev && out);
    struct webhook_decision d = {WEBHOOK_IGNORE, ATTEMPT_STATUS_PENDING, "", 0};
    struct webhook_attempt a;
    char reason[256];
    int found = 0;
    enum charged_rc rc = attempt_webhook_lock(db, ev, out, &a, &found, err);
    if (rc != CHARGED_OK || !found)
        return rc; /* unmatched: recorded for a person */
    authorize_event_decide(ev, &a, &d);
    out->outcome = webhook_action_name(d.action);
    out->reason = d.reason;
    if (d.check_now)
        rc = attempt_webhook_check_now(db, out->attempt_id, err);
    if (rc != CHARGED_OK || (d.action != WEBHOOK_APPLY && d.action != WEBHOOK_REVIEW))
        return rc;
    /* The expiry is published as the authorization's (authorize.h). */
    const char *type = d.status == ATTEMPT_STATUS_VOIDED
                           ? AUTHORIZE_EXPIRED_EVENT
                           : attempt_status_authorization_event_type(d.status);
    return attempt_webhook_move(db, ev, &d, reason_for(ev, &d, reason, sizeof(reason)),
                                type, out, err);
}

/* The hold; a manual intent's failure (not a cancel: a void's, or the
 * expiry below); the provider's own cancel of a hold. Looks at the event
 * only. */
static int authorize_takes(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
    int manual = !strcmp(ev->capture_method, "manual");
    return ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED || webhook_event_is_expiry(ev) ||
           (manual && ev->evidence == WEBHOOK_EVIDENCE_FAILED &&
            strcmp(ev->intent_status, "canceled") != 0);
}

const struct op_webhook authorize_webhook = {
    .takes = authorize_takes,
    .apply = authorize_apply,
};
