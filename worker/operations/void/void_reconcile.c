/* The void's face for the reconciler (op.h's struct op_reconcile): the look
 * at a void left in doubt, in the void's own order of evidence
 * (void_command.h: void_look_order), and its store's hooks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "metrics.h"
#include "op.h"
#include "op_shared.h"
#include "void.h"
#include "void_command.h"

OP_RECONCILE_STORE_HOOKS(void, void_store, struct void_due, struct void_call, void_id)

static void void_begin(const struct op_look_env *env, const void *row,
                       struct op_look_start *start, struct reconcile_look *core,
                       int64_t claimed_at)
{
    const struct void_due *d = row;
    CHARGED_ASSERT(env && d && start && core);
    /* The intent is the one charged recorded for the authorization: the
     * only object a void is settled on. */
    const struct reconcile_attempt a = {
        .id = d->id,
        .status = d->status,
        .provider_payment_id = d->params.payment_intent,
        .amount = d->params.amount,
        .key_age_ms = d->key_age_ms,
        .first_sent_ms = -1,
        .age_ms = d->age_ms,
        .payment_intent = d->params.payment_intent,
        .object = "intent",
    };
    *start = (struct op_look_start){.id = d->id,
                                    .lease_epoch = d->lease_epoch,
                                    .from = d->status,
                                    .checks = d->checks,
                                    .order_id = NULL,
                                    .about = d->params.payment_attempt_id,
                                    .object = d->params.payment_intent};
    reconcile_look_begin_order(core, &void_look_order, &env->lim, &a, claimed_at);
}

/* The cancel again, under the void's key and with its stored parameters,
 * waited for (the reconciler makes one call at a time, each bounded by
 * PROVIDER_TIMEOUT_MS). */
static void void_again(provider_client_t *pc, const struct void_due *d,
                       struct provider_result *res)
{
    const struct provider_void req = void_op_request(&d->params);
    struct charged_error err = {0};
    void *tag;
    CHARGED_ASSERT(pc && res);
    memset(res, 0, sizeof(*res));
    if (provider_client_start_void(pc, &req, NULL, &err) == CHARGED_OK) {
        while (!provider_client_next_done(pc, res, &tag))
            provider_client_perform(pc, 100);
        return;
    }
    /* Nothing was started: not executed, the next look sends it again. */
    res->outcome = PROVIDER_NOT_EXECUTED;
    snprintf(res->error, sizeof(res->error), "%.*s", (int)sizeof(res->error) - 1,
             err.message);
}

static void void_call(const struct op_look_env *env, const void *row,
                      enum reconcile_next next, struct provider_result *res)
{
    const struct void_due *d = row;
    CHARGED_ASSERT(env && d && res);
    if (next == RECONCILE_RETRIEVE) {
        provider_client_retrieve(env->provider, d->params.payment_intent, res);
    } else {
        CHARGED_ASSERT(next == RECONCILE_CHARGE);
        void_again(env->provider, d, res);
    }
}

/* Never asked: the void's order of evidence walks no list. */
static void void_page(const struct op_look_env *env, const void *row, const char *after,
                      struct provider_result *page)
{
    (void)env;
    (void)row;
    (void)after;
    CHARGED_ASSERT(!"a void's look walks no list");
    memset(page, 0, sizeof(*page));
}

static enum charged_rc void_settle(void *store, struct op_settlement *s,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(store && s && s->nrows <= OP_LOOK_ROWS_MAX);
    return void_store_settle(store, s, err);
}

const struct op_reconcile void_reconcile = {
    .words = {.noun = "void",
              .id_key = "void_id",
              .about_key = "payment_attempt_id",
              .object_key = "provider_payment_id",
              .refused = "a void's settlement"},
    .stages = {.claim = "claim voids",
               .settle = "settle void",
               .backlog = "count void backlog"},
    .metrics = {.settlements = METRIC_RECONCILER_VOID_SETTLEMENTS,
                .backlog = METRIC_RECONCILER_VOID_BACKLOG,
                .oldest = METRIC_RECONCILER_VOID_OLDEST},
    .due_size = sizeof(struct void_due),
    OP_RECONCILE_STORE(void),
    .begin = void_begin,
    .call = void_call,
    .page = void_page,
    .settle = void_settle,
};
