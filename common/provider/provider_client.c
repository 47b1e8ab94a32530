/* provider_client: the callers' face of the provider seam (provider.h).
 * Each call checks what its contract requires of the caller and hands the
 * rest to the backend the client was opened with; nothing here knows a
 * provider's paths, headers or shapes. */
#include "provider_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "provider.h"
#include "stripe.h"

struct provider_client {
    const struct provider_backend *be;
    void *impl; /* the backend's own client, from be->open */
    provider_gate_fn gate;
    void *gate_ctx;
};

void provider_client_set_gate(provider_client_t *pc, provider_gate_fn gate, void *ctx)
{
    CHARGED_ASSERT(pc != NULL);
    pc->gate = gate;
    pc->gate_ctx = ctx;
}

/* 1 when the request may be sent; else res says it was not (NOT_EXECUTED:
 * nothing reached the wire). */
static int gate_open(provider_client_t *pc, enum budget_class cls,
                     struct provider_result *res)
{
    char why[sizeof(res->error)];
    if (!pc->gate || pc->gate(pc->gate_ctx, cls, why, sizeof(why)) == 0)
        return 1;
    memset(res, 0, sizeof(*res));
    res->outcome = PROVIDER_NOT_EXECUTED;
    snprintf(res->error, sizeof(res->error), "%s", why);
    return 0;
}

/* The same for a start: CHARGED_OK, or CHARGED_RETRY and err. */
static enum charged_rc gate_start(provider_client_t *pc, enum budget_class cls,
                                  struct charged_error *err)
{
    char why[256];
    if (!pc->gate || pc->gate(pc->gate_ctx, cls, why, sizeof(why)) == 0)
        return CHARGED_OK;
    charged_error_set(err, "%s", why);
    return CHARGED_RETRY;
}

/* Every backend there is, by name. */
static const struct provider_backend *const backends[] = {&provider_stripe};

const struct provider_backend *provider_backend_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof(backends) / sizeof(backends[0]); i++)
        if (!strcmp(backends[i]->name, name))
            return backends[i];
    return NULL;
}

const struct provider_backend *provider_backend_default(void)
{
    const struct provider_backend *be = provider_backend_find(PROVIDER_BACKEND_DEFAULT);
    CHARGED_ASSERT(be != NULL); /* the default is one of the table's */
    return be;
}

provider_client_t *provider_client_open(const struct provider_backend *be,
                                        const char *base_url, const char *api_key,
                                        const char *api_version, long timeout_ms,
                                        struct charged_error *err)
{
    CHARGED_ASSERT(be != NULL && be->open != NULL);
    CHARGED_ASSERT(err != NULL);
    provider_client_t *pc = calloc(1, sizeof(*pc));
    if (!pc) {
        charged_error_set(err, "provider client: out of memory");
        return NULL;
    }
    pc->be = be;
    pc->impl = be->open(base_url, api_key, api_version, timeout_ms, err);
    if (!pc->impl) {
        free(pc);
        return NULL;
    }
    return pc;
}

provider_client_t *provider_client_new(const char *base_url, const char *api_key,
                                       const char *api_version, long timeout_ms,
                                       struct charged_error *err)
{
    return provider_client_open(provider_backend_default(), base_url, api_key,
                                api_version, timeout_ms, err);
}

void provider_client_free(provider_client_t *pc)
{
    if (!pc)
        return;
    CHARGED_ASSERT(pc->be != NULL && pc->impl != NULL);
    pc->be->close(pc->impl);
    free(pc);
}

void provider_client_charge(provider_client_t *pc, const struct provider_charge *ch,
                            struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && ch != NULL && res != NULL);
    if (gate_open(pc, BUDGET_CLASS_CREATE, res))
        pc->be->charge(pc->impl, ch, res);
}

void provider_client_retrieve(provider_client_t *pc, const char *payment_intent_id,
                              struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (gate_open(pc, BUDGET_CLASS_RETRIEVE, res))
        pc->be->retrieve(pc->impl, payment_intent_id, res);
}

void provider_client_search(provider_client_t *pc, const char *payment_attempt_id,
                            struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (gate_open(pc, BUDGET_CLASS_SEARCH, res))
        pc->be->search(pc->impl, payment_attempt_id, res);
}

void provider_client_list(provider_client_t *pc, const char *payment_attempt_id,
                          long long created_gte, long long created_lt,
                          const char *starting_after, struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (gate_open(pc, BUDGET_CLASS_LIST, res))
        pc->be->list(pc->impl, payment_attempt_id, created_gte, created_lt,
                     starting_after, res);
}

