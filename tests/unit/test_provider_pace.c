/* Unit tests of common/core/provider_pace: a pace cut to what the
 * provider served when its 429s overrun the account, driven with a clock
 * of our own. */
#include <check.h>
#include <stdint.h>

#include "provider_pace.h"
#include "test_env.h"

#define CARD      1001 /* the object most calls are about */
#define THROTTLED 1002 /* an object the provider throttles by itself */

/* Calls started from t to t + ms, one tried every ms. */
static int started(struct provider_pace *p, int64_t t, int ms)
{
    int n = 0;
    for (int64_t i = t; i < t + ms; i++)
        n += provider_pace_take(p, i);
    return n;
}

/* A second of answers from t, spread evenly: `served` about `obj_served`
 * and `throttled` 429s about `obj_throttled`, interleaved. */
static void second(struct provider_pace *p, int64_t t, int served, uint64_t obj_served,
                   int throttled, uint64_t obj_throttled)
{
    int n = served + throttled;
    for (int i = 0; i < n; i++) {
        /* every k-th answer a 429, so both kinds span the second */
        int is_429 = throttled > 0 &&
                     (int64_t)i * throttled / n != (int64_t)(i + 1) * throttled / n;
        provider_pace_answer(p, is_429, is_429 ? obj_throttled : obj_served,
                             t + (int64_t)i * 1000 / n);
    }
}

/* The window before t is judged by the first answer at t (a served one,
 * which adds its step: at most one call/s at the floor). */
static void judged_at(struct provider_pace *p, int64_t t)
{
    provider_pace_answer(p, 0, CARD, t);
}

#define ck_limit(p, x)                                                                 \
    ck_assert_msg(                                                                     \
        provider_pace_limit(p) >= (x) && provider_pace_limit(p) < (x) + 1.01,          \
        "limit %.3f, not %.3f and a step", provider_pace_limit(p), (double)(x))

START_TEST(unpaced_until_an_overrun)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    ck_assert(provider_pace_limit(&p) == 0.0);
    ck_assert_int_eq(started(&p, 0, 1000), 1000);
    ck_assert_int_eq(provider_pace_next_ms(&p, 1000), 1000);
    second(&p, 1000, 1000, CARD, 0, 0);
    judged_at(&p, 2000);
    ck_assert(provider_pace_limit(&p) == 0.0);
}
END_TEST

/* The provider's bucket lets its rate through and answers the rest 429:
 * the pace becomes what it served, at once, however far over it was. */
START_TEST(an_overrun_cuts_to_what_was_served)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    second(&p, 0, 5, CARD, 295, CARD);
    ck_assert(provider_pace_limit(&p) == 0.0); /* judged whole, not at its first 429 */
    judged_at(&p, 1000);
    ck_limit(&p, 5.0);
    /* The next second lets about 5 through, trying every ms. */
    int n = started(&p, 1000, 1000);
    ck_assert_int_ge(n, 4);
    ck_assert_int_le(n, 6);
    ck_assert_int_gt(provider_pace_next_ms(&p, 2000) + 0, 1999);
    /* Nothing served at all: the floor, never 0 (a throttled sender
     * still sends). */
    provider_pace_init(&p, 0);
    second(&p, 0, 0, 0, 50, CARD);
    provider_pace_answer(&p, 1, CARD, 1000);
    ck_assert(provider_pace_limit(&p) == PACE_MIN_PER_S);
    ck_assert_int_eq(provider_pace_take(&p, 1500), 0);
    ck_assert_int_eq(provider_pace_take(&p, 2001), 1);
    ck_assert_int_eq(provider_pace_take(&p, 2001), 0);
}
END_TEST

/* Adversary 38g: only a message's first 429 counted, so once every
 * command of a backlog had had one, its retries (1,492 429s in 6 s against
 * 30 served at psp-sim's 5/s) cut nothing. Every 429 counts. */
