/* Unit tests of common/budget/budget_alloc: the fleet's budget divided
 * among its members (pure). The targets' sum never passes the global limit
 * nor a class's; priorities in order, a priority waiting only for those
 * above it; the audit floor; the leftover split; no limit; bad input
 * refused; the two-phase take, whose holders' sum stays within the
 * limits whatever order the members take in (random fleets); and each
 * member's own target, the same allocation whatever order it gathers the
 * fleet in. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget_alloc.h"
#include "test_env.h"

#define R(x) ((x)*1000LL) /* requests/s in mrps */

static struct budget_settings limits(long long global, long long floor)
{
    struct budget_settings s = {.global_rps = global, .audit_floor_rps = floor};
    return s;
}

static void want(struct budget_demand *d, enum budget_priority p, enum budget_class c,
                 long long rps)
{
    d->mrps[p][c] = R(rps);
}

static void alloc(const struct budget_settings *s, struct budget_demand *d, size_t n,
                  struct budget_share *t)
{
    const char *why = NULL;
    if (budget_alloc_targets(s, d, n, t, &why) != 0)
        ck_abort_msg("refused: %s", why);
}

/* The targets' sums are within every limit (one check: Check's asserts
 * cost a message each, and the random fleets make many). */
static void assert_within(const struct budget_settings *s, const struct budget_share *t,
                          size_t n)
{
    struct budget_share sum;
    int ok = 1;
    budget_share_zero(&sum);
    for (size_t m = 0; m < n; m++) {
        ok &= t[m].global_mrps >= 0 || t[m].global_mrps == BUDGET_UNLIMITED;
        ok &= t[m].floor_mrps >= 0;
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
            ok &= t[m].class_mrps[c] >= 0 || t[m].class_mrps[c] == BUDGET_UNLIMITED;
        budget_share_add(&sum, &t[m]);
    }
    if (!ok || !budget_alloc_within(s, &sum))
        ck_abort_msg("a share is negative or the sum passes a limit");
}

START_TEST(higher_priorities_are_served_first)
{
    struct budget_settings s = limits(40, 0);
    struct budget_demand d[3] = {0};
    struct budget_share t[3];
    want(&d[0], BUDGET_PRIO_CAPTURE, BUDGET_CLASS_CAPTURE, 30);
    want(&d[1], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 30);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[0].global_mrps, R(30));
    ck_assert_int_eq(t[1].global_mrps, R(10));
    /* No class limit: each class share is unlimited, the global binds. */
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_CAPTURE], BUDGET_UNLIMITED);
    assert_within(&s, t, 2);

    /* A lower priority's demand, however large, takes nothing from them:
     * a priority waits only for those above it. */
    want(&d[2], BUDGET_PRIO_LOOKUP, BUDGET_CLASS_RETRIEVE, 1000);
    want(&d[2], BUDGET_PRIO_AUDIT, BUDGET_CLASS_LIST, 1000);
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[0].global_mrps, R(30));
    ck_assert_int_eq(t[1].global_mrps, R(10));
    ck_assert_int_eq(t[2].global_mrps, 0);
    assert_within(&s, t, 3);

    /* And a charge does not wait for look-ups: with the capture gone, the
     * charge takes its whole demand first, look-ups the rest. */
    memset(&d[0], 0, sizeof(d[0]));
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[1].global_mrps, R(30));
    ck_assert_int_eq(t[2].global_mrps, R(10));
    assert_within(&s, t, 3);
}
END_TEST

START_TEST(a_class_limit_binds_its_class_and_splits_fairly)
{
    struct budget_settings s = limits(100, 0);
    struct budget_demand d[2] = {0};
    struct budget_share t[2];
    s.class_rps[BUDGET_CLASS_CREATE] = 25;
    want(&d[0], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 30);
    want(&d[1], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 10);
    want(&d[1], BUDGET_PRIO_LOOKUP, BUDGET_CLASS_SEARCH, 20);
    alloc(&s, d, 2, t);
    /* Water-filling: B asks less than half and gets it all, A the rest. */
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_CREATE], R(15));
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_CREATE], R(10));
    /* The search has no class limit: its share is unlimited, its use
     * bounded by the global share (its demand plus room to grow). */
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_SEARCH], BUDGET_UNLIMITED);
    /* 100 - 25 - 20 = 55 left, split between the two with demand. */
    ck_assert_int_eq(t[0].global_mrps, R(15) + R(28));
    ck_assert_int_eq(t[1].global_mrps, R(10) + R(20) + R(27));
    assert_within(&s, t, 2);
}
END_TEST

