/* provider_client: the callers' face of the provider seam (provider.h).
 * Each call checks what its contract requires of the caller and hands the
 * rest to the backend the client was opened with; nothing here knows a
 * provider's paths, headers or shapes. */
#include "provider_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "metrics.h"
#include "provider.h"
#include "stripe.h"

/* A gated client's asynchronous request, the backend's opaque for it
 * until its answer: the class its re-sends are charged to and its answer
 * counted under, and its operation's name. */
struct gated {
    struct gated *prev, *next;
    void *opaque; /* the caller's */
    enum budget_class cls;
    const char *op; /* a string literal */
};

struct provider_client {
    const struct provider_backend *be;
    void *impl; /* the backend's own client, from be->open */
    provider_gate_fn gate;
    provider_charge_fn charge;
    void *gate_ctx;
    struct gated *gated; /* a gated client's requests in flight */
};

void provider_client_set_gate(provider_client_t *pc, provider_gate_fn gate,
                              provider_charge_fn charge, void *ctx)
{
    CHARGED_ASSERT(pc != NULL && (gate != NULL || charge == NULL));
    /* Set before any request: an answer must find what it was started with. */
    CHARGED_ASSERT(pc->be->in_flight(pc->impl) == 0 && pc->gated == NULL);
    pc->gate = gate;
    pc->charge = charge;
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
    /* Over the fleet's limit as a 429 says over the provider's: a caller
     * backs off and asks again (a look not counted, a page asked again),
     * with no Retry-After. */
    res->throttled = 1;
    snprintf(res->error, sizeof(res->error), "%s", why);
    return 0;
}

/* A gated client's request was sent and its answer is in (blocking or
 * started). Every role but the worker gates its client (reconciler,
 * auditor, console, chargectl), so its answers are counted here, once, in
 * the series the worker's engine adds to for its own ungated client: the
 * responses by operation and outcome, and a 429 by endpoint class, over
 * which ChargedProviderThrottled fires per role. A request the gate
 * refused reached no provider and is not counted. Every arrival is paid
 * for: the requests the backend re-sent by itself (a pooled connection
 * closed unanswered) are charged to the gate after the fact. */
static void answered(provider_client_t *pc, enum budget_class cls, const char *op,
                     const struct provider_result *res)
{
    CHARGED_ASSERT(res->resent >= 0 && op != NULL);
    if (!pc->gate)
        return;
    metrics_observe(METRIC_PROVIDER_DURATION, (double)res->latency_ms / 1000.0, op);
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, op, provider_outcome_name(res->outcome));
    if (res->throttled)
        metrics_add(METRIC_PROVIDER_THROTTLED, 1, budget_class_name(cls));
    if (pc->charge && res->resent > 0)
        pc->charge(pc->gate_ctx, cls, res->resent);
}

static void gated_free(provider_client_t *pc, struct gated *g)
{
    if (g->prev)
        g->prev->next = g->next;
    else
        pc->gated = g->next;
    if (g->next)
        g->next->prev = g->prev;
    free(g);
}

/* The same for a start: CHARGED_OK with *opaque the one to hand the
 * backend (a gated client's wraps the caller's with the class), or
 * CHARGED_RETRY and err. */
static enum charged_rc gate_start(provider_client_t *pc, enum budget_class cls,
                                  const char *op, void **opaque,
                                  struct charged_error *err)
{
    char why[256];
    struct gated *g = NULL;
    if (pc->gate) {
        if (!(g = calloc(1, sizeof(*g)))) {
            charged_error_set(err, "provider client: out of memory");
            return CHARGED_RETRY;
        }
        *g = (struct gated){.next = pc->gated, .opaque = *opaque, .cls = cls, .op = op};
        if (pc->gated)
            pc->gated->prev = g;
        pc->gated = g;
    }
    if (!pc->gate || pc->gate(pc->gate_ctx, cls, why, sizeof(why)) == 0) {
        *opaque = g ? (void *)g : *opaque;
        return CHARGED_OK;
    }
    if (g)
        gated_free(pc, g);
    charged_error_set(err, "%s", why);
    return CHARGED_RETRY;
}

/* After the backend's start: a request that did not start forgets its
 * wrapper. */
static enum charged_rc started(provider_client_t *pc, enum charged_rc rc, void *opaque)
{
    if (rc != CHARGED_OK && pc->gate)
        gated_free(pc, opaque);
    return rc;
}

/* A charge's operation, as the worker's engine names it: an authorization
 * holds the money, a charge takes it. */
static const char *charge_op(const struct provider_charge *ch)
{
    return ch->capture_method == PROVIDER_CAPTURE_MANUAL ? "authorize" : "charge";
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
    while (pc->gated)
        gated_free(pc, pc->gated);
    free(pc);
}

void provider_client_charge(provider_client_t *pc, const struct provider_charge *ch,
                            struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && ch != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_CREATE, res))
        return;
    pc->be->charge(pc->impl, ch, res);
    answered(pc, BUDGET_CLASS_CREATE, charge_op(ch), res);
}

