#include "batch_gate.h"

#include "charged_assert.h"

void batch_gate_init(struct batch_gate *g, int64_t hold_ms, size_t full)
{
    CHARGED_ASSERT(g != NULL && hold_ms >= 0 && full > 0);
    *g = (struct batch_gate){.hold_ms = hold_ms, .full = full};
}

int64_t batch_gate_due_at(const struct batch_gate *g, size_t waiting, int64_t now)
{
    CHARGED_ASSERT(g != NULL);
    if (waiting == 0)
        return INT64_MAX;
    /* Nothing ran within a hold: the stage is idle, the item goes now (a
     * clock behind the last run holds nothing either). */
    if (!g->ran || g->hold_ms == 0 || waiting >= g->full || now < g->last_ms ||
        now - g->last_ms >= g->hold_ms)
        return now;
    int64_t at = g->last_ms + g->hold_ms;
    CHARGED_ASSERT(at > now && at - now <= g->hold_ms);
    return at;
}

int64_t batch_gate_holds_until(const struct batch_gate *g, int64_t now)
{
    CHARGED_ASSERT(g != NULL);
    if (!g->ran || g->hold_ms == 0 || now < g->last_ms ||
        now - g->last_ms >= g->hold_ms)
        return now;
    return g->last_ms + g->hold_ms;
}

void batch_gate_ran(struct batch_gate *g, int64_t now)
{
    CHARGED_ASSERT(g != NULL);
    g->last_ms = now;
    g->ran = 1;
}
