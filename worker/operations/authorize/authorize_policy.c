/* The authorization's pure decisions (authorize_policy.h): its order of
 * evidence, and what the provider's events about its intent do. */
#include "authorize_policy.h"

#include <stdio.h>
#include <string.h>

#include "charged_assert.h"

/* ---- its order of evidence ---- */

/* The authorization's own rows, as docs/reconciler.md's "Authorizations"
 * tells them (reconcile_policy.h's struct reconcile_row). */
#define ROW(rule) ((rule)-RECONCILE_RULE__COUNT)
static const struct reconcile_row authorize_rows[AUTHORIZE_RULES] = {
    /* Held: the authorization's success. */
    [ROW(AUTHORIZE_FOUND_AUTHORIZED)] = {"found_authorized", RECONCILE_SETS,
                                         ATTEMPT_STATUS_AUTHORIZED,
                                         RECONCILE_BOOKS_INTENT, NULL},
    /* Money taken where it was to be held (captured behind our back): no
     * capture of ours took it, so a person decides, never SUCCEEDED. */
    [ROW(AUTHORIZE_FOUND_CAPTURED)] = {"found_captured", RECONCILE_SETS,
                                       ATTEMPT_STATUS_REQUIRES_REVIEW,
                                       RECONCILE_BOOKS_INTENT,
                                       "requires_review: captured: "},
    /* Canceled before the hold was ever recorded: no money is held, as
     * after a decline. VOIDED is for a hold recorded AUTHORIZED. */
    [ROW(AUTHORIZE_FOUND_CANCELED)] = {"found_canceled", RECONCILE_SETS,
                                       ATTEMPT_STATUS_FAILED, RECONCILE_BOOKS_INTENT,
                                       "canceled: "},
    /* The provider's expiry of a hold recorded AUTHORIZED: released. */
    [ROW(AUTHORIZE_FOUND_EXPIRED)] = {"found_expired", RECONCILE_SETS,
                                      ATTEMPT_STATUS_VOIDED, RECONCILE_BOOKS_NONE,
                                      "expired"},
    [ROW(AUTHORIZE_HOLD_STANDS)] = {"hold_stands", RECONCILE_KEEPS, 0,
                                    RECONCILE_BOOKS_NONE, "not expired: "},
    /* A hold canceled by another client of the account (no void of ours
     * holds it): no step of ours will settle it; the money is no longer
     * held for the order. */
    [ROW(AUTHORIZE_FOUND_CANCELED_ELSEWHERE)] = {"found_canceled_elsewhere",
                                                 RECONCILE_SETS, ATTEMPT_STATUS_VOIDED,
                                                 RECONCILE_BOOKS_NONE,
                                                 "canceled_elsewhere: "},
    /* A replayed hold proved the intent ours; its retrieve failed: the id
     * is kept (the next look goes by it), the state is looked at again. */
    [ROW(
        AUTHORIZE_HELD_LOOKUP_FAILED)] = {"held_lookup_failed", RECONCILE_KEEPS, 0,
                                          RECONCILE_BOOKS_INTENT,
                                          "held when first answered; look-up failed: "},
};

_Static_assert(ROW(AUTHORIZE_HELD_LOOKUP_FAILED) == AUTHORIZE_RULES - 1,
               "one row per rule");

const char *authorize_rule_name(enum reconcile_rule rule)
{
    if (rule < RECONCILE_RULE__COUNT || ROW(rule) >= AUTHORIZE_RULES)
        return NULL;
    CHARGED_ASSERT(authorize_rows[ROW(rule)].name);
    return authorize_rows[ROW(rule)].name;
}

/* What an authorization's own intent says (ours: the core proved it).
 * Held is AUTHORIZED; taken (succeeded) is for a person; canceled before
 * the hold was recorded is FAILED; declined and processing as a charge's.
 * Of an AUTHORIZED attempt (the look for the provider's expiry) only a
 * cancel settles: the provider's own (cancellation_reason automatic),
 * VOIDED expired; another's, with no void of ours holding it, VOIDED
 * canceled_elsewhere; anything else leaves the hold as it is, to its steps
 * (a capture's or void's look) and the auditor. */
static enum reconcile_rule authorize_of_intent(const struct reconcile_attempt *a,
                                               const struct provider_result *res,
                                               char *detail, size_t size)
{
    CHARGED_ASSERT(a && res && detail && size > 0);
    int canceled = !strcmp(res->intent_status, "canceled");
    if (a->status == ATTEMPT_STATUS_AUTHORIZED) {
        if (canceled && !strcmp(res->cancellation_reason, "automatic")) {
            detail[0] = '\0';
            return AUTHORIZE_FOUND_EXPIRED;
        }
        if (canceled && !a->step_holds) {
            snprintf(detail, size, "%s",
                     res->cancellation_reason[0] ? res->cancellation_reason
                                                 : "no reason");
            return AUTHORIZE_FOUND_CANCELED_ELSEWHERE;
        }
        snprintf(detail, size, "intent status '%s'%s%s", res->intent_status,
                 res->cancellation_reason[0] ? ", cancellation_reason " : "",
                 res->cancellation_reason);
        return AUTHORIZE_HOLD_STANDS;
    }
    if (res->outcome == PROVIDER_AUTHORIZED)
        return AUTHORIZE_FOUND_AUTHORIZED;
    if (!strcmp(res->intent_status, "succeeded")) {
        snprintf(detail, size, "intent succeeded where a hold was asked");
        return AUTHORIZE_FOUND_CAPTURED;
    }
    if (canceled) {
        snprintf(detail, size, "%s",
                 res->cancellation_reason[0] ? res->cancellation_reason : "canceled");
        return AUTHORIZE_FOUND_CANCELED;
    }
    switch (res->outcome) {
    case PROVIDER_DECLINED:
        snprintf(detail, size, "%s%s%s", res->code[0] ? res->code : "declined",
                 res->decline_code[0] ? ": " : "", res->decline_code);
        return RECONCILE_FOUND_DECLINED;
    case PROVIDER_PROCESSING:
        return RECONCILE_FOUND_PROCESSING;
    default:
        snprintf(detail, size, "intent status '%s'", res->intent_status);
        return RECONCILE_FOUND_OTHER_STATUS;
    }
}

