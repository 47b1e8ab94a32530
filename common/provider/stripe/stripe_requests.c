/* stripe_requests: what each of the backend's calls sends, as Stripe's API
 * takes it:
 *   charge, probe      POST /v1/payment_intents (confirmed, off session;
 *                      an authorization with capture_method=manual)
 *   capture            POST /v1/payment_intents/<id>/capture
 *   void               POST /v1/payment_intents/<id>/cancel
 *   refund             POST /v1/refunds
 *   retrieve           GET  /v1/payment_intents/<id>
 *   search             GET  /v1/payment_intents/search?query=metadata[...]
 *   list, list_page    GET  /v1/payment_intents?created[gte]=..&created[lt]=..
 *   retrieve_refund    GET  /v1/refunds/<id>
 *   list_refunds       GET  /v1/refunds?payment_intent=<pi>
 *   fetch              GET  /v1/payment_intents/<id> or /v1/refunds/<id>
 * and the backend's table (struct provider_backend, provider.h). */
#include "stripe.h"
#include "stripe_wire.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"

/* The charge's transfer, or NULL with err and *why: CHARGED_BAD_ITEM when
 * ch cannot be sent (no usable key), CHARGED_RETRY when memory ran out. */
static struct stripe_xfer *charge_xfer(struct stripe_client *pc,
                                       const struct provider_charge *ch, int with_share,
                                       enum charged_rc *why, struct charged_error *err)
{
    char amount[32], currency[8], *body = NULL;
    size_t len = 0;
    struct stripe_xfer *x = NULL;
    int manual = ch->capture_method == PROVIDER_CAPTURE_MANUAL;

    CHARGED_ASSERT(pc != NULL && ch != NULL);
    CHARGED_ASSERT(ch->capture_method == PROVIDER_CAPTURE_AUTOMATIC || manual);
    CHARGED_ASSERT(err != NULL && why != NULL);
    *why = CHARGED_BAD_ITEM;
    if (!ch->idempotency_key || !*ch->idempotency_key ||
        strpbrk(ch->idempotency_key, "\r\n")) {
        charged_error_set(err, "charge without a usable idempotency key");
        goto out;
    }
    *why = CHARGED_RETRY;
    snprintf(amount, sizeof(amount), "%lld", ch->amount);
    snprintf(currency, sizeof(currency), "%s", ch->currency ? ch->currency : "");
    for (char *p = currency; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    /* automatic_payment_methods without redirects: recent API versions
     * refuse a server-side confirm without a return_url otherwise. A saved
     * card belongs to its customer, so the customer goes along. */
    if (stripe_form_add(&body, &len, "amount", amount) ||
        stripe_form_add(&body, &len, "currency", currency) ||
        stripe_form_add(&body, &len, "payment_method", ch->payment_method) ||
        stripe_form_add(&body, &len, "confirm", "true") ||
        stripe_form_add(&body, &len, "off_session", "true") ||
        stripe_form_add(&body, &len, "automatic_payment_methods[enabled]", "true") ||
        stripe_form_add(&body, &len, "automatic_payment_methods[allow_redirects]",
                        "never") ||
        (ch->customer_id && *ch->customer_id &&
         stripe_form_add(&body, &len, "customer", ch->customer_id)) ||
        stripe_form_add(&body, &len, "metadata[payment_attempt_id]",
                        ch->payment_attempt_id) ||
        stripe_form_add(&body, &len, "metadata[order_id]", ch->order_id) ||
        (manual && stripe_form_add(&body, &len, "capture_method", "manual")))
        goto oom;
    x = stripe_post_xfer(pc, "/v1/payment_intents", body, ch->idempotency_key,
                         with_share, err);
    body = NULL; /* owned by x, or freed */
    if (!x)
        goto out;
    x->call.amount = ch->amount;
    x->call.manual = manual;
    snprintf(x->call.currency, sizeof(x->call.currency), "%s", currency);
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s",
             ch->payment_attempt_id ? ch->payment_attempt_id : "");
    goto out;
oom:
    charged_error_set(err, "provider client: out of memory");
out:
    free(body);
    return x;
}

