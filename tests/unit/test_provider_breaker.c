/* Unit tests of common/core/provider_breaker: the state machine, driven with a
 * clock of our own. Expected states are written out step by step. */
#include <check.h>
#include <stdint.h>

#include "provider_breaker.h"
#include "test_env.h"

#define S PROVIDER_BREAKER_SUCCESS
#define F PROVIDER_BREAKER_FAILURE
#define T PROVIDER_BREAKER_THROTTLED

/* Half the calls of the last second, once four calls are in it. */
static const struct provider_breaker_config cfg = {.failure_rate = 50,
                                                   .min_calls = 4,
                                                   .window_ms = 1000,
                                                   .open_ms = 1000,
                                                   .probes = 2};

/* One call, start to end, at time t. */
static void call(provider_breaker_t *b, int64_t t, enum provider_breaker_answer a)
{
    struct provider_breaker_ticket k;
    ck_assert_int_eq(provider_breaker_allow(b, t, &k), 1);
    provider_breaker_record(b, &k, a, t);
}

/* Opens b at time t with cfg.min_calls failures. */
static void open_at(provider_breaker_t *b, int64_t t)
{
    for (int i = 0; i < cfg.min_calls; i++)
        call(b, t, F);
    ck_assert_int_eq(provider_breaker_state(b, t), PROVIDER_BREAKER_OPEN);
}

static void window_is(provider_breaker_t *b, int64_t t, int calls, int failures)
{
    int c, f;
    provider_breaker_window(b, t, &c, &f);
    ck_assert_int_eq(c, calls);
    ck_assert_int_eq(f, failures);
}

START_TEST(the_rate_opens_it_once_enough_calls_are_in)
{
    provider_breaker_t *b = provider_breaker_new(&cfg);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_CLOSED);
    /* Three failures of three: 100%, but too few calls to judge. */
    call(b, 0, F);
    call(b, 0, F);
    call(b, 0, F);
    window_is(b, 0, 3, 3);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_CLOSED);
    ck_assert_uint_eq(provider_breaker_opens(b), 0);
    /* A success is the fourth call: 75% failing, judged only on a failure. */
    call(b, 5, S);
    ck_assert_int_eq(provider_breaker_state(b, 5), PROVIDER_BREAKER_CLOSED);
    call(b, 5, F);
    ck_assert_int_eq(provider_breaker_state(b, 5), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 1);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    provider_breaker_free(b);
}
END_TEST

START_TEST(exactly_the_rate_opens_it_and_just_under_does_not)
{
    provider_breaker_t *b = provider_breaker_new(&cfg);
    /* 1 of 3, then 2 of 5 (40%): under 50%, closed. */
    call(b, 0, S);
    call(b, 0, S);
    call(b, 0, F);
    call(b, 0, S);
    call(b, 0, F);
    window_is(b, 0, 5, 2);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_CLOSED);
    /* 3 of 6 is 50%: open. */
    call(b, 0, F);
    ck_assert_int_eq(provider_breaker_state(b, 0), PROVIDER_BREAKER_OPEN);
    provider_breaker_free(b);
}
END_TEST

/* The attack that broke the streak breaker: one call in five fails, spread
 * over many calls in flight at once. It must never open. */
START_TEST(one_failure_in_five_never_opens_it)
{
    const struct provider_breaker_config dflt = {.failure_rate = 50,
                                                 .min_calls = 50,
                                                 .window_ms = 30000,
                                                 .open_ms = 5000,
                                                 .probes = 3};
    provider_breaker_t *b = provider_breaker_new(&dflt);
    struct provider_breaker_ticket k[200];
    for (int round = 0; round < 50; round++) {
        int64_t t = round * 100;
        for (int i = 0; i < 200; i++)
            ck_assert_int_eq(provider_breaker_allow(b, t, &k[i]), 1);
        /* Answers come back in any order; failures in runs of up to 8. */
        for (int i = 0; i < 200; i++)
            provider_breaker_record(b, &k[i], (i % 40) < 8 ? F : S, t + 50);
    }
    ck_assert_int_eq(provider_breaker_state(b, 6000), PROVIDER_BREAKER_CLOSED);
    ck_assert_uint_eq(provider_breaker_opens(b), 0);
    provider_breaker_free(b);
}
END_TEST