void provider_client_redact(char *dst, size_t size, const char *src)
{
    CHARGED_ASSERT(dst != NULL && size > 0);
    provider_backend_default()->redact(dst, size, src);
}

void provider_client_classify(const struct provider_call *call, int http_status,
                              const char *replayed, const char *body, size_t body_len,
                              struct provider_result *res)
{
    CHARGED_ASSERT(call != NULL && res != NULL);
    CHARGED_ASSERT(body != NULL || body_len == 0);
    provider_backend_default()->classify(call, http_status, replayed, body, body_len,
                                         res);
}

void provider_client_parse_page(enum provider_list_of what, int http_status,
                                const char *body, size_t body_len,
                                struct provider_page *page, struct provider_result *res)
{
    CHARGED_ASSERT(page != NULL && res != NULL);
    CHARGED_ASSERT(body != NULL || body_len == 0);
    provider_backend_default()->parse_page(what, http_status, body, body_len, page,
                                           res);
    CHARGED_ASSERT(page->n <= PROVIDER_PAGE_MAX);
}

enum charged_rc provider_client_start_charge(provider_client_t *pc,
                                             const struct provider_charge *ch,
                                             void *opaque, struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && ch != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_CREATE, err);
    return rc != CHARGED_OK ? rc : pc->be->start_charge(pc->impl, ch, opaque, err);
}

enum charged_rc provider_client_start_capture(provider_client_t *pc,
                                              const struct provider_capture *c,
                                              void *opaque, struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && c != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_CAPTURE, err);
    return rc != CHARGED_OK ? rc : pc->be->start_capture(pc->impl, c, opaque, err);
}

enum charged_rc provider_client_start_void(provider_client_t *pc,
                                           const struct provider_void *v, void *opaque,
                                           struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && v != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_CAPTURE, err);
    return rc != CHARGED_OK ? rc : pc->be->start_void(pc->impl, v, opaque, err);
}

enum charged_rc provider_client_start_refund(provider_client_t *pc,
                                             const struct provider_refund *r,
                                             void *opaque, struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && r != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_REFUND, err);
    return rc != CHARGED_OK ? rc : pc->be->start_refund(pc->impl, r, opaque, err);
}

void provider_client_retrieve_refund(provider_client_t *pc, const char *refund_id,
                                     struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (gate_open(pc, BUDGET_CLASS_RETRIEVE, res))
        pc->be->retrieve_refund(pc->impl, refund_id, res);
}

void provider_client_list_refunds(provider_client_t *pc, const char *payment_intent,
                                  const char *refund_id, const char *starting_after,
                                  struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (gate_open(pc, BUDGET_CLASS_LIST, res))
        pc->be->list_refunds(pc->impl, payment_intent, refund_id, starting_after, res);
}

void provider_client_list_page(provider_client_t *pc, enum provider_list_of what,
                               long long created_gte, long long created_lt,
                               const char *starting_after, struct provider_page *page,
                               struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && page != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_LIST, res)) {
        page->n = 0; /* nothing listed, nothing more */
        page->has_more = 0;
        return;
    }
    pc->be->list_page(pc->impl, what, created_gte, created_lt, starting_after, page,
                      res);
    CHARGED_ASSERT(page->n <= PROVIDER_PAGE_MAX);
}

void provider_client_fetch(provider_client_t *pc, enum provider_list_of what,
                           const char *id, struct provider_listed *obj,
                           struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && obj != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_RETRIEVE, res)) {
        memset(obj, 0, sizeof(*obj));
        return;
    }
    pc->be->fetch(pc->impl, what, id, obj, res);
}

enum charged_rc provider_client_start_probe(provider_client_t *pc, void *opaque,
                                            struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL);
    CHARGED_ASSERT(err != NULL);
    return pc->be->start_probe(pc->impl, opaque, err);
}

void provider_client_perform(provider_client_t *pc, int timeout_ms)
{
    CHARGED_ASSERT(pc != NULL);
    pc->be->perform(pc->impl, timeout_ms);
}

int provider_client_next_done(provider_client_t *pc, struct provider_result *res,
                              void **opaque)
{
    CHARGED_ASSERT(pc != NULL && res != NULL && opaque != NULL);
    return pc->be->next_done(pc->impl, res, opaque);
}

size_t provider_client_in_flight(const provider_client_t *pc)
{
    CHARGED_ASSERT(pc != NULL);
    return pc->be->in_flight(pc->impl);
}

void provider_client_abandon_all(provider_client_t *pc)
{
    CHARGED_ASSERT(pc != NULL);
    pc->be->abandon_all(pc->impl);
    CHARGED_ASSERT(pc->be->in_flight(pc->impl) == 0);
}
