/* Unit tests of common/core/reconcile_policy: docs/reconciler.md's order of
 * evidence, one row per rule it states, the adversarial ones included. Each
 * row plays one look the way the reconciler does (the policy names a call,
 * the row's answer to that call is added, until it settles) and asserts the
 * calls made, in order, and the decision. The expectations are written out
 * here from the documentation, not computed from the module. The last tests
 * step reconcile_look, the look itself as the reconciler runs it. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "reconcile_answers.h"
#include "reconcile_look.h"
#include "reconcile_policy.h"
#include "test_env.h"

static const struct {
    const char *doc; /* the rule, as docs/reconciler.md has it */
    enum attempt_status status;
    const char *ppid; /* the intent id the attempt knows */
    long long key_age_ms, lookup_after_ms, first_sent_ms, age_ms;
    const struct answer *lookup, *search, *charge, *list;
    const char *calls; /* made, in order */
    enum reconcile_rule rule;
    enum attempt_status want;
    const char *reason, *booked;
} rows[] = {
    /* 1. Look it up: by id when known, otherwise by search. */
    {"found by id, PAID: SUCCEEDED (the search knows no other)", ATTEMPT_STATUS_UNKNOWN,
     "pi_1", 1000, 5, 1, 2000, PAID, PAID, NULL, NULL, "retrieve search",
     RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "", "pi_1"},
    /* Issue 34: a search only finds what names the attempt (anyone may
     * write metadata): it never settles it. Before, this row settled the
     * attempt SUCCEEDED on whatever the search found. */
    {"found by search past the window, PAID: unproven, a person decides",
     ATTEMPT_STATUS_UNKNOWN, "", WINDOW, 5, 1, 2000, PAID, NULL, NULL, NULL, "search",
     RECONCILE_FOUND_UNPROVEN, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: unproven: intent pi_1 (succeeded): it only names us: neither "
     "our recorded id nor the answer under our key",
     ""},
    {"found by search past the window, declined: unproven, never FAILED on it",
     ATTEMPT_STATUS_UNKNOWN, "", WINDOW, 5, 1, 2000,
     A(INTENT(PROVIDER_DECLINED, "requires_payment_method", "pi_x"), OURS, ONE,
       .code = "card_declined"),
     NULL, NULL, NULL, "search", RECONCILE_FOUND_UNPROVEN,
     ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: unproven: intent pi_x (requires_payment_method): it only names "
     "us: neither our recorded id nor the answer under our key",
     ""},
    /* Issue 34, break 2: inside the key's window a foreign declined intent
     * naming the attempt settled it FAILED while its own call executed.
     * Now the proof is the charge again under our key; nothing is searched. */
    {"no id inside the window: the charge again under our key, never a search",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000,
     A(INTENT(PROVIDER_DECLINED, "requires_payment_method", "pi_x"), OURS, ONE,
       .code = "card_declined"),
     NULL, A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_2"), OURS), NULL, "charge",
     RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "", "pi_2"},
    {"our charge again answered 409 (our first call still executes): look again",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NULL, NULL,
     A(.outcome = PROVIDER_NOT_EXECUTED, .http_status = 409,
       .error = "idempotency_key_in_use"),
     NULL, "charge", RECONCILE_CHARGE_NOT_EXECUTED, ATTEMPT_STATUS_UNKNOWN,
     "sent again, not executed: idempotency_key_in_use", ""},
    {"a PROCESSING attempt's charge again answered 409: stays PROCESSING",
     ATTEMPT_STATUS_PROCESSING, "", 1000, 5, 1, 2000, NULL, NULL,
     A(.outcome = PROVIDER_NOT_EXECUTED, .http_status = 409,
       .error = "idempotency_key_in_use"),
     NULL, "charge", RECONCILE_CHARGE_NOT_EXECUTED, ATTEMPT_STATUS_PROCESSING,
     "sent again, not executed: idempotency_key_in_use", ""},
    {"found by id, PAID, and the search says nothing today: SUCCEEDED",
     ATTEMPT_STATUS_PROCESSING, "pi_1", 1000, 5, 1, 2000, PAID, NO_ANSWER, NULL, NULL,
     "retrieve search", RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "",
     "pi_1"},
    {"found, requires_payment_method: FAILED with its decline code",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, 2000,
     A(INTENT(PROVIDER_DECLINED, "requires_payment_method", "pi_1"), OURS, ONE,
       .code = "card_declined", .decline_code = "insufficient_funds"),
     NULL, NULL, NULL, "retrieve", RECONCILE_FOUND_DECLINED, ATTEMPT_STATUS_FAILED,
     "declined: card_declined: insufficient_funds", "pi_1"},
    {"found, canceled without a code: FAILED, declined", ATTEMPT_STATUS_UNKNOWN, "pi_1",
     1000, 5, 1, 2000, A(INTENT(PROVIDER_DECLINED, "canceled", "pi_1"), OURS, ONE),
     NULL, NULL, NULL, "retrieve", RECONCILE_FOUND_DECLINED, ATTEMPT_STATUS_FAILED,
     "declined: declined", "pi_1"},
    {"found processing, an UNKNOWN attempt: PROCESSING, looked at again",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, 2000,
     A(INTENT(PROVIDER_PROCESSING, "processing", "pi_1"), OURS, ONE), NULL, NULL, NULL,
     "retrieve", RECONCILE_FOUND_PROCESSING, ATTEMPT_STATUS_PROCESSING,
     "provider_processing", "pi_1"},
    {"found processing, a PROCESSING attempt: stays, looked at again",
     ATTEMPT_STATUS_PROCESSING, "pi_1", 1000, 5, 1, 2000,
     A(INTENT(PROVIDER_PROCESSING, "processing", "pi_1"), OURS, ONE), NULL, NULL, NULL,
     "retrieve", RECONCILE_FOUND_PROCESSING, ATTEMPT_STATUS_PROCESSING,
     "provider_processing", "pi_1"},
    {"found with any other status: REQUIRES_REVIEW", ATTEMPT_STATUS_UNKNOWN, "pi_1",
     1000, 5, 1, 2000,
     A(INTENT(PROVIDER_REQUIRES_REVIEW, "requires_action", "pi_1"), OURS, ONE), NULL,
     NULL, NULL, "retrieve", RECONCILE_FOUND_OTHER_STATUS,
     ATTEMPT_STATUS_REQUIRES_REVIEW, "requires_review: intent status 'requires_action'",
     "pi_1"},
    {"look-up: no answer: no evidence, look again", ATTEMPT_STATUS_UNKNOWN, "pi_1",
     1000, 5, 1, 2000, NO_ANSWER, NULL, NULL, NULL, "retrieve", RECONCILE_LOOKUP_FAILED,
     ATTEMPT_STATUS_UNKNOWN, "look-up failed: timeout after 10000 ms", ""},
    {"look-up: 5xx: no evidence, look again (a PROCESSING attempt stays)",
     ATTEMPT_STATUS_PROCESSING, "pi_1", 1000, 5, 1, 2000,
     A(.outcome = PROVIDER_UNKNOWN, .http_status = 503, .error = "http 503"), NULL,
     NULL, NULL, "retrieve", RECONCILE_LOOKUP_FAILED, ATTEMPT_STATUS_PROCESSING,
     "look-up failed: http 503", ""},
    /* Issue 38: a 429 is no evidence, and no look either (the record is
     * looked at again after Retry-After, its checks not counted:
     * a_throttled_look_is_no_look). */
    {"look-up: 429: throttled, look again", ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1,
     2000, THROTTLED(1000), NULL, NULL, NULL, "retrieve", RECONCILE_THROTTLED,
     ATTEMPT_STATUS_UNKNOWN, "throttled, looking again: answered 429", ""},
    {"our charge again answered 429: throttled, a PROCESSING attempt stays",
     ATTEMPT_STATUS_PROCESSING, "", 1000, 5, 1, 2000, NULL, NULL, THROTTLED_CALL(0),
     NULL, "charge", RECONCILE_THROTTLED, ATTEMPT_STATUS_PROCESSING,
     "throttled, looking again: answered 429", ""},
    {"the search past the window answered 429: throttled", ATTEMPT_STATUS_UNKNOWN, "",
     PAST_LAG, 0, 1, 2000, THROTTLED(2000), NULL, NULL, NULL, "search",
     RECONCILE_THROTTLED, ATTEMPT_STATUS_UNKNOWN,
     "throttled, looking again: answered 429", ""},
    {"a page of the list answered 429: throttled, never FAILED", ATTEMPT_STATUS_UNKNOWN,
     "", PAST_LAG, 0, 1, 2000, NOT_FOUND, NULL, NULL, THROTTLED(1000), "search list",
     RECONCILE_THROTTLED, ATTEMPT_STATUS_UNKNOWN,
     "throttled, looking again: answered 429", ""},
    {"found by id PAID, the search for others throttled: SUCCEEDED all the same",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, 2000, PAID, THROTTLED(1000), NULL,
     NULL, "retrieve search", RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "",
     "pi_1"},
    {"a 404 that is not resource_missing is no evidence: never charged again on it",
     ATTEMPT_STATUS_UNKNOWN, "", WINDOW, 5, 1, 2000,
     A(.outcome = PROVIDER_UNKNOWN, .http_status = 404, .error = "http 404"), NULL,
     NULL, NULL, "search", RECONCILE_LOOKUP_FAILED, ATTEMPT_STATUS_UNKNOWN,
     "look-up failed: http 404", ""},

    /* Contradictory evidence goes to REQUIRES_REVIEW. */
    {"the provider does not know an intent id it gave us", ATTEMPT_STATUS_UNKNOWN,
     "pi_1", 1000, 5, 1, 2000, A(.outcome = PROVIDER_NOT_FOUND, .http_status = 404),
     NULL, NULL, NULL, "retrieve", RECONCILE_ID_UNKNOWN, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: the provider does not know intent pi_1", ""},
    /* Neither intent is proven ours: none is booked on the attempt. */
    {"two intents for one attempt, found by search past the window",
     ATTEMPT_STATUS_UNKNOWN, "", WINDOW, 5, 1, 2000,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), OURS, .matches = 2), NULL, NULL,
     NULL, "search", RECONCILE_FOUND_SEVERAL, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: 2 intents for one attempt", ""},
    /* Ours is proven by its recorded id; the others only name the attempt:
     * foreign, noted, never our attempt's review (before issue 34 this was
     * REQUIRES_REVIEW, so anyone could stall a paid attempt). */
    {"found by id PAID, and the search knows two: ours settles, the other is foreign",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, 2000, PAID,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_9"), OURS, .matches = 2), NULL, NULL,
     "retrieve search", RECONCILE_SEARCH_FOUND_OTHERS, ATTEMPT_STATUS_SUCCEEDED, "",
     "pi_1"},
    {"a look-up's intent for another amount: never booked on the attempt",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, 2000,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), ONE, .amount = 999,
       .currency = "usd", .attempt_id = ATT),
     NULL, NULL, NULL, "retrieve", RECONCILE_FOUND_NOT_OURS,
     ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: intent amount 999, the attempt's 1000", ""},
    {"a look-up's intent in another currency", ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5,
     1, 2000,
     A(INTENT(PROVIDER_DECLINED, "canceled", "pi_1"), ONE, .amount = 1000,
       .currency = "eur", .attempt_id = ATT),
     NULL, NULL, NULL, "retrieve", RECONCILE_FOUND_NOT_OURS,
     ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: intent currency eur, the attempt's usd", ""},
    {"a look-up's intent naming another attempt", ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000,
     5, 1, 2000,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), ONE, .amount = 1000,
       .currency = "usd", .attempt_id = "00000000-0000-4000-8000-000000000002"),
     NULL, NULL, NULL, "retrieve", RECONCILE_FOUND_NOT_OURS,
     ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: intent of another attempt "
     "(00000000-0000-4000-8000-000000000002)",
     ""},
    {"a look-up's intent must carry its amount and currency", ATTEMPT_STATUS_UNKNOWN,
     "pi_1", 1000, 5, 1, 2000,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), ONE, .attempt_id = ATT),
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), ONE, .attempt_id = ATT), NULL,
     NULL, "retrieve", RECONCILE_FOUND_NOT_OURS, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: intent pi_1 without amount or currency", ""},
    {"the currency is the same in either case", ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5,
     1, 2000,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), ONE, .amount = 1000,
       .currency = "USD", .attempt_id = ATT),
     NOT_FOUND, NULL, NULL, "retrieve search", RECONCILE_FOUND_SUCCEEDED,
     ATTEMPT_STATUS_SUCCEEDED, "", "pi_1"},

    /* 2. No id, the key inside its retention less the margin: charge again
     * with the same key; its answer (or replay) is ours. */
    {"no id inside the key's window: charged again, it succeeded",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_2"), OURS), NULL, "charge",
     RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "", "pi_2"},
    {"never sent at all (no first_sent_at): the key is new, charged",
     ATTEMPT_STATUS_PROCESSING, "", -1, 5, -1, 2000, NOT_FOUND, NULL,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_2"), OURS), NULL, "charge",
     RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "", "pi_2"},
    {"a replayed 402 carries the intent: judged on its fields, FAILED",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL,
     A(INTENT_HTTP(PROVIDER_DECLINED, "requires_payment_method", "pi_2", 402), OURS,
       .code = "card_declined", .decline_code = "expired_card"),
     NULL, "charge", RECONCILE_FOUND_DECLINED, ATTEMPT_STATUS_FAILED,
     "declined: card_declined: expired_card", "pi_2"},
    {"our charge's card error carrying no intent fields: FAILED",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL,
     A(.outcome = PROVIDER_DECLINED, .http_status = 402, .code = "card_declined"), NULL,
     "charge", RECONCILE_FOUND_DECLINED, ATTEMPT_STATUS_FAILED,
     "declined: card_declined", ""},
    {"our charge answered for another amount: still contradictory",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_2"), .amount = 999,
       .currency = "usd"),
     NULL, "charge", RECONCILE_FOUND_NOT_OURS, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: intent amount 999, the attempt's 1000", ""},
    {"a replayed 402 whose intent is in another currency: contradictory",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL,
     A(INTENT_HTTP(PROVIDER_DECLINED, "requires_payment_method", "pi_2", 402),
       .amount = 1000, .currency = "gbp", .code = "card_declined"),
     NULL, "charge", RECONCILE_FOUND_NOT_OURS, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: intent currency gbp, the attempt's usd", ""},
    {"our charge refused: FAILED invalid_request: <code> (<param>): <message>",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL,
     A(.outcome = PROVIDER_INVALID, .http_status = 400,
       .code = "parameter_invalid_integer", .param = "amount",
       .error = "Invalid integer: ***"),
     NULL, "charge", RECONCILE_CHARGE_REFUSED, ATTEMPT_STATUS_FAILED,
     "invalid_request: parameter_invalid_integer (amount): Invalid integer: ***", ""},
    {"our charge unanswered: never FAILED, the attempt stays UNKNOWN",
     ATTEMPT_STATUS_UNKNOWN, "", 1000, 5, 1, 2000, NOT_FOUND, NULL, NO_ANSWER, NULL,
     "charge", RECONCILE_CHARGE_UNANSWERED, ATTEMPT_STATUS_UNKNOWN,
     "charged again, unknown: timeout after 10000 ms", ""},
    {"our charge unanswered for a PROCESSING attempt: UNKNOWN",
     ATTEMPT_STATUS_PROCESSING, "", 1000, 5, 1, 2000, NOT_FOUND, NULL, NO_ANSWER, NULL,
     "charge", RECONCILE_CHARGE_UNANSWERED_PROCESSING, ATTEMPT_STATUS_UNKNOWN,
     "outcome_unknown: timeout after 10000 ms", ""},

    /* Whose clock: the key's age is the database's at the claim, plus the
     * time the look has taken since; nothing is sent once it has passed. */
    {"key a millisecond inside the window: charged", ATTEMPT_STATUS_UNKNOWN, "",
     WINDOW - 1001, 1000, 1, 2000, NOT_FOUND, NULL, NO_ANSWER, NULL, "charge",
     RECONCILE_CHARGE_UNANSWERED, ATTEMPT_STATUS_UNKNOWN,
     "charged again, unknown: timeout after 10000 ms", ""},
    {"key past the window at the claim: never charged, searched",
     ATTEMPT_STATUS_UNKNOWN, "", WINDOW, 1000, 1, 2000, NOT_FOUND, NULL, NULL, NULL,
     "search", RECONCILE_SEARCH_MAY_LAG, ATTEMPT_STATUS_UNKNOWN,
     "not found; the search may still lag: looking again", ""},

    /* 3. Not found after the retention: search's "none" is never enough. */
    {"not found past the window, the search's lag not passed: look again, not FAILED",
     ATTEMPT_STATUS_UNKNOWN, "", PAST_LAG - 1, 0, 1, 2000, NOT_FOUND, NULL, NULL, NULL,
     "search", RECONCILE_SEARCH_MAY_LAG, ATTEMPT_STATUS_UNKNOWN,
     "not found; the search may still lag: looking again", ""},
    {"past the lag, no first_sent_at to list a window from: look again",
     ATTEMPT_STATUS_UNKNOWN, "", PAST_LAG, 0, -1, 2000, NOT_FOUND, NULL, NULL, NULL,
     "search", RECONCILE_SEARCH_MAY_LAG, ATTEMPT_STATUS_UNKNOWN,
     "not found; the search may still lag: looking again", ""},
    {"past the lag, every page of the list answered, none held it: FAILED",
     ATTEMPT_STATUS_UNKNOWN, "", PAST_LAG, 0, 1, 2000, NOT_FOUND, NULL, NULL, NOT_FOUND,
     "search list", RECONCILE_NEVER_EXECUTED, ATTEMPT_STATUS_FAILED,
     "never_executed: not in the provider's list of the key's window, nor found by "
     "search, at the key's age of 90000000 ms, past its retention (86400000 ms) and "
     "the "
     "search's lag (3600000 ms)",
     ""},
    {"past the lag, a PROCESSING attempt the list does not hold: FAILED",
     ATTEMPT_STATUS_PROCESSING, "", PAST_LAG - 500, 500, 1, 2000, NOT_FOUND, NULL, NULL,
     NOT_FOUND, "search list", RECONCILE_NEVER_EXECUTED, ATTEMPT_STATUS_FAILED,
     "never_executed: not in the provider's list of the key's window, nor found by "
     "search, at the key's age of 90000000 ms, past its retention (86400000 ms) and "
     "the "
     "search's lag (3600000 ms)",
     ""},
    /* The list, like the search, only finds what names the attempt: never
     * settled on (it was SUCCEEDED before issue 34). */
    {"the search lagged: the list holds an intent naming it: unproven, review",
     ATTEMPT_STATUS_UNKNOWN, "", PAST_LAG, 0, 1, 2000, NOT_FOUND, NULL, NULL, PAID,
     "search list", RECONCILE_FOUND_UNPROVEN, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: unproven: intent pi_1 (succeeded): it only names us: neither "
     "our recorded id nor the answer under our key",
     ""},
    {"the list holds two intents of the attempt: review", ATTEMPT_STATUS_UNKNOWN, "",
     PAST_LAG, 0, 1, 2000, NOT_FOUND, NULL, NULL,
     A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), OURS, .matches = 2),
     "search list", RECONCILE_FOUND_SEVERAL, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: contradictory: 2 intents for one attempt", ""},
    {"a page of the list failed: no evidence, never FAILED", ATTEMPT_STATUS_UNKNOWN, "",
     PAST_LAG, 0, 1, 2000, NOT_FOUND, NULL, NULL,
     A(.outcome = PROVIDER_UNKNOWN, .http_status = 502, .error = "http 502"),
     "search list", RECONCILE_LIST_FAILED, ATTEMPT_STATUS_UNKNOWN,
     "not found by search; the list failed: http 502", ""},
    {"the list refused (not a list): no evidence", ATTEMPT_STATUS_UNKNOWN, "", PAST_LAG,
     0, 1, 2000, NOT_FOUND, NULL, NULL,
     A(.outcome = PROVIDER_INVALID, .http_status = 400, .error = "not a list"),
     "search list", RECONCILE_LIST_FAILED, ATTEMPT_STATUS_UNKNOWN,
     "not found by search; the list failed: not a list", ""},
    {"past the window nothing is sent: not even when the list fails",
     ATTEMPT_STATUS_PROCESSING, "", 10 * RET_MS, 0, 1, 2000, NOT_FOUND, NULL, NULL,
     NO_ANSWER, "search list", RECONCILE_LIST_FAILED, ATTEMPT_STATUS_PROCESSING,
     "not found by search; the list failed: timeout after 10000 ms", ""},

    /* Unsettled RECONCILER_MAX_AGE_MS after it was recorded: review. */
    {"still unsettled past the maximum age: review", ATTEMPT_STATUS_UNKNOWN, "pi_1",
     1000, 5, 1, MAX_AGE + 1, NO_ANSWER, NULL, NULL, NULL, "retrieve",
     RECONCILE_TOO_OLD, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: still unsettled after 604800001 ms; last: look-up failed: "
     "timeout after 10000 ms",
     ""},
    {"still processing past the maximum age: review, the intent kept",
     ATTEMPT_STATUS_PROCESSING, "pi_1", 1000, 5, 1, MAX_AGE + 1,
     A(INTENT(PROVIDER_PROCESSING, "processing", "pi_1"), OURS, ONE), NULL, NULL, NULL,
     "retrieve", RECONCILE_TOO_OLD, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: still unsettled after 604800001 ms; last: provider_processing",
     "pi_1"},
    {"throttled past the maximum age: review all the same", ATTEMPT_STATUS_UNKNOWN,
     "pi_1", 1000, 5, 1, MAX_AGE + 1, THROTTLED(1000), NULL, NULL, NULL, "retrieve",
     RECONCILE_TOO_OLD, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "requires_review: still unsettled after 604800001 ms; last: throttled, looking "
     "again: answered 429",
     ""},
    {"at exactly the maximum age: not yet", ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1,
     MAX_AGE, NO_ANSWER, NULL, NULL, NULL, "retrieve", RECONCILE_LOOKUP_FAILED,
     ATTEMPT_STATUS_UNKNOWN, "look-up failed: timeout after 10000 ms", ""},
    {"settled by this look past the maximum age: the evidence wins",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, MAX_AGE + 1, PAID, NOT_FOUND, NULL,
     NULL, "retrieve search", RECONCILE_FOUND_SUCCEEDED, ATTEMPT_STATUS_SUCCEEDED, "",
     "pi_1"},

    /* Reasons quote the provider: stored as valid UTF-8. */
    {"a provider's control characters and invalid bytes never reach the reason",
     ATTEMPT_STATUS_UNKNOWN, "pi_1", 1000, 5, 1, 2000,
     A(.outcome = PROVIDER_UNKNOWN, .http_status = 500,
       .error = "bad\x01\xff"
                "end"),
     NULL, NULL, NULL, "retrieve", RECONCILE_LOOKUP_FAILED, ATTEMPT_STATUS_UNKNOWN,
     "look-up failed: bad ?end", ""},
};

