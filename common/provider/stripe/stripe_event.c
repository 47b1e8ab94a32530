#include "stripe.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uuid/uuid.h>

#include "card_data.h"
#include "charged_assert.h"
#include "webhook_event.h"

/* An identifier from the provider (event id, intent id, event type): we
 * store, log and compare these, so only a plain alphabet is accepted. */
static int plain_token(const char *s, size_t max)
{
    CHARGED_ASSERT(s != NULL && max > 0);
    size_t n = strlen(s);
    if (n == 0 || n >= max)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr("_.:-", s[i]))
            return 0;
    return 1;
}

static const char *str_at(json_t *o, const char *key)
{
    return json_string_value(json_object_get(o, key));
}

static enum webhook_evidence evidence_of(const char *type)
{
    CHARGED_ASSERT(type != NULL);
    if (!strcmp(type, "payment_intent.succeeded"))
        return WEBHOOK_EVIDENCE_SUCCEEDED;
    if (!strcmp(type, "payment_intent.payment_failed") ||
        !strcmp(type, "payment_intent.canceled"))
        return WEBHOOK_EVIDENCE_FAILED;
    if (!strcmp(type, "payment_intent.processing"))
        return WEBHOOK_EVIDENCE_PROCESSING;
    if (!strcmp(type, "payment_intent.amount_capturable_updated"))
        return WEBHOOK_EVIDENCE_AUTHORIZED;
    if (!strcmp(type, "refund.created") || !strcmp(type, "refund.updated") ||
        !strcmp(type, "refund.failed") || !strcmp(type, "charge.refunded"))
        return WEBHOOK_EVIDENCE_REFUND;
    return WEBHOOK_EVIDENCE_NONE;
}

/* Does the intent's status say what the event's type says? */
static int status_agrees(enum webhook_evidence e, const char *status)
{
    CHARGED_ASSERT(status != NULL);
    switch (e) {
    case WEBHOOK_EVIDENCE_SUCCEEDED:
        return !strcmp(status, "succeeded");
    case WEBHOOK_EVIDENCE_FAILED:
        return !strcmp(status, "requires_payment_method") ||
               !strcmp(status, "canceled");
    case WEBHOOK_EVIDENCE_PROCESSING:
        return !strcmp(status, "processing");
    case WEBHOOK_EVIDENCE_AUTHORIZED:
        return !strcmp(status, "requires_capture");
    case WEBHOOK_EVIDENCE_NONE:
    case WEBHOOK_EVIDENCE_REFUND:
    case WEBHOOK_EVIDENCE__COUNT:
        break;
    }
    return 1;
}

/* A canonical uuid from metadata[key] into out[37], or "". */
static void metadata_uuid(json_t *obj, const char *key, char out[37])
{
    const char *s = str_at(json_object_get(obj, "metadata"), key);
    uuid_t u;
    out[0] = '\0';
    if (s && strlen(s) == 36 && uuid_parse(s, u) == 0)
        uuid_unparse_lower(u, out);
}

/* An upper-cased ISO currency into out, "" when absent. 0 / -1. */
static int currency_at(json_t *obj, char out[8])
{
    const char *s = str_at(obj, "currency");
    out[0] = '\0';
    if (!s)
        return 0;
    if (strlen(s) != 3 || !isalpha((unsigned char)s[0]) ||
        !isalpha((unsigned char)s[1]) || !isalpha((unsigned char)s[2]))
        return -1;
    for (int i = 0; i < 3; i++)
        out[i] = (char)toupper((unsigned char)s[i]);
    out[3] = '\0';
    CHARGED_ASSERT(isupper((unsigned char)out[0]) && strlen(out) == 3);
    return 0;
}

/* An id given as a string or as an expanded object's id: 0, 1 absent, -1
 * malformed. */
static int id_at(json_t *obj, const char *key, char *out, size_t size)
{
    CHARGED_ASSERT(out != NULL && size > 0);
    json_t *v = json_object_get(obj, key);
    const char *s = json_is_object(v) ? str_at(v, "id") : json_string_value(v);
    if (!v || json_is_null(v))
        return 1;
    if (!s || !plain_token(s, size))
        return -1;
    snprintf(out, size, "%s", s);
    return 0;
}

/* One refund object into r; `intent` is the charge's when the refund is
 * one of its refunds.data[] ("" otherwise). CHARGED_OK, or CHARGED_BAD_ITEM
 * with err. */
static int by_refund(const void *a, const void *b)
{
    const struct webhook_refund *x = a, *y = b;
    int c = strcmp(x->refund_id, y->refund_id);
    return c ? c : strcmp(x->id, y->id);
}

