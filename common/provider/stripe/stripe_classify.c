#include "stripe_internal.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "card_data.h"
#include "charged_assert.h"
#include "utf8_text.h"

/* Provider text is bounded and made valid UTF-8 here, before anything
 * stores or logs it: a message cut mid-character once jammed every batch.
 * It is anyone's to write (a decline code, metadata): its card numbers are
 * masked on the way in, so no reason, event, log or finding carries one. */
void stripe_copy_str(char *dst, size_t size, const char *src)
{
    CHARGED_ASSERT(dst != NULL && size > 0);
    card_data_copy_masked(dst, size, src);
}

/* A provider object id is a key we look the object up by, not text: a
 * masked one would name another object. Bounded and valid UTF-8 only. */
static void copy_id(char *dst, size_t size, const char *src)
{
    CHARGED_ASSERT(dst != NULL && size > 0);
    utf8_text_copy(dst, size, src);
}

/* Prefixes of Stripe's object ids (and keys) a message may echo. */
static const char *const id_prefixes[] = {
    "acct", "ba",   "btok", "card", "ch",  "cs",    "cus",  "evt", "file", "ii",
    "in",   "pi",   "pk",   "pm",   "po",  "price", "prod", "py",  "pyr",  "re",
    "rk",   "seti", "si",   "sk",   "src", "sub",   "tok",  "tr",  "txn",  "whsec",
};

static int id_char(char c)
{
    return isalnum((unsigned char)c) || c == '_';
}

/* Length of the provider object id at s ("cus_" and at least one letter or
 * digit), 0 when there is none; prefix_len gets the length of "cus". */
static size_t id_at(const char *s, size_t *prefix_len)
{
    for (size_t i = 0; i < sizeof(id_prefixes) / sizeof(id_prefixes[0]); i++) {
        size_t n = strlen(id_prefixes[i]);
        if (strncmp(s, id_prefixes[i], n) != 0 || s[n] != '_' ||
            !isalnum((unsigned char)s[n + 1]))
            continue;
        size_t len = n + 1;
        while (id_char(s[len]))
            len++;
        *prefix_len = n;
        CHARGED_ASSERT(len > n + 1); /* the prefix, '_', and at least one more */
        return len;
    }
    return 0;
}

/* Appends n bytes of src to out (of size), as far as they fit. */
static void put(char *out, size_t size, size_t *at, const char *src, size_t n)
{
    CHARGED_ASSERT(*at < size);
    while (n-- > 0 && *at + 1 < size)
        out[(*at)++] = *src++;
}

void stripe_redact(char *dst, size_t size, const char *src)
{
    CHARGED_ASSERT(dst != NULL && size > 0);
    /* Masked first, on the whole message (a quote cut off by the bound is
     * still masked), then bounded and made valid UTF-8. */
    char tmp[1024];
    size_t at = 0, n, prefix;
    const char *p = src ? src : "";
    while (*p && at + 1 < sizeof(tmp)) {
        int boundary = p == src || !id_char(p[-1]);
        const char *close;
        if (boundary && (*p == '\'' || *p == '"' || *p == '`')) {
            /* A quoted value, up to the same quote ending a word: "card's"
             * is no quote, 'cus_x' is. */
            for (close = strchr(p + 1, *p); close && id_char(close[1]);
                 close = strchr(close + 1, *p))
                ;
            put(tmp, sizeof(tmp), &at, p, 1);
            put(tmp, sizeof(tmp), &at, "***", 3);
            if (!close)
                break; /* unterminated: the rest is the value */
            put(tmp, sizeof(tmp), &at, close, 1);
            p = close + 1;
        } else if (boundary && (n = id_at(p, &prefix)) > 0) {
            put(tmp, sizeof(tmp), &at, p, prefix + 1);
            put(tmp, sizeof(tmp), &at, "***", 3);
            p += n;
        } else {
            put(tmp, sizeof(tmp), &at, p++, 1);
        }
    }
    CHARGED_ASSERT(at < sizeof(tmp));
    tmp[at] = '\0';
    stripe_copy_str(dst, size, tmp);
}

