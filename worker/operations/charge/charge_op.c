#include "charge_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charge_command.h"
#include "charged_assert.h"
#include "config.h"
#include "op_shared.h"
#include "payment_answer.h"

struct charge_state {
    struct op_store store; /* first: op_shared.h's stages take the state */
    struct charge_command_limits limits;
};

struct provider_charge charge_op_request(const struct attempt_params *p,
                                         const char *attempt_id)
{
    /* A stored attempt: its key and amount were checked when recorded. */
    CHARGED_ASSERT(p && attempt_id && attempt_id[0]);
    CHARGED_ASSERT(p->idempotency_key[0] && p->amount > 0);
    return (struct provider_charge){
        .idempotency_key = p->idempotency_key,
        .amount = p->amount,
        .currency = p->currency,
        .payment_method = p->payment_method,
        .customer_id = p->customer_id,
        .payment_attempt_id = attempt_id,
        .order_id = p->order_id,
    };
}

static void *charge_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    struct charge_state *c = calloc(1, sizeof(*c));
    if (!c) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    c->limits.max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    c->limits.max_amount = config_int(cfg, CONFIG_WORKER_MAX_AMOUNT);
    c->limits.allowed_currencies = config_str(cfg, CONFIG_WORKER_ALLOWED_CURRENCIES);
    if (op_store_open(&c->store, 0, cfg, actor, err) != 0) {
        free(c);
        return NULL;
    }
    return c;
}

static void charge_close(void *op)
{
    struct charge_state *c = op;
    if (!c)
        return;
    op_store_close(&c->store);
    free(c);
}

/* The attempts' store of the state. */
static attempt_store_t *store_of(void *op)
{
    CHARGED_ASSERT(op);
    return ((struct charge_state *)op)->store.attempts;
}

static enum dead_letter_reason charge_parse(void *op, const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            void *command, struct charged_error *err)
{
    struct charge_state *c = op;
    return charge_command_parse(key, key_len, value, value_len, &c->limits, command,
                                err);
}

static void charge_release(void *command)
{
    charge_command_release(command);
}

static const char *charge_id_of(const void *command)
{
    return ((const struct charge_command *)command)->payment_attempt_id;
}

static const char *charge_order_of(const void *command)
{
    return ((const struct charge_command *)command)->order_id;
}

static enum charged_rc charge_record(void *op, struct engine_record *items, size_t n,
                                     long long lease_ms, struct charged_error *err)
{
    static const enum engine_record_result results[] = {
        [ATTEMPT_RECORDED] = ENGINE_RECORDED,
        [ATTEMPT_CONFLICT] = ENGINE_CONFLICT,
        [ATTEMPT_REJECTED] = ENGINE_REJECTED,
        [ATTEMPT_RETRY] = ENGINE_RECORD_AGAIN,
        [ATTEMPT_RECORDED_CLAIMED] = ENGINE_RECORDED_CLAIMED,
    };
    struct attempt_record_item *a = op_batch_new(n, sizeof(*a), err);
    if (!a)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        a[i].cmd = items[i].command;
    enum charged_rc rc = attempt_store_record(store_of(op), a, n, lease_ms, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        CHARGED_ASSERT((unsigned)a[i].result < sizeof(results) / sizeof(results[0]));
        items[i].result = results[a[i].result];
        snprintf(items[i].reason, sizeof(items[i].reason), "%s", a[i].reason);
        if (items[i].result == ENGINE_RECORDED_CLAIMED) {
            CHARGED_ASSERT(a[i].lease_epoch > 0); /* claimed by the record */
            items[i].lease_epoch = a[i].lease_epoch;
            memcpy(items[i].params, &a[i].params, sizeof(a[i].params));
        }
    }
    free(a);
    return rc;
}

static enum charged_rc charge_claim(void *op, struct engine_claim *items, size_t n,
                                    long long lease_ms, struct charged_error *err)
{
    static const enum engine_claim_result results[] = {
        [ATTEMPT_CLAIMED] = ENGINE_CLAIMED,
        [ATTEMPT_SETTLED] = ENGINE_SETTLED,
        [ATTEMPT_BUSY] = ENGINE_BUSY,
    };
    struct attempt_claim_item *a = op_batch_new(n, sizeof(*a), err);
    if (!a)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        a[i].attempt_id = items[i].id;
    enum charged_rc rc = attempt_store_claim(store_of(op), a, n, lease_ms, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        CHARGED_ASSERT((unsigned)a[i].result < sizeof(results) / sizeof(results[0]));
        op_batch_claimed(&items[i], results[a[i].result], a[i].lease_epoch,
                         a[i].key_age_ms, a[i].status, &a[i].params,
                         sizeof(a[i].params));
    }
    free(a);
    return rc;
}

static const char *charge_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return attempt_status_event_type(status);
}

static enum charged_rc charge_start_call(void *op, provider_client_t *pc,
                                         const void *params, const void *command,
                                         void *tag, struct charged_error *err)
{
    (void)op;
    const struct provider_charge ch = charge_op_request(params, charge_id_of(command));
    return provider_client_start_charge(pc, &ch, tag, err);
}

const struct engine_op charge_op = {
    .name = "charge",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct charge_command),
    .params_size = sizeof(struct attempt_params),
    OP_CALLBACKS(charge),
    OP_STORE_CALLBACKS(op_store),
    .decide = payment_answer_decide,
    .outcome = payment_answer_outcome,
};