static enum charged_rc parse_refund(json_t *obj, const char *type, const char *intent,
                                    struct webhook_refund *r, struct charged_error *err)
{
    const char *s;
    json_t *v;

    CHARGED_ASSERT(type != NULL && intent != NULL && r != NULL);
    memset(r, 0, sizeof(*r));
    r->amount = -1;
    if (!json_is_object(obj) ||
        ((s = str_at(obj, "object")) && strcmp(s, "refund") != 0)) {
        charged_error_set(err, "refund is not a refund object");
        return CHARGED_BAD_ITEM;
    }
    if (!(s = str_at(obj, "id")) || !plain_token(s, sizeof(r->id))) {
        charged_error_set(err, "refund id missing or malformed");
        return CHARGED_BAD_ITEM;
    }
    snprintf(r->id, sizeof(r->id), "%s", s);
    if (!(s = str_at(obj, "status")) || !plain_token(s, sizeof(r->status))) {
        charged_error_set(err, "refund status missing or malformed");
        return CHARGED_BAD_ITEM;
    }
    snprintf(r->status, sizeof(r->status), "%s", s);
    if (!strcmp(type, "refund.failed") &&
        webhook_refund_status(s) != ATTEMPT_STATUS_FAILED) {
        charged_error_set(err, "event type %s disagrees with refund status %s", type,
                          s);
        return CHARGED_BAD_ITEM;
    }
    v = json_object_get(obj, "amount");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0)) {
        charged_error_set(err, "refund amount is not a whole number >= 0");
        return CHARGED_BAD_ITEM;
    }
    r->amount = v ? (long long)json_integer_value(v) : -1;
    if (currency_at(obj, r->currency) != 0) {
        charged_error_set(err, "refund currency malformed");
        return CHARGED_BAD_ITEM;
    }
    if (webhook_refund_status(r->status) == ATTEMPT_STATUS_SUCCEEDED &&
        (r->amount < 0 || !r->currency[0])) {
        charged_error_set(err, "refund amount or currency missing");
        return CHARGED_BAD_ITEM;
    }
    int got =
        id_at(obj, "payment_intent", r->payment_intent, sizeof(r->payment_intent));
    if (got < 0) {
        charged_error_set(err, "refund payment_intent malformed");
        return CHARGED_BAD_ITEM;
    }
    if (got > 0)
        snprintf(r->payment_intent, sizeof(r->payment_intent), "%s", intent);
    metadata_uuid(obj, "refund_id", r->refund_id);
    metadata_uuid(obj, "payment_attempt_id", r->attempt_id);
    if ((s = str_at(obj, "failure_reason"))) {
        card_data_copy_masked(r->failure_reason, sizeof(r->failure_reason), s);
    }
    CHARGED_ASSERT(r->id[0] && r->status[0] && r->amount >= -1);
    return CHARGED_OK;
}

/* data.object of a refund event: a refund, or (charge.refunded) a charge
 * whose refunds.data[] are each applied. CHARGED_OK, or CHARGED_BAD_ITEM
 * with err. */
static enum charged_rc parse_refunds(json_t *obj, struct webhook_event *ev,
                                     struct charged_error *err)
{
    if (strcmp(ev->type, "charge.refunded") != 0) {
        ev->nrefunds = 1;
        if (parse_refund(obj, ev->type, "", &ev->refunds[0], err) != CHARGED_OK)
            return CHARGED_BAD_ITEM;
    } else {
        const char *s = str_at(obj, "object");
        if (s && strcmp(s, "charge") != 0) {
            charged_error_set(err, "event data.object is not a charge");
            return CHARGED_BAD_ITEM;
        }
        if (id_at(obj, "payment_intent", ev->intent_id, sizeof(ev->intent_id)) < 0) {
            charged_error_set(err, "charge payment_intent malformed");
            return CHARGED_BAD_ITEM;
        }
        json_t *list = json_object_get(json_object_get(obj, "refunds"), "data"), *r;
        size_t i;
        if (list && !json_is_array(list)) {
            charged_error_set(err, "charge refunds.data is not a list");
            return CHARGED_BAD_ITEM;
        }
        if (json_array_size(list) > WEBHOOK_REFUNDS_MAX) {
            charged_error_set(err, "charge lists more than %d refunds",
                              WEBHOOK_REFUNDS_MAX);
            return CHARGED_BAD_ITEM;
        }
        json_array_foreach(list, i, r)
        {
            if (parse_refund(r, ev->type, ev->intent_id, &ev->refunds[i], err) !=
                CHARGED_OK)
                return CHARGED_BAD_ITEM;
            ev->nrefunds++;
        }
        metadata_uuid(obj, "payment_attempt_id", ev->attempt_id);
    }
    /* Locked in one order by every delivery: two events naming the same
     * refunds in other orders never deadlock. */
    CHARGED_ASSERT(ev->nrefunds <= WEBHOOK_REFUNDS_MAX);
    qsort(ev->refunds, ev->nrefunds, sizeof(ev->refunds[0]), by_refund);
    if (ev->nrefunds > 0) {
        if (!ev->intent_id[0])
            snprintf(ev->intent_id, sizeof(ev->intent_id), "%s",
                     ev->refunds[0].payment_intent);
        if (!ev->attempt_id[0])
            snprintf(ev->attempt_id, sizeof(ev->attempt_id), "%s",
                     ev->refunds[0].attempt_id);
    }
    return CHARGED_OK;
}

