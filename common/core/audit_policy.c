#include "audit_policy.h"

#include <string.h>
#include <strings.h>

#include "charged_assert.h"
#include "ownership.h"

static const char *const kind_names[AUDIT_KIND__COUNT] = {
    [AUDIT_CHARGED_TWICE] = "charged_twice",
    [AUDIT_CHARGED_UNBOOKED] = "charged_unbooked",
    [AUDIT_BOOKED_NOT_CHARGED] = "booked_not_charged",
    [AUDIT_AMOUNT_MISMATCH] = "amount_mismatch",
    [AUDIT_CURRENCY_MISMATCH] = "currency_mismatch",
    [AUDIT_UNKNOWN_INTENT] = "unknown_intent",
    [AUDIT_REFUND_UNBOOKED] = "refund_unbooked",
    [AUDIT_REFUNDED_OVER_CHARGE] = "refunded_over_charge",
    [AUDIT_BOOKED_FOREIGN] = "booked_foreign",
    [AUDIT_FOREIGN_INTENT] = "foreign_intent",
    [AUDIT_CAPTURED_OVER_AUTHORIZED] = "captured_over_authorized",
    [AUDIT_CAPTURE_UNBOOKED] = "capture_unbooked",
    [AUDIT_VOID_UNBOOKED] = "void_unbooked",
    [AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED] = "authorization_expired_unvoided",
};

const char *audit_kind_name(enum audit_kind k)
{
    /* Every kind has its name: the table is ours. */
    CHARGED_ASSERT((unsigned)k >= AUDIT_KIND__COUNT || kind_names[k] != NULL);
    return (unsigned)k < AUDIT_KIND__COUNT ? kind_names[k] : NULL;
}

int audit_kind_parse(const char *name)
{
    for (int k = 0; name && k < AUDIT_KIND__COUNT; k++)
        if (!strcmp(name, kind_names[k]))
            return k;
    return -1;
}

static struct audit_result matched(void)
{
    return (struct audit_result){AUDIT_MATCHED, 0, "", 0};
}

static struct audit_result pending(const char *why)
{
    CHARGED_ASSERT(why && *why); /* a verdict not taken says why */
    return (struct audit_result){AUDIT_PENDING, 0, why, 0};
}

static struct audit_result finding(enum audit_kind k, const char *why)
{
    CHARGED_ASSERT((unsigned)k < AUDIT_KIND__COUNT && why && *why);
    return (struct audit_result){AUDIT_FINDING, k, why, 0};
}

int audit_policy_same_currency(const char *a, const char *b)
{
    return a && b && *a && strlen(a) == strlen(b) && !strcasecmp(a, b);
}

/* The attempt may still become SUCCEEDED on this very intent: the
 * reconciler, a webhook or an operator settles these. */
static int attempt_unsettled(const char *status)
{
    CHARGED_ASSERT(status);
    static const char *const open[] = {"PENDING", "PROCESSING", "UNKNOWN",
                                       "REQUIRES_REVIEW"};
    for (size_t i = 0; i < sizeof(open) / sizeof(open[0]); i++)
        if (!strcmp(status, open[i]))
            return 1;
    return 0;
}

/* Whose intent it is, for the attempt it is judged for (ownership.h). A
 * booking is checked against the intent's metadata and against the other
 * attempts' records, not against the id it recorded itself: that id is the
 * booking under test (a forced resolve records whatever it was told). */
static int foreign(const struct audit_intent_facts *f)
{
    struct ownership_claim c = {
        .recorded_id = f->booked ? "" : f->attempt_recorded_id,
        .object_id = f->object_id,
        .recorded_elsewhere = f->recorded_elsewhere,
        .names_another = f->names_another,
    };
    return ownership_judge(&c, NULL, 0) == OWNERSHIP_FOREIGN;
}

static struct audit_result booked_intent(const struct audit_intent_facts *f)
{
    if (foreign(f))
        return finding(AUDIT_BOOKED_FOREIGN,
                       "booked intent belongs to another attempt or order");
    if (strcmp(f->status, "succeeded") != 0) {
        /* Money may still move: the ledger side judges it once it
         * settles (booked_not_charged when it never does). */
        if (!strcmp(f->status, "processing"))
            return pending("booked intent still processing");
        /* The provider's list is read before our books: a hold listed, then
         * captured and booked. Judged again, on a read after the books. */
        if (f->manual && !strcmp(f->status, "requires_capture"))
            return pending("booked intent still held when listed");
        return finding(AUDIT_BOOKED_NOT_CHARGED,
                       "booked intent is not succeeded at the provider");
    }
    /* A manual intent's money is what the provider took, not what it held. */
    long long taken =
        f->manual && f->amount_received >= 0 ? f->amount_received : f->amount;
    if (taken != f->booked_amount)
        return finding(AUDIT_AMOUNT_MISMATCH,
                       "provider amount differs from the ledger's");
    if (!audit_policy_same_currency(f->currency, f->booked_currency))
        return finding(AUDIT_CURRENCY_MISMATCH,
                       "provider currency differs from the ledger's");
    return matched();
}

