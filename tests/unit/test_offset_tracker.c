/* Unit tests of common/core/offset_tracker: commits never skip an unfinished
 * message, whatever order messages finish in. */
#include <check.h>
#include <stdlib.h>

#include "offset_tracker.h"
#include "test_env.h"

START_TEST(nothing_seen_nothing_to_commit)
{
    offset_tracker_t *t = offset_tracker_new();
    ck_assert_int_eq(offset_tracker_committable(t, 0), -1);
    offset_tracker_free(t);
    offset_tracker_free(NULL);
}
END_TEST

START_TEST(out_of_order_completion_holds_the_lowest)
{
    offset_tracker_t *t = offset_tracker_new();
    for (int o = 10; o < 15; o++)
        ck_assert_int_eq(offset_tracker_begin(t, 3, o), 0);
    ck_assert_int_eq(offset_tracker_committable(t, 3), 10);
    offset_tracker_done(t, 3, 12);
    offset_tracker_done(t, 3, 14);
    ck_assert_int_eq(offset_tracker_committable(t, 3), 10);
    offset_tracker_done(t, 3, 10);
    ck_assert_int_eq(offset_tracker_committable(t, 3), 11);
    offset_tracker_done(t, 3, 11);
    ck_assert_int_eq(offset_tracker_committable(t, 3), 13);
    ck_assert_uint_eq(offset_tracker_pending(t, 3), 1);
    offset_tracker_done(t, 3, 13);
    ck_assert_int_eq(offset_tracker_committable(t, 3), 15);
    ck_assert_uint_eq(offset_tracker_pending_total(t), 0);
    offset_tracker_free(t);
}
END_TEST

START_TEST(partitions_are_independent_and_dirty_tracks_moves)
{
    offset_tracker_t *t = offset_tracker_new();
    int32_t parts[8];
    offset_tracker_begin(t, 0, 5);
    offset_tracker_begin(t, 1, 7);
    offset_tracker_done(t, 1, 7);
    ck_assert_int_eq(offset_tracker_committable(t, 0), 5);
    ck_assert_int_eq(offset_tracker_committable(t, 1), 8);
    ck_assert_uint_eq(offset_tracker_dirty(t, parts, 8), 2);
    offset_tracker_mark_committed(t, 0, 5);
    offset_tracker_mark_committed(t, 1, 8);
    ck_assert_uint_eq(offset_tracker_dirty(t, parts, 8), 0);
    offset_tracker_done(t, 0, 5);
    ck_assert_uint_eq(offset_tracker_dirty(t, parts, 8), 1);
    ck_assert_int_eq(parts[0], 0);
    offset_tracker_forget(t, 0);
    ck_assert_int_eq(offset_tracker_committable(t, 0), -1);
    offset_tracker_free(t);
}
END_TEST

START_TEST(many_offsets_in_random_order)
{
    enum { N = 5000 };
    offset_tracker_t *t = offset_tracker_new();
    int *order = malloc(N * sizeof(int));
    for (int i = 0; i < N; i++) {
        offset_tracker_begin(t, 2, 1000 + i);
        order[i] = i;
    }
    srand(7);
    for (int i = N - 1; i > 0; i--) {
        int j = rand() % (i + 1), x = order[i];
        order[i] = order[j];
        order[j] = x;
    }
    int lowest_open = 0;
    char *done = calloc(N, 1);
    for (int k = 0; k < N; k++) {
        offset_tracker_done(t, 2, 1000 + order[k]);
        done[order[k]] = 1;
        while (lowest_open < N && done[lowest_open])
            lowest_open++;
        ck_assert_int_eq(offset_tracker_committable(t, 2), 1000 + lowest_open);
    }
    free(done);
    free(order);
    offset_tracker_free(t);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("offset_tracker");
    TCase *tc = tcase_create("offset_tracker");
    tcase_add_test(tc, nothing_seen_nothing_to_commit);
    tcase_add_test(tc, out_of_order_completion_holds_the_lowest);
    tcase_add_test(tc, partitions_are_independent_and_dirty_tracks_moves);
    tcase_add_test(tc, many_offsets_in_random_order);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
