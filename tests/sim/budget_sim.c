/* budget-sim: the fleet's provider budget simulated millisecond by
 * millisecond, from one seed: members joining, leaving, dying, their demand
 * shifting, the global limit changed from 100 to 40 and back. It links the
 * real allocation and gate (charged_budget_core) and models only the
 * database of budget_lease.c (one refresh at a time, as the row lock makes
 * them: the live members' demands and shares, the two-phase take, the
 * lease) and the members' requests (arrivals at their demand, each sent
 * when the member's gate lets it).
 *
 * Checked, exit 1 on a violation:
 * - every simulated second [k, k+1), the requests the fleet sent stay
 *   within the global limit and every class's limit in force (after a
 *   lowered limit: the old one for at most FOLLOW_MS, the new one after),
 *   plus what the members' buckets hold (burst_of);
 * - at every millisecond, the shares the live members hold (in the model
 *   database) sum within the limits (the old ones for FOLLOW_MS after a
 *   change down);
 * - a change is followed within FOLLOW_MS (the held sum within a lowered
 *   limit; at least 95% of a raised one taken);
 * - a member that dies holding a share keeps it from the others for at
 *   most its lease plus one refresh period (its lease ends at most
 *   LEASE_MS after its last refresh; each other member takes its part at
 *   its next refresh).
 * It prints the per-second series and what it measured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget_alloc.h"
#include "budget_gate.h"

#define MEMBERS    6
#define END_MS     45000
#define LEASE_MS   1000
#define REFRESH_MS 250
#define FOLLOW_MS  2000
#define SECONDS    (END_MS / 1000)

enum life { LIFE_OUT, LIFE_LIVE, LIFE_DEAD };

struct member {
    enum life life;
    struct budget_demand demand; /* what it reports and receives */
    long long pending[BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT]; /* in mrps-ms */
    long long next_ask[BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT];
    struct budget_ticket ticket[BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT];
    struct budget_gate gate;
    long long next_refresh;
    /* Its row in the model database. */
    int row;
    struct budget_share held;
    long long expires_at;
};

struct world {
    unsigned long long rng;
    long long now;
    struct budget_settings s, old; /* old: in force until change + FOLLOW_MS */
    long long changed_at, follow_ms;
    int raised;
    struct member m[MEMBERS];
    long long sent[SECONDS], sent_cls[SECONDS][BUDGET_CLASS_COUNT];
    long long limit_at[SECONDS];
    long long died_at, dead_share, dead_cost_ms;
    int violations;
};

static unsigned rnd(struct world *w, unsigned n)
{
    w->rng = w->rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (unsigned)((w->rng >> 33) % n);
}

static void violation(struct world *w, const char *what, long long got, long long limit)
{
    if (w->violations++ < 10)
        fprintf(stderr, "budget-sim: at %lld ms: %s %lld > %lld\n", w->now, what, got,
                limit);
}

/* The two-phase refresh of member i, as budget_lease_refresh does it: the
 * live members (their ids: "m<slot>") and itself, the allocation in id order
 * rotated by the clock (budget_alloc_member_target, as every member computes
 * it). */
static void refresh(struct world *w, int i)
{
    struct budget_member_view v[MEMBERS];
    struct budget_share target, others;
    int n = 0, me = -1;
    const char *why;
    budget_share_zero(&others);
    for (int k = 0; k < MEMBERS; k++) {
        struct member *o = &w->m[k];
        if (k != i && !o->row)
            continue;
        if (k != i && o->expires_at <= w->now) {
            o->row = 0; /* deleted by this refresh */
            continue;
        }
        if (k == i)
            me = n;
        else
            budget_share_add(&others, &o->held);
        snprintf(v[n].id, sizeof(v[n].id), "m%d", k);
        v[n++].demand = o->demand;
    }
    /* The rotation from the world's clock, read once per refresh as a
     * member reads the database's: members that refresh either side of a
     * rotation disagree for a refresh, and the take keeps them within. */
    if (budget_alloc_member_target(&w->s, v, (size_t)n, (size_t)me,
                                   budget_alloc_rotation(w->now), &target, &why) != 0) {
        fprintf(stderr, "budget-sim: allocation refused: %s\n", why);
        exit(2);
    }
    struct member *m = &w->m[i];
    budget_alloc_take(&w->s, &target, &others, &m->held);
    m->row = 1;
    m->expires_at = w->now + LEASE_MS;
    struct budget_share spend = m->held;
    budget_share_spendable(&w->s, &spend);
    budget_gate_set_share(&m->gate, &spend, w->now + LEASE_MS, w->now);
    m->next_refresh = w->now + REFRESH_MS - 50 + rnd(w, 101);
}

