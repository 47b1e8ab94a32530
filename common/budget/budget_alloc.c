#include "budget_alloc.h"

#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"

static const char *const class_names[BUDGET_CLASS_COUNT] = {
    "create", "capture", "refund", "retrieve", "search", "list"};
static const char *const prio_names[BUDGET_PRIO_COUNT] = {"capture", "refund", "charge",
                                                          "lookup", "audit"};

const char *budget_class_name(enum budget_class c)
{
    return (unsigned)c < BUDGET_CLASS_COUNT ? class_names[c] : NULL;
}

int budget_class_parse(const char *name)
{
    for (int c = 0; name && c < BUDGET_CLASS_COUNT; c++)
        if (!strcmp(name, class_names[c]))
            return c;
    return -1;
}

const char *budget_priority_name(enum budget_priority p)
{
    return (unsigned)p < BUDGET_PRIO_COUNT ? prio_names[p] : NULL;
}

int budget_priority_parse(const char *name)
{
    for (int p = 0; name && p < BUDGET_PRIO_COUNT; p++)
        if (!strcmp(name, prio_names[p]))
            return p;
    return -1;
}

static int rps_ok(long long v)
{
    return v >= 0 && v <= BUDGET_RPS_MAX;
}

/* One limit raised: 0 is no limit, the largest of all. */
static int limit_raised(long long before, long long after)
{
    return before != 0 && (after == 0 || after > before);
}

int budget_settings_raised(const struct budget_settings *before,
                           const struct budget_settings *after, unsigned classes)
{
    CHARGED_ASSERT(before != NULL && after != NULL);
    int raised = limit_raised(before->global_rps, after->global_rps);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        if (classes & (1u << c))
            raised |= limit_raised(before->class_rps[c], after->class_rps[c]);
    return raised;
}

int budget_settings_check(const struct budget_settings *s, const char **why)
{
    CHARGED_ASSERT(s != NULL && why != NULL);
    if (!rps_ok(s->global_rps) || !rps_ok(s->audit_floor_rps)) {
        *why = "a limit must be a whole number of requests/s in 0..1000000";
        return -1;
    }
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        if (!rps_ok(s->class_rps[c])) {
            *why = "a limit must be a whole number of requests/s in 0..1000000";
            return -1;
        }
    }
    if (s->global_rps > 0 && s->audit_floor_rps > s->global_rps) {
        *why = "the audit floor may not exceed the global limit";
        return -1;
    }
    return 0;
}

int budget_demand_check(const struct budget_demand *d, const char **why)
{
    CHARGED_ASSERT(d != NULL && why != NULL);
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++) {
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            if (d->mrps[p][c] < 0 || d->mrps[p][c] > BUDGET_DEMAND_MAX_MRPS) {
                *why = "a demand must be in 0..1000000000 mrps";
                return -1;
            }
        }
    }
    return 0;
}

/* One allocation in progress: the room each limit has left (meaningful
 * where it is limited), what the floor gave each member's audit per class
 * (n x BUDGET_CLASS_COUNT), one class's split in progress (got, n, and
 * its fractions, n more), and the targets being filled. */
struct alloc_work {
    const struct budget_demand *d;
    size_t n;
    struct budget_share *t;
    long long *floor_c, *got;
    int g_lim, c_lim[BUDGET_CLASS_COUNT];
    long long room_g, room_c[BUDGET_CLASS_COUNT];
};

/* What member m still asks of priority p on class c. */
static long long demand_left(const struct alloc_work *w, size_t m, int p, int c)
{
    long long v = w->d[m].mrps[p][c];
    if (p == BUDGET_PRIO_AUDIT)
        v -= w->floor_c[m * BUDGET_CLASS_COUNT + c];
    return v > 0 ? v : 0; /* the floor may have given a whole request for less */
}

/* The split in got[] (mrps) as whole requests/s: each member its floor,
 * then the `units` left one each to the largest fractions. Returns what
 * was given (mrps). Whole shares are what keep every second within the
 * limit: a gate sends at most its whole rate in any second (budget_gate.h),
 * where a fractional one could send one more. */
