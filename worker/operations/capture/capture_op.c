#include "capture_op.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "capture_command.h"
#include "charged_assert.h"
#include "config.h"
#include "metrics.h"
#include "op_shared.h"
#include "payment_answer.h"

struct capture_state {
    capture_store_t *store;
    size_t max_bytes;
};

struct provider_capture capture_op_request(const struct capture_params *p)
{
    /* A stored, claimed capture: its key, and the intent of the
     * authorization it holds, were checked; its amount within it. */
    CHARGED_ASSERT(p && p->idempotency_key[0] && p->payment_intent[0]);
    CHARGED_ASSERT(p->payment_attempt_id[0] && p->amount >= 0);
    return (struct provider_capture){
        .idempotency_key = p->idempotency_key,
        .payment_intent = p->payment_intent,
        .amount = p->amount, /* 0: all that is held */
        .payment_attempt_id = p->payment_attempt_id,
    };
}

static void *capture_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    struct capture_state *c = calloc(1, sizeof(*c));
    if (!c) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    c->max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    /* Does not connect: its database steps retry with back-off. */
    if (!(c->store =
              capture_store_new(config_str(cfg, CONFIG_DATABASE_URL), actor, err))) {
        free(c);
        return NULL;
    }
    return c;
}

static void capture_close(void *op)
{
    struct capture_state *c = op;
    if (!c)
        return;
    capture_store_free(c->store);
    free(c);
}

static capture_store_t *store_of(void *op)
{
    CHARGED_ASSERT(op && ((struct capture_state *)op)->store);
    return ((struct capture_state *)op)->store;
}

static enum dead_letter_reason capture_parse(void *op, const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             void *command, struct charged_error *err)
{
    return capture_command_parse(key, key_len, value, value_len,
                                 ((struct capture_state *)op)->max_bytes, command, err);
}

static void capture_release(void *command)
{
    capture_command_release(command);
}

static const char *capture_id_of(const void *command)
{
    return ((const struct capture_command *)command)->capture_id;
}

/* A capture's log lines name it (capture_id_field) and leave the order out:
 * the message does not carry it. */
static const char *capture_order_of(const void *command)
{
    (void)command;
    return NULL;
}

static enum charged_rc capture_ping(void *op, struct charged_error *err)
{
    return capture_store_ping(store_of(op), err);
}

/* Recorded, then claimed on its own: its claim takes the hold. */
static enum charged_rc capture_record(void *op, struct engine_record *items, size_t n,
                                      long long lease_ms, struct charged_error *err)
{
    (void)lease_ms;
    return capture_store_record(store_of(op), items, n, err);
}

static enum charged_rc capture_claim(void *op, struct engine_claim *items, size_t n,
                                     long long lease_ms, struct charged_error *err)
{
    return capture_store_claim(store_of(op), items, n, lease_ms, err);
}

static enum charged_rc capture_log_calls(void *op, const struct engine_call *calls,
                                         size_t n, struct charged_error *err)
{
    struct capture_call *c = op_batch_new(n, sizeof(*c), err);
    if (!c)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++) {
        /* A call is recorded only with its capture's id and its answer. */
        CHARGED_ASSERT(calls[i].id && calls[i].res);
        c[i] = (struct capture_call){.capture_id = calls[i].id,
                                     .operation = "capture",
                                     .started_ms = calls[i].started_ms,
                                     .res = calls[i].res,
                                     .written_maybe = calls[i].written_maybe};
    }
    enum charged_rc rc = capture_store_log_calls(store_of(op), c, n, err);
    free(c);
    return rc;
}

static enum charged_rc capture_persist(void *op, struct engine_outcome *items, size_t n,
                                       struct charged_error *err)
{
    return capture_store_persist(store_of(op), items, n, err);
}

static enum charged_rc capture_renew(void *op, const char *const *ids, const int *kinds,
                                     const int64_t *epochs, size_t n,
                                     long long lease_ms, int *still_ours,
                                     struct charged_error *err)
{
    (void)kinds;
    return capture_store_renew(store_of(op), ids, epochs, n, lease_ms, still_ours, err);
}