START_TEST(a_backlogs_retries_cut)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    /* Retries about the one card every command uses: 5 served, 245 not. */
    second(&p, 0, 5, CARD, 245, CARD);
    judged_at(&p, 1000);
    ck_limit(&p, 5.0);
    /* And about many objects, each retried a few times a second. */
    provider_pace_init(&p, 0);
    int64_t t = -4;
    for (uint64_t obj = 1; obj <= 60; obj++)
        for (int i = 0; i < 4; i++)
            provider_pace_answer(&p, 1, obj, t += 4);
    for (int i = 0; i < 5; i++)
        provider_pace_answer(&p, 0, 100 + (uint64_t)i, t += 4);
    judged_at(&p, 1000);
    ck_assert(provider_pace_limit(&p) > 0.0 && provider_pace_limit(&p) <= 6.0);
}
END_TEST

/* Adversary 38g: a budget share of 15 against a provider at 5/s brought
 * fewer than forty answers in two seconds, so no 429 cut: ten 429s a
 * second for good. A window of ten answers and a second is judged. And a
 * trickle under ten a second is judged when ten have come. */
START_TEST(a_slow_overrun_is_cut)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    second(&p, 0, 5, CARD, 10, CARD);
    judged_at(&p, 1000);
    ck_limit(&p, 5.0);
    /* 4 answers a second, half of them 429s: ten by 2.5 s. */
    provider_pace_init(&p, 0);
    for (int i = 0; i < 10; i++)
        provider_pace_answer(&p, i % 2, CARD, (int64_t)i * 250);
    ck_assert(provider_pace_limit(&p) == 0.0);
    judged_at(&p, 2500);
    ck_limit(&p, 2.0);
    /* Two answers in five seconds, both 429s: judged at five, the floor. */
    provider_pace_init(&p, 0);
    provider_pace_answer(&p, 1, CARD, 0);
    provider_pace_answer(&p, 1, CARD, 2000);
    judged_at(&p, 4999);
    ck_assert(provider_pace_limit(&p) == 0.0);
    judged_at(&p, 5000);
    ck_limit(&p, PACE_MIN_PER_S);
}
END_TEST

/* One stray 429 (another client's, a fault) is no overrun, nor are 429s
 * under a twentieth of the answers (psp-sim's 3% fault); a twentieth is. */
START_TEST(strays_cut_nothing)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    second(&p, 0, 1, CARD, 1, CARD); /* 1 of 2, judged at five seconds */
    judged_at(&p, 5000);
    ck_assert(provider_pace_limit(&p) == 0.0);
    provider_pace_init(&p, 0);
    second(&p, 0, 1000, CARD, 49, CARD);
    judged_at(&p, 1000);
    ck_assert(provider_pace_limit(&p) == 0.0);
    provider_pace_init(&p, 0);
    second(&p, 0, 950, CARD, 50, CARD);
    judged_at(&p, 1000);
    ck_limit(&p, 950.0);
}
END_TEST

static void other_answers_raise_it_again_at(double from, int answers, double lo,
                                            double hi)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    second(&p, 0, (int)from, CARD, 100, CARD);
    judged_at(&p, 1000);
    ck_limit(&p, from >= 1.0 ? from : PACE_MIN_PER_S);
    for (int i = 1; i < answers; i++)
        provider_pace_answer(&p, 0, CARD, 1000 + i);
    ck_assert(provider_pace_limit(&p) > lo && provider_pace_limit(&p) < hi);
}

START_TEST(other_answers_raise_it_again)
{
    /* at 50/s: a second's answers add 5% */
    other_answers_raise_it_again_at(50.0, 50, 52.4, 52.6);
    /* from the floor, +1/limit an answer: about one call/s a second */
    other_answers_raise_it_again_at(0.0, 2, 2.49, 2.51);
}
END_TEST

/* Adversary 38f, 38g: one command in ten (or 51) for a card the provider
 * throttles by itself halved the whole worker every second, ~3,000 req/s
 * to tens. 429s about an object that got nothing else while others were
 * served say nothing of the account's rate. */
