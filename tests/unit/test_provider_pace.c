/* Unit tests of common/core/provider_pace: AIMD on calls started per
 * second, driven with a clock of our own. */
#include <check.h>
#include <stdint.h>

#include "provider_pace.h"
#include "test_env.h"

/* Calls started from t to t + ms, one tried every ms. */
static int started(struct provider_pace *p, int64_t t, int ms)
{
    int n = 0;
    for (int64_t i = t; i < t + ms; i++)
        n += provider_pace_take(p, i);
    return n;
}

/* An overrun's answers from t: PACE_CUT_ANSWERS first 429s, a ms apart
 * (a 429 cuts only once that many answers tell it from a stray). */
static void overrun(struct provider_pace *p, int64_t t)
{
    for (int i = 0; i < PACE_CUT_ANSWERS; i++)
        provider_pace_answer(p, 1, 1, t + i);
}

/* A pace 1,000 calls a second once, then overrun every second to its
 * floor by 12000. */
static void at_the_floor(struct provider_pace *p)
{
    provider_pace_init(p, 0);
    ck_assert_int_eq(started(p, 0, 1000), 1000);
    for (int64_t t = 1000; t < 12000; t += 1000)
        overrun(p, t);
    ck_assert(provider_pace_limit(p) == PACE_MIN_PER_S);
}

START_TEST(unpaced_until_a_429)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert(provider_pace_limit(&p) == 0.0);
    ck_assert_int_eq(started(&p, 0, 1000), 1000);
    ck_assert_int_eq(provider_pace_next_ms(&p, 1000), 1000);
    /* A success changes nothing while unpaced. */
    provider_pace_answer(&p, 0, 1, 1000);
    ck_assert(provider_pace_limit(&p) == 0.0);
}
END_TEST

START_TEST(a_429_halves_what_was_sent_and_the_rate_holds)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert_int_eq(started(&p, 0, 1000), 1000);
    overrun(&p, 1000);
    ck_assert(provider_pace_limit(&p) == 500.0);
    /* A burst of 429s from the same overrun cuts once. */
    provider_pace_answer(&p, 1, 1, 1500);
    ck_assert(provider_pace_limit(&p) == 500.0);
    /* The next second lets about 500 through, trying every ms (from the
     * cut, at the overrun's PACE_CUT_ANSWERS-th answer). */
    int n = started(&p, 1000, 1000);
    ck_assert_int_ge(n, 490 - PACE_CUT_ANSWERS / 2);
    ck_assert_int_le(n, 551); /* the rate, and one bucket (a tenth of a second) */
    ck_assert_int_gt(provider_pace_next_ms(&p, 2000) + 0, 1999);
    /* Later 429s halve it, a second apart, down to the floor. */
    for (int64_t t = 2000; t < 40000; t += 1000)
        overrun(&p, t);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    ck_assert_int_eq(started(&p, 40000, 1000), 1);
    ck_assert_int_eq(provider_pace_take(&p, 41000), 1);
    ck_assert_int_eq(provider_pace_take(&p, 41000), 0);
    ck_assert_int_eq(provider_pace_next_ms(&p, 41000), 42001);
}
END_TEST

START_TEST(other_answers_raise_it_again)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert_int_eq(started(&p, 0, 100), 100);
    overrun(&p, 1000); /* the last second's 100: 50/s */
    ck_assert(provider_pace_limit(&p) == 50.0);
    /* A second's answers at 50/s: 5% more. */
    for (int i = 0; i < 50; i++)
        provider_pace_answer(&p, 0, 1, 1000 + i);
    ck_assert(provider_pace_limit(&p) > 52.4 && provider_pace_limit(&p) < 52.6);
    /* Never below the floor; from there about one call/s more per
     * second. */
    provider_pace_init(&p, 0);
    ck_assert_int_eq(started(&p, 0, PACE_MIN_SAMPLE), PACE_MIN_SAMPLE);
    for (int64_t t = 10; t < 5000; t += 1000)
        overrun(&p, t);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    provider_pace_answer(&p, 0, 1, 5020);
    ck_assert(provider_pace_limit(&p) == 2.0);
    provider_pace_answer(&p, 0, 1, 5030);
    provider_pace_answer(&p, 0, 1, 5040);
    ck_assert(provider_pace_limit(&p) > 2.89 && provider_pace_limit(&p) < 2.91);
}
END_TEST

