#include "webhook_event.h"

#include <string.h>

#include "charged_assert.h"
#include "ownership.h"

const char *webhook_action_name(enum webhook_action a)
{
    switch (a) {
    case WEBHOOK_IGNORE:
        return "ignored";
    case WEBHOOK_APPLY:
        return "applied";
    case WEBHOOK_REVIEW:
        return "review";
    case WEBHOOK_FLAG:
        return "flagged";
    case WEBHOOK_UNPROVEN:
        return "unproven";
    case WEBHOOK_ACTION__COUNT:
        break;
    }
    return "ignored";
}

void webhook_decision_set(struct webhook_decision *d, enum webhook_action action,
                          enum attempt_status status, const char *reason)
{
    CHARGED_ASSERT(d != NULL);
    CHARGED_ASSERT((unsigned)action <= WEBHOOK_UNPROVEN);
    CHARGED_ASSERT((unsigned)status < ATTEMPT_STATUS__COUNT && reason != NULL);
    d->check_now = 0;
    d->action = action;
    d->status = status;
    d->reason = reason;
}

/* A recorded id the database found different from the event's: never a
 * plain token, so never equal to one the event carries. */
static const char ANOTHER_ID[] = "(another)";

/* Whose intent the event is about (ownership.h). The database compared the
 * ids, whatever their length: the recorded one stands as the event's when
 * they are equal, as another otherwise. */
static enum ownership_verdict intent_owner(const struct webhook_event *ev,
                                           const struct webhook_attempt *a)
{
    const struct ownership_claim c = {
        .recorded_id = !a->intent_recorded ? NULL
                       : a->intent_differs ? ANOTHER_ID
                                           : ev->intent_id,
        .object_id = ev->intent_id,
        .recorded_elsewhere = a->intent_elsewhere,
    };
    return ownership_judge(&c, NULL, 0);
}

/* Our own intent, yet another charge: its amount or currency differ. */
static int other_charge(const struct webhook_event *ev, const struct webhook_attempt *a)
{
    return (ev->amount >= 0 && ev->amount != a->amount) ||
           (ev->currency[0] && strcmp(ev->currency, a->currency));
}

/* An intent not proven ours never moves the attempt. Its success could be
 * money taken in our name: flagged loudly for a person, our attempt left
 * as it is. Not while the attempt's own call is in flight or unknown and
 * nothing of ours is recorded: the provider's webhook often outruns our
 * own answer, and paging on every such race would teach people to ignore
 * the page. Then it is unproven: the attempt's own call, or the
 * reconciler's replay under its key, settles it, and the auditor pages on
 * an intent that stays no attempt's own (foreign_intent, charged_twice).
 * An UNKNOWN attempt is looked at now: the charge again under its own key
 * is the proof the event is not. */
static void decide_not_ours(const struct webhook_event *ev,
                            const struct webhook_attempt *a, enum ownership_verdict v,
                            struct webhook_decision *d)
{
    CHARGED_ASSERT(v == OWNERSHIP_UNPROVEN || v == OWNERSHIP_FOREIGN);
    int foreign = v == OWNERSHIP_FOREIGN;
    int in_flight =
        a->status == ATTEMPT_STATUS_PROCESSING || a->status == ATTEMPT_STATUS_UNKNOWN;
    if (ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED && !foreign && in_flight)
        webhook_decision_set(
            d, WEBHOOK_UNPROVEN, a->status,
            "the provider reported success of an intent that only names the attempt; "
            "its own call settles it");
    else if (ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED)
        webhook_decision_set(
            d, WEBHOOK_FLAG, a->status,
            foreign ? "the provider reported success of another's intent"
                    : "the provider reported success of an intent that only names "
                      "the attempt");
    else
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                             foreign ? "about another's intent"
                                     : "about an intent that only names the attempt");
    d->check_now = a->status == ATTEMPT_STATUS_UNKNOWN;
    /* Not proven ours: the attempt stays as it is, whatever the event. */
    CHARGED_ASSERT(d->status == a->status);
}

