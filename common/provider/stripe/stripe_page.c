#include "stripe_internal.h"

#include <stdio.h>
#include <string.h>

#include "charged_assert.h"

/* Printable ASCII only, bounded: what a listed object carries goes into
 * SQL parameters and log lines, and one odd byte must not fail a page. */
static void copy_ascii_id(char *dst, size_t size, const char *src)
{
    CHARGED_ASSERT(dst != NULL && size > 0);
    size_t i = 0;
    for (; src && src[i] && i + 1 < size; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    dst[i] = '\0';
}

/* The same for its text (status, currency, metadata), card numbers masked
 * as every provider text is (copy_str). */
static void copy_ascii(char *dst, size_t size, const char *src)
{
    stripe_copy_str(dst, size, src);
    copy_ascii_id(dst, size, dst);
}

static const char *str_field(json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* An intent's amount, -1 when it does not carry one (as a result's). */
static long long listed_amount(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v)
                                                            : -1;
}

/* One listed object into *obj; -1 when it is not an object of `what` with
 * an id. */
int stripe_read_listed(json_t *o, enum provider_list_of what,
                       struct provider_listed *obj)
{
    const char *type = what == PROVIDER_LIST_REFUNDS ? "refund" : "payment_intent";
    memset(obj, 0, sizeof(*obj));
    if (!json_is_object(o) || strcmp(str_field(o, "object"), type) != 0 ||
        !*str_field(o, "id"))
        return -1;
    CHARGED_ASSERT((unsigned)what <= PROVIDER_LIST_REFUNDS);
    json_t *md = json_object_get(o, "metadata");
    copy_ascii_id(obj->id, sizeof(obj->id), str_field(o, "id"));
    copy_ascii(obj->status, sizeof(obj->status), str_field(o, "status"));
    copy_ascii(obj->currency, sizeof(obj->currency), str_field(o, "currency"));
    obj->amount = json_integer_value(json_object_get(o, "amount"));
    obj->created = json_integer_value(json_object_get(o, "created"));
    /* An empty one is no more ours than none. */
    obj->has_attempt_metadata = *str_field(md, "payment_attempt_id") != '\0';
    copy_ascii(obj->payment_attempt_id, sizeof(obj->payment_attempt_id),
               str_field(md, "payment_attempt_id"));
    copy_ascii(obj->order_id, sizeof(obj->order_id), str_field(md, "order_id"));
    copy_ascii(obj->refund_id, sizeof(obj->refund_id), str_field(md, "refund_id"));
    /* A refund names its intent as an id, or expanded as an object. */
    json_t *pi = json_object_get(o, "payment_intent");
    copy_ascii_id(obj->payment_intent, sizeof(obj->payment_intent),
                  json_is_object(pi) ? str_field(pi, "id") : json_string_value(pi));
    copy_ascii(obj->capture_method, sizeof(obj->capture_method),
               str_field(o, "capture_method"));
    copy_ascii(obj->cancellation_reason, sizeof(obj->cancellation_reason),
               str_field(o, "cancellation_reason"));
    obj->amount_capturable = listed_amount(o, "amount_capturable");
    obj->amount_received = listed_amount(o, "amount_received");
    CHARGED_ASSERT(obj->id[0]); /* a listed object is always named */
    return 0;
}

/* A GET's answer, parsed here, not classified: *doc the JSON of a 200 (the
 * caller decrefs it), or NULL with res->outcome and res->error set. */
json_t *stripe_answer_json(int http, const char *body, size_t body_len,
                           struct provider_result *res)
{
    CHARGED_ASSERT(res != NULL && (body != NULL || body_len == 0));
    json_error_t jerr;
    json_t *doc = body ? json_loadb(body, body_len, 0, &jerr) : NULL;
    res->http_status = http;
    res->throttled = http == 429; /* UNKNOWN below: no evidence, retried later */
    if (http == 404) {
        const char *code =
            json_string_value(json_object_get(json_object_get(doc, "error"), "code"));
        res->outcome = code && !strcmp(code, "resource_missing") ? PROVIDER_NOT_FOUND
                                                                 : PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "answered 404%s",
                 res->outcome == PROVIDER_NOT_FOUND ? " resource_missing" : "");
        json_decref(doc);
        return NULL;
    }
    if (http != 200 || !json_is_object(doc)) {
        res->outcome = http >= 400 && http < 500 && http != 429 ? PROVIDER_INVALID
                                                                : PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "answered %d%s", http,
                 http == 200 ? " without a JSON object" : "");
        json_decref(doc);
        return NULL;
    }
    res->outcome = PROVIDER_SUCCEEDED;
    return doc;
}

/* A list page's JSON into *page (res->outcome SUCCEEDED), or res->outcome
 * INVALID and an empty page. */
void stripe_read_page(json_t *doc, enum provider_list_of what,
                      struct provider_page *page, struct provider_result *res)
{
    CHARGED_ASSERT(doc != NULL && page != NULL && page->n == 0);
    json_t *data = json_object_get(doc, "data"), *o;
    size_t i;
    if (strcmp(str_field(doc, "object"), "list") != 0 || !json_is_array(data) ||
        json_array_size(data) > PROVIDER_PAGE_MAX ||
        !json_is_boolean(json_object_get(doc, "has_more"))) {
        res->outcome = PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "list answer is not a list page");
        goto out;
    }
    json_array_foreach(data, i, o)
    {
        if (stripe_read_listed(o, what, &page->items[i]) != 0) {
            res->outcome = PROVIDER_INVALID;
            snprintf(res->error, sizeof(res->error),
                     "list item %zu is not a %s with an id", i,
                     what == PROVIDER_LIST_REFUNDS ? "refund" : "payment intent");
            page->n = 0;
            goto out;
        }
        page->n++;
    }
    page->has_more = json_is_true(json_object_get(doc, "has_more"));
    /* More to come, yet nothing to start the next page after: no cursor,
     * no evidence. */
    if (page->has_more && page->n == 0) {
        res->outcome = PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "list page empty with has_more");
    }
out:
    if (res->outcome != PROVIDER_SUCCEEDED) {
        page->n = 0;
        page->has_more = 0;
    }
    /* A page that says more follows names where: its last object. */
    CHARGED_ASSERT(page->n <= PROVIDER_PAGE_MAX && (!page->has_more || page->n > 0));
}

void stripe_parse_page(enum provider_list_of what, int http_status, const char *body,
                       size_t body_len, struct provider_page *page,
                       struct provider_result *res)
{
    CHARGED_ASSERT(page != NULL && res != NULL);
    memset(res, 0, sizeof(*res));
    page->n = 0;
    page->has_more = 0;
    json_t *doc = stripe_answer_json(http_status, body, body_len, res);
    if (doc)
        stripe_read_page(doc, what, page, res);
    json_decref(doc);
}