START_TEST(the_audit_floor_is_served_before_every_priority)
{
    struct budget_settings s = limits(25, 3);
    struct budget_demand d[2] = {0};
    struct budget_share t[2];
    want(&d[0], BUDGET_PRIO_CAPTURE, BUDGET_CLASS_CAPTURE, 100);
    want(&d[1], BUDGET_PRIO_AUDIT, BUDGET_CLASS_LIST, 10);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_LIST], BUDGET_UNLIMITED);
    ck_assert_int_eq(t[1].global_mrps, R(3));
    ck_assert_int_eq(t[1].floor_mrps, R(3));
    ck_assert_int_eq(t[0].global_mrps, R(22));
    ck_assert_int_eq(t[0].floor_mrps, 0);
    assert_within(&s, t, 2);

    /* A floor above the audit's demand gives only the demand; the rest goes
     * on by priority. Without audit demand the floor is not taken. */
    want(&d[1], BUDGET_PRIO_AUDIT, BUDGET_CLASS_LIST, 1);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[1].floor_mrps, R(1));
    ck_assert_int_eq(t[0].global_mrps, R(24));
    memset(&d[1], 0, sizeof(d[1]));
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[0].global_mrps, R(25));
    ck_assert_int_eq(t[1].global_mrps, 0);

    /* The floor obeys a class limit too. */
    s.class_rps[BUDGET_CLASS_LIST] = 2;
    want(&d[1], BUDGET_PRIO_AUDIT, BUDGET_CLASS_LIST, 10);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_LIST], R(2));
    ck_assert_int_eq(t[1].floor_mrps, R(2));
    assert_within(&s, t, 2);
}
END_TEST

/* Adversary 38, finding 9: with no global limit and a class limit only,
 * the floor holds on the limited class: the audit gets it ahead of the
 * look-ups that would take the whole class; a class without a limit needs
 * no floor. */
START_TEST(the_audit_floor_holds_per_class_without_a_global_limit)
{
    struct budget_settings s = limits(0, 1);
    struct budget_demand d[2] = {0};
    struct budget_share t[2];
    s.class_rps[BUDGET_CLASS_LIST] = 5;
    want(&d[0], BUDGET_PRIO_LOOKUP, BUDGET_CLASS_LIST, 50); /* the reconciler */
    want(&d[0], BUDGET_PRIO_LOOKUP, BUDGET_CLASS_CREATE, 50);
    want(&d[1], BUDGET_PRIO_AUDIT, BUDGET_CLASS_LIST, 10); /* the auditor */
    want(&d[1], BUDGET_PRIO_AUDIT, BUDGET_CLASS_RETRIEVE, 10);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_LIST], R(1));
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_LIST], R(4));
    ck_assert_int_eq(t[1].floor_mrps, R(1)); /* the limited class only */
    ck_assert_int_eq(t[0].floor_mrps, 0);
    ck_assert_int_eq(t[1].global_mrps, BUDGET_UNLIMITED);
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_RETRIEVE], BUDGET_UNLIMITED);
    assert_within(&s, t, 2);

    /* A floor above the class limit gives the whole class, no more; one
     * per limited class, each within its own limit. */
    s.audit_floor_rps = 7;
    s.class_rps[BUDGET_CLASS_RETRIEVE] = 3;
    want(&d[0], BUDGET_PRIO_LOOKUP, BUDGET_CLASS_RETRIEVE, 50);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_LIST], R(5));
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_RETRIEVE], R(3));
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_LIST], 0);
    ck_assert_int_eq(t[1].floor_mrps, R(8));
    assert_within(&s, t, 2);

    /* Without audit demand the floor is not taken. */
    memset(&d[1], 0, sizeof(d[1]));
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_LIST], R(5));
    ck_assert_int_eq(t[1].floor_mrps, 0);
}
END_TEST