START_TEST(old_calls_age_out_of_the_window)
{
    provider_breaker_t *b = provider_breaker_new(&cfg);
    call(b, 0, F);
    call(b, 50, F);
    call(b, 150, F);
    window_is(b, 150, 3, 3);
    /* A second later the first two (bucket 0) are gone. */
    window_is(b, 1050, 1, 1);
    call(b, 1050, F);
    call(b, 1060, F);
    window_is(b, 1060, 3, 3);
    ck_assert_int_eq(provider_breaker_state(b, 1060), PROVIDER_BREAKER_CLOSED);
    /* The failure at 150 is still in: four in the window, open. */
    call(b, 1070, F);
    ck_assert_int_eq(provider_breaker_state(b, 1070), PROVIDER_BREAKER_OPEN);
    /* Long quiet: nothing is left in the window. */
    provider_breaker_t *q = provider_breaker_new(&cfg);
    for (int i = 0; i < 3; i++)
        call(q, 10, F);
    window_is(q, 100000, 0, 0);
    call(q, 100000, F);
    ck_assert_int_eq(provider_breaker_state(q, 100000), PROVIDER_BREAKER_CLOSED);
    provider_breaker_free(q);
    provider_breaker_free(b);
}
END_TEST

START_TEST(zero_rate_never_opens)
{
    const struct provider_breaker_config off = {.failure_rate = 0,
                                                .min_calls = 2,
                                                .window_ms = 1000,
                                                .open_ms = 10,
                                                .probes = 1};
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
    /* Half-open: no call, one probe. */
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &q), 0);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1000, &p), 1);
    ck_assert_int_eq(p.probe, 1);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1000, &q), 0);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 5000, &q), 0);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 5000), INT64_MAX);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 1);
    /* The first success allows the next probe, but does not close it yet. */
    provider_breaker_record(b, &p, S, 5000);
    ck_assert_int_eq(provider_breaker_state(b, 5000), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_streak(b), 1);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 5000, &q), 1);
    ck_assert_int_eq(q.probe, 1);
    provider_breaker_record(b, &q, S, 5001);
    ck_assert_int_eq(provider_breaker_state(b, 5001), PROVIDER_BREAKER_CLOSED);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    /* Closed: calls are no probes, and no probe goes. */
    ck_assert_int_eq(provider_breaker_allow_probe(b, 5001, &q), 0);
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
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1000, &p), 1);
    provider_breaker_record(b, &p, S, 1200);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1200, &p), 1);
    /* One success before does not save it: a probe failure reopens. */
    provider_breaker_record(b, &p, F, 1500);
    ck_assert_int_eq(provider_breaker_state(b, 1500), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 2);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 2499, &p), 0);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 2000), 2500);
    ck_assert_int_eq(provider_breaker_state(b, 2500), PROVIDER_BREAKER_HALF_OPEN);
    /* Probe successes start from zero after a reopening. */
    ck_assert_int_eq(provider_breaker_allow_probe(b, 2500, &p), 1);
    provider_breaker_record(b, &p, S, 2600);
    ck_assert_int_eq(provider_breaker_state(b, 2600), PROVIDER_BREAKER_HALF_OPEN);
    provider_breaker_free(b);
}
END_TEST