void stripe_charge(void *impl, const struct provider_charge *ch,
                   struct provider_result *res)
{
    struct stripe_client *pc = impl;
    struct charged_error err;
    enum charged_rc why;
    struct stripe_xfer *x = charge_xfer(pc, ch, 1, &why, &err);
    if (!x) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_NOT_EXECUTED;
        stripe_copy_str(res->error, sizeof(res->error), err.message);
        return;
    }
    stripe_finish(x, curl_easy_perform(x->easy), res);
    stripe_xfer_free(x);
    CHARGED_ASSERT((unsigned)res->outcome < PROVIDER_OUTCOME__COUNT);
}

static void retrieve_url(struct stripe_client *pc, const char *payment_intent_id,
                         char *url, size_t size)
{
    CHARGED_ASSERT(url != NULL && size > 0);
    char *id = curl_easy_escape(NULL, payment_intent_id ? payment_intent_id : "", 0);
    snprintf(url, size, "%s/v1/payment_intents/%s", pc->base_url, id ? id : "");
    curl_free(id);
}

void stripe_retrieve(void *impl, const char *payment_intent_id,
                     struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024];
    retrieve_url(pc, payment_intent_id, url, sizeof(url));
    stripe_lookup(pc, url, PROVIDER_LOOKUP_RETRIEVE, 0, NULL, res);
}

void stripe_search(void *impl, const char *payment_attempt_id,
                   struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024], q[256];
    snprintf(q, sizeof(q), "metadata['payment_attempt_id']:'%s'", payment_attempt_id);
    char *eq = curl_easy_escape(NULL, q, 0);
    snprintf(url, sizeof(url), "%s/v1/payment_intents/search?query=%s", pc->base_url,
             eq ? eq : "");
    curl_free(eq);
    stripe_lookup(pc, url, PROVIDER_LOOKUP_SEARCH, 0, NULL, res);
}

void stripe_list(void *impl, const char *payment_attempt_id, long long created_gte,
                 long long created_lt, const char *starting_after,
                 struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024];
    char *after = starting_after && *starting_after
                      ? curl_easy_escape(NULL, starting_after, 0)
                      : NULL;
    /* Brackets percent-encoded, as a form encoder sends them. */
    snprintf(url, sizeof(url),
             "%s/v1/payment_intents?created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld"
             "&limit=100%s%s",
             pc->base_url, created_gte, created_lt, after ? "&starting_after=" : "",
             after ? after : "");
    curl_free(after);
    stripe_lookup(pc, url, PROVIDER_LOOKUP_LIST, 0, payment_attempt_id, res);
}

void stripe_retrieve_refund(void *impl, const char *refund_id,
                            struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024];
    char *id = curl_easy_escape(NULL, refund_id ? refund_id : "", 0);
    snprintf(url, sizeof(url), "%s/v1/refunds/%s", pc->base_url, id ? id : "");
    curl_free(id);
    stripe_lookup(pc, url, PROVIDER_LOOKUP_RETRIEVE, 1, NULL, res);
}

void stripe_list_refunds(void *impl, const char *payment_intent, const char *refund_id,
                         const char *starting_after, struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024];
    char *pi = curl_easy_escape(NULL, payment_intent ? payment_intent : "", 0);
    char *after = starting_after && *starting_after
                      ? curl_easy_escape(NULL, starting_after, 0)
                      : NULL;
    snprintf(url, sizeof(url), "%s/v1/refunds?payment_intent=%s&limit=100%s%s",
             pc->base_url, pi ? pi : "", after ? "&starting_after=" : "",
             after ? after : "");
    curl_free(pi);
    curl_free(after);
    stripe_lookup(pc, url, PROVIDER_LOOKUP_LIST, 1, refund_id ? refund_id : "", res);
}