static void join(struct world *w, int i)
{
    struct member *m = &w->m[i];
    struct budget_demand d = m->demand;
    memset(m, 0, sizeof(*m));
    m->demand = d;
    m->life = LIFE_LIVE;
    budget_gate_init(&m->gate, w->now);
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++) {
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            m->ticket[p][c].cls = (enum budget_class)c;
            m->ticket[p][c].prio = (enum budget_priority)p;
        }
    }
    refresh(w, i);
}

/* Arrivals at the member's demand, and each pending request asking the
 * gate when its wait is over. */
static void member_step(struct world *w, int i)
{
    struct member *m = &w->m[i];
    int sec = (int)(w->now / 1000);
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++) {
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            long long *pend = &m->pending[p][c];
            *pend += m->demand.mrps[p][c];
            if (*pend > m->demand.mrps[p][c] * 2000)
                *pend = m->demand.mrps[p][c] * 2000; /* a backlog of 2 s */
            while (*pend >= 1000000 && w->now >= m->next_ask[p][c]) {
                long long wait = budget_gate_ask(&m->gate, &m->ticket[p][c], w->now);
                if (wait > 0) {
                    m->next_ask[p][c] = w->now + wait;
                    break;
                }
                *pend -= 1000000;
                w->sent[sec]++;
                w->sent_cls[sec][c]++;
            }
        }
    }
    if (w->now >= m->next_refresh)
        refresh(w, i);
}

/* The limits in force for a check at now: after a change, the looser of
 * the old and the new for FOLLOW_MS. */
static long long limit_of(const struct world *w, long long s_now, long long s_old,
                          long long at)
{
    long long lim = s_now;
    if (at < w->changed_at + FOLLOW_MS && (s_old == 0 || (s_now && s_old > s_now)))
        lim = s_old;
    return lim;
}

static void check_held(struct world *w)
{
    struct budget_share sum;
    budget_share_zero(&sum);
    for (int k = 0; k < MEMBERS; k++)
        if (w->m[k].row && w->m[k].expires_at > w->now)
            budget_share_add(&sum, &w->m[k].held);
    long long g = limit_of(w, w->s.global_rps, w->old.global_rps, w->now);
    if (g && (sum.global_mrps < 0 || sum.global_mrps > g * 1000))
        violation(w, "held global (mrps)", sum.global_mrps, g * 1000);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        long long l = limit_of(w, w->s.class_rps[c], w->old.class_rps[c], w->now);
        if (l && (sum.class_mrps[c] < 0 || sum.class_mrps[c] > l * 1000))
            violation(w, "held class (mrps)", sum.class_mrps[c], l * 1000);
    }
    /* Following a change: measured once. */
    if (w->follow_ms < 0 && w->now >= w->changed_at && w->changed_at > 0) {
        long long lim = w->s.global_rps * 1000;
        if (w->raised ? sum.global_mrps >= lim * 95 / 100 : sum.global_mrps <= lim)
            w->follow_ms = w->now - w->changed_at;
    }
    /* The dead member's share, idle until the others took it back. */
    if (w->died_at > 0 && w->dead_cost_ms < 0 &&
        sum.global_mrps >= w->s.global_rps * 1000 * 95 / 100 &&
        !(w->m[2].row && w->m[2].expires_at > w->now))
        w->dead_cost_ms = w->now - w->died_at;
}

static void set_demand(struct world *w, int i, int p, int c, long long rps)
{
    w->m[i].demand.mrps[p][c] = rps * 1000;
}

static void change_limit(struct world *w, long long global)
{
    w->old = w->s;
    w->raised = global > w->s.global_rps;
    w->s.global_rps = global;
    w->changed_at = w->now;
    w->follow_ms = -1;
}

/* The script: who joins, leaves, dies, and when the demand and the limit
 * change. follow[0], [1]: the measured follow of the change down, up. */
static void script(struct world *w, long long follow[2])
{
    switch (w->now) {
    case 0:
        join(w, 0);
        join(w, 1);
        join(w, 2);
        break;
    case 5000:
        join(w, 3);
        break;
    case 10000:
        w->m[1].life = LIFE_OUT; /* a clean exit: its row deleted */
        w->m[1].row = 0;
        break;
    case 15000:
        w->m[2].life = LIFE_DEAD; /* killed: its row stays until its lease */
        w->died_at = w->now;
        w->dead_share = w->m[2].held.global_mrps;
        w->dead_cost_ms = -1;
        join(w, 1); /* and one comes back, to take its place */
        break;
    case 20000:
        set_demand(w, 0, BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 5);
        join(w, 4);
        break;
    case 25000:
        change_limit(w, 40);
        break;
    case 27000:
        follow[0] = w->follow_ms;
        break;
    case 35000:
        change_limit(w, 100);
        break;
    case 37000:
        follow[1] = w->follow_ms;
        break;
    }
}