static const char *call_name(enum reconcile_next n)
{
    switch (n) {
    case RECONCILE_RETRIEVE:
        return "retrieve";
    case RECONCILE_SEARCH:
    case RECONCILE_SEARCH_OTHERS:
        return "search";
    case RECONCILE_CHARGE:
        return "charge";
    case RECONCILE_LIST:
        return "list";
    default:
        return "?";
    }
}

START_TEST(each_documented_rule)
{
    const int i = _i;
    const struct reconcile_attempt a = {
        .id = ATT,
        .status = rows[i].status,
        .provider_payment_id = rows[i].ppid,
        .amount = 1000,
        .currency = "usd",
        .key_age_ms = rows[i].key_age_ms,
        .first_sent_ms = rows[i].first_sent_ms < 0 ? -1 : 1764590000000LL,
        .age_ms = rows[i].age_ms,
    };
    struct reconcile_evidence e = {0};
    struct provider_result answers[4];
    struct reconcile_decision d;
    char calls[64] = "";
    int n = 0;

    for (;;) {
        reconcile_policy_decide(&lim, &a, &e, &d);
        if (d.next == RECONCILE_SETTLE)
            break;
        ck_assert_msg(n < 4, "%s: more calls than a look makes (%s)", rows[i].doc,
                      calls);
        snprintf(calls + strlen(calls), sizeof(calls) - strlen(calls), "%s%s",
                 n ? " " : "", call_name(d.next));
        const struct answer *given = NULL;
        const struct provider_result **slot = NULL;
        switch (d.next) {
        case RECONCILE_RETRIEVE:
        case RECONCILE_SEARCH:
            given = rows[i].lookup, slot = &e.lookup;
            e.lookup_after_ms = rows[i].lookup_after_ms;
            break;
        case RECONCILE_SEARCH_OTHERS:
            given = rows[i].search, slot = &e.search;
            break;
        case RECONCILE_CHARGE:
            given = rows[i].charge, slot = &e.charge;
            break;
        default:
            given = rows[i].list, slot = &e.list;
            break;
        }
        ck_assert_msg(given != NULL, "%s: asked for an unexpected %s (calls: %s)",
                      rows[i].doc, call_name(d.next), calls);
        ck_assert_msg(*slot == NULL, "%s: asked twice for %s", rows[i].doc,
                      call_name(d.next));
        fill(&answers[n], given);
        *slot = &answers[n++];
    }
    ck_assert_msg(!strcmp(calls, rows[i].calls), "%s: calls '%s', documented '%s'",
                  rows[i].doc, calls, rows[i].calls);
    ck_assert_msg(d.rule == rows[i].rule, "%s: rule %s, documented %s", rows[i].doc,
                  reconcile_policy_rule_name(d.rule),
                  reconcile_policy_rule_name(rows[i].rule));
    ck_assert_msg(d.status == rows[i].want, "%s: status %s, documented %s", rows[i].doc,
                  attempt_status_name(d.status), attempt_status_name(rows[i].want));
    ck_assert_msg(!strcmp(d.reason, rows[i].reason), "%s: reason '%s'", rows[i].doc,
                  d.reason);
    ck_assert_msg(!strcmp(d.provider_payment_id, rows[i].booked), "%s: booked '%s'",
                  rows[i].doc, d.provider_payment_id);
    /* The vocabulary's transitions hold for whatever the table decides. */
    if (d.status != a.status)
        ck_assert(attempt_status_transition_allowed(a.status, d.status));
}
END_TEST