/* A number written with card digits (an "amount" of 19 Luhn-valid digits),
 * masked in the text, would be no JSON ("amount":****...): *r gets the
 * string of its masked digits to stand in for it, or NULL when m is no such
 * number (found by fuzz_webhook_event). 0 / -1. */
static int masked_number(json_t *m, json_t **r)
{
    *r = NULL;
    if (!json_is_number(m))
        return 0;
    char *text = json_dumps(m, JSON_ENCODE_ANY);
    if (!text)
        return -1;
    int rc = 0;
    if (card_data_mask(text, strlen(text)) > 0 && !(*r = json_string(text)))
        rc = -1;
    free(text);
    return rc;
}

/* A string is anyone's text (metadata, a description): masked as shown
 * text is, a TAB or NBSP between groups included, which the dump would
 * write as escapes the text's mask cannot read through. 0 / -1. */
static int masked_string(json_t *v)
{
    CHARGED_ASSERT(json_is_string(v));
    size_t n = json_string_length(v);
    char *copy = malloc(n + 1);
    if (!copy)
        return -1;
    memcpy(copy, json_string_value(v), n + 1);
    int rc =
        card_data_mask_loose(copy, n) > 0 ? json_string_setn_nocheck(v, copy, n) : 0;
    free(copy);
    return rc;
}

/* The keys under which the provider writes ids of its own objects. Ids are
 * not text: psp-sim's "pi_18ee99fce2095510000001" holds a Luhn-valid run
 * the shown-text mask would take for a card, and a stored copy must name
 * the intent the event is about. */
static const char *const PROVIDER_ID_KEYS[] = {
    "id",
    "payment_intent",
    "charge",
    "latest_charge",
    "payment_method",
    "customer",
    "refund",
    "balance_transaction",
};

static int provider_id(const char *key, json_t *v)
{
    if (!json_is_string(v) || !plain_token(json_string_value(v), PROVIDER_ID_MAX))
        return 0;
    for (size_t i = 0; i < sizeof(PROVIDER_ID_KEYS) / sizeof(PROVIDER_ID_KEYS[0]); i++)
        if (!strcmp(key, PROVIDER_ID_KEYS[i]))
            return 1;
    return 0;
}

/* A key is anyone's text too (metadata keys are the writer's choice, and
 * the provider keeps any): one holding a card number, however grouped or
 * surrounded, is stored under its masked copy instead. 0 / -1. */
static int mask_keys(json_t *obj)
{
    const char *key;
    json_t *m, *tmp;
    json_t *renamed = json_object();
    if (!renamed)
        return -1;
    json_object_foreach_safe(obj, tmp, key, m)
    {
        char *copy = strdup(key);
        if (!copy)
            goto fail;
        if (card_data_mask_loose(copy, strlen(copy)) > 0) {
            if (json_object_set(renamed, copy, m) != 0) {
                free(copy);
                goto fail;
            }
            json_object_del(obj, key);
        }
        free(copy);
    }
    if (json_object_update(obj, renamed) != 0)
        goto fail;
    json_decref(renamed);
    return 0;
fail:
    json_decref(renamed);
    return -1;
}

/* Every such number in the tree replaced, every key and string masked but
 * the provider's ids; under "metadata" (anyone's to write) every string is
 * text, whatever its key. Digits in strings stay valid JSON when masked.
 * 0 / -1. */
