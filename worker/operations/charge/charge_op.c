#include "charge_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charge_command.h"
#include "config.h"
#include "payment_answer.h"

struct charge_state {
    attempt_store_t *store;
    struct charge_command_limits limits;
};

struct provider_charge charge_op_request(const struct attempt_params *p,
                                         const char *attempt_id)
{
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

static void *charge_open(config_t *cfg, const char *actor, char *err, size_t err_size)
{
    struct store_error serr;
    struct charge_state *c = calloc(1, sizeof(*c));
    if (!c) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    c->limits.max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    c->limits.max_amount = config_int(cfg, CONFIG_WORKER_MAX_AMOUNT);
    c->limits.allowed_currencies = config_str(cfg, CONFIG_WORKER_ALLOWED_CURRENCIES);
    /* Does not connect: a worker started while the database is down keeps
     * running, and its database steps retry with back-off. */
    c->store = attempt_store_new(config_str(cfg, CONFIG_DATABASE_URL), actor, &serr);
    if (!c->store) {
        snprintf(err, err_size, "%s", serr.message);
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
    attempt_store_free(c->store);
    free(c);
}

static enum dead_letter_reason charge_parse(void *op, const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            void *command, char *err, size_t err_size)
{
    struct charge_state *c = op;
    return charge_command_parse(key, key_len, value, value_len, &c->limits, command,
                                err, err_size);
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

static enum store_rc charge_ping(void *op, struct store_error *err)
{
    return attempt_store_ping(((struct charge_state *)op)->store, err);
}

static enum store_rc charge_record(void *op, struct engine_record *items, size_t n,
                                   long long lease_ms, struct store_error *err)
{
    static const enum engine_record_result results[] = {
        [ATTEMPT_RECORDED] = ENGINE_RECORDED,
        [ATTEMPT_CONFLICT] = ENGINE_CONFLICT,
        [ATTEMPT_REJECTED] = ENGINE_REJECTED,
        [ATTEMPT_RETRY] = ENGINE_RECORD_AGAIN,
        [ATTEMPT_RECORDED_CLAIMED] = ENGINE_RECORDED_CLAIMED,
    };
    struct attempt_record_item *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        a[i].cmd = items[i].command;
    enum store_rc rc =
        attempt_store_record(((struct charge_state *)op)->store, a, n, lease_ms, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        items[i].result = results[a[i].result];
        snprintf(items[i].reason, sizeof(items[i].reason), "%s", a[i].reason);
        if (items[i].result == ENGINE_RECORDED_CLAIMED) {
            items[i].lease_epoch = a[i].lease_epoch;
            memcpy(items[i].params, &a[i].params, sizeof(a[i].params));
        }
    }
    free(a);
    return rc;
}

static enum store_rc charge_claim(void *op, struct engine_claim *items, size_t n,
                                  long long lease_ms, struct store_error *err)
{
    static const enum engine_claim_result results[] = {
        [ATTEMPT_CLAIMED] = ENGINE_CLAIMED,
        [ATTEMPT_SETTLED] = ENGINE_SETTLED,
        [ATTEMPT_BUSY] = ENGINE_BUSY,
    };
    struct attempt_claim_item *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        a[i].attempt_id = items[i].id;
    enum store_rc rc =
        attempt_store_claim(((struct charge_state *)op)->store, a, n, lease_ms, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        struct engine_claim *it = &items[i];
        it->result = results[a[i].result];
        it->lease_epoch = a[i].lease_epoch;
        it->key_age_ms = a[i].key_age_ms;
        snprintf(it->status, sizeof(it->status), "%s", a[i].status);
        if (it->result == ENGINE_CLAIMED)
            memcpy(it->params, &a[i].params, sizeof(a[i].params));
    }
    free(a);
    return rc;
}

static enum store_rc charge_log_calls(void *op, const struct engine_call *calls,
                                      size_t n, struct store_error *err)
{
    struct attempt_call *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (struct attempt_call){.attempt_id = calls[i].id,
                                     .started_ms = calls[i].started_ms,
                                     .res = calls[i].res,
                                     .written_maybe = calls[i].written_maybe};
    enum store_rc rc =
        attempt_store_log_calls(((struct charge_state *)op)->store, a, n, err);
    free(a);
    return rc;
}

static enum store_rc charge_persist(void *op, struct engine_outcome *items, size_t n,
                                    struct store_error *err)
{
    struct attempt_outcome *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++) {
        const struct engine_outcome *o = &items[i];
        a[i] = (struct attempt_outcome){
            .attempt_id = o->id,
            .lease_epoch = o->lease_epoch,
            .status = o->status,
            .reason = o->reason,
            .provider_payment_id = o->provider_id,
            .event_type = o->event_type,
            .evidence_json = o->evidence_json,
            .calls = o->calls,
            .last_error = o->last_error,
            .next_check_ms = o->next_check_ms,
        };
    }
    enum store_rc rc =
        attempt_store_persist(((struct charge_state *)op)->store, a, n, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        items[i].persisted = a[i].persisted;
        items[i].busy = a[i].busy;
    }
    free(a);
    return rc;
}

static enum store_rc charge_renew(void *op, const char *const *ids, const int *kinds,
                                  const int64_t *epochs, size_t n, long long lease_ms,
                                  int *still_ours, struct store_error *err)
{
    (void)kinds;
    return attempt_store_renew(((struct charge_state *)op)->store, ids, epochs, n,
                               lease_ms, still_ours, err);
}

static enum store_rc charge_release_leases(void *op, const char *const *ids,
                                           const int *kinds, const int64_t *epochs,
                                           size_t n, struct store_error *err)
{
    (void)kinds;
    return attempt_store_release(((struct charge_state *)op)->store, ids, epochs, n,
                                 err);
}

static const char *charge_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return attempt_status_event_type(status);
}

static int charge_start_call(void *op, provider_client_t *pc, const void *params,
                             const void *command, void *tag, char *err, size_t err_size)
{
    (void)op;
    const struct provider_charge ch = charge_op_request(params, charge_id_of(command));
    return provider_client_start_charge(pc, &ch, tag, err, err_size);
}

const struct engine_op charge_op = {
    .name = "charge",
    .commands_topic_key = CONFIG_CHARGE_COMMANDS_TOPIC,
    .dlq_topic_key = CONFIG_CHARGE_DLQ_TOPIC,
    .command_size = sizeof(struct charge_command),
    .params_size = sizeof(struct attempt_params),
    .open = charge_open,
    .close = charge_close,
    .parse = charge_parse,
    .release = charge_release,
    .id_of = charge_id_of,
    .order_of = charge_order_of,
    .ping = charge_ping,
    .record = charge_record,
    .claim = charge_claim,
    .log_calls = charge_log_calls,
    .persist = charge_persist,
    .renew = charge_renew,
    .release_leases = charge_release_leases,
    .start_call = charge_start_call,
    .event_type = charge_event_type,
    .decide = payment_answer_decide,
    .outcome = payment_answer_outcome,
};