/* An error's code and decline_code, each where it has one. */
static void take_codes(json_t *err, struct provider_result *res)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *decline = json_string_value(json_object_get(err, "decline_code"));
    if (code)
        stripe_copy_str(res->code, sizeof(res->code), code);
    if (decline)
        stripe_copy_str(res->decline_code, sizeof(res->decline_code), decline);
}

/* An amount the intent may carry: -1 when it does not (or not as one). */
static long long amount_at(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v)
                                                            : -1;
}

/* Fills result fields from a provider object (a PaymentIntent's, where it
 * has them): its id, status, amount, currency, attempt, and manual
 * capture's fields. */
static void take_object(json_t *pi, struct provider_result *res)
{
    const char *id = json_string_value(json_object_get(pi, "id"));
    copy_id(res->provider_payment_id, sizeof(res->provider_payment_id),
            provider_outcome_id_ok(id) ? id : "");
    /* Kept whole or not at all: a cut id would name another object. */
    CHARGED_ASSERT(!res->provider_payment_id[0] ||
                   !strcmp(res->provider_payment_id, id));
    stripe_copy_str(res->intent_status, sizeof(res->intent_status),
                    json_string_value(json_object_get(pi, "status")));
    res->amount = json_integer_value(json_object_get(pi, "amount"));
    stripe_copy_str(res->currency, sizeof(res->currency),
                    json_string_value(json_object_get(pi, "currency")));
    stripe_copy_str(res->intent_attempt_id, sizeof(res->intent_attempt_id),
                    json_string_value(json_object_get(json_object_get(pi, "metadata"),
                                                      "payment_attempt_id")));
    stripe_copy_str(res->capture_method, sizeof(res->capture_method),
                    json_string_value(json_object_get(pi, "capture_method")));
    stripe_copy_str(res->cancellation_reason, sizeof(res->cancellation_reason),
                    json_string_value(json_object_get(pi, "cancellation_reason")));
    res->amount_capturable = amount_at(pi, "amount_capturable");
    res->amount_received = amount_at(pi, "amount_received");
}

/* Fills result fields from a PaymentIntent object, its last error's codes
 * included. */
static void take_intent(json_t *pi, struct provider_result *res)
{
    take_object(pi, res);
    json_t *lpe = json_object_get(pi, "last_payment_error");
    if (json_is_object(lpe))
        take_codes(lpe, res);
}

/* An intent's own status, as an outcome; `manual`: a manual-capture
 * intent, whose hold is an authorization. */
static enum provider_outcome intent_outcome(const char *status, int manual)
{
    CHARGED_ASSERT(status != NULL);
    if (!strcmp(status, "succeeded"))
        return PROVIDER_SUCCEEDED;
    if (!strcmp(status, "processing"))
        return PROVIDER_PROCESSING;
    if (!strcmp(status, "requires_payment_method") || !strcmp(status, "canceled"))
        return PROVIDER_DECLINED;
    if (manual && !strcmp(status, "requires_capture"))
        return PROVIDER_AUTHORIZED;
    /* requires_action, requires_confirmation, a hold on an automatic
     * intent...: off-session charges should not end here; a human decides. */
    return PROVIDER_REQUIRES_REVIEW;
}

/* Is the intent of manual capture, as it says itself? */
static int intent_manual(json_t *pi)
{
    const char *how = json_string_value(json_object_get(pi, "capture_method"));
    return how && !strcmp(how, "manual");
}

/* A charge's 2xx intent, as an outcome. An authorization (manual) must be
 * held: money taken where a hold was asked, or an intent of the other
 * capture method, is for a person. */
