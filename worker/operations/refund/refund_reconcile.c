/* The refund's face for the reconciler (op.h's struct op_reconcile): the
 * look at a refund left in doubt (reconcile_policy's refund order of
 * evidence, with the charge's limits), and its store's hooks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "metrics.h"
#include "refund.h"
#include "op.h"
#include "op_shared.h"
#include "refund_op.h"
#include "refund_store.h"

/* ---- the store ---- */

OP_RECONCILE_STORE_HOOKS(refund, refund_store, struct refund_due, struct refund_call,
                         refund_id)

/* ---- the look ---- */

static void refund_begin(const struct op_look_env *env, const void *row,
                         struct op_look_start *start, struct reconcile_look *core,
                         int64_t claimed_at)
{
    const struct refund_due *d = row;
    CHARGED_ASSERT(env && d && start && core);
    const struct reconcile_attempt a = {
        .id = d->id,
        .status = d->status,
        .provider_payment_id = d->provider_refund_id,
        .amount = d->params.amount,
        .key_age_ms = d->key_age_ms,
        .first_sent_ms = -1,
        .age_ms = d->age_ms,
        .payment_intent = d->params.payment_intent,
        .object = "refund",
    };
    *start = (struct op_look_start){
        .id = d->id,
        .lease_epoch = d->lease_epoch,
        .from = d->status,
        .checks = d->checks,
        .order_id = NULL,
        .about = d->params.payment_attempt_id,
        .object = d->params.payment_intent,
    };
    reconcile_look_begin(core, RECONCILE_KIND_REFUND, &env->lim, &a, claimed_at);
}

/* The refund again, under its key and with its stored parameters
 * (refund_op_request), waited for: the reconciler makes one call at a
 * time, each bounded by PROVIDER_TIMEOUT_MS. */
static void refund_again(provider_client_t *pc, const struct refund_due *rd,
                         struct provider_result *res)
{
    const struct provider_refund req = refund_op_request(&rd->params, rd->id);
    struct charged_error err = {0};
    void *tag;
    CHARGED_ASSERT(pc && res);
    if (provider_client_start_refund(pc, &req, NULL, &err) != CHARGED_OK) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_NOT_EXECUTED; /* nothing was started */
        snprintf(res->error, sizeof(res->error), "%.*s", (int)sizeof(res->error) - 1,
                 err.message);
        return;
    }
    while (!provider_client_next_done(pc, res, &tag))
        provider_client_perform(pc, 100);
}

static void refund_call(const struct op_look_env *env, const void *row,
                        enum reconcile_next next, struct provider_result *res)
{
    const struct refund_due *d = row;
    CHARGED_ASSERT(env && d && res);
    if (next == RECONCILE_RETRIEVE) {
        provider_client_retrieve_refund(env->provider, d->provider_refund_id, res);
    } else {
        CHARGED_ASSERT(next == RECONCILE_CHARGE);
        refund_again(env->provider, d, res);
    }
}

/* The refunds of the charge's intent. */
static void refund_page(const struct op_look_env *env, const void *row,
                        const char *after, struct provider_result *page)
{
    const struct refund_due *d = row;
    CHARGED_ASSERT(env && d && after && page);
    provider_client_list_refunds(env->provider, d->params.payment_intent, d->id, after,
                                 page);
}

static enum charged_rc refund_settle(void *store, struct op_settlement *s,
                                     struct charged_error *err)
{
    struct refund_call calls[OP_LOOK_ROWS_MAX];
    CHARGED_ASSERT(store && s && s->nrows <= OP_LOOK_ROWS_MAX);
    for (size_t i = 0; i < s->nrows; i++)
        calls[i] = (struct refund_call){.refund_id = s->id,
                                        .operation = s->rows[i].operation,
                                        .started_ms = s->rows[i].started_ms,
                                        .res = s->rows[i].res};
    struct refund_settlement f = {.refund_id = s->id,
                                  .lease_epoch = s->lease_epoch,
                                  .expected = s->expected,
                                  .status = s->status,
                                  .reason = s->reason,
                                  .provider_refund_id = s->object_id,
                                  .evidence_json = s->evidence_json,
                                  .next_check_ms = s->next_check_ms,
                                  .throttled = s->throttled,
                                  .calls = calls,
                                  .ncalls = s->nrows};
    enum charged_rc rc = refund_store_settle(store, &f, err);
    s->settled = f.settled;
    s->busy = f.busy;
    return rc;
}

const struct op_reconcile refund_reconcile = {
    .words = {.noun = "refund",
              .id_key = "refund_id",
              .about_key = "payment_attempt_id",
              .object_key = "provider_refund_id",
              .refused = "a refund's settlement"},
    .stages = {.claim = "claim refunds",
               .settle = "settle refund",
               .backlog = "count refund backlog"},
    .metrics = {.settlements = METRIC_RECONCILER_REFUND_SETTLEMENTS,
                .backlog = METRIC_RECONCILER_REFUND_BACKLOG,
                .oldest = METRIC_RECONCILER_REFUND_OLDEST},
    .due_size = sizeof(struct refund_due),
    OP_RECONCILE_STORE(refund),
    .begin = refund_begin,
    .call = refund_call,
    .page = refund_page,
    .settle = refund_settle,
};
