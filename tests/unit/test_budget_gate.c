/* Unit tests of common/budget/budget_gate: one process spending its share,
 * on a clock of the test's own. It paces at its share (no second holds
 * more), its waits are exact, a lowered share caps the tokens at once,
 * waiters are served by priority (a waiter whose class has no token does
 * not hold up the others), the audit floor keeps audit alive under a
 * saturating higher priority, nothing goes past the lease, and a request
 * the HTTP client re-sent is paid for after the fact. */
#include <check.h>
#include <string.h>

#include "budget_gate.h"
#include "test_env.h"

#define R(x)    ((x)*1000LL)
#define FOREVER (1LL << 40)

/* A share of global_rps with every class unlimited, floor floor_rps. */
static struct budget_share share_of(long long global_rps, long long floor_rps)
{
    struct budget_share s = {.global_mrps = R(global_rps), .floor_mrps = R(floor_rps)};
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        s.class_mrps[c] = BUDGET_UNLIMITED;
    return s;
}

static struct budget_ticket ticket(enum budget_class c, enum budget_priority p)
{
    struct budget_ticket t = {.cls = c, .prio = p, .waiting = 0};
    return t;
}

START_TEST(it_paces_at_its_share_and_no_second_holds_more)
{
    struct budget_gate g;
    struct budget_share s = share_of(10, 0);
    int per_second[10] = {0}, total = 0;
    s.class_mrps[BUDGET_CLASS_CREATE] = R(10);
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    for (long long now = 0; now < 10000; now++) {
        struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
        if (budget_gate_ask(&g, &t, now) == 0) {
            per_second[now / 1000]++;
            total++;
        } else {
            budget_gate_forget(&g, &t);
        }
    }
    for (int i = 0; i < 10; i++)
        ck_assert_int_le(per_second[i], 10);
    ck_assert_int_eq(total, 99); /* at 100, 200, ... 9900 ms */
}
END_TEST

/* Adversary 38f: an engine asks for a turn's calls at one now. With a
 * bucket of one request it sent one a turn (70-142/s under a share of
 * 500) and never more than one a ms (1,000/s); the bucket holds
 * BUDGET_GATE_BURST_MS of the rate, so turns of 20 ms spend the share. */
static int spent_in_turns(long long rps, int turn_ms, int asks, int *most_in_a_second)
{
    struct budget_gate g;
    struct budget_share s = share_of(rps, 0);
    int per_second[5] = {0}, total = 0;
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    for (long long now = 0; now < 5000; now += turn_ms)
        for (int i = 0; i < asks; i++) {
            struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
            if (budget_gate_ask(&g, &t, now) == 0) {
                per_second[now / 1000]++;
                total++;
            } else {
                budget_gate_forget(&g, &t);
            }
        }
    *most_in_a_second = 0;
    for (int i = 0; i < 5; i++)
        if (per_second[i] > *most_in_a_second)
            *most_in_a_second = per_second[i];
    return total;
}

START_TEST(a_turn_of_asks_at_one_now_spends_the_share)
{
    int most;
    ck_assert_int_ge(spent_in_turns(500, 20, 50, &most), 5 * 500 * 95 / 100);
    ck_assert_int_le(most, 500 + 500 * BUDGET_GATE_BURST_MS / 1000);
    ck_assert_int_ge(spent_in_turns(2000, 10, 100, &most), 5 * 2000 * 95 / 100);
    ck_assert_int_le(most, 2000 + 2000 * BUDGET_GATE_BURST_MS / 1000);
}
END_TEST

START_TEST(its_wait_is_exact)
{
    struct budget_gate g;
    struct budget_share s = share_of(4, 0); /* one every 250 ms */
    struct budget_ticket t = ticket(BUDGET_CLASS_RETRIEVE, BUDGET_PRIO_LOOKUP);
    budget_gate_init(&g, 1000);
    budget_gate_set_share(&g, &s, FOREVER, 1000);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 1000), 250);
    ck_assert_int_eq(t.waiting, 1);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 1249), 1);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 1250), 0);
    ck_assert_int_eq(t.waiting, 0);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 1251), 249);
    budget_gate_forget(&g, &t);
    ck_assert_int_eq(g.waiting[BUDGET_PRIO_LOOKUP][BUDGET_CLASS_RETRIEVE], 0);
}
END_TEST