START_TEST(what_is_left_is_split_among_members_with_demand)
{
    struct budget_settings s = limits(100, 0);
    struct budget_demand d[3] = {0};
    struct budget_share t[3];
    want(&d[0], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 10);
    want(&d[1], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 20);
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[0].global_mrps, R(10) + R(35));
    ck_assert_int_eq(t[1].global_mrps, R(20) + R(35));
    ck_assert_int_eq(t[2].global_mrps, 0);

    /* An idle fleet: evenly among all, in whole requests/s. */
    memset(d, 0, sizeof(d));
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[0].global_mrps, R(34));
    ck_assert_int_eq(t[1].global_mrps, R(33));
    ck_assert_int_eq(t[2].global_mrps, R(33));
    assert_within(&s, t, 3);

    /* A class's leftover goes to the members with demand on it. */
    s.class_rps[BUDGET_CLASS_REFUND] = 9;
    want(&d[2], BUDGET_PRIO_REFUND, BUDGET_CLASS_REFUND, 3);
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[2].class_mrps[BUDGET_CLASS_REFUND], R(9));
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_REFUND], 0);
    assert_within(&s, t, 3);
}
END_TEST

START_TEST(every_share_is_whole_requests_per_second)
{
    struct budget_settings s = limits(25, 1);
    struct budget_demand d[3] = {0};
    struct budget_share t[3];
    /* 25 split three ways, and fractional demands: whole shares, the
     * units the rounding leaves to the largest fractions. */
    for (int m = 0; m < 3; m++)
        want(&d[m], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 100);
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[0].global_mrps + t[1].global_mrps + t[2].global_mrps, R(25));
    for (int m = 0; m < 3; m++)
        ck_assert_int_eq(t[m].global_mrps % BUDGET_UNIT, 0);
    memset(d, 0, sizeof(d));
    d[0].mrps[BUDGET_PRIO_LOOKUP][BUDGET_CLASS_RETRIEVE] = 300;
    d[1].mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = 200; /* below the floor */
    d[2].mrps[BUDGET_PRIO_CHARGE][BUDGET_CLASS_CREATE] = 20500;
    alloc(&s, d, 3, t);
    ck_assert_int_eq(t[1].floor_mrps, R(1));  /* a whole request for 0.2 */
    ck_assert_int_ge(t[0].global_mrps, R(1)); /* 0.3 of a look-up: a whole one */
    ck_assert_int_le(t[2].global_mrps, R(23));
    for (int m = 0; m < 3; m++)
        ck_assert_int_eq(t[m].global_mrps % BUDGET_UNIT, 0);
    assert_within(&s, t, 3);
}
END_TEST

START_TEST(no_limit_is_unlimited_shares)
{
    struct budget_settings s = limits(0, 5);
    struct budget_demand d[2] = {0};
    struct budget_share t[2];
    want(&d[0], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 5000);
    alloc(&s, d, 2, t);
    for (int m = 0; m < 2; m++) {
        ck_assert_int_eq(t[m].global_mrps, BUDGET_UNLIMITED);
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
            ck_assert_int_eq(t[m].class_mrps[c], BUDGET_UNLIMITED);
    }
    /* A class limit alone binds its class; the global stays unlimited. */
    s.class_rps[BUDGET_CLASS_SEARCH] = 20;
    want(&d[1], BUDGET_PRIO_LOOKUP, BUDGET_CLASS_SEARCH, 50);
    alloc(&s, d, 2, t);
    ck_assert_int_eq(t[1].class_mrps[BUDGET_CLASS_SEARCH], R(20));
    ck_assert_int_eq(t[0].class_mrps[BUDGET_CLASS_SEARCH], 0);
    ck_assert_int_eq(t[1].global_mrps, BUDGET_UNLIMITED);
    assert_within(&s, t, 2);
    /* No member: nothing to do. */
    alloc(&s, d, 0, NULL);
}
END_TEST

