#include "psp_store_internal.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *counter_names[PSP_C__COUNT] = {
    "requests",
    "executed",
    "succeeded",
    "declined",
    "processing",
    "replayed",
    "in_use_409",
    "idempotency_error",
    "invalid_request",
    "expired_keys",
    "canceled",
    "settled",
    "cancels",
    "refunds",
    "refunds_succeeded",
    "refunds_pending",
    "refunds_failed",
    "refunds_settled",
    "requires_capture",
    "captures",
    "voids",
    "authorizations_expired",
};

static const struct psp_method methods[] = {
    {"pm_card_visa", "succeeded", NULL, NULL, NULL},
    {"pm_card_mastercard", "succeeded", NULL, NULL, NULL},
    {"pm_card_processing", "processing", NULL, NULL, NULL},
    {"pm_card_chargeDeclined", NULL, "generic_decline", "Your card was declined.",
     NULL},
    {"pm_card_chargeDeclinedInsufficientFunds", NULL, "insufficient_funds",
     "Your card has insufficient funds.", NULL},
    {"pm_card_refundPending", "succeeded", NULL, NULL, "pending"},
    {"pm_card_refundPendingFail", "succeeded", NULL, NULL, "pending_fail"},
    {"pm_card_refundFail", "succeeded", NULL, NULL, "failed"},
};

psp_store_t *psp_store_new(int64_t retention_ms)
{
    psp_store_t *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    pthread_mutex_init(&st->lock, NULL);
    st->retention_ms = retention_ms;
    st->keys = json_object();
    st->intents = json_object();
    st->ledger = json_array();
    st->cancels = json_array();
    st->processing = json_object();
    st->refunds = json_object();
    st->refund_rows = json_array();
    st->refunds_pending = json_object();
    st->refund_executions = json_object();
    st->deleted = json_object();
    st->authorized = json_object();
    st->captures = json_array();
    st->expiries = json_array();
    st->authorization_expiry_ms = PSP_AUTHORIZATION_EXPIRY_MS;
    st->next_id = 1;
    if (!st->keys || !st->intents || !st->ledger || !st->cancels || !st->processing ||
        !st->refunds || !st->refund_rows || !st->refunds_pending ||
        !st->refund_executions || !st->deleted || !st->authorized || !st->captures ||
        !st->expiries) {
        psp_store_free(st);
        return NULL;
    }
    return st;
}

void psp_store_free(psp_store_t *st)
{
    if (!st)
        return;
    json_decref(st->keys);
    json_decref(st->intents);
    json_decref(st->ledger);
    json_decref(st->cancels);
    json_decref(st->processing);
    json_decref(st->refunds);
    json_decref(st->refund_rows);
    json_decref(st->refunds_pending);
    json_decref(st->refund_executions);
    json_decref(st->deleted);
    json_decref(st->authorized);
    json_decref(st->captures);
    json_decref(st->expiries);
    free(st->intent_index.v);
    free(st->refund_index.v);
    pthread_mutex_destroy(&st->lock);
    free(st);
}

void psp_store_set_journal(psp_store_t *st, psp_store_journal_fn fn, void *ctx)
{
    pthread_mutex_lock(&st->lock);
    st->journal = fn;
    st->journal_ctx = ctx;
    pthread_mutex_unlock(&st->lock);
}

/* Caller holds the lock, so records come in the order of the changes.
 * Hands record (taken; NULL when it could not be made) to the journal as
 * operation op at now_ms. Callers test st->journal first, so that nothing
 * is built without one. */
void pst_journal(psp_store_t *st, const char *op, int64_t now_ms, json_t *record)
{
    if (record) {
        json_object_set_new(record, "op", json_string(op));
        json_object_set_new(record, "now", json_integer(now_ms));
    }
    st->journal(st->journal_ctx, record);
}

