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

/* Issue 38: a 429 is not executed and says it was throttled; a look-up's
 * stays no evidence (UNKNOWN). Nothing else is throttled, and a 409 parks
 * its job without being throttled. */
START_TEST(a_429_says_throttled_and_nothing_else_does)
{
    const char *rate = "{\"error\":{\"type\":\"invalid_request_error\","
                       "\"code\":\"rate_limit\",\"message\":\"Too many requests\"}}";
    struct provider_result r = classify_charge(429, NULL, rate);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(r.throttled, 1);
    ck_assert_int_eq(r.retry_after_ms, 0); /* the header is the wire's */
    ck_assert(provider_outcome_parks(&r));
    static const int others[] = {200, 400, 401, 402, 403, 404, 409, 500, 503};
    for (size_t i = 0; i < sizeof(others) / sizeof(others[0]); i++)
        ck_assert_int_eq(classify_charge(others[i], NULL, rate).throttled, 0);
    r = classify_charge(409, NULL, NULL);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert(provider_outcome_parks(&r));
    ck_assert(!provider_outcome_parks(&(struct provider_result){
        .outcome = PROVIDER_NOT_EXECUTED, .http_status = 401}));
    for (int k = PROVIDER_LOOKUP_RETRIEVE; k <= PROVIDER_LOOKUP_LIST; k++) {
        struct provider_call call = {.lookup = 1, .kind = (enum provider_lookup)k};
        struct provider_result l;
        memset(&l, 0, sizeof(l));
        provider_client_classify(&call, 429, NULL, rate, strlen(rate), &l);
        ck_assert_int_eq(l.outcome, PROVIDER_UNKNOWN);
        ck_assert_int_eq(l.throttled, 1);
        ck_assert(!provider_outcome_parks(&l));
    }
}
END_TEST

START_TEST(retry_after_is_seconds_bounded)
{
    ck_assert_int_eq(provider_outcome_retry_after_ms(NULL), 0);
    ck_assert_int_eq(provider_outcome_retry_after_ms(""), 0);
    ck_assert_int_eq(provider_outcome_retry_after_ms("0"), 0);
    ck_assert_int_eq(provider_outcome_retry_after_ms("2"), 2000);
    ck_assert_int_eq(provider_outcome_retry_after_ms(" 7 "), 7000);
    ck_assert_int_eq(provider_outcome_retry_after_ms("60"),
                     PROVIDER_RETRY_AFTER_MAX_MS);
    ck_assert_int_eq(provider_outcome_retry_after_ms("3600"),
                     PROVIDER_RETRY_AFTER_MAX_MS);
    ck_assert_int_eq(provider_outcome_retry_after_ms("99999999999999999999999"),
                     PROVIDER_RETRY_AFTER_MAX_MS);
    /* An HTTP-date, a fraction, a sign: not delta-seconds. */
    ck_assert_int_eq(provider_outcome_retry_after_ms("Wed, 21 Oct 2015 07:28:00 GMT"),
                     0);
    ck_assert_int_eq(provider_outcome_retry_after_ms("1.5"), 0);
    ck_assert_int_eq(provider_outcome_retry_after_ms("-1"), 0);
}
END_TEST

/* Issue 38: a 429 slows its sender: the provider's Retry-After when it gave
 * one, else a back-off from a second, doubled per 429 in a row, at most a
 * minute; never nothing. */
START_TEST(throttled_waits_retry_after_or_backs_off)
{
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(1000, 0), 1000);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(7000, 5), 7000);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(PROVIDER_RETRY_AFTER_MAX_MS, 0),
                     PROVIDER_RETRY_AFTER_MAX_MS);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(0, 0), 1000);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(0, 1), 2000);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(0, 3), 8000);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(0, 6),
                     PROVIDER_RETRY_AFTER_MAX_MS);
    ck_assert_int_eq(provider_outcome_throttled_wait_ms(0, 1000000),
                     PROVIDER_RETRY_AFTER_MAX_MS);
}
END_TEST