static enum provider_outcome charge_outcome(const char *st, int manual, json_t *doc,
                                            struct provider_result *res)
{
    CHARGED_ASSERT(st != NULL && res != NULL);
    enum provider_outcome o = intent_outcome(st, manual);
    const char *how = json_string_value(json_object_get(doc, "capture_method"));
    if (manual && how && strcmp(how, "manual") != 0) {
        snprintf(res->error, sizeof(res->error),
                 "intent of another capture method, where a hold was asked");
        return PROVIDER_REQUIRES_REVIEW;
    }
    if (manual && o == PROVIDER_SUCCEEDED) {
        snprintf(res->error, sizeof(res->error),
                 "intent succeeded, where a hold was asked");
        return PROVIDER_REQUIRES_REVIEW;
    }
    if (o == PROVIDER_DECLINED)
        stripe_copy_str(res->error, sizeof(res->error), "intent not paid");
    else if (o == PROVIDER_REQUIRES_REVIEW)
        /* The status as take_intent kept it: the provider's own text may
         * hold control bytes or be cut mid-character here. */
        snprintf(res->error, sizeof(res->error), "intent status '%s'",
                 res->intent_status);
    return o;
}

static void classify_charge(int http, json_t *doc, int manual,
                            struct provider_result *res)
{
    json_t *err = json_object_get(doc, "error");
    const char *type = json_string_value(json_object_get(err, "type"));

    if (http >= 200 && http < 300) {
        const char *st = json_string_value(json_object_get(doc, "status"));
        if (!json_is_object(doc) || !st) {
            res->outcome = PROVIDER_UNKNOWN;
            stripe_copy_str(res->error, sizeof(res->error),
                            "2xx answer without an intent");
            return;
        }
        if (!provider_outcome_id_ok(json_string_value(json_object_get(doc, "id")))) {
            /* It may have executed, but we could never find it again. */
            res->outcome = PROVIDER_UNKNOWN;
            stripe_copy_str(res->error, sizeof(res->error),
                            "2xx answer with an unusable intent id");
            return;
        }
        take_intent(doc, res);
        res->outcome = charge_outcome(st, manual, doc, res);
        return;
    }
    if (err) {
        take_codes(err, res);
        stripe_redact(res->param, sizeof(res->param),
                      json_string_value(json_object_get(err, "param")));
        /* Masked here, once: the message echoes what we sent (a customer,
         * a card token), and no reason, event or log may carry it. */
        stripe_redact(res->error, sizeof(res->error),
                      json_string_value(json_object_get(err, "message")));
    }
    if (http >= 500) {
        res->outcome = PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "provider answered %d", http);
        return;
    }
    switch (http) {
    case 402:
        if (type && !strcmp(type, "card_error")) {
            res->outcome = PROVIDER_DECLINED;
            /* Stripe's card error carries the intent: its amount, currency
             * and metadata tell whose it is, as a 2xx intent's do. The
             * error's own codes win over its last_payment_error. */
            json_t *pi = json_object_get(err, "payment_intent");
            if (json_is_object(pi)) {
                take_intent(pi, res);
                take_codes(err, res);
            }
        } else {
            res->outcome = PROVIDER_REQUIRES_REVIEW;
            if (!res->error[0])
                stripe_copy_str(res->error, sizeof(res->error),
                                "402 without a card error");
        }
        return;
    case 400:
        res->outcome = type && !strcmp(type, "idempotency_error")
                           ? PROVIDER_REQUIRES_REVIEW
                           : PROVIDER_INVALID;
        return;
    case 409:
    case 429:
        res->outcome = PROVIDER_NOT_EXECUTED;
        if (!res->error[0])
            snprintf(res->error, sizeof(res->error), "provider answered %d", http);
        return;
    case 401:
    case 403:
    case 404:
        /* The provider refused us before doing anything (our key or URL is
         * wrong). Retrying with the same key is safe, and an operator must
         * look: the caller logs it. */
        res->outcome = PROVIDER_NOT_EXECUTED;
        snprintf(res->error, sizeof(res->error), "provider refused the request (%d)",
                 http);
        return;
    default:
        /* 1xx, 3xx, another 4xx: nothing says it did not execute. Unknown,
         * for look-ups; retrying it for as long as the key is kept would
         * hold the partition for a day. */
        res->outcome = PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "unexpected answer %d", http);
        return;
    }
}