enum charged_rc stripe_start_charge(void *impl, const struct provider_charge *ch,
                                    void *opaque, struct charged_error *err)
{
    struct stripe_client *pc = impl;
    enum charged_rc why;
    /* The multi handle keeps its own connection cache. */
    struct stripe_xfer *x = charge_xfer(pc, ch, 0, &why, err);
    if (!x)
        return why;
    return stripe_start_async(pc, x, opaque, err);
}

/* A path we can append to the base url as it is: '/', then printable ASCII
 * without spaces (the caller escapes ids). */
static int usable_path(const char *path)
{
    if (!path || path[0] != '/')
        return 0;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f)
            return 0;
    return 1;
}

/* A POST of body (taken: freed here or owned by the transfer) to path
 * under the caller's idempotency key, handing the transfer back (NULL with
 * err and *why, as charge_xfer's) so that the caller can say how its
 * answer is classified before it starts. */
static struct stripe_xfer *operation_xfer(struct stripe_client *pc, const char *path,
                                          char *body, const char *idempotency_key,
                                          enum charged_rc *why,
                                          struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && err != NULL && why != NULL);
    CHARGED_ASSERT(usable_path(path));
    *why = CHARGED_BAD_ITEM;
    if (!idempotency_key || !*idempotency_key || strpbrk(idempotency_key, "\r\n")) {
        charged_error_set(err, "post without a usable idempotency key");
        free(body);
        return NULL;
    }
    *why = CHARGED_RETRY;
    /* Always a body, if empty: that makes it a POST. */
    if (!body && !(body = strdup(""))) {
        charged_error_set(err, "provider client: out of memory");
        return NULL;
    }
    /* The multi handle keeps its own connection cache, as for charges. */
    struct stripe_xfer *x = stripe_post_xfer(pc, path, body, idempotency_key, 0, err);
    CHARGED_ASSERT(!x || x->body); /* a POST */
    return x;
}

/* The path of one of an intent's actions ("capture", "cancel"), or -1 with
 * err when the id is not one we can send. */
static int intent_action_path(const char *payment_intent, const char *action,
                              char *path, size_t size, struct charged_error *err)
{
    CHARGED_ASSERT(action != NULL && path != NULL && size > 0);
    /* Letters, digits and '_': nothing to escape. */
    if (!provider_outcome_id_ok(payment_intent)) {
        charged_error_set(err, "%s without a usable payment intent", action);
        return -1;
    }
    int n = snprintf(path, size, "/v1/payment_intents/%s/%s", payment_intent, action);
    CHARGED_ASSERT(n > 0 && (size_t)n < size); /* the id is shorter than its max */
    return 0;
}

/* Starts x, the POST of an action on `payment_intent`, classified as `op`. */
static enum charged_rc start_intent_action(struct stripe_client *pc,
                                           struct stripe_xfer *x,
                                           enum provider_operation op,
                                           const char *payment_intent, void *opaque,
                                           struct charged_error *err)
{
    CHARGED_ASSERT(x != NULL && op != PROVIDER_OPERATION_NONE);
    x->call.operation = op;
    snprintf(x->call.payment_intent, sizeof(x->call.payment_intent), "%s",
             payment_intent);
    return stripe_start_async(pc, x, opaque, err);
}

