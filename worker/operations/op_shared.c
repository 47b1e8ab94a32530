#include "op_shared.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "store_stmt.h"

enum charged_rc op_store_open(struct op_store *s, int refunds, config_t *cfg,
                              const char *actor, struct charged_error *err)
{
    const char *url = config_str(cfg, CONFIG_DATABASE_URL);
    CHARGED_ASSERT(s && !s->attempts && !s->refunds && actor);
    /* Does not connect: a worker started while the database is down keeps
     * running, and its database steps retry with back-off. */
    if (refunds)
        s->refunds = refund_store_new(url, actor, err);
    else
        s->attempts = attempt_store_new(url, actor, err);
    return s->attempts || s->refunds ? CHARGED_OK : CHARGED_GIVE_UP;
}

void op_store_close(struct op_store *s)
{
    attempt_store_free(s->attempts);
    refund_store_free(s->refunds);
}

/* The store of a payment operation's state. */
static const struct op_store *store_of(void *op)
{
    const struct op_store *s = op;
    CHARGED_ASSERT(s && !s->attempts != !s->refunds);
    return s;
}

enum charged_rc op_store_ping(void *op, struct charged_error *err)
{
    const struct op_store *s = store_of(op);
    return s->attempts ? attempt_store_ping(s->attempts, err)
                       : refund_store_ping(s->refunds, err);
}

static enum charged_rc log_attempt_calls(attempt_store_t *st,
                                         const struct engine_call *calls, size_t n,
                                         struct charged_error *err)
{
    struct attempt_call *a = op_batch_new(n, sizeof(*a), err);
    if (!a)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        a[i] = (struct attempt_call){.attempt_id = calls[i].id,
                                     .started_ms = calls[i].started_ms,
                                     .res = calls[i].res,
                                     .written_maybe = calls[i].written_maybe};
    enum charged_rc rc = attempt_store_log_calls(st, a, n, err);
    free(a);
    return rc;
}

static enum charged_rc log_refund_calls(refund_store_t *st,
                                        const struct engine_call *calls, size_t n,
                                        struct charged_error *err)
{
    struct refund_call *r = op_batch_new(n, sizeof(*r), err);
    if (!r)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++)
        r[i] = (struct refund_call){.refund_id = calls[i].id,
                                    .started_ms = calls[i].started_ms,
                                    .res = calls[i].res,
                                    .written_maybe = calls[i].written_maybe};
    enum charged_rc rc = refund_store_log_calls(st, r, n, err);
    free(r);
    return rc;
}

enum charged_rc op_store_log_calls(void *op, const struct engine_call *calls, size_t n,
                                   struct charged_error *err)
{
    const struct op_store *s = store_of(op);
    /* A call is recorded only with its record's id and its answer. */
    for (size_t i = 0; i < n; i++)
        CHARGED_ASSERT(calls[i].id && calls[i].res);
    return s->attempts ? log_attempt_calls(s->attempts, calls, n, err)
                       : log_refund_calls(s->refunds, calls, n, err);
}

static enum charged_rc persist_attempts(attempt_store_t *st,
                                        struct engine_outcome *items, size_t n,
                                        struct charged_error *err)
{
    struct attempt_outcome *a = op_batch_new(n, sizeof(*a), err);
    if (!a)
        return CHARGED_RETRY;
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
    enum charged_rc rc = attempt_store_persist(st, a, n, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        items[i].persisted = a[i].persisted;
        items[i].busy = a[i].busy;
    }
    free(a);
    return rc;
}

