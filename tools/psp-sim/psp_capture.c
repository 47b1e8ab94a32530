/* psp_capture: what moves an intent after its creation: a client's cancel
 * (a void when the intent is an authorization) and capture, and the
 * provider's own cancel of an authorization that expired. Stripe's manual
 * capture: an intent made with capture_method=manual is requires_capture
 * with amount_capturable its amount; a capture takes amount_to_capture (or
 * all) of it once and releases the rest; a cancel or the expiry releases
 * it all. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psp_store_internal.h"

static const char *member(json_t *o, const char *name)
{
    const char *s = json_string_value(json_object_get(o, name));
    return s ? s : "";
}

static json_int_t member_int(json_t *o, const char *name)
{
    return json_integer_value(json_object_get(o, name));
}

/* Caller holds the lock. Stripe's refusal of an operation on this intent:
 * 400 invalid_request_error with the intent in error.payment_intent. */
static void refuse_with_intent(psp_store_t *st, struct psp_answer *ans,
                               const char *code, const char *param, const char *msg,
                               json_t *pi)
{
    json_t *err = json_pack("{s:s, s:s, s:s, s:O}", "type", "invalid_request_error",
                            "code", code, "message", msg, "payment_intent", pi);
    if (param)
        json_object_set_new(err, "param", json_string(param));
    pst_answer_json(ans, 400, json_pack("{s:o}", "error", err));
    st->counters[PSP_C_INVALID_400]++;
}

/* 400 parameter_unknown naming the parameter, as printable ASCII cut at 64
 * bytes: it comes from the client. */
static void refuse_unknown_parameter(const char *name, struct psp_answer *ans)
{
    char shown[65], msg[128];
    size_t i;
    for (i = 0; name[i] && i < 64; i++) {
        unsigned char c = (unsigned char)name[i];
        shown[i] = c > 0x20 && c < 0x7f ? (char)c : '?';
    }
    shown[i] = '\0';
    snprintf(msg, sizeof(msg), "Received unknown parameter: %s", shown);
    pst_answer_error(ans, 400, "invalid_request_error", "parameter_unknown", shown,
                     msg);
}

void pst_release_reserved_key(psp_store_t *st, const char *key)
{
    json_t *e = key ? json_object_get(st->keys, key) : NULL;
    if (e && !json_integer_value(json_object_get(e, "done")))
        json_object_del(st->keys, key);
}

void pst_money_fields(json_t *pi, json_t *row)
{
    const char *status = member(pi, "status");
    json_int_t amount = member_int(pi, "amount");
    int manual = !strcmp(member(pi, "capture_method"), "manual");
    json_int_t capturable = !strcmp(status, "requires_capture") ? amount : 0;
    json_int_t received = !strcmp(status, "succeeded") ? amount : 0;

    json_object_set_new(pi, "amount_capturable", json_integer(capturable));
    json_object_set_new(pi, "amount_received", json_integer(received));
    if (!row)
        return;
    json_object_set_new(row, "kind", json_string(manual ? "authorization" : "charge"));
    if (manual) {
        json_object_set_new(row, "amount_authorized", json_integer(amount));
        json_object_set_new(row, "amount_capturable", json_integer(capturable));
        json_object_set_new(row, "amount_received", json_integer(received));
    }
}

void pst_authorize(psp_store_t *st, json_t *rec, int64_t at_ms)
{
    json_t *pi = json_object_get(rec, "pi");
    json_object_set_new(rec, "authorized_ms", json_integer(at_ms));
    json_object_set(st->authorized, member(pi, "id"), rec);
}

int64_t pst_expiry_left(psp_store_t *st, json_t *rec, int64_t now_ms)
{
    if (strcmp(member(json_object_get(rec, "pi"), "status"), "requires_capture") != 0)
        return -1;
    int64_t left =
        member_int(rec, "authorized_ms") + st->authorization_expiry_ms - now_ms;
    return left < 0 ? 0 : left;
}