const struct reconcile_meaning authorize_meaning = {
    .of_intent = authorize_of_intent,
    .rows = authorize_rows,
    .nrows = AUTHORIZE_RULES,
    .looks_at_settled = ATTEMPT_STATUS_AUTHORIZED,
    /* The create again under the key answering requires_capture may be
     * the provider's replay, as old as the first execution: it proves the
     * intent ours, not held now (captured or canceled since by anyone). */
    .replay_proves_ours_only = AUTHORIZE_FOUND_AUTHORIZED,
    .replay_lookup_failed = AUTHORIZE_HELD_LOOKUP_FAILED,
    .replay_without_id = "requires_capture without an intent id",
};

void authorize_look_decide(const struct reconcile_limits *lim,
                           const struct reconcile_attempt *a,
                           const struct reconcile_evidence *e,
                           struct reconcile_decision *out)
{
    CHARGED_ASSERT(lim && a && e && out);
    /* Looked at unsettled, or held (for the expiry) by its recorded id. */
    CHARGED_ASSERT(a->status != ATTEMPT_STATUS_AUTHORIZED ||
                   (a->provider_payment_id && a->provider_payment_id[0]));
    reconcile_policy_decide_as(&authorize_meaning, lim, a, e, out);
}

const struct reconcile_order authorize_look_order = {
    .decide = authorize_look_decide,
    .operation = {[RECONCILE_RETRIEVE] = "retrieve",
                  [RECONCILE_SEARCH] = "search",
                  [RECONCILE_SEARCH_OTHERS] = "search",
                  [RECONCILE_CHARGE] = "charge",
                  [RECONCILE_LIST] = "list"},
};

/* ---- the provider's events about its intent ---- */

/* Our own intent holds the money. */
static void decide_hold(const struct webhook_attempt *a, struct webhook_decision *d)
{
    CHARGED_ASSERT(a && d);
    switch (a->status) {
    case ATTEMPT_STATUS_PROCESSING:
    case ATTEMPT_STATUS_UNKNOWN:
        webhook_decision_set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_AUTHORIZED,
                             "the provider holds the money");
        return;
    case ATTEMPT_STATUS_AUTHORIZED:
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "already authorized");
        return;
    case ATTEMPT_STATUS_FAILED:
        webhook_decision_set(d, WEBHOOK_REVIEW, ATTEMPT_STATUS_REQUIRES_REVIEW,
                             "the provider reported a hold for a failed attempt");
        return;
    case ATTEMPT_STATUS_REJECTED:
        webhook_decision_set(d, WEBHOOK_FLAG, a->status,
                             "the provider reported a hold for a rejected attempt");
        return;
    case ATTEMPT_STATUS_PENDING:
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                             "not sent yet; the call will see it");
        return;
    default: /* captured, voided, under review: older news */
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                             "older than the current state");
        return;
    }
}

/* Our own intent was canceled by the provider on its own: its expiry. */
static void decide_expiry(const struct webhook_attempt *a, struct webhook_decision *d)
{
    CHARGED_ASSERT(a && d);
    switch (a->status) {
    case ATTEMPT_STATUS_AUTHORIZED:
        webhook_decision_set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_VOIDED,
                             "the provider canceled the hold on its own: expired");
        return;
    case ATTEMPT_STATUS_PROCESSING:
    case ATTEMPT_STATUS_UNKNOWN:
        webhook_decision_set(
            d, WEBHOOK_APPLY, ATTEMPT_STATUS_FAILED,
            "the provider canceled the authorization before its hold was recorded");
        return;
    case ATTEMPT_STATUS_SUCCEEDED:
        webhook_decision_set(
            d, WEBHOOK_REVIEW, ATTEMPT_STATUS_REQUIRES_REVIEW,
            "the provider reported the expiry of a captured authorization");
        return;
    case ATTEMPT_STATUS_VOIDED:
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "already voided");
        return;
    default:
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "nothing to change");
        return;
    }
}

/* The hold, and the provider's own cancel of one (its expiry); a failure
 * of its intent is decided as a charge's. */
static int authorize_event_takes(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev);
    return ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED || webhook_event_is_expiry(ev);
}

static void authorize_event_of_ours(const struct webhook_event *ev,
                                    const struct webhook_attempt *a,
                                    struct webhook_decision *d)
{
    CHARGED_ASSERT(ev && a && d);
    if (webhook_event_is_expiry(ev))
        decide_expiry(a, d);
    else
        decide_hold(a, d);
}

static const struct webhook_meaning authorize_event_meaning = {
    .takes = authorize_event_takes,
    .of_ours = authorize_event_of_ours,
    .other_charge = "the provider reported a hold of another amount or currency",
};

void authorize_event_decide(const struct webhook_event *ev,
                            const struct webhook_attempt *a, struct webhook_decision *d)
{
    CHARGED_ASSERT(ev != NULL && a != NULL && d != NULL);
    CHARGED_ASSERT((unsigned)a->status < ATTEMPT_STATUS__COUNT);
    webhook_event_decide_as(&authorize_event_meaning, ev, a, d);
}