static void decide_success(const struct webhook_event *ev,
                           const struct webhook_attempt *a, struct webhook_decision *d)
{
    const enum attempt_status RV = ATTEMPT_STATUS_REQUIRES_REVIEW;
    CHARGED_ASSERT(ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED);
    if (other_charge(ev, a)) {
        switch (a->status) {
        case ATTEMPT_STATUS_PROCESSING:
        case ATTEMPT_STATUS_UNKNOWN:
        case ATTEMPT_STATUS_SUCCEEDED:
        case ATTEMPT_STATUS_FAILED:
            webhook_decision_set(d, WEBHOOK_REVIEW, RV,
                                 "the provider reported success for another charge");
            return;
        case ATTEMPT_STATUS_REQUIRES_REVIEW:
            webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "already under review");
            return;
        default:
            webhook_decision_set(d, WEBHOOK_FLAG, a->status,
                                 "the provider reported success for another charge");
            return;
        }
    }
    switch (a->status) {
    case ATTEMPT_STATUS_PROCESSING:
    case ATTEMPT_STATUS_UNKNOWN:
        webhook_decision_set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_SUCCEEDED,
                             "the provider reported success");
        return;
    case ATTEMPT_STATUS_SUCCEEDED:
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "already succeeded");
        return;
    case ATTEMPT_STATUS_FAILED:
        webhook_decision_set(d, WEBHOOK_REVIEW, RV,
                             "the provider reported success for a failed attempt");
        return;
    case ATTEMPT_STATUS_REQUIRES_REVIEW:
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "already under review");
        return;
    case ATTEMPT_STATUS_PENDING:
        /* Not sent by us yet: our own call, with the same key, will be
         * answered with this success. */
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                             "not sent yet; the call will see it");
        return;
    default:
        webhook_decision_set(d, WEBHOOK_FLAG, a->status,
                             "the provider reported success for a rejected attempt");
        return;
    }
}

static void decide(const struct webhook_event *ev, const struct webhook_attempt *a,
                   struct webhook_decision *d);

/* A FAILED attempt may have been followed by another attempt of its
 * order: it cannot become live (REQUIRES_REVIEW) again beside it. The
 * evidence is kept for a person instead, loudly, never lost. */
static void keep_order_live_once(const struct webhook_attempt *a,
                                 struct webhook_decision *d)
{
    if ((d->action == WEBHOOK_APPLY || d->action == WEBHOOK_REVIEW) &&
        attempt_status_is_live(d->status) && !attempt_status_is_live(a->status) &&
        a->order_has_other_live) {
        d->action = WEBHOOK_FLAG;
        d->reason = "contradicts a failed attempt whose order has another live attempt";
        d->status = a->status;
    }
    /* Only APPLY and REVIEW move the attempt, and each to another state. */
    CHARGED_ASSERT((d->action == WEBHOOK_APPLY || d->action == WEBHOOK_REVIEW) ==
                   (d->status != a->status));
    CHARGED_ASSERT(!d->check_now || a->status == ATTEMPT_STATUS_UNKNOWN);
}

void webhook_event_decide(const struct webhook_event *ev,
                          const struct webhook_attempt *a, struct webhook_decision *d)
{
    CHARGED_ASSERT(ev != NULL && a != NULL && d != NULL);
    CHARGED_ASSERT((unsigned)a->status < ATTEMPT_STATUS__COUNT);
    decide(ev, a, d);
    keep_order_live_once(a, d);
}

int webhook_event_is_expiry(const struct webhook_event *ev)
{
    CHARGED_ASSERT(ev != NULL);
    return ev->evidence == WEBHOOK_EVIDENCE_FAILED &&
           !strcmp(ev->intent_status, "canceled") &&
           !strcmp(ev->cancellation_reason, "automatic");
}

void webhook_event_decide_as(const struct webhook_meaning *m,
                             const struct webhook_event *ev,
                             const struct webhook_attempt *a,
                             struct webhook_decision *d)
{
    CHARGED_ASSERT(m && m->takes && m->of_ours && m->other_charge);
    CHARGED_ASSERT(ev != NULL && a != NULL && d != NULL);
    CHARGED_ASSERT((unsigned)a->status < ATTEMPT_STATUS__COUNT);
    if (!m->takes(ev)) {
        webhook_event_decide(ev, a, d); /* not its own evidence: as a charge's */
        return;
    }
    enum ownership_verdict v = intent_owner(ev, a);
    if (v != OWNERSHIP_OURS)
        decide_not_ours(ev, a, v, d);
    else if (other_charge(ev, a))
        webhook_decision_set(d, WEBHOOK_FLAG, a->status, m->other_charge);
    else
        m->of_ours(ev, a, d);
    keep_order_live_once(a, d);
}

