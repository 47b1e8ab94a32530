/* Unit tests of the capture's, the void's and the authorization's review
 * judges: what the provider's intent (retrieved by the id charged recorded)
 * must show before an operator's decision on one in review is written,
 * without a socket or a database. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "authorization_review.h"
#include "capture_review.h"
#include "test_env.h"
#include "void_review.h"

static struct provider_result intent(const char *status, long long received,
                                     const char *cancellation)
{
    struct provider_result r;
    memset(&r, 0, sizeof(r));
    r.outcome = PROVIDER_SUCCEEDED;
    snprintf(r.intent_status, sizeof(r.intent_status), "%s", status);
    r.amount = 1000;
    r.amount_received = received;
    r.amount_capturable = received > 0 ? 0 : 1000;
    snprintf(r.cancellation_reason, sizeof(r.cancellation_reason), "%s", cancellation);
    return r;
}

static const struct step_review_row row600 = {
    .payment_intent = "pi_1", .asked = 600, .authorized = 1000};
static const struct step_review_row row_all = {
    .payment_intent = "pi_1", .asked = 0, .authorized = 1000};

static const char *cap(struct provider_result r, enum attempt_status d,
                       const struct step_review_row *row, char *says)
{
    says[0] = '\0';
    return capture_review_judge(&r, d, row, says, 512);
}

static const char *vd(struct provider_result r, enum attempt_status d, char *says)
{
    says[0] = '\0';
    return void_review_judge(&r, d, &row_all, says, 512);
}

START_TEST(a_capture_succeeded_only_as_the_provider_received_it)
{
    char says[512];
    enum attempt_status S = ATTEMPT_STATUS_SUCCEEDED;
    ck_assert_str_eq(cap(intent("succeeded", 600, ""), S, &row600, says), "agrees");
    ck_assert_str_eq(cap(intent("succeeded", 700, ""), S, &row_all, says), "agrees");
    ck_assert_str_eq(cap(intent("succeeded", 800, ""), S, &row600, says),
                     "contradicts");
    ck_assert_msg(strstr(says, "received 800"), "%s", says);
    ck_assert_str_eq(cap(intent("succeeded", 1200, ""), S, &row_all, says),
                     "contradicts");
    ck_assert_str_eq(cap(intent("requires_capture", 0, ""), S, &row600, says),
                     "contradicts");
    ck_assert_msg(strstr(says, "not captured"), "%s", says);
}
END_TEST

START_TEST(a_capture_failed_only_while_nothing_was_received)
{
    char says[512];
    enum attempt_status F = ATTEMPT_STATUS_FAILED;
    ck_assert_str_eq(cap(intent("requires_capture", 0, ""), F, &row600, says),
                     "agrees");
    ck_assert_str_eq(cap(intent("canceled", 0, "automatic"), F, &row600, says),
                     "agrees");
    ck_assert_str_eq(cap(intent("succeeded", 600, ""), F, &row600, says),
                     "contradicts");
    ck_assert_msg(strstr(says, "was captured"), "%s", says);
    ck_assert_str_eq(cap(intent("processing", 0, ""), F, &row600, says), "contradicts");
}
END_TEST

START_TEST(a_void_succeeded_only_when_a_request_released_it)
{
    char says[512];
    enum attempt_status S = ATTEMPT_STATUS_SUCCEEDED;
    ck_assert_str_eq(vd(intent("canceled", 0, "requested_by_customer"), S, says),
                     "agrees");
    ck_assert_str_eq(vd(intent("canceled", 0, "automatic"), S, says), "contradicts");
    ck_assert_msg(strstr(says, "expiry"), "%s", says);
    ck_assert_str_eq(vd(intent("requires_capture", 0, ""), S, says), "contradicts");
    ck_assert_str_eq(vd(intent("succeeded", 1000, ""), S, says), "contradicts");
}
END_TEST

START_TEST(a_void_failed_while_held_expired_or_captured)
{
    char says[512];
    enum attempt_status F = ATTEMPT_STATUS_FAILED;
    ck_assert_str_eq(vd(intent("requires_capture", 0, ""), F, says), "agrees");
    ck_assert_str_eq(vd(intent("canceled", 0, "automatic"), F, says), "agrees");
    ck_assert_str_eq(vd(intent("succeeded", 1000, ""), F, says), "agrees");
    ck_assert_str_eq(vd(intent("canceled", 0, "abandoned"), F, says), "contradicts");
    ck_assert_msg(strstr(says, "released by a request"), "%s", says);
}
END_TEST

static const char *au(struct provider_result r, enum attempt_status d, char *says)
{
    says[0] = '\0';
    return authorization_review_judge(&r, d, &row_all, says, 512);
}

START_TEST(an_authorization_settles_as_its_intent_shows)
{
    char says[512];
    ck_assert_str_eq(au(intent("succeeded", 700, ""), ATTEMPT_STATUS_SUCCEEDED, says),
                     "agrees");
    ck_assert_str_eq(au(intent("succeeded", 1200, ""), ATTEMPT_STATUS_SUCCEEDED, says),
                     "contradicts");
    ck_assert_str_eq(
        au(intent("requires_capture", 0, ""), ATTEMPT_STATUS_AUTHORIZED, says),
        "agrees");
    ck_assert_str_eq(au(intent("succeeded", 700, ""), ATTEMPT_STATUS_AUTHORIZED, says),
                     "contradicts");
    ck_assert_msg(strstr(says, "not AUTHORIZED"), "%s", says);
    ck_assert_str_eq(
        au(intent("canceled", 0, "automatic"), ATTEMPT_STATUS_VOIDED, says), "agrees");
    ck_assert_str_eq(au(intent("requires_capture", 0, ""), ATTEMPT_STATUS_VOIDED, says),
                     "contradicts");
    ck_assert_str_eq(
        au(intent("requires_payment_method", 0, ""), ATTEMPT_STATUS_FAILED, says),
        "agrees");
    ck_assert_str_eq(au(intent("requires_capture", 0, ""), ATTEMPT_STATUS_FAILED, says),
                     "contradicts");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("step_review_judge");
    TCase *tc = tcase_create("step_review_judge");
    tcase_add_test(tc, a_capture_succeeded_only_as_the_provider_received_it);
    tcase_add_test(tc, a_capture_failed_only_while_nothing_was_received);
    tcase_add_test(tc, a_void_succeeded_only_when_a_request_released_it);
    tcase_add_test(tc, a_void_failed_while_held_expired_or_captured);
    tcase_add_test(tc, an_authorization_settles_as_its_intent_shows);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