static struct provider_result classify_lookup(enum provider_lookup kind, int refund,
                                              const char *attempt, int http,
                                              const char *body)
{
    struct provider_call call = {.lookup = 1, .kind = kind, .refund = refund};
    snprintf(call.attempt_id, sizeof(call.attempt_id), "%s", attempt ? attempt : "");
    struct provider_result res;
    memset(&res, 0, sizeof(res));
    provider_client_classify(&call, http, NULL, body, body ? strlen(body) : 0, &res);
    return res;
}

/* Issue 34, adversary round 2: the refunds of an intent the provider no
 * longer has answered 404 resource_missing, and a review read that as an
 * empty list, "no refund executed". Only a look-up of one object by its
 * id is absent on a 404; a search or a list answered 404 looked at
 * nothing: no evidence. */
START_TEST(a_list_or_search_answered_404_is_no_evidence)
{
    const char *missing = "{\"error\":{\"type\":\"invalid_request_error\","
                          "\"code\":\"resource_missing\",\"param\":\"payment_intent\","
                          "\"message\":\"No such payment_intent: 'pi_gone'\"}}";
    struct provider_result r =
        classify_lookup(PROVIDER_LOOKUP_LIST, 1, ATTEMPT, 404, missing);
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN);
    ck_assert_msg(strstr(r.error, "404"), "%s", r.error);
    ck_assert_int_eq(
        classify_lookup(PROVIDER_LOOKUP_LIST, 0, ATTEMPT, 404, missing).outcome,
        PROVIDER_UNKNOWN);
    ck_assert_int_eq(
        classify_lookup(PROVIDER_LOOKUP_SEARCH, 0, NULL, 404, missing).outcome,
        PROVIDER_UNKNOWN);
    /* One object by its id: the provider's own word that it has none. */
    ck_assert_int_eq(
        classify_lookup(PROVIDER_LOOKUP_RETRIEVE, 0, NULL, 404, missing).outcome,
        PROVIDER_NOT_FOUND);
    ck_assert_int_eq(
        classify_lookup(PROVIDER_LOOKUP_RETRIEVE, 1, NULL, 404, missing).outcome,
        PROVIDER_NOT_FOUND);
    /* An empty page that answered is evidence of none. */
    ck_assert_int_eq(
        classify_lookup(PROVIDER_LOOKUP_LIST, 1, ATTEMPT, 200,
                        "{\"object\":\"list\",\"data\":[],\"has_more\":false}")
            .outcome,
        PROVIDER_NOT_FOUND);
}
END_TEST

/* Issue 34, adversary round 2: a UUID is one id in either case. An object
 * whose metadata names ours in upper case is listed as naming it, whether
 * the id asked for is written in lower or upper case. */
START_TEST(a_list_matches_metadata_ids_in_either_case)
{
    char upper[64], body[1024];
    snprintf(upper, sizeof(upper), "%s", ATTEMPT);
    for (char *p = upper; *p; p++)
        if (*p >= 'a' && *p <= 'z')
            *p = (char)(*p - 'a' + 'A');
    snprintf(body, sizeof(body),
             "{\"object\":\"list\",\"has_more\":false,\"data\":["
             "{\"id\":\"pi_2\",\"object\":\"payment_intent\",\"status\":"
             "\"succeeded\",\"amount\":1999,\"currency\":\"eur\","
             "\"metadata\":{\"payment_attempt_id\":\"%s\"}}]}",
             upper);
    const char *asked[] = {ATTEMPT, upper};
    for (size_t i = 0; i < 2; i++) {
        struct provider_result r =
            classify_lookup(PROVIDER_LOOKUP_LIST, 0, asked[i], 200, body);
        ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
        ck_assert_int_eq(r.matches, 1);
        ck_assert_str_eq(r.provider_payment_id, "pi_2");
    }
    snprintf(body, sizeof(body),
             "{\"object\":\"list\",\"has_more\":false,\"data\":["
             "{\"id\":\"re_2\",\"object\":\"refund\",\"status\":\"succeeded\","
             "\"amount\":500,\"currency\":\"eur\",\"payment_intent\":\"pi_1\","
             "\"metadata\":{\"refund_id\":\"%s\"}}]}",
             upper);
    for (size_t i = 0; i < 2; i++) {
        struct provider_result r =
            classify_lookup(PROVIDER_LOOKUP_LIST, 1, asked[i], 200, body);
        ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
        ck_assert_int_eq(r.matches, 1);
        ck_assert_str_eq(r.provider_payment_id, "re_2");
    }
    /* Another id still names another. */
    struct provider_result r = classify_lookup(
        PROVIDER_LOOKUP_LIST, 1, "5d1c2c1e-1a9b-4b1e-8e55-000000000002", 200, body);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_FOUND);
    ck_assert_int_eq(r.matches, 0);
}
END_TEST