static long long quantize(struct alloc_work *w, long long units)
{
    long long *frac = w->got + w->n, used = 0;
    for (size_t m = 0; m < w->n; m++) {
        frac[m] = w->got[m] % BUDGET_UNIT;
        w->got[m] -= frac[m];
        used += w->got[m] / BUDGET_UNIT;
    }
    while (used < units) {
        size_t best = w->n;
        for (size_t m = 0; m < w->n; m++)
            if (frac[m] > 0 && (best == w->n || frac[m] > frac[best]))
                best = m;
        if (best == w->n)
            break;
        w->got[best] += BUDGET_UNIT;
        frac[best] = 0;
        used++;
    }
    CHARGED_ASSERT(used <= units);
    return used * BUDGET_UNIT;
}

/* Gives `give` (whole requests/s) of class c to the members' demand of
 * priority p, max-min fair (water-filling: each gets min(its demand, a
 * level), the level such that all of give is given; a member asking less
 * than an even share gets all it asks), then in whole requests. Returns
 * what was given. */
static long long split_class(struct alloc_work *w, int p, int c, long long want,
                             long long give, int floor)
{
    long long left = give < want ? give : 0;
    size_t k = 0;
    for (size_t m = 0; m < w->n; m++) {
        long long dm = demand_left(w, m, p, c);
        w->got[m] = give >= want ? dm : 0;
        k += dm > 0;
    }
    while (k > 0 && left >= (long long)k) {
        long long level = left / (long long)k;
        for (size_t m = 0; m < w->n; m++) {
            long long short_by = demand_left(w, m, p, c) - w->got[m];
            if (short_by <= 0)
                continue;
            long long g = short_by < level ? short_by : level;
            w->got[m] += g;
            left -= g;
            k -= g == short_by;
        }
    }
    long long given = quantize(w, give / BUDGET_UNIT);
    for (size_t m = 0; m < w->n; m++) {
        w->t[m].class_mrps[c] += w->got[m];
        if (floor)
            w->floor_c[m * BUDGET_CLASS_COUNT + c] += w->got[m];
    }
    CHARGED_ASSERT(given <= give);
    return given;
}

/* v rounded up to whole requests/s. */
static long long ceil_unit(long long v)
{
    return (v + BUDGET_UNIT - 1) / BUDGET_UNIT * BUDGET_UNIT;
}

/* Each class's give scaled down together to budget, in whole requests/s,
 * the units the rounding left one each to classes still short. */
static void scale_to(long long give[BUDGET_CLASS_COUNT], long long sum,
                     long long budget)
{
    long long full[BUDGET_CLASS_COUNT], scaled = 0;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        full[c] = give[c];
        give[c] = give[c] * budget / sum / BUDGET_UNIT * BUDGET_UNIT;
        scaled += give[c];
    }
    for (int c = 0; c < BUDGET_CLASS_COUNT && scaled < budget; c++) {
        if (give[c] < full[c]) {
            give[c] += BUDGET_UNIT;
            scaled += BUDGET_UNIT;
        }
    }
    CHARGED_ASSERT(scaled <= budget);
}

/* Serves priority p within `budget` of the global room (-1: the whole
 * room): each class's demand up to its class room, scaled down together
 * when their sum passes the budget, in whole requests/s (rounded up while
 * the room allows: the rooms are whole). floor: the audit floor's pass;
 * without a global limit the floor is `budget` on each limited class (a
 * class without a limit needs none). */
