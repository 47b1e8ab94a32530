#include "payment_ops.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "command_fields.h"
#include "metrics.h"
#include "op.h"
#include "op_shared.h"

/* Kinds are the indexes of the table of operations (op.h); the first is
 * also the one whose error a message of no known type gets. */
#define NOPS payment_operations_count

struct routed_command {
    int kind;
    union {
        max_align_t align;
        unsigned char bytes[PAYMENT_OP_COMMAND_MAX];
    } u;
};

struct routed_state {
    void *states[PAYMENT_OPS_MAX];
};

/* The worker's stages of kind k (NULL: the worker runs none of its). */
static const struct engine_op *engine_of(size_t k)
{
    return payment_op_of(k)->engine;
}

static const void *inner(const void *command)
{
    return &((const struct routed_command *)command)->u;
}

static int kind_of(const void *command)
{
    int k = ((const struct routed_command *)command)->kind;
    CHARGED_ASSERT(k >= 0 && (size_t)k < NOPS); /* set by routed_parse */
    return k;
}

/* The descriptor of a kind the engine handed back. */
static const struct engine_op *op_of(int kind)
{
    CHARGED_ASSERT(kind >= 0 && (size_t)kind < NOPS);
    const struct engine_op *o = engine_of((size_t)kind);
    CHARGED_ASSERT(o); /* only an operation with stages is given a kind */
    return o;
}

static void routed_close(void *op)
{
    struct routed_state *r = op;
    if (!r)
        return;
    for (size_t k = 0; k < NOPS; k++)
        if (r->states[k])
            engine_of(k)->close(r->states[k]);
    free(r);
}

static void *routed_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    struct routed_state *r = calloc(1, sizeof(*r));
    if (!r) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    for (size_t k = 0; k < NOPS; k++) {
        const struct engine_op *o = engine_of(k);
        if (!o)
            continue;
        /* The job's buffers hold any kind's command and params. */
        CHARGED_ASSERT(o->command_size <= PAYMENT_OP_COMMAND_MAX &&
                       o->params_size <= PAYMENT_OP_PARAMS_MAX);
        if (!(r->states[k] = o->open(cfg, actor, err))) {
            routed_close(r);
            return NULL;
        }
    }
    /* Every kind routed to has its state: state_of never hands out NULL. */
    for (size_t k = 0; k < NOPS; k++)
        CHARGED_ASSERT(r->states[k] || !engine_of(k));
    return r;
}

static void *state_of(void *op, int kind)
{
    CHARGED_ASSERT(op && kind >= 0 && (size_t)kind < NOPS);
    return ((struct routed_state *)op)->states[kind];
}

/* The error of a message of no known type: the types routed to. */
static void say_types(struct charged_error *err)
{
    const size_t err_size = sizeof(err->message);
    size_t at = (size_t)snprintf(err->message, err_size, "'type' must be ");
    size_t n = 0, left = 0;
    for (size_t k = 0; k < NOPS; k++)
        left += engine_of(k) != NULL;
    for (size_t k = 0; k < NOPS && at < err_size; k++) {
        if (!engine_of(k))
            continue;
        const char *sep = n == 0 ? "" : n + 1 == left ? " or " : ", ";
        at += (size_t)snprintf(err->message + at, err_size - at, "%s\"%s\"", sep,
                               payment_op_of(k)->command_type);
        n++;
    }
}

/* A charge first (the common case, parsed once); a message its parser
 * refuses on the schema and whose type another operation names is that
 * operation's. */
static enum dead_letter_reason routed_parse(void *op, const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            void *command, struct charged_error *err)
{
    struct routed_command *c = command;
    c->kind = 0;
    enum dead_letter_reason r =
        op_of(0)->parse(state_of(op, 0), key, key_len, value, value_len, &c->u, err);
    if (r != DEAD_LETTER_SCHEMA_VIOLATION)
        return r;
    for (size_t k = 1; k < NOPS; k++)
        if (engine_of(k) &&
            command_fields_type_is(value, value_len, payment_op_of(k)->command_type)) {
            c->kind = (int)k;
            return engine_of(k)->parse(state_of(op, (int)k), key, key_len, value,
                                       value_len, &c->u, err);
        }
    if (!strncmp(err->message, "'type'", 6))
        say_types(err);
    return r;
}

static void routed_release(void *command)
{
    op_of(kind_of(command))->release(&((struct routed_command *)command)->u);
}

static const char *routed_id_of(const void *command)
{
    return op_of(kind_of(command))->id_of(inner(command));
}

static const char *routed_order_of(const void *command)
{
    return op_of(kind_of(command))->order_of(inner(command));
}

static enum charged_rc routed_ping(void *op, struct charged_error *err)
{
    return op_of(0)->ping(state_of(op, 0), err);
}

/* Each stage below runs the items of one kind after the other: a copy of
 * them, in batch order, through that kind's descriptor, and the results
 * back. The first failure ends the stage (every stage is safe to repeat). */

