#include "webhook_event.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>
#include <uuid/uuid.h>

#include "card_data.h"
#include "utf8_text.h"

/* An identifier from the provider (event id, intent id, event type): we
 * store, log and compare these, so only a plain alphabet is accepted. */
static int plain_token(const char *s, size_t max)
{
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
    if (!strcmp(type, "payment_intent.succeeded"))
        return WEBHOOK_EVIDENCE_SUCCEEDED;
    if (!strcmp(type, "payment_intent.payment_failed") ||
        !strcmp(type, "payment_intent.canceled"))
        return WEBHOOK_EVIDENCE_FAILED;
    if (!strcmp(type, "payment_intent.processing"))
        return WEBHOOK_EVIDENCE_PROCESSING;
    return WEBHOOK_EVIDENCE_NONE;
}

/* Does the intent's status say what the event's type says? */
static int status_agrees(enum webhook_evidence e, const char *status)
{
    switch (e) {
    case WEBHOOK_EVIDENCE_SUCCEEDED:
        return !strcmp(status, "succeeded");
    case WEBHOOK_EVIDENCE_FAILED:
        return !strcmp(status, "requires_payment_method") ||
               !strcmp(status, "canceled");
    case WEBHOOK_EVIDENCE_PROCESSING:
        return !strcmp(status, "processing");
    case WEBHOOK_EVIDENCE_NONE:
        break;
    }
    return 1;
}

/* The event as stored: re-written by jansson, ASCII only. 0 / -1. */
static int normalize(json_t *root, char **out, char *errbuf, size_t errbuf_size)
{
    if (!out)
        return 0;
    *out = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!*out) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return -1;
    }
    /* Card digits are never kept, whoever sent them. */
    card_data_mask(*out, strlen(*out));
    return 0;
}

