/* A capture's order of evidence (capture.h's capture_look_decide): pure. */
#include <stdio.h>
#include <string.h>

#include "capture.h"
#include "capture_op.h"
#include "charge_policy.h"
#include "charged_assert.h"

/* Pure, so it lives with the look (the simulation links this file). */
const char *capture_refusal_code(const struct provider_result *res)
{
    CHARGED_ASSERT(res);
    if (!strcmp(res->intent_status, "canceled"))
        return !res->cancellation_reason[0] ||
                       !strcmp(res->cancellation_reason, "automatic")
                   ? "authorization_expired"
                   : "voided";
    if (!strcmp(res->intent_status, "succeeded"))
        return "already_captured";
    return "invalid_request";
}

/* The look's end: status (the capture's own: look again), reason. */
static void end(struct reconcile_decision *out, enum reconcile_rule rule,
                enum attempt_status status, const char *reason)
{
    out->next = RECONCILE_SETTLE;
    out->rule = rule;
    out->status = status;
    snprintf(out->reason, sizeof(out->reason), "%s", reason);
}

/* An intent that says what became of the authorization: captured (the
 * money it received), canceled (expired or voided). 1 when it settled the
 * look. */
static int from_intent(const struct reconcile_attempt *a,
                       const struct provider_result *r, struct reconcile_decision *out)
{
    char why[sizeof(out->reason)];
    if (!strcmp(r->intent_status, "succeeded") && r->amount_received > 0) {
        if (a->amount > 0 && r->amount_received != a->amount) {
            snprintf(
                why, sizeof(why),
                "requires_review: intent %s captured %lld, this capture asked %lld",
                r->provider_payment_id, r->amount_received, a->amount);
            end(out, RECONCILE_FOUND_NOT_OURS, ATTEMPT_STATUS_REQUIRES_REVIEW, why);
            return 1;
        }
        end(out, RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "");
        out->amount = r->amount_received;
        snprintf(out->provider_payment_id, sizeof(out->provider_payment_id), "%s",
                 r->provider_payment_id);
        return 1;
    }
    if (!strcmp(r->intent_status, "canceled")) {
        snprintf(why, sizeof(why), "%s: intent %s canceled (%s)",
                 capture_refusal_code(r), a->provider_payment_id,
                 r->cancellation_reason[0] ? r->cancellation_reason : "no reason");
        end(out, RECONCILE_FOUND_DECLINED, ATTEMPT_STATUS_FAILED, why);
        return 1;
    }
    return 0;
}

/* The capture again under its key: its answer, when it says anything. */
static int from_capture(const struct reconcile_attempt *a,
                        const struct provider_result *r, struct reconcile_decision *out)
{
    char why[sizeof(out->reason)], detail[400];
    provider_outcome_detail(r, detail, sizeof(detail));
    switch (r->outcome) {
    case PROVIDER_SUCCEEDED:
        return from_intent(a, r, out);
    case PROVIDER_INVALID:
        /* Refused, executing nothing. Captured already, though our own
         * call would have been replayed under the key: not this capture's. */
        if (!strcmp(capture_refusal_code(r), "already_captured")) {
            snprintf(why, sizeof(why),
                     "requires_review: captured, not under this key: %s", detail);
            end(out, RECONCILE_FOUND_NOT_OURS, ATTEMPT_STATUS_REQUIRES_REVIEW, why);
            return 1;
        }
        snprintf(why, sizeof(why), "%s: %s", capture_refusal_code(r), detail);
        end(out, RECONCILE_CHARGE_REFUSED, ATTEMPT_STATUS_FAILED, why);
        return 1;
    case PROVIDER_REQUIRES_REVIEW:
        snprintf(why, sizeof(why), "requires_review: %s", detail);
        end(out, RECONCILE_FOUND_OTHER_STATUS, ATTEMPT_STATUS_REQUIRES_REVIEW, why);
        return 1;
    default:
        return 0; /* no answer, not executed (409: ours still runs), ...: look */
    }
}