static void grant_priority(struct alloc_work *w, int p, long long budget, int floor)
{
    long long want[BUDGET_CLASS_COUNT], give[BUDGET_CLASS_COUNT], sum = 0;
    int limited = w->g_lim;
    CHARGED_ASSERT(!floor || budget >= 0);
    if (limited && (budget < 0 || budget > w->room_g))
        budget = w->room_g;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        want[c] = 0;
        for (size_t m = 0; m < w->n; m++)
            want[c] += demand_left(w, m, p, c);
        give[c] = ceil_unit(want[c]);
        if (w->c_lim[c] && give[c] > w->room_c[c])
            give[c] = w->room_c[c];
        if ((limited || (floor && w->c_lim[c])) && give[c] > budget)
            give[c] = budget;
        if (floor && !limited && !w->c_lim[c])
            give[c] = 0;
        sum += give[c];
    }
    if (limited && sum > budget)
        scale_to(give, sum, budget);
    sum = 0;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        if (give[c] == 0)
            continue;
        long long given = split_class(w, p, c, want[c], give[c], floor);
        if (w->c_lim[c])
            w->room_c[c] -= given;
        sum += given;
    }
    if (limited)
        w->room_g -= sum;
    CHARGED_ASSERT(!limited || w->room_g >= 0);
}

static int has_demand(const struct budget_demand *d, int cls)
{
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++)
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
            if ((cls < 0 || c == cls) && d->mrps[p][c] > 0)
                return 1;
    return 0;
}

/* Splits `room` evenly among the members with demand on class cls (any
 * class: cls -1), or among all when none has; adds it to their class
 * share (cls >= 0) or global one. */
static void split_leftover(struct alloc_work *w, int cls, long long room)
{
    size_t k = 0, any = 0;
    for (size_t m = 0; m < w->n; m++)
        k += (size_t)has_demand(&w->d[m], cls);
    any = k == 0;
    if (any)
        k = w->n;
    if (k == 0 || room <= 0)
        return;
    long long units = room / BUDGET_UNIT; /* whole requests/s, as every share */
    long long each = units / (long long)k * BUDGET_UNIT, rest = units % (long long)k;
    for (size_t m = 0; m < w->n; m++) {
        if (!any && !has_demand(&w->d[m], cls))
            continue;
        long long add = each + (rest > 0 ? BUDGET_UNIT : 0);
        rest -= rest > 0;
        if (cls < 0)
            w->t[m].global_mrps += add;
        else
            w->t[m].class_mrps[cls] += add;
    }
}

static void work_begin(struct alloc_work *w, const struct budget_settings *s)
{
    w->g_lim = s->global_rps > 0;
    w->room_g = s->global_rps * 1000;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        w->c_lim[c] = s->class_rps[c] > 0;
        w->room_c[c] = s->class_rps[c] * 1000;
    }
    memset(w->t, 0, w->n * sizeof(*w->t));
}

/* The priorities' grants become the targets: global = the sum of a
 * member's class grants plus its part of the global leftover; a class
 * without a limit is BUDGET_UNLIMITED, and so is every share when there is
 * no global limit. */
static void work_finish(struct alloc_work *w)
{
    for (size_t m = 0; m < w->n; m++) {
        long long sum = 0, floor = 0;
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            sum += w->t[m].class_mrps[c];
            floor += w->floor_c[m * BUDGET_CLASS_COUNT + c];
        }
        w->t[m].global_mrps = w->g_lim ? sum : BUDGET_UNLIMITED;
        w->t[m].floor_mrps = floor;
    }
    if (w->g_lim)
        split_leftover(w, -1, w->room_g);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        if (w->c_lim[c])
            split_leftover(w, c, w->room_c[c]);
        else
            for (size_t m = 0; m < w->n; m++)
                w->t[m].class_mrps[c] = BUDGET_UNLIMITED;
    }
}

