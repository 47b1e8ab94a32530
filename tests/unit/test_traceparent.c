/* Unit tests of common/core/traceparent: the W3C example and its near misses.
 * A near miss must leave nothing behind: out is "" whatever came in. */
#include <check.h>
#include <string.h>

#include "test_env.h"
#include "traceparent.h"

#define GOOD "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static int parse(const char *s, char *out)
{
    strcpy(out, "leftover");
    return traceparent_parse(s, s ? strlen(s) : 0, out);
}

START_TEST(the_w3c_example_is_read)
{
    char out[TRACEPARENT_LEN + 1];
    ck_assert_int_eq(parse(GOOD, out), 1);
    ck_assert_str_eq(out, GOOD);
    /* Flags are any two hex digits (unsampled, unknown bits). */
    ck_assert_int_eq(
        parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", out), 1);
    ck_assert_int_eq(
        parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", out), 1);
    /* Not NUL-terminated: only len bytes are read. */
    char buf[80];
    memcpy(buf, GOOD "xyz", sizeof(GOOD) + 3);
    ck_assert_int_eq(traceparent_parse(buf, TRACEPARENT_LEN, out), 1);
    ck_assert_str_eq(out, GOOD);
}
END_TEST

static const char *const bad[] = {
    "",
    "00",
    /* a byte short, a byte long */
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",
    GOOD " ",
    " " GOOD,
    /* all-zero ids */
    "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
    /* upper case, other versions, wrong separators, not hex */
    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "0a-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
    "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
    "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
    /* what would break a log line, were it copied */
    "00-4bf92f3577b34da6a3ce929d0e0e473\"-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\n",
};

START_TEST(near_misses_are_ignored_whole)
{
    char out[TRACEPARENT_LEN + 1];
    ck_assert_msg(parse(bad[_i], out) == 0, "accepted '%s'", bad[_i]);
    ck_assert_str_eq(out, "");
}
END_TEST

START_TEST(nul_bytes_and_null_are_ignored)
{
    char out[TRACEPARENT_LEN + 1], buf[TRACEPARENT_LEN];
    memcpy(buf, GOOD, TRACEPARENT_LEN);
    buf[20] = '\0';
    ck_assert_int_eq(traceparent_parse(buf, sizeof(buf), out), 0);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(traceparent_parse(NULL, TRACEPARENT_LEN, out), 0);
    ck_assert_int_eq(traceparent_parse(NULL, 0, out), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("traceparent");
    TCase *tc = tcase_create("traceparent");
    tcase_add_test(tc, the_w3c_example_is_read);
    tcase_add_loop_test(tc, near_misses_are_ignored_whole, 0,
                        sizeof(bad) / sizeof(bad[0]));
    tcase_add_test(tc, nul_bytes_and_null_are_ignored);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