/* Adversary 38e: one stray 429 (another client's, a fault) as a backlog
 * begins, two calls out: half of them set the pace to 1/s, which climbs
 * back about +1/s a second. Fewer than PACE_MIN_SAMPLE calls in the last
 * second are no rate to halve; as many are. */
START_TEST(a_429_with_too_few_calls_sent_cuts_nothing)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert_int_eq(started(&p, 0, PACE_MIN_SAMPLE - 1), PACE_MIN_SAMPLE - 1);
    provider_pace_answer(&p, 1, 1, 150);
    ck_assert(provider_pace_limit(&p) == 0.0);
    ck_assert_int_eq(provider_pace_take(&p, 151), 1);
    for (int i = 0; i < PACE_CUT_ANSWERS - 2; i++)
        provider_pace_answer(&p, 0, 0, 151);
    provider_pace_answer(&p, 1, 1, 152); /* 2 of 40: a twentieth */
    ck_assert(provider_pace_limit(&p) == PACE_MIN_SAMPLE / 2.0);
}
END_TEST

/* A change of the limits (the budget's settings) starts the pace afresh:
 * unpaced at once, however low 429s had cut it, and a 429 under the new
 * limits cuts it again from what was sent since, even within a second of
 * the last cut (adversary 38b: a pace at the floor kept a worker at 5-7
 * req/s for seconds after the limits went from 2 to 100). */
START_TEST(a_restart_follows_new_limits_and_a_429_after_its_grace_cuts)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert_int_eq(started(&p, 0, 1000), 1000);
    for (int64_t t = 1000; t < 40000; t += 1000)
        overrun(&p, t);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    ck_assert_int_eq(provider_pace_take(&p, 39500), 1);
    ck_assert_int_gt(provider_pace_next_ms(&p, 39500), 39500);
    provider_pace_restart(&p, 39500);
    ck_assert(provider_pace_limit(&p) == 0.0);
    ck_assert_int_eq(provider_pace_next_ms(&p, 39500), 39500);
    /* Unpaced: every call goes, and other answers change nothing. */
    ck_assert_int_eq(started(&p, 39500, 100), 100);
    provider_pace_answer(&p, 0, 1, 39600);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* A 429 in the restart's grace cuts nothing: it answers the old
     * limits, or a provider that raised its own a moment after the
     * budget did (adversary 38c: a cut then held the worker at 1-6/s). */
    provider_pace_answer(&p, 1, 1, 39600);
    ck_assert(provider_pace_limit(&p) == 0.0);
    provider_pace_answer(&p, 1, 1, 39500 + PACE_RESTART_GRACE_MS - 1);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* 429s after it, any message's (repeats too: a backlog's 429s past
     * the grace are all repeats, adversary 38d), refute the raise when
     * their window fills: the pace from before the restart comes back. */
    ck_assert_int_eq(started(&p, 39500 + PACE_RESTART_GRACE_MS - 1, 1000), 1000);
    for (int i = 0; i < PACE_JUDGE_ANSWERS - 1; i++)
        provider_pace_answer(&p, 1, 0, 42500 + i);
    ck_assert(provider_pace_limit(&p) == 0.0); /* the window is not full */
    provider_pace_answer(&p, 1, 0, 42500 + PACE_JUDGE_ANSWERS);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    /* Then AIMD as ever: a repeat cuts nothing, a first one halves, at
     * most once a second. */
    provider_pace_answer(&p, 1, 0, 44000);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);

    /* Within PACE_RESTART_CONFIRM_MS of a refutation a raise restarts
     * nothing: the provider did not follow the last one. */
    ck_assert_int_eq(provider_pace_restart(&p, 46000), 0);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);

    /* Stray 429s past the grace among other answers (another client's, a
     * fault; a twentieth of them or more, no window over a fifth) refute
     * nothing: they cut as any first 429, to half of what was sent, not
     * back to the old pace. */
    ck_assert_int_eq(provider_pace_restart(&p, 53000), 1);
    int64_t past = 53000 + PACE_RESTART_GRACE_MS;
    ck_assert_int_eq(started(&p, past, 1000), 1000);
    int64_t t = past + 1000;
    for (int i = 0; i < 35; i++) /* windows of 10: three, and 5 of a fourth */
        provider_pace_answer(&p, 0, 0, t++);
    provider_pace_answer(&p, 1, 1, t++); /* the fourth: 1 of 10 */
    for (int i = 0; i < 4; i++)
        provider_pace_answer(&p, 0, 0, t++);
    provider_pace_answer(&p, 1, 1, t++);       /* the fifth: 2 of 10, at most */
    ck_assert(provider_pace_limit(&p) == 0.0); /* 2 of 41: under a twentieth */
    provider_pace_answer(&p, 1, 1, t++);       /* 3 of 42 */
    ck_assert(provider_pace_limit(&p) == 500.0);
    for (int i = 0; i < 20; i++)
        provider_pace_answer(&p, 0, 0, t++);
    ck_assert(provider_pace_limit(&p) > 500.0);

    /* A restart no 429 refutes within PACE_RESTART_CONFIRM_MS past its
     * grace was the provider's raise too: a later 429 cuts from what is
     * sent then, not back to the old pace. */
    ck_assert_int_eq(provider_pace_restart(&p, 58000), 1);
    int64_t later = 58000 + PACE_RESTART_GRACE_MS + PACE_RESTART_CONFIRM_MS;
    provider_pace_answer(&p, 0, 0, later);
    ck_assert_int_eq(started(&p, later, 1000), 1000);
    for (int i = 0; i < PACE_CUT_ANSWERS - 3; i++)
        provider_pace_answer(&p, 0, 0, later + 1000);
    provider_pace_answer(&p, 1, 1, later + 1001);
    provider_pace_answer(&p, 1, 1, later + 1001); /* 2 of 40 */
    ck_assert(provider_pace_limit(&p) == 500.0);
}
END_TEST

