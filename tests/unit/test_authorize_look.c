/* Unit tests of worker/operations/authorize/authorize_policy: the
 * authorization's order of evidence (docs/reconciler.md, "Authorizations"):
 * the charge's, with the hold's meanings. Each test plays looks the way the
 * reconciler does (reconcile_look, with the authorization's order) and
 * asserts the calls made, in order, and the decision. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "authorize_policy.h"
#include "reconcile_answers.h"
#include "reconcile_look.h"
#include "test_env.h"

/* One look at an authorization (its own order of evidence) to its end: each
 * call answered by the next of answers (NULL: the look must settle first).
 * The decision, and the calls made, space-separated, into calls. */
static struct reconcile_decision
look_at_authorization(const struct reconcile_attempt *a,
                      const struct answer *const *answers, char *calls, size_t size)
{
    struct reconcile_look l;
    struct reconcile_step st;
    reconcile_look_begin_order(&l, &authorize_look_order, &lim, a, 0);
    calls[0] = '\0';
    for (int i = 0;; i++) {
        reconcile_look_step(&l, i, &st);
        if (st.next == RECONCILE_SETTLE)
            return st.dec;
        ck_assert_ptr_nonnull(answers[i]);
        snprintf(calls + strlen(calls), size - strlen(calls), "%s%s%s%s%s",
                 i ? " " : "", st.operation, st.dec.object_id[0] ? "(" : "",
                 st.dec.object_id, st.dec.object_id[0] ? ")" : "");
        fill(st.answer, answers[i]);
    }
}

#define TAKEN A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_h"), OURS, ONE)
#define EXPIRED                                                                        \
    A(INTENT(PROVIDER_DECLINED, "canceled", "pi_h"), OURS, ONE,                        \
      .cancellation_reason = "automatic")

/* Adversary 37a, finding 1: the create again under the key answers
 * requires_capture from the provider's idempotency store, whatever the
 * intent did since. Captured by another client since: for a person;
 * expired since: FAILED canceled; the retrieve failing: still UNKNOWN, the
 * intent's id (proven ours by the replay) recorded. A replayed decline
 * settles as before, with no retrieve. */
