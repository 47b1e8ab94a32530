#include "refund_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "metrics.h"
#include "payment_answer.h"
#include "refund_command.h"

struct refund_state {
    refund_store_t *store;
    size_t max_bytes;
};

struct provider_refund refund_op_request(const struct refund_params *p,
                                         const char *refund_id)
{
    return (struct provider_refund){
        .idempotency_key = p->idempotency_key,
        .payment_intent = p->payment_intent,
        .amount = p->amount,
        .reason = p->reason,
        .refund_id = refund_id,
        .payment_attempt_id = p->payment_attempt_id,
    };
}

static void *refund_open(config_t *cfg, const char *actor, char *err, size_t err_size)
{
    struct store_error serr;
    struct refund_state *r = calloc(1, sizeof(*r));
    if (!r) {
        snprintf(err, err_size, "out of memory");
        return NULL;
    }
    r->max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    r->store = refund_store_new(config_str(cfg, CONFIG_DATABASE_URL), actor, &serr);
    if (!r->store) {
        snprintf(err, err_size, "%s", serr.message);
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
    refund_store_free(r->store);
    free(r);
}

static refund_store_t *store_of(void *op)
{
    return ((struct refund_state *)op)->store;
}

static enum dead_letter_reason refund_parse(void *op, const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            void *command, char *err, size_t err_size)
{
    return refund_command_parse(key, key_len, value, value_len,
                                ((struct refund_state *)op)->max_bytes, command, err,
                                err_size);
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

static enum store_rc refund_ping(void *op, struct store_error *err)
{
    return refund_store_ping(store_of(op), err);
}

/* A refund is recorded, then claimed on its own: its claim checks the
 * charge it refunds. */
static enum store_rc refund_record(void *op, struct engine_record *items, size_t n,
                                   long long lease_ms, struct store_error *err)
{
    (void)lease_ms;
    struct refund_record_item *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        a[i].cmd = items[i].command;
    enum store_rc rc = refund_store_record(store_of(op), a, n, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        items[i].result =
            a[i].result == REFUND_CONFLICT ? ENGINE_CONFLICT : ENGINE_RECORDED;
        snprintf(items[i].reason, sizeof(items[i].reason), "%s", a[i].reason);
    }
    free(a);
    return rc;
}

static enum store_rc refund_claim(void *op, struct engine_claim *items, size_t n,
                                  long long lease_ms, struct store_error *err)
{
    static const enum engine_claim_result results[] = {
        [REFUND_CLAIMED] = ENGINE_CLAIMED,
        [REFUND_SETTLED] = ENGINE_SETTLED,
        [REFUND_BUSY] = ENGINE_BUSY,
    };
    struct refund_claim_item *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        a[i].refund_id = items[i].id;
    enum store_rc rc = refund_store_claim(store_of(op), a, n, lease_ms, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        struct engine_claim *it = &items[i];
        it->result = results[a[i].result];
        it->lease_epoch = a[i].lease_epoch;
        it->key_age_ms = a[i].key_age_ms;
        snprintf(it->status, sizeof(it->status), "%s", a[i].status);
        snprintf(it->rejected, sizeof(it->rejected), "%s", a[i].rejected);
        if (it->result == ENGINE_CLAIMED)
            memcpy(it->params, &a[i].params, sizeof(a[i].params));
    }
    free(a);
    return rc;
}

static enum store_rc refund_log_calls(void *op, const struct engine_call *calls,
                                      size_t n, struct store_error *err)
{
    struct refund_call *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        a[i] = (struct refund_call){.refund_id = calls[i].id,
                                    .started_ms = calls[i].started_ms,
                                    .res = calls[i].res,
                                    .written_maybe = calls[i].written_maybe};
    enum store_rc rc = refund_store_log_calls(store_of(op), a, n, err);
    free(a);
    return rc;
}

static enum store_rc refund_persist(void *op, struct engine_outcome *items, size_t n,
                                    struct store_error *err)
{
    struct refund_outcome *a = calloc(n ? n : 1, sizeof(*a));
    if (!a) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++) {
        const struct engine_outcome *o = &items[i];
        a[i] = (struct refund_outcome){
            .refund_id = o->id,
            .lease_epoch = o->lease_epoch,
            .status = o->status,
            .reason = o->reason,
            .provider_refund_id = o->provider_id,
            .event_type = o->event_type,
            .evidence_json = o->evidence_json,
            .calls = o->calls,
            .last_error = o->last_error,
            .next_check_ms = o->next_check_ms,
        };
    }
    enum store_rc rc = refund_store_persist(store_of(op), a, n, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++) {
        items[i].persisted = a[i].persisted;
        items[i].busy = a[i].busy;
    }
    free(a);
    return rc;
}

static enum store_rc refund_renew(void *op, const char *const *ids, const int *kinds,
                                  const int64_t *epochs, size_t n, long long lease_ms,
                                  int *still_ours, struct store_error *err)
{
    (void)kinds;
    return refund_store_renew(store_of(op), ids, epochs, n, lease_ms, still_ours, err);
}

static enum store_rc refund_release_leases(void *op, const char *const *ids,
                                           const int *kinds, const int64_t *epochs,
                                           size_t n, struct store_error *err)
{
    (void)kinds;
    return refund_store_release(store_of(op), ids, epochs, n, err);
}

static int refund_start_call(void *op, provider_client_t *pc, const void *params,
                             const void *command, void *tag, char *err, size_t err_size)
{
    (void)op;
    const struct provider_refund r = refund_op_request(params, refund_id_of(command));
    return provider_client_start_refund(pc, &r, tag, err, err_size);
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
    .commands_topic_key = CONFIG_CHARGE_COMMANDS_TOPIC,
    .dlq_topic_key = CONFIG_CHARGE_DLQ_TOPIC,
    .command_size = sizeof(struct refund_command),
    .params_size = sizeof(struct refund_params),
    .open = refund_open,
    .close = refund_close,
    .parse = refund_parse,
    .release = refund_release,
    .id_of = refund_id_of,
    .order_of = refund_order_of,
    .ping = refund_ping,
    .record = refund_record,
    .claim = refund_claim,
    .log_calls = refund_log_calls,
    .persist = refund_persist,
    .renew = refund_renew,
    .release_leases = refund_release_leases,
    .start_call = refund_start_call,
    .event_type = refund_event_type,
    .decide = payment_answer_decide,
    .outcome = payment_answer_outcome,
    .id_field = refund_id_field,
    .outcomes_metric = refund_outcomes_metric,
};
