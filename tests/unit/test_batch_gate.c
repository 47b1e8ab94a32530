/* batch_gate: items go at once at low load, gather for at most a hold
 * under load, and a full batch never waits. */
#include <check.h>
#include <stdint.h>

#include "batch_gate.h"
#include "test_env.h"

START_TEST(nothing_waiting_is_never_due)
{
    struct batch_gate g;
    batch_gate_init(&g, 5, 64);
    ck_assert(batch_gate_due_at(&g, 0, 1000) == INT64_MAX);
    batch_gate_ran(&g, 1000);
    ck_assert(batch_gate_due_at(&g, 0, 1001) == INT64_MAX);
}
END_TEST

START_TEST(an_idle_stage_runs_at_once)
{
    struct batch_gate g;
    batch_gate_init(&g, 5, 64);
    ck_assert_int_eq(batch_gate_due_at(&g, 1, 1000), 1000); /* never ran */
    batch_gate_ran(&g, 1000);
    /* Items further apart than the hold each go at once. */
    ck_assert_int_eq(batch_gate_due_at(&g, 1, 1005), 1005);
    ck_assert_int_eq(batch_gate_due_at(&g, 1, 1900), 1900);
}
END_TEST

START_TEST(under_load_items_wait_at_most_a_hold)
{
    struct batch_gate g;
    batch_gate_init(&g, 5, 64);
    batch_gate_ran(&g, 1000);
    /* One ran 1 ms ago: the next statement is due when the hold ends, and
     * no item waits longer than a hold for it. */
    for (int64_t now = 1000; now < 1005; now++) {
        int64_t at = batch_gate_due_at(&g, 3, now);
        ck_assert_int_eq(at, 1005);
        ck_assert(at - now <= 5);
    }
    ck_assert_int_eq(batch_gate_due_at(&g, 3, 1005), 1005);
}
END_TEST

START_TEST(a_full_batch_goes_at_once)
{
    struct batch_gate g;
    batch_gate_init(&g, 5, 64);
    batch_gate_ran(&g, 1000);
    ck_assert_int_eq(batch_gate_due_at(&g, 63, 1001), 1005);
    ck_assert_int_eq(batch_gate_due_at(&g, 64, 1001), 1001);
    ck_assert_int_eq(batch_gate_due_at(&g, 500, 1001), 1001);
}
END_TEST

START_TEST(no_hold_is_every_item_at_once)
{
    struct batch_gate g;
    batch_gate_init(&g, 0, 64);
    batch_gate_ran(&g, 1000);
    ck_assert_int_eq(batch_gate_due_at(&g, 1, 1000), 1000);
}
END_TEST

/* A clock behind the last run (a test's clock, a step) holds nothing. */
START_TEST(a_clock_behind_the_last_run_holds_nothing)
{
    struct batch_gate g;
    batch_gate_init(&g, 5, 64);
    batch_gate_ran(&g, 1000);
    ck_assert_int_eq(batch_gate_due_at(&g, 1, 990), 990);
}
END_TEST

/* Under a steady rate the gate's statements per item fall as the rate
 * rises: a loop that wakes per item and runs whatever is due. */
START_TEST(statements_per_item_fall_with_the_rate)
{
    const int64_t every_us[] = {10000, 1000, 100}; /* 100/s, 1,000/s, 10,000/s */
    double per_item[3];
    for (int r = 0; r < 3; r++) {
        struct batch_gate g;
        batch_gate_init(&g, 5, 1000);
        int statements = 0, waiting = 0, items = 0;
        int64_t longest = 0, oldest = -1;
        for (int64_t us = 0; us < 2000000; us += 100) { /* 2 s in 0.1 ms steps */
            int64_t now = us / 1000;
            if (us % every_us[r] == 0) {
                if (!waiting)
                    oldest = now;
                waiting++;
                items++;
            }
            if (waiting && batch_gate_due_at(&g, (size_t)waiting, now) <= now) {
                if (now - oldest > longest)
                    longest = now - oldest;
                batch_gate_ran(&g, now);
                statements++;
                waiting = 0;
            }
        }
        per_item[r] = (double)statements / items;
        ck_assert_msg(longest <= 5, "an item waited %lld ms", (long long)longest);
    }
    ck_assert(per_item[0] == 1.0); /* 100/s: every item alone, at once */
    ck_assert(per_item[1] < 0.25);
    ck_assert(per_item[2] < per_item[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("batch_gate");
    TCase *tc = tcase_create("batch_gate");
    tcase_add_test(tc, nothing_waiting_is_never_due);
    tcase_add_test(tc, an_idle_stage_runs_at_once);
    tcase_add_test(tc, under_load_items_wait_at_most_a_hold);
    tcase_add_test(tc, a_full_batch_goes_at_once);
    tcase_add_test(tc, no_hold_is_every_item_at_once);
    tcase_add_test(tc, a_clock_behind_the_last_run_holds_nothing);
    tcase_add_test(tc, statements_per_item_fall_with_the_rate);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