START_TEST(bad_input_is_refused)
{
    struct budget_settings s = limits(100, 0);
    struct budget_demand d[1] = {0};
    struct budget_share t[1];
    const char *why = NULL;
    want(&d[0], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 10);
    d[0].mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = -1;
    t[0].global_mrps = 77;
    ck_assert_int_eq(budget_alloc_targets(&s, d, 1, t, &why), -1);
    ck_assert_ptr_nonnull(why);
    ck_assert_int_eq(t[0].global_mrps, 0); /* zeroed, never half filled */
    d[0].mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = BUDGET_DEMAND_MAX_MRPS + 1;
    ck_assert_int_eq(budget_alloc_targets(&s, d, 1, t, &why), -1);
    d[0].mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = 0;

    struct budget_settings bad[4] = {limits(-1, 0), limits(100, 101),
                                     limits(BUDGET_RPS_MAX + 1, 0), limits(10, -2)};
    for (int i = 0; i < 4; i++) {
        why = NULL;
        ck_assert_int_eq(budget_settings_check(&bad[i], &why), -1);
        ck_assert_ptr_nonnull(why);
        ck_assert_int_eq(budget_alloc_targets(&bad[i], d, 1, t, &why), -1);
    }
    s.class_rps[BUDGET_CLASS_LIST] = -5;
    ck_assert_int_eq(budget_settings_check(&s, &why), -1);
    /* A floor with no global limit is allowed (it applies per limited class). */
    struct budget_settings ok = limits(0, 50);
    ck_assert_int_eq(budget_settings_check(&ok, &why), 0);
    struct budget_demand *many = calloc(BUDGET_MEMBERS_MAX + 1, sizeof(*many));
    struct budget_share *out = calloc(BUDGET_MEMBERS_MAX + 1, sizeof(*out));
    ck_assert(many && out);
    ck_assert_int_eq(budget_alloc_targets(&ok, many, BUDGET_MEMBERS_MAX + 1, out, &why),
                     -1);
    ck_assert_int_eq(budget_alloc_targets(&ok, many, BUDGET_MEMBERS_MAX, out, &why), 0);
    free(many);
    free(out);
}
END_TEST

START_TEST(the_take_lowers_at_once_and_raises_only_into_room)
{
    struct budget_settings s = limits(100, 0);
    struct budget_share target = {0}, others = {0}, held;
    s.class_rps[BUDGET_CLASS_CREATE] = 25;
    target.global_mrps = R(60);
    target.class_mrps[BUDGET_CLASS_CREATE] = R(20);
    others.global_mrps = R(70);
    others.class_mrps[BUDGET_CLASS_CREATE] = R(10);
    budget_alloc_take(&s, &target, &others, &held);
    ck_assert_int_eq(held.global_mrps, R(30));                     /* room: 30 */
    ck_assert_int_eq(held.class_mrps[BUDGET_CLASS_CREATE], R(15)); /* room: 15 */
    ck_assert_int_eq(held.class_mrps[BUDGET_CLASS_LIST], 0); /* unlimited: target */
    others.global_mrps = R(120); /* the limit was lowered under the others */
    budget_alloc_take(&s, &target, &others, &held);
    ck_assert_int_eq(held.global_mrps, 0);
    others.global_mrps = BUDGET_UNLIMITED; /* a holder from before a limit */
    budget_alloc_take(&s, &target, &others, &held);
    ck_assert_int_eq(held.global_mrps, 0);
    others.global_mrps = 0;
    budget_alloc_take(&s, &target, &others, &held);
    ck_assert_int_eq(held.global_mrps, R(60));
}
END_TEST

static long long rnd(long long n)
{
    return (long long)(random() % n);
}

static void random_settings(struct budget_settings *s)
{
    s->global_rps = rnd(3) ? rnd(200) : 0;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        s->class_rps[c] = rnd(2) ? rnd(60) : 0;
    s->audit_floor_rps = s->global_rps ? rnd(s->global_rps + 1) : rnd(5);
}

