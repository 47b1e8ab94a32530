/* Unit tests of attempt_review_intent_pays: what the provider's look-up of
 * an intent must show before a review books it for an attempt, without a
 * socket or a database. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "attempt_review.h"
#include "test_env.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"

static struct provider_result intent(long long amount, const char *currency,
                                     const char *attempt)
{
    struct provider_result r;
    memset(&r, 0, sizeof(r));
    r.outcome = PROVIDER_SUCCEEDED;
    snprintf(r.provider_payment_id, sizeof(r.provider_payment_id), "pi_1");
    snprintf(r.intent_status, sizeof(r.intent_status), "succeeded");
    r.amount = amount;
    snprintf(r.currency, sizeof(r.currency), "%s", currency);
    snprintf(r.intent_attempt_id, sizeof(r.intent_attempt_id), "%s", attempt);
    return r;
}

static int pays(const struct provider_result *r, char *says, size_t size)
{
    says[0] = '\0';
    return attempt_review_intent_pays(r, "pi_1", ATTEMPT, 1500, "EUR", says, size);
}

START_TEST(an_intent_of_the_attempt_s_amount_pays_it)
{
    char says[512];
    struct provider_result r = intent(1500, "eur", ATTEMPT);
    ck_assert_int_eq(pays(&r, says, sizeof(says)), 0);
    /* Its metadata naming the attempt in upper case names the attempt. */
    r = intent(1500, "eur", "5D1C2C1E-1A9B-4B1E-8E55-000000000001");
    ck_assert_int_eq(pays(&r, says, sizeof(says)), 0);
    /* A look-up that carries no currency or metadata is not judged on them. */
    r = intent(1500, "", "");
    ck_assert_int_eq(pays(&r, says, sizeof(says)), 0);
}
END_TEST

/* Issue 34, adversary round 2: an intent the provider reports of amount 0
 * (or with no amount) was waved through, the amount compared only when it
 * was not 0: a charge of 0 is no charge of the attempt's 1500. */
START_TEST(an_amount_of_0_is_not_the_attempt_s)
{
    char says[512];
    struct provider_result r = intent(0, "eur", ATTEMPT);
    ck_assert_int_eq(pays(&r, says, sizeof(says)), -1);
    ck_assert_msg(strstr(says, "amount 0") && strstr(says, "1500"), "%s", says);
    r = intent(1499, "eur", ATTEMPT);
    ck_assert_int_eq(pays(&r, says, sizeof(says)), -1);
    ck_assert_msg(strstr(says, "amount 1499"), "%s", says);
}
END_TEST

START_TEST(anything_else_is_said)
{
    char says[512];
    struct provider_result r = intent(1500, "eur", ATTEMPT);
    r.outcome = PROVIDER_NOT_FOUND;
    ck_assert_int_eq(pays(&r, says, sizeof(says)), -1);
    ck_assert_msg(strstr(says, "no payment intent pi_1"), "%s", says);
    r = intent(1500, "eur", ATTEMPT);
    snprintf(r.intent_status, sizeof(r.intent_status), "processing");
    ck_assert_int_eq(pays(&r, says, sizeof(says)), -1);
    ck_assert_msg(strstr(says, "processing"), "%s", says);
    r = intent(1500, "usd", ATTEMPT);
    ck_assert_int_eq(pays(&r, says, sizeof(says)), -1);
    ck_assert_msg(strstr(says, "usd"), "%s", says);
    r = intent(1500, "eur", "5d1c2c1e-1a9b-4b1e-8e55-000000000002");
    ck_assert_int_eq(pays(&r, says, sizeof(says)), -1);
    ck_assert_msg(strstr(says, "another attempt"), "%s", says);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attempt_review_pays");
    TCase *tc = tcase_create("attempt_review_pays");
    tcase_add_test(tc, an_intent_of_the_attempt_s_amount_pays_it);
    tcase_add_test(tc, an_amount_of_0_is_not_the_attempt_s);
    tcase_add_test(tc, anything_else_is_said);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
