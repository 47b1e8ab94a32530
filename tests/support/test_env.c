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

long long test_env_deadline(long long ms)
{
    const char *s = getenv("CHARGED_TEST_TIMEOUT_SCALE");
    double scale = s && atof(s) > 0 ? atof(s) : 1;
    return test_env_now_ms() + (long long)(ms * scale);
}

void test_env_uuid(char out[37])
{
    unsigned char b[16];
    FILE *f = fopen("/dev/urandom", "rb");
    ck_assert(f && fread(b, 1, sizeof(b), f) == sizeof(b));
    fclose(f);
    b[6] = (unsigned char)((b[6] & 0x0f) | 0x40);
    b[8] = (unsigned char)((b[8] & 0x3f) | 0x80);
    snprintf(out, 37,
             "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11],
             b[12], b[13], b[14], b[15]);
}