/* A fuzzed answer: a look-up answered a hold (or a charge, a refund) whose
 * id is not one we could use again. Settling on it would book an
 * authorization that no capture can name: no evidence, as a garbled
 * answer. */
START_TEST(a_looked_up_object_without_a_usable_id_is_no_evidence)
{
    const char *ids[] = {"\"x y\"", "\"\"", "7", "null"};
    for (size_t i = 0; i < sizeof(ids) / sizeof(ids[0]); i++) {
        char body[1024];
        snprintf(body, sizeof(body),
                 "{\"object\":\"payment_intent\",\"id\":%s,\"status\":"
                 "\"requires_capture\",\"capture_method\":\"manual\"}",
                 ids[i]);
        struct provider_result r =
            classify_lookup(PROVIDER_LOOKUP_RETRIEVE, 0, NULL, 200, body);
        ck_assert_msg(r.outcome == PROVIDER_UNKNOWN, "%s: %s", ids[i],
                      provider_outcome_name(r.outcome));
        ck_assert_msg(strstr(r.error, "usable id"), "%s", r.error);
        snprintf(body, sizeof(body),
                 "{\"object\":\"search_result\",\"data\":[{\"object\":"
                 "\"payment_intent\",\"id\":%s,\"status\":\"succeeded\"}]}",
                 ids[i]);
        ck_assert_int_eq(
            classify_lookup(PROVIDER_LOOKUP_SEARCH, 0, NULL, 200, body).outcome,
            PROVIDER_UNKNOWN);
        snprintf(body, sizeof(body),
                 "{\"object\":\"list\",\"has_more\":false,\"data\":[{\"object\":"
                 "\"refund\",\"id\":%s,\"status\":\"succeeded\",\"metadata\":"
                 "{\"refund_id\":\"%s\"}}]}",
                 ids[i], ATTEMPT);
        ck_assert_int_eq(
            classify_lookup(PROVIDER_LOOKUP_LIST, 1, ATTEMPT, 200, body).outcome,
            PROVIDER_UNKNOWN);
    }
    /* The same answers naming their objects are evidence. */
    ck_assert_int_eq(classify_lookup(PROVIDER_LOOKUP_RETRIEVE, 0, NULL, 200,
                                     "{\"object\":\"payment_intent\",\"id\":"
                                     "\"pi_1\",\"status\":\"requires_capture\","
                                     "\"capture_method\":\"manual\"}")
                         .outcome,
                     PROVIDER_AUTHORIZED);
    ck_assert_int_eq(classify_lookup(PROVIDER_LOOKUP_SEARCH, 0, NULL, 200,
                                     "{\"object\":\"search_result\",\"data\":[{"
                                     "\"object\":\"payment_intent\",\"id\":"
                                     "\"pi_1\",\"status\":\"succeeded\"}]}")
                         .outcome,
                     PROVIDER_SUCCEEDED);
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
    tcase_add_test(tc, a_429_says_throttled_and_nothing_else_does);
    tcase_add_test(tc, retry_after_is_seconds_bounded);
    tcase_add_test(tc, throttled_waits_retry_after_or_backs_off);
    tcase_add_test(tc, a_list_or_search_answered_404_is_no_evidence);
    tcase_add_test(tc, a_list_matches_metadata_ids_in_either_case);
    tcase_add_test(tc, a_looked_up_object_without_a_usable_id_is_no_evidence);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
