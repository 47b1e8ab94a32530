/* Unit tests of common/core/money: the cases shared with the console's
 * page (money_cases.txt), ISO 4217's exponents, the edges of the range and
 * a buffer too small. */
#include <check.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "money.h"
#include "test_env.h"

START_TEST(shared_cases_are_written_as_money)
{
    FILE *f = fopen(MONEY_CASES, "r");
    char line[256], cur[8], want[128], got[128];
    long long minor;
    int cases = 0;
    ck_assert_ptr_nonnull(f);
    while (fgets(line, sizeof(line), f)) {
        int used = 0;
        if (line[0] == '#' || line[0] == '\n')
            continue;
        ck_assert_int_eq(sscanf(line, "%lld %7s %n", &minor, cur, &used), 2);
        snprintf(want, sizeof(want), "%s", line + used);
        want[strcspn(want, "\n")] = '\0';
        ck_assert_int_eq(money_format(got, sizeof(got), minor, cur), (int)strlen(want));
        ck_assert_str_eq(got, want);
        cases++;
    }
    fclose(f);
    ck_assert_int_ge(cases, 10);
}
END_TEST

START_TEST(exponents_follow_iso_4217)
{
    ck_assert_int_eq(money_exponent("EUR"), 2);
    ck_assert_int_eq(money_exponent("JPY"), 0);
    ck_assert_int_eq(money_exponent("KWD"), 3);
    ck_assert_int_eq(money_exponent("UYW"), 4);
    /* Only whole codes: "PY" is in "JPY PYG" but no currency. */
    ck_assert_int_eq(money_exponent("PY"), 2);
    ck_assert_int_eq(money_exponent("YG "), 2);
    ck_assert_int_eq(money_exponent(NULL), 2);
}
END_TEST

START_TEST(edges_of_the_range_and_small_buffers)
{
    char out[64];
    ck_assert_int_gt(money_format(out, sizeof(out), LLONG_MIN, "EUR"), 0);
    ck_assert_str_eq(out, "-92233720368547758.08 EUR");
    ck_assert_int_gt(money_format(out, sizeof(out), LLONG_MAX, "JPY"), 0);
    ck_assert_str_eq(out, "9223372036854775807 JPY");
    ck_assert_int_eq(money_format(out, sizeof(out), 1500, NULL), 5);
    ck_assert_str_eq(out, "15.00");
    ck_assert_int_eq(money_format(out, 9, 1500, "EUR"), -1);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(money_format(out, 10, 1500, "EUR"), 9);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("money");
    TCase *tc = tcase_create("money");
    tcase_add_test(tc, shared_cases_are_written_as_money);
    tcase_add_test(tc, exponents_follow_iso_4217);
    tcase_add_test(tc, edges_of_the_range_and_small_buffers);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
