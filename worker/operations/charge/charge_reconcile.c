/* The charge's face for the reconciler (op.h's struct op_reconcile): the
 * look at an attempt left in doubt, and its store's hooks; and the look at
 * a payment attempt that an authorization's face shares (attempt_look.h). */
#include <stdio.h>
#include <stdlib.h>

#include "attempt_look.h"
#include "attempt_store.h"
#include "charge_op.h"
#include "charged_assert.h"
#include "metrics.h"
#include "charge.h"
#include "op.h"
#include "op_shared.h"
#include "reconcile_policy.h"

/* ---- the store ---- */

/* The charge's attempts only: an authorization's are its own look's (a hold
 * is not money taken). */
static void *charge_store_open(const char *url, const char *actor,
                               const struct reconcile_limits *lim, const config_t *cfg,
                               struct charged_error *err)
{
    (void)lim;
    (void)cfg;
    return attempt_store_new_of(url, actor, "automatic", -1, err);
}

OP_RECONCILE_STORE_HOOKS_OPENED(charge, charge_store_open, attempt_store,
                                struct attempt_due, struct attempt_call, attempt_id)

/* ---- the look at an attempt ---- */

void attempt_look_begin(const struct reconcile_order *order,
                        const struct op_look_env *env, const void *row,
                        struct op_look_start *start, struct reconcile_look *core,
                        int64_t claimed_at)
{
    const struct attempt_due *d = row;
    CHARGED_ASSERT(env && d && start && core);
    /* Each look claims its own capture method's attempts: the charge's
     * automatic, an operation's of its own order manual. */
    CHARGED_ASSERT((order != NULL) == (d->params.manual != 0));
    const struct reconcile_attempt a = {
        .id = d->id,
        .status = d->status,
        .provider_payment_id = d->provider_payment_id,
        .amount = d->params.amount,
        .currency = d->params.currency,
        .key_age_ms = d->key_age_ms,
        .first_sent_ms = d->first_sent_ms,
        .age_ms = d->age_ms,
        .step_holds = d->void_holds,
    };
    *start = (struct op_look_start){
        .id = d->id,
        .lease_epoch = d->lease_epoch,
        .from = d->status,
        .checks = d->checks,
        .order_id = d->params.order_id,
        .about = d->params.order_id,
        .object = d->params.payment_method,
    };
    if (order)
        reconcile_look_begin_order(core, order, &env->lim, &a, claimed_at);
    else
        reconcile_look_begin(core, RECONCILE_KIND_CHARGE, &env->lim, &a, claimed_at);
}

void attempt_look_call(const struct op_look_env *env, const void *row,
                       enum reconcile_next next, struct provider_result *res)
{
    const struct attempt_due *d = row;
    CHARGED_ASSERT(env && d && res);
    if (next == RECONCILE_RETRIEVE) {
        /* The recorded intent, or the one a replayed hold proved ours. */
        provider_client_retrieve(
            env->provider, env->object_id ? env->object_id : d->provider_payment_id,
            res);
    } else if (next == RECONCILE_SEARCH || next == RECONCILE_SEARCH_OTHERS) {
        provider_client_search(env->provider, d->id, res);
    } else {
        CHARGED_ASSERT(next == RECONCILE_CHARGE);
        const struct provider_charge ch = charge_op_request(&d->params, d->id);
        provider_client_charge(env->provider, &ch, res);
    }
}

/* The intents created while a call under the attempt's key could have
 * been (reconcile_policy says which window). */
void attempt_look_page(const struct op_look_env *env, const void *row,
                       const char *after, struct provider_result *page)
{
    const struct attempt_due *d = row;
    long long gte, lt;
    CHARGED_ASSERT(env && d && after && page);
    reconcile_policy_list_window(d->first_sent_ms, env->lim.key_retention_ms, &gte,
                                 &lt);
    provider_client_list(env->provider, d->id, gte, lt, after, page);
}

enum charged_rc attempt_look_settle(void *store, struct op_settlement *s,
                                    const char *event_type, struct charged_error *err)
{
    struct attempt_call calls[OP_LOOK_ROWS_MAX];
    CHARGED_ASSERT(store && s && s->nrows <= OP_LOOK_ROWS_MAX);
    for (size_t i = 0; i < s->nrows; i++)
        calls[i] = (struct attempt_call){.attempt_id = s->id,
                                         .operation = s->rows[i].operation,
                                         .started_ms = s->rows[i].started_ms,
                                         .res = s->rows[i].res};
    struct attempt_settlement a = {
        .attempt_id = s->id,
        .lease_epoch = s->lease_epoch,
        .expected = s->expected,
        .status = s->status,
        .cause = "reconciler",
        .reason = s->reason,
        .provider_payment_id = s->object_id,
        .evidence_json = s->evidence_json,
        .next_check_ms = s->next_check_ms,
        .throttled = s->throttled,
        .event_type = event_type,
        .calls = calls,
        .ncalls = s->nrows,
    };
    enum charged_rc rc = attempt_store_settle(store, &a, 1, err);
    s->settled = a.settled;
    s->busy = a.busy;
    return rc;
}

/* ---- the charge's ---- */

static void charge_begin(const struct op_look_env *env, const void *row,
                         struct op_look_start *start, struct reconcile_look *core,
                         int64_t claimed_at)
{
    attempt_look_begin(NULL, env, row, start, core, claimed_at);
}

static enum charged_rc charge_settle(void *store, struct op_settlement *s,
                                     struct charged_error *err)
{
    return attempt_look_settle(store, s, NULL, err);
}

const struct op_reconcile charge_reconcile = {
    ATTEMPT_LOOK_FACE,
    OP_RECONCILE_STORE(charge),
    .begin = charge_begin,
    .settle = charge_settle,
};