/* A refused POST other than a charge's (a refund's, a capture's, a
 * void's): as a charge's, but a 404 resource_missing is the provider's word
 * that the object is not there: final, as a 400. The object a 4xx carries
 * (Stripe's error.payment_intent) is taken too: it says what state refused
 * the operation (a captured, voided or expired authorization). */
static void classify_operation(int http, json_t *doc, struct provider_result *res)
{
    CHARGED_ASSERT(http < 200 || http >= 300);
    json_t *err = json_object_get(doc, "error");
    const char *code = json_string_value(json_object_get(err, "code"));
    if (http == 404 && code && !strcmp(code, "resource_missing")) {
        take_codes(err, res);
        stripe_redact(res->param, sizeof(res->param),
                      json_string_value(json_object_get(err, "param")));
        stripe_redact(res->error, sizeof(res->error),
                      json_string_value(json_object_get(err, "message")));
        res->outcome = PROVIDER_INVALID;
        return;
    }
    classify_charge(http, doc, 0, res);
    json_t *pi = json_object_get(err, "payment_intent");
    if (http >= 400 && http < 500 && json_is_object(pi))
        take_object(pi, res);
}

/* Why a capture's or void's 2xx intent is not the one asked for, or NULL:
 * another intent, another attempt's, or (a capture) another amount
 * captured than asked. */
static const char *action_mismatch(const struct provider_call *call,
                                   const struct provider_result *res)
{
    CHARGED_ASSERT(call->operation != PROVIDER_OPERATION_NONE);
    if (strcmp(res->provider_payment_id, call->payment_intent) != 0)
        return "answer describes another intent";
    if (call->attempt_id[0] && res->intent_attempt_id[0] &&
        strcasecmp(res->intent_attempt_id, call->attempt_id) != 0)
        return "intent belongs to another payment attempt";
    /* Captured: what it received is what was taken (processing: nothing yet). */
    if (call->operation == PROVIDER_OPERATION_CAPTURE && call->amount > 0 &&
        !strcmp(res->intent_status, "succeeded") && res->amount_received >= 0 &&
        res->amount_received != call->amount)
        return "intent captured another amount than asked";
    return NULL;
}

/* A capture's or void's answer: a 2xx intent in the status the action
 * leaves it in (captured: succeeded; voided: canceled) is the action done;
 * anything else in a 2xx is for a person; a refusal is an operation's. */
static void classify_intent_action(const struct provider_call *call, int http,
                                   json_t *doc, struct provider_result *res)
{
    CHARGED_ASSERT(call->operation == PROVIDER_OPERATION_CAPTURE ||
                   call->operation == PROVIDER_OPERATION_VOID);
    int capture = call->operation == PROVIDER_OPERATION_CAPTURE;
    if (http < 200 || http >= 300) {
        classify_operation(http, doc, res);
        return;
    }
    const char *st = json_string_value(json_object_get(doc, "status"));
    if (!json_is_object(doc) || !st ||
        !provider_outcome_id_ok(json_string_value(json_object_get(doc, "id")))) {
        /* It may have executed, but we could never say on what. */
        res->outcome = PROVIDER_UNKNOWN;
        stripe_copy_str(res->error, sizeof(res->error),
                        "2xx answer without a usable intent");
        return;
    }
    take_object(doc, res);
    const char *why = action_mismatch(call, res);
    if (why) {
        res->outcome = PROVIDER_REQUIRES_REVIEW;
        stripe_copy_str(res->error, sizeof(res->error), why);
    } else if (!strcmp(st, capture ? "succeeded" : "canceled")) {
        res->outcome = PROVIDER_SUCCEEDED;
    } else if (capture && !strcmp(st, "processing")) {
        res->outcome = PROVIDER_PROCESSING;
    } else {
        res->outcome = PROVIDER_REQUIRES_REVIEW;
        snprintf(res->error, sizeof(res->error), "intent status '%s' after a %s",
                 res->intent_status, capture ? "capture" : "void");
    }
    CHARGED_ASSERT(res->outcome != PROVIDER_SUCCEEDED || res->provider_payment_id[0]);
}