/* Adversary 38e: the budget and the provider raised together; past the
 * grace two 429s (another client's, a fault) come back first in a second
 * and the rest of it succeeds. Judged at their second 429 (2 of 2) they
 * put back the pace from before the raise (1/s against a provider that
 * now takes 100); judged on their window, 2 of 10 refute nothing. */
START_TEST(two_429s_first_in_a_window_refute_nothing)
{
    struct provider_pace p;
    at_the_floor(&p);
    provider_pace_restart(&p, 12000);
    int64_t past = 12000 + PACE_RESTART_GRACE_MS;
    ck_assert_int_eq(started(&p, past, 1000), 1000);
    /* Repeats, so that no first-429 cut hides what the window decides. */
    provider_pace_answer(&p, 1, 0, past + 1000);
    provider_pace_answer(&p, 1, 0, past + 1001);
    ck_assert(provider_pace_limit(&p) == 0.0);
    for (int i = 0; i < PACE_JUDGE_ANSWERS - 2; i++)
        provider_pace_answer(&p, 0, 0, past + 1002 + i);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* The same two alone, and nothing for a second (an idle worker): the
     * window is dropped unjudged, and the answers after it open their own. */
    provider_pace_answer(&p, 1, 0, past + 3000);
    provider_pace_answer(&p, 1, 0, past + 3001);
    for (int i = 0; i < PACE_JUDGE_ANSWERS - 1; i++)
        provider_pace_answer(&p, 0, 0, past + 3000 + PACE_JUDGE_MS + i);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* Three of ten are over a fifth: the provider did not raise. */
    for (int i = 0; i < 3; i++)
        provider_pace_answer(&p, 1, 0, past + 5000 + i);
    for (int i = 0; i < PACE_JUDGE_ANSWERS - 3; i++)
        provider_pace_answer(&p, 0, 0, past + 5003 + i);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
}
END_TEST

