/* Unit tests of common/core/daemon_policy: how long the loop sleeps before
 * its step is due (never past it, never while it is due), the database
 * back-off's steps and ceiling, and the shutdown's time shared between the
 * drain and finish(). */
#include <check.h>
#include <limits.h>
#include <stdint.h>

#include "daemon_policy.h"
#include "test_env.h"

START_TEST(the_earlier_time_is_due_first)
{
    ck_assert_int_eq(daemon_policy_earliest(1000, 2000), 1000);
    ck_assert_int_eq(daemon_policy_earliest(2000, 1000), 1000);
    ck_assert_int_eq(daemon_policy_earliest(0, 5000), 0);
    ck_assert_int_eq(daemon_policy_earliest(INT64_MAX, 7), 7);
}
END_TEST

START_TEST(a_due_step_gets_no_sleep)
{
    ck_assert_int_eq(daemon_policy_wait_ms(5000, 5000), 0);
    ck_assert_int_eq(daemon_policy_wait_ms(5000, 4999), 0);
    /* 0: "due now", whatever the clock says. */
    ck_assert_int_eq(daemon_policy_wait_ms(5000, 0), 0);
    ck_assert_int_eq(daemon_policy_wait_ms(0, 0), 0);
}
END_TEST

START_TEST(the_sleep_ends_when_the_step_is_due)
{
    ck_assert_int_eq(daemon_policy_wait_ms(5000, 5001), 1);
    ck_assert_int_eq(daemon_policy_wait_ms(5000, 5250), 250);
    ck_assert_int_eq(daemon_policy_wait_ms(123456789, 123456789 + 600000), 600000);
}
END_TEST

START_TEST(a_far_step_sleeps_at_most_what_poll_takes)
{
    ck_assert_int_eq(daemon_policy_wait_ms(1000, 1000 + (int64_t)INT_MAX), INT_MAX);
    ck_assert_int_eq(daemon_policy_wait_ms(1000, 1000 + (int64_t)INT_MAX + 1), INT_MAX);
    ck_assert_int_eq(daemon_policy_wait_ms(1000, INT64_MAX), INT_MAX);
}
END_TEST

START_TEST(the_back_off_doubles_from_250_ms_to_5_s)
{
    static const int64_t steps[] = {250, 500, 1000, 2000, 4000, 5000, 5000};
    int64_t b = 0;
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        b = daemon_policy_backoff_ms(b);
        ck_assert_int_eq(b, steps[i]);
    }
    /* Whatever came before, never above the ceiling, and 0 starts again. */
    ck_assert_int_eq(daemon_policy_backoff_ms(3000), 5000);
    ck_assert_int_eq(daemon_policy_backoff_ms(2400), 4800);
    ck_assert_int_eq(daemon_policy_backoff_ms(INT64_MAX), 5000);
    ck_assert_int_eq(daemon_policy_backoff_ms(0), 250);
}
END_TEST

START_TEST(the_drain_leaves_a_quarter_at_most_2_s_for_finish)
{
    /* 30 s: a quarter is 7.5 s, more than 2 s: 2 s are kept. */
    ck_assert_int_eq(daemon_policy_drain_deadline(100000, 30000), 100000 + 28000);
    /* 4 s: a quarter, 1 s, is kept. */
    ck_assert_int_eq(daemon_policy_drain_deadline(100000, 4000), 100000 + 3000);
    ck_assert_int_eq(daemon_policy_drain_deadline(100000, 8000), 100000 + 6000);
    /* No time at all: the drain ends at once. */
    ck_assert_int_eq(daemon_policy_drain_deadline(100000, 0), 100000);
}
END_TEST

START_TEST(finish_flushes_what_is_left_at_most_1_s)
{
    ck_assert_int_eq(daemon_policy_flush_ms(100000, 30000, 100000 + 28000), 1000);
    ck_assert_int_eq(daemon_policy_flush_ms(100000, 4000, 100000 + 3600), 400);
    ck_assert_int_eq(daemon_policy_flush_ms(100000, 4000, 100000 + 4000), 0);
    ck_assert_int_eq(daemon_policy_flush_ms(100000, 4000, 100000 + 9000), 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon_policy");
    TCase *tc = tcase_create("daemon_policy");
    tcase_add_test(tc, the_earlier_time_is_due_first);
    tcase_add_test(tc, a_due_step_gets_no_sleep);
    tcase_add_test(tc, the_sleep_ends_when_the_step_is_due);
    tcase_add_test(tc, a_far_step_sleeps_at_most_what_poll_takes);
    tcase_add_test(tc, the_back_off_doubles_from_250_ms_to_5_s);
    tcase_add_test(tc, the_drain_leaves_a_quarter_at_most_2_s_for_finish);
    tcase_add_test(tc, finish_flushes_what_is_left_at_most_1_s);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