void psp_store_set_retention(psp_store_t *st, int64_t retention_ms)
{
    pthread_mutex_lock(&st->lock);
    st->retention_ms = retention_ms;
    if (st->journal)
        pst_journal(st, "set", 0,
                    json_pack("{s:s, s:I}", "name", "retention_ms", "ms",
                              (json_int_t)retention_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_search_lag(psp_store_t *st, int64_t search_lag_ms)
{
    pthread_mutex_lock(&st->lock);
    st->search_lag_ms = search_lag_ms;
    if (st->journal)
        pst_journal(st, "set", 0,
                    json_pack("{s:s, s:I}", "name", "search_lag_ms", "ms",
                              (json_int_t)search_lag_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_processing_settle(psp_store_t *st, int64_t settle_ms)
{
    pthread_mutex_lock(&st->lock);
    st->processing_settle_ms = settle_ms;
    if (st->journal)
        pst_journal(st, "set", 0,
                    json_pack("{s:s, s:I}", "name", "processing_settle_ms", "ms",
                              (json_int_t)settle_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_observer(psp_store_t *st, psp_store_observer_fn fn, void *ctx)
{
    pthread_mutex_lock(&st->lock);
    st->observer = fn;
    st->observer_ctx = ctx;
    pthread_mutex_unlock(&st->lock);
}

/* Caller holds the lock. */
void pst_observe(psp_store_t *st, json_t *pi, int64_t at_ms)
{
    if (st->observer)
        st->observer(st->observer_ctx, pi, at_ms);
}

void psp_store_count(psp_store_t *st, enum psp_counter c)
{
    pthread_mutex_lock(&st->lock);
    st->counters[c]++;
    if (st->journal)
        pst_journal(st, "count", 0, json_pack("{s:i}", "counter", (int)c));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_charge_began(psp_store_t *st)
{
    pthread_mutex_lock(&st->lock);
    if (++st->charges_in_flight > st->max_charges_in_flight)
        st->max_charges_in_flight = st->charges_in_flight;
    pthread_mutex_unlock(&st->lock);
}

void psp_store_charge_ended(psp_store_t *st)
{
    pthread_mutex_lock(&st->lock);
    st->charges_in_flight--;
    pthread_mutex_unlock(&st->lock);
}

/* FNV-1a over the raw form body: the same request has the same body. */
void pst_fingerprint(const char *body, char out[17])
{
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char *p = (const unsigned char *)body; p && *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

void pst_answer_json(struct psp_answer *ans, int status, json_t *body)
{
    ans->status = status;
    ans->body = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ans->replayed = 0;
    json_decref(body);
}

void pst_answer_error(struct psp_answer *ans, int status, const char *type,
                      const char *code, const char *param, const char *message)
{
    json_t *err = json_pack("{s:s}", "type", type);
    if (code)
        json_object_set_new(err, "code", json_string(code));
    json_object_set_new(err, "message", json_string(message));
    if (param)
        json_object_set_new(err, "param", json_string(param));
    pst_answer_json(ans, status, json_pack("{s:o}", "error", err));
}

const struct psp_method *pst_find_method(const char *name)
{
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
        if (name && !strcmp(methods[i].name, name))
            return &methods[i];
    return NULL;
}

/* Stripe customer ids are cus_ and letters or digits (object ids stay under
 * 255 bytes); we keep no customers, so this shape is all we check. */
static int customer_id_valid(const char *s)
{
    size_t n = strlen(s);
    if (n <= 4 || n > 255 || strncmp(s, "cus_", 4) != 0)
        return 0;
    for (size_t i = 4; i < n; i++)
        if (!isalnum((unsigned char)s[i]))
            return 0;
    return 1;
}

/* value cut at 64 bytes and reduced to printable ASCII, "..." after it
 * when cut: it comes from the client and goes into JSON. */
void pst_printable(const char *value, char out[72])
{
    size_t i;
    for (i = 0; value[i] && i < 64; i++) {
        unsigned char c = (unsigned char)value[i];
        out[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    snprintf(out + i, 72 - i, "%s", value[i] ? "..." : "");
}

/* "No such <what>: '<value>'", the value as pst_printable() shows it. */
void pst_no_such(const char *what, const char *value, char *out, size_t outlen)
{
    char shown[72];
    pst_printable(value, shown);
    snprintf(out, outlen, "No such %s: '%s'", what, shown);
}

int pst_currency_valid(const char *c)
{
    return c && strlen(c) == 3 && islower((unsigned char)c[0]) &&
           islower((unsigned char)c[1]) && islower((unsigned char)c[2]);
}

/* Returns 0 when valid, else fills a 400 invalid_request_error. */
static int validate(const struct psp_charge_request *req, struct psp_answer *ans)
{
    char *end;
    long long amount;

    if (!req->amount || !*req->amount) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                         "amount", "Missing required param: amount.");
        return -1;
    }
    errno = 0;
    amount = strtoll(req->amount, &end, 10);
    if (errno || *end || end == req->amount || amount < 1 ||
        amount > 99999999999999LL) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid_integer",
                         "amount", "Invalid positive integer: amount.");
        return -1;
    }
    if (!pst_currency_valid(req->currency)) {
        pst_answer_error(
            ans, 400, "invalid_request_error", "invalid_currency", "currency",
            "Invalid currency: must be a three-letter ISO code in lower case.");
        return -1;
    }
    if (!req->payment_method || !*req->payment_method) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                         "payment_method", "Missing required param: payment_method.");
        return -1;
    }
    if (!pst_find_method(req->payment_method)) {
        pst_answer_error(ans, 400, "invalid_request_error", "resource_missing",
                         "payment_method", "No such PaymentMethod.");
        return -1;
    }
    if (!req->confirm || strcmp(req->confirm, "true") != 0) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                         "confirm", "This simulator only creates confirmed intents.");
        return -1;
    }
    if (req->capture_method && strcmp(req->capture_method, "automatic") != 0 &&
        strcmp(req->capture_method, "manual") != 0) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                         "capture_method",
                         "Invalid capture_method: must be one of automatic or manual.");
        return -1;
    }
    if (req->apm_allow_redirects && !req->apm_enabled) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                         "automatic_payment_methods[enabled]",
                         "Missing required param: automatic_payment_methods[enabled].");
        return -1;
    }
    if (req->apm_enabled && strcmp(req->apm_enabled, "true") != 0 &&
        strcmp(req->apm_enabled, "false") != 0) {
        pst_answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                         "automatic_payment_methods[enabled]",
                         "Invalid boolean: automatic_payment_methods[enabled].");
        return -1;
    }
    if (req->apm_allow_redirects && strcmp(req->apm_allow_redirects, "always") != 0 &&
        strcmp(req->apm_allow_redirects, "never") != 0) {
        pst_answer_error(
            ans, 400, "invalid_request_error", "parameter_invalid",
            "automatic_payment_methods[allow_redirects]",
            "Invalid automatic_payment_methods[allow_redirects]: must be one "
            "of always or never.");
        return -1;
    }
    if (req->customer && !customer_id_valid(req->customer)) {
        char msg[128];
        pst_no_such("customer", req->customer, msg, sizeof(msg));
        pst_answer_error(ans, 400, "invalid_request_error", "resource_missing",
                         "customer", msg);
        return -1;
    }
    return 0;
}