/* Fills result fields from a Refund object: its id, status, amount,
 * currency and metadata[refund_id]. */
static void take_refund(json_t *re, struct provider_result *res)
{
    const char *id = json_string_value(json_object_get(re, "id"));
    copy_id(res->provider_payment_id, sizeof(res->provider_payment_id),
            provider_outcome_id_ok(id) ? id : "");
    /* Kept whole or not at all: a cut id would name another object. */
    CHARGED_ASSERT(!res->provider_payment_id[0] ||
                   !strcmp(res->provider_payment_id, id));
    stripe_copy_str(res->intent_status, sizeof(res->intent_status),
                    json_string_value(json_object_get(re, "status")));
    res->amount = json_integer_value(json_object_get(re, "amount"));
    stripe_copy_str(res->currency, sizeof(res->currency),
                    json_string_value(json_object_get(re, "currency")));
    stripe_copy_str(res->intent_attempt_id, sizeof(res->intent_attempt_id),
                    json_string_value(
                        json_object_get(json_object_get(re, "metadata"), "refund_id")));
}

/* A refund's status as an outcome: the one place it is decided. A failed
 * or canceled one keeps why in code and error. */
static void refund_outcome(json_t *re, struct provider_result *res)
{
    const char *st = json_string_value(json_object_get(re, "status"));
    const char *why = json_string_value(json_object_get(re, "failure_reason"));

    if (!st)
        st = "";
    if (!strcmp(st, "succeeded")) {
        res->outcome = PROVIDER_SUCCEEDED;
    } else if (!strcmp(st, "pending") || !strcmp(st, "requires_action")) {
        res->outcome = PROVIDER_PROCESSING;
    } else if (!strcmp(st, "failed") || !strcmp(st, "canceled")) {
        res->outcome = PROVIDER_DECLINED;
        if (why && *why)
            stripe_redact(res->code, sizeof(res->code), why);
        else
            stripe_copy_str(res->code, sizeof(res->code),
                            !strcmp(st, "failed") ? "refund_failed"
                                                  : "refund_canceled");
        snprintf(res->error, sizeof(res->error), "refund %s: %s", st, res->code);
    } else {
        /* A status we do not know: a human decides. */
        res->outcome = PROVIDER_REQUIRES_REVIEW;
        stripe_redact(res->intent_status, sizeof(res->intent_status), st);
        snprintf(res->error, sizeof(res->error), "refund status '%s'",
                 res->intent_status);
    }
}

/* A refund's answer to its POST: a 2xx refund by its status, anything else
 * as an operation's (a 404 resource_missing, no such intent, is final). */
static void classify_refund(const struct provider_call *call, int http, json_t *doc,
                            struct provider_result *res)
{
    CHARGED_ASSERT(call->refund && !call->lookup);
    if (http < 200 || http >= 300) {
        classify_operation(http, doc, res);
        return;
    }
    const char *object = json_string_value(json_object_get(doc, "object"));
    if (!json_is_object(doc) ||
        !provider_outcome_id_ok(json_string_value(json_object_get(doc, "id"))) ||
        !object || strcmp(object, "refund") != 0) {
        /* It may have executed, but we could never find it again. */
        res->outcome = PROVIDER_UNKNOWN;
        stripe_copy_str(res->error, sizeof(res->error),
                        "2xx answer without a usable refund");
        return;
    }
    take_refund(doc, res);
    refund_outcome(doc, res);
    /* The refund must be the one we asked for: a replay under our key of
     * something else is not ours to book. */
    json_t *amount = json_object_get(doc, "amount");
    const char *rid = json_string_value(
        json_object_get(json_object_get(doc, "metadata"), "refund_id"));
    if ((json_is_integer(amount) && json_integer_value(amount) != call->amount) ||
        (rid && strcmp(rid, call->attempt_id) != 0)) {
        res->outcome = PROVIDER_REQUIRES_REVIEW;
        stripe_copy_str(res->error, sizeof(res->error),
                        "refund differs from the one we asked for");
    }
}

