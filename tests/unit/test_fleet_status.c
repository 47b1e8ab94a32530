/* Unit tests of fleet_status_parse_breaker: the breaker's gauge in a
 * worker's Prometheus text, as common/runtime/metrics writes it and as any
 * exposition may, and everything that is not it. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "fleet_status.h"
#include "metrics.h"
#include "test_env.h"

static int parse(const char *body)
{
    return fleet_status_parse_breaker(body, strlen(body));
}

START_TEST(what_the_workers_metrics_say)
{
    char *text = NULL;
    size_t len = 0;
    metrics_reset();
    for (int state = 0; state <= 2; state++) {
        metrics_set(METRIC_BREAKER_STATE, state);
        metrics_add(METRIC_BREAKER_OPENS, 1);
        ck_assert_int_eq(metrics_render(&text, &len), 0);
        ck_assert_int_eq(fleet_status_parse_breaker(text, len), state);
        free(text);
    }
    /* A role without a breaker has no such line. */
    metrics_reset();
    ck_assert_int_eq(metrics_render(&text, &len), 0);
    ck_assert_int_eq(fleet_status_parse_breaker(text, len), -1);
    free(text);
    metrics_reset();
}
END_TEST

START_TEST(plain_labelled_and_timestamped_samples)
{
    ck_assert_int_eq(parse("charged_provider_breaker_state 0\n"), 0);
    ck_assert_int_eq(parse("charged_provider_breaker_state 1\n"), 1);
    ck_assert_int_eq(parse("charged_provider_breaker_state 2\n"), 2);
    ck_assert_int_eq(parse("charged_provider_breaker_state{provider=\"psp\"} 2\n"), 2);
    ck_assert_int_eq(parse("charged_provider_breaker_state{} 1\n"), 1);
    /* A '}' and an escaped quote inside a label value end nothing. */
    ck_assert_int_eq(
        parse("charged_provider_breaker_state{a=\"x} 0\",b=\"\\\"}\"} 2\n"), 2);
    ck_assert_int_eq(parse("charged_provider_breaker_state 2 1764748800000\n"), 2);
    ck_assert_int_eq(parse("charged_provider_breaker_state\t\t1\t\n"), 1);
    ck_assert_int_eq(parse("  charged_provider_breaker_state 1\r\n"), 1);
    /* Gauges are floats: 2.0 and 2e0 are 2. */
    ck_assert_int_eq(parse("charged_provider_breaker_state 2.0\n"), 2);
    ck_assert_int_eq(parse("charged_provider_breaker_state 2e0\n"), 2);
    ck_assert_int_eq(parse("charged_provider_breaker_state -0\n"), 0);
}
END_TEST

START_TEST(comments_and_other_metrics_are_not_the_sample)
{
    const char *body =
        "# HELP charged_provider_breaker_state Provider circuit breaker: "
        "0 closed, 1 half-open, 2 open.\n"
        "# TYPE charged_provider_breaker_state gauge\n"
        "#charged_provider_breaker_state 2\n"
        "charged_provider_breaker_state_total 2\n"
        "charged_provider_breaker_states 2\n"
        "xcharged_provider_breaker_state 2\n"
        "charged_provider_breaker_opens_total 7\n"
        "charged_provider_breaker_state 1\n";
    ck_assert_int_eq(parse(body), 1);
    ck_assert_int_eq(parse("# HELP charged_provider_breaker_state 2\n"
                           "# TYPE charged_provider_breaker_state gauge\n"),
                     -1);
}
END_TEST

START_TEST(missing_is_minus_one)
{
    ck_assert_int_eq(fleet_status_parse_breaker(NULL, 0), -1);
    ck_assert_int_eq(fleet_status_parse_breaker("", 0), -1);
    ck_assert_int_eq(parse("\n\n\n"), -1);
    ck_assert_int_eq(parse("charged_ready 1\ncharged_worker_in_flight 3\n"), -1);
    /* len is the body: what follows it is not read. */
    const char *b = "charged_ready 1\ncharged_provider_breaker_state 2\n";
    ck_assert_int_eq(fleet_status_parse_breaker(b, strlen("charged_ready 1\n")), -1);
}
END_TEST