static void random_demand(struct budget_demand *d)
{
    memset(d, 0, sizeof(*d));
    for (int i = rnd(6); i > 0; i--)
        d->mrps[rnd(BUDGET_PRIO_COUNT)][rnd(BUDGET_CLASS_COUNT)] = rnd(R(150));
}

/* Random fleets: the targets stay within the limits, and members taking
 * one at a time in a random order (some keeping the share of old
 * settings, some dead: gone) never hold more than the limits together. */
START_TEST(random_fleets_never_pass_a_limit)
{
    enum { N = 7 };
    srandom(38);
    for (int round = 0; round < 2000; round++) {
        struct budget_settings s, old;
        struct budget_demand d[N];
        struct budget_share t[N], held[N];
        size_t n = 1 + (size_t)rnd(N);
        random_settings(&old);
        random_settings(&s);
        for (size_t m = 0; m < n; m++)
            random_demand(&d[m]);
        alloc(&old, d, n, held); /* what they held under the old settings */
        for (size_t m = 0; m < n; m++)
            if (rnd(2))
                budget_share_zero(&held[m]); /* not yet a holder */
        for (int step = 0; step < 4 * N; step++) {
            size_t m = (size_t)rnd((long long)n);
            struct budget_share others, sum;
            random_demand(&d[m]);
            alloc(&s, d, n, t);
            assert_within(&s, t, n);
            budget_share_zero(&others);
            for (size_t k = 0; k < n; k++)
                if (k != m)
                    budget_share_add(&others, &held[k]);
            budget_alloc_take(&s, &t[m], &others, &held[m]);
            sum = others;
            budget_share_add(&sum, &held[m]);
            if (budget_alloc_within(&s, &others) && !budget_alloc_within(&s, &sum))
                ck_abort_msg("round %d step %d: the take passed a limit", round, step);
        }
        /* Once each has taken under the new settings, they are within. */
        for (size_t m = 0; m < n; m++) {
            struct budget_share others;
            budget_share_zero(&others);
            for (size_t k = 0; k < n; k++)
                if (k != m)
                    budget_share_add(&others, &held[k]);
            budget_alloc_take(&s, &t[m], &others, &held[m]);
        }
        assert_within(&s, held, n);
    }
}
END_TEST

/* Each member's own target in the view its refresh gathers (the others in
 * the order given by perm, itself last); ids "m<index>" (index order). */
static void own_view(const struct budget_settings *s, const struct budget_demand *d,
                     size_t n, size_t me, const size_t *perm, struct budget_share *own)
{
    struct budget_member_view v[8];
    const char *why = NULL;
    size_t k = 0;
    ck_assert(n <= 8);
    for (size_t j = 0; j < n; j++) {
        if (perm[j] == me)
            continue;
        snprintf(v[k].id, sizeof(v[k].id), "m%zu", perm[j]);
        v[k++].demand = d[perm[j]];
    }
    snprintf(v[k].id, sizeof(v[k].id), "m%zu", me);
    v[k].demand = d[me];
    if (budget_alloc_member_target(s, v, n, n - 1, 0, own, &why) != 0)
        ck_abort_msg("refused: %s", why);
}

static void shuffle(size_t *perm, size_t n)
{
    for (size_t j = 0; j < n; j++)
        perm[j] = j;
    for (size_t j = n; j > 1; j--) {
        size_t r = (size_t)rnd((long long)j), x = perm[j - 1];
        perm[j - 1] = perm[r];
        perm[r] = x;
    }
}

/* Whatever order a member gathers the fleet in, its target is its row of
 * the one allocation in id order: the members' own targets are that
 * allocation, so the rounding's odd units are held (a limit of 2 among
 * three saturated members: 1, 1, 0 in id order, not 0, 0, 0). */