static void setup(struct world *w, unsigned long long seed)
{
    memset(w, 0, sizeof(*w));
    w->rng = seed * 2654435761ULL + 1;
    w->s.global_rps = 100;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        w->s.class_rps[c] = 25;
    w->s.class_rps[BUDGET_CLASS_SEARCH] = 20;
    w->s.audit_floor_rps = 2;
    w->old = w->s;
    w->follow_ms = 0;
    /* Two workers charging, a reconciler looking up, an auditor walking,
     * and a worker capturing (joins at 20 s). */
    set_demand(w, 0, BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 40);
    set_demand(w, 1, BUDGET_PRIO_CHARGE, BUDGET_CLASS_CREATE, 40);
    set_demand(w, 1, BUDGET_PRIO_REFUND, BUDGET_CLASS_REFUND, 5);
    set_demand(w, 2, BUDGET_PRIO_LOOKUP, BUDGET_CLASS_RETRIEVE, 30);
    set_demand(w, 2, BUDGET_PRIO_LOOKUP, BUDGET_CLASS_SEARCH, 20);
    set_demand(w, 3, BUDGET_PRIO_AUDIT, BUDGET_CLASS_LIST, 30);
    set_demand(w, 4, BUDGET_PRIO_CAPTURE, BUDGET_CLASS_CAPTURE, 60);
}

/* What the members' buckets may hold at once under a limit of rps: a
 * second may carry that over its rate (BUDGET_GATE_BURST_MS of each share,
 * at least one request a member), which the provider's bucket of rps
 * takes. */
static long long burst_of(long long rps)
{
    return rps * BUDGET_GATE_BURST_MS / 1000 + MEMBERS;
}

/* The per-second checks and series: a window may use the old limit for
 * FOLLOW_MS after a change down, the new one after. */
static void seconds(struct world *w, int quiet)
{
    for (int k = 0; k < SECONDS; k++) {
        long long g = w->limit_at[k];
        for (int back = 1; back <= FOLLOW_MS / 1000 && k - back >= 0; back++)
            if (w->limit_at[k - back] > g)
                g = w->limit_at[k - back];
        w->now = k * 1000LL; /* for the messages */
        if (w->sent[k] > g + burst_of(g))
            violation(w, "sent in the second from here", w->sent[k], g + burst_of(g));
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            long long l = w->s.class_rps[c];
            if (w->sent_cls[k][c] > l + burst_of(l))
                violation(w, budget_class_name((enum budget_class)c), w->sent_cls[k][c],
                          l + burst_of(l));
        }
        if (!quiet)
            printf("t=%2ds limit=%3lld sent=%3lld\n", k, w->limit_at[k], w->sent[k]);
    }
}

int main(int argc, char **argv)
{
    unsigned long long seed = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    int quiet = argc > 2 && !strcmp(argv[2], "--quiet");
    static struct world w;
    long long follow[2] = {-1, -1};
    setup(&w, seed);
    for (w.now = 0; w.now < END_MS; w.now++) {
        script(&w, follow);
        if (w.now % 1000 == 0)
            w.limit_at[w.now / 1000] = w.s.global_rps;
        for (int i = 0; i < MEMBERS; i++)
            if (w.m[i].life == LIFE_LIVE)
                member_step(&w, i);
        check_held(&w);
    }
    seconds(&w, quiet);
    if (follow[0] < 0 || follow[0] > FOLLOW_MS)
        violation(&w, "following 100 -> 40 (ms)", follow[0], FOLLOW_MS);
    if (follow[1] < 0 || follow[1] > FOLLOW_MS)
        violation(&w, "following 40 -> 100 (ms)", follow[1], FOLLOW_MS);
    if (w.dead_cost_ms < 0 || w.dead_cost_ms > LEASE_MS + REFRESH_MS + 50)
        violation(&w, "the dead member's share idle (ms)", w.dead_cost_ms,
                  LEASE_MS + REFRESH_MS + 50);
    printf(
        "seed %llu: 100->40 followed in %lld ms, 40->100 in %lld ms; the dead member's"
        " %lld.%03lld req/s idle for %lld ms (lease %d ms); %d violations\n",
        seed, follow[0], follow[1], w.dead_share / 1000, w.dead_share % 1000,
        w.dead_cost_ms, LEASE_MS, w.violations);
    return w.violations ? 1 : 0;
}