/* Caller holds the lock. Drops the key if its retention has run out. */
static json_t *lookup_key(psp_store_t *st, const char *key, int64_t now_ms)
{
    json_t *e = json_object_get(st->keys, key);
    if (!e)
        return NULL;
    if (json_integer_value(json_object_get(e, "done")) &&
        now_ms - json_integer_value(json_object_get(e, "created_ms")) >=
            st->retention_ms) {
        json_object_del(st->keys, key);
        st->counters[PSP_C_EXPIRED_KEYS]++;
        return NULL;
    }
    return e;
}

/* Caller holds the lock. What an earlier request with this key decides:
 * 409 while it runs, 400 idempotency_error when it went to another endpoint
 * (path) or had other parameters (fp), else its answer replayed. Returns 1
 * when *ans is filled in, 0 when the key is free. */
int pst_answer_from_key(psp_store_t *st, const char *key, const char *path,
                        const char *fp, int64_t now_ms, struct psp_answer *ans)
{
    json_t *e = key ? lookup_key(st, key, now_ms) : NULL;
    if (!e)
        return 0;
    if (!json_integer_value(json_object_get(e, "done"))) {
        st->counters[PSP_C_IN_USE_409]++;
        pst_answer_error(ans, 409, "invalid_request_error", "idempotency_key_in_use",
                         NULL,
                         "There is currently another in-progress request using this "
                         "Idempotent Key. Please try again later.");
        return 1;
    }
    if (strcmp(json_string_value(json_object_get(e, "path")), path) != 0) {
        st->counters[PSP_C_IDEMPOTENCY_ERROR_400]++;
        pst_answer_error(ans, 400, "idempotency_error", NULL, NULL,
                         "Keys for idempotent requests can only be used for the same "
                         "endpoint they were first used for.");
        return 1;
    }
    if (strcmp(json_string_value(json_object_get(e, "fp")), fp) != 0) {
        st->counters[PSP_C_IDEMPOTENCY_ERROR_400]++;
        pst_answer_error(ans, 400, "idempotency_error", NULL, NULL,
                         "Keys for idempotent requests can only be used with the same "
                         "parameters they were first used with.");
        return 1;
    }
    st->counters[PSP_C_REPLAYED]++;
    ans->status = (int)json_integer_value(json_object_get(e, "status"));
    ans->body = strdup(json_string_value(json_object_get(e, "body")));
    ans->replayed = 1;
    return 1;
}