static int mask_card_numbers(json_t *v, int anyones)
{
    const char *key;
    json_t *m, *r, *tmp;
    size_t i;

    if (json_is_string(v))
        return masked_string(v);
    if (json_is_object(v)) {
        if (mask_keys(v) != 0)
            return -1;
        json_object_foreach_safe(v, tmp, key, m)
        {
            if (!anyones && provider_id(key, m))
                continue;
            if (masked_number(m, &r) != 0 ||
                (r ? json_object_set_new(v, key, r)
                   : mask_card_numbers(m, anyones || !strcmp(key, "metadata"))) != 0)
                return -1;
        }
    } else if (json_is_array(v)) {
        json_array_foreach(v, i, m)
        {
            if (masked_number(m, &r) != 0 ||
                (r ? json_array_set_new(v, i, r) : mask_card_numbers(m, anyones)) != 0)
                return -1;
        }
    }
    return 0;
}

/* The event as stored: re-written by jansson, ASCII only. CHARGED_OK, or
 * CHARGED_RETRY when memory ran out. */
static enum charged_rc normalize(json_t *root, char **out, struct charged_error *err)
{
    CHARGED_ASSERT(root != NULL);
    if (!out)
        return CHARGED_OK;
    if (mask_card_numbers(root, 0) != 0) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    *out = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!*out) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    /* Card digits are never kept, whoever sent them. */
    card_data_mask(*out, strlen(*out));
    return CHARGED_OK;
}

/* The event's own fields (id, type, created) into *ev and its
 * data.object into *obj. CHARGED_OK, or CHARGED_BAD_ITEM with err. */
static enum charged_rc parse_envelope(json_t *root, struct webhook_event *ev,
                                      json_t **obj, struct charged_error *err)
{
    const char *s;
    json_t *v;

    if (!json_is_object(root)) {
        charged_error_set(err, "event is not a json object");
        return CHARGED_BAD_ITEM;
    }
    if (!(s = str_at(root, "id")) || !plain_token(s, sizeof(ev->id))) {
        charged_error_set(err, "event id missing or malformed");
        return CHARGED_BAD_ITEM;
    }
    snprintf(ev->id, sizeof(ev->id), "%s", s);
    if (!(s = str_at(root, "type")) || !plain_token(s, sizeof(ev->type))) {
        charged_error_set(err, "event type missing or malformed");
        return CHARGED_BAD_ITEM;
    }
    snprintf(ev->type, sizeof(ev->type), "%s", s);
    ev->evidence = evidence_of(ev->type);
    v = json_object_get(root, "created");
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        charged_error_set(err, "event created missing or not a unix time");
        return CHARGED_BAD_ITEM;
    }
    ev->created = (int64_t)json_integer_value(v);
    *obj = json_object_get(json_object_get(root, "data"), "object");
    if (!json_is_object(*obj)) {
        charged_error_set(err, "event data.object missing");
        return CHARGED_BAD_ITEM;
    }
    CHARGED_ASSERT(ev->id[0] && ev->type[0] && ev->created >= 0);
    return CHARGED_OK;
}

/* Manual capture's fields of the intent into *ev, each checked, never cut:
 * a malformed one refuses the event. A hold must say what it holds. */
static enum charged_rc parse_capture(json_t *obj, struct webhook_event *ev,
                                     struct charged_error *err)
{
    static const char *const texts[] = {"capture_method", "cancellation_reason"};
    char *text_to[] = {ev->capture_method, ev->cancellation_reason};
    size_t text_size[] = {sizeof(ev->capture_method), sizeof(ev->cancellation_reason)};
    static const char *const amounts[] = {"amount_capturable", "amount_received"};
    long long *amount_to[] = {&ev->amount_capturable, &ev->amount_received};

    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(obj, texts[i]);
        const char *s = json_string_value(v);
        if (v && !json_is_null(v) && (!s || !plain_token(s, text_size[i]))) {
            charged_error_set(err, "payment_intent %s malformed", texts[i]);
            return CHARGED_BAD_ITEM;
        }
        snprintf(text_to[i], text_size[i], "%s", s ? s : "");
    }
    for (size_t i = 0; i < 2; i++) {
        json_t *v = json_object_get(obj, amounts[i]);
        if (v && (!json_is_integer(v) || json_integer_value(v) < 0)) {
            charged_error_set(err, "payment_intent %s is not a whole number >= 0",
                              amounts[i]);
            return CHARGED_BAD_ITEM;
        }
        *amount_to[i] = v ? (long long)json_integer_value(v) : -1;
    }
    if (ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED && ev->amount_capturable < 0) {
        charged_error_set(err, "payment_intent amount_capturable missing");
        return CHARGED_BAD_ITEM;
    }
    CHARGED_ASSERT(ev->amount_capturable >= -1 && ev->amount_received >= -1);
    return CHARGED_OK;
}

/* data.object of a payment_intent.* event: the intent, whose status must
 * say what the event's type says. CHARGED_OK, or CHARGED_BAD_ITEM with err. */