/* The search alone never says "never executed", at any age of the key: a
 * look that is not found, and whose list never answers "none", is never
 * FAILED, and past the window it never charges. */
START_TEST(search_alone_never_fails_an_attempt)
{
    struct provider_result nf, list;
    fill(&nf, NOT_FOUND);
    fill(&list, NO_ANSWER);
    for (long long age = 0; age <= 3 * RET_MS; age += 60000) {
        const struct reconcile_attempt a = {.id = ATT,
                                            .status = ATTEMPT_STATUS_UNKNOWN,
                                            .provider_payment_id = "",
                                            .amount = 1000,
                                            .currency = "usd",
                                            .key_age_ms = age,
                                            .first_sent_ms = 1764590000000LL,
                                            .age_ms = 1000};
        struct reconcile_evidence e = {.lookup = &nf};
        struct reconcile_decision d;
        reconcile_policy_decide(&lim, &a, &e, &d);
        if (age >= WINDOW)
            ck_assert_msg(d.next != RECONCILE_CHARGE, "charged at key age %lld", age);
        if (d.next == RECONCILE_LIST) {
            e.list = &list;
            reconcile_policy_decide(&lim, &a, &e, &d);
        } else if (d.next == RECONCILE_CHARGE) {
            e.charge = &list; /* unanswered */
            reconcile_policy_decide(&lim, &a, &e, &d);
        }
        ck_assert_int_eq(d.next, RECONCILE_SETTLE);
        ck_assert_msg(d.status == ATTEMPT_STATUS_UNKNOWN, "key age %lld: %s (%s)", age,
                      attempt_status_name(d.status), d.reason);
    }
}
END_TEST

