#include "budget_gate.h"

#include <string.h>

#include "charged_assert.h"

/* One request, in the buckets' unit. */
#define ONE 1000000LL
/* Past this, a bucket is full whatever its rate: it bounds the product. */
#define ELAPSED_MAX_MS 60000LL

static void bucket_fill(struct budget_bucket *b, long long elapsed_ms)
{
    if (b->rate_mrps <= 0)
        return;
    if (elapsed_ms > ELAPSED_MAX_MS)
        elapsed_ms = ELAPSED_MAX_MS;
    b->tokens += b->rate_mrps * elapsed_ms;
    if (b->tokens > b->cap)
        b->tokens = b->cap;
}

static void bucket_set(struct budget_bucket *b, long long rate_mrps)
{
    CHARGED_ASSERT(rate_mrps >= 0 || rate_mrps == BUDGET_UNLIMITED);
    b->rate_mrps = rate_mrps;
    if (rate_mrps <= 0) {
        b->cap = 0;
    } else {
        b->cap = rate_mrps * BUDGET_GATE_BURST_MS;
        if (b->cap < ONE)
            b->cap = ONE;
    }
    if (b->tokens > b->cap)
        b->tokens = b->cap;
}

/* Whether the bucket holds n requests (unlimited: always). */
static int bucket_has(const struct budget_bucket *b, long long n)
{
    return b->rate_mrps == BUDGET_UNLIMITED || b->tokens >= n * ONE;
}

/* ms until the bucket holds n requests; BUDGET_GATE_WAIT_MAX_MS without a
 * rate. */
static long long bucket_wait(const struct budget_bucket *b, long long n)
{
    if (bucket_has(b, n))
        return 0;
    if (b->rate_mrps <= 0)
        return BUDGET_GATE_WAIT_MAX_MS;
    long long need = n * ONE - b->tokens;
    return (need + b->rate_mrps - 1) / b->rate_mrps;
}

static void bucket_take(struct budget_bucket *b)
{
    if (b->rate_mrps == BUDGET_UNLIMITED)
        return;
    CHARGED_ASSERT(b->tokens >= ONE);
    b->tokens -= ONE;
}

static void gate_fill(struct budget_gate *g, long long now_ms)
{
    long long elapsed = now_ms - g->last_ms;
    if (elapsed <= 0)
        return; /* a clock that went back fills nothing */
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        bucket_fill(&g->cls[c], elapsed);
    bucket_fill(&g->global, elapsed);
    bucket_fill(&g->floor, elapsed);
    g->last_ms = now_ms;
}

void budget_gate_init(struct budget_gate *g, long long now_ms)
{
    CHARGED_ASSERT(g != NULL);
    memset(g, 0, sizeof(*g));
    g->last_ms = now_ms;
    g->valid_until_ms = now_ms;
}

void budget_gate_set_share(struct budget_gate *g, const struct budget_share *share,
                           long long valid_until_ms, long long now_ms)
{
    CHARGED_ASSERT(g != NULL && share != NULL);
    gate_fill(g, now_ms); /* what the old rates earned until now */
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        bucket_set(&g->cls[c], share->class_mrps[c]);
    /* The floor is the audit's alone: the others share the rest. */
    long long floor = share->floor_mrps, global = share->global_mrps;
    if (global != BUDGET_UNLIMITED) {
        if (floor > global)
            floor = global;
        global -= floor;
    }
    bucket_set(&g->global, global);
    bucket_set(&g->floor, floor);
    g->valid_until_ms = valid_until_ms;
}

/* How many requests the waiters above priority p would take first: on
 * class c (cls 1) or on the global bucket (cls 0: every class whose own
 * bucket could let its waiters through). */
static long long waiting_above(const struct budget_gate *g, int p, int c, int cls)
{
    long long n = 0;
    for (int q = 0; q < p; q++) {
        if (cls) {
            n += g->waiting[q][c];
            continue;
        }
        for (int k = 0; k < BUDGET_CLASS_COUNT; k++)
            if (bucket_has(&g->cls[k], 1))
                n += g->waiting[q][k];
    }
    return n;
}