START_TEST(every_member_computes_the_same_allocation)
{
    struct budget_settings s = limits(2, 0);
    struct budget_demand d[8] = {0};
    struct budget_share t[8], own;
    size_t perm[8];
    for (int m = 0; m < 3; m++)
        want(&d[m], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 10);
    for (size_t m = 0; m < 3; m++) {
        size_t order[3] = {2, 1, 0};
        own_view(&s, d, 3, m, order, &own);
        ck_assert_int_eq(own.global_mrps, m < 2 ? R(1) : 0);
        ck_assert_int_eq(own.class_mrps[BUDGET_CLASS_CREATE], BUDGET_UNLIMITED);
    }
    srandom(3838);
    for (int round = 0; round < 300; round++) {
        size_t n = 1 + (size_t)rnd(8);
        random_settings(&s);
        for (size_t m = 0; m < n; m++)
            random_demand(&d[m]);
        alloc(&s, d, n, t); /* ids "m0".."m7": id order is index order */
        for (size_t m = 0; m < n; m++) {
            shuffle(perm, n);
            own_view(&s, d, n, m, perm, &own);
            if (memcmp(&own, &t[m], sizeof(own)) != 0)
                ck_abort_msg("round %d: member %zu's own target is not its row", round,
                             m);
        }
    }
}
END_TEST

/* The target of member me among three ids "m0".."m2" (its view: the others
 * in index order, itself last) at a rotation. */
static void own_at(const struct budget_settings *s, const struct budget_demand *d,
                   size_t me, unsigned long long rotation, struct budget_share *own)
{
    struct budget_member_view v[3];
    const char *why = NULL;
    size_t k = 0;
    for (size_t j = 0; j < 3; j++)
        if (j != me) {
            snprintf(v[k].id, sizeof(v[k].id), "m%zu", j);
            v[k++].demand = d[j];
        }
    snprintf(v[k].id, sizeof(v[k].id), "m%zu", me);
    v[k].demand = d[me];
    if (budget_alloc_member_target(s, v, 3, 2, rotation, own, &why) != 0)
        ck_abort_msg("refused: %s", why);
}

/* More members asking than the limit has whole requests/s: the odd units
 * go to the first members of the order, and the rotation moves the first
 * place along the ids, so that over n rotations each member gets its even
 * part (a limit of 2 among three saturated members: 2 of every 3
 * rotations each), not 1, 1, 0 for ever. The rotation comes from the
 * database's clock in whole BUDGET_ROTATE_MS. */
START_TEST(the_odd_units_rotate_over_the_members)
{
    struct budget_settings s = limits(2, 0);
    struct budget_demand d[3] = {0};
    struct budget_share own;
    long long got[3] = {0};
    for (int m = 0; m < 3; m++)
        want(&d[m], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 10);
    for (unsigned long long r = 0; r < 6; r++) {
        long long sum = 0;
        for (size_t m = 0; m < 3; m++) {
            own_at(&s, d, m, r, &own);
            sum += own.global_mrps;
            got[m] += own.global_mrps;
            /* rotation r puts m<r % 3> first: it and the next get a unit */
            ck_assert_int_eq(own.global_mrps, (m + 3 - r % 3) % 3 < 2 ? R(1) : 0);
        }
        ck_assert_int_eq(sum, R(2)); /* each rotation: the whole limit, within it */
    }
    for (size_t m = 0; m < 3; m++)
        ck_assert_int_eq(got[m], R(4)); /* 2 of every 3 rotations, each */
    /* Rotation 0 is the id order unrotated. */
    own_at(&s, d, 0, 0, &own);
    ck_assert_int_eq(own.global_mrps, R(1));
    own_at(&s, d, 2, 0, &own);
    ck_assert_int_eq(own.global_mrps, 0);
    /* Whole periods of the database's clock; none before the epoch. */
    ck_assert_uint_eq(budget_alloc_rotation(0), 0);
    ck_assert_uint_eq(budget_alloc_rotation(BUDGET_ROTATE_MS - 1), 0);
    ck_assert_uint_eq(budget_alloc_rotation(BUDGET_ROTATE_MS), 1);
    ck_assert_uint_eq(budget_alloc_rotation(7 * BUDGET_ROTATE_MS + 5), 7);
    ck_assert_uint_eq(budget_alloc_rotation(-5), 0);
}
END_TEST

/* Members that read the clock either side of a rotation disagree on who
 * holds the odd units for a refresh: the two-phase take keeps the holders'
 * sum within the limit at every step, whichever rotation each one used,
 * and once all have taken at the same rotation they hold the whole of it. */