START_TEST(calls_in_flight_when_it_opens_still_end_and_change_nothing)
{
    struct provider_breaker_ticket early[12], p;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    for (int i = 0; i < 12; i++)
        ck_assert_int_eq(provider_breaker_allow(b, 0, &early[i]), 1);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 12);
    /* The provider goes away: the first four answers open it... */
    for (int i = 0; i < 4; i++)
        provider_breaker_record(b, &early[i], F, 10);
    ck_assert_int_eq(provider_breaker_state(b, 10), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 8);
    /* ...the rest still end; a late success does not close it. */
    provider_breaker_record(b, &early[4], S, 20);
    provider_breaker_record(b, &early[5], F, 20);
    ck_assert_int_eq(provider_breaker_state(b, 20), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 1);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 6);
    /* Half-open with a probe out: late answers neither close nor reopen it,
     * and do not free the probe's place. */
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1010, &p), 1);
    provider_breaker_record(b, &early[6], F, 1020);
    provider_breaker_record(b, &early[7], S, 1020);
    provider_breaker_record(b, &early[8], S, 1020);
    ck_assert_int_eq(provider_breaker_state(b, 1020), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_streak(b), 0);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1020, &early[0]), 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 4);
    provider_breaker_record(b, &p, S, 1030);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1030, &p), 1);
    provider_breaker_record(b, &p, S, 1040);
    ck_assert_int_eq(provider_breaker_state(b, 1040), PROVIDER_BREAKER_CLOSED);
    /* Closed again, with an empty window: the failures that opened it and
     * the late answers of before count for nothing. */
    window_is(b, 1040, 0, 0);
    provider_breaker_record(b, &early[9], F, 1050);
    provider_breaker_record(b, &early[10], F, 1050);
    provider_breaker_record(b, &early[11], F, 1050);
    window_is(b, 1050, 0, 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    /* The probation's two calls go through; a failure after them makes
     * three calls, still too few to judge. */
    ck_assert_int_eq(provider_breaker_on_probation(b), 1);
    call(b, 1055, S);
    call(b, 1055, S);
    ck_assert_int_eq(provider_breaker_on_probation(b), 0);
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
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1000, &p), 1);
    provider_breaker_cancel(b, &p);
    ck_assert_int_eq(provider_breaker_state(b, 1000), PROVIDER_BREAKER_HALF_OPEN);
    ck_assert_int_eq(provider_breaker_streak(b), 0);
    ck_assert_uint_eq(provider_breaker_in_flight(b), 0);
    ck_assert_int_eq(provider_breaker_allow_probe(b, 1000, &p), 1);
    ck_assert_int_eq(p.probe, 1);
    provider_breaker_cancel(b, &p);
    provider_breaker_free(b);
}
END_TEST

/* Closes b (opened at 0) with cfg.probes probe successes at 1000. */
static void close_by_probes(provider_breaker_t *b)
{
    struct provider_breaker_ticket p;
    for (int i = 0; i < cfg.probes; i++) {
        ck_assert_int_eq(provider_breaker_allow_probe(b, 1000, &p), 1);
        provider_breaker_record(b, &p, S, 1000);
    }
    ck_assert_int_eq(provider_breaker_state(b, 1000), PROVIDER_BREAKER_CLOSED);
}

/* The attack on the probe: a provider that refuses the probe's request
 * (as it should) while every real charge fails after executing. After a
 * close, only `probes` calls go, and their failures open it again at once,
 * before a whole window of calls could go into the outage. */
START_TEST(after_a_close_the_first_calls_alone_decide)
{
    struct provider_breaker_ticket t[3], k;
    provider_breaker_t *b = provider_breaker_new(&cfg);
    open_at(b, 0);
    close_by_probes(b);
    ck_assert_int_eq(provider_breaker_on_probation(b), 1);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &t[0]), 1);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &t[1]), 1);
    ck_assert_int_eq(t[0].probation, 1);
    /* Both calls of the probation are out: no third until they end. */
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &t[2]), 0);
    ck_assert_int_eq(provider_breaker_next_allow_ms(b, 1000), INT64_MAX);
    /* A cancelled one gives its place back. */
    provider_breaker_cancel(b, &t[1]);
    ck_assert_int_eq(provider_breaker_allow(b, 1000, &t[1]), 1);
    provider_breaker_record(b, &t[0], F, 1100);
    ck_assert_int_eq(provider_breaker_state(b, 1100), PROVIDER_BREAKER_CLOSED);
    provider_breaker_record(b, &t[1], F, 1100);
    ck_assert_int_eq(provider_breaker_state(b, 1100), PROVIDER_BREAKER_OPEN);
    ck_assert_uint_eq(provider_breaker_opens(b), 2);

    /* Half of them failing is the rate too; fewer is not. */
    const struct provider_breaker_config three = {.failure_rate = 50,
                                                  .min_calls = 50,
                                                  .window_ms = 1000,
                                                  .open_ms = 1000,
                                                  .probes = 3};
    provider_breaker_t *c = provider_breaker_new(&three);
    for (int i = 0; i < 50; i++)
        call(c, 0, F);
    ck_assert_int_eq(provider_breaker_state(c, 0), PROVIDER_BREAKER_OPEN);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(provider_breaker_allow_probe(c, 1000, &k), 1);
        provider_breaker_record(c, &k, S, 1000);
    }
    call(c, 1000, F);
    call(c, 1000, S);
    call(c, 1000, S);
    ck_assert_int_eq(provider_breaker_state(c, 1000), PROVIDER_BREAKER_CLOSED);
    ck_assert_int_eq(provider_breaker_on_probation(c), 0);
    /* Past the probation, the window and its minimum judge again. */
    for (int i = 0; i < 40; i++)
        call(c, 1000, F);
    ck_assert_int_eq(provider_breaker_state(c, 1000), PROVIDER_BREAKER_CLOSED);
    provider_breaker_free(c);
    provider_breaker_free(b);
}
END_TEST

