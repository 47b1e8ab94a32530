/* CHARGED_ASSERT stops the process, in every build, and only when its
 * condition is false. */
#include <check.h>
#include <signal.h>
#include <string.h>

#include "charged_assert.h"

START_TEST(a_true_condition_goes_on)
{
    int calls = 0;
    CHARGED_ASSERT(++calls == 1); /* evaluated once */
    ck_assert_int_eq(calls, 1);
}
END_TEST

START_TEST(a_false_condition_aborts)
{
    const char *status = "SUCCEEDED";
    CHARGED_ASSERT(strcmp(status, "FAILED") == 0);
    ck_abort_msg("still running after a false assertion");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("charged_assert");
    TCase *tc = tcase_create("assert");
    tcase_add_test(tc, a_true_condition_goes_on);
    tcase_add_test_raise_signal(tc, a_false_condition_aborts, SIGABRT);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
