/* The void as an operation of the engine (engine.h): its parser, its store
 * (void_store.h) and the meaning of the provider's answer to a cancel. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "card_data.h"
#include "charged_assert.h"
#include "config.h"
#include "metrics.h"
#include "op_shared.h"
#include "payment_answer.h"
#include "void.h"
#include "void_command.h"

struct void_state {
    void_store_t *store;
    size_t max_bytes;
};

struct provider_void void_op_request(const struct void_params *p)
{
    /* A claimed void: its key, and the intent its authorization recorded. */
    CHARGED_ASSERT(p && p->idempotency_key[0] && p->payment_intent[0]);
    CHARGED_ASSERT(p->reason[0]);
    return (struct provider_void){.idempotency_key = p->idempotency_key,
                                  .payment_intent = p->payment_intent,
                                  .reason = p->reason};
}

static void *void_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    struct void_state *v = calloc(1, sizeof(*v));
    if (!v) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    v->max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    /* Does not connect: the database may come up later. */
    if (!(v->store =
              void_store_new(config_str(cfg, CONFIG_DATABASE_URL), actor, err))) {
        free(v);
        return NULL;
    }
    return v;
}

static void void_close(void *op)
{
    struct void_state *v = op;
    if (!v)
        return;
    void_store_free(v->store);
    free(v);
}

static void_store_t *store_of(void *op)
{
    CHARGED_ASSERT(op && ((struct void_state *)op)->store);
    return ((struct void_state *)op)->store;
}

static enum dead_letter_reason void_parse(void *op, const void *key, size_t key_len,
                                          const void *value, size_t value_len,
                                          void *command, struct charged_error *err)
{
    return void_command_parse(key, key_len, value, value_len,
                              ((struct void_state *)op)->max_bytes, command, err);
}

static void void_release(void *command)
{
    void_command_release(command);
}

static const char *void_id_of(const void *command)
{
    CHARGED_ASSERT(command);
    return ((const struct void_command *)command)->void_id;
}

/* A void names its authorization, not an order: its log lines name the
 * void (void_id_field). */
static const char *void_order_of(const void *command)
{
    (void)command;
    return NULL;
}

static enum charged_rc void_ping(void *op, struct charged_error *err)
{
    return void_store_ping(store_of(op), err);
}

static enum charged_rc void_record(void *op, struct engine_record *items, size_t n,
                                   long long lease_ms, struct charged_error *err)
{
    (void)lease_ms; /* recorded, then claimed with its hold */
    return void_store_record(store_of(op), items, n, err);
}

static enum charged_rc void_claim(void *op, struct engine_claim *items, size_t n,
                                  long long lease_ms, struct charged_error *err)
{
    return void_store_claim(store_of(op), items, n, lease_ms, err);
}

static enum charged_rc void_log_calls(void *op, const struct engine_call *calls,
                                      size_t n, struct charged_error *err)
{
    struct void_call *c = op_batch_new(n ? n : 1, sizeof(*c), err);
    if (!c)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        c[i] = (struct void_call){.void_id = calls[i].id,
                                  .operation = "void",
                                  .started_ms = calls[i].started_ms,
                                  .res = calls[i].res,
                                  .written_maybe = calls[i].written_maybe};
    enum charged_rc rc = void_store_log_calls(store_of(op), c, n, err);
    free(c);
    return rc;
}

static enum charged_rc void_persist(void *op, struct engine_outcome *items, size_t n,
                                    struct charged_error *err)
{
    return void_store_persist(store_of(op), items, n, err);
}

static enum charged_rc void_renew(void *op, const char *const *ids, const int *kinds,
                                  const int64_t *epochs, size_t n, long long lease_ms,
                                  int *still_ours, struct charged_error *err)
{
    (void)kinds;
    return void_store_renew(store_of(op), ids, epochs, n, lease_ms, still_ours, err);
}

static enum charged_rc void_release_leases(void *op, const char *const *ids,
                                           const int *kinds, const int64_t *epochs,
                                           size_t n, struct charged_error *err)
{
    (void)kinds;
    return void_store_release(store_of(op), ids, epochs, n, err);
}

static enum charged_rc void_wait(void *op, const struct store_wait *items, size_t n,
                                 struct charged_error *err)
{
    return void_store_wait(store_of(op), items, n, err);
}

/* Its provider object: the payment intent it acts on. */
static const char *void_object_of(int kind, const void *params)
{
    (void)kind;
    return ((const struct void_params *)params)->payment_intent;
}

static enum charged_rc void_start_call(void *op, provider_client_t *pc,
                                       const void *params, const void *command,
                                       void *tag, struct charged_error *err)
{
    (void)op;
    (void)command;
    const struct provider_void v = void_op_request(params);
    return provider_client_start_void(pc, &v, tag, err);
}

static const char *void_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return void_store_event_type(status);
}

/* The charge's outcome, but a refusal says why in the void's words: a
 * captured intent is void_after_capture (void_store moves the attempt to
 * review on it), an expired one authorization_expired. */
static char *void_outcome(int kind, const struct provider_result *res,
                          const struct answer_decision *d, int calls, char *reason,
                          size_t reason_size, const char **provider_id)
{
    char *evidence =
        payment_answer_outcome(kind, res, d, calls, reason, reason_size, provider_id);
    if (res->outcome == PROVIDER_INVALID && d->status == ATTEMPT_STATUS_FAILED) {
        char detail[400], tmp[512];
        provider_outcome_detail(res, detail, sizeof(detail));
        snprintf(tmp, sizeof(tmp), "%s: intent %s, %s", void_refusal_code(res),
                 res->intent_status[0] ? res->intent_status : "unknown", detail);
        card_data_copy_masked(reason, reason_size, tmp);
    }
    /* A failure says why. */
    CHARGED_ASSERT(d->status != ATTEMPT_STATUS_FAILED || reason[0]);
    return evidence;
}

static const char *void_id_field(int kind)
{
    (void)kind;
    return "void_id";
}

/* Voids are counted apart from payment attempts. */
static unsigned void_outcomes_metric(int kind)
{
    (void)kind;
    return METRIC_VOIDS;
}

const struct engine_op void_engine_op = {
    .name = "void",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct void_command),
    .params_size = sizeof(struct void_params),
    OP_CALLBACKS(void),
    .ping = void_ping,
    .log_calls = void_log_calls,
    .persist = void_persist,
    .renew = void_renew,
    .release_leases = void_release_leases,
    .wait = void_wait,
    .decide = payment_answer_decide,
    .outcome = void_outcome,
    .id_field = void_id_field,
    .outcomes_metric = void_outcomes_metric,
};