static enum charged_rc persist_refunds(refund_store_t *st, struct engine_outcome *items,
                                       size_t n, struct charged_error *err)
{
    struct refund_outcome *r = op_batch_new(n, sizeof(*r), err);
    if (!r)
        return CHARGED_RETRY;
    for (size_t i = 0; i < n; i++) {
        const struct engine_outcome *o = &items[i];
        /* A refund's outcome settles a refund: its events are refund.*. */
        CHARGED_ASSERT(!o->event_type || !strncmp(o->event_type, "refund.", 7));
        r[i] = (struct refund_outcome){
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
    enum charged_rc rc = refund_store_persist(st, r, n, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        items[i].persisted = r[i].persisted;
        items[i].busy = r[i].busy;
    }
    free(r);
    return rc;
}

enum charged_rc op_store_persist(void *op, struct engine_outcome *items, size_t n,
                                 struct charged_error *err)
{
    const struct op_store *s = store_of(op);
    for (size_t i = 0; i < n; i++)
        /* Fenced on the claim it belongs to: one was made (epoch 1 on), and
         * the status is one of the table's. */
        CHARGED_ASSERT(items[i].id && items[i].lease_epoch > 0 &&
                       attempt_status_parse(items[i].status) >= 0);
    return s->attempts ? persist_attempts(s->attempts, items, n, err)
                       : persist_refunds(s->refunds, items, n, err);
}

enum charged_rc op_store_renew(void *op, const char *const *ids, const int *kinds,
                               const int64_t *epochs, size_t n, long long lease_ms,
                               int *still_ours, struct charged_error *err)
{
    const struct op_store *s = store_of(op);
    (void)kinds;
    CHARGED_ASSERT(n == 0 || (ids && epochs && still_ours));
    CHARGED_ASSERT(lease_ms > 0);
    return s->attempts ? attempt_store_renew(s->attempts, ids, epochs, n, lease_ms,
                                             still_ours, err)
                       : refund_store_renew(s->refunds, ids, epochs, n, lease_ms,
                                            still_ours, err);
}

enum charged_rc op_store_release_leases(void *op, const char *const *ids,
                                        const int *kinds, const int64_t *epochs,
                                        size_t n, struct charged_error *err)
{
    const struct op_store *s = store_of(op);
    (void)kinds;
    CHARGED_ASSERT(n == 0 || (ids && epochs));
    return s->attempts ? attempt_store_release(s->attempts, ids, epochs, n, err)
                       : refund_store_release(s->refunds, ids, epochs, n, err);
}

enum charged_rc op_store_wait(void *op, const struct store_wait *items, size_t n,
                              struct charged_error *err)
{
    const struct op_store *s = store_of(op);
    CHARGED_ASSERT(items || n == 0);
    return s->attempts ? attempt_store_wait(s->attempts, items, n, err)
                       : refund_store_wait(s->refunds, items, n, err);
}

void *op_batch_new(size_t n, size_t size, struct charged_error *err)
{
    CHARGED_ASSERT(size > 0 && err);
    void *items = calloc(n ? n : 1, size);
    if (!items)
        charged_error_set(err, "out of memory");
    return items;
}

enum charged_rc op_outcomes_lock(store_conn_t *db, const char *lock_sql,
                                 struct engine_outcome *items, size_t n,
                                 struct engine_outcome **ours, size_t *nours,
                                 struct charged_error *err)
{
    CHARGED_ASSERT(db && lock_sql && ours && nours);
    CHARGED_ASSERT(items || n == 0);
    const char **ids = op_batch_new(n, sizeof(*ids), err);
    int *locked = op_batch_new(n, sizeof(*locked), err);
    enum charged_rc rc = CHARGED_RETRY;
    *nours = 0;
    if (!(*ours = op_batch_new(n, sizeof(**ours), err)) || !ids || !locked)
        goto out;
    for (size_t i = 0; i < n; i++)
        ids[i] = items[i].id;
    if ((rc = stmt_lock_ids(db, lock_sql, ids, n, locked, err)) != CHARGED_OK)
        goto out;
    for (size_t i = 0; i < n; i++) {
        items[i].persisted = 0;
        items[i].busy = !locked[i];
        if (locked[i])
            (*ours)[(*nours)++] = items[i];
    }
out:
    CHARGED_ASSERT(*nours <= n);
    free(ids);
    free(locked);
    return rc;
}

void op_outcomes_unpack(struct engine_outcome *items, size_t n,
                        const struct engine_outcome *ours, size_t nours)
{
    CHARGED_ASSERT(items || n == 0);
    CHARGED_ASSERT(ours || nours == 0);
    size_t k = 0;
    for (size_t i = 0; i < n && k < nours; i++)
        if (!items[i].busy) {
            /* In items' order: the copy of this very outcome. */
            CHARGED_ASSERT(ours[k].id == items[i].id);
            items[i].persisted = ours[k].persisted;
            items[i].busy = ours[k].busy;
            k++;
        }
    CHARGED_ASSERT(k == nours);
}

void op_batch_claimed(struct engine_claim *it, enum engine_claim_result result,
                      int64_t lease_epoch, int64_t key_age_ms, const char *status,
                      const void *params, size_t params_size)
{
    CHARGED_ASSERT(it && status && params);
    CHARGED_ASSERT(result == ENGINE_CLAIMED || result == ENGINE_SETTLED ||
                   result == ENGINE_BUSY);
    it->result = result;
    it->lease_epoch = lease_epoch;
    it->key_age_ms = key_age_ms;
    snprintf(it->status, sizeof(it->status), "%s", status);
    if (result != ENGINE_CLAIMED)
        return;
    /* A claim takes the lease a step further: never the epoch before any. */
    CHARGED_ASSERT(lease_epoch > 0 && it->params);
    memcpy(it->params, params, params_size);
}

/* ---- operations over payment attempts ---- */

struct provider_charge op_attempts_request(const struct attempt_params *p,
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
        .capture_method =
            p->manual ? PROVIDER_CAPTURE_MANUAL : PROVIDER_CAPTURE_AUTOMATIC,
    };
}

void *op_attempts_open(config_t *cfg, const char *actor, const char *command_type,
                       int manual, struct charged_error *err)
{
    CHARGED_ASSERT(cfg && actor && command_type);
    struct op_attempts *a = calloc(1, sizeof(*a));
    if (!a) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    a->limits.max_bytes = (size_t)config_int(cfg, CONFIG_WORKER_MAX_COMMAND_BYTES);
    a->limits.max_amount = config_int(cfg, CONFIG_WORKER_MAX_AMOUNT);
    a->limits.allowed_currencies = config_str(cfg, CONFIG_WORKER_ALLOWED_CURRENCIES);
    a->command_type = command_type;
    a->manual = manual != 0;
    if (op_store_open(&a->store, 0, cfg, actor, err) != 0) {
        free(a);
        return NULL;
    }
    return a;
}

void op_attempts_close(void *op)
{
    struct op_attempts *a = op;
    if (!a)
        return;
    op_store_close(&a->store);
    free(a);
}

/* The attempts' store of the state. */
static attempt_store_t *attempts_of(void *op)
{
    CHARGED_ASSERT(op);
    attempt_store_t *st = ((struct op_attempts *)op)->store.attempts;
    CHARGED_ASSERT(st); /* op_attempts_open made it */
    return st;
}

enum dead_letter_reason op_attempts_parse(void *op, const void *key, size_t key_len,
                                          const void *value, size_t value_len,
                                          void *command, struct charged_error *err)
{
    const struct op_attempts *a = op;
    CHARGED_ASSERT(a && command);
    return charge_command_parse_as(a->command_type, a->manual, key, key_len, value,
                                   value_len, &a->limits, command, err);
}

void op_attempts_release(void *command)
{
    charge_command_release(command);
}

const char *op_attempts_id_of(const void *command)
{
    return ((const struct charge_command *)command)->payment_attempt_id;
}

const char *op_attempts_order_of(const void *command)
{
    return ((const struct charge_command *)command)->order_id;
}

enum charged_rc op_attempts_record(void *op, struct engine_record *items, size_t n,
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
    enum charged_rc rc = attempt_store_record(attempts_of(op), a, n, lease_ms, err);
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

enum charged_rc op_attempts_claim(void *op, struct engine_claim *items, size_t n,
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
    enum charged_rc rc = attempt_store_claim(attempts_of(op), a, n, lease_ms, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++) {
        CHARGED_ASSERT((unsigned)a[i].result < sizeof(results) / sizeof(results[0]));
        op_batch_claimed(&items[i], results[a[i].result], a[i].lease_epoch,
                         a[i].key_age_ms, a[i].status, &a[i].params,
                         sizeof(a[i].params));
    }
    free(a);
    return rc;
}

int op_sets_aside(int kind)
{
    (void)kind;
    return 1;
}

const char *op_attempts_object_of(int kind, const void *params)
{
    (void)kind;
    return ((const struct attempt_params *)params)->payment_method;
}

enum charged_rc op_attempts_start_call(void *op, provider_client_t *pc,
                                       const void *params, const void *command,
                                       void *tag, struct charged_error *err)
{
    const struct op_attempts *a = op;
    const struct attempt_params *p = params;
    /* The stored attempt is what this operation records: a charge is never
     * sent as an authorization, nor the other way round. */
    CHARGED_ASSERT(a && p && p->manual == a->manual);
    const struct provider_charge ch =
        op_attempts_request(p, op_attempts_id_of(command));
    return provider_client_start_charge(pc, &ch, tag, err);
}
