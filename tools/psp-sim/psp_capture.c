/* psp_capture: what moves an intent after its creation at a client's
 * request: cancel (a void of an authorization). */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psp_store_internal.h"

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
    json_t *err = json_pack("{s:s, s:s, s:s, s:O}", "type", "invalid_request_error",
                            "code", "payment_intent_unexpected_state", "message", msg,
                            "payment_intent", pi);
    pst_answer_json(ans, 400, json_pack("{s:o}", "error", err));
    st->counters[PSP_C_INVALID_400]++;
    return NULL;
}

/* Returns 0 when the parameters are Stripe's, else fills a 400. */
static int validate_cancel(const struct psp_cancel_request *req, struct psp_answer *ans)
{
    static const char *const reasons[] = {"duplicate", "fraudulent",
                                          "requested_by_customer", "abandoned"};
    if (req->unknown_parameter) {
        /* The name comes from the client: pst_printable ASCII, cut. */
        char shown[65], msg[128];
        size_t i;
        for (i = 0; req->unknown_parameter[i] && i < 64; i++) {
            unsigned char c = (unsigned char)req->unknown_parameter[i];
            shown[i] = c > 0x20 && c < 0x7f ? (char)c : '?';
        }
        shown[i] = '\0';
        snprintf(msg, sizeof(msg), "Received unknown parameter: %s", shown);
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_unknown", shown,
                         msg);
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

/* The endpoint a cancel's key belongs to (free() it), NULL when out of
 * memory. Not JSON: the id is any bytes the URL decoded to. */
static char *cancel_path(const struct psp_cancel_request *req)
{
    size_t n = strlen(req->payment_intent_id) + sizeof("/v1/payment_intents//cancel");
    char *path = malloc(n);
    if (path)
        snprintf(path, n, "/v1/payment_intents/%s/cancel", req->payment_intent_id);
    return path;
}

enum psp_begin psp_store_cancel_begin(psp_store_t *st,
                                      const struct psp_cancel_request *req,
                                      int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    enum psp_begin rc = PSP_BEGIN_ANSWERED;
    char *path = cancel_path(req);

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
    /* The intent may have settled while the cancel waited (latency). */
    json_t *rec = cancelable_intent(st, req->payment_intent_id, now_ms, ans);
    if (!rec) {
        /* Refused, as begin would have: nothing stored under the key. */
        json_t *e = req->idempotency_key
                        ? json_object_get(st->keys, req->idempotency_key)
                        : NULL;
        if (e && !json_integer_value(json_object_get(e, "done")))
            json_object_del(st->keys, req->idempotency_key);
        goto out;
    }
    json_t *pi = json_object_get(rec, "pi"), *row = json_object_get(rec, "row");
    const char *was = json_string_value(json_object_get(pi, "status"));
    json_t *cancel =
        json_pack("{s:s?, s:s, s:s?, s:s, s:i, s:I}", "idempotency_key",
                  req->idempotency_key, "payment_intent_id", req->payment_intent_id,
                  "cancellation_reason", req->cancellation_reason, "previous_status",
                  was, "http_status", 200, "at_ms", (json_int_t)now_ms);
    json_array_append_new(st->cancels, cancel);
    /* The charge's row follows its intent, counted once by what it is now;
     * a processing one has settled. */
    const char *outcome = json_string_value(json_object_get(row, "outcome"));
    if (outcome && !strcmp(outcome, "processing")) {
        st->counters[PSP_C_PROCESSING]--;
        st->counters[PSP_C_SETTLED]++;
        json_object_set_new(row, "settled_at_ms", json_integer(now_ms));
        json_object_del(st->processing, req->payment_intent_id);
    } else if (outcome && !strcmp(outcome, "declined")) {
        st->counters[PSP_C_DECLINED]--;
    }
    st->counters[PSP_C_CANCELED]++;
    st->counters[PSP_C_CANCELS]++;
    json_object_set_new(row, "outcome", json_string("canceled"));
    json_object_set_new(pi, "canceled_at", json_integer(now_ms / 1000));
    json_object_set_new(pi, "cancellation_reason",
                        req->cancellation_reason ? json_string(req->cancellation_reason)
                                                 : json_null());
    json_object_set_new(pi, "status", json_string("canceled"));
    pst_observe(st, pi, now_ms);
    pst_answer_json(ans, 200, json_incref(pi));
    pst_store_answer(st, req->idempotency_key, ans);
    executed = 1;
out:
    if (st->journal)
        pst_journal(st, "cancel_execute", now_ms, pst_cancel_record(req));
    pthread_mutex_unlock(&st->lock);
    return executed;
}