START_TEST(throttling_is_no_failure_while_other_answers_come_back)
{
    provider_breaker_t *b = provider_breaker_new(&cfg);
    /* 429s by the hundred for three windows, one success a window: the
     * provider answers; 429s count neither as calls nor as failures. */
    for (int64_t t = 0; t < 3000; t += 10) {
        call(b, t, T);
        if (t % 900 == 0)
            call(b, t, S);
        ck_assert_int_eq(provider_breaker_state(b, t), PROVIDER_BREAKER_CLOSED);
    }
    window_is(b, 2990, 1, 0);
    /* A failure rate is still judged on the other answers alone: the 429s
     * around them do not dilute it (3 of 4 with a 429 every 10 ms). */
    for (int i = 0; i < 2; i++)
        call(b, 3000, F);
    ck_assert_int_eq(provider_breaker_state(b, 3000), PROVIDER_BREAKER_CLOSED);
    call(b, 3000, F);
    ck_assert_int_eq(provider_breaker_state(b, 3000), PROVIDER_BREAKER_OPEN);
    provider_breaker_free(b);
}
END_TEST

START_TEST(nothing_but_429s_for_a_whole_window_opens_it)
{
    provider_breaker_t *b = provider_breaker_new(&cfg);
    call(b, 0, S);
    /* From 100 on, only 429s: not yet a whole window at 1099. */
    for (int64_t t = 100; t < 1100; t += 50)
        call(b, t, T);
    ck_assert_int_eq(provider_breaker_state(b, 1099), PROVIDER_BREAKER_CLOSED);
    window_is(b, 1099, 0, 0);
    call(b, 1100, T);
    ck_assert_int_eq(provider_breaker_state(b, 1100), PROVIDER_BREAKER_OPEN);
    /* Half-open, a probe answered 429 is still nothing but 429s. */
    struct provider_breaker_ticket p;
    ck_assert_int_eq(provider_breaker_allow_probe(b, 2100, &p), 1);
    provider_breaker_record(b, &p, T, 2100);
    ck_assert_int_eq(provider_breaker_state(b, 2100), PROVIDER_BREAKER_OPEN);
    provider_breaker_free(b);

    /* A whole window, but fewer than min_calls 429s: not judged. */
    b = provider_breaker_new(&cfg);
    call(b, 0, T);
    call(b, 600, T);
    call(b, 1200, T);
    ck_assert_int_eq(provider_breaker_state(b, 1200), PROVIDER_BREAKER_CLOSED);
    provider_breaker_free(b);
}
END_TEST

START_TEST(what_counts_as_a_failure)
{
    /* No answer (refused, lost, timed out), refusals and 5xx. */
    ck_assert_int_eq(provider_breaker_classify(0), F);
    /* A 429 is over our budget, not a provider in trouble. */
    ck_assert_int_eq(provider_breaker_classify(429), T);
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
    tcase_add_test(tc, the_rate_opens_it_once_enough_calls_are_in);
    tcase_add_test(tc, exactly_the_rate_opens_it_and_just_under_does_not);
    tcase_add_test(tc, one_failure_in_five_never_opens_it);
    tcase_add_test(tc, old_calls_age_out_of_the_window);
    tcase_add_test(tc, zero_rate_never_opens);
    tcase_add_test(tc, open_refuses_calls_until_the_cool_down_ends);
    tcase_add_test(tc, half_open_allows_one_probe_at_a_time);
    tcase_add_test(tc, a_failed_probe_opens_it_again_for_a_full_cool_down);
    tcase_add_test(tc, calls_in_flight_when_it_opens_still_end_and_change_nothing);
    tcase_add_test(tc, a_cancelled_probe_frees_its_place_and_counts_neither_way);
    tcase_add_test(tc, after_a_close_the_first_calls_alone_decide);
    tcase_add_test(tc, throttling_is_no_failure_while_other_answers_come_back);
    tcase_add_test(tc, nothing_but_429s_for_a_whole_window_opens_it);
    tcase_add_test(tc, what_counts_as_a_failure);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
