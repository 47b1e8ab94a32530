#include "refund_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "config.h"
#include "metrics.h"
#include "op_shared.h"
#include "payment_answer.h"
#include "refund_command.h"

struct refund_state {
    struct op_store store; /* first: op_shared.h's stages take the state */
    size_t max_bytes;
};

struct provider_refund refund_op_request(const struct refund_params *p,
                                         const char *refund_id)
{
    /* A stored refund: its key, its charge's intent and its amount (within
     * what the charge has left, reserved by the claim) were checked. */
    CHARGED_ASSERT(p && refund_id && refund_id[0] && p->idempotency_key[0]);
    CHARGED_ASSERT(p->payment_intent[0] && p->payment_attempt_id[0] && p->amount > 0);
    return (struct provider_refund){
        .idempotency_key = p->idempotency_key,
        .payment_intent = p->payment_intent,
        .amount = p->amount,
        .reason = p->reason,
        .refund_id = refund_id,
        .payment_attempt_id = p->payment_attempt_id,
    };
}

static void *refund_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    struct refund_state *r = calloc(1, sizeof(*r));
    if (!r) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    r->max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    if (op_store_open(&r->store, 1, cfg, actor, err) != 0) {
        free(r);
        return NULL;
    }
    return r;
}

static void refund_close(void *op)
{
    struct refund_state *r = op;
    if (!r)
        return;
    op_store_close(&r->store);
    free(r);
}

/* The refunds' store of the state. */
static refund_store_t *store_of(void *op)
{
    CHARGED_ASSERT(op);
    return ((struct refund_state *)op)->store.refunds;
}

static enum dead_letter_reason refund_parse(void *op, const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            void *command, struct charged_error *err)
{
    return refund_command_parse(key, key_len, value, value_len,
                                ((struct refund_state *)op)->max_bytes, command, err);
}

static void refund_release(void *command)
{
    refund_command_release(command);
}

static const char *refund_id_of(const void *command)
{
    return ((const struct refund_command *)command)->refund_id;
}

/* A refund belongs to no order of its own: its log lines name the refund
 * (refund_id_field) and leave the order out. */
static const char *refund_order_of(const void *command)
{
    (void)command;
    return NULL;
}

/* A refund is recorded, then claimed on its own: its claim checks the
 * charge it refunds. */
static enum charged_rc refund_record(void *op, struct engine_record *items, size_t n,
                                     long long lease_ms, struct charged_error *err)
{
    (void)lease_ms;
    struct refund_record_item *a = op_batch_new(n, sizeof(*a), err);
    if (!a)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        a[i].cmd = items[i].command;
    enum charged_rc rc = refund_store_record(store_of(op), a, n, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        CHARGED_ASSERT(a[i].result == REFUND_RECORDED ||
                       a[i].result == REFUND_CONFLICT);
        items[i].result =
            a[i].result == REFUND_CONFLICT ? ENGINE_CONFLICT : ENGINE_RECORDED;
        snprintf(items[i].reason, sizeof(items[i].reason), "%s", a[i].reason);
    }
    free(a);
    return rc;
}

static enum charged_rc refund_claim(void *op, struct engine_claim *items, size_t n,
                                    long long lease_ms, struct charged_error *err)
{
    static const enum engine_claim_result results[] = {
        [REFUND_CLAIMED] = ENGINE_CLAIMED,
        [REFUND_SETTLED] = ENGINE_SETTLED,
        [REFUND_BUSY] = ENGINE_BUSY,
    };
    struct refund_claim_item *a = op_batch_new(n, sizeof(*a), err);
    if (!a)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        a[i].refund_id = items[i].id;
    enum charged_rc rc = refund_store_claim(store_of(op), a, n, lease_ms, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        CHARGED_ASSERT((unsigned)a[i].result < sizeof(results) / sizeof(results[0]));
        /* Claimed, it is reserved on its charge: never for nothing. */
        CHARGED_ASSERT(a[i].result != REFUND_CLAIMED || a[i].params.amount > 0);
        op_batch_claimed(&items[i], results[a[i].result], a[i].lease_epoch,
                         a[i].key_age_ms, a[i].status, &a[i].params,
                         sizeof(a[i].params));
        snprintf(items[i].rejected, sizeof(items[i].rejected), "%s", a[i].rejected);
    }
    free(a);
    return rc;
}

/* Its provider object: the payment intent it acts on. */
static const char *refund_object_of(int kind, const void *params)
{
    (void)kind;
    return ((const struct refund_params *)params)->payment_intent;
}

static enum charged_rc refund_start_call(void *op, provider_client_t *pc,
                                         const void *params, const void *command,
                                         void *tag, struct charged_error *err)
{
    (void)op;
    const struct provider_refund r = refund_op_request(params, refund_id_of(command));
    return provider_client_start_refund(pc, &r, tag, err);
}

static const char *refund_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return attempt_status_refund_event_type(status);
}

static const char *refund_id_field(int kind)
{
    (void)kind;
    return "refund_id";
}

static unsigned refund_outcomes_metric(int kind)
{
    (void)kind;
    return METRIC_REFUNDS;
}

const struct engine_op refund_op = {
    .name = "refund",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct refund_command),
    .params_size = sizeof(struct refund_params),
    OP_CALLBACKS(refund),
    OP_STORE_CALLBACKS(op_store),
    .decide = payment_answer_decide,
    .outcome = payment_answer_outcome,
    .id_field = refund_id_field,
    .outcomes_metric = refund_outcomes_metric,
    .sets_aside = op_sets_aside,
};