START_TEST(a_lowered_share_caps_the_tokens_at_once)
{
    struct budget_gate g;
    struct budget_share big = share_of(100, 0), none = share_of(0, 0);
    struct budget_share small = share_of(10, 0);
    int sent = 0;
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &big, FOREVER, 0);
    /* A full bucket is BUDGET_GATE_BURST_MS of the rate (20 at 100/s),
     * whatever the idle time. */
    for (int i = 0; i < 40; i++) {
        struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
        sent += budget_gate_ask(&g, &t, 5000) == 0;
        budget_gate_forget(&g, &t);
    }
    ck_assert_int_eq(sent, 100 * BUDGET_GATE_BURST_MS / 1000);
    /* Lowered to nothing, its token is gone at once; raised again, the
     * bucket fills from then at the new rate. */
    struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CAPTURE);
    budget_gate_set_share(&g, &none, FOREVER, 6000);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 6000), BUDGET_GATE_WAIT_MAX_MS);
    budget_gate_set_share(&g, &small, FOREVER, 7000);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 7000), 100);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 7100), 0);
}
END_TEST

START_TEST(waiters_are_served_by_priority)
{
    struct budget_gate g;
    struct budget_share s = share_of(10, 0);
    struct budget_ticket charge = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    struct budget_ticket look = ticket(BUDGET_CLASS_RETRIEVE, BUDGET_PRIO_LOOKUP);
    struct budget_ticket cap = ticket(BUDGET_CLASS_CAPTURE, BUDGET_PRIO_CAPTURE);
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    ck_assert_int_eq(budget_gate_ask(&g, &charge, 0), 100); /* waits */
    /* The token comes at 100: the charge waiting above it takes it first. */
    ck_assert_int_gt(budget_gate_ask(&g, &look, 100), 0);
    ck_assert_int_eq(budget_gate_ask(&g, &charge, 100), 0);
    ck_assert_int_eq(budget_gate_ask(&g, &look, 200), 0);

    /* A capture waiting on a class with no share holds up no one. */
    s.class_mrps[BUDGET_CLASS_CAPTURE] = 0;
    budget_gate_set_share(&g, &s, FOREVER, 200);
    ck_assert_int_eq(budget_gate_ask(&g, &cap, 300), BUDGET_GATE_WAIT_MAX_MS);
    ck_assert_int_eq(budget_gate_ask(&g, &charge, 300), 0);
    /* A lower priority waits for a waiter above it only while that one
     * waits: once forgotten, it goes. */
    struct budget_ticket charge2 = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    ck_assert_int_gt(budget_gate_ask(&g, &charge2, 350), 0);
    ck_assert_int_gt(budget_gate_ask(&g, &look, 400), 0);
    budget_gate_forget(&g, &charge2);
    ck_assert_int_eq(budget_gate_ask(&g, &look, 400), 0);
    budget_gate_forget(&g, &cap);
}
END_TEST

/* A charge always waiting and an audit asking every ms, 10 s: the floor
 * gives the audit its rate; without it the audit starves. */
static int audit_sent(long long floor_rps)
{
    struct budget_gate g;
    struct budget_share s = share_of(10, floor_rps);
    struct budget_ticket charge = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    int audits = 0, charges = 0;
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    for (long long now = 0; now < 10000; now++) {
        struct budget_ticket audit = ticket(BUDGET_CLASS_LIST, BUDGET_PRIO_AUDIT);
        charges += budget_gate_ask(&g, &charge, now) == 0;
        audits += budget_gate_ask(&g, &audit, now) == 0;
        budget_gate_forget(&g, &audit);
    }
    ck_assert_int_le(audits + charges, 100);
    return audits;
}

START_TEST(the_floor_keeps_the_audit_alive)
{
    ck_assert_int_eq(audit_sent(0), 0);
    int with = audit_sent(2);
    ck_assert_int_ge(with, 19);
    ck_assert_int_le(with, 21);
}
END_TEST

START_TEST(nothing_goes_past_the_lease)
{
    struct budget_gate g;
    struct budget_share s = share_of(1000, 0);
    struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CAPTURE);
    budget_gate_init(&g, 0);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 0),
                     BUDGET_GATE_WAIT_MAX_MS); /* no share */
    budget_gate_set_share(&g, &s, 1000, 0);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 500), 0);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 1000), BUDGET_GATE_WAIT_MAX_MS);
    budget_gate_set_share(&g, &s, 2250, 1250); /* renewed */
    ck_assert_int_eq(budget_gate_ask(&g, &t, 1300), 0);
    budget_gate_forget(&g, &t);
}
END_TEST