START_TEST(a_replayed_hold_settles_on_the_intent_now)
{
    const struct reconcile_attempt a = {.id = ATT,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = "",
                                        .amount = 1000,
                                        .currency = "usd",
                                        .key_age_ms = 1000,
                                        .first_sent_ms = 1764590000000LL,
                                        .age_ms = 2000};
    char calls[128];
    struct reconcile_decision d;

    d = look_at_authorization(&a, (const struct answer *const[]){HELD, TAKEN, NULL},
                              calls, sizeof(calls));
    ck_assert_str_eq(calls, "charge retrieve(pi_h)");
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_CAPTURED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
    ck_assert_str_eq(d.provider_payment_id, "pi_h");

    d = look_at_authorization(&a, (const struct answer *const[]){HELD, EXPIRED, NULL},
                              calls, sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_CANCELED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert_str_eq(d.reason, "canceled: automatic");

    d = look_at_authorization(&a, (const struct answer *const[]){HELD, NO_ANSWER, NULL},
                              calls, sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_HELD_LOOKUP_FAILED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    ck_assert_str_eq(d.provider_payment_id, "pi_h");

    /* Another intent behind the id: not ours, never settled on. */
    d = look_at_authorization(
        &a,
        (const struct answer *const[]){
            HELD, A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_x"), OURS, ONE), NULL},
        calls, sizeof(calls));
    ck_assert_int_eq(d.rule, RECONCILE_FOUND_NOT_OURS);

    d = look_at_authorization(
        &a,
        (const struct answer *const[]){
            A(INTENT(PROVIDER_DECLINED, "requires_payment_method", "pi_h"), OURS, ONE,
              .code = "card_declined"),
            NULL},
        calls, sizeof(calls));
    ck_assert_str_eq(calls, "charge");
    ck_assert_int_eq(d.rule, RECONCILE_FOUND_DECLINED);
}
END_TEST

/* Issue 37: an authorization's own intent settles it as a hold, never as
 * money taken. Held (requires_capture) is AUTHORIZED, by the create again
 * under its own key or its recorded id; taken where a hold was asked is for
 * a person; canceled before the hold was recorded FAILED (no money held);
 * a foreign intent naming it is never ours. */
START_TEST(an_authorization_settles_as_a_hold)
{
    struct reconcile_attempt a = {.id = ATT,
                                  .status = ATTEMPT_STATUS_UNKNOWN,
                                  .provider_payment_id = "",
                                  .amount = 1000,
                                  .currency = "usd",
                                  .key_age_ms = 1000,
                                  .first_sent_ms = 1764590000000LL,
                                  .age_ms = 2000};
    char calls[128];
    struct reconcile_decision d;

    /* The create again answers held: ours, but perhaps a replay as old as
     * the first execution; the intent it names is retrieved for its state
     * now. */
    d = look_at_authorization(&a, (const struct answer *const[]){HELD, HELD, NULL},
                              calls, sizeof(calls));
    ck_assert_str_eq(calls, "charge retrieve(pi_h)");
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_AUTHORIZED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_AUTHORIZED);
    ck_assert_str_eq(d.provider_payment_id, "pi_h");
    ck_assert_str_eq(d.reason, "");

    a.provider_payment_id = "pi_h";
    d = look_at_authorization(&a, (const struct answer *const[]){HELD, NULL}, calls,
                              sizeof(calls));
    ck_assert_str_eq(calls, "retrieve"); /* no search for others: not a success */
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_AUTHORIZED);

    d = look_at_authorization(&a, (const struct answer *const[]){TAKEN, NULL}, calls,
                              sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_CAPTURED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
    ck_assert_str_eq(
        d.reason, "requires_review: captured: intent succeeded where a hold was asked");

    d = look_at_authorization(&a, (const struct answer *const[]){EXPIRED, NULL}, calls,
                              sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_CANCELED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert_str_eq(d.reason, "canceled: automatic");

    d = look_at_authorization(
        &a,
        (const struct answer *const[]){
            A(INTENT(PROVIDER_DECLINED, "requires_payment_method", "pi_h"), OURS, ONE,
              .code = "card_declined"),
            NULL},
        calls, sizeof(calls));
    ck_assert_int_eq(d.rule, RECONCILE_FOUND_DECLINED);
    ck_assert_str_eq(d.reason, "declined: card_declined");

    /* Past the key's window, found only by what names it: never ours. */
    a.provider_payment_id = "";
    a.key_age_ms = WINDOW;
    d = look_at_authorization(&a, (const struct answer *const[]){HELD, NULL}, calls,
                              sizeof(calls));
    ck_assert_str_eq(calls, "search");
    ck_assert_int_eq(d.rule, RECONCILE_FOUND_UNPROVEN);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
    ck_assert_str_eq(d.provider_payment_id, "");
}
END_TEST

/* An AUTHORIZED one is looked at for the provider's expiry only: canceled
 * automatic is VOIDED expired, anything else leaves the hold as it is,
 * however old. */
START_TEST(a_hold_is_looked_at_for_its_expiry)
{
    /* The hold, for its expiry: however old, only the provider's own
     * cancel settles it. */
    struct reconcile_attempt a = {.id = ATT,
                                  .status = ATTEMPT_STATUS_AUTHORIZED,
                                  .provider_payment_id = "pi_h",
                                  .amount = 1000,
                                  .currency = "usd",
                                  .key_age_ms = WINDOW,
                                  .first_sent_ms = 1764590000000LL,
                                  .age_ms = MAX_AGE * 2};
    char calls[128];
    struct reconcile_decision d;

    d = look_at_authorization(&a, (const struct answer *const[]){EXPIRED, NULL}, calls,
                              sizeof(calls));
    ck_assert_str_eq(calls, "retrieve");
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_EXPIRED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_VOIDED);
    ck_assert_str_eq(d.reason, "expired");
    d = look_at_authorization(&a, (const struct answer *const[]){HELD, NULL}, calls,
                              sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_HOLD_STANDS);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_AUTHORIZED);
    /* Canceled, not by the provider: a void of ours holding it settles its
     * own cancel; with none, another client canceled it (finding 4 of
     * adversary 37a): VOIDED, the money no longer held for the order. */
    a.step_holds = 1;
    d = look_at_authorization(
        &a,
        (const struct answer *const[]){
            A(INTENT(PROVIDER_DECLINED, "canceled", "pi_h"), OURS, ONE,
              .cancellation_reason = "requested_by_customer"),
            NULL},
        calls, sizeof(calls));
    ck_assert_int_eq(d.rule,
                     AUTHORIZE_HOLD_STANDS); /* a void's: its step's to settle */
    a.step_holds = 0;
    d = look_at_authorization(
        &a,
        (const struct answer *const[]){
            A(INTENT(PROVIDER_DECLINED, "canceled", "pi_h"), OURS, ONE,
              .cancellation_reason = "requested_by_customer"),
            NULL},
        calls, sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_FOUND_CANCELED_ELSEWHERE);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_VOIDED);
    ck_assert_str_eq(d.reason, "canceled_elsewhere: requested_by_customer");
    d = look_at_authorization(&a, (const struct answer *const[]){TAKEN, NULL}, calls,
                              sizeof(calls));
    ck_assert_int_eq(d.rule, AUTHORIZE_HOLD_STANDS); /* a capture's */
    d = look_at_authorization(&a, (const struct answer *const[]){NO_ANSWER, NULL},
                              calls, sizeof(calls));
    ck_assert_int_eq(d.rule, RECONCILE_LOOKUP_FAILED);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_AUTHORIZED);
    ck_assert_int_eq(reconcile_look_next_check_ms(ATTEMPT_STATUS_AUTHORIZED,
                                                  ATTEMPT_STATUS_VOIDED,
                                                  (const long long[]){5}, 1, 0),
                     -1);
}
END_TEST

/* Its own rows are named, past the core's, and only they. */
START_TEST(each_own_rule_has_a_name)
{
    for (int r = 0; r < AUTHORIZE_RULES; r++)
        ck_assert_ptr_nonnull(authorize_rule_name(AUTHORIZE_RULE(r)));
    ck_assert_ptr_null(authorize_rule_name(AUTHORIZE_RULE(AUTHORIZE_RULES)));
    ck_assert_ptr_null(authorize_rule_name(RECONCILE_FOUND_SUCCEEDED));
    ck_assert_str_eq(authorize_rule_name(AUTHORIZE_FOUND_CAPTURED), "found_captured");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("authorize_look");
    TCase *tc = tcase_create("authorize_look");
    tcase_add_test(tc, an_authorization_settles_as_a_hold);
    tcase_add_test(tc, a_hold_is_looked_at_for_its_expiry);
    tcase_add_test(tc, a_replayed_hold_settles_on_the_intent_now);
    tcase_add_test(tc, each_own_rule_has_a_name);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
