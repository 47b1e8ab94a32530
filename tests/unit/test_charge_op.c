/* Unit tests of worker/operations/charge/charge_op: a charge sends the
 * stored attempt's parameters, each in its own field, and a lost first try
 * is recorded as a call of unknown outcome that reached the wire. */
#include <check.h>
#include <stdio.h>

#include "charge_op.h"
#include "test_env.h"

START_TEST(the_request_is_the_stored_attempts)
{
    struct attempt_params p = {.amount = 1999};
    snprintf(p.idempotency_key, sizeof(p.idempotency_key), "%s", "key-1");
    snprintf(p.order_id, sizeof(p.order_id), "%s",
             "0b6c1f0e-0000-4000-8000-00000000000a");
    snprintf(p.currency, sizeof(p.currency), "%s", "EUR");
    snprintf(p.payment_method, sizeof(p.payment_method), "%s", "pm_card_visa");
    snprintf(p.customer_id, sizeof(p.customer_id), "%s", "cus_1");
    const char *attempt = "5d0e6a3c-0000-4000-8000-00000000000b";
    struct provider_charge ch = charge_op_request(&p, attempt);
    ck_assert_str_eq(ch.idempotency_key, "key-1");
    ck_assert_int_eq(ch.amount, 1999);
    ck_assert_str_eq(ch.currency, "EUR");
    ck_assert_str_eq(ch.payment_method, "pm_card_visa");
    ck_assert_str_eq(ch.customer_id, "cus_1");
    ck_assert_str_eq(ch.order_id, "0b6c1f0e-0000-4000-8000-00000000000a");
    ck_assert_ptr_eq(ch.payment_attempt_id, attempt);
    /* It points into the stored attempt: nothing is copied that could go
     * stale between the claim and the call. */
    ck_assert_ptr_eq(ch.idempotency_key, p.idempotency_key);
    ck_assert_ptr_eq(ch.payment_method, p.payment_method);
    ck_assert_int_eq(ch.capture_method, PROVIDER_CAPTURE_AUTOMATIC);
    /* An authorization's stored attempt is sent as one, by every role. */
    p.manual = 1;
    ch = charge_op_request(&p, attempt);
    ck_assert_int_eq(ch.capture_method, PROVIDER_CAPTURE_MANUAL);
}
END_TEST

START_TEST(a_lost_try_is_unknown_and_was_sent)
{
    struct provider_result lost = provider_outcome_lost_answer();
    ck_assert_int_eq(lost.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(lost.sent, 1);
    ck_assert_int_eq(lost.http_status, 0);
    ck_assert_int_eq(lost.resent, 0);
    ck_assert_str_eq(lost.error,
                     "connection closed without an answer; re-sent with the same key");
    ck_assert_str_eq(lost.provider_payment_id, "");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("charge_op");
    TCase *tc = tcase_create("charge_op");
    tcase_add_test(tc, the_request_is_the_stored_attempts);
    tcase_add_test(tc, a_lost_try_is_unknown_and_was_sent);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