START_TEST(unlimited_always_goes)
{
    struct budget_gate g;
    struct budget_share s;
    s.global_mrps = BUDGET_UNLIMITED;
    s.floor_mrps = 0;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        s.class_mrps[c] = BUDGET_UNLIMITED;
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    for (int i = 0; i < 100000; i++) {
        struct budget_ticket t = ticket((enum budget_class)(i % BUDGET_CLASS_COUNT),
                                        (enum budget_priority)(i % BUDGET_PRIO_COUNT));
        ck_assert_int_eq(budget_gate_ask(&g, &t, 5), 0);
    }
}
END_TEST

/* A request the HTTP client sent twice is paid for after the fact: the
 * buckets hold less than nothing, and the next ask waits the debt out. */
START_TEST(a_charged_arrival_is_waited_out)
{
    struct budget_gate g;
    struct budget_share s = share_of(10, 0); /* one every 100 ms */
    struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    s.class_mrps[BUDGET_CLASS_CREATE] = R(10);
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 100), 0);
    budget_gate_charge(&g, BUDGET_CLASS_CREATE, 2, 150);
    ck_assert_int_lt(g.global.tokens, 0);
    ck_assert_int_lt(g.cls[BUDGET_CLASS_CREATE].tokens, 0);
    /* Two requests owed and one to take: 300 ms from the ask's token. */
    ck_assert_int_eq(budget_gate_ask(&g, &t, 150), 250);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 399), 1);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 400), 0);
    /* n = 0 changes nothing. */
    budget_gate_charge(&g, BUDGET_CLASS_CREATE, 0, 400);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 500), 0);
}
END_TEST

/* Every request arriving twice: the arrivals, not the asks, stay within
 * the share in every second. */
START_TEST(every_arrival_is_paid_for)
{
    struct budget_gate g;
    struct budget_share s = share_of(10, 0);
    int per_second[10] = {0}, total = 0;
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    for (long long now = 0; now < 10000; now++) {
        struct budget_ticket t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
        if (budget_gate_ask(&g, &t, now) != 0) {
            budget_gate_forget(&g, &t);
            continue;
        }
        per_second[now / 1000] += 2; /* sent, and re-sent by the client */
        total += 2;
        budget_gate_charge(&g, BUDGET_CLASS_CREATE, 1, now);
    }
    for (int i = 0; i < 10; i++)
        ck_assert_int_le(per_second[i], 10);
    ck_assert_int_eq(total, 100); /* at 100, 300, ... 9900 ms, two each */
}
END_TEST

/* An unlimited bucket takes nothing; a class's debt is its own and the
 * global bucket's, never another class's. */
START_TEST(a_charge_takes_only_what_is_limited)
{
    struct budget_gate g;
    struct budget_share s = share_of(0, 0);
    struct budget_ticket t = ticket(BUDGET_CLASS_RETRIEVE, BUDGET_PRIO_LOOKUP);
    s.global_mrps = BUDGET_UNLIMITED;
    s.class_mrps[BUDGET_CLASS_CREATE] = R(10);
    s.class_mrps[BUDGET_CLASS_RETRIEVE] = R(10);
    budget_gate_init(&g, 0);
    budget_gate_set_share(&g, &s, FOREVER, 0);
    budget_gate_charge(&g, BUDGET_CLASS_CREATE, 3, 100);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 100), 0);
    t = ticket(BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    ck_assert_int_eq(budget_gate_ask(&g, &t, 100), 250); /* 3 owed, 1 to take */
    budget_gate_forget(&g, &t);
    ck_assert_int_eq(g.global.tokens, 0); /* unlimited: nothing owed */
}
END_TEST

int main(void)
{
    Suite *s = suite_create("budget_gate");
    TCase *tc = tcase_create("budget_gate");
    tcase_add_test(tc, it_paces_at_its_share_and_no_second_holds_more);
    tcase_add_test(tc, its_wait_is_exact);
    tcase_add_test(tc, a_lowered_share_caps_the_tokens_at_once);
    tcase_add_test(tc, a_turn_of_asks_at_one_now_spends_the_share);
    tcase_add_test(tc, waiters_are_served_by_priority);
    tcase_add_test(tc, the_floor_keeps_the_audit_alive);
    tcase_add_test(tc, nothing_goes_past_the_lease);
    tcase_add_test(tc, unlimited_always_goes);
    tcase_add_test(tc, a_charged_arrival_is_waited_out);
    tcase_add_test(tc, every_arrival_is_paid_for);
    tcase_add_test(tc, a_charge_takes_only_what_is_limited);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