/* The window of calls the key could have made, widened 5 minutes each side. */
START_TEST(list_window_covers_the_key_and_the_clocks)
{
    long long gte, lt;
    reconcile_policy_list_window(1000000000000LL, RET_MS, &gte, &lt);
    ck_assert_int_eq(gte, 1000000000000LL / 1000 - 300);
    ck_assert_int_eq(lt, 1000000000000LL / 1000 + 86400 + 300 + 1);
}
END_TEST

static struct provider_result page(enum provider_outcome o, int matches, int more,
                                   const char *pi)
{
    struct provider_result p = {
        .outcome = o, .http_status = 200, .matches = matches, .has_more = more};
    snprintf(p.provider_payment_id, sizeof(p.provider_payment_id), "%s", pi);
    snprintf(p.list_last_id, sizeof(p.list_last_id), "pi_last");
    return p;
}

START_TEST(list_every_page_empty_is_not_found)
{
    struct provider_result walk = {0};
    struct provider_result p1 = page(PROVIDER_NOT_FOUND, 0, 1, "");
    struct provider_result p2 = page(PROVIDER_NOT_FOUND, 0, 0, "");
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p1, 1), 1);
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p2, 2), 0);
    ck_assert_int_eq(walk.outcome, PROVIDER_NOT_FOUND);
    ck_assert_int_eq(walk.matches, 0);
}
END_TEST