/* Caller holds the lock. Reserves the key (NULL: none) for a request about
 * to execute. */
void pst_reserve_key(psp_store_t *st, const char *key, const char *path, const char *fp,
                     int64_t now_ms)
{
    if (key)
        json_object_set_new(st->keys, key,
                            json_pack("{s:s, s:s, s:i, s:I}", "fp", fp, "path", path,
                                      "done", 0, "created_ms", (json_int_t)now_ms));
}

/* Caller holds the lock. Stores an executed request's answer under its key. */
void pst_store_answer(psp_store_t *st, const char *key, const struct psp_answer *ans)
{
    json_t *e = key ? json_object_get(st->keys, key) : NULL;
    if (!e)
        return;
    json_object_set_new(e, "done", json_integer(1));
    json_object_set_new(e, "status", json_integer(ans->status));
    json_object_set_new(e, "body", json_string(ans->body));
}

/* n characters of v in base 62, most significant first; letters first,
 * so that a small number's padding is letters too. */
static void base62(char *out, unsigned long long v, int n)
{
    static const char digits[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    for (int i = n - 1; i >= 0; i--, v /= 62)
        out[i] = digits[v % 62];
}

/* Caller holds the lock. A new object id, unpredictable enough for a
 * simulator; an injected intent may have taken any name, so a taken one
 * (in `taken`, or `taken2` when not NULL) is skipped. Base 62, like the
 * provider's own: a hexadecimal id with a zero-padded counter held runs
 * of 13 and more decimal digits, some of which pass the Luhn check, and
 * charged masks those as card numbers wherever it shows provider text. */
void pst_fresh_id(psp_store_t *st, const char *prefix, json_t *taken, json_t *taken2,
                  int64_t now_ms, char *out, size_t outlen)
{
    char tail[11 + 6 + 1];
    do {
        base62(tail,
               (unsigned long long)now_ms * 1000003ULL ^ (st->next_id * 2654435761ULL),
               11);
        base62(tail + 11, st->next_id, 6);
        tail[17] = '\0';
        snprintf(out, outlen, "%s_%s", prefix, tail);
        st->next_id++;
    } while (json_object_get(taken, out) || (taken2 && json_object_get(taken2, out)));
}

static const char charge_path[] = "/v1/payment_intents";

enum psp_begin psp_store_begin(psp_store_t *st, const struct psp_charge_request *req,
                               int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    enum psp_begin rc = PSP_BEGIN_ANSWERED;

    pst_fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (pst_answer_from_key(st, req->idempotency_key, charge_path, fp, now_ms, ans))
        goto out;
    if (validate(req, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    pst_reserve_key(st, req->idempotency_key, charge_path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        pst_journal(st, "charge_begin", now_ms, pst_charge_record(req));
    pthread_mutex_unlock(&st->lock);
    return rc;
}

void psp_store_release(psp_store_t *st, const char *idempotency_key)
{
    if (!idempotency_key)
        return;
    pthread_mutex_lock(&st->lock);
    json_t *e = json_object_get(st->keys, idempotency_key);
    if (e && !json_integer_value(json_object_get(e, "done")))
        json_object_del(st->keys, idempotency_key);
    if (st->journal)
        pst_journal(st, "release", 0, json_pack("{s:s}", "key", idempotency_key));
    pthread_mutex_unlock(&st->lock);
}

/* Caller holds the lock and reserved a place in intent_index. Keeps the
 * intent (pi borrowed) with its ledger row (taken): the record shares the
 * row with the ledger, so settling the intent later updates the one row its
 * charge has, never adds one. seq orders intents by creation. */
json_t *pst_add_intent(psp_store_t *st, const char *id, json_t *pi, json_t *row,
                       int64_t created_ms)
{
    int64_t seq = (int64_t)st->next_id++;
    const char *status = json_string_value(json_object_get(pi, "status"));

    json_array_append(st->ledger, row);
    json_t *rec = json_pack("{s:O, s:o, s:I, s:I}", "pi", pi, "row", row, "created_ms",
                            (json_int_t)created_ms, "seq", (json_int_t)seq);
    json_object_set_new(st->intents, id, rec);
    pst_index_append(&st->intent_index,
                     json_integer_value(json_object_get(pi, "created")), seq, rec);
    if (status && !strcmp(status, "processing"))
        json_object_set(st->processing, id, rec);
    return rec;
}

void psp_store_execute(psp_store_t *st, const struct psp_charge_request *req,
                       int64_t now_ms, struct psp_answer *ans)
{
    const struct psp_method *m = pst_find_method(req->payment_method);
    char id[40];
    json_t *pi, *metadata, *body, *row, *apm = NULL;
    int status, manual = req->capture_method && !strcmp(req->capture_method, "manual");
    /* A manual intent's success is an authorization: nothing captured yet. */
    const char *to = m->status && manual && !strcmp(m->status, "succeeded")
                         ? "requires_capture"
                         : m->status;

    pthread_mutex_lock(&st->lock);
    if (pst_index_reserve(&st->intent_index, 1) != 0) {
        pst_answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        json_t *e = req->idempotency_key
                        ? json_object_get(st->keys, req->idempotency_key)
                        : NULL;
        if (e && !json_integer_value(json_object_get(e, "done")))
            json_object_del(st->keys, req->idempotency_key);
        goto out;
    }
    pst_fresh_id(st, "pi", st->intents, st->deleted, now_ms, id, sizeof(id));
    metadata = json_object();
    if (req->payment_attempt_id)
        json_object_set_new(metadata, "payment_attempt_id",
                            json_string(req->payment_attempt_id));
    if (req->order_id)
        json_object_set_new(metadata, "order_id", json_string(req->order_id));
    if (req->apm_enabled) {
        apm = json_pack("{s:b}", "enabled", !strcmp(req->apm_enabled, "true"));
        if (req->apm_allow_redirects)
            json_object_set_new(apm, "allow_redirects",
                                json_string(req->apm_allow_redirects));
    }
    /* As Stripe does, customer and automatic_payment_methods are null when
     * the request had none. */
    pi = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s?, s:o?, s:I, s:o, s:s}", "id", id,
                   "object", "payment_intent", "amount",
                   (json_int_t)strtoll(req->amount, NULL, 10), "currency",
                   req->currency, "payment_method", req->payment_method, "customer",
                   req->customer, "automatic_payment_methods", apm, "created",
                   (json_int_t)(now_ms / 1000), "metadata", metadata, "capture_method",
                   manual ? "manual" : "automatic");
    if (to) {
        json_object_set_new(pi, "status", json_string(to));
        json_object_set_new(pi, "last_payment_error", json_null());
        status = 200;
        body = json_incref(pi);
        st->counters[!strcmp(to, "succeeded")    ? PSP_C_SUCCEEDED
                     : !strcmp(to, "processing") ? PSP_C_PROCESSING
                                                 : PSP_C_REQUIRES_CAPTURE]++;
    } else {
        json_t *lpe = json_pack("{s:s, s:s, s:s, s:s}", "type", "card_error", "code",
                                "card_declined", "decline_code", m->decline_code,
                                "message", m->message);
        json_object_set_new(pi, "status", json_string("requires_payment_method"));
        json_object_set_new(pi, "last_payment_error", json_deep_copy(lpe));
        json_object_set_new(lpe, "payment_intent", json_incref(pi));
        status = 402;
        body = json_pack("{s:o}", "error", lpe);
        st->counters[PSP_C_DECLINED]++;
    }
    st->counters[PSP_C_EXECUTED]++;
    row = json_pack(
        "{s:s?, s:s, s:s?, s:s?, s:s?, s:I, s:s, s:s, s:i, s:I, s:n, s:b, s:b, s:b}",
        "idempotency_key", req->idempotency_key, "payment_intent_id", id,
        "payment_attempt_id", req->payment_attempt_id, "order_id", req->order_id,
        "customer", req->customer, "amount", (json_int_t)strtoll(req->amount, NULL, 10),
        "currency", req->currency, "outcome", to ? to : "declined", "http_status",
        status, "at_ms", (json_int_t)now_ms, "settled_at_ms", "injected", 0, "amended",
        0, "deleted", 0);
    pst_money_fields(pi, row);
    json_t *rec = pst_add_intent(st, id, pi, row, now_ms);
    if (to && !strcmp(to, "requires_capture"))
        pst_authorize(st, rec, now_ms);
    pst_observe(st, pi, now_ms);
    pst_answer_json(ans, status, body);
    pst_store_answer(st, req->idempotency_key, ans);
    json_decref(pi);
out:
    if (st->journal)
        pst_journal(st, "charge_execute", now_ms, pst_charge_record(req));
    pthread_mutex_unlock(&st->lock);
}

static const char *member(json_t *o, const char *name)
{
    const char *s = json_string_value(json_object_get(o, name));
    return s ? s : "";
}

/* Caller holds the lock. Settles a processing intent as `set` says, at
 * at_ms: the intent's status and error, its ledger row, the counters. */
static void apply_settlement(psp_store_t *st, json_t *rec,
                             const struct psp_settlement *set, int64_t at_ms)
{
    json_t *pi = json_object_get(rec, "pi"), *row = json_object_get(rec, "row");
    const char *outcome = set->status;
    enum psp_counter c = PSP_C_SUCCEEDED;

    json_object_set_new(pi, "status", json_string(set->status));
    if (!strcmp(set->status, "requires_payment_method")) {
        const char *code = set->decline_code ? set->decline_code : "generic_decline";
        const char *message = "Your card was declined.";
        for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++)
            if (methods[i].decline_code && !strcmp(methods[i].decline_code, code))
                message = methods[i].message;
        /* As a failed asynchronous payment leaves it at Stripe. */
        json_object_set_new(pi, "last_payment_error",
                            json_pack("{s:s, s:s, s:s, s:s}", "type", "card_error",
                                      "code", "card_declined", "decline_code", code,
                                      "message", message));
        outcome = "declined";
        c = PSP_C_DECLINED;
    } else if (!strcmp(set->status, "canceled")) {
        json_object_set_new(pi, "canceled_at", json_integer(at_ms / 1000));
        c = PSP_C_CANCELED;
    } else if (!strcmp(member(pi, "capture_method"), "manual")) {
        /* A manual intent's payment succeeded: it is authorized. */
        json_object_set_new(pi, "status", json_string("requires_capture"));
        outcome = "requires_capture";
        c = PSP_C_REQUIRES_CAPTURE;
        pst_authorize(st, rec, at_ms);
    }
    pst_money_fields(pi, row);
    json_object_set_new(row, "outcome", json_string(outcome));
    json_object_set_new(row, "settled_at_ms", json_integer(at_ms));
    json_object_del(st->processing, json_string_value(json_object_get(pi, "id")));
    pst_observe(st, pi, at_ms);
    /* Counters count each charge once, by what it is now. */
    st->counters[PSP_C_PROCESSING]--;
    st->counters[c]++;
    st->counters[PSP_C_SETTLED]++;
}

static int is_processing(json_t *rec)
{
    const char *s =
        json_string_value(json_object_get(json_object_get(rec, "pi"), "status"));
    return s && !strcmp(s, "processing");
}

/* Caller holds the lock. With --processing-settle-ms, a processing intent
 * has succeeded once that long has passed since its creation; it is
 * settled here, when first looked at, as of the moment it was due. */
void pst_settle_if_due(psp_store_t *st, json_t *rec, int64_t now_ms)
{
    static const struct psp_settlement succeeded = {"succeeded", NULL};
    int64_t created = json_integer_value(json_object_get(rec, "created_ms"));
    if (st->processing_settle_ms > 0 && is_processing(rec) &&
        now_ms - created >= st->processing_settle_ms) {
        apply_settlement(st, rec, &succeeded, created + st->processing_settle_ms);
        /* A read changed the books: kept, since the setting may change. */
        if (st->journal)
            pst_journal(st, "settle_due", now_ms,
                        json_pack("{s:O}", "id",
                                  json_object_get(json_object_get(rec, "pi"), "id")));
    }
    pst_expire_if_due(st, rec, now_ms);
}

void pst_answer_no_such_intent(struct psp_answer *ans, const char *id)
{
    char msg[128];
    pst_no_such("payment_intent", id, msg, sizeof(msg));
    pst_answer_error(ans, 404, "invalid_request_error", "resource_missing", "intent",
                     msg);
}

int64_t psp_store_settle_due(psp_store_t *st, int64_t now_ms)
{
    const char *id;
    json_t *rec, *tmp;
    int64_t next = -1;

    pthread_mutex_lock(&st->lock);
    json_object_foreach_safe(st->processing, tmp, id, rec)
    {
        pst_settle_if_due(st, rec, now_ms); /* may delete it from processing */
        if (st->processing_settle_ms > 0 && is_processing(rec)) {
            int64_t left = json_integer_value(json_object_get(rec, "created_ms")) +
                           st->processing_settle_ms - now_ms;
            if (next < 0 || left < next)
                next = left;
        }
    }
    json_object_foreach_safe(st->authorized, tmp, id, rec)
    {
        pst_expire_if_due(st, rec, now_ms); /* may delete it from authorized */
        int64_t left = pst_expiry_left(st, rec, now_ms);
        if (left >= 0 && (next < 0 || left < next))
            next = left;
    }
    json_object_foreach_safe(st->refunds_pending, tmp, id, rec)
    {
        pst_settle_refund_if_due(st, rec, now_ms); /* may delete it from pending */
        if (st->refund_settle_ms > 0 && json_object_get(st->refunds_pending, id)) {
            int64_t left = json_integer_value(json_object_get(rec, "created_ms")) +
                           st->refund_settle_ms - now_ms;
            if (next < 0 || left < next)
                next = left;
        }
    }
    pthread_mutex_unlock(&st->lock);
    return next;
}

void psp_store_retrieve(psp_store_t *st, const char *id, int64_t now_ms,
                        struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->intents, id);
    if (rec) {
        pst_settle_if_due(st, rec, now_ms);
        pst_answer_json(ans, 200, json_incref(json_object_get(rec, "pi")));
    } else {
        pst_answer_no_such_intent(ans, id);
    }
    pthread_mutex_unlock(&st->lock);
}