static void decide(const struct webhook_event *ev, const struct webhook_attempt *a,
                   struct webhook_decision *d)
{
    CHARGED_ASSERT((unsigned)ev->evidence < WEBHOOK_EVIDENCE__COUNT);
    /* A refund's event is about a refund, not the attempt; a hold is no
     * charge's evidence. */
    if (ev->evidence == WEBHOOK_EVIDENCE_NONE ||
        ev->evidence == WEBHOOK_EVIDENCE_REFUND ||
        ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED) {
        webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "event type not acted on");
        return;
    }
    enum ownership_verdict v = intent_owner(ev, a);
    if (v != OWNERSHIP_OURS) {
        decide_not_ours(ev, a, v, d);
        return;
    }
    switch (ev->evidence) {
    case WEBHOOK_EVIDENCE_NONE:
    case WEBHOOK_EVIDENCE_REFUND:
    case WEBHOOK_EVIDENCE_AUTHORIZED:
    case WEBHOOK_EVIDENCE__COUNT:
        break;
    case WEBHOOK_EVIDENCE_SUCCEEDED:
        decide_success(ev, a, d);
        return;
    case WEBHOOK_EVIDENCE_FAILED:
        if (other_charge(ev, a)) {
            /* No money moved on a failure: nothing to review. */
            webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                                 "failure of another charge");
        } else if (a->status == ATTEMPT_STATUS_PROCESSING ||
                   a->status == ATTEMPT_STATUS_UNKNOWN) {
            webhook_decision_set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_FAILED,
                                 "the provider reported failure");
        } else if (a->status == ATTEMPT_STATUS_SUCCEEDED &&
                   ev->created > a->updated_at) {
            webhook_decision_set(d, WEBHOOK_REVIEW, ATTEMPT_STATUS_REQUIRES_REVIEW,
                                 "the provider reported failure after success");
        } else if (a->status == ATTEMPT_STATUS_SUCCEEDED) {
            webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                                 "older than the success it would undo");
        } else {
            webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "nothing to change");
        }
        return;
    case WEBHOOK_EVIDENCE_PROCESSING:
        if (!other_charge(ev, a) && a->status == ATTEMPT_STATUS_UNKNOWN)
            webhook_decision_set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_PROCESSING,
                                 "the provider is processing it");
        else if (attempt_status_is_settled(a->status))
            webhook_decision_set(d, WEBHOOK_IGNORE, a->status,
                                 "older than the current state");
        else
            webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "nothing to change");
        return;
    }
    webhook_decision_set(d, WEBHOOK_IGNORE, a->status, "event type not acted on");
}

int webhook_refund_status(const char *provider_status)
{
    if (!strcmp(provider_status, "succeeded"))
        return ATTEMPT_STATUS_SUCCEEDED;
    if (!strcmp(provider_status, "failed") || !strcmp(provider_status, "canceled"))
        return ATTEMPT_STATUS_FAILED;
    if (!strcmp(provider_status, "pending") ||
        !strcmp(provider_status, "requires_action"))
        return ATTEMPT_STATUS_PROCESSING;
    return -1;
}

static void refund_set(struct webhook_refund_decision *d,
                       enum webhook_refund_action action, enum attempt_status status,
                       const char *reason)
{
    CHARGED_ASSERT((unsigned)action <= WEBHOOK_REFUND_UNPROVEN);
    CHARGED_ASSERT((unsigned)status < ATTEMPT_STATUS__COUNT && reason != NULL);
    d->check_now = 0;
    d->action = action;
    d->status = status;
    d->reason = reason;
}

static void refund_decide(const struct webhook_refund *r,
                          const struct webhook_refund_row *row,
                          struct webhook_refund_decision *d);

/* Whose refund the event's is (ownership.h), from what the database
 * compared: the ids recorded, and the intent our refund is on. */
static enum ownership_verdict refund_owner(const struct webhook_refund *r,
                                           const struct webhook_refund_row *row)
{
    const struct ownership_claim c = {
        .recorded_id = !row->provider_id_recorded ? NULL
                       : row->provider_id_differs ? ANOTHER_ID
                                                  : r->id,
        .object_id = r->id,
        .recorded_elsewhere = row->provider_id_elsewhere,
        .parent_id = row->intent_differs ? ANOTHER_ID : r->payment_intent,
        .object_parent_id = r->payment_intent,
    };
    return ownership_judge(&c, NULL, 0);
}

/* Our own refund, yet another amount or currency than we asked. */
static int other_refund(const struct webhook_refund *r,
                        const struct webhook_refund_row *row)
{
    return (r->amount >= 0 && r->amount != row->amount) ||
           (r->currency[0] && row->currency[0] && strcmp(r->currency, row->currency));
}

/* A refund not proven ours never moves the row, and never gives a
 * reservation back: its success is recorded for a person, anything else
 * ignored; an UNKNOWN refund is looked at now (its refund again under its
 * own key is the proof). Not while the refund's own call is in flight or
 * unknown and no provider id of ours is recorded: as for an attempt
 * (decide_not_ours), the provider's webhook often outruns our answer, and
 * a ticket for every such race would teach people to ignore it. Then it is
 * unproven: the refund's own call or the reconciler's replay settles it,
 * and the auditor reports a refund that stays no refund's own
 * (refund_unbooked). */