void provider_client_retrieve(provider_client_t *pc, const char *payment_intent_id,
                              struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_RETRIEVE, res))
        return;
    pc->be->retrieve(pc->impl, payment_intent_id, res);
    answered(pc, BUDGET_CLASS_RETRIEVE, "retrieve", res);
}

void provider_client_search(provider_client_t *pc, const char *payment_attempt_id,
                            struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_SEARCH, res))
        return;
    pc->be->search(pc->impl, payment_attempt_id, res);
    answered(pc, BUDGET_CLASS_SEARCH, "search", res);
}

void provider_client_list(provider_client_t *pc, const char *payment_attempt_id,
                          long long created_gte, long long created_lt,
                          const char *starting_after, struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_LIST, res))
        return;
    pc->be->list(pc->impl, payment_attempt_id, created_gte, created_lt, starting_after,
                 res);
    answered(pc, BUDGET_CLASS_LIST, "list", res);
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
    enum charged_rc rc =
        gate_start(pc, BUDGET_CLASS_CREATE, charge_op(ch), &opaque, err);
    if (rc != CHARGED_OK)
        return rc;
    return started(pc, pc->be->start_charge(pc->impl, ch, opaque, err), opaque);
}

enum charged_rc provider_client_start_capture(provider_client_t *pc,
                                              const struct provider_capture *c,
                                              void *opaque, struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && c != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_CAPTURE, "capture", &opaque, err);
    if (rc != CHARGED_OK)
        return rc;
    return started(pc, pc->be->start_capture(pc->impl, c, opaque, err), opaque);
}

enum charged_rc provider_client_start_void(provider_client_t *pc,
                                           const struct provider_void *v, void *opaque,
                                           struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && v != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_CAPTURE, "void", &opaque, err);
    if (rc != CHARGED_OK)
        return rc;
    return started(pc, pc->be->start_void(pc->impl, v, opaque, err), opaque);
}

enum charged_rc provider_client_start_refund(provider_client_t *pc,
                                             const struct provider_refund *r,
                                             void *opaque, struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && r != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_REFUND, "refund", &opaque, err);
    if (rc != CHARGED_OK)
        return rc;
    return started(pc, pc->be->start_refund(pc->impl, r, opaque, err), opaque);
}

void provider_client_retrieve_refund(provider_client_t *pc, const char *refund_id,
                                     struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_RETRIEVE, res))
        return;
    pc->be->retrieve_refund(pc->impl, refund_id, res);
    answered(pc, BUDGET_CLASS_RETRIEVE, "retrieve_refund", res);
}

void provider_client_list_refunds(provider_client_t *pc, const char *payment_intent,
                                  const char *refund_id, const char *starting_after,
                                  struct provider_result *res)
{
    CHARGED_ASSERT(pc != NULL && res != NULL);
    if (!gate_open(pc, BUDGET_CLASS_LIST, res))
        return;
    pc->be->list_refunds(pc->impl, payment_intent, refund_id, starting_after, res);
    answered(pc, BUDGET_CLASS_LIST, "list_refunds", res);
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
    answered(pc, BUDGET_CLASS_LIST,
             what == PROVIDER_LIST_REFUNDS ? "list_refunds" : "list", res);
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
    answered(pc, BUDGET_CLASS_RETRIEVE,
             what == PROVIDER_LIST_REFUNDS ? "retrieve_refund" : "retrieve", res);
}

enum charged_rc provider_client_start_probe(provider_client_t *pc, void *opaque,
                                            struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL);
    CHARGED_ASSERT(err != NULL);
    enum charged_rc rc = gate_start(pc, BUDGET_CLASS_CREATE, "probe", &opaque, err);
    if (rc != CHARGED_OK)
        return rc;
    return started(pc, pc->be->start_probe(pc->impl, opaque, err), opaque);
}

void provider_client_perform(provider_client_t *pc, int timeout_ms)
{
    CHARGED_ASSERT(pc != NULL);
    pc->be->perform(pc->impl, timeout_ms, NULL, 0);
}

void provider_client_wait(provider_client_t *pc, int timeout_ms, const int *wake_fds,
                          size_t n_wake)
{
    CHARGED_ASSERT(pc != NULL && timeout_ms >= 0);
    CHARGED_ASSERT(n_wake <= PROVIDER_WAKE_FDS_MAX && (wake_fds || !n_wake));
    pc->be->perform(pc->impl, timeout_ms, wake_fds, n_wake);
}

int provider_client_next_done(provider_client_t *pc, struct provider_result *res,
                              void **opaque)
{
    CHARGED_ASSERT(pc != NULL && res != NULL && opaque != NULL);
    if (!pc->be->next_done(pc->impl, res, opaque))
        return 0;
    if (pc->gate) {
        struct gated *g = *opaque;
        CHARGED_ASSERT(g != NULL); /* every start of a gated client wraps */
        *opaque = g->opaque;
        answered(pc, g->cls, g->op, res);
        gated_free(pc, g);
    }
    return 1;
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
    while (pc->gated)
        gated_free(pc, pc->gated);
    CHARGED_ASSERT(pc->be->in_flight(pc->impl) == 0);
}