/* Caller holds the lock. Cancels the intent of rec at at_ms for `reason`
 * (NULL: none): its status, its charge row's outcome and the counters,
 * which count each charge once by what it is now; a processing one has
 * settled, an authorization is released. Returns the status it had. */
static const char *cancel_now(psp_store_t *st, json_t *rec, const char *reason,
                              int64_t at_ms)
{
    json_t *pi = json_object_get(rec, "pi"), *row = json_object_get(rec, "row");
    const char *id = member(pi, "id"), *outcome = member(row, "outcome");
    const char *was = member(pi, "status");

    if (!strcmp(outcome, "processing")) {
        st->counters[PSP_C_PROCESSING]--;
        st->counters[PSP_C_SETTLED]++;
        json_object_set_new(row, "settled_at_ms", json_integer(at_ms));
        json_object_del(st->processing, id);
    } else if (!strcmp(outcome, "declined")) {
        st->counters[PSP_C_DECLINED]--;
    } else if (!strcmp(outcome, "requires_capture")) {
        st->counters[PSP_C_REQUIRES_CAPTURE]--;
        json_object_set_new(row, "settled_at_ms", json_integer(at_ms));
    }
    st->counters[PSP_C_CANCELED]++;
    json_object_set_new(row, "outcome", json_string("canceled"));
    json_object_set_new(pi, "canceled_at", json_integer(at_ms / 1000));
    json_object_set_new(pi, "cancellation_reason",
                        reason ? json_string(reason) : json_null());
    json_object_set_new(pi, "status", json_string("canceled"));
    pst_money_fields(pi, row);
    pst_observe(st, pi, at_ms);
    return was;
}

/* The row of a release of an authorization: a void or an expiry. */
static json_t *release_row(const char *kind, const char *key, json_t *rec,
                           const char *reason, int64_t at_ms)
{
    json_t *pi = json_object_get(rec, "pi"), *md = json_object_get(pi, "metadata");
    return json_pack("{s:s, s:s?, s:s, s:O?, s:O?, s:s?, s:I, s:s, s:I}", "kind", kind,
                     "idempotency_key", key, "payment_intent_id", member(pi, "id"),
                     "payment_attempt_id", json_object_get(md, "payment_attempt_id"),
                     "order_id", json_object_get(md, "order_id"), "cancellation_reason",
                     reason, "amount_released", member_int(pi, "amount_capturable"),
                     "currency", member(pi, "currency"), "at_ms", (json_int_t)at_ms);
}

void pst_expire_if_due(psp_store_t *st, json_t *rec, int64_t now_ms)
{
    if (pst_expiry_left(st, rec, now_ms) != 0)
        return;
    json_t *pi = json_object_get(rec, "pi");
    int64_t due = member_int(rec, "authorized_ms") + st->authorization_expiry_ms;
    json_t *row = release_row("expiry", NULL, rec, "automatic", due);
    json_object_set_new(row, "detected_at_ms", json_integer(now_ms));
    json_array_append_new(st->expiries, row);
    json_object_del(st->authorized, member(pi, "id"));
    st->counters[PSP_C_AUTHORIZATIONS_EXPIRED]++;
    cancel_now(st, rec, "automatic", due);
    /* A read changed the books: kept, since the setting may change. */
    if (st->journal)
        pst_journal(st, "expire_due", now_ms,
                    json_pack("{s:O}", "id", json_object_get(pi, "id")));
}

void psp_store_set_authorization_expiry(psp_store_t *st, int64_t expiry_ms)
{
    pthread_mutex_lock(&st->lock);
    st->authorization_expiry_ms = expiry_ms;
    if (st->journal)
        pst_journal(st, "set", 0,
                    json_pack("{s:s, s:I}", "name", "authorization_expiry_ms", "ms",
                              (json_int_t)expiry_ms));
    pthread_mutex_unlock(&st->lock);
}

