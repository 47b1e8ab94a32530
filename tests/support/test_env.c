#include "test_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <check.h>

const char *test_env_database_url(void)
{
    const char *url = getenv("CHARGED_TEST_DATABASE_URL");
    ck_assert_msg(url && *url,
                  "CHARGED_TEST_DATABASE_URL is not set: run the tests "
                  "through tools/run-all-tests.sh, which starts the stack");
    return url;
}

const char *test_env_kafka(void)
{
    const char *k = getenv("CHARGED_TEST_KAFKA");
    ck_assert_msg(k && *k, "CHARGED_TEST_KAFKA is not set: run the tests through "
                           "tools/run-all-tests.sh, which starts the stack");
    return k;
}

long long test_env_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int test_env_run_suite(Suite *suite)
{
    SRunner *sr = srunner_create(suite);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
