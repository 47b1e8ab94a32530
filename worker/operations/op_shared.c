#include "op_shared.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"

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

void *op_batch_new(size_t n, size_t size, struct charged_error *err)
{
    CHARGED_ASSERT(size > 0 && err);
    void *items = calloc(n ? n : 1, size);
    if (!items)
        charged_error_set(err, "out of memory");
    return items;
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