START_TEST(list_keeps_the_first_page_holding_the_intent_and_counts_all)
{
    struct provider_result walk = {0};
    struct provider_result p1 = page(PROVIDER_NOT_FOUND, 0, 1, "");
    struct provider_result p2 = page(PROVIDER_SUCCEEDED, 1, 1, "pi_a");
    struct provider_result p3 = page(PROVIDER_DECLINED, 1, 0, "pi_b");
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p1, 1), 1);
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p2, 2), 1);
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p3, 3), 0);
    ck_assert_int_eq(walk.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(walk.provider_payment_id, "pi_a");
    ck_assert_int_eq(walk.matches, 2); /* two intents: review */
}
END_TEST

START_TEST(list_a_failed_page_is_no_evidence_whatever_came_before)
{
    static const enum provider_outcome failures[] = {PROVIDER_UNKNOWN, PROVIDER_INVALID,
                                                     PROVIDER_NOT_EXECUTED};
    for (size_t k = 0; k < sizeof(failures) / sizeof(failures[0]); k++) {
        struct provider_result walk = {0};
        struct provider_result p1 = page(PROVIDER_SUCCEEDED, 1, 1, "pi_a");
        struct provider_result p2 = page(failures[k], 0, 0, "");
        ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p1, 1), 1);
        ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p2, 2), 0);
        ck_assert_int_eq(walk.outcome, failures[k]);
    }
}
END_TEST

START_TEST(list_of_too_many_pages_is_no_evidence)
{
    struct provider_result walk = {0};
    struct provider_result p = page(PROVIDER_NOT_FOUND, 0, 1, "");
    for (int n = 1; n < RECONCILE_LIST_MAX_PAGES; n++)
        ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p, n), 1);
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p, RECONCILE_LIST_MAX_PAGES),
                     0);
    ck_assert_int_eq(walk.outcome, PROVIDER_UNKNOWN);
    ck_assert_str_eq(walk.error, "more than 100 pages of intents in the window");
    ck_assert_int_eq(RECONCILE_LIST_MAX_PAGES, 100);
}
END_TEST

/* A review asks whether money moved: a declined intent on an early page
 * must not hide a succeeded one on a later page. */
START_TEST(list_keeps_the_most_settled_intent_of_every_page)
{
    struct provider_result walk = {0};
    struct provider_result p1 = page(PROVIDER_DECLINED, 1, 1, "pi_a");
    struct provider_result p2 = page(PROVIDER_NOT_FOUND, 0, 1, "");
    struct provider_result p3 = page(PROVIDER_SUCCEEDED, 1, 1, "pi_b");
    struct provider_result p4 = page(PROVIDER_PROCESSING, 1, 0, "pi_c");
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p1, 1), 1);
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p2, 2), 1);
    ck_assert_str_eq(walk.provider_payment_id, "pi_a");
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p3, 3), 1);
    ck_assert_int_eq(reconcile_policy_list_fold(&walk, &p4, 4), 0);
    ck_assert_int_eq(walk.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(walk.provider_payment_id, "pi_b");
    ck_assert_int_eq(walk.matches, 3);
}
END_TEST