/* The most settled of a page's refunds of `refund_id` (succeeded > pending
 * > any other > failed): res->matches counts them, none is NOT_FOUND. Its
 * metadata names the refund in either case: a UUID is one id however it is
 * written, and one naming ours in upper case must not hide from a review. */
static void take_best_refund(json_t *data, const char *refund_id,
                             struct provider_result *res)
{
    json_t *re, *best = NULL;
    size_t i;
    int best_rank = 99;
    res->matches = 0;
    json_array_foreach(data, i, re)
    {
        const char *a = json_string_value(
            json_object_get(json_object_get(re, "metadata"), "refund_id"));
        if (!a || strcasecmp(a, refund_id) != 0)
            continue;
        res->matches++;
        struct provider_result probe = {0};
        refund_outcome(re, &probe);
        int rank = probe.outcome == PROVIDER_SUCCEEDED    ? 0
                   : probe.outcome == PROVIDER_PROCESSING ? 1
                   : probe.outcome == PROVIDER_DECLINED   ? 3
                                                          : 2;
        if (rank < best_rank) {
            best_rank = rank;
            best = re;
        }
    }
    if (!best) {
        res->outcome = PROVIDER_NOT_FOUND;
        stripe_copy_str(res->error, sizeof(res->error),
                        "no refund for this refund attempt");
        return;
    }
    take_refund(best, res);
    refund_outcome(best, res);
    CHARGED_ASSERT(res->matches > 0 && res->outcome != PROVIDER_NOT_FOUND);
}

/* A charge's intent must be the one we asked for: the same amount and
 * currency, and our attempt in its metadata. An answer that says otherwise
 * is not a success we can book: a human looks. Fields the answer does not
 * carry are not judged. */
static void check_intent_matches(const struct provider_call *call, json_t *doc,
                                 struct provider_result *res)
{
    CHARGED_ASSERT(!call->lookup && !call->refund && !call->operation);
    if (res->outcome != PROVIDER_SUCCEEDED && res->outcome != PROVIDER_PROCESSING &&
        res->outcome != PROVIDER_AUTHORIZED)
        return;
    json_t *amount = json_object_get(doc, "amount");
    const char *currency = json_string_value(json_object_get(doc, "currency"));
    const char *attempt = json_string_value(
        json_object_get(json_object_get(doc, "metadata"), "payment_attempt_id"));
    char why[160] = "";
    if (json_is_integer(amount) && json_integer_value(amount) != call->amount)
        snprintf(why, sizeof(why), "intent amount %lld, we asked %lld",
                 (long long)json_integer_value(amount), call->amount);
    else if (currency && strcasecmp(currency, call->currency) != 0)
        snprintf(why, sizeof(why), "intent currency differs from the one we asked");
    else if (attempt && strcmp(attempt, call->attempt_id) != 0)
        snprintf(why, sizeof(why), "intent belongs to another payment attempt");
    if (!why[0])
        return;
    res->outcome = PROVIDER_REQUIRES_REVIEW;
    stripe_copy_str(res->error, sizeof(res->error), why);
}

/* The most settled of a look-up's intents (succeeded > processing >
 * anything else > declined), only those of `attempt_id` when it is given
 * (named in either case, as take_best_refund): res->matches counts them,
 * none is NOT_FOUND. */
