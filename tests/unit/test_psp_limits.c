/* Unit tests of psp-sim's rate limiter (tools/psp-sim/psp_limits): the
 * bucket arithmetic on a clock the test turns, global and class buckets
 * taken together or not at all, keys apart, a change of limits at once,
 * Retry-After, the configuration's JSON and flags refused whole. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "psp_limits.h"
#include "test_env.h"

static struct psp_limits_config cfg_of(long global, long create, long create_burst)
{
    struct psp_limits_config c = {0};
    c.global.rate = global;
    c.classes[PSP_LC_CREATE] = (struct psp_limit){create, create_burst};
    return c;
}

/* How many of n requests of key in class c pass at now_ms. */
static int passed(psp_limits_t *l, size_t key, enum psp_limit_class c, int n,
                  int64_t now_ms)
{
    int ok = 0;
    long retry;
    for (int i = 0; i < n; i++)
        ok += psp_limits_take(l, key, c, now_ms, &retry);
    return ok;
}

static json_int_t throttled(psp_limits_t *l, const char *cls)
{
    json_t *t = psp_limits_throttled_json(l);
    json_int_t n = json_integer_value(json_object_get(t, cls));
    json_decref(t);
    return n;
}

START_TEST(unlimited_by_default)
{
    psp_limits_t *l = psp_limits_new(1);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 10000, 1000), 10000);
    ck_assert_int_eq(throttled(l, "create"), 0);
    psp_limits_free(l);
}
END_TEST

START_TEST(burst_is_the_rate_then_refills_at_the_rate)
{
    psp_limits_t *l = psp_limits_new(1);
    struct psp_limits_config c = cfg_of(0, 10, 0);
    psp_limits_set(l, &c, 5000);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 15, 5000), 10);
    ck_assert_int_eq(throttled(l, "create"), 5);
    /* 10/s: one token each 100 ms, none before. */
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 1, 5099), 0);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 2, 5100), 1);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 5, 5350), 2);
    /* A long pause fills it to the burst, no more. */
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 50, 3600000), 10);
    /* Other classes are not limited. */
    ck_assert_int_eq(passed(l, 0, PSP_LC_RETRIEVE, 100, 3600000), 100);
    psp_limits_free(l);
}
END_TEST

START_TEST(burst_set_apart_from_the_rate)
{
    psp_limits_t *l = psp_limits_new(1);
    struct psp_limits_config c = cfg_of(0, 4, 1);
    psp_limits_set(l, &c, 0);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 3, 0), 1);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 3, 250), 1);
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 3, 10000), 1);
    psp_limits_free(l);
}
END_TEST

START_TEST(global_and_class_together_or_not_at_all)
{
    psp_limits_t *l = psp_limits_new(2);
    struct psp_limits_config c = cfg_of(5, 3, 0);
    psp_limits_set(l, &c, 0);
    /* The class refuses the 4th create: the global keeps its token. */
    ck_assert_int_eq(passed(l, 0, PSP_LC_CREATE, 4, 0), 3);
    ck_assert_int_eq(passed(l, 0, PSP_LC_LIST, 4, 0), 2);
    ck_assert_int_eq(throttled(l, "create"), 1);
    ck_assert_int_eq(throttled(l, "list"), 2);
    /* Key 1 has buckets of its own. */
    ck_assert_int_eq(passed(l, 1, PSP_LC_CREATE, 4, 0), 3);
    psp_limits_free(l);
}
END_TEST