void psp_store_search(psp_store_t *st, const char *payment_attempt_id, int64_t now_ms,
                      struct psp_answer *ans)
{
    const char *id;
    json_t *rec, *data = json_array();

    pthread_mutex_lock(&st->lock);
    json_object_foreach(st->intents, id, rec)
    {
        json_t *pi = json_object_get(rec, "pi");
        const char *a = json_string_value(
            json_object_get(json_object_get(pi, "metadata"), "payment_attempt_id"));
        if (!a || strcmp(a, payment_attempt_id) != 0)
            continue;
        /* Indexed late, as Stripe's search is: not there until the lag has
         * passed, then with its current status. */
        if (now_ms - json_integer_value(json_object_get(rec, "created_ms")) <
            st->search_lag_ms)
            continue;
        pst_settle_if_due(st, rec, now_ms);
        /* A copy: the answer is serialised after we let go of the lock. */
        json_array_append_new(data, json_deep_copy(pi));
    }
    pthread_mutex_unlock(&st->lock);
    pst_answer_json(ans, 200,
                    json_pack("{s:s, s:o, s:b}", "object", "search_result", "data",
                              data, "has_more", 0));
}

int psp_settlement_parse(json_t *body, struct psp_settlement *out, char *errbuf,
                         size_t errbuf_size)
{
    const char *k;
    json_t *v, *status = json_object_get(body, "status");
    json_t *code = json_object_get(body, "decline_code");

    if (!json_is_object(body)) {
        snprintf(errbuf, errbuf_size, "body must be a JSON object");
        return -1;
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "status") != 0 && strcmp(k, "decline_code") != 0) {
            snprintf(errbuf, errbuf_size, "unknown member '%.64s'", k);
            return -1;
        }
    }
    out->status = json_string_value(status);
    if (!out->status || (strcmp(out->status, "succeeded") != 0 &&
                         strcmp(out->status, "requires_payment_method") != 0 &&
                         strcmp(out->status, "canceled") != 0)) {
        snprintf(errbuf, errbuf_size,
                 "status must be succeeded, requires_payment_method or canceled");
        return -1;
    }
    out->decline_code = NULL;
    if (code && !json_is_null(code)) {
        const char *s = json_string_value(code);
        size_t n = s ? strlen(s) : 0;
        if (strcmp(out->status, "requires_payment_method") != 0) {
            snprintf(errbuf, errbuf_size,
                     "decline_code goes only with status requires_payment_method");
            return -1;
        }
        /* It goes into every answer about the intent: Stripe's shape only. */
        if (n < 1 || n > 64 ||
            strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789_") != n) {
            snprintf(errbuf, errbuf_size,
                     "decline_code must be 1..64 of a-z, 0-9 and _");
            return -1;
        }
        out->decline_code = s;
    }
    return 0;
}

