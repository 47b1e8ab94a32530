/* Unit tests of common/provider_breaker: the state machine, driven with a
 * clock of our own. Expected states are written out step by step. */
#include <check.h>
#include <stdint.h>

#include "provider_breaker.h"
#include "test_env.h"

#define S PROVIDER_BREAKER_SUCCESS
#define F PROVIDER_BREAKER_FAILURE

static const struct provider_breaker_config cfg = {
    .failures = 3, .open_ms = 1000, .probes = 2};

/* One call, start to end, at time t. */
static void call(provider_breaker_t *b, int64_t t, enum provider_breaker_answer a)
{
    struct provider_breaker_ticket k;
    ck_assert_int_eq(provider_breaker_allow(b, t, &k), 1);
    provider_breaker_record(b, &k, a, t);
}

/* Opens b at time t with cfg.failures failures in a row. */
static void open_at(provider_breaker_t *b, int64_t t)
{
    for (int i = 0; i < cfg.failures; i++)
        call(b, t, F);
    ck_assert_int_eq(provider_breaker_state(b, t), PROVIDER_BREAKER_OPEN);
}

START_TEST(failures_in_a_row_open_it)
{
    provider_breaker_t *b = provider_breaker_new(&cfg);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_CLOSED);
    call(b, 0, F);
    call(b, 0, F);
    ck_assert_int_eq(provider_breaker_streak(b), 2);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_CLOSED);
    /* A success in between starts the count again. */
    call(b, 0, S);
    ck_assert_int_eq(provider_breaker_streak(b), 0);
    call(b, 0, F);
    call(b, 0, F);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_CLOSED);
    ck_assert_uint_eq(provider_breaker_opens(b), 0);
    call(b, 5, F);
    ck_assert_int_eq(provider_breaker_state(b, 5), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 1);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    provider_breaker_free(b);
}
END_TEST

START_TEST(zero_failures_never_opens)
{
    const struct provider_breaker_config off = {
        .failures = 0, .open_ms = 10, .probes = 1};
    provider_breaker_t *b = provider_breaker_new(&off);
    for (int i = 0; i < 1000; i++)
        call(b, i, F);
    ck_assert_int_eq(provider_breaker_state(b, 1000), PROVIDER_BREAKER_CLOSED);
    ck_assert_uint_eq(provider_breaker_opens(b), 0);
    provider_breaker_free(b);
}
END_TEST

START_TEST(open_refuses_calls_until_the_cool_down_ends)
{
    struct provider_breaker_ticket k;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    open_at(b, 100);
    ck_assert_int_eq(provider_breaker_allow(b, 100, &k), 0);
    ck_assert_int_eq(provider_breaker_allow(b, 1099, &k), 0);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 500), 1100);
    ck_assert_int_eq(provider_breaker_state(b, 1099), PROVIDER_BREAKER_OPEN);
    /* Refused calls took no ticket. */
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    ck_assert_int_eq(provider_breaker_state(b, 1100), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 1100), 1100);
    provider_breaker_free(b);
}
END_TEST

START_TEST(half_open_allows_one_probe_at_a_time)
{
    struct provider_breaker_ticket p, q;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    open_at(b, 0);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &p), 1);
    ck_assert_int_eq(p.probe, 1);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &q), 0);
    ck_assert_int_eq(provider_breaker_allow(b, 5000, &q), 0);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 5000), INT64_MAX);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 1);
    /* The first success allows the next probe, but does not close it yet. */
    provider_breaker_record(b, &p, S, 5000);
    ck_assert_int_eq(provider_breaker_state(b, 5000), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_streak(b), 1);
    ck_assert_int_eq(provider_breaker_allow(b, 5000, &q), 1);
    ck_assert_int_eq(q.probe, 1);
    provider_breaker_record(b, &q, S, 5001);
    ck_assert_int_eq(provider_breaker_state(b, 5001), PROVIDER_BREAKER_CLOSED);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    /* Closed: calls are no probes, and go together. */
    ck_assert_int_eq(provider_breaker_allow(b, 5001, &p), 1);
    ck_assert_int_eq(provider_breaker_allow(b, 5001, &q), 1);
    ck_assert_int_eq(p.probe, 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 2);
    provider_breaker_cancel(b, &p);
    provider_breaker_cancel(b, &q);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    provider_breaker_free(b);
}
END_TEST