START_TEST(a_change_takes_effect_at_once)
{
    psp_limits_t *l = psp_limits_new(1);
    struct psp_limits_config c = cfg_of(100, 0, 0);
    psp_limits_set(l, &c, 0);
    ck_assert_int_eq(passed(l, 0, PSP_LC_SEARCH, 50, 0), 50);
    /* Down to 10: the bucket keeps at most the new burst. */
    c = cfg_of(10, 0, 0);
    psp_limits_set(l, &c, 0);
    ck_assert_int_eq(passed(l, 0, PSP_LC_SEARCH, 50, 0), 10);
    ck_assert_int_eq(passed(l, 0, PSP_LC_SEARCH, 50, 1000), 10);
    /* Back up: it refills at the new rate from what it has. */
    c = cfg_of(100, 0, 0);
    psp_limits_set(l, &c, 1000);
    ck_assert_int_eq(passed(l, 0, PSP_LC_SEARCH, 50, 1100), 10);
    /* Unlimited again, then limited: it starts full. */
    c = cfg_of(0, 0, 0);
    psp_limits_set(l, &c, 1100);
    ck_assert_int_eq(passed(l, 0, PSP_LC_SEARCH, 500, 1100), 500);
    c = cfg_of(7, 0, 0);
    psp_limits_set(l, &c, 1100);
    ck_assert_int_eq(passed(l, 0, PSP_LC_SEARCH, 50, 1100), 7);
    psp_limits_free(l);
}
END_TEST

START_TEST(retry_after_in_whole_seconds_when_on)
{
    psp_limits_t *l = psp_limits_new(1);
    struct psp_limits_config c = cfg_of(0, 1, 0);
    long retry = -1;
    psp_limits_set(l, &c, 0);
    ck_assert_int_eq(psp_limits_take(l, 0, PSP_LC_CREATE, 0, &retry), 1);
    ck_assert_int_eq(psp_limits_take(l, 0, PSP_LC_CREATE, 0, &retry), 0);
    ck_assert_int_eq(retry, 0); /* off by default */
    psp_limits_free(l);
    l = psp_limits_new(1);
    c = cfg_of(1, 2, 0);
    c.retry_after = 1;
    psp_limits_set(l, &c, 0);
    ck_assert_int_eq(psp_limits_take(l, 0, PSP_LC_CREATE, 0, &retry), 1);
    ck_assert_int_eq(psp_limits_take(l, 0, PSP_LC_CREATE, 0, &retry), 0);
    ck_assert_int_eq(retry, 1); /* the global's second, rounded up */
    ck_assert_int_eq(psp_limits_take(l, 0, PSP_LC_CREATE, 999, &retry), 0);
    ck_assert_int_eq(retry, 1);
    ck_assert_int_eq(psp_limits_take(l, 0, PSP_LC_CREATE, 1000, &retry), 1);
    psp_limits_free(l);
}
END_TEST

START_TEST(series_counts_each_second)
{
    psp_limits_t *l = psp_limits_new(1);
    struct psp_limits_config c = cfg_of(2, 0, 0);
    psp_limits_set(l, &c, 0);
    passed(l, 0, PSP_LC_LIST, 5, 700000);
    passed(l, 0, PSP_LC_LIST, 1, 702500);
    json_t *j = psp_limits_json(l, 702900, 1800000702900LL);
    json_t *s = json_object_get(j, "per_second");
    ck_assert_int_eq(json_array_size(s), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(s, 0), "at")),
                     1800000700);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_array_get(s, 0), "served")), 2);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_array_get(s, 0), "throttled")), 3);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_array_get(s, 1), "served")), 1);
    json_decref(j);
    /* Ten minutes on, it is gone; a reset clears counts and fills buckets. */
    j = psp_limits_json(l, 1400000, 0);
    ck_assert_int_eq(json_array_size(json_object_get(j, "per_second")), 0);
    json_decref(j);
    psp_limits_reset(l, 1400000);
    ck_assert_int_eq(throttled(l, "list"), 0);
    ck_assert_int_eq(passed(l, 0, PSP_LC_LIST, 3, 1400000), 2);
    psp_limits_free(l);
}
END_TEST

