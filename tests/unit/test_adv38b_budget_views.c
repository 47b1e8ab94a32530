/* Adversary 38b: the fleet's allocation as the members really compute it.
 * Every member's refresh (budget_lease.c refresh_once) runs
 * budget_alloc_targets over the other members' demands with its own LAST,
 * and keeps only its own row of the answer. The rounding to whole
 * requests/s gives the odd units to the first members (quantize: ties to
 * the lowest index; split_leftover: the remainder to the first): in each
 * member's view the odd units are another's, so nobody holds them. With the
 * same demands seen by all, the members' own targets must add up to the
 * limit when their demand passes it; they add up to limit - (odd units). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "budget_alloc.h"
#include "test_env.h"

#define R(x) ((x)*1000LL) /* requests/s in mrps */
#define MAXN 8

/* Each of the n members' own targets, computed as its refresh does: the
 * others in their order, itself last. */
static void own_targets(const struct budget_settings *s, const struct budget_demand *d,
                        size_t n, struct budget_share *own)
{
    struct budget_demand view[MAXN];
    struct budget_share t[MAXN];
    const char *why = NULL;
    ck_assert(n <= MAXN);
    for (size_t i = 0; i < n; i++) {
        size_t k = 0;
        for (size_t m = 0; m < n; m++)
            if (m != i)
                view[k++] = d[m];
        view[k] = d[i]; /* this member last */
        if (budget_alloc_targets(s, view, n, t, &why) != 0)
            ck_abort_msg("refused: %s", why);
        own[i] = t[n - 1];
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
