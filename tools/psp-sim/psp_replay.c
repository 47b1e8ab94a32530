/* psp_replay: the state file's records, made and replayed. */
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "psp_store_internal.h"

/* The requests as records (NULL when a string is no UTF-8), and back: the
 * strings of a request read from a record point into it. */
json_t *pst_charge_record(const struct psp_charge_request *req)
{
    return json_pack(
        "{s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?}",
        "idempotency_key", req->idempotency_key, "amount", req->amount, "currency",
        req->currency, "payment_method", req->payment_method, "confirm", req->confirm,
        "payment_attempt_id", req->payment_attempt_id, "order_id", req->order_id,
        "customer", req->customer, "apm_enabled", req->apm_enabled,
        "apm_allow_redirects", req->apm_allow_redirects, "body", req->body,
        "capture_method", req->capture_method);
}

json_t *pst_cancel_record(const struct psp_cancel_request *req)
{
    return json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?}", "idempotency_key",
                     req->idempotency_key, "payment_intent_id", req->payment_intent_id,
                     "cancellation_reason", req->cancellation_reason,
                     "unknown_parameter", req->unknown_parameter, "body", req->body);
}

json_t *pst_capture_record(const struct psp_capture_request *req)
{
    return json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?}", "idempotency_key",
                     req->idempotency_key, "payment_intent_id", req->payment_intent_id,
                     "amount_to_capture", req->amount_to_capture, "unknown_parameter",
                     req->unknown_parameter, "body", req->body);
}

json_t *pst_refund_record(const struct psp_refund_request *req)
{
    return json_pack("{s:s?, s:s?, s:s?, s:s?, s:O?, s:s?, s:s?}", "idempotency_key",
                     req->idempotency_key, "payment_intent", req->payment_intent,
                     "amount", req->amount, "reason", req->reason, "metadata",
                     req->metadata, "unknown_parameter", req->unknown_parameter, "body",
                     req->body);
}

/* An admin body, kept as its JSON text: nested in the record it would be a
 * level deeper than the parse allowed it, and a body as deep as allowed
 * could not be read back. */
json_t *pst_body_record(json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_t *record = json_pack("{s:s?}", "body_json", text);
    free(text);
    return record;
}

json_t *pst_id_and_body_record(const char *id, json_t *body)
{
    json_t *record = pst_body_record(body);
    if (record)
        json_object_set_new(record, "id", json_string(id));
    return record;
}

static const char *member_str(json_t *record, const char *name)
{
    return json_string_value(json_object_get(record, name));
}

/* ---- the journal's records, replayed ---- */

static void charge_from_record(json_t *r, struct psp_charge_request *req)
{
    *req = (struct psp_charge_request){
        .idempotency_key = member_str(r, "idempotency_key"),
        .amount = member_str(r, "amount"),
        .currency = member_str(r, "currency"),
        .payment_method = member_str(r, "payment_method"),
        .confirm = member_str(r, "confirm"),
        .capture_method = member_str(r, "capture_method"),
        .payment_attempt_id = member_str(r, "payment_attempt_id"),
        .order_id = member_str(r, "order_id"),
        .customer = member_str(r, "customer"),
        .apm_enabled = member_str(r, "apm_enabled"),
        .apm_allow_redirects = member_str(r, "apm_allow_redirects"),
        .body = member_str(r, "body"),
    };
}

static void cancel_from_record(json_t *r, struct psp_cancel_request *req)
{
    *req = (struct psp_cancel_request){
        .idempotency_key = member_str(r, "idempotency_key"),
        .payment_intent_id = member_str(r, "payment_intent_id"),
        .cancellation_reason = member_str(r, "cancellation_reason"),
        .unknown_parameter = member_str(r, "unknown_parameter"),
        .body = member_str(r, "body"),
    };
}

static void capture_from_record(json_t *r, struct psp_capture_request *req)
{
    *req = (struct psp_capture_request){
        .idempotency_key = member_str(r, "idempotency_key"),
        .payment_intent_id = member_str(r, "payment_intent_id"),
        .amount_to_capture = member_str(r, "amount_to_capture"),
        .unknown_parameter = member_str(r, "unknown_parameter"),
        .body = member_str(r, "body"),
    };
}

static void refund_from_record(json_t *r, struct psp_refund_request *req)
{
    json_t *md = json_object_get(r, "metadata");
    *req = (struct psp_refund_request){
        .idempotency_key = member_str(r, "idempotency_key"),
        .payment_intent = member_str(r, "payment_intent"),
        .amount = member_str(r, "amount"),
        .reason = member_str(r, "reason"),
        .metadata = json_is_object(md) ? md : NULL,
        .unknown_parameter = member_str(r, "unknown_parameter"),
        .body = member_str(r, "body"),
    };
}

/* The records a read makes: a settlement that was due, as of its time. */
static void replay_due(psp_store_t *st, json_t *record, int64_t now_ms, int refund)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec =
        json_object_get(refund ? st->refunds : st->intents, member_str(record, "id"));
    if (rec && refund)
        pst_settle_refund_if_due(st, rec, now_ms);
    else if (rec)
        pst_settle_if_due(st, rec, now_ms);
    pthread_mutex_unlock(&st->lock);
}