/* Adversary 38f: one command in 51 for a card the provider throttles (a
 * 429 about one object, not the account's rate): each message's first 429
 * halved the pace, once a second, from ~3,000 req/s to 42-56. Under a
 * twentieth of the answers of this second and the last, a first 429 cuts
 * nothing; at a twentieth it does. */
START_TEST(a_429_about_one_object_among_many_answers_cuts_nothing)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert_int_eq(started(&p, 0, 1000), 1000);
    overrun(&p, 1000);
    ck_assert(provider_pace_limit(&p) == 500.0); /* a real overrun */
    for (int64_t t = 3000; t < 13000; t++) {     /* 10 s at 1,000 answers a second */
        int one_card = t % 51 == 0;
        provider_pace_answer(&p, one_card, one_card, t);
    }
    ck_assert(provider_pace_limit(&p) > 500.0);
    /* A twentieth of a second's answers, first 429s: a cut. */
    for (int64_t t = 14000; t < 14950; t++)
        provider_pace_answer(&p, 0, 0, t);
    double before = provider_pace_limit(&p);
    for (int64_t t = 14950; t < 15000; t++)
        provider_pace_answer(&p, 1, 1, t);
    ck_assert(provider_pace_limit(&p) == before / 2.0);
}
END_TEST

/* Adversary 38f: raises a second apart (a script stepping the limit)
 * each restarted the pace with a grace of its own: no 429 ever cut it and
 * no window judged it while the steps went on. A restart in a restart's
 * grace keeps that grace; once refuted, raises restart nothing for
 * PACE_RESTART_CONFIRM_MS. */
START_TEST(raises_in_a_row_keep_the_first_grace)
{
    struct provider_pace p;
    at_the_floor(&p);
    ck_assert_int_eq(provider_pace_restart(&p, 12000), 1);
    ck_assert_int_eq(provider_pace_restart(&p, 13000), 1);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* The first restart's grace ends at 14000, not the second's at 15000. */
    for (int i = 0; i < PACE_JUDGE_ANSWERS; i++)
        provider_pace_answer(&p, 1, 0, 14000 + i);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    ck_assert_int_eq(provider_pace_restart(&p, 15000), 0); /* refuted at 14009 */
    ck_assert_int_eq(provider_pace_restart(&p, 14009 + PACE_RESTART_CONFIRM_MS - 1), 0);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    ck_assert_int_eq(provider_pace_restart(&p, 14009 + PACE_RESTART_CONFIRM_MS), 1);
    ck_assert(provider_pace_limit(&p) == 0.0);
}
END_TEST

/* A flood of throttled repeats (adversary 38d's backlog) is judged at the
 * window's PACE_JUDGE_ANSWERS-th answer, not a second later. */
START_TEST(a_flood_of_429s_refutes_at_once)
{
    struct provider_pace p;
    at_the_floor(&p);
    provider_pace_restart(&p, 12000);
    int64_t past = 12000 + PACE_RESTART_GRACE_MS;
    for (int i = 0; i < PACE_JUDGE_ANSWERS - 1; i++)
        provider_pace_answer(&p, 1, 0, past + i);
    ck_assert(provider_pace_limit(&p) == 0.0);
    provider_pace_answer(&p, 1, 0, past + PACE_JUDGE_ANSWERS);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("provider_pace");
    TCase *tc = tcase_create("provider_pace");
    tcase_add_test(tc, unpaced_until_a_429);
    tcase_add_test(tc, a_429_halves_what_was_sent_and_the_rate_holds);
    tcase_add_test(tc, other_answers_raise_it_again);
    tcase_add_test(tc, a_restart_follows_new_limits_and_a_429_after_its_grace_cuts);
    tcase_add_test(tc, a_429_with_too_few_calls_sent_cuts_nothing);
    tcase_add_test(tc, two_429s_first_in_a_window_refute_nothing);
    tcase_add_test(tc, a_flood_of_429s_refutes_at_once);
    tcase_add_test(tc, raises_in_a_row_keep_the_first_grace);
    tcase_add_test(tc, a_429_about_one_object_among_many_answers_cuts_nothing);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