START_TEST(configuration_from_json)
{
    struct psp_limits_config c;
    char err[256];
    json_t *j = json_loads("{\"global\": 100, \"classes\": {\"create\": 25, \"search\":"
                           " {\"rate\": 20, \"burst\": 5}}, \"retry_after\": true}",
                           0, NULL);
    ck_assert_int_eq(psp_limits_config_from_json(j, &c, err, sizeof(err)), 0);
    ck_assert_int_eq(c.global.rate, 100);
    ck_assert_int_eq(c.classes[PSP_LC_CREATE].rate, 25);
    ck_assert_int_eq(c.classes[PSP_LC_SEARCH].burst, 5);
    ck_assert_int_eq(c.classes[PSP_LC_LIST].rate, 0);
    ck_assert_int_eq(c.retry_after, 1);
    json_decref(j);
}
END_TEST

static const char *bad_json[] = {
    "[]",
    "{\"global\": -1}",
    "{\"global\": 1000001}",
    "{\"global\": 1.5}",
    "{\"global\": \"10\"}",
    "{\"global\": {\"rate\": 10, \"brust\": 2}}",
    "{\"global\": {\"burst\": 2}}",
    "{\"classes\": {\"charge\": 10}}",
    "{\"classes\": [10]}",
    "{\"classes\": {\"create\": 10, \"list\": -3}}",
    "{\"retry_after\": 1}",
    "{\"global\": 10, \"rate\": 3}",
};

START_TEST(bad_json_is_refused_whole)
{
    struct psp_limits_config c = cfg_of(42, 42, 0);
    char err[256] = "";
    json_t *j = json_loads(bad_json[_i], 0, NULL);
    ck_assert_ptr_nonnull(j);
    ck_assert_int_eq(psp_limits_config_from_json(j, &c, err, sizeof(err)), -1);
    ck_assert_msg(err[0], "no reason for %s", bad_json[_i]);
    /* out untouched */
    ck_assert_int_eq(c.global.rate, 42);
    ck_assert_int_eq(c.classes[PSP_LC_CREATE].rate, 42);
    ck_assert_int_eq(c.classes[PSP_LC_LIST].rate, 0);
    json_decref(j);
}
END_TEST

START_TEST(flag_specs)
{
    struct psp_limit lim = {0};
    char err[200];
    ck_assert_int_eq(psp_limits_parse_spec("25", &lim, err, sizeof(err)), 0);
    ck_assert_int_eq(lim.rate, 25);
    ck_assert_int_eq(lim.burst, 0);
    ck_assert_int_eq(psp_limits_parse_spec("100:10", &lim, err, sizeof(err)), 0);
    ck_assert_int_eq(lim.rate, 100);
    ck_assert_int_eq(lim.burst, 10);
    const char *bad[] = {"", "x", "-1", "10:", ":5", "10:x", "0:5", "1000001", " 5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(psp_limits_parse_spec(bad[i], &lim, err, sizeof(err)) == -1,
                      "'%s' taken", bad[i]);
    ck_assert_int_eq(psp_limits_class_parse("capture"), PSP_LC_CAPTURE);
    ck_assert_int_eq(psp_limits_class_parse("global"), -1);
}
END_TEST

START_TEST(stripes_body)
{
    json_t *j = psp_limits_error_json();
    json_t *e = json_object_get(j, "error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "type")),
                     "invalid_request_error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "rate_limit");
    json_decref(j);
}
END_TEST

static Suite *limits_suite(void)
{
    Suite *s = suite_create("psp_limits");
    TCase *tc = tcase_create("psp_limits");
    tcase_add_test(tc, unlimited_by_default);
    tcase_add_test(tc, burst_is_the_rate_then_refills_at_the_rate);
    tcase_add_test(tc, burst_set_apart_from_the_rate);
    tcase_add_test(tc, global_and_class_together_or_not_at_all);
    tcase_add_test(tc, a_change_takes_effect_at_once);
    tcase_add_test(tc, retry_after_in_whole_seconds_when_on);
    tcase_add_test(tc, series_counts_each_second);
    tcase_add_test(tc, configuration_from_json);
    tcase_add_loop_test(tc, bad_json_is_refused_whole, 0,
                        sizeof(bad_json) / sizeof(bad_json[0]));
    tcase_add_test(tc, flag_specs);
    tcase_add_test(tc, stripes_body);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(limits_suite());
}