/* A "set" record: the setter it names. 0, or -1 for an unknown name. */
static int replay_set(psp_store_t *st, json_t *record)
{
    static const struct {
        const char *name;
        void (*set)(psp_store_t *, int64_t);
    } setters[] = {
        {"retention_ms", psp_store_set_retention},
        {"search_lag_ms", psp_store_set_search_lag},
        {"processing_settle_ms", psp_store_set_processing_settle},
        {"refund_settle_ms", psp_store_set_refund_settle},
        {"authorization_expiry_ms", psp_store_set_authorization_expiry},
    };
    const char *name = member_str(record, "name");
    for (size_t i = 0; name && i < sizeof(setters) / sizeof(setters[0]); i++) {
        if (!strcmp(name, setters[i].name)) {
            setters[i].set(st, json_integer_value(json_object_get(record, "ms")));
            return 0;
        }
    }
    return -1;
}

/* A capture's begin or execute record. 0, or -1 without an intent id. */
static int replay_capture(psp_store_t *st, json_t *record, int begin, int64_t now_ms)
{
    struct psp_capture_request capture;
    struct psp_answer ans = {0};

    capture_from_record(record, &capture);
    if (!capture.payment_intent_id)
        return -1;
    if (begin)
        psp_store_capture_begin(st, &capture, now_ms, &ans);
    else
        psp_store_capture_execute(st, &capture, now_ms, &ans);
    free(ans.body);
    return 0;
}

int psp_store_replay(psp_store_t *st, json_t *record)
{
    const char *op = member_str(record, "op");
    int64_t now = json_integer_value(json_object_get(record, "now"));
    const char *body_json = member_str(record, "body_json");
    /* Parsed as the admin API parsed it; "body": a record of an older file. */
    json_t *body = body_json ? json_loads(body_json, JSON_DECODE_ANY, NULL)
                             : json_incref(json_object_get(record, "body"));
    const char *id = member_str(record, "id");
    struct psp_answer ans = {0};
    struct psp_charge_request charge;
    struct psp_cancel_request cancel;
    struct psp_refund_request refund;
    int rc = 0;

    if (!op) {
        rc = -1;
    } else if (!strcmp(op, "charge_begin") || !strcmp(op, "charge_execute")) {
        charge_from_record(record, &charge);
        if (!strcmp(op, "charge_begin"))
            psp_store_begin(st, &charge, now, &ans);
        else
            psp_store_execute(st, &charge, now, &ans);
    } else if (!strcmp(op, "cancel_begin") || !strcmp(op, "cancel_execute")) {
        cancel_from_record(record, &cancel);
        if (!cancel.payment_intent_id)
            rc = -1;
        else if (!strcmp(op, "cancel_begin"))
            psp_store_cancel_begin(st, &cancel, now, &ans);
        else
            psp_store_cancel_execute(st, &cancel, now, &ans);
    } else if (!strcmp(op, "capture_begin") || !strcmp(op, "capture_execute")) {
        rc = replay_capture(st, record, !strcmp(op, "capture_begin"), now);
    } else if (!strcmp(op, "refund_begin") || !strcmp(op, "refund_execute")) {
        refund_from_record(record, &refund);
        if (!strcmp(op, "refund_begin"))
            psp_store_refund_begin(st, &refund, now, &ans);
        else
            psp_store_refund_execute(st, &refund, now, &ans);
    } else if (!strcmp(op, "release")) {
        psp_store_release(st, member_str(record, "key"));
    } else if (!strcmp(op, "settle_due") || !strcmp(op, "expire_due") ||
               !strcmp(op, "refund_settle_due")) {
        replay_due(st, record, now, op[0] == 'r');
    } else if (!strcmp(op, "settle") && id) {
        struct psp_settlement set = {member_str(record, "status"),
                                     member_str(record, "decline_code")};
        if (!set.status)
            rc = -1;
        else
            psp_store_settle(st, id, &set, now, &ans);
    } else if (!strcmp(op, "refund_settle") && id) {
        psp_store_refund_settle(st, id, member_str(record, "status"),
                                member_str(record, "failure_reason"), now, &ans);
    } else if (!strcmp(op, "inject_intents")) {
        psp_store_inject_intents(st, body, now, &ans);
    } else if (!strcmp(op, "inject_refund")) {
        psp_store_inject_refund(st, body, now, &ans);
    } else if (!strcmp(op, "amend") && id) {
        psp_store_amend(st, id, body, now, &ans);
    } else if (!strcmp(op, "delete") && id) {
        psp_store_delete(st, id, &ans);
    } else if (!strcmp(op, "reset")) {
        psp_store_reset(st);
    } else if (!strcmp(op, "set")) {
        rc = replay_set(st, record);
    } else if (!strcmp(op, "count")) {
        json_int_t c = json_integer_value(json_object_get(record, "counter"));
        if (c >= 0 && c < PSP_C__COUNT)
            psp_store_count(st, (enum psp_counter)c);
        else
            rc = -1;
    } else {
        rc = -1;
    }
    free(ans.body);
    json_decref(body);
    return rc;
}

void psp_store_release_reserved(psp_store_t *st)
{
    const char *key;
    json_t *e, *tmp;

    pthread_mutex_lock(&st->lock);
    json_object_foreach_safe(st->keys, tmp, key, e)
    {
        if (json_integer_value(json_object_get(e, "done")))
            continue;
        /* Kept as a release: the next replay must see the key free too,
         * not still held by a request that never ran. */
        if (st->journal)
            pst_journal(st, "release", 0, json_pack("{s:s}", "key", key));
        json_object_del(st->keys, key);
    }
    pthread_mutex_unlock(&st->lock);
}