START_TEST(garbage_is_no_state)
{
    const char *bad[] = {
        "charged_provider_breaker_state\n",
        "charged_provider_breaker_state \n",
        "charged_provider_breaker_state open\n",
        "charged_provider_breaker_state 2x\n",
        "charged_provider_breaker_state 3\n",
        "charged_provider_breaker_state -1\n",
        "charged_provider_breaker_state 1.5\n",
        "charged_provider_breaker_state NaN\n",
        "charged_provider_breaker_state +Inf\n",
        "charged_provider_breaker_state 0x2\n",
        "charged_provider_breaker_state 2e\n",
        "charged_provider_breaker_state .\n",
        "charged_provider_breaker_state 2 12 extra\n",
        "charged_provider_breaker_state 2 twelve\n",
        "charged_provider_breaker_state{provider=\"psp\" 2\n",
        "charged_provider_breaker_state{provider=\"psp} 2\n",
        "charged_provider_breaker_state2\n",
        "charged_provider_breaker_state{}2\n",
        "{}\n",
        "\xff\xfe\x01\x02",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(parse(bad[i]) == -1, "'%s' read as a state", bad[i]);
    /* A NUL inside the value. */
    const char nul[] = "charged_provider_breaker_state 2\0\n";
    ck_assert_int_eq(fleet_status_parse_breaker(nul, sizeof(nul) - 1), -1);
    /* A bad line does not hide a good one. */
    ck_assert_int_eq(parse("charged_provider_breaker_state banana\n"
                           "charged_provider_breaker_state 2\n"),
                     2);
}
END_TEST

START_TEST(huge_numbers_are_no_state)
{
    ck_assert_int_eq(parse("charged_provider_breaker_state 99999999999999999999\n"),
                     -1);
    ck_assert_int_eq(parse("charged_provider_breaker_state 4294967298\n"), -1);
    ck_assert_int_eq(parse("charged_provider_breaker_state 1e400\n"), -1);
    /* Rounds to 0 only by underflow: not a 0. */
    ck_assert_int_eq(parse("charged_provider_breaker_state 1e-400\n"), -1);
    /* Longer than any value written: refused unread. */
    char big[4096];
    memcpy(big, "charged_provider_breaker_state ", 31);
    memset(big + 31, '0', sizeof(big) - 33);
    big[sizeof(big) - 2] = '2';
    big[sizeof(big) - 1] = '\0';
    ck_assert_int_eq(parse(big), -1);
    /* A line of a megabyte, then the sample. */
    size_t n = 1024 * 1024;
    char *body = malloc(n + 64);
    ck_assert_ptr_nonnull(body);
    memset(body, 'x', n);
    strcpy(body + n, "\ncharged_provider_breaker_state 1");
    ck_assert_int_eq(parse(body), 1);
    free(body);
}
END_TEST

START_TEST(no_trailing_newline)
{
    ck_assert_int_eq(parse("charged_provider_breaker_state 2"), 2);
    ck_assert_int_eq(parse("# TYPE charged_provider_breaker_state gauge\n"
                           "charged_provider_breaker_state{provider=\"psp\"} 1"),
                     1);
    /* The body cut inside the labels or the name. */
    ck_assert_int_eq(parse("charged_provider_breaker_state{provider=\"p"), -1);
    ck_assert_int_eq(parse("charged_provider_breaker_sta"), -1);
    /* Exactly len bytes, no NUL after them. */
    char exact[32];
    memcpy(exact, "charged_provider_breaker_state 1", 32);
    ck_assert_int_eq(fleet_status_parse_breaker(exact, sizeof(exact)), 1);
}
END_TEST

START_TEST(several_samples_the_worst_is_the_workers)
{
    ck_assert_int_eq(parse("charged_provider_breaker_state{provider=\"a\"} 0\n"
                           "charged_provider_breaker_state{provider=\"b\"} 2\n"
                           "charged_provider_breaker_state{provider=\"c\"} 1\n"),
                     2);
    ck_assert_int_eq(parse("charged_provider_breaker_state{provider=\"a\"} 1\n"
                           "charged_provider_breaker_state{provider=\"b\"} 0\n"),
                     1);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fleet_status");
    TCase *tc = tcase_create("parse_breaker");
    tcase_add_test(tc, what_the_workers_metrics_say);
    tcase_add_test(tc, plain_labelled_and_timestamped_samples);
    tcase_add_test(tc, comments_and_other_metrics_are_not_the_sample);
    tcase_add_test(tc, missing_is_minus_one);
    tcase_add_test(tc, garbage_is_no_state);
    tcase_add_test(tc, huge_numbers_are_no_state);
    tcase_add_test(tc, no_trailing_newline);
    tcase_add_test(tc, several_samples_the_worst_is_the_workers);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
