/* CHARGED_ASSERT stops the process, in every build, and only when its
 * condition is false. The false case runs in a child of its own: under
 * valgrind the suite runs without Check's fork. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

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
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        const char *status = "SUCCEEDED";
        CHARGED_ASSERT(strcmp(status, "FAILED") == 0);
        _exit(0); /* still running after a false assertion */
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert_msg(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT,
                  "the child was not stopped by SIGABRT (status %d)", st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("charged_assert");
    TCase *tc = tcase_create("assert");
    tcase_add_test(tc, a_true_condition_goes_on);
    tcase_add_test(tc, a_false_condition_aborts);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