/* The endpoint an operation's key belongs to (free() it), NULL when out of
 * memory. Not JSON: the id is any bytes the URL decoded to. */
static char *op_path(const char *intent_id, const char *op)
{
    size_t n = strlen(intent_id) + strlen(op) + sizeof("/v1/payment_intents//");
    char *path = malloc(n);
    if (path)
        snprintf(path, n, "/v1/payment_intents/%s/%s", intent_id, op);
    return path;
}

/* The statuses Stripe lets a PaymentIntent be canceled from. */
static int cancelable(const char *status)
{
    static const char *const ok[] = {"requires_payment_method", "requires_capture",
                                     "requires_confirmation", "requires_action",
                                     "processing"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        if (status && !strcmp(status, ok[i]))
            return 1;
    return 0;
}

/* Caller holds the lock. The intent a cancel may execute on, settled first
 * if it was due; else NULL and *ans is the refusal: 404 resource_missing, or
 * Stripe's 400 payment_intent_unexpected_state carrying the intent. */
static json_t *cancelable_intent(psp_store_t *st, const char *id, int64_t now_ms,
                                 struct psp_answer *ans)
{
    json_t *rec = json_object_get(st->intents, id);
    if (!rec) {
        pst_answer_no_such_intent(ans, id);
        return NULL;
    }
    pst_settle_if_due(st, rec, now_ms);
    json_t *pi = json_object_get(rec, "pi");
    const char *status = json_string_value(json_object_get(pi, "status"));
    if (cancelable(status))
        return rec;
    char msg[320];
    snprintf(msg, sizeof(msg),
             "You cannot cancel this PaymentIntent because it has a status of %s. "
             "Only a PaymentIntent with one of the following statuses may be "
             "canceled: requires_payment_method, requires_capture, "
             "requires_confirmation, requires_action, processing.",
             status ? status : "unknown");
    refuse_with_intent(st, ans, "payment_intent_unexpected_state", NULL, msg, pi);
    return NULL;
}

/* Returns 0 when the parameters are Stripe's, else fills a 400. */
static int validate_cancel(const struct psp_cancel_request *req, struct psp_answer *ans)
{
    static const char *const reasons[] = {"duplicate", "fraudulent",
                                          "requested_by_customer", "abandoned"};
    if (req->unknown_parameter) {
        refuse_unknown_parameter(req->unknown_parameter, ans);
        return -1;
    }
    if (!req->cancellation_reason)
        return 0;
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(req->cancellation_reason, reasons[i]))
            return 0;
    pst_answer_error(
        ans, 400, "invalid_request_error", "parameter_invalid", "cancellation_reason",
        "Invalid cancellation_reason: must be one of duplicate, fraudulent, "
        "requested_by_customer or abandoned.");
    return -1;
}