START_TEST(a_429_about_one_object_cuts_nothing)
{
    struct provider_pace p;
    provider_pace_init(&p, 0);
    for (int64_t t = 0; t < 10000; t += 1000)
        second(&p, t, 900, CARD, 100, THROTTLED);
    /* Half of them: still nothing. */
    second(&p, 10000, 500, CARD, 500, THROTTLED);
    judged_at(&p, 11000);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* The same share about the card that is also served: an overrun. */
    provider_pace_init(&p, 0);
    second(&p, 0, 900, CARD, 100, CARD);
    judged_at(&p, 1000);
    ck_limit(&p, 900.0);
    /* About eight throttled cards, each set apart; and about forty, most
     * of them counted: the account's. */
    for (int cards = 8; cards <= 40; cards += 32) {
        provider_pace_init(&p, 0);
        for (int i = 0; i < 1000; i++) {
            int bad = i % 10 == 0;
            provider_pace_answer(&p, bad,
                                 bad ? 5000 + (uint64_t)(i / 10 % cards) : CARD, i);
        }
        judged_at(&p, 1000);
        ck_assert_msg((provider_pace_limit(&p) == 0.0) == (cards == 8),
                      "%d cards: %.1f", cards, provider_pace_limit(&p));
    }
    /* Nothing served at all: no object is told apart, it is the account. */
    provider_pace_init(&p, 0);
    second(&p, 0, 0, 0, 100, THROTTLED);
    judged_at(&p, 1000);
    ck_limit(&p, PACE_MIN_PER_S);
}
END_TEST

/* A pace cut to the floor at 1000. */
static void at_the_floor(struct provider_pace *p)
{
    provider_pace_init(p, 0);
    second(p, 0, 0, 0, 100, CARD);
    provider_pace_answer(p, 1, CARD, 1000);
    ck_assert(provider_pace_limit(p) == PACE_MIN_PER_S);
}

/* A raise of the budget starts the pace afresh (adversary 38b: a pace at
 * the floor kept a worker at 5-7 req/s for seconds after the limits went
 * from 2 to 100); its grace judges nothing (adversary 38c: a 429 answering
 * the old limits cut it again); PACE_CONFIRM_WINDOWS clean windows confirm
 * it. */
START_TEST(a_raise_restarts_and_clean_windows_confirm_it)
{
    struct provider_pace p;
    at_the_floor(&p);
    ck_assert_int_eq(provider_pace_next_ms(&p, 1500) > 1500, 1);
    ck_assert_int_eq(provider_pace_restart(&p, 1500), 1);
    ck_assert(provider_pace_limit(&p) == 0.0);
    ck_assert_int_eq(started(&p, 1500, 100), 100);
    /* The grace (to 3500): overruns judge nothing. */
    second(&p, 1500, 10, CARD, 90, CARD);
    second(&p, 2500, 10, CARD, 90, CARD);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* Three clean windows past it confirm the raise. */
    for (int64_t t = 3500; t < 6500; t += 1000)
        second(&p, t, 100, CARD, 0, 0);
    judged_at(&p, 6500);
    ck_assert(provider_pace_limit(&p) == 0.0);
    /* An overrun later is an ordinary one; the next raise restarts. */
    second(&p, 6500, 10, CARD, 90, CARD);
    judged_at(&p, 7500);
    ck_limit(&p, 11.0); /* with judged_at's at 6500 */
    ck_assert_int_eq(provider_pace_restart(&p, 7600), 1);
}
END_TEST

/* Adversary 38f, 38g: an operator stepping the budget up and down over a
 * provider that never follows. Raises during a grace keep its end; an
 * overrun past it refutes the raise, and no raise restarts the pace for
 * PACE_QUIET_MS, then twice that after the next refutation, and so on up
 * to PACE_QUIET_MAX_MS: the steps cost fewer and fewer restarts. */