enum charged_rc stripe_start_capture(void *impl, const struct provider_capture *c,
                                     void *opaque, struct charged_error *err)
{
    struct stripe_client *pc = impl;
    char path[PROVIDER_ID_MAX + 40], amount[32], *body = NULL;
    size_t len = 0;
    enum charged_rc why;

    CHARGED_ASSERT(pc != NULL && c != NULL);
    if (intent_action_path(c->payment_intent, "capture", path, sizeof(path), err))
        return CHARGED_BAD_ITEM;
    if (c->payment_attempt_id && strlen(c->payment_attempt_id) >=
                                     sizeof(((struct provider_call *)0)->attempt_id)) {
        charged_error_set(err, "capture with an unusable payment attempt id");
        return CHARGED_BAD_ITEM;
    }
    /* Nothing named: all that is capturable, as the provider takes it. */
    snprintf(amount, sizeof(amount), "%lld", c->amount);
    if (c->amount > 0 && stripe_form_add(&body, &len, "amount_to_capture", amount)) {
        charged_error_set(err, "provider client: out of memory");
        return CHARGED_RETRY;
    }
    struct stripe_xfer *x =
        operation_xfer(pc, path, body, c->idempotency_key, &why, err);
    if (!x)
        return why;
    x->call.amount = c->amount > 0 ? c->amount : 0;
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s",
             c->payment_attempt_id ? c->payment_attempt_id : "");
    return start_intent_action(pc, x, PROVIDER_OPERATION_CAPTURE, c->payment_intent,
                               opaque, err);
}

enum charged_rc stripe_start_void(void *impl, const struct provider_void *v,
                                  void *opaque, struct charged_error *err)
{
    struct stripe_client *pc = impl;
    char path[PROVIDER_ID_MAX + 40], *body = NULL;
    size_t len = 0;
    enum charged_rc why;

    CHARGED_ASSERT(pc != NULL && v != NULL);
    if (intent_action_path(v->payment_intent, "cancel", path, sizeof(path), err))
        return CHARGED_BAD_ITEM;
    if (v->reason && *v->reason &&
        stripe_form_add(&body, &len, "cancellation_reason", v->reason)) {
        charged_error_set(err, "provider client: out of memory");
        return CHARGED_RETRY;
    }
    struct stripe_xfer *x =
        operation_xfer(pc, path, body, v->idempotency_key, &why, err);
    if (!x)
        return why;
    return start_intent_action(pc, x, PROVIDER_OPERATION_VOID, v->payment_intent,
                               opaque, err);
}

enum charged_rc stripe_start_refund(void *impl, const struct provider_refund *r,
                                    void *opaque, struct charged_error *err)
{
    struct stripe_client *pc = impl;
    char amount[32], *body = NULL;
    size_t len = 0;
    enum charged_rc rc = CHARGED_RETRY;

    CHARGED_ASSERT(pc != NULL && r != NULL);
    if (!r->payment_intent || !*r->payment_intent || !r->refund_id ||
        strlen(r->refund_id) >= sizeof(((struct provider_call *)0)->attempt_id)) {
        charged_error_set(err, "refund without a payment intent or refund id");
        return CHARGED_BAD_ITEM;
    }
    snprintf(amount, sizeof(amount), "%lld", r->amount);
    if (stripe_form_add(&body, &len, "payment_intent", r->payment_intent) ||
        stripe_form_add(&body, &len, "amount", amount) ||
        (r->reason && *r->reason &&
         stripe_form_add(&body, &len, "reason", r->reason)) ||
        stripe_form_add(&body, &len, "metadata[refund_id]", r->refund_id) ||
        stripe_form_add(&body, &len, "metadata[payment_attempt_id]",
                        r->payment_attempt_id ? r->payment_attempt_id : "")) {
        charged_error_set(err, "provider client: out of memory");
        goto out;
    }
    struct stripe_xfer *x =
        operation_xfer(pc, "/v1/refunds", body, r->idempotency_key, &rc, err);
    body = NULL; /* owned by x, or freed */
    if (!x)
        goto out;
    x->call.refund = 1;
    x->call.amount = r->amount;
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s", r->refund_id);
    rc = stripe_start_async(pc, x, opaque, err);
out:
    free(body);
    return rc;
}