enum psp_begin psp_store_cancel_begin(psp_store_t *st,
                                      const struct psp_cancel_request *req,
                                      int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    enum psp_begin rc = PSP_BEGIN_ANSWERED;
    char *path = op_path(req->payment_intent_id, "cancel");

    pst_fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (!path) {
        pst_answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (pst_answer_from_key(st, req->idempotency_key, path, fp, now_ms, ans))
        goto out;
    if (validate_cancel(req, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    if (!cancelable_intent(st, req->payment_intent_id, now_ms, ans))
        goto out;
    pst_reserve_key(st, req->idempotency_key, path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        pst_journal(st, "cancel_begin", now_ms, pst_cancel_record(req));
    pthread_mutex_unlock(&st->lock);
    free(path);
    return rc;
}

int psp_store_cancel_execute(psp_store_t *st, const struct psp_cancel_request *req,
                             int64_t now_ms, struct psp_answer *ans)
{
    int executed = 0;

    pthread_mutex_lock(&st->lock);
    /* The intent may have settled, or expired, while the cancel waited. */
    json_t *rec = cancelable_intent(st, req->payment_intent_id, now_ms, ans);
    if (!rec) {
        /* Refused, as begin would have: nothing stored under the key. */
        pst_release_reserved_key(st, req->idempotency_key);
        goto out;
    }
    json_t *pi = json_object_get(rec, "pi");
    int is_void = !strcmp(member(pi, "status"), "requires_capture");
    json_t *cancel = release_row(is_void ? "void" : "cancel", req->idempotency_key, rec,
                                 req->cancellation_reason, now_ms);
    if (!is_void)
        json_object_del(cancel, "amount_released");
    json_object_set_new(cancel, "http_status", json_integer(200));
    json_object_set_new(cancel, "previous_status", json_string(member(pi, "status")));
    json_array_append_new(st->cancels, cancel);
    if (is_void) {
        json_object_del(st->authorized, req->payment_intent_id);
        st->counters[PSP_C_VOIDS]++;
    }
    st->counters[PSP_C_CANCELS]++;
    cancel_now(st, rec, req->cancellation_reason, now_ms);
    pst_answer_json(ans, 200, json_incref(pi));
    pst_store_answer(st, req->idempotency_key, ans);
    executed = 1;
out:
    if (st->journal)
        pst_journal(st, "cancel_execute", now_ms, pst_cancel_record(req));
    pthread_mutex_unlock(&st->lock);
    return executed;
}

/* ---- capture ---- */

/* Returns 0 when the parameters are Stripe's, else fills a 400; *amount
 * gets amount_to_capture (0: all that is capturable). */
static int validate_capture(const struct psp_capture_request *req, long long *amount,
                            struct psp_answer *ans)
{
    char *end;

    if (req->unknown_parameter) {
        refuse_unknown_parameter(req->unknown_parameter, ans);
        return -1;
    }
    *amount = 0;
    if (!req->amount_to_capture)
        return 0;
    errno = 0;
    *amount = strtoll(req->amount_to_capture, &end, 10);
    if (errno || *end || end == req->amount_to_capture || *amount < 1 ||
        *amount > 99999999999999LL) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid_integer",
                         "amount_to_capture",
                         "Invalid positive integer: amount_to_capture.");
        return -1;
    }
    return 0;
}

/* Caller holds the lock. The intent a capture of `amount` (0: all) may
 * execute on, settled or expired first if it was due, *amount set to what
 * it captures; else NULL and *ans is Stripe's refusal. */
static json_t *capturable_intent(psp_store_t *st, const char *id, long long *amount,
                                 int64_t now_ms, struct psp_answer *ans)
{
    json_t *rec = json_object_get(st->intents, id);
    char msg[320];

    if (!rec) {
        pst_answer_no_such_intent(ans, id);
        return NULL;
    }
    pst_settle_if_due(st, rec, now_ms);
    json_t *pi = json_object_get(rec, "pi");
    const char *status = member(pi, "status");
    long long capturable = member_int(pi, "amount_capturable");
    if (strcmp(status, "requires_capture") != 0) {
        snprintf(msg, sizeof(msg),
                 "This PaymentIntent could not be captured because it has a status of "
                 "%s. Only a PaymentIntent with one of the following statuses may be "
                 "captured: requires_capture.",
                 status);
        refuse_with_intent(st, ans, "payment_intent_unexpected_state", NULL, msg, pi);
        return NULL;
    }
    if (*amount > capturable) {
        snprintf(msg, sizeof(msg),
                 "The amount_to_capture (%lld) must be less than or equal to the "
                 "PaymentIntent's amount_capturable (%lld).",
                 *amount, capturable);
        refuse_with_intent(st, ans, "amount_too_large", "amount_to_capture", msg, pi);
        return NULL;
    }
    if (*amount == 0)
        *amount = capturable;
    return rec;
}

enum psp_begin psp_store_capture_begin(psp_store_t *st,
                                       const struct psp_capture_request *req,
                                       int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    long long amount;
    enum psp_begin rc = PSP_BEGIN_ANSWERED;
    char *path = op_path(req->payment_intent_id, "capture");

    pst_fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (!path) {
        pst_answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (pst_answer_from_key(st, req->idempotency_key, path, fp, now_ms, ans))
        goto out;
    if (validate_capture(req, &amount, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    if (!capturable_intent(st, req->payment_intent_id, &amount, now_ms, ans))
        goto out;
    pst_reserve_key(st, req->idempotency_key, path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        pst_journal(st, "capture_begin", now_ms, pst_capture_record(req));
    pthread_mutex_unlock(&st->lock);
    free(path);
    return rc;
}

/* Caller holds the lock. Captures `amount` of rec's authorization at
 * now_ms: the intent, its charge row (where the money moved: succeeded, of
 * the amount captured) and the counters. Returns the capture's row. */
static json_t *capture_now(psp_store_t *st, json_t *rec, long long amount,
                           int64_t now_ms)
{
    json_t *pi = json_object_get(rec, "pi"), *row = json_object_get(rec, "row");
    json_t *md = json_object_get(pi, "metadata");
    long long capturable = member_int(pi, "amount_capturable");

    json_t *capture = json_pack(
        "{s:s, s:s, s:O?, s:O?, s:I, s:I, s:s, s:i, s:I}", "kind", "capture",
        "payment_intent_id", member(pi, "id"), "payment_attempt_id",
        json_object_get(md, "payment_attempt_id"), "order_id",
        json_object_get(md, "order_id"), "amount", (json_int_t)amount,
        "amount_released", (json_int_t)(capturable - amount), "currency",
        member(pi, "currency"), "http_status", 200, "at_ms", (json_int_t)now_ms);
    json_object_set_new(pi, "status", json_string("succeeded"));
    json_object_set_new(pi, "amount_capturable", json_integer(0));
    json_object_set_new(pi, "amount_received", json_integer(amount));
    json_object_set_new(row, "outcome", json_string("succeeded"));
    json_object_set_new(row, "amount", json_integer(amount));
    json_object_set_new(row, "amount_capturable", json_integer(0));
    json_object_set_new(row, "amount_received", json_integer(amount));
    json_object_set_new(row, "settled_at_ms", json_integer(now_ms));
    json_object_del(st->authorized, member(pi, "id"));
    st->counters[PSP_C_REQUIRES_CAPTURE]--;
    st->counters[PSP_C_SUCCEEDED]++;
    st->counters[PSP_C_CAPTURES]++;
    pst_observe(st, pi, now_ms);
    return capture;
}

int psp_store_capture_execute(psp_store_t *st, const struct psp_capture_request *req,
                              int64_t now_ms, struct psp_answer *ans)
{
    long long amount = 0;
    int executed = 0;

    pthread_mutex_lock(&st->lock);
    /* The authorization may have been voided or expired while the capture
     * waited (latency): checked again, as begin did. */
    json_t *rec = NULL;
    if (validate_capture(req, &amount, ans) == 0)
        rec = capturable_intent(st, req->payment_intent_id, &amount, now_ms, ans);
    if (!rec) {
        pst_release_reserved_key(st, req->idempotency_key);
        goto out;
    }
    json_t *capture = capture_now(st, rec, amount, now_ms);
    json_object_set_new(capture, "idempotency_key",
                        req->idempotency_key ? json_string(req->idempotency_key)
                                             : json_null());
    json_object_set_new(capture, "amount_to_capture",
                        req->amount_to_capture ? json_integer(amount) : json_null());
    json_array_append_new(st->captures, capture);
    pst_answer_json(ans, 200, json_incref(json_object_get(rec, "pi")));
    pst_store_answer(st, req->idempotency_key, ans);
    executed = 1;
out:
    if (st->journal)
        pst_journal(st, "capture_execute", now_ms, pst_capture_record(req));
    pthread_mutex_unlock(&st->lock);
    return executed;
}