static void take_best(json_t *data, const char *attempt_id, struct provider_result *res)
{
    json_t *pi, *best = NULL;
    size_t i;
    int best_rank = 99;
    res->matches = 0;
    json_array_foreach(data, i, pi)
    {
        const char *a = json_string_value(
            json_object_get(json_object_get(pi, "metadata"), "payment_attempt_id"));
        if (attempt_id && (!a || strcasecmp(a, attempt_id) != 0))
            continue;
        res->matches++;
        const char *st = json_string_value(json_object_get(pi, "status"));
        enum provider_outcome o = intent_outcome(st ? st : "", intent_manual(pi));
        int rank = o == PROVIDER_SUCCEEDED    ? 0
                   : o == PROVIDER_PROCESSING ? 1
                   : o == PROVIDER_DECLINED   ? 3
                                              : 2;
        if (rank < best_rank) {
            best_rank = rank;
            best = pi;
        }
    }
    if (!best) {
        res->outcome = PROVIDER_NOT_FOUND;
        stripe_copy_str(res->error, sizeof(res->error), "no intent for this attempt");
        return;
    }
    take_intent(best, res);
    res->outcome = intent_outcome(res->intent_status, intent_manual(best));
    CHARGED_ASSERT(res->matches > 0 && res->outcome != PROVIDER_NOT_FOUND);
}

/* A list page must say whether another follows, and where: else the walk
 * could stop short and call an absence what it never saw. */
static int take_cursor(json_t *doc, json_t *data, struct provider_result *res)
{
    json_t *more = json_object_get(doc, "has_more");
    if (!json_is_boolean(more))
        return -1;
    res->has_more = json_is_true(more);
    if (!res->has_more)
        return 0;
    size_t n = json_array_size(data);
    const char *last =
        n ? json_string_value(json_object_get(json_array_get(data, n - 1), "id"))
          : NULL;
    if (!provider_outcome_id_ok(last))
        return -1;
    copy_id(res->list_last_id, sizeof(res->list_last_id), last);
    CHARGED_ASSERT(res->list_last_id[0]); /* where the next page starts */
    return 0;
}