/* Pages served from a script: each asked after the one before it. */
struct script {
    int n, asked;
    struct provider_result pages[4];
    char after[4][16];
};

static void scripted_page(void *ctx, const char *after, struct provider_result *page)
{
    struct script *sc = ctx;
    ck_assert_int_lt(sc->asked, sc->n);
    snprintf(sc->after[sc->asked], sizeof(sc->after[0]), "%s", after);
    *page = sc->pages[sc->asked++];
}

START_TEST(list_walk_asks_each_page_after_the_last_and_sums_the_latency)
{
    struct script sc = {.n = 3};
    sc.pages[0] = page(PROVIDER_NOT_FOUND, 0, 1, "");
    sc.pages[1] = page(PROVIDER_SUCCEEDED, 1, 1, "pi_b");
    sc.pages[2] = page(PROVIDER_NOT_FOUND, 0, 0, "");
    for (int i = 0; i < 3; i++) {
        sc.pages[i].latency_ms = 10 * (i + 1);
        snprintf(sc.pages[i].list_last_id, sizeof(sc.pages[i].list_last_id), "pi_p%d",
                 i + 1);
    }
    struct provider_result walk;
    ck_assert_int_eq(reconcile_policy_list_walk(scripted_page, &sc, &walk), 3);
    ck_assert_str_eq(sc.after[0], "");
    ck_assert_str_eq(sc.after[1], "pi_p1");
    ck_assert_str_eq(sc.after[2], "pi_p2");
    ck_assert_int_eq(walk.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(walk.provider_payment_id, "pi_b");
    ck_assert_int_eq(walk.matches, 1);
    ck_assert_int_eq(walk.latency_ms, 60);

    /* A failed page ends the walk: no evidence. */
    struct script failing = {.n = 2};
    failing.pages[0] = page(PROVIDER_NOT_FOUND, 0, 1, "");
    failing.pages[1] = page(PROVIDER_UNKNOWN, 0, 0, "");
    ck_assert_int_eq(reconcile_policy_list_walk(scripted_page, &failing, &walk), 2);
    ck_assert_int_eq(walk.outcome, PROVIDER_UNKNOWN);
}
END_TEST

/* Ours settled, the others named in the look's note: never in the reason
 * of a SUCCEEDED attempt, never lost. */
START_TEST(foreign_intents_beside_ours_are_noted)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = "pi_1",
                                        .amount = 1000,
                                        .currency = "usd",
                                        .key_age_ms = 1000,
                                        .first_sent_ms = 1764590000000LL,
                                        .age_ms = 2000};
    struct provider_result ours, search;
    struct reconcile_evidence e = {.lookup = &ours, .search = &search};
    struct reconcile_decision d;
    fill(&ours, PAID);
    fill(&search,
         A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_9"), OURS, .matches = 2));
    reconcile_policy_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.rule, RECONCILE_SEARCH_FOUND_OTHERS);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_str_eq(d.reason, "");
    ck_assert_msg(strstr(d.note, "pi_9") && strstr(d.note, "foreign"), "%s", d.note);
}
END_TEST

/* One look at refund R (its charge's intent pi_c), as the reconciler plays
 * it: the calls made, in order, and the decision. */
static void refund_look(const char *recorded, long long key_age,
                        const struct answer *retrieve, const struct answer *again,
                        const struct answer *list, struct reconcile_decision *d,
                        char *calls, size_t calls_size)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = recorded,
                                        .amount = 500,
                                        .key_age_ms = key_age,
                                        .first_sent_ms = -1,
                                        .age_ms = 2000,
                                        .payment_intent = "pi_c",
                                        .object = "refund"};
    struct reconcile_evidence e = {0};
    struct provider_result res[3];
    int n = 0;
    calls[0] = '\0';
    for (;;) {
        reconcile_policy_decide_refund(&lim, &a, &e, d);
        if (d->next == RECONCILE_SETTLE)
            return;
        ck_assert_int_lt(n, 3);
        const struct answer *given = d->next == RECONCILE_RETRIEVE ? retrieve
                                     : d->next == RECONCILE_CHARGE ? again
                                     : d->next == RECONCILE_LIST   ? list
                                                                   : NULL;
        ck_assert_msg(given != NULL, "unexpected %s", call_name(d->next));
        fill(&res[n], given);
        snprintf(calls + strlen(calls), calls_size - strlen(calls), "%s%s",
                 n ? " " : "", call_name(d->next));
        if (d->next == RECONCILE_RETRIEVE)
            e.lookup = &res[n];
        else if (d->next == RECONCILE_CHARGE)
            e.charge = &res[n];
        else
            e.list = &res[n];
        n++;
    }
}

#define REFUND(o, st, re)                                                              \
    .outcome = o, .http_status = 200, .intent_status = st, .ppid = re, .amount = 500,  \
    .attempt_id = ATT, .matches = 1

/* Issue 34, break 3: a refund that only names R (its metadata) never
 * settles R; inside the key's window the refund again under R's key is the
 * proof, past it the list's refund naming R is for a person. */
