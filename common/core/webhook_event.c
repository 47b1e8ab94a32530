#include "webhook_event.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uuid/uuid.h>

#include "card_data.h"
#include "ownership.h"

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
    if (!strcmp(type, "refund.created") || !strcmp(type, "refund.updated") ||
        !strcmp(type, "refund.failed") || !strcmp(type, "charge.refunded"))
        return WEBHOOK_EVIDENCE_REFUND;
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
    case WEBHOOK_EVIDENCE_REFUND:
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
    return 0;
}

/* An id given as a string or as an expanded object's id: 0, 1 absent, -1
 * malformed. */
static int id_at(json_t *obj, const char *key, char *out, size_t size)
{
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
 * one of its refunds.data[] ("" otherwise). 0 / -1 with errbuf. */
static int by_refund(const void *a, const void *b)
{
    const struct webhook_refund *x = a, *y = b;
    int c = strcmp(x->refund_id, y->refund_id);
    return c ? c : strcmp(x->id, y->id);
}

static int parse_refund(json_t *obj, const char *type, const char *intent,
                        struct webhook_refund *r, char *errbuf, size_t errbuf_size)
{
    const char *s;
    json_t *v;

    memset(r, 0, sizeof(*r));
    r->amount = -1;
    if (!json_is_object(obj) ||
        ((s = str_at(obj, "object")) && strcmp(s, "refund") != 0)) {
        snprintf(errbuf, errbuf_size, "refund is not a refund object");
        return -1;
    }
    if (!(s = str_at(obj, "id")) || !plain_token(s, sizeof(r->id))) {
        snprintf(errbuf, errbuf_size, "refund id missing or malformed");
        return -1;
    }
    snprintf(r->id, sizeof(r->id), "%s", s);
    if (!(s = str_at(obj, "status")) || !plain_token(s, sizeof(r->status))) {
        snprintf(errbuf, errbuf_size, "refund status missing or malformed");
        return -1;
    }
    snprintf(r->status, sizeof(r->status), "%s", s);
    if (!strcmp(type, "refund.failed") &&
        webhook_refund_status(s) != ATTEMPT_STATUS_FAILED) {
        snprintf(errbuf, errbuf_size, "event type %s disagrees with refund status %s",
                 type, s);
        return -1;
    }
    v = json_object_get(obj, "amount");
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0)) {
        snprintf(errbuf, errbuf_size, "refund amount is not a whole number >= 0");
        return -1;
    }
    r->amount = v ? (long long)json_integer_value(v) : -1;
    if (currency_at(obj, r->currency) != 0) {
        snprintf(errbuf, errbuf_size, "refund currency malformed");
        return -1;
    }
    if (webhook_refund_status(r->status) == ATTEMPT_STATUS_SUCCEEDED &&
        (r->amount < 0 || !r->currency[0])) {
        snprintf(errbuf, errbuf_size, "refund amount or currency missing");
        return -1;
    }
    int got =
        id_at(obj, "payment_intent", r->payment_intent, sizeof(r->payment_intent));
    if (got < 0) {
        snprintf(errbuf, errbuf_size, "refund payment_intent malformed");
        return -1;
    }
    if (got > 0)
        snprintf(r->payment_intent, sizeof(r->payment_intent), "%s", intent);
    metadata_uuid(obj, "refund_id", r->refund_id);
    metadata_uuid(obj, "payment_attempt_id", r->attempt_id);
    if ((s = str_at(obj, "failure_reason"))) {
        card_data_copy_masked(r->failure_reason, sizeof(r->failure_reason), s);
    }
    return 0;
}

/* data.object of a refund event: a refund, or (charge.refunded) a charge
 * whose refunds.data[] are each applied. 0 / -1 with errbuf. */
