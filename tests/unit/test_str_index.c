/* str_index: every key found with its values, most recent first; absent
 * keys not; the capacity holds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "str_index.h"
#include "test_env.h"

START_TEST(each_key_finds_its_values_most_recent_first)
{
    str_index_t *ix = str_index_new(4);
    ck_assert_ptr_nonnull(ix);
    ck_assert_int_eq(str_index_add(ix, "a", 0), 0);
    ck_assert_int_eq(str_index_add(ix, "b", 1), 0);
    ck_assert_int_eq(str_index_add(ix, "a", 2), 0);
    int e = str_index_find(ix, "a");
    ck_assert_int_ge(e, 0);
    ck_assert_int_eq(str_index_value(ix, e), 2);
    e = str_index_next(ix, e);
    ck_assert_int_ge(e, 0);
    ck_assert_int_eq(str_index_value(ix, e), 0);
    ck_assert_int_eq(str_index_next(ix, e), -1);
    ck_assert_int_eq(str_index_value(ix, str_index_find(ix, "b")), 1);
    ck_assert_int_eq(str_index_next(ix, str_index_find(ix, "b")), -1);
    ck_assert_int_eq(str_index_find(ix, "c"), -1);
    ck_assert_int_eq(str_index_find(ix, ""), -1);
    str_index_free(ix);
}
END_TEST

START_TEST(the_capacity_holds)
{
    str_index_t *ix = str_index_new(2);
    ck_assert_int_eq(str_index_add(ix, "a", 0), 0);
    ck_assert_int_eq(str_index_add(ix, "b", 1), 0);
    ck_assert_int_eq(str_index_add(ix, "c", 2), -1);
    ck_assert_int_eq(str_index_find(ix, "c"), -1);
    str_index_free(ix);
    ix = str_index_new(0);
    ck_assert_ptr_nonnull(ix);
    ck_assert_int_eq(str_index_add(ix, "a", 0), -1);
    ck_assert_int_eq(str_index_find(ix, "a"), -1);
    str_index_free(ix);
    str_index_free(NULL);
}
END_TEST

/* Many ids, as a batch's: each found once with its own value, and none
 * of another batch. */
START_TEST(a_batch_of_ids_each_found_once)
{
    enum { N = 4000 };
    static char keys[N][40], other[40];
    str_index_t *ix = str_index_new(N);
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "5d1c2c1e-1a9b-4b1e-8e55-%012d", i);
        ck_assert_int_eq(str_index_add(ix, keys[i], i), 0);
    }
    for (int i = 0; i < N; i++) {
        int e = str_index_find(ix, keys[i]);
        ck_assert_int_ge(e, 0);
        ck_assert_int_eq(str_index_value(ix, e), i);
        ck_assert_int_eq(str_index_next(ix, e), -1);
    }
    for (int i = N; i < N + 1000; i++) {
        snprintf(other, sizeof(other), "5d1c2c1e-1a9b-4b1e-8e55-%012d", i);
        ck_assert_int_eq(str_index_find(ix, other), -1);
    }
    str_index_free(ix);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("str_index");
    TCase *tc = tcase_create("str_index");
    tcase_add_test(tc, each_key_finds_its_values_most_recent_first);
    tcase_add_test(tc, the_capacity_holds);
    tcase_add_test(tc, a_batch_of_ids_each_found_once);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