static void classify_lookup(int http, json_t *doc, enum provider_lookup kind,
                            int refund, const char *attempt_id,
                            struct provider_result *res)
{
    static const char *objects[] = {"payment_intent", "search_result", "list"};
    CHARGED_ASSERT((unsigned)kind <= PROVIDER_LOOKUP_LIST);
    const char *want =
        refund && kind == PROVIDER_LOOKUP_RETRIEVE ? "refund" : objects[kind];
    if (http == 404) {
        /* Evidence of absence only in the provider's own words: a 404 from a
         * wrong URL or a proxy says nothing about the intent. And only of
         * the object asked for by id: a search or list answered 404 (say,
         * the refunds of an intent the provider no longer has) did not
         * look, so it says nothing of what there is. */
        const char *code =
            json_string_value(json_object_get(json_object_get(doc, "error"), "code"));
        if (kind != PROVIDER_LOOKUP_RETRIEVE) {
            res->outcome = PROVIDER_UNKNOWN;
            snprintf(res->error, sizeof(res->error),
                     "%s answered 404%s: no evidence of what it holds", objects[kind],
                     code && !strcmp(code, "resource_missing") ? " resource_missing"
                                                               : "");
        } else if (code && !strcmp(code, "resource_missing")) {
            res->outcome = PROVIDER_NOT_FOUND;
            stripe_copy_str(res->error, sizeof(res->error),
                            refund ? "no such refund" : "no such payment intent");
        } else {
            res->outcome = PROVIDER_UNKNOWN;
            stripe_copy_str(res->error, sizeof(res->error),
                            "look-up answered 404 without resource_missing");
        }
        return;
    }
    if (http != 200 || !json_is_object(doc)) {
        res->outcome = http >= 500 || http == 429 || http == 0 ? PROVIDER_UNKNOWN
                                                               : PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "look-up answered %d", http);
        return;
    }
    const char *object = json_string_value(json_object_get(doc, "object"));
    if (!object || strcmp(object, want) != 0) {
        /* Not the answer asked for: no evidence either way. */
        res->outcome = PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error),
                 "look-up answered something that is not a %s", want);
        return;
    }
    if (kind == PROVIDER_LOOKUP_RETRIEVE && refund) {
        if (!provider_outcome_id_ok(json_string_value(json_object_get(doc, "id")))) {
            res->outcome = PROVIDER_UNKNOWN;
            stripe_copy_str(res->error, sizeof(res->error),
                            "refund without a usable id");
            return;
        }
        res->matches = 1;
        take_refund(doc, res);
        refund_outcome(doc, res);
        return;
    }
    json_t *data = json_object_get(doc, "data");
    if (kind == PROVIDER_LOOKUP_RETRIEVE) {
        res->matches = 1;
        take_intent(doc, res);
        res->outcome = intent_outcome(res->intent_status, intent_manual(doc));
    } else if (!json_is_array(data) ||
               (kind == PROVIDER_LOOKUP_LIST && take_cursor(doc, data, res))) {
        res->outcome = PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "%s answered without %s",
                 objects[kind],
                 json_is_array(data) ? "a usable has_more and cursor" : "a data list");
        return;
    } else if (refund) {
        /* A search is asked for the attempt; a list holds everyone's
         * intents (a refunds' list, the intent's refunds of every refund
         * attempt). */
        take_best_refund(data, attempt_id, res);
    } else {
        take_best(data, kind == PROVIDER_LOOKUP_LIST ? attempt_id : NULL, res);
    }
    /* Evidence names its object: a hold or a charge whose id we could not
     * use again (to capture it, to look it up) settles nothing. */
    if (res->outcome != PROVIDER_NOT_FOUND && !res->provider_payment_id[0]) {
        res->outcome = PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error),
                 "look-up answered an object without a usable id");
    }
}

void stripe_classify(const struct provider_call *call, int http_status,
                     const char *replayed, const char *body, size_t body_len,
                     struct provider_result *res)
{
    CHARGED_ASSERT(call != NULL && res != NULL);
    res->http_status = http_status;
    res->replayed = replayed && !strcasecmp(replayed, "true");
    json_error_t jerr;
    json_t *doc = body ? json_loadb(body, body_len, 0, &jerr) : NULL;
    if (call->lookup)
        classify_lookup(http_status, doc, call->kind, call->refund, call->attempt_id,
                        res);
    else if (call->refund)
        classify_refund(call, http_status, doc, res);
    else if (call->operation != PROVIDER_OPERATION_NONE)
        classify_intent_action(call, http_status, doc, res);
    else {
        classify_charge(http_status, doc, call->manual, res);
        check_intent_matches(call, doc, res);
    }
    json_decref(doc);
    /* Over the rate limit: nothing executed (a POST's NOT_EXECUTED, a
     * look-up's UNKNOWN, as before), and said so, so that callers slow
     * down instead of counting it as an outage. Retry-After is the wire's
     * (stripe_finish). */
    res->throttled = http_status == 429;
    CHARGED_ASSERT(!res->throttled || res->outcome == PROVIDER_NOT_EXECUTED ||
                   res->outcome == PROVIDER_UNKNOWN);
    CHARGED_ASSERT((unsigned)res->outcome < PROVIDER_OUTCOME__COUNT);
    /* An answer to what we sent never says "not found", and a success or a
     * hold we may book always names the provider's object. */
    CHARGED_ASSERT(call->lookup || (res->outcome != PROVIDER_NOT_FOUND &&
                                    ((res->outcome != PROVIDER_SUCCEEDED &&
                                      res->outcome != PROVIDER_AUTHORIZED) ||
                                     res->provider_payment_id[0])));
}