static int parse_refunds(json_t *obj, struct webhook_event *ev, char *errbuf,
                         size_t errbuf_size)
{
    if (strcmp(ev->type, "charge.refunded") != 0) {
        ev->nrefunds = 1;
        if (parse_refund(obj, ev->type, "", &ev->refunds[0], errbuf, errbuf_size) != 0)
            return -1;
    } else {
        const char *s = str_at(obj, "object");
        if (s && strcmp(s, "charge") != 0) {
            snprintf(errbuf, errbuf_size, "event data.object is not a charge");
            return -1;
        }
        if (id_at(obj, "payment_intent", ev->intent_id, sizeof(ev->intent_id)) < 0) {
            snprintf(errbuf, errbuf_size, "charge payment_intent malformed");
            return -1;
        }
        json_t *list = json_object_get(json_object_get(obj, "refunds"), "data"), *r;
        size_t i;
        if (list && !json_is_array(list)) {
            snprintf(errbuf, errbuf_size, "charge refunds.data is not a list");
            return -1;
        }
        if (json_array_size(list) > WEBHOOK_REFUNDS_MAX) {
            snprintf(errbuf, errbuf_size, "charge lists more than %d refunds",
                     WEBHOOK_REFUNDS_MAX);
            return -1;
        }
        json_array_foreach(list, i, r)
        {
            if (parse_refund(r, ev->type, ev->intent_id, &ev->refunds[i], errbuf,
                             errbuf_size) != 0)
                return -1;
            ev->nrefunds++;
        }
        metadata_uuid(obj, "payment_attempt_id", ev->attempt_id);
    }
    /* Locked in one order by every delivery: two events naming the same
     * refunds in other orders never deadlock. */
    qsort(ev->refunds, ev->nrefunds, sizeof(ev->refunds[0]), by_refund);
    if (ev->nrefunds > 0) {
        if (!ev->intent_id[0])
            snprintf(ev->intent_id, sizeof(ev->intent_id), "%s",
                     ev->refunds[0].payment_intent);
        if (!ev->attempt_id[0])
            snprintf(ev->attempt_id, sizeof(ev->attempt_id), "%s",
                     ev->refunds[0].attempt_id);
    }
    return 0;
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
    if (!json_is_string(v) || !plain_token(json_string_value(v), 256))
        return 0;
    for (size_t i = 0; i < sizeof(PROVIDER_ID_KEYS) / sizeof(PROVIDER_ID_KEYS[0]); i++)
        if (!strcmp(key, PROVIDER_ID_KEYS[i]))
            return 1;
    return 0;
}

/* Every such number in the tree replaced, every string masked but the
 * provider's ids; under "metadata" (anyone's to write) every string is
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

/* The event as stored: re-written by jansson, ASCII only. 0 /
 * WEBHOOK_PARSE_NO_MEMORY. */
static int normalize(json_t *root, char **out, char *errbuf, size_t errbuf_size)
{
    if (!out)
        return 0;
    if (mask_card_numbers(root, 0) != 0) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return WEBHOOK_PARSE_NO_MEMORY;
    }
    *out = json_dumps(root, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!*out) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return WEBHOOK_PARSE_NO_MEMORY;
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
        int oom = json_error_code(&jerr) == json_error_out_of_memory;
        snprintf(errbuf, errbuf_size, oom ? "out of memory" : "body is not valid json");
        rc = oom ? WEBHOOK_PARSE_NO_MEMORY : -1;
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
    if (ev->evidence == WEBHOOK_EVIDENCE_REFUND) {
        if (parse_refunds(obj, ev, errbuf, errbuf_size) == 0)
            rc = normalize(root, normalized, errbuf, errbuf_size);
        goto out;
    }
    /* Events about other objects are recorded, not acted on. */
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
        card_data_copy_masked(ev->decline_code, sizeof(ev->decline_code), s);
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
    case WEBHOOK_UNPROVEN:
        return "unproven";
    case WEBHOOK_ACTION__COUNT:
        break;
    }
    return "ignored";
}

static void set(struct webhook_decision *d, enum webhook_action action,
                enum attempt_status status, const char *reason)
{
    d->check_now = 0;
    d->action = action;
    d->status = status;
    d->reason = reason;
}

/* A recorded id the database found different from the event's: never a
 * plain token, so never equal to one the event carries. */
static const char ANOTHER_ID[] = "(another)";

/* Whose intent the event is about (ownership.h). The database compared the
 * ids, whatever their length: the recorded one stands as the event's when
 * they are equal, as another otherwise. */
