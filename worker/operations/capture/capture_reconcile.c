/* The capture's face for the reconciler (op.h's struct op_reconcile): the
 * look at a capture left in doubt, in its own order of evidence
 * (capture_look_decide, on reconcile_look's core), and its store's hooks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "capture_op.h"
#include "capture_store.h"
#include "charged_assert.h"
#include "metrics.h"
#include "op.h"
#include "op_shared.h"

/* ---- the store ---- */

OP_RECONCILE_STORE_HOOKS(capture, capture_store, struct capture_due,
                         struct capture_call, capture_id)

/* ---- the look ---- */

static const struct reconcile_order capture_order = {
    .decide = capture_look_decide,
    .operation = {[RECONCILE_RETRIEVE] = "retrieve", [RECONCILE_CHARGE] = "capture"},
};

static void capture_begin(const struct op_look_env *env, const void *row,
                          struct op_look_start *start, struct reconcile_look *core,
                          int64_t claimed_at)
{
    const struct capture_due *d = row;
    CHARGED_ASSERT(env && d && start && core);
    const struct reconcile_attempt a = {
        .id = d->id,
        .status = d->status,
        .provider_payment_id = d->params.payment_intent,
        /* What it asked: all is the authorization's amount (resolved at
         * its claim; a capture claimed before that was so has 0 here). */
        .amount = d->params.amount > 0 ? d->params.amount : d->authorized,
        .key_age_ms = d->key_age_ms,
        .first_sent_ms = -1,
        .age_ms = d->age_ms,
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
    reconcile_look_begin_order(core, &capture_order, &env->lim, &a, claimed_at);
}

/* The capture again, under its key and with its stored parameters
 * (capture_op_request), waited for: one call at a time, each bounded by
 * PROVIDER_TIMEOUT_MS. */
static void capture_again(provider_client_t *pc, const struct capture_due *d,
                          struct provider_result *res)
{
    const struct provider_capture req = capture_op_request(&d->params);
    struct charged_error err = {0};
    void *tag;
    CHARGED_ASSERT(pc && res);
    if (provider_client_start_capture(pc, &req, NULL, &err) != CHARGED_OK) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_NOT_EXECUTED; /* nothing was started */
        snprintf(res->error, sizeof(res->error), "%.*s", (int)sizeof(res->error) - 1,
                 err.message);
        return;
    }
    while (!provider_client_next_done(pc, res, &tag))
        provider_client_perform(pc, 100);
}

static void capture_call(const struct op_look_env *env, const void *row,
                         enum reconcile_next next, struct provider_result *res)
{
    const struct capture_due *d = row;
    CHARGED_ASSERT(env && d && res);
    if (next == RECONCILE_RETRIEVE) {
        provider_client_retrieve(env->provider, d->params.payment_intent, res);
    } else {
        CHARGED_ASSERT(next == RECONCILE_CHARGE);
        capture_again(env->provider, d, res);
    }
}

/* A capture's order walks no list (capture_order names none). */
static void capture_page(const struct op_look_env *env, const void *row,
                         const char *after, struct provider_result *page)
{
    (void)env;
    (void)row;
    (void)after;
    CHARGED_ASSERT(!"a capture's look walks no list");
    memset(page, 0, sizeof(*page));
    page->outcome = PROVIDER_UNKNOWN;
}

static enum charged_rc capture_settle(void *store, struct op_settlement *s,
                                      struct charged_error *err)
{
    CHARGED_ASSERT(store && s && s->nrows <= OP_LOOK_ROWS_MAX);
    return capture_store_settle(store, s, err);
}

const struct op_reconcile capture_reconcile = {
    .words = {.noun = "capture",
              .id_key = "capture_id",
              .about_key = "payment_attempt_id",
              .object_key = "provider_payment_id",
              .refused = "a capture's settlement"},
    .stages = {.claim = "claim captures",
               .settle = "settle capture",
               .backlog = "count capture backlog"},
    .metrics = {.settlements = METRIC_RECONCILER_CAPTURE_SETTLEMENTS,
                .backlog = METRIC_RECONCILER_CAPTURE_BACKLOG,
                .oldest = METRIC_RECONCILER_CAPTURE_OLDEST},
    .due_size = sizeof(struct capture_due),
    OP_RECONCILE_STORE(capture),
    .begin = capture_begin,
    .call = capture_call,
    .page = capture_page,
    .settle = capture_settle,
};