START_TEST(a_refund_settles_only_on_its_own)
{
    struct reconcile_decision d;
    char calls[64];
    const struct answer *named_failed = A(REFUND(PROVIDER_DECLINED, "failed", "re_x"));
    const struct answer *ours_ok = A(REFUND(PROVIDER_SUCCEEDED, "succeeded", "re_r"));

    /* Inside the window: the list is never asked, the replay settles. */
    refund_look("", 1000, NULL, ours_ok, named_failed, &d, calls, sizeof(calls));
    ck_assert_str_eq(calls, "charge");
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_str_eq(d.provider_payment_id, "re_r");
    /* ... 409: our first refund still executes: look again. */
    refund_look("", 1000, NULL,
                A(.outcome = PROVIDER_NOT_EXECUTED, .http_status = 409,
                  .error = "idempotency_key_in_use"),
                NULL, &d, calls, sizeof(calls));
    ck_assert_int_eq(d.rule, RECONCILE_CHARGE_NOT_EXECUTED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    /* Past the window: a refund naming R is unproven, never FAILED on. */
    refund_look("", WINDOW, NULL, NULL, named_failed, &d, calls, sizeof(calls));
    ck_assert_str_eq(calls, "list");
    ck_assert_int_eq(d.rule, RECONCILE_FOUND_UNPROVEN);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
    ck_assert_str_eq(d.provider_payment_id, "");
    /* ... a consistent list with none naming R: never executed. */
    refund_look("", WINDOW, NULL, NULL, NOT_FOUND, &d, calls, sizeof(calls));
    ck_assert_int_eq(d.rule, RECONCILE_NEVER_EXECUTED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    /* By its recorded id: ours. */
    refund_look("re_r", WINDOW, A(REFUND(PROVIDER_DECLINED, "failed", "re_r")), NULL,
                NULL, &d, calls, sizeof(calls));
    ck_assert_str_eq(calls, "retrieve");
    ck_assert_int_eq(d.rule, RECONCILE_FOUND_REFUND_FAILED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
}
END_TEST

/* reconcile_look: one look as steps, as the reconciler and the simulation
 * run it. A charge whose intent is recorded: the look-up, then the search
 * for others, then the decision; each call named, in its own slot. */
START_TEST(a_look_names_each_call_then_decides)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = "pi_1",
                                        .amount = 1000,
                                        .currency = "usd",
                                        .key_age_ms = 1000,
                                        .first_sent_ms = 1764590000000LL,
                                        .age_ms = 2000};
    struct reconcile_look l;
    struct reconcile_step st;
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 5000);
    reconcile_look_step(&l, 5000, &st);
    ck_assert_int_eq(st.next, RECONCILE_RETRIEVE);
    ck_assert_str_eq(st.operation, "retrieve");
    ck_assert_int_eq(st.call, 0);
    ck_assert_ptr_eq(st.answer, &l.res[0]);
    fill(st.answer, PAID);
    reconcile_look_step(&l, 5010, &st);
    ck_assert_int_eq(st.next, RECONCILE_SEARCH_OTHERS);
    ck_assert_str_eq(st.operation, "search");
    ck_assert_int_eq(st.call, 1);
    fill(st.answer, PAID);
    reconcile_look_step(&l, 5020, &st);
    ck_assert_int_eq(st.next, RECONCILE_SETTLE);
    ck_assert_int_eq(st.dec.rule, RECONCILE_FOUND_SUCCEEDED);
    ck_assert_int_eq(st.dec.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_str_eq(st.dec.provider_payment_id, "pi_1");
    ck_assert_int_eq(l.ncalls, 2);
    ck_assert_int_eq(l.e.lookup_after_ms, 20);
}
END_TEST

/* The key ages while a look goes on: the look's time since the claim
 * counts, so a key just inside its window at the claim is past it later,
 * and the charge is not sent again. A refund's calls have its own names. */
START_TEST(a_look_decides_on_the_key_age_now)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .amount = 1000,
                                        .currency = "usd",
                                        .key_age_ms = WINDOW - 100,
                                        .first_sent_ms = 1764590000000LL,
                                        .age_ms = RET_MS};
    const struct reconcile_attempt r = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .amount = 500,
                                        .key_age_ms = 1000,
                                        .first_sent_ms = -1,
                                        .age_ms = 2000,
                                        .payment_intent = "pi_c",
                                        .object = "refund"};
    struct reconcile_look l;
    struct reconcile_step st;
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    ck_assert_str_eq(st.operation, "charge");
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 100, &st);
    ck_assert_int_eq(st.next, RECONCILE_SEARCH);
    ck_assert_str_eq(st.operation, "search");
    reconcile_look_begin(&l, RECONCILE_KIND_REFUND, &lim, &r, 0);
    reconcile_look_step(&l, 0, &st);
    ck_assert_int_eq(st.next, RECONCILE_CHARGE);
    ck_assert_str_eq(st.operation, "refund");
    fill(st.answer, A(REFUND(PROVIDER_SUCCEEDED, "succeeded", "re_r")));
    reconcile_look_step(&l, 10, &st);
    ck_assert_int_eq(st.dec.rule, RECONCILE_FOUND_SUCCEEDED);
    ck_assert_str_eq(st.dec.provider_payment_id, "re_r");
}
END_TEST

/* A charge's look never calls a hold a success: an authorized intent is a
 * status a charge never ends in. */
START_TEST(a_charge_never_settles_on_a_hold)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = "pi_h",
                                        .amount = 1000,
                                        .currency = "usd",
                                        .key_age_ms = 1000,
                                        .first_sent_ms = 1764590000000LL,
                                        .age_ms = 2000};
    struct reconcile_look l;
    struct reconcile_step st;
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, HELD);
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.next, RECONCILE_SETTLE);
    ck_assert_int_eq(st.dec.rule, RECONCILE_FOUND_OTHER_STATUS);
    ck_assert_int_eq(st.dec.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
}
END_TEST

/* The next look: a record that kept its status, or is left PROCESSING or
 * UNKNOWN, on the schedule (its last entry past its end); a settled one
 * never. */
START_TEST(next_look_on_the_schedule_only_when_unsettled)
{
    static const long long schedule[] = {1000, 5000, 15000};
    const enum attempt_status U = ATTEMPT_STATUS_UNKNOWN, P = ATTEMPT_STATUS_PROCESSING;
    ck_assert_int_eq(reconcile_look_next_check_ms(U, U, schedule, 3, 0), 1000);
    ck_assert_int_eq(reconcile_look_next_check_ms(P, P, schedule, 3, 2), 15000);
    ck_assert_int_eq(reconcile_look_next_check_ms(U, U, schedule, 3, 9), 15000);
    ck_assert_int_eq(reconcile_look_next_check_ms(U, P, schedule, 3, 1), 5000);
    ck_assert_int_eq(reconcile_look_next_check_ms(P, U, schedule, 3, 1), 5000);
    ck_assert_int_eq(
        reconcile_look_next_check_ms(U, ATTEMPT_STATUS_SUCCEEDED, schedule, 3, 0), -1);
    ck_assert_int_eq(
        reconcile_look_next_check_ms(U, ATTEMPT_STATUS_FAILED, schedule, 3, 0), -1);
    ck_assert_int_eq(
        reconcile_look_next_check_ms(P, ATTEMPT_STATUS_REQUIRES_REVIEW, schedule, 3, 0),
        -1);
}
END_TEST

/* Issue 38: a look a 429 ended is no look. It keeps the record's status,
 * says so (throttled, the Retry-After), and is looked at again after the
 * Retry-After or the back-off, never on the schedule; a look that settled
 * despite a 429, or gave up past the maximum age, is not throttled. */
