/* Adversary 38b: the fleet's allocation as the members really compute it.
 * Every member's refresh (budget_lease.c refresh_once) gathers the other
 * live members as the database returns them and itself LAST, and keeps
 * only its own target. The rounding to whole requests/s gives the odd units
 * to the first members (quantize: ties to the lowest index; split_leftover:
 * the remainder to the first): when each member computed the allocation in
 * that order of its own, in each member's view the odd units were another's,
 * so nobody held them (a limit of 2 with three members idled). With the same
 * demands seen by all, the members' own targets must add up to the limit
 * when their demand passes it, whatever order each one gathered them in.
 *
 * (Fix38d: own_targets first ran budget_alloc_targets over the view and
 * took its last row, a copy of refresh_once's arrangement; it now calls
 * budget_alloc_member_target, the arrangement refresh_once runs, with the
 * same view. On main's arrangement every case below fails.) */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget_alloc.h"
#include "test_env.h"

#define R(x) ((x)*1000LL) /* requests/s in mrps */
#define MAXN 8

/* Each of the n members' own targets, computed as its refresh does: the
 * others in the order the database gives them (one order for the even
 * members, its reverse for the odd), itself last; each member known by a
 * random-looking id whose order is not the index's. */
static void own_targets(const struct budget_settings *s, const struct budget_demand *d,
                        size_t n, struct budget_share *own)
{
    static const char *const ids[MAXN] = {
        "c3a1e6f0-0000-4000-8000-000000000001", "0b7d2e91-0000-4000-8000-000000000002",
        "f04c9a33-0000-4000-8000-000000000003", "7e55b1c2-0000-4000-8000-000000000004",
        "2a9f0d47-0000-4000-8000-000000000005", "d81c6e05-0000-4000-8000-000000000006",
        "5b3e7a98-0000-4000-8000-000000000007", "9c0f4b6d-0000-4000-8000-000000000008"};
    struct budget_member_view view[MAXN];
    const char *why = NULL;
    ck_assert(n <= MAXN);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        for (size_t j = 0; j < n; j++) {
            size_t m = i % 2 ? n - 1 - j : j;
            if (m == i)
                continue;
            snprintf(view[k].id, sizeof(view[k].id), "%s", ids[m]);
            view[k++].demand = d[m];
        }
        snprintf(view[k].id, sizeof(view[k].id), "%s", ids[i]);
        view[k].demand = d[i]; /* this member last */
        if (budget_alloc_member_target(s, view, n, n - 1, 0, &own[i], &why) != 0)
            ck_abort_msg("refused: %s", why);
    }
}

static long long sum_global(const struct budget_share *own, size_t n)
{
    long long v = 0;
    for (size_t i = 0; i < n; i++)
        v += own[i].global_mrps;
    return v;
}

START_TEST(a_limit_below_the_members_is_not_left_idle)
{
    /* Three workers with charges queued (10 req/s each asked), limit 2. */
    struct budget_settings s = {.global_rps = 2};
    struct budget_demand d[3] = {0};
    struct budget_share own[3];
    for (int i = 0; i < 3; i++)
        d[i].mrps[BUDGET_PRIO_CHARGE][BUDGET_CLASS_CREATE] = R(10);
    own_targets(&s, d, 3, own);
    ck_assert_msg(sum_global(own, 3) == R(2),
                  "three saturated members under a limit of 2 req/s hold %lld mrps "
                  "together: each gives the odd units to another",
                  sum_global(own, 3));
}
END_TEST

START_TEST(a_saturated_fleet_holds_its_whole_limit)
{
    /* Three workers, limit 10: each takes 3, the tenth request/s idles. */
    struct budget_settings s = {.global_rps = 10};
    struct budget_demand d[3] = {0};
    struct budget_share own[3];
    for (int i = 0; i < 3; i++)
        d[i].mrps[BUDGET_PRIO_CHARGE][BUDGET_CLASS_CREATE] = R(50);
    own_targets(&s, d, 3, own);
    ck_assert_msg(sum_global(own, 3) == R(10),
                  "three saturated members under a limit of 10 req/s hold %lld mrps "
                  "together",
                  sum_global(own, 3));
}
END_TEST

START_TEST(the_audit_floor_is_not_lost_between_two_auditors)
{
    /* Workers take everything above the floor; two auditors share a floor
     * of 1 req/s: the lowest priority may not starve. */
    struct budget_settings s = {.global_rps = 10, .audit_floor_rps = 1};
    struct budget_demand d[3] = {0};
    struct budget_share own[3];
    d[0].mrps[BUDGET_PRIO_CHARGE][BUDGET_CLASS_CREATE] = R(100);
    d[1].mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = R(5);
    d[2].mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = R(5);
    own_targets(&s, d, 3, own);
    ck_assert_msg(own[1].floor_mrps + own[2].floor_mrps == R(1),
                  "two auditors under a floor of 1 req/s hold %lld mrps of floor "
                  "together: the audit starves behind the charges",
                  own[1].floor_mrps + own[2].floor_mrps);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("adv38b_budget_views");
    TCase *tc = tcase_create("adv38b_budget_views");
    tcase_add_test(tc, a_limit_below_the_members_is_not_left_idle);
    tcase_add_test(tc, a_saturated_fleet_holds_its_whole_limit);
    tcase_add_test(tc, the_audit_floor_is_not_lost_between_two_auditors);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