static enum ownership_verdict intent_owner(const struct webhook_event *ev,
                                           const struct webhook_attempt *a)
{
    const struct ownership_claim c = {
        .recorded_id = !a->intent_recorded ? NULL
                       : a->intent_differs ? ANOTHER_ID
                                           : ev->intent_id,
        .object_id = ev->intent_id,
        .recorded_elsewhere = a->intent_elsewhere,
    };
    return ownership_judge(&c, NULL, 0);
}

/* Our own intent, yet another charge: its amount or currency differ. */
static int other_charge(const struct webhook_event *ev, const struct webhook_attempt *a)
{
    return (ev->amount >= 0 && ev->amount != a->amount) ||
           (ev->currency[0] && strcmp(ev->currency, a->currency));
}

/* An intent not proven ours never moves the attempt. Its success could be
 * money taken in our name: flagged loudly for a person, our attempt left
 * as it is. Not while the attempt's own call is in flight or unknown and
 * nothing of ours is recorded: the provider's webhook often outruns our
 * own answer, and paging on every such race would teach people to ignore
 * the page. Then it is unproven: the attempt's own call, or the
 * reconciler's replay under its key, settles it, and the auditor pages on
 * an intent that stays no attempt's own (foreign_intent, charged_twice).
 * An UNKNOWN attempt is looked at now: the charge again under its own key
 * is the proof the event is not. */