int budget_alloc_targets(const struct budget_settings *s,
                         const struct budget_demand *demands, size_t n,
                         struct budget_share *targets, const char **why)
{
    struct alloc_work w = {.d = demands, .n = n, .t = targets};
    CHARGED_ASSERT(s != NULL && why != NULL && (n == 0 || (demands && targets)));
    if (n > BUDGET_MEMBERS_MAX) {
        *why = "too many members";
        goto refused;
    }
    if (budget_settings_check(s, why) != 0)
        goto refused;
    for (size_t m = 0; m < n; m++)
        if (budget_demand_check(&demands[m], why) != 0)
            goto refused;
    if (n == 0)
        return 0;
    w.floor_c = calloc(n * BUDGET_CLASS_COUNT, sizeof(*w.floor_c));
    w.got = calloc(2 * n, sizeof(*w.got)); /* and the fractions */
    if (!w.floor_c || !w.got) {
        free(w.floor_c);
        free(w.got);
        *why = "out of memory";
        goto refused;
    }
    work_begin(&w, s);
    /* The floor: of the global limit when one is set, else of each class
     * limit (the lowest priority never starves on a limited class). */
    if (s->audit_floor_rps > 0)
        grant_priority(&w, BUDGET_PRIO_AUDIT, s->audit_floor_rps * 1000, 1);
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++)
        grant_priority(&w, p, -1, 0);
    work_finish(&w);
    free(w.floor_c);
    free(w.got);
    return 0;
refused:
    if (n > 0 && targets)
        memset(targets, 0, n * sizeof(*targets));
    return -1;
}

static int view_by_id(const void *a, const void *b)
{
    const struct budget_member_view *x = *(const struct budget_member_view *const *)a;
    const struct budget_member_view *y = *(const struct budget_member_view *const *)b;
    return strcmp(x->id, y->id);
}

unsigned long long budget_alloc_rotation(long long db_ms)
{
    return db_ms > 0 ? (unsigned long long)(db_ms / BUDGET_ROTATE_MS) : 0;
}

int budget_alloc_member_target(const struct budget_settings *s,
                               const struct budget_member_view *members, size_t n,
                               size_t own, unsigned long long rotation,
                               struct budget_share *target, const char **why)
{
    const struct budget_member_view **by_id = NULL;
    struct budget_demand *d = NULL;
    struct budget_share *t = NULL;
    size_t me = n;
    int rc = -1;
    CHARGED_ASSERT(s != NULL && members != NULL && target != NULL && why != NULL);
    CHARGED_ASSERT(own < n);
    budget_share_zero(target);
    if (n > BUDGET_MEMBERS_MAX) {
        *why = "too many members";
        return -1;
    }
    by_id = malloc(n * sizeof(*by_id));
    d = malloc(n * sizeof(*d));
    t = malloc(n * sizeof(*t));
    if (!by_id || !d || !t) {
        *why = "out of memory";
        goto out;
    }
    for (size_t m = 0; m < n; m++)
        by_id[m] = &members[m];
    qsort(by_id, n, sizeof(*by_id), view_by_id);
    size_t first = (size_t)(rotation % n);
    for (size_t m = 0; m < n; m++) {
        CHARGED_ASSERT(m == 0 || strcmp(by_id[m - 1]->id, by_id[m]->id) < 0);
        size_t at = (m + n - first) % n; /* by_id[first] goes first */
        d[at] = by_id[m]->demand;
        if (by_id[m] == &members[own])
            me = at;
    }
    CHARGED_ASSERT(me < n);
    if ((rc = budget_alloc_targets(s, d, n, t, why)) == 0)
        *target = t[me];
out:
    free(by_id);
    free(d);
    free(t);
    return rc;
}

/* One held value bounded to what a member under limit_rps can hold. */
static long long bound_one(long long limit_rps, long long v)
{
    long long max = limit_rps * BUDGET_UNIT;
    if (limit_rps == 0)
        return BUDGET_UNLIMITED; /* no limit: a hold bounds nothing */
    if (v == BUDGET_UNLIMITED || v > max)
        return max;
    return v < 0 ? 0 : v;
}

void budget_share_spendable(const struct budget_settings *s, struct budget_share *held)
{
    CHARGED_ASSERT(s != NULL && held != NULL);
    if (s->global_rps == 1 && held->global_mrps > BUDGET_ONE_RPS_MRPS)
        held->global_mrps = BUDGET_ONE_RPS_MRPS;
    if (held->floor_mrps > held->global_mrps && held->global_mrps != BUDGET_UNLIMITED)
        held->floor_mrps = held->global_mrps;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        if (s->class_rps[c] == 1 && held->class_mrps[c] > BUDGET_ONE_RPS_MRPS)
            held->class_mrps[c] = BUDGET_ONE_RPS_MRPS;
}