/* No attempt named. Nothing judged final may depend on an unsettled row: an
 * attempt of its order that may still succeed on its own intent, or this
 * intent still processing. Judged unknown_intent then, it would stay so
 * when the order is paid twice. */
static struct audit_result order_only_intent(const struct audit_intent_facts *f)
{
    int succeeded = !strcmp(f->status, "succeeded");
    /* order_charged_twice: an order of ours already paid is named, a
     * second charge of it, whoever made it. */
    if (succeeded && f->order_booked_other)
        return finding(AUDIT_CHARGED_TWICE,
                       "second succeeded intent for an order already paid");
    if (!strcmp(f->status, "processing"))
        return pending("intent still processing");
    if (succeeded && f->order_unsettled)
        return pending("an attempt of its order is not settled yet");
    /* Not ours at all: someone made it outside charged. */
    return finding(AUDIT_UNKNOWN_INTENT, "intent without charged metadata");
}

/* A succeeded intent naming an attempt, not booked: a second charge, one
 * the attempt may still settle on, or money charged never booked. */
static struct audit_result unbooked_money(const struct audit_intent_facts *f,
                                          int is_foreign)
{
    if (f->attempt_booked_other)
        return finding(AUDIT_CHARGED_TWICE,
                       "second succeeded intent for an attempt already booked");
    if (f->order_booked_other)
        return finding(AUDIT_CHARGED_TWICE,
                       "second succeeded intent for an order already paid");
    if (f->earlier_twin)
        return finding(AUDIT_CHARGED_TWICE,
                       "second succeeded intent for one attempt or order");
    /* A manual intent of ours: the operations' rules about its steps are
     * the books to compare with (audit_policy_steps), with their own grace
     * while a step is in flight. */
    if (!is_foreign && f->steps_ours)
        return matched();
    /* A foreign intent never settles the attempt: waiting changes nothing.
     * Nor is it waited for while the attempt sits in REQUIRES_REVIEW: only a
     * person moves it, and until one does this money is taken and unbooked
     * with no page at all (an intent that only names the attempt is
     * `unproven` at the api). It is judged now; a booking later matches. */
    if (!is_foreign && *f->attempt_status && attempt_unsettled(f->attempt_status) &&
        strcmp(f->attempt_status, "REQUIRES_REVIEW") != 0)
        return pending("attempt not settled yet");
    return finding(AUDIT_CHARGED_UNBOOKED,
                   !strcmp(f->attempt_status, "REQUIRES_REVIEW")
                       ? "succeeded intent, unbooked while its attempt waits in review"
                   : *f->attempt_status
                       ? "succeeded intent, attempt not SUCCEEDED on it"
                       : "succeeded intent for an attempt we never recorded");
}

struct audit_result audit_policy_order_twin(const struct audit_intent_facts *f)
{
    CHARGED_ASSERT(f);
    /* The order_charged_twice rule (order_only_intent) seen from the paid
     * side: an intent judged unknown_intent before this one was booked is
     * judged again now that its order is paid. */
    if (f->booked && f->order_only_twin && !strcmp(f->status, "succeeded"))
        return finding(AUDIT_CHARGED_TWICE,
                       "second succeeded intent for an order already paid");
    return matched();
}

struct audit_result audit_policy_intent(const struct audit_intent_facts *f)
{
    CHARGED_ASSERT(f);
    if (f->booked)
        return booked_intent(f);
    if (!f->has_attempt_metadata)
        return order_only_intent(f);
    if (!strcmp(f->status, "processing"))
        return pending("intent still processing");
    /* Another client's intent naming an attempt of ours (one we have). */
    int is_foreign = *f->attempt_status && foreign(f);
    if (strcmp(f->status, "succeeded") != 0)
        return is_foreign ? finding(AUDIT_FOREIGN_INTENT,
                                    "another client's intent names our attempt")
                          : matched(); /* declined, canceled: no money */
    struct audit_result r = unbooked_money(f, is_foreign);
    r.also_foreign = is_foreign;
    return r;
}

int audit_policy_step_grace(const char *attempt_status, int step_unsettled)
{
    CHARGED_ASSERT(attempt_status);
    return step_unsettled || (attempt_unsettled(attempt_status) &&
                              strcmp(attempt_status, "REQUIRES_REVIEW") != 0);
}

struct audit_result audit_result_matched(void)
{
    return matched();
}

struct audit_result audit_result_pending(const char *why)
{
    return pending(why);
}

struct audit_result audit_result_finding(enum audit_kind k, const char *why)
{
    return finding(k, why);
}

