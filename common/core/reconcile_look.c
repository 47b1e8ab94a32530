#include "reconcile_look.h"

#include <stddef.h>
#include <string.h>

#include "charged_assert.h"

/* What differs between the kinds of look: the order of evidence, and the
 * name of each call it asks for (NULL: never asked of that kind). */
static const struct reconcile_order kinds[] = {
    [RECONCILE_KIND_CHARGE] = {reconcile_policy_decide,
                               {[RECONCILE_RETRIEVE] = "retrieve",
                                [RECONCILE_SEARCH] = "search",
                                [RECONCILE_SEARCH_OTHERS] = "search",
                                [RECONCILE_CHARGE] = "charge",
                                [RECONCILE_LIST] = "list"}},
    /* No search of refunds exists. */
    [RECONCILE_KIND_REFUND] = {reconcile_policy_decide_refund,
                               {[RECONCILE_RETRIEVE] = "retrieve_refund",
                                [RECONCILE_CHARGE] = "refund",
                                [RECONCILE_LIST] = "list_refunds"}},
};
_Static_assert(sizeof(kinds) / sizeof(kinds[0]) == RECONCILE_KIND__COUNT,
               "one row per kind");

void reconcile_look_begin(struct reconcile_look *l, enum reconcile_kind kind,
                          const struct reconcile_limits *lim,
                          const struct reconcile_attempt *a, long long claimed_at)
{
    CHARGED_ASSERT(l && lim && a && a->id);
    CHARGED_ASSERT((unsigned)kind < RECONCILE_KIND__COUNT);
    /* A refund is looked at on its charge's intent, a charge on its own. */
    CHARGED_ASSERT((kind == RECONCILE_KIND_REFUND) == (a->object != NULL));
    reconcile_look_begin_order(l, &kinds[kind], lim, a, claimed_at);
    l->kind = kind;
}

void reconcile_look_begin_order(struct reconcile_look *l,
                                const struct reconcile_order *order,
                                const struct reconcile_limits *lim,
                                const struct reconcile_attempt *a, long long claimed_at)
{
    CHARGED_ASSERT(l && order && order->decide && lim && a && a->id);
    memset(l, 0, sizeof(*l));
    l->kind = RECONCILE_KIND__COUNT;
    l->order = order;
    l->lim = *lim;
    l->a = *a;
    l->claimed_at = claimed_at;
}

/* The evidence a call's answer becomes. */
static const struct provider_result **slot_of(struct reconcile_evidence *e,
                                              enum reconcile_next next)
{
    switch (next) {
    case RECONCILE_RETRIEVE:
    case RECONCILE_SEARCH:
        return &e->lookup;
    case RECONCILE_SEARCH_OTHERS:
        return &e->search;
    case RECONCILE_CHARGE:
        return &e->charge;
    case RECONCILE_LIST:
        return &e->list;
    case RECONCILE_SETTLE:
        break;
    }
    CHARGED_ASSERT(!"a call has a slot");
    return NULL;
}

void reconcile_look_step(struct reconcile_look *l, long long now,
                         struct reconcile_step *out)
{
    CHARGED_ASSERT(l && out);
    CHARGED_ASSERT(l->order && l->order->decide);
    CHARGED_ASSERT(now >= l->claimed_at); /* a monotonic clock */
    memset(out, 0, offsetof(struct reconcile_step, dec));
    l->e.lookup_after_ms = now - l->claimed_at;
    l->order->decide(&l->lim, &l->a, &l->e, &out->dec);
    out->next = out->dec.next;
    if (out->next == RECONCILE_SETTLE) {
        /* Whichever order decided: a look a 429 left as it was is none. */
        reconcile_policy_mark_throttled(&l->a, &l->e, &out->dec);
        return;
    }
    CHARGED_ASSERT((unsigned)out->next <= RECONCILE_LIST);
    out->operation = l->order->operation[out->next];
    if (!out->operation) {
        /* A call the kind has not (never asked): the look ends, the record
         * as it was. */
        out->next = out->dec.next = RECONCILE_SETTLE;
        out->dec.status = l->a.status;
        return;
    }
    const struct provider_result **slot = slot_of(&l->e, out->next);
    /* Each piece of evidence is asked for once: the order of evidence
     * bounds the calls. */
    CHARGED_ASSERT(*slot == NULL && l->ncalls < RECONCILE_LOOK_MAX_CALLS);
    out->call = l->ncalls++;
    out->answer = &l->res[out->call];
    memset(out->answer, 0, sizeof(*out->answer));
    *slot = out->answer;
}

long long reconcile_look_next_check_ms(enum attempt_status from, enum attempt_status to,
                                       const long long *schedule, int nschedule,
                                       int checks)
{
    CHARGED_ASSERT(schedule && nschedule > 0 && checks >= 0);
    CHARGED_ASSERT((unsigned)to < ATTEMPT_STATUS__COUNT);
    if (to != from && to != ATTEMPT_STATUS_PROCESSING && to != ATTEMPT_STATUS_UNKNOWN)
        return -1;
    long long ms = schedule[checks < nschedule ? checks : nschedule - 1];
    CHARGED_ASSERT(ms >= 0);
    return ms;
}

long long reconcile_look_throttled_ms(const struct reconcile_decision *dec,
                                      int in_a_row)
{
    CHARGED_ASSERT(dec && dec->throttled);
    CHARGED_ASSERT(in_a_row >= 0);
    long long ms = provider_outcome_throttled_wait_ms(dec->retry_after_ms, in_a_row);
    CHARGED_ASSERT(ms > 0 && ms <= PROVIDER_RETRY_AFTER_MAX_MS);
    return ms;
}