static enum charged_rc routed_record(void *op, struct engine_record *items, size_t n,
                                     long long lease_ms, struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    struct engine_record *sub = calloc(n ? n : 1, sizeof(*sub));
    size_t *at = calloc(n ? n : 1, sizeof(*at));
    if (!sub || !at) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
        goto out;
    }
    size_t routed = 0;
    for (size_t k = 0; k < NOPS && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (kind_of(items[i].command) == (int)k) {
                sub[m] = items[i];
                sub[m].command = inner(items[i].command);
                at[m++] = i;
            }
        if (m && (rc = engine_of(k)->record(state_of(op, (int)k), sub, m, lease_ms,
                                            err)) == CHARGED_OK)
            for (size_t i = 0; i < m; i++) {
                sub[i].command = items[at[i]].command;
                items[at[i]] = sub[i];
            }
        routed += m;
    }
    /* Every item went to one operation, once. */
    CHARGED_ASSERT(rc != CHARGED_OK || routed == n);
out:
    free(sub);
    free(at);
    return rc;
}

static enum charged_rc routed_claim(void *op, struct engine_claim *items, size_t n,
                                    long long lease_ms, struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    struct engine_claim *sub = calloc(n ? n : 1, sizeof(*sub));
    size_t *at = calloc(n ? n : 1, sizeof(*at));
    if (!sub || !at) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
        goto out;
    }
    size_t routed = 0;
    for (size_t k = 0; k < NOPS && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].kind == (int)k) {
                sub[m] = items[i];
                at[m++] = i;
            }
        if (m && (rc = engine_of(k)->claim(state_of(op, (int)k), sub, m, lease_ms,
                                           err)) == CHARGED_OK)
            for (size_t i = 0; i < m; i++)
                items[at[i]] = sub[i];
        routed += m;
    }
    CHARGED_ASSERT(rc != CHARGED_OK || routed == n); /* each item once */
out:
    free(sub);
    free(at);
    return rc;
}

static enum charged_rc routed_log_calls(void *op, const struct engine_call *calls,
                                        size_t n, struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    struct engine_call *sub = calloc(n ? n : 1, sizeof(*sub));
    if (!sub) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    size_t routed = 0;
    for (size_t k = 0; k < NOPS && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (calls[i].kind == (int)k)
                sub[m++] = calls[i];
        if (m)
            rc = engine_of(k)->log_calls(state_of(op, (int)k), sub, m, err);
        routed += m;
    }
    /* No call of an unknown kind is dropped unwritten. */
    CHARGED_ASSERT(rc != CHARGED_OK || routed == n);
    free(sub);
    return rc;
}

static enum charged_rc routed_persist(void *op, struct engine_outcome *items, size_t n,
                                      struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    size_t routed = 0;
    struct engine_outcome *sub = calloc(n ? n : 1, sizeof(*sub));
    size_t *at = calloc(n ? n : 1, sizeof(*at));
    if (!sub || !at) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
        goto out;
    }
    for (size_t k = 0; k < NOPS && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].kind == (int)k) {
                sub[m] = items[i];
                at[m++] = i;
            }
        if (m && (rc = engine_of(k)->persist(state_of(op, (int)k), sub, m, err)) ==
                     CHARGED_OK)
            for (size_t i = 0; i < m; i++) {
                items[at[i]].persisted = sub[i].persisted;
                items[at[i]].busy = sub[i].busy;
            }
        routed += m;
    }
    /* No outcome of an unknown kind is left unwritten as if written. */
    CHARGED_ASSERT(rc != CHARGED_OK || routed == n);
out:
    free(sub);
    free(at);
    return rc;
}

/* renew (still_ours not NULL) or release, routed by kind. */
static enum charged_rc routed_leases(void *op, const char *const *ids, const int *kinds,
                                     const int64_t *epochs, size_t n,
                                     long long lease_ms, int *still_ours,
                                     struct charged_error *err)
{
    CHARGED_ASSERT(n == 0 || (ids && kinds && epochs));
    enum charged_rc rc = CHARGED_OK;
    const char **sid = calloc(n ? n : 1, sizeof(*sid));
    int64_t *sep = calloc(n ? n : 1, sizeof(*sep));
    int *sours = calloc(n ? n : 1, sizeof(*sours));
    size_t *at = calloc(n ? n : 1, sizeof(*at));
    if (!sid || !sep || !sours || !at) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
        goto out;
    }
    size_t routed = 0;
    for (size_t k = 0; k < NOPS && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (kinds[i] == (int)k) {
                sid[m] = ids[i];
                sep[m] = epochs[i];
                at[m++] = i;
            }
        routed += m;
        if (m == 0)
            continue;
        if (still_ours) {
            rc = engine_of(k)->renew(state_of(op, (int)k), sid, NULL, sep, m, lease_ms,
                                     sours, err);
            for (size_t i = 0; rc == CHARGED_OK && i < m; i++)
                still_ours[at[i]] = sours[i];
        } else {
            rc = engine_of(k)->release_leases(state_of(op, (int)k), sid, NULL, sep, m,
                                              err);
        }
    }
    /* Every lease went to its operation's store: none kept by mistake. */
    CHARGED_ASSERT(rc != CHARGED_OK || routed == n);