START_TEST(members_that_disagree_on_the_rotation_stay_within)
{
    struct budget_settings s = limits(2, 0);
    struct budget_demand d[3] = {0};
    struct budget_share held[3], t;
    for (int m = 0; m < 3; m++)
        want(&d[m], BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 10);
    for (int m = 0; m < 3; m++)
        budget_share_zero(&held[m]);
    srandom(3839);
    unsigned long long r = 0;
    for (int step = 0; step < 3000; step++) {
        size_t m = (size_t)rnd(3);
        if (rnd(4) == 0)
            r++; /* the clock passed a rotation between two refreshes */
        unsigned long long seen = r - (r > 0 && rnd(2) == 0); /* or just before */
        struct budget_share others;
        budget_share_zero(&others);
        for (size_t k = 0; k < 3; k++)
            if (k != m)
                budget_share_add(&others, &held[k]);
        own_at(&s, d, m, seen, &t);
        budget_alloc_take(&s, &t, &others, &held[m]);
        assert_within(&s, held, 3);
    }
    for (int round = 0; round < 2; round++) /* lower first, then raise */
        for (size_t m = 0; m < 3; m++) {
            struct budget_share others;
            budget_share_zero(&others);
            for (size_t k = 0; k < 3; k++)
                if (k != m)
                    budget_share_add(&others, &held[k]);
            own_at(&s, d, m, r, &t);
            budget_alloc_take(&s, &t, &others, &held[m]);
        }
    ck_assert_int_eq(held[0].global_mrps + held[1].global_mrps + held[2].global_mrps,
                     R(2));
}
END_TEST

START_TEST(a_member_target_refused_is_zero)
{
    struct budget_settings bad = limits(-1, 0);
    struct budget_member_view v[1] = {{.id = "m0"}};
    struct budget_share own;
    const char *why = NULL;
    want(&v[0].demand, BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 5);
    memset(&own, 0x7f, sizeof(own));
    ck_assert_int_eq(budget_alloc_member_target(&bad, v, 1, 0, 0, &own, &why), -1);
    ck_assert_ptr_nonnull(why);
    ck_assert_int_eq(own.global_mrps, 0);
    ck_assert_int_eq(own.floor_mrps, 0);
}
END_TEST

#define ALL_CLASSES ((1u << BUDGET_CLASS_COUNT) - 1)

/* A raise is a larger limit or none where there was one; a set that
 * changed nothing, or lowered, raised none (the worker's pace restarts
 * only on a raise). */
START_TEST(a_raise_is_told_from_a_lowering_and_a_no_op)
{
    struct budget_settings a = {.global_rps = 40,
                                .class_rps = {[BUDGET_CLASS_CREATE] = 25}};
    struct budget_settings b = a;
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 0); /* the same */
    b.global_rps = 30;
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 0); /* lowered */
    b.global_rps = 41;
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 1);
    b = a;
    b.global_rps = 0; /* no limit any more */
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 1);
    ck_assert_int_eq(budget_settings_raised(&b, &a, ALL_CLASSES), 0); /* a limit set */
    b = a;
    b.class_rps[BUDGET_CLASS_LIST] = 5; /* a class limited */
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 0);
    b.class_rps[BUDGET_CLASS_CREATE] = 26;
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 1);
    b.audit_floor_rps = 3; /* the floor is a part of a limit, not one */
    b.class_rps[BUDGET_CLASS_CREATE] = 25;
    ck_assert_int_eq(budget_settings_raised(&a, &b, ALL_CLASSES), 0);
    /* A raise of a class the member never asks (list, the auditor's) is
     * none of a worker's (adversary 38d); the global's always is. */
    b = a;
    b.class_rps[BUDGET_CLASS_LIST] = 5;
    struct budget_settings c = b;
    c.class_rps[BUDGET_CLASS_LIST] = 10;
    ck_assert_int_eq(budget_settings_raised(&b, &c, 1u << BUDGET_CLASS_CREATE), 0);
    ck_assert_int_eq(budget_settings_raised(&b, &c, 1u << BUDGET_CLASS_LIST), 1);
    c = b;
    c.global_rps = 50;
    ck_assert_int_eq(budget_settings_raised(&b, &c, 1u << BUDGET_CLASS_CREATE), 1);
}
END_TEST