static void refund_not_ours(const struct webhook_refund *r,
                            const struct webhook_refund_row *row,
                            enum ownership_verdict v, struct webhook_refund_decision *d)
{
    CHARGED_ASSERT(v == OWNERSHIP_UNPROVEN || v == OWNERSHIP_FOREIGN);
    int foreign = v == OWNERSHIP_FOREIGN;
    int in_flight = row->status == ATTEMPT_STATUS_PROCESSING ||
                    row->status == ATTEMPT_STATUS_UNKNOWN;
    int succeeded = webhook_refund_status(r->status) == ATTEMPT_STATUS_SUCCEEDED;
    if (succeeded && !foreign && in_flight && !row->provider_id_recorded)
        refund_set(d, WEBHOOK_REFUND_UNPROVEN, row->status,
                   "the provider reported success of a refund that only names ours; "
                   "its own call settles it");
    else if (succeeded)
        refund_set(d, WEBHOOK_REFUND_NEEDS_REVIEW, row->status,
                   foreign ? "the provider reported success of another's refund"
                           : "the provider reported success of a refund that only "
                             "names ours");
    else
        refund_set(d, WEBHOOK_REFUND_IGNORE, row->status,
                   foreign ? "about another's refund"
                           : "about a refund that only names ours");
    d->check_now = row->status == ATTEMPT_STATUS_UNKNOWN;
}

void webhook_refund_decide(const struct webhook_refund *r,
                           const struct webhook_refund_row *row,
                           struct webhook_refund_decision *d)
{
    CHARGED_ASSERT(r != NULL && row != NULL && d != NULL);
    CHARGED_ASSERT((unsigned)row->status < ATTEMPT_STATUS__COUNT);
    refund_decide(r, row, d);
    /* Only APPLY moves the refund, and to another state: what is refunded
     * only grows on evidence about this refund. */
    CHARGED_ASSERT((d->action == WEBHOOK_REFUND_APPLY) == (d->status != row->status));
    CHARGED_ASSERT(!d->check_now || row->status == ATTEMPT_STATUS_UNKNOWN);
}

static void refund_decide(const struct webhook_refund *r,
                          const struct webhook_refund_row *row,
                          struct webhook_refund_decision *d)
{
    const enum attempt_status cur = row->status;
    int open = cur == ATTEMPT_STATUS_PROCESSING || cur == ATTEMPT_STATUS_UNKNOWN;
    enum ownership_verdict v = refund_owner(r, row);

    if (v != OWNERSHIP_OURS && webhook_refund_status(r->status) >= 0) {
        refund_not_ours(r, row, v, d);
        return;
    }

    switch (webhook_refund_status(r->status)) {
    case ATTEMPT_STATUS_SUCCEEDED:
        if (other_refund(r, row) && cur != ATTEMPT_STATUS_PENDING)
            refund_set(d, WEBHOOK_REFUND_NEEDS_REVIEW, cur,
                       "the provider reported success for another refund");
        else if (open)
            refund_set(d, WEBHOOK_REFUND_APPLY, ATTEMPT_STATUS_SUCCEEDED,
                       "the provider reported the refund succeeded");
        else if (cur == ATTEMPT_STATUS_SUCCEEDED)
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "already succeeded");
        else if (cur == ATTEMPT_STATUS_PENDING)
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur,
                       "not sent yet; the call will see it");
        else if (cur == ATTEMPT_STATUS_REQUIRES_REVIEW)
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "already under review");
        else
            refund_set(
                d, WEBHOOK_REFUND_NEEDS_REVIEW, cur,
                "the provider reported success for a refund we hold as not made");
        return;
    case ATTEMPT_STATUS_FAILED:
        if (cur == ATTEMPT_STATUS_SUCCEEDED && !other_refund(r, row))
            refund_set(d, WEBHOOK_REFUND_NEEDS_REVIEW, cur,
                       "the provider reported failure of a succeeded refund");
        else if (other_refund(r, row))
            /* No money moved on a failure: nothing to apply. */
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "failure of another refund");
        else if (open)
            refund_set(d, WEBHOOK_REFUND_APPLY, ATTEMPT_STATUS_FAILED,
                       "the provider reported the refund failed");
        else
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "nothing to change");
        return;
    case ATTEMPT_STATUS_PROCESSING:
        if (cur == ATTEMPT_STATUS_UNKNOWN && !other_refund(r, row))
            refund_set(d, WEBHOOK_REFUND_APPLY, ATTEMPT_STATUS_PROCESSING,
                       "the provider is processing the refund");
        else if (attempt_status_is_settled(cur))
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "older than the current state");
        else
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "nothing to change");
        return;
    default:
        refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "refund status not acted on");
        return;
    }
}