static enum charged_rc parse_intent(json_t *obj, struct webhook_event *ev,
                                    struct charged_error *err)
{
    const char *s;
    json_t *v;

    CHARGED_ASSERT(ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED ||
                   ev->evidence == WEBHOOK_EVIDENCE_FAILED ||
                   ev->evidence == WEBHOOK_EVIDENCE_PROCESSING ||
                   ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED);
    if ((s = str_at(obj, "object")) && strcmp(s, "payment_intent") != 0) {
        charged_error_set(err, "event data.object is not a payment_intent");
        return CHARGED_BAD_ITEM;
    }
    if (!(s = str_at(obj, "id")) || !plain_token(s, sizeof(ev->intent_id))) {
        charged_error_set(err, "payment_intent id missing or malformed");
        return CHARGED_BAD_ITEM;
    }
    snprintf(ev->intent_id, sizeof(ev->intent_id), "%s", s);
    if (!(s = str_at(obj, "status")) || !plain_token(s, sizeof(ev->intent_status))) {
        charged_error_set(err, "payment_intent status missing or malformed");
        return CHARGED_BAD_ITEM;
    }
    snprintf(ev->intent_status, sizeof(ev->intent_status), "%s", s);
    if (!status_agrees(ev->evidence, ev->intent_status)) {
        charged_error_set(err, "event type %s disagrees with intent status %s",
                          ev->type, ev->intent_status);
        return CHARGED_BAD_ITEM;
    }
    v = json_object_get(obj, "amount");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0)) {
        charged_error_set(err, "payment_intent amount is not a whole number >= 0");
        return CHARGED_BAD_ITEM;
    }
    ev->amount = v ? (long long)json_integer_value(v) : -1;
    if (currency_at(obj, ev->currency) != 0) {
        charged_error_set(err, "payment_intent currency malformed");
        return CHARGED_BAD_ITEM;
    }
    if ((ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED ||
         ev->evidence == WEBHOOK_EVIDENCE_AUTHORIZED) &&
        (ev->amount < 0 || !ev->currency[0])) {
        charged_error_set(err, "payment_intent amount or currency missing");
        return CHARGED_BAD_ITEM;
    }
    metadata_uuid(obj, "payment_attempt_id", ev->attempt_id);
    v = json_object_get(obj, "last_payment_error");
    if ((s = str_at(v, "decline_code")) || (s = str_at(v, "code")))
        card_data_copy_masked(ev->decline_code, sizeof(ev->decline_code), s);
    return parse_capture(obj, ev, err);
}

enum charged_rc stripe_webhook_parse(const char *body, size_t len,
                                     struct webhook_event *ev, char **normalized,
                                     struct charged_error *err)
{
    json_error_t jerr;
    json_t *root = NULL, *obj = NULL;
    const char *s;
    enum charged_rc rc = CHARGED_BAD_ITEM;

    CHARGED_ASSERT(body != NULL && ev != NULL);
    CHARGED_ASSERT(err != NULL);
    memset(ev, 0, sizeof(*ev));
    ev->amount = -1;
    ev->amount_capturable = -1;
    ev->amount_received = -1;
    if (normalized)
        *normalized = NULL;
    /* jansson refuses invalid UTF-8 and \u0000, which the database would
     * refuse later: such a body is a bad request, never a stored one. */
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        int oom = json_error_code(&jerr) == json_error_out_of_memory;
        charged_error_set(err, oom ? "out of memory" : "body is not valid json");
        rc = oom ? CHARGED_RETRY : CHARGED_BAD_ITEM;
        goto out;
    }
    if (parse_envelope(root, ev, &obj, err) != CHARGED_OK)
        goto out;
    if (ev->evidence == WEBHOOK_EVIDENCE_REFUND) {
        if (parse_refunds(obj, ev, err) == CHARGED_OK)
            rc = normalize(root, normalized, err);
        goto out;
    }
    /* Events about other objects are recorded, not acted on. */
    if (ev->evidence == WEBHOOK_EVIDENCE_NONE) {
        if ((s = str_at(obj, "id")) && plain_token(s, sizeof(ev->intent_id)))
            snprintf(ev->intent_id, sizeof(ev->intent_id), "%s", s);
        rc = normalize(root, normalized, err);
        goto out;
    }
    if (parse_intent(obj, ev, err) == CHARGED_OK)
        rc = normalize(root, normalized, err);
out:
    json_decref(root);
    CHARGED_ASSERT(rc != CHARGED_OK ||
                   (ev->id[0] && ev->nrefunds <= WEBHOOK_REFUNDS_MAX));
    return rc;
}