/* The intent by our id: what the authorization is now. */
static void from_lookup(const struct reconcile_attempt *a,
                        const struct provider_result *r, int window_open, long long age,
                        struct reconcile_decision *out)
{
    char why[sizeof(out->reason)];
    if (r->outcome == PROVIDER_NOT_FOUND) {
        snprintf(why, sizeof(why),
                 "requires_review: contradictory: the provider does not know intent %s",
                 a->provider_payment_id);
        end(out, RECONCILE_ID_UNKNOWN, ATTEMPT_STATUS_REQUIRES_REVIEW, why);
    } else if (!r->intent_status[0]) {
        snprintf(why, sizeof(why), "look-up failed: %s", r->error);
        end(out, RECONCILE_LOOKUP_FAILED, a->status, why);
    } else if (from_intent(a, r, out)) {
        return;
    } else if (!strcmp(r->intent_status, "requires_capture") && !window_open) {
        snprintf(why, sizeof(why),
                 "never_executed: intent %s still requires_capture at the key's age of "
                 "%lld ms, past its retention",
                 a->provider_payment_id, age);
        end(out, RECONCILE_NEVER_EXECUTED, ATTEMPT_STATUS_FAILED, why);
    } else if (!strcmp(r->intent_status, "requires_capture") ||
               !strcmp(r->intent_status, "processing")) {
        snprintf(
            why, sizeof(why),
            "intent %s is %s; a call under the key may still take it: looking again",
            a->provider_payment_id, r->intent_status);
        end(out, RECONCILE_CHARGE_UNANSWERED, a->status, why);
    } else {
        snprintf(why, sizeof(why), "requires_review: intent status '%s'",
                 r->intent_status);
        end(out, RECONCILE_FOUND_OTHER_STATUS, ATTEMPT_STATUS_REQUIRES_REVIEW, why);
    }
}

void capture_look_decide(const struct reconcile_limits *lim,
                         const struct reconcile_attempt *a,
                         const struct reconcile_evidence *e,
                         struct reconcile_decision *out)
{
    CHARGED_ASSERT(lim && a && e && out && a->id);
    CHARGED_ASSERT(a->status == ATTEMPT_STATUS_UNKNOWN ||
                   a->status == ATTEMPT_STATUS_PROCESSING);
    memset(out, 0, sizeof(*out));
    long long age = (a->key_age_ms < 0 ? 0 : a->key_age_ms) + e->lookup_after_ms;
    int window = charge_policy_key_window_open(age, lim->key_retention_ms,
                                               lim->provider_timeout_ms);
    if (!a->provider_payment_id || !a->provider_payment_id[0])
        end(out, RECONCILE_REFUND_NO_INTENT, ATTEMPT_STATUS_REQUIRES_REVIEW,
            "requires_review: no authorization intent recorded to capture on");
    else if (window && !e->charge)
        out->next = RECONCILE_CHARGE;
    else if (e->charge && from_capture(a, e->charge, out))
        ;
    else if (!e->lookup)
        out->next = RECONCILE_RETRIEVE;
    else
        from_lookup(a, e->lookup, window, age, out);
    if (out->next == RECONCILE_SETTLE && out->status == a->status &&
        a->age_ms > lim->max_age_ms) {
        char why[sizeof(out->reason)];
        snprintf(why, sizeof(why),
                 "requires_review: still unsettled after %lld ms; last: %.400s",
                 a->age_ms, out->reason);
        end(out, RECONCILE_TOO_OLD, ATTEMPT_STATUS_REQUIRES_REVIEW, why);
    }
    /* A success says what it captured; what settles is a move allowed. */
    CHARGED_ASSERT(out->next != RECONCILE_SETTLE ||
                   out->status != ATTEMPT_STATUS_SUCCEEDED || out->amount >= 1);
    CHARGED_ASSERT(out->next != RECONCILE_SETTLE || out->status == a->status ||
                   attempt_status_transition_allowed((int)a->status, out->status));
}