static enum charged_rc capture_release_leases(void *op, const char *const *ids,
                                              const int *kinds, const int64_t *epochs,
                                              size_t n, struct charged_error *err)
{
    (void)kinds;
    return capture_store_release(store_of(op), ids, epochs, n, err);
}

static enum charged_rc capture_wait(void *op, const struct store_wait *items, size_t n,
                                    struct charged_error *err)
{
    return capture_store_wait(store_of(op), items, n, err);
}

/* Its provider object: the payment intent it acts on. */
static const char *capture_object_of(int kind, const void *params)
{
    (void)kind;
    return ((const struct capture_params *)params)->payment_intent;
}

static enum charged_rc capture_start_call(void *op, provider_client_t *pc,
                                          const void *params, const void *command,
                                          void *tag, struct charged_error *err)
{
    (void)op;
    (void)command;
    const struct provider_capture c = capture_op_request(params);
    return provider_client_start_capture(pc, &c, tag, err);
}

static const char *capture_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return capture_status_event_type(status);
}

/* The charge's table (payment_answer_decide): send again under the key
 * while nothing executed, a lost answer UNKNOWN (never FAILED), a refusal
 * FAILED (the hold given back by the database). A capture's answer that
 * the money is only held is no success: a person looks. */
static struct answer_decision capture_decide(int kind, const struct engine_policy *p,
                                             enum provider_outcome outcome,
                                             int may_replay, int tries,
                                             int key_window_open, unsigned jitter)
{
    if (outcome == PROVIDER_AUTHORIZED)
        outcome = PROVIDER_REQUIRES_REVIEW;
    struct answer_decision d = payment_answer_decide(kind, p, outcome, may_replay,
                                                     tries, key_window_open, jitter);
    /* Only the provider's refusal fails a capture: a call that may have
     * executed never does. */
    CHARGED_ASSERT(d.next != ANSWER_NEXT_SETTLE || d.status != ATTEMPT_STATUS_FAILED ||
                   outcome == PROVIDER_INVALID || outcome == PROVIDER_DECLINED);
    return d;
}

/* payment_answer_outcome's reason and evidence, with a refusal's reason
 * code the capture's own (capture_refusal_code) and the intent's capture
 * fields in the evidence: amount_received is what a success captured
 * (capture_store_persist books it). */
static char *capture_outcome(int kind, const struct provider_result *res,
                             const struct answer_decision *d, int calls, char *reason,
                             size_t reason_size, const char **provider_id)
{
    char *s =
        payment_answer_outcome(kind, res, d, calls, reason, reason_size, provider_id);
    json_t *e = s ? json_loads(s, 0, NULL) : NULL;
    free(s);
    if (!e)
        return NULL;
    if (d->status == ATTEMPT_STATUS_FAILED && res->outcome == PROVIDER_INVALID) {
        char detail[400];
        provider_outcome_detail(res, detail, sizeof(detail));
        snprintf(reason, reason_size, "%s: %s", capture_refusal_code(res), detail);
    }
    /* json_object_set_new steals the new values' references. */
    if (res->intent_status[0])
        json_object_set_new(e, "intent_status", json_string(res->intent_status));
    if (res->amount_received >= 0)
        json_object_set_new(e, "amount_received", json_integer(res->amount_received));
    if (res->amount_capturable >= 0)
        json_object_set_new(e, "amount_capturable",
                            json_integer(res->amount_capturable));
    if (res->cancellation_reason[0])
        json_object_set_new(e, "cancellation_reason",
                            json_string(res->cancellation_reason));
    s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

static unsigned capture_outcomes_metric(int kind)
{
    (void)kind;
    return METRIC_CAPTURES;
}

static const char *capture_id_field(int kind)
{
    (void)kind;
    return "capture_id";
}

const struct engine_op capture_op = {
    .name = "capture",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct capture_command),
    .params_size = sizeof(struct capture_params),
    OP_CALLBACKS(capture),
    .ping = capture_ping,
    .log_calls = capture_log_calls,
    .persist = capture_persist,
    .renew = capture_renew,
    .release_leases = capture_release_leases,
    .wait = capture_wait,
    .decide = capture_decide,
    .outcome = capture_outcome,
    .id_field = capture_id_field,
    .outcomes_metric = capture_outcomes_metric,
};