enum charged_rc stripe_start_probe(void *impl, void *opaque, struct charged_error *err)
{
    struct stripe_client *pc = impl;
    char url[1024];
    CHARGED_ASSERT(pc != NULL && err != NULL);
    /* The charge endpoint, as charges use it, with a body the provider
     * refuses before it executes anything: an amount of 0, no payment
     * method, no confirm. Even a provider that took it would only create an
     * unconfirmed intent, which charges nobody. */
    char *body = strdup("amount=0&currency=usd&metadata%5Bcharged_probe%5D=breaker");
    snprintf(url, sizeof(url), "%s/v1/payment_intents", pc->base_url);
    struct stripe_xfer *x = body ? stripe_xfer_new(pc, url, body, 0) : NULL;
    if (!x) {
        charged_error_set(err, "provider client: out of memory");
        return CHARGED_RETRY;
    }
    return stripe_start_async(pc, x, opaque, err);
}

void stripe_list_page(void *impl, enum provider_list_of what, long long created_gte,
                      long long created_lt, const char *starting_after,
                      struct provider_page *page, struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024];
    char *after = starting_after && *starting_after
                      ? curl_easy_escape(NULL, starting_after, 0)
                      : NULL;
    CHARGED_ASSERT((unsigned)what <= PROVIDER_LIST_REFUNDS);
    page->n = 0;
    page->has_more = 0;
    snprintf(url, sizeof(url),
             "%s/v1/%s?created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld&limit=%d%s%s",
             pc->base_url,
             what == PROVIDER_LIST_REFUNDS ? "refunds" : "payment_intents", created_gte,
             created_lt, PROVIDER_PAGE_MAX, after ? "&starting_after=" : "",
             after ? after : "");
    curl_free(after);
    json_t *doc = stripe_get_json(pc, url, res);
    if (doc)
        stripe_read_page(doc, what, page, res);
    json_decref(doc);
    CHARGED_ASSERT(res->outcome == PROVIDER_SUCCEEDED || page->n == 0);
}

void stripe_fetch(void *impl, enum provider_list_of what, const char *id,
                  struct provider_listed *obj, struct provider_result *res)
{
    struct stripe_client *pc = impl;
    char url[1024];
    char *eid = curl_easy_escape(NULL, id ? id : "", 0);
    CHARGED_ASSERT((unsigned)what <= PROVIDER_LIST_REFUNDS && obj != NULL);
    memset(obj, 0, sizeof(*obj));
    snprintf(url, sizeof(url), "%s/v1/%s/%s", pc->base_url,
             what == PROVIDER_LIST_REFUNDS ? "refunds" : "payment_intents",
             eid ? eid : "");
    curl_free(eid);
    json_t *doc = stripe_get_json(pc, url, res);
    if (!doc)
        return;
    if (stripe_read_listed(doc, what, obj) != 0 || strcmp(obj->id, id) != 0) {
        res->outcome = PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "answer is not the object asked for");
    }
    json_decref(doc);
}

/* The Stripe backend as the seam sees it: every entry set (provider.h). */
const struct provider_backend provider_stripe = {
    .name = "stripe",
    .open = stripe_open,
    .close = stripe_close,
    .charge = stripe_charge,
    .start_charge = stripe_start_charge,
    .start_refund = stripe_start_refund,
    .start_capture = stripe_start_capture,
    .start_void = stripe_start_void,
    .start_probe = stripe_start_probe,
    .perform = stripe_perform,
    .next_done = stripe_next_done,
    .in_flight = stripe_in_flight,
    .abandon_all = stripe_abandon_all,
    .retrieve = stripe_retrieve,
    .search = stripe_search,
    .list = stripe_list,
    .list_refunds = stripe_list_refunds,
    .retrieve_refund = stripe_retrieve_refund,
    .list_page = stripe_list_page,
    .fetch = stripe_fetch,
    .classify = stripe_classify,
    .parse_page = stripe_parse_page,
    .redact = stripe_redact,
    .signature_header = STRIPE_SIGNATURE_HEADER,
    .verify = stripe_signature_verify,
    .parse_event = stripe_webhook_parse,
};
