/* Unit tests of provider_client_classify: the answers the fuzz target
 * (tests/fuzz/fuzz_provider_answer.c) found, and the table's rows it checks,
 * without a socket. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "card_data.h"
#include "provider_client.h"
#include "test_env.h"
#include "utf8_text.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"

static struct provider_result classify_charge(int http, const char *replayed,
                                              const char *body)
{
    struct provider_call call = {.amount = 1999};
    snprintf(call.currency, sizeof(call.currency), "eur");
    snprintf(call.attempt_id, sizeof(call.attempt_id), ATTEMPT);
    struct provider_result res;
    memset(&res, 0, sizeof(res));
    provider_client_classify(&call, http, replayed, body, body ? strlen(body) : 0,
                             &res);
    return res;
}

static void assert_clean(const char *s)
{
    ck_assert(utf8_text_valid(s, strlen(s)));
    for (const char *p = s; *p; p++)
        ck_assert_msg((unsigned char)*p >= 0x20 && *p != 0x7f, "control byte in '%s'",
                      s);
}

/* Found by fuzz_provider_answer (tests/fuzz/regressions/provider_answer/):
 * a 2xx intent whose status holds a DEL byte put it into the error line
 * raw, for the log and the database. */
START_TEST(an_odd_intent_status_is_quoted_clean)
{
    struct provider_result r =
        classify_charge(200, NULL,
                        "{\"id\":\"pi_1\",\"object\":\"payment_intent\",\"status\":"
                        "\"pr\\u007fcessing\"}");
    ck_assert_int_eq(r.outcome, PROVIDER_REQUIRES_REVIEW);
    assert_clean(r.error);
    ck_assert(strstr(r.error, "intent status 'pr"));
}
END_TEST

/* A long status of multi-byte characters is cut on a character. */
START_TEST(a_long_intent_status_is_cut_whole)
{
    /* "x" first, so that the bound falls inside a character. */
    char body[2048] = "{\"id\":\"pi_1\",\"status\":\"x";
    for (int i = 0; i < 200; i++)
        strcat(body, "\xc3\xa9");
    strcat(body, "\"}");
    struct provider_result r = classify_charge(201, NULL, body);
    ck_assert_int_eq(r.outcome, PROVIDER_REQUIRES_REVIEW);
    assert_clean(r.error);
}
END_TEST

/* Issue 34, break 8: a card number as a decline code (or in any text of
 * the answer) is masked where the answer is read, whichever path reads it
 * (the worker's charge, the reconciler's look-up, a resolve). The intent's
 * id is not text: it stays as given. */
START_TEST(card_numbers_in_an_answer_are_masked)
{
    const char *body =
        "{\"id\":\"pi_1\",\"object\":\"payment_intent\",\"status\":"
        "\"requires_payment_method\",\"amount\":1999,\"currency\":\"eur\","
        "\"metadata\":{\"payment_attempt_id\":\"" ATTEMPT "\"},"
        "\"last_payment_error\":{\"type\":\"card_error\",\"code\":"
        "\"card_declined 5555555555554444\",\"decline_code\":\"4242424242424242\","
        "\"message\":\"card 4000 0566 5566 5556 refused\"}}";
    struct provider_call call = {
        .lookup = 1, .kind = PROVIDER_LOOKUP_RETRIEVE, .amount = 1999};
    snprintf(call.currency, sizeof(call.currency), "eur");
    snprintf(call.attempt_id, sizeof(call.attempt_id), ATTEMPT);
    struct provider_result r;
    memset(&r, 0, sizeof(r));
    provider_client_classify(&call, 200, NULL, body, strlen(body), &r);
    ck_assert_str_eq(r.decline_code, "************4242");
    ck_assert_str_eq(r.code, "card_declined ************4444");
    ck_assert_str_eq(r.provider_payment_id, "pi_1");
    char all[1024];
    snprintf(all, sizeof(all), "%s|%s|%s|%s", r.code, r.decline_code, r.error,
             r.intent_status);
    ck_assert_msg(!card_data_found(all, strlen(all)), "card digits in '%s'", all);
}
END_TEST

START_TEST(the_table_without_a_socket)
{
    const char *intent = "{\"id\":\"pi_1\",\"status\":\"succeeded\",\"amount\":1999,"
                         "\"currency\":\"eur\"}";
    struct provider_result r = classify_charge(200, "true", intent);
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.replayed, 1);
    ck_assert_str_eq(r.provider_payment_id, "pi_1");
    ck_assert_int_eq(classify_charge(503, NULL, intent).outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(classify_charge(429, "false", NULL).outcome,
                     PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(classify_charge(429, "false", NULL).replayed, 0);
    ck_assert_int_eq(
        classify_charge(200, NULL,
                        "{\"id\":\"pi_1\",\"status\":\"succeeded\",\"amount\":5}")
            .outcome,
        PROVIDER_REQUIRES_REVIEW);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("provider_classify");
    TCase *tc = tcase_create("provider_classify");
    tcase_add_test(tc, an_odd_intent_status_is_quoted_clean);
    tcase_add_test(tc, a_long_intent_status_is_cut_whole);
    tcase_add_test(tc, card_numbers_in_an_answer_are_masked);
    tcase_add_test(tc, the_table_without_a_socket);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