out:
    free(sid);
    free(sep);
    free(sours);
    free(at);
    return rc;
}

static enum charged_rc routed_renew(void *op, const char *const *ids, const int *kinds,
                                    const int64_t *epochs, size_t n, long long lease_ms,
                                    int *still_ours, struct charged_error *err)
{
    return routed_leases(op, ids, kinds, epochs, n, lease_ms, still_ours, err);
}

static enum charged_rc routed_release_leases(void *op, const char *const *ids,
                                             const int *kinds, const int64_t *epochs,
                                             size_t n, struct charged_error *err)
{
    return routed_leases(op, ids, kinds, epochs, n, 0, NULL, err);
}

/* The waits of each kind to its operation's store, one UPDATE per kind. */
static enum charged_rc routed_wait(void *op, const struct store_wait *items, size_t n,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(items || n == 0);
    enum charged_rc rc = CHARGED_OK;
    struct store_wait *sub = calloc(n ? n : 1, sizeof(*sub));
    if (!sub) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    size_t routed = 0;
    for (size_t k = 0; k < NOPS && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (items[i].kind == (int)k)
                sub[m++] = items[i];
        if (m)
            rc = engine_of(k)->wait(state_of(op, (int)k), sub, m, err);
        routed += m;
    }
    CHARGED_ASSERT(rc != CHARGED_OK || routed == n); /* each wait once */
    free(sub);
    return rc;
}

static const char *routed_object_of(int kind, const void *params)
{
    const struct engine_op *o = op_of(kind);
    return o->object_of ? o->object_of(0, params) : NULL;
}

static int routed_sets_aside(int kind)
{
    const struct engine_op *o = op_of(kind);
    return o->sets_aside && o->sets_aside(0);
}

static enum charged_rc routed_start_call(void *op, provider_client_t *pc,
                                         const void *params, const void *command,
                                         void *tag, struct charged_error *err)
{
    int k = kind_of(command);
    /* The claim's params, never the message's: a claim gave them. */
    CHARGED_ASSERT(pc && params);
    return op_of(k)->start_call(state_of(op, k), pc, params, inner(command), tag, err);
}

static const char *routed_event_type(int kind, enum attempt_status status)
{
    return op_of(kind)->event_type(0, status);
}

/* Each kind is decided, and its outcome told, by its own operation. */
static struct answer_decision routed_decide(int kind, const struct engine_policy *p,
                                            enum provider_outcome outcome,
                                            int may_replay, int tries,
                                            int key_window_open, unsigned jitter)
{
    return op_of(kind)->decide(0, p, outcome, may_replay, tries, key_window_open,
                               jitter);
}

static char *routed_outcome(int kind, const struct provider_result *res,
                            const struct answer_decision *d, int calls, char *reason,
                            size_t reason_size, const char **provider_id)
{
    return op_of(kind)->outcome(0, res, d, calls, reason, reason_size, provider_id);
}

static const char *routed_kind_name(int kind)
{
    return op_of(kind)->name;
}

static const char *routed_id_field(int kind)
{
    const struct engine_op *o = op_of(kind);
    return o->id_field ? o->id_field(0) : NULL;
}

static unsigned routed_outcomes_metric(int kind)
{
    const struct engine_op *o = op_of(kind);
    return o->outcomes_metric ? o->outcomes_metric(0) : METRIC_ATTEMPTS;
}

/* The kind's line of the table says it (op.h). */
static void routed_budget_of(int kind, enum budget_class *cls,
                             enum budget_priority *prio)
{
    CHARGED_ASSERT(op_of(kind) && cls && prio); /* a kind with stages */
    const struct payment_op *p = payment_op_of((size_t)kind);
    *cls = p->endpoint_class;
    *prio = p->budget_priority;
    CHARGED_ASSERT((unsigned)*cls < BUDGET_CLASS_COUNT &&
                   (unsigned)*prio < BUDGET_PRIO_COUNT);
}

const struct engine_op payment_ops = {
    .name = "charge",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct routed_command),
    .params_size = PAYMENT_OP_PARAMS_MAX,
    OP_CALLBACKS(routed),
    OP_STORE_CALLBACKS(routed),
    .decide = routed_decide,
    .outcome = routed_outcome,
    .sets_aside = routed_sets_aside,
    .kind_of = kind_of,
    .kind_name = routed_kind_name,
    .id_field = routed_id_field,
    .outcomes_metric = routed_outcomes_metric,
    .budget_of = routed_budget_of,
};