int webhook_event_parse(const char *body, size_t len, struct webhook_event *ev,
                        char **normalized, char *errbuf, size_t errbuf_size)
{
    json_error_t jerr;
    json_t *root = NULL, *obj, *v;
    const char *s;
    int rc = -1;

    memset(ev, 0, sizeof(*ev));
    ev->amount = -1;
    if (normalized)
        *normalized = NULL;
    /* jansson refuses invalid UTF-8 and \u0000, which the database would
     * refuse later: such a body is a bad request, never a stored one. */
    root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) {
        snprintf(errbuf, errbuf_size, "body is not valid json");
        goto out;
    }
    if (!json_is_object(root)) {
        snprintf(errbuf, errbuf_size, "event is not a json object");
        goto out;
    }
    if (!(s = str_at(root, "id")) || !plain_token(s, sizeof(ev->id))) {
        snprintf(errbuf, errbuf_size, "event id missing or malformed");
        goto out;
    }
    snprintf(ev->id, sizeof(ev->id), "%s", s);
    if (!(s = str_at(root, "type")) || !plain_token(s, sizeof(ev->type))) {
        snprintf(errbuf, errbuf_size, "event type missing or malformed");
        goto out;
    }
    snprintf(ev->type, sizeof(ev->type), "%s", s);
    ev->evidence = evidence_of(ev->type);
    v = json_object_get(root, "created");
    if (!json_is_integer(v) || json_integer_value(v) < 0) {
        snprintf(errbuf, errbuf_size, "event created missing or not a unix time");
        goto out;
    }
    ev->created = (int64_t)json_integer_value(v);
    obj = json_object_get(json_object_get(root, "data"), "object");
    if (!json_is_object(obj)) {
        snprintf(errbuf, errbuf_size, "event data.object missing");
        goto out;
    }
    /* Events about other objects (charges, refunds) are recorded, not
     * acted on: only a PaymentIntent is evidence here. */
    if (ev->evidence == WEBHOOK_EVIDENCE_NONE) {
        if ((s = str_at(obj, "id")) && plain_token(s, sizeof(ev->intent_id)))
            snprintf(ev->intent_id, sizeof(ev->intent_id), "%s", s);
        rc = normalize(root, normalized, errbuf, errbuf_size);
        goto out;
    }
    if ((s = str_at(obj, "object")) && strcmp(s, "payment_intent") != 0) {
        snprintf(errbuf, errbuf_size, "event data.object is not a payment_intent");
        goto out;
    }
    if (!(s = str_at(obj, "id")) || !plain_token(s, sizeof(ev->intent_id))) {
        snprintf(errbuf, errbuf_size, "payment_intent id missing or malformed");
        goto out;
    }
    snprintf(ev->intent_id, sizeof(ev->intent_id), "%s", s);
    if (!(s = str_at(obj, "status")) || !plain_token(s, sizeof(ev->intent_status))) {
        snprintf(errbuf, errbuf_size, "payment_intent status missing or malformed");
        goto out;
    }
    snprintf(ev->intent_status, sizeof(ev->intent_status), "%s", s);
    if (!status_agrees(ev->evidence, ev->intent_status)) {
        snprintf(errbuf, errbuf_size, "event type %s disagrees with intent status %s",
                 ev->type, ev->intent_status);
        goto out;
    }
    v = json_object_get(obj, "amount");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0)) {
        snprintf(errbuf, errbuf_size,
                 "payment_intent amount is not a whole number >= 0");
        goto out;
    }
    ev->amount = v ? (long long)json_integer_value(v) : -1;
    if ((s = str_at(obj, "currency"))) {
        if (strlen(s) != 3 || !isalpha((unsigned char)s[0]) ||
            !isalpha((unsigned char)s[1]) || !isalpha((unsigned char)s[2])) {
            snprintf(errbuf, errbuf_size, "payment_intent currency malformed");
            goto out;
        }
        for (int i = 0; i < 3; i++)
            ev->currency[i] = (char)toupper((unsigned char)s[i]);
    }
    if (ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED &&
        (ev->amount < 0 || !ev->currency[0])) {
        snprintf(errbuf, errbuf_size, "payment_intent amount or currency missing");
        goto out;
    }
    s = str_at(json_object_get(obj, "metadata"), "payment_attempt_id");
    uuid_t u;
    if (s && strlen(s) == 36 && uuid_parse(s, u) == 0)
        uuid_unparse_lower(u, ev->attempt_id);
    v = json_object_get(obj, "last_payment_error");
    if ((s = str_at(v, "decline_code")) || (s = str_at(v, "code"))) {
        utf8_text_copy(ev->decline_code, sizeof(ev->decline_code), s);
        card_data_mask(ev->decline_code, strlen(ev->decline_code));
    }
    rc = normalize(root, normalized, errbuf, errbuf_size);
out:
    json_decref(root);
    return rc;
}

const char *webhook_action_name(enum webhook_action a)
{
    switch (a) {
    case WEBHOOK_IGNORE:
        return "ignored";
    case WEBHOOK_APPLY:
        return "applied";
    case WEBHOOK_REVIEW:
        return "review";
    case WEBHOOK_FLAG:
        return "flagged";
    }
    return "ignored";
}

static void set(struct webhook_decision *d, enum webhook_action action,
                enum attempt_status status, const char *reason)
{
    d->action = action;
    d->status = status;
    d->reason = reason;
}

/* Is the event about another charge than the attempt's own? */
static int other_charge(const struct webhook_event *ev, const struct webhook_attempt *a)
{
    return a->intent_differs || a->intent_elsewhere ||
           (ev->amount >= 0 && ev->amount != a->amount) ||
           (ev->currency[0] && strcmp(ev->currency, a->currency));
}