START_TEST(a_throttled_look_is_no_look)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = "pi_1",
                                        .amount = 1000,
                                        .currency = "usd",
                                        .key_age_ms = 1000,
                                        .first_sent_ms = 1764590000000LL,
                                        .age_ms = 2000};
    struct reconcile_look l;
    struct reconcile_step st;
    char calls[64];
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, THROTTLED(3000));
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.next, RECONCILE_SETTLE);
    ck_assert_int_eq(st.dec.rule, RECONCILE_THROTTLED);
    ck_assert_int_eq(st.dec.status, ATTEMPT_STATUS_UNKNOWN);
    ck_assert_int_eq(st.dec.throttled, 1);
    ck_assert_int_eq(st.dec.retry_after_ms, 3000);
    ck_assert_int_eq(reconcile_look_throttled_ms(&st.dec, 0), 3000);
    ck_assert_int_eq(reconcile_look_throttled_ms(&st.dec, 4), 3000);
    /* No Retry-After: the back-off, longer for each throttled look in a
     * row. */
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, THROTTLED(0));
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.dec.throttled, 1);
    ck_assert_int_eq(reconcile_look_throttled_ms(&st.dec, 0), 1000);
    ck_assert_int_eq(reconcile_look_throttled_ms(&st.dec, 2), 4000);
    /* Other answers without evidence are looks, on the schedule. */
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, NO_ANSWER);
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.dec.rule, RECONCILE_LOOKUP_FAILED);
    ck_assert_int_eq(st.dec.throttled, 0);
    /* Settled despite a throttled search: no wait. */
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, PAID);
    reconcile_look_step(&l, 1, &st);
    fill(st.answer, THROTTLED(5000));
    reconcile_look_step(&l, 2, &st);
    ck_assert_int_eq(st.dec.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_int_eq(st.dec.throttled, 0);
    /* A refund's look, by id and by the refund again, alike. */
    struct reconcile_decision d;
    refund_look("re_r", 1000, THROTTLED(2000), NULL, NULL, &d, calls, sizeof(calls));
    ck_assert_int_eq(d.rule, RECONCILE_THROTTLED);
    ck_assert_int_eq(d.throttled, 1);
    ck_assert_int_eq(d.retry_after_ms, 2000);
    refund_look("", 1000, NULL, THROTTLED_CALL(0), NULL, &d, calls, sizeof(calls));
    ck_assert_str_eq(calls, "charge");
    ck_assert_int_eq(d.rule, RECONCILE_THROTTLED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    /* Past the maximum age it gives up, throttled or not. */
    struct reconcile_attempt old = a;
    old.age_ms = MAX_AGE + 1;
    reconcile_look_begin(&l, RECONCILE_KIND_CHARGE, &lim, &old, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, THROTTLED(1000));
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.dec.rule, RECONCILE_TOO_OLD);
    ck_assert_int_eq(st.dec.throttled, 0);
}
END_TEST

/* An operation's own order of evidence (a capture's, a void's): asks for
 * the intent, then keeps the status whatever it says. */
static void keeps_after_retrieve(const struct reconcile_limits *l,
                                 const struct reconcile_attempt *a,
                                 const struct reconcile_evidence *e,
                                 struct reconcile_decision *out)
{
    (void)l;
    memset(out, 0, sizeof(*out));
    out->next = e->lookup ? RECONCILE_SETTLE : RECONCILE_RETRIEVE;
    out->rule = e->lookup ? RECONCILE_LOOKUP_FAILED : RECONCILE_RULE_NONE;
    out->status = a->status;
}

/* Whichever order decided, a look a 429 left as it was is no look. */
START_TEST(an_operations_own_look_throttled_is_no_look)
{
    static const struct reconcile_order order = {
        .decide = keeps_after_retrieve,
        .operation = {[RECONCILE_RETRIEVE] = "retrieve"}};
    const struct reconcile_attempt a = {
        .id = ATT, .status = ATTEMPT_STATUS_UNKNOWN, .provider_payment_id = "pi_1"};
    struct reconcile_look l;
    struct reconcile_step st;
    reconcile_look_begin_order(&l, &order, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, THROTTLED(4000));
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.next, RECONCILE_SETTLE);
    ck_assert_int_eq(st.dec.rule, RECONCILE_LOOKUP_FAILED); /* the order's own */
    ck_assert_int_eq(st.dec.throttled, 1);
    ck_assert_int_eq(reconcile_look_throttled_ms(&st.dec, 0), 4000);
    reconcile_look_begin_order(&l, &order, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    fill(st.answer, NO_ANSWER);
    reconcile_look_step(&l, 1, &st);
    ck_assert_int_eq(st.dec.throttled, 0);
}
END_TEST

START_TEST(every_rule_has_a_name)
{
    for (int r = 0; r < RECONCILE_RULE__COUNT; r++)
        ck_assert_ptr_nonnull(reconcile_policy_rule_name((enum reconcile_rule)r));
    ck_assert_ptr_null(reconcile_policy_rule_name(RECONCILE_RULE__COUNT));
    ck_assert_str_eq(reconcile_policy_rule_name(RECONCILE_NEVER_EXECUTED),
                     "never_executed");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("reconcile_policy");
    TCase *tc = tcase_create("reconcile_policy");
    tcase_add_loop_test(tc, each_documented_rule, 0, sizeof(rows) / sizeof(rows[0]));
    tcase_add_test(tc, search_alone_never_fails_an_attempt);
    tcase_add_test(tc, list_window_covers_the_key_and_the_clocks);
    tcase_add_test(tc, list_every_page_empty_is_not_found);
    tcase_add_test(tc, list_keeps_the_first_page_holding_the_intent_and_counts_all);
    tcase_add_test(tc, list_a_failed_page_is_no_evidence_whatever_came_before);
    tcase_add_test(tc, list_of_too_many_pages_is_no_evidence);
    tcase_add_test(tc, list_keeps_the_most_settled_intent_of_every_page);
    tcase_add_test(tc, list_walk_asks_each_page_after_the_last_and_sums_the_latency);
    tcase_add_test(tc, foreign_intents_beside_ours_are_noted);
    tcase_add_test(tc, a_refund_settles_only_on_its_own);
    tcase_add_test(tc, every_rule_has_a_name);
    tcase_add_test(tc, a_look_names_each_call_then_decides);
    tcase_add_test(tc, a_look_decides_on_the_key_age_now);
    tcase_add_test(tc, next_look_on_the_schedule_only_when_unsettled);
    tcase_add_test(tc, a_charge_never_settles_on_a_hold);
    tcase_add_test(tc, a_throttled_look_is_no_look);
    tcase_add_test(tc, an_operations_own_look_throttled_is_no_look);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