/* A limit of exactly 1 req/s is spent at 0.8/s (the provider's bucket of
 * one token takes no early request: one in five came back 429, adversary
 * 38b); 2 and more, and no limit, are spent whole; the floor follows. */
START_TEST(a_limit_of_one_is_spent_at_four_fifths)
{
    struct budget_settings s = limits(1, 1);
    s.class_rps[BUDGET_CLASS_REFUND] = 1;
    s.class_rps[BUDGET_CLASS_CREATE] = 2;
    struct budget_share h = {.global_mrps = R(1), .floor_mrps = R(1)};
    h.class_mrps[BUDGET_CLASS_REFUND] = R(1);
    h.class_mrps[BUDGET_CLASS_CREATE] = R(2);
    h.class_mrps[BUDGET_CLASS_LIST] = BUDGET_UNLIMITED;
    budget_share_spendable(&s, &h);
    ck_assert_int_eq(h.global_mrps, BUDGET_ONE_RPS_MRPS);
    ck_assert_int_eq(h.floor_mrps, BUDGET_ONE_RPS_MRPS);
    ck_assert_int_eq(h.class_mrps[BUDGET_CLASS_REFUND], BUDGET_ONE_RPS_MRPS);
    ck_assert_int_eq(h.class_mrps[BUDGET_CLASS_CREATE], R(2));
    ck_assert_int_eq(h.class_mrps[BUDGET_CLASS_LIST], BUDGET_UNLIMITED);
    /* A share under 0.8 of a limit of 1 stays as it is. */
    struct budget_share low = {.global_mrps = 500};
    budget_share_spendable(&s, &low);
    ck_assert_int_eq(low.global_mrps, 500);
}
END_TEST

START_TEST(names_round_trip)
{
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        ck_assert_int_eq(budget_class_parse(budget_class_name((enum budget_class)c)),
                         c);
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++)
        ck_assert_int_eq(
            budget_priority_parse(budget_priority_name((enum budget_priority)p)), p);
    ck_assert_str_eq(budget_class_name(BUDGET_CLASS_SEARCH), "search");
    ck_assert_str_eq(budget_priority_name(BUDGET_PRIO_LOOKUP), "lookup");
    ck_assert_int_eq(budget_class_parse("global"), -1);
    ck_assert_int_eq(budget_priority_parse(NULL), -1);
    ck_assert_ptr_null(budget_class_name(BUDGET_CLASS_COUNT));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("budget_alloc");
    TCase *tc = tcase_create("budget_alloc");
    tcase_add_test(tc, higher_priorities_are_served_first);
    tcase_add_test(tc, a_class_limit_binds_its_class_and_splits_fairly);
    tcase_add_test(tc, the_audit_floor_is_served_before_every_priority);
    tcase_add_test(tc, the_audit_floor_holds_per_class_without_a_global_limit);
    tcase_add_test(tc, what_is_left_is_split_among_members_with_demand);
    tcase_add_test(tc, every_share_is_whole_requests_per_second);
    tcase_add_test(tc, no_limit_is_unlimited_shares);
    tcase_add_test(tc, bad_input_is_refused);
    tcase_add_test(tc, the_take_lowers_at_once_and_raises_only_into_room);
    tcase_add_test(tc, random_fleets_never_pass_a_limit);
    tcase_add_test(tc, every_member_computes_the_same_allocation);
    tcase_add_test(tc, the_odd_units_rotate_over_the_members);
    tcase_add_test(tc, members_that_disagree_on_the_rotation_stay_within);
    tcase_add_test(tc, a_member_target_refused_is_zero);
    tcase_add_test(tc, a_raise_is_told_from_a_lowering_and_a_no_op);
    tcase_add_test(tc, a_limit_of_one_is_spent_at_four_fifths);
    tcase_add_test(tc, names_round_trip);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