static void decide_success(const struct webhook_event *ev,
                           const struct webhook_attempt *a, struct webhook_decision *d)
{
    const enum attempt_status RV = ATTEMPT_STATUS_REQUIRES_REVIEW;
    if (other_charge(ev, a)) {
        switch (a->status) {
        case ATTEMPT_STATUS_PROCESSING:
        case ATTEMPT_STATUS_UNKNOWN:
        case ATTEMPT_STATUS_SUCCEEDED:
        case ATTEMPT_STATUS_FAILED:
            set(d, WEBHOOK_REVIEW, RV,
                "the provider reported success for another charge");
            return;
        case ATTEMPT_STATUS_REQUIRES_REVIEW:
            set(d, WEBHOOK_IGNORE, a->status, "already under review");
            return;
        default:
            set(d, WEBHOOK_FLAG, a->status,
                "the provider reported success for another charge");
            return;
        }
    }
    switch (a->status) {
    case ATTEMPT_STATUS_PROCESSING:
    case ATTEMPT_STATUS_UNKNOWN:
        set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_SUCCEEDED,
            "the provider reported success");
        return;
    case ATTEMPT_STATUS_SUCCEEDED:
        set(d, WEBHOOK_IGNORE, a->status, "already succeeded");
        return;
    case ATTEMPT_STATUS_FAILED:
        set(d, WEBHOOK_REVIEW, RV,
            "the provider reported success for a failed attempt");
        return;
    case ATTEMPT_STATUS_REQUIRES_REVIEW:
        set(d, WEBHOOK_IGNORE, a->status, "already under review");
        return;
    case ATTEMPT_STATUS_PENDING:
        /* Not sent by us yet: our own call, with the same key, will be
         * answered with this success. */
        set(d, WEBHOOK_IGNORE, a->status, "not sent yet; the call will see it");
        return;
    default:
        set(d, WEBHOOK_FLAG, a->status,
            "the provider reported success for a rejected attempt");
        return;
    }
}

static void decide(const struct webhook_event *ev, const struct webhook_attempt *a,
                   struct webhook_decision *d);

void webhook_event_decide(const struct webhook_event *ev,
                          const struct webhook_attempt *a, struct webhook_decision *d)
{
    decide(ev, a, d);
    /* A FAILED attempt may have been followed by another attempt of its
     * order: it cannot become live (REQUIRES_REVIEW) again beside it. The
     * evidence is kept for a person instead, loudly, never lost. */
    if ((d->action == WEBHOOK_APPLY || d->action == WEBHOOK_REVIEW) &&
        attempt_status_is_live(d->status) && !attempt_status_is_live(a->status) &&
        a->order_has_other_live) {
        d->action = WEBHOOK_FLAG;
        d->reason = "contradicts a failed attempt whose order has another live attempt";
        d->status = a->status;
    }
}

static void decide(const struct webhook_event *ev, const struct webhook_attempt *a,
                   struct webhook_decision *d)
{
    switch (ev->evidence) {
    case WEBHOOK_EVIDENCE_NONE:
        set(d, WEBHOOK_IGNORE, a->status, "event type not acted on");
        return;
    case WEBHOOK_EVIDENCE_SUCCEEDED:
        decide_success(ev, a, d);
        return;
    case WEBHOOK_EVIDENCE_FAILED:
        if (other_charge(ev, a)) {
            /* No money moved on a failure: nothing to review. */
            set(d, WEBHOOK_IGNORE, a->status, "failure of another charge");
        } else if (a->status == ATTEMPT_STATUS_PROCESSING ||
                   a->status == ATTEMPT_STATUS_UNKNOWN) {
            set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_FAILED,
                "the provider reported failure");
        } else if (a->status == ATTEMPT_STATUS_SUCCEEDED &&
                   ev->created > a->updated_at) {
            set(d, WEBHOOK_REVIEW, ATTEMPT_STATUS_REQUIRES_REVIEW,
                "the provider reported failure after success");
        } else if (a->status == ATTEMPT_STATUS_SUCCEEDED) {
            set(d, WEBHOOK_IGNORE, a->status, "older than the success it would undo");
        } else {
            set(d, WEBHOOK_IGNORE, a->status, "nothing to change");
        }
        return;
    case WEBHOOK_EVIDENCE_PROCESSING:
        if (!other_charge(ev, a) && a->status == ATTEMPT_STATUS_UNKNOWN)
            set(d, WEBHOOK_APPLY, ATTEMPT_STATUS_PROCESSING,
                "the provider is processing it");
        else if (attempt_status_is_settled(a->status))
            set(d, WEBHOOK_IGNORE, a->status, "older than the current state");
        else
            set(d, WEBHOOK_IGNORE, a->status, "nothing to change");
        return;
    }
    set(d, WEBHOOK_IGNORE, a->status, "event type not acted on");
}