void budget_share_bound(const struct budget_settings *s, struct budget_share *held)
{
    CHARGED_ASSERT(s != NULL && held != NULL);
    held->global_mrps = bound_one(s->global_rps, held->global_mrps);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        held->class_mrps[c] = bound_one(s->class_rps[c], held->class_mrps[c]);
    long long floor_max =
        s->global_rps ? s->global_rps * BUDGET_UNIT : BUDGET_DEMAND_MAX_MRPS;
    if (held->floor_mrps < 0)
        held->floor_mrps = 0;
    else if (held->floor_mrps > floor_max)
        held->floor_mrps = floor_max;
    CHARGED_ASSERT(held->floor_mrps >= 0 && held->global_mrps >= BUDGET_UNLIMITED);
}

void budget_demand_bound(struct budget_demand *d)
{
    CHARGED_ASSERT(d != NULL);
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++)
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            long long *v = &d->mrps[p][c];
            *v = *v < 0 ? 0 : *v > BUDGET_DEMAND_MAX_MRPS ? BUDGET_DEMAND_MAX_MRPS : *v;
        }
    const char *why;
    CHARGED_ASSERT(budget_demand_check(d, &why) == 0);
}

void budget_share_zero(struct budget_share *s)
{
    CHARGED_ASSERT(s != NULL);
    memset(s, 0, sizeof(*s));
}

static long long add_one(long long a, long long b)
{
    return a == BUDGET_UNLIMITED || b == BUDGET_UNLIMITED ? BUDGET_UNLIMITED : a + b;
}

void budget_share_add(struct budget_share *others, const struct budget_share *one)
{
    CHARGED_ASSERT(others != NULL && one != NULL);
    others->global_mrps = add_one(others->global_mrps, one->global_mrps);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        others->class_mrps[c] = add_one(others->class_mrps[c], one->class_mrps[c]);
    others->floor_mrps += one->floor_mrps;
}

/* One limit's two-phase take: min(target, limit - others), >= 0. */
static long long take_one(long long limit_rps, long long target, long long others)
{
    if (limit_rps == 0)
        return target;
    if (others == BUDGET_UNLIMITED)
        return 0; /* a holder from before the limit was set still has it all */
    long long room = limit_rps * 1000 - others;
    long long v = target == BUDGET_UNLIMITED || target > room ? room : target;
    return v < 0 ? 0 : v;
}

void budget_alloc_take(const struct budget_settings *s,
                       const struct budget_share *target,
                       const struct budget_share *others, struct budget_share *held)
{
    CHARGED_ASSERT(s != NULL && target != NULL && others != NULL && held != NULL);
    held->global_mrps =
        take_one(s->global_rps, target->global_mrps, others->global_mrps);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        held->class_mrps[c] =
            take_one(s->class_rps[c], target->class_mrps[c], others->class_mrps[c]);
    held->floor_mrps = target->floor_mrps;
    if (held->global_mrps != BUDGET_UNLIMITED && held->floor_mrps > held->global_mrps)
        held->floor_mrps = held->global_mrps;
    CHARGED_ASSERT(held->floor_mrps >= 0);
}

static int within_one(long long limit_rps, long long sum)
{
    return limit_rps == 0 || (sum != BUDGET_UNLIMITED && sum <= limit_rps * 1000);
}

int budget_alloc_within(const struct budget_settings *s, const struct budget_share *sum)
{
    CHARGED_ASSERT(s != NULL && sum != NULL);
    if (!within_one(s->global_rps, sum->global_mrps))
        return 0;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        if (!within_one(s->class_rps[c], sum->class_mrps[c]))
            return 0;
    return 1;
}