void psp_store_settle(psp_store_t *st, const char *id, const struct psp_settlement *set,
                      int64_t now_ms, struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->intents, id);
    if (!rec) {
        pst_answer_no_such_intent(ans, id);
    } else {
        /* One that has settled by itself by now is no longer processing. */
        pst_settle_if_due(st, rec, now_ms);
        json_t *pi = json_object_get(rec, "pi");
        if (is_processing(rec)) {
            apply_settlement(st, rec, set, now_ms);
            pst_answer_json(ans, 200, json_incref(pi));
        } else {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "This PaymentIntent's status is %s; only a processing one can be "
                     "settled.",
                     json_string_value(json_object_get(pi, "status")));
            pst_answer_error(ans, 409, "invalid_request_error",
                             "payment_intent_unexpected_state", NULL, msg);
        }
    }
    if (st->journal)
        pst_journal(st, "settle", now_ms,
                    json_pack("{s:s, s:s, s:s?}", "id", id, "status", set->status,
                              "decline_code", set->decline_code));
    pthread_mutex_unlock(&st->lock);
}

json_t *psp_store_ledger_json(psp_store_t *st, int64_t now_ms)
{
    const char *id;
    json_t *rec, *counters = json_object();
    pthread_mutex_lock(&st->lock);
    json_object_foreach(st->intents, id, rec) pst_settle_if_due(st, rec, now_ms);
    for (int i = 0; i < PSP_C__COUNT; i++)
        json_object_set_new(counters, counter_names[i], json_integer(st->counters[i]));
    json_object_set_new(counters, "charges_in_flight",
                        json_integer(st->charges_in_flight));
    json_object_set_new(counters, "max_charges_in_flight",
                        json_integer(st->max_charges_in_flight));
    /* A copy: the caller serialises it after we let go of the lock. */
    json_object_foreach(st->refunds, id, rec) pst_settle_refund_if_due(st, rec, now_ms);
    /* What the provider holds now, as an auditor paging its lists sees it. */
    json_object_set_new(counters, "intents",
                        json_integer((json_int_t)json_object_size(st->intents)));
    json_object_set_new(counters, "refund_objects",
                        json_integer((json_int_t)json_object_size(st->refunds)));
    json_t *out = json_pack(
        "{s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "charges", json_deep_copy(st->ledger),
        "cancels", json_deep_copy(st->cancels), "captures",
        json_deep_copy(st->captures), "expiries", json_deep_copy(st->expiries),
        "refunds", json_deep_copy(st->refund_rows), "refund_executions",
        json_deep_copy(st->refund_executions), "counters", counters);
    pthread_mutex_unlock(&st->lock);
    return out;
}

void psp_store_reset(psp_store_t *st)
{
    pthread_mutex_lock(&st->lock);
    json_object_clear(st->keys);
    json_object_clear(st->intents);
    json_array_clear(st->ledger);
    json_array_clear(st->cancels);
    json_object_clear(st->processing);
    json_object_clear(st->refunds);
    json_array_clear(st->refund_rows);
    json_object_clear(st->refunds_pending);
    json_object_clear(st->refund_executions);
    json_object_clear(st->deleted);
    json_object_clear(st->authorized);
    json_array_clear(st->captures);
    json_array_clear(st->expiries);
    st->intent_index.n = st->refund_index.n = 0;
    memset(st->counters, 0, sizeof(st->counters));
    st->max_charges_in_flight = st->charges_in_flight;
    if (st->journal)
        pst_journal(st, "reset", 0, json_object());
    pthread_mutex_unlock(&st->lock);
}