int audit_policy_steps(const struct audit_step_facts *f,
                       const struct audit_step_table *t,
                       struct audit_result out[AUDIT_STEP_RULES_MAX], size_t *n)
{
    CHARGED_ASSERT(f && t && out && n);
    CHARGED_ASSERT(t->n <= AUDIT_STEP_SETS_MAX);
    int ours = *f->attempt_status != '\0', waits = 0;
    /* Held, or on its way to be: it may yet be taken, released or expire.
     * Nothing of it but what is final whoever's (any_owner) is judged
     * until then. */
    int held =
        !strcmp(f->status, "requires_capture") || !strcmp(f->status, "processing");
    size_t col = 0;
    *n = 0;
    for (size_t s = 0; s < t->n; s++) {
        const struct audit_steps *set = t->sets[s];
        CHARGED_ASSERT(col + set->ncolumns <= AUDIT_STEP_COLUMNS_MAX);
        for (size_t r = 0; r < set->nrules; r++) {
            const struct audit_step_rule *rule = &set->rules[r];
            CHARGED_ASSERT(*n < AUDIT_STEP_RULES_MAX);
            out[*n] = matched();
            if (f->manual && (rule->any_owner || (ours && !held)))
                out[*n] = rule->judge(f, f->columns + col, ours);
            waits |= out[*n].outcome == AUDIT_PENDING;
            (*n)++;
        }
        col += set->ncolumns;
    }
    if (!f->manual)
        return 0;
    /* Not ours yet: the attempt its metadata names may still record it. */
    if (!ours)
        return f->named_unsettled || waits;
    return held || waits;
}

/* A booked refund is the booking's refund only on the booking's charge's
 * intent, and when its metadata names no other refund (ownership.h). */
static int refund_foreign(const struct audit_refund_facts *f)
{
    struct ownership_claim c = {
        .parent_id = f->booked_intent,
        .object_parent_id = f->object_intent,
        .names_another = f->names_another,
    };
    return ownership_judge(&c, NULL, 0) == OWNERSHIP_FOREIGN;
}

static int refund_unsettled(const char *status)
{
    return !strcmp(status, "pending") || !strcmp(status, "requires_action");
}

/* A booked refund is judged as a booked intent is: the ledger says money
 * went back, so a refund the provider failed or canceled is a finding,
 * not "no money moved" (a forced resolve books what it is told, and a
 * refund may fail after it looked done). */
static struct audit_result booked_refund(const struct audit_refund_facts *f)
{
    if (refund_foreign(f))
        return finding(AUDIT_BOOKED_FOREIGN,
                       "booked refund belongs to another refund or charge");
    if (refund_unsettled(f->status))
        return pending("booked refund still pending");
    if (strcmp(f->status, "succeeded") != 0)
        return finding(AUDIT_BOOKED_NOT_CHARGED,
                       "booked refund is not succeeded at the provider");
    if (f->amount != f->booked_amount)
        return finding(AUDIT_AMOUNT_MISMATCH,
                       "provider refund amount differs from the ledger's");
    return matched();
}

struct audit_result audit_policy_refund(const struct audit_refund_facts *f)
{
    CHARGED_ASSERT(f);
    if (f->booked)
        return booked_refund(f);
    if (refund_unsettled(f->status))
        return pending("refund still pending");
    if (strcmp(f->status, "succeeded") != 0)
        return matched(); /* failed or canceled: no money moved */
    if (*f->refund_status && attempt_unsettled(f->refund_status))
        return pending("refund attempt not settled yet");
    return finding(AUDIT_REFUND_UNBOOKED,
                   *f->refund_status ? "succeeded refund, refund attempt not SUCCEEDED"
                                     : "succeeded refund we never requested");
}

struct audit_result audit_policy_ledger(const struct audit_ledger_facts *f)
{
    CHARGED_ASSERT(f);
    if (!f->provider_status)
        return finding(AUDIT_BOOKED_NOT_CHARGED,
                       "provider does not have the booked object");
    if (!strcmp(f->provider_status, "processing") ||
        !strcmp(f->provider_status, "pending"))
        return pending("booked object still processing at the provider");
    if (strcmp(f->provider_status, "succeeded") != 0)
        return finding(AUDIT_BOOKED_NOT_CHARGED,
                       "booked object is not succeeded at the provider");
    if (f->provider_amount != f->amount)
        return finding(AUDIT_AMOUNT_MISMATCH,
                       "provider amount differs from the ledger's");
    if (!audit_policy_same_currency(f->provider_currency, f->currency))
        return finding(AUDIT_CURRENCY_MISMATCH,
                       "provider currency differs from the ledger's");
    return matched();
}

int audit_policy_over_refunded(long long refunded_total, long long charge_amount)
{
    return refunded_total > charge_amount;
}