START_TEST(refuted_raises_restart_less_and_less)
{
    struct provider_pace p;
    at_the_floor(&p);
    ck_assert_int_eq(provider_pace_restart(&p, 2000), 1);
    ck_assert_int_eq(provider_pace_restart(&p, 3000), 1); /* the grace ends at 4000 */
    second(&p, 4000, 5, CARD, 95, CARD);
    judged_at(&p, 5000);
    ck_limit(&p, 5.0);
    int64_t quiet = PACE_QUIET_MS, refuted = 5000;
    for (int round = 0; round < 6; round++) {
        ck_assert_int_eq(provider_pace_restart(&p, refuted + quiet - 1), 0);
        ck_assert(provider_pace_limit(&p) > 0.0);
        int64_t t = refuted + quiet;
        ck_assert_int_eq(provider_pace_restart(&p, t), 1);
        second(&p, t + PACE_RESTART_GRACE_MS, 5, CARD, 95, CARD);
        refuted = t + PACE_RESTART_GRACE_MS + 1000;
        judged_at(&p, refuted);
        ck_limit(&p, 5.0);
        quiet = quiet * 2 > PACE_QUIET_MAX_MS ? PACE_QUIET_MAX_MS : quiet * 2;
    }
    ck_assert_int_eq(quiet, PACE_QUIET_MAX_MS);
    ck_assert_int_eq(provider_pace_restart(&p, refuted + PACE_QUIET_MAX_MS - 1), 0);
    /* A raise the provider follows sets the quiet back to its least. */
    ck_assert_int_eq(provider_pace_restart(&p, refuted + PACE_QUIET_MAX_MS), 1);
    int64_t t = refuted + PACE_QUIET_MAX_MS + PACE_RESTART_GRACE_MS;
    for (int i = 0; i < PACE_CONFIRM_WINDOWS; i++, t += 1000)
        second(&p, t, 100, CARD, 0, 0);
    judged_at(&p, t);
    ck_assert_int_eq(provider_pace_restart(&p, t + 1), 1);
    second(&p, t + 1 + PACE_RESTART_GRACE_MS, 5, CARD, 95, CARD);
    int64_t again = t + 1 + PACE_RESTART_GRACE_MS + 1000;
    judged_at(&p, again);
    ck_assert_int_eq(provider_pace_restart(&p, again + PACE_QUIET_MS - 1), 0);
    ck_assert_int_eq(provider_pace_restart(&p, again + PACE_QUIET_MS), 1);
}
END_TEST

/* Adversary 38e: the budget and the provider raised together; past the
 * grace two 429s (another client's, a fault) come back among the served:
 * no refutation, no cut. */
START_TEST(strays_after_a_shared_raise_refute_nothing)
{
    struct provider_pace p;
    at_the_floor(&p);
    ck_assert_int_eq(provider_pace_restart(&p, 2000), 1);
    second(&p, 4000, 98, CARD, 2, CARD);
    judged_at(&p, 5000);
    ck_assert(provider_pace_limit(&p) == 0.0);
}
END_TEST

START_TEST(object_names)
{
    ck_assert(provider_pace_object(NULL) == 0);
    ck_assert(provider_pace_object("") == 0);
    ck_assert(provider_pace_object("pm_card_visa") != 0);
    ck_assert(provider_pace_object("pm_card_visa") ==
              provider_pace_object("pm_card_visa"));
    ck_assert(provider_pace_object("pm_card_visa") !=
              provider_pace_object("pm_card_throttled"));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("provider_pace");
    TCase *tc = tcase_create("provider_pace");
    tcase_add_test(tc, unpaced_until_an_overrun);
    tcase_add_test(tc, an_overrun_cuts_to_what_was_served);
    tcase_add_test(tc, a_backlogs_retries_cut);
    tcase_add_test(tc, a_slow_overrun_is_cut);
    tcase_add_test(tc, strays_cut_nothing);
    tcase_add_test(tc, other_answers_raise_it_again);
    tcase_add_test(tc, a_429_about_one_object_cuts_nothing);
    tcase_add_test(tc, a_raise_restarts_and_clean_windows_confirm_it);
    tcase_add_test(tc, refuted_raises_restart_less_and_less);
    tcase_add_test(tc, strays_after_a_shared_raise_refute_nothing);
    tcase_add_test(tc, object_names);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