START_TEST(a_failed_probe_opens_it_again_for_a_full_cool_down)
{
    struct provider_breaker_ticket p;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    open_at(b, 0);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &p), 1);
    provider_breaker_record(b, &p, S, 1200);
    ck_assert_int_eq(provider_breaker_allow(b, 1200, &p), 1);
    /* One success before does not save it: a probe failure reopens. */
    provider_breaker_record(b, &p, F, 1500);
    ck_assert_int_eq(provider_breaker_state(b, 1500), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 2);
    ck_assert_int_eq(provider_breaker_allow(b, 2499, &p), 0);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 2000), 2500);
    ck_assert_int_eq(provider_breaker_state(b, 2500), PROVIDER_BREAKER_HALF_OPEN);
    /* Probe successes start from zero after a reopening. */
    ck_assert_int_eq(provider_breaker_allow(b, 2500, &p), 1);
    provider_breaker_record(b, &p, S, 2600);
    ck_assert_int_eq(provider_breaker_state(b, 2600), PROVIDER_BREAKER_HALF_OPEN);
    provider_breaker_free(b);
}
END_TEST

START_TEST(calls_in_flight_when_it_opens_still_end_and_change_nothing)
{
    struct provider_breaker_ticket early[10], p;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(provider_breaker_allow(b, 0, &early[i]), 1);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 10);
    /* The provider goes away: the first three answers open it... */
    for (int i = 0; i < 3; i++)
        provider_breaker_record(b, &early[i], F, 10);
    ck_assert_int_eq(provider_breaker_state(b, 10), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 7);
    /* ...the rest still end; a late success does not close it. */
    provider_breaker_record(b, &early[3], S, 20);
    provider_breaker_record(b, &early[4], F, 20);
    ck_assert_int_eq(provider_breaker_state(b, 20), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 1);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 5);
    /* Half-open with a probe out: late answers neither close nor reopen it,
     * and do not free the probe's place. */
    ck_assert_int_eq(provider_breaker_allow(b, 1010, &p), 1);
    provider_breaker_record(b, &early[5], F, 1020);
    provider_breaker_record(b, &early[6], S, 1020);
    provider_breaker_record(b, &early[7], S, 1020);
    ck_assert_int_eq(provider_breaker_state(b, 1020), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_streak(b), 0);
    ck_assert_int_eq(provider_breaker_allow(b, 1020, &early[0]), 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 3);
    provider_breaker_record(b, &p, S, 1030);
    ck_assert_int_eq(provider_breaker_allow(b, 1030, &p), 1);
    provider_breaker_record(b, &p, S, 1040);
    ck_assert_int_eq(provider_breaker_state(b, 1040), PROVIDER_BREAKER_CLOSED);
    /* Closed again: old failures do not count towards opening it. */
    provider_breaker_record(b, &early[8], F, 1050);
    provider_breaker_record(b, &early[9], F, 1050);
    ck_assert_int_eq(provider_breaker_streak(b), 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    call(b, 1060, F);
    call(b, 1060, F);
    ck_assert_int_eq(provider_breaker_state(b, 1060), PROVIDER_BREAKER_CLOSED);
    provider_breaker_free(b);
}
END_TEST

START_TEST(a_cancelled_probe_frees_its_place_and_counts_neither_way)
{
    struct provider_breaker_ticket p;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    open_at(b, 0);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &p), 1);
    provider_breaker_cancel(b, &p);
    ck_assert_int_eq(provider_breaker_state(b, 1000), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_streak(b), 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &p), 1);
    ck_assert_int_eq(p.probe, 1);
    provider_breaker_cancel(b, &p);
    provider_breaker_free(b);
}
END_TEST

START_TEST(what_counts_as_a_failure)
{
    /* No answer (refused, lost, timed out), refusals and 5xx. */
    ck_assert_int_eq(provider_breaker_classify(0), F);
    ck_assert_int_eq(provider_breaker_classify(429), F);
    ck_assert_int_eq(provider_breaker_classify(500), F);
    ck_assert_int_eq(provider_breaker_classify(503), F);
    /* Anything else is a provider that works, declines and 409 included. */
    ck_assert_int_eq(provider_breaker_classify(200), S);
    ck_assert_int_eq(provider_breaker_classify(400), S);
    ck_assert_int_eq(provider_breaker_classify(402), S);
    ck_assert_int_eq(provider_breaker_classify(404), S);
    ck_assert_int_eq(provider_breaker_classify(409), S);
    ck_assert_str_eq(provider_breaker_state_name(PROVIDER_BREAKER_HALF_OPEN),
                     "half_open");
    provider_breaker_free(NULL);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("provider_breaker");
    TCase *tc = tcase_create("provider_breaker");
    tcase_add_test(tc, failures_in_a_row_open_it);
    tcase_add_test(tc, zero_failures_never_opens);
    tcase_add_test(tc, open_refuses_calls_until_the_cool_down_ends);
    tcase_add_test(tc, half_open_allows_one_probe_at_a_time);
    tcase_add_test(tc, a_failed_probe_opens_it_again_for_a_full_cool_down);
    tcase_add_test(tc, calls_in_flight_when_it_opens_still_end_and_change_nothing);
    tcase_add_test(tc, a_cancelled_probe_frees_its_place_and_counts_neither_way);
    tcase_add_test(tc, what_counts_as_a_failure);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