static long long wait_of(const struct budget_gate *g, int c, long long n_cls,
                         long long n_global)
{
    long long w = bucket_wait(&g->cls[c], n_cls),
              wg = bucket_wait(&g->global, n_global);
    if (wg > w)
        w = wg;
    if (w < 1)
        w = 1; /* tokens there but owed to waiters above: ask again soon */
    return w > BUDGET_GATE_WAIT_MAX_MS ? BUDGET_GATE_WAIT_MAX_MS : w;
}

long long budget_gate_ask(struct budget_gate *g, struct budget_ticket *t,
                          long long now_ms)
{
    CHARGED_ASSERT(g != NULL && t != NULL);
    CHARGED_ASSERT((unsigned)t->cls < BUDGET_CLASS_COUNT &&
                   (unsigned)t->prio < BUDGET_PRIO_COUNT);
    int c = (int)t->cls, p = (int)t->prio;
    long long wait;

    gate_fill(g, now_ms);
    if (now_ms >= g->valid_until_ms) {
        wait = BUDGET_GATE_WAIT_MAX_MS; /* no lease: nothing is ours to spend */
        goto refused;
    }
    /* An audit request with a floor token goes ahead of every waiter. */
    if (p == BUDGET_PRIO_AUDIT && g->floor.rate_mrps > 0 && bucket_has(&g->floor, 1) &&
        bucket_has(&g->cls[c], 1)) {
        bucket_take(&g->floor);
        bucket_take(&g->cls[c]);
        budget_gate_forget(g, t);
        return 0;
    }
    long long n_cls = 1 + waiting_above(g, p, c, 1);
    long long n_global = 1 + waiting_above(g, p, c, 0);
    if (!bucket_has(&g->cls[c], n_cls) || !bucket_has(&g->global, n_global)) {
        wait = wait_of(g, c, n_cls, n_global);
        if (p == BUDGET_PRIO_AUDIT && g->floor.rate_mrps > 0) {
            long long wf = bucket_wait(&g->floor, 1), wc = bucket_wait(&g->cls[c], 1);
            wf = wf > wc ? wf : wc;
            wait = wf >= 1 && wf < wait ? wf : wait; /* the floor's token comes first */
        }
        goto refused;
    }
    bucket_take(&g->cls[c]);
    bucket_take(&g->global);
    budget_gate_forget(g, t);
    return 0;
refused:
    if (!t->waiting) {
        t->waiting = 1;
        g->waiting[p][c]++;
    }
    CHARGED_ASSERT(wait >= 1 && wait <= BUDGET_GATE_WAIT_MAX_MS);
    return wait;
}

/* Takes n requests whatever the bucket holds (a debt the fill pays back
 * before the next token). */
static void bucket_charge(struct budget_bucket *b, int n)
{
    if (b->rate_mrps == BUDGET_UNLIMITED)
        return;
    long long before = b->tokens;
    b->tokens -= (long long)n * ONE;
    CHARGED_ASSERT(b->tokens <= before);
}

void budget_gate_charge(struct budget_gate *g, enum budget_class cls, int n,
                        long long now_ms)
{
    CHARGED_ASSERT(g != NULL && (unsigned)cls < BUDGET_CLASS_COUNT);
    CHARGED_ASSERT(n >= 0 && n <= BUDGET_GATE_CHARGE_MAX);
    gate_fill(g, now_ms); /* what the rates earned until the arrival */
    bucket_charge(&g->cls[cls], n);
    bucket_charge(&g->global, n);
}

void budget_gate_forget(struct budget_gate *g, struct budget_ticket *t)
{
    CHARGED_ASSERT(g != NULL && t != NULL);
    if (!t->waiting)
        return;
    CHARGED_ASSERT(g->waiting[t->prio][t->cls] > 0);
    g->waiting[t->prio][t->cls]--;
    t->waiting = 0;
}