static void decide_not_ours(const struct webhook_event *ev,
                            const struct webhook_attempt *a, enum ownership_verdict v,
                            struct webhook_decision *d)
{
    int foreign = v == OWNERSHIP_FOREIGN;
    int in_flight =
        a->status == ATTEMPT_STATUS_PROCESSING || a->status == ATTEMPT_STATUS_UNKNOWN;
    if (ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED && !foreign && in_flight)
        set(d, WEBHOOK_UNPROVEN, a->status,
            "the provider reported success of an intent that only names the attempt; "
            "its own call settles it");
    else if (ev->evidence == WEBHOOK_EVIDENCE_SUCCEEDED)
        set(d, WEBHOOK_FLAG, a->status,
            foreign ? "the provider reported success of another's intent"
                    : "the provider reported success of an intent that only names "
                      "the attempt");
    else
        set(d, WEBHOOK_IGNORE, a->status,
            foreign ? "about another's intent"
                    : "about an intent that only names the attempt");
    d->check_now = a->status == ATTEMPT_STATUS_UNKNOWN;
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
    /* A refund's event is about a refund, not the attempt. */
    if (ev->evidence == WEBHOOK_EVIDENCE_NONE ||
        ev->evidence == WEBHOOK_EVIDENCE_REFUND) {
        set(d, WEBHOOK_IGNORE, a->status, "event type not acted on");
        return;
    }
    enum ownership_verdict v = intent_owner(ev, a);
    if (v != OWNERSHIP_OURS) {
        decide_not_ours(ev, a, v, d);
        return;
    }
    switch (ev->evidence) {
    case WEBHOOK_EVIDENCE_NONE:
    case WEBHOOK_EVIDENCE_REFUND:
        break;
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

int webhook_refund_status(const char *provider_status)
{
    if (!strcmp(provider_status, "succeeded"))
        return ATTEMPT_STATUS_SUCCEEDED;
    if (!strcmp(provider_status, "failed") || !strcmp(provider_status, "canceled"))
        return ATTEMPT_STATUS_FAILED;
    if (!strcmp(provider_status, "pending") ||
        !strcmp(provider_status, "requires_action"))
        return ATTEMPT_STATUS_PROCESSING;
    return -1;
}

static void refund_set(struct webhook_refund_decision *d,
                       enum webhook_refund_action action, enum attempt_status status,
                       const char *reason)
{
    d->check_now = 0;
    d->action = action;
    d->status = status;
    d->reason = reason;
}

/* Whose refund the event's is (ownership.h), from what the database
 * compared: the ids recorded, and the intent our refund is on. */
static enum ownership_verdict refund_owner(const struct webhook_refund *r,
                                           const struct webhook_refund_row *row)
{
    const struct ownership_claim c = {
        .recorded_id = !row->provider_id_recorded ? NULL
                       : row->provider_id_differs ? ANOTHER_ID
                                                  : r->id,
        .object_id = r->id,
        .recorded_elsewhere = row->provider_id_elsewhere,
        .parent_id = row->intent_differs ? ANOTHER_ID : r->payment_intent,
        .object_parent_id = r->payment_intent,
    };
    return ownership_judge(&c, NULL, 0);
}

/* Our own refund, yet another amount or currency than we asked. */
static int other_refund(const struct webhook_refund *r,
                        const struct webhook_refund_row *row)
{
    return (r->amount >= 0 && r->amount != row->amount) ||
           (r->currency[0] && row->currency[0] && strcmp(r->currency, row->currency));
}

/* A refund not proven ours never moves the row, and never gives a
 * reservation back: its success is recorded for a person, anything else
 * ignored; an UNKNOWN refund is looked at now (its refund again under its
 * own key is the proof). */
static void refund_not_ours(const struct webhook_refund *r,
                            const struct webhook_refund_row *row,
                            enum ownership_verdict v, struct webhook_refund_decision *d)
{
    int foreign = v == OWNERSHIP_FOREIGN;
    if (webhook_refund_status(r->status) == ATTEMPT_STATUS_SUCCEEDED)
        refund_set(d, WEBHOOK_REFUND_NEEDS_REVIEW, row->status,
                   foreign ? "the provider reported success of another's refund"
                           : "the provider reported success of a refund that only "
                             "names ours");
    else
        refund_set(d, WEBHOOK_REFUND_IGNORE, row->status,
                   foreign ? "about another's refund"
                           : "about a refund that only names ours");
    d->check_now = row->status == ATTEMPT_STATUS_UNKNOWN;
}

void webhook_refund_decide(const struct webhook_refund *r,
                           const struct webhook_refund_row *row,
                           struct webhook_refund_decision *d)
{
    const enum attempt_status cur = row->status;
    int open = cur == ATTEMPT_STATUS_PROCESSING || cur == ATTEMPT_STATUS_UNKNOWN;
    enum ownership_verdict v = refund_owner(r, row);

    if (v != OWNERSHIP_OURS && webhook_refund_status(r->status) >= 0) {
        refund_not_ours(r, row, v, d);
        return;
    }

    switch (webhook_refund_status(r->status)) {
    case ATTEMPT_STATUS_SUCCEEDED:
        if (other_refund(r, row) && cur != ATTEMPT_STATUS_PENDING)
            refund_set(d, WEBHOOK_REFUND_NEEDS_REVIEW, cur,
                       "the provider reported success for another refund");
        else if (open)
            refund_set(d, WEBHOOK_REFUND_APPLY, ATTEMPT_STATUS_SUCCEEDED,
                       "the provider reported the refund succeeded");
        else if (cur == ATTEMPT_STATUS_SUCCEEDED)
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "already succeeded");
        else if (cur == ATTEMPT_STATUS_PENDING)
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur,
                       "not sent yet; the call will see it");
        else if (cur == ATTEMPT_STATUS_REQUIRES_REVIEW)
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "already under review");
        else
            refund_set(
                d, WEBHOOK_REFUND_NEEDS_REVIEW, cur,
                "the provider reported success for a refund we hold as not made");
        return;
    case ATTEMPT_STATUS_FAILED:
        if (cur == ATTEMPT_STATUS_SUCCEEDED && !other_refund(r, row))
            refund_set(d, WEBHOOK_REFUND_NEEDS_REVIEW, cur,
                       "the provider reported failure of a succeeded refund");
        else if (other_refund(r, row))
            /* No money moved on a failure: nothing to apply. */
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "failure of another refund");
        else if (open)
            refund_set(d, WEBHOOK_REFUND_APPLY, ATTEMPT_STATUS_FAILED,
                       "the provider reported the refund failed");
        else
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "nothing to change");
        return;
    case ATTEMPT_STATUS_PROCESSING:
        if (cur == ATTEMPT_STATUS_UNKNOWN && !other_refund(r, row))
            refund_set(d, WEBHOOK_REFUND_APPLY, ATTEMPT_STATUS_PROCESSING,
                       "the provider is processing the refund");
        else if (attempt_status_is_settled(cur))
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "older than the current state");
        else
            refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "nothing to change");
        return;
    default:
        refund_set(d, WEBHOOK_REFUND_IGNORE, cur, "refund status not acted on");
        return;
    }
}
