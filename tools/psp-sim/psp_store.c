#include "psp_store.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* An object a list can show, in creation order (seq grows): the lists scan
 * these plain values instead of the JSON records. */
struct list_entry {
    int64_t created; /* unix seconds, as the object's created */
    int64_t seq;
    json_t *rec; /* borrowed from intents, deleted or refunds */
    int live;    /* 0 once the intent is deleted */
};

struct list_index {
    struct list_entry *v;
    size_t n, cap;
};

struct psp_store {
    pthread_mutex_t lock;
    int64_t retention_ms;
    int64_t search_lag_ms;        /* search sees an intent this long after creation */
    int64_t processing_settle_ms; /* > 0: processing succeeds this long after */
    json_t *keys;    /* idempotency key -> {fp, done, status, body, created_ms} */
    json_t *intents; /* pi id -> {pi: PaymentIntent, row: its ledger row, created_ms} */
    json_t *ledger;  /* array of executed charges */
    json_t *cancels; /* array of executed cancels */
    json_t *processing;        /* pi id -> its record in intents, while processing */
    json_t *refunds;           /* re id -> {refund, row, seq, created_ms, settle_to} */
    json_t *refund_rows;       /* array of executed refunds (the rows) */
    json_t *refunds_pending;   /* re id -> its record, while pending */
    json_t *refund_executions; /* refund key -> refunds it executed */
    json_t *deleted;           /* pi id -> record of a deleted intent: a list cursor
                                  naming it still has its place */
    struct list_index intent_index, refund_index;
    int64_t refund_settle_ms; /* > 0: pending refunds settle this long after */
    psp_store_observer_fn observer;
    void *observer_ctx;
    psp_store_event_fn event_observer;
    void *event_observer_ctx;
    psp_store_journal_fn journal; /* NULL: nothing is kept (or replaying) */
    void *journal_ctx;
    uint64_t next_id;
    long long counters[PSP_C__COUNT];
    long long charges_in_flight, max_charges_in_flight;
};

static const char *counter_names[PSP_C__COUNT] = {
    "requests",        "executed",        "succeeded",         "declined",
    "processing",      "replayed",        "in_use_409",        "idempotency_error",
    "invalid_request", "expired_keys",    "canceled",          "settled",
    "cancels",         "refunds",         "refunds_succeeded", "refunds_pending",
    "refunds_failed",  "refunds_settled",
};

/* Test payment methods, as the contract names them, plus one that stays
 * processing until settled (psp_store_settle, or by itself after
 * processing_settle_ms). */
struct psp_method {
    const char *name;
    const char *status; /* succeeded, processing, or NULL when declined */
    const char *decline_code;
    const char *message;
    const char *refund; /* how its refunds go: NULL succeeded, "pending" (then
                           succeeded), "pending_fail" (then failed), "failed" */
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
    st->next_id = 1;
    if (!st->keys || !st->intents || !st->ledger || !st->cancels || !st->processing ||
        !st->refunds || !st->refund_rows || !st->refunds_pending ||
        !st->refund_executions || !st->deleted) {
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
static void journal(psp_store_t *st, const char *op, int64_t now_ms, json_t *record)
{
    if (record) {
        json_object_set_new(record, "op", json_string(op));
        json_object_set_new(record, "now", json_integer(now_ms));
    }
    st->journal(st->journal_ctx, record);
}

/* The requests as records (NULL when a string is no UTF-8), and back: the
 * strings of a request read from a record point into it. */
static json_t *charge_record(const struct psp_charge_request *req)
{
    return json_pack(
        "{s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?, s:s?}",
        "idempotency_key", req->idempotency_key, "amount", req->amount, "currency",
        req->currency, "payment_method", req->payment_method, "confirm", req->confirm,
        "payment_attempt_id", req->payment_attempt_id, "order_id", req->order_id,
        "customer", req->customer, "apm_enabled", req->apm_enabled,
        "apm_allow_redirects", req->apm_allow_redirects, "body", req->body);
}

static json_t *cancel_record(const struct psp_cancel_request *req)
{
    return json_pack("{s:s?, s:s?, s:s?, s:s?, s:s?}", "idempotency_key",
                     req->idempotency_key, "payment_intent_id", req->payment_intent_id,
                     "cancellation_reason", req->cancellation_reason,
                     "unknown_parameter", req->unknown_parameter, "body", req->body);
}

static json_t *refund_record(const struct psp_refund_request *req)
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
static json_t *body_record(json_t *body)
{
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    json_t *record = json_pack("{s:s?}", "body_json", text);
    free(text);
    return record;
}

static json_t *id_and_body_record(const char *id, json_t *body)
{
    json_t *record = body_record(body);
    if (record)
        json_object_set_new(record, "id", json_string(id));
    return record;
}

static const char *member_str(json_t *record, const char *name)
{
    return json_string_value(json_object_get(record, name));
}

void psp_store_set_retention(psp_store_t *st, int64_t retention_ms)
{
    pthread_mutex_lock(&st->lock);
    st->retention_ms = retention_ms;
    if (st->journal)
        journal(st, "set", 0,
                json_pack("{s:s, s:I}", "name", "retention_ms", "ms",
                          (json_int_t)retention_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_search_lag(psp_store_t *st, int64_t search_lag_ms)
{
    pthread_mutex_lock(&st->lock);
    st->search_lag_ms = search_lag_ms;
    if (st->journal)
        journal(st, "set", 0,
                json_pack("{s:s, s:I}", "name", "search_lag_ms", "ms",
                          (json_int_t)search_lag_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_processing_settle(psp_store_t *st, int64_t settle_ms)
{
    pthread_mutex_lock(&st->lock);
    st->processing_settle_ms = settle_ms;
    if (st->journal)
        journal(st, "set", 0,
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
static void observe(psp_store_t *st, json_t *pi, int64_t at_ms)
{
    if (st->observer)
        st->observer(st->observer_ctx, pi, at_ms);
}

void psp_store_count(psp_store_t *st, enum psp_counter c)
{
    pthread_mutex_lock(&st->lock);
    st->counters[c]++;
    if (st->journal)
        journal(st, "count", 0, json_pack("{s:i}", "counter", (int)c));
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
static void fingerprint(const char *body, char out[17])
{
    uint64_t h = 1469598103934665603ULL;
    for (const unsigned char *p = (const unsigned char *)body; p && *p; p++) {
        h ^= *p;
        h *= 1099511628211ULL;
    }
    snprintf(out, 17, "%016llx", (unsigned long long)h);
}

static void answer_json(struct psp_answer *ans, int status, json_t *body)
{
    ans->status = status;
    ans->body = json_dumps(body, JSON_COMPACT | JSON_PRESERVE_ORDER);
    ans->replayed = 0;
    json_decref(body);
}

static void answer_error(struct psp_answer *ans, int status, const char *type,
                         const char *code, const char *param, const char *message)
{
    json_t *err = json_pack("{s:s}", "type", type);
    if (code)
        json_object_set_new(err, "code", json_string(code));
    json_object_set_new(err, "message", json_string(message));
    if (param)
        json_object_set_new(err, "param", json_string(param));
    answer_json(ans, status, json_pack("{s:o}", "error", err));
}

static const struct psp_method *find_method(const char *name)
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
static void printable(const char *value, char out[72])
{
    size_t i;
    for (i = 0; value[i] && i < 64; i++) {
        unsigned char c = (unsigned char)value[i];
        out[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    snprintf(out + i, 72 - i, "%s", value[i] ? "..." : "");
}

/* "No such <what>: '<value>'", the value as printable() shows it. */
static void no_such(const char *what, const char *value, char *out, size_t outlen)
{
    char shown[72];
    printable(value, shown);
    snprintf(out, outlen, "No such %s: '%s'", what, shown);
}

static int currency_valid(const char *c)
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
        answer_error(ans, 400, "invalid_request_error", "parameter_missing", "amount",
                     "Missing required param: amount.");
        return -1;
    }
    errno = 0;
    amount = strtoll(req->amount, &end, 10);
    if (errno || *end || end == req->amount || amount < 1 ||
        amount > 99999999999999LL) {
        answer_error(ans, 400, "invalid_request_error", "parameter_invalid_integer",
                     "amount", "Invalid positive integer: amount.");
        return -1;
    }
    if (!currency_valid(req->currency)) {
        answer_error(
            ans, 400, "invalid_request_error", "invalid_currency", "currency",
            "Invalid currency: must be a three-letter ISO code in lower case.");
        return -1;
    }
    if (!req->payment_method || !*req->payment_method) {
        answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                     "payment_method", "Missing required param: payment_method.");
        return -1;
    }
    if (!find_method(req->payment_method)) {
        answer_error(ans, 400, "invalid_request_error", "resource_missing",
                     "payment_method", "No such PaymentMethod.");
        return -1;
    }
    if (!req->confirm || strcmp(req->confirm, "true") != 0) {
        answer_error(ans, 400, "invalid_request_error", "parameter_invalid", "confirm",
                     "This simulator only creates confirmed intents.");
        return -1;
    }
    if (req->apm_allow_redirects && !req->apm_enabled) {
        answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                     "automatic_payment_methods[enabled]",
                     "Missing required param: automatic_payment_methods[enabled].");
        return -1;
    }
    if (req->apm_enabled && strcmp(req->apm_enabled, "true") != 0 &&
        strcmp(req->apm_enabled, "false") != 0) {
        answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                     "automatic_payment_methods[enabled]",
                     "Invalid boolean: automatic_payment_methods[enabled].");
        return -1;
    }
    if (req->apm_allow_redirects && strcmp(req->apm_allow_redirects, "always") != 0 &&
        strcmp(req->apm_allow_redirects, "never") != 0) {
        answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                     "automatic_payment_methods[allow_redirects]",
                     "Invalid automatic_payment_methods[allow_redirects]: must be one "
                     "of always or never.");
        return -1;
    }
    if (req->customer && !customer_id_valid(req->customer)) {
        char msg[128];
        no_such("customer", req->customer, msg, sizeof(msg));
        answer_error(ans, 400, "invalid_request_error", "resource_missing", "customer",
                     msg);
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
static int answer_from_key(psp_store_t *st, const char *key, const char *path,
                           const char *fp, int64_t now_ms, struct psp_answer *ans)
{
    json_t *e = key ? lookup_key(st, key, now_ms) : NULL;
    if (!e)
        return 0;
    if (!json_integer_value(json_object_get(e, "done"))) {
        st->counters[PSP_C_IN_USE_409]++;
        answer_error(ans, 409, "invalid_request_error", "idempotency_key_in_use", NULL,
                     "There is currently another in-progress request using this "
                     "Idempotent Key. Please try again later.");
        return 1;
    }
    if (strcmp(json_string_value(json_object_get(e, "path")), path) != 0) {
        st->counters[PSP_C_IDEMPOTENCY_ERROR_400]++;
        answer_error(ans, 400, "idempotency_error", NULL, NULL,
                     "Keys for idempotent requests can only be used for the same "
                     "endpoint they were first used for.");
        return 1;
    }
    if (strcmp(json_string_value(json_object_get(e, "fp")), fp) != 0) {
        st->counters[PSP_C_IDEMPOTENCY_ERROR_400]++;
        answer_error(ans, 400, "idempotency_error", NULL, NULL,
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
static void reserve_key(psp_store_t *st, const char *key, const char *path,
                        const char *fp, int64_t now_ms)
{
    if (key)
        json_object_set_new(st->keys, key,
                            json_pack("{s:s, s:s, s:i, s:I}", "fp", fp, "path", path,
                                      "done", 0, "created_ms", (json_int_t)now_ms));
}

/* Caller holds the lock. Stores an executed request's answer under its key. */
static void store_answer(psp_store_t *st, const char *key, const struct psp_answer *ans)
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
static void fresh_id(psp_store_t *st, const char *prefix, json_t *taken, json_t *taken2,
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

/* Caller holds the lock. Room for `more` entries: 0, or -1 out of memory. */
static int index_reserve(struct list_index *ix, size_t more)
{
    size_t cap = ix->cap ? ix->cap : 1024;
    if (ix->cap - ix->n >= more)
        return 0;
    while (cap - ix->n < more)
        cap *= 2;
    struct list_entry *v = realloc(ix->v, cap * sizeof(*v));
    if (!v)
        return -1;
    ix->v = v;
    ix->cap = cap;
    return 0;
}

/* Caller holds the lock and has reserved the room. */
static void index_append(struct list_index *ix, int64_t created, int64_t seq,
                         json_t *rec)
{
    ix->v[ix->n++] = (struct list_entry){created, seq, rec, 1};
}

/* Caller holds the lock. Entries are appended as seq grows: sorted by it. */
static struct list_entry *index_find(struct list_index *ix, int64_t seq)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ix->v[mid].seq < seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < ix->n && ix->v[lo].seq == seq ? &ix->v[lo] : NULL;
}

/* The lists' order, newest first: by created, then by creation (seq), so
 * an intent injected with an earlier created sits where Stripe's would. */
static int newer(const struct list_entry *a, const struct list_entry *b)
{
    return a->created != b->created ? a->created > b->created : a->seq > b->seq;
}

static int newest_first(const void *a, const void *b)
{
    const struct list_entry *x = *(const struct list_entry *const *)a;
    const struct list_entry *y = *(const struct list_entry *const *)b;
    return newer(x, y) ? -1 : newer(y, x) ? 1 : 0;
}

static void heap_swap_entries(const struct list_entry **h, size_t a, size_t b)
{
    const struct list_entry *t = h[a];
    h[a] = h[b];
    h[b] = t;
}

/* A heap whose root is the oldest entry kept. */
static void heap_up(const struct list_entry **h, size_t i)
{
    while (i > 0 && newer(h[(i - 1) / 2], h[i])) {
        heap_swap_entries(h, i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
}

static void heap_down(const struct list_entry **h, size_t n, size_t i)
{
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < n && newer(h[m], h[l]))
            m = l;
        if (r < n && newer(h[m], h[r]))
            m = r;
        if (m == i)
            return;
        heap_swap_entries(h, i, m);
        i = m;
    }
}

/* What a list page may show: objects created in [created_gte, created_lt),
 * after the cursor in the list's order (after_seq < 0: no cursor), that
 * keep() accepts (NULL: all). */
struct list_scan {
    int64_t created_gte, created_lt;
    int64_t after_created, after_seq;
    int (*keep)(json_t *rec, const char *want);
    const char *want;
};

/* Caller holds the lock. The k newest live entries the scan accepts, newest
 * first, into page (room for k); returns how many. One pass keeping only
 * the k newest seen, so a page costs O(n), not a sort of all the matches.
 * From the last created back: once the heap is full, the older ones are
 * turned away at the first comparison. */
static size_t select_page(const struct list_index *ix, const struct list_scan *s,
                          const struct list_entry **page, size_t k)
{
    const struct list_entry cursor = {s->after_created, s->after_seq, NULL, 0};
    size_t n = 0;

    for (size_t i = ix->n; i-- > 0;) {
        const struct list_entry *e = &ix->v[i];
        if (!e->live || e->created < s->created_gte || e->created >= s->created_lt ||
            (s->after_seq >= 0 && !newer(&cursor, e)) ||
            (n == k && !newer(e, page[0])) || (s->keep && !s->keep(e->rec, s->want)))
            continue;
        if (n < k) {
            page[n] = e;
            heap_up(page, n++);
        } else {
            page[0] = e;
            heap_down(page, n, 0);
        }
    }
    qsort(page, n, sizeof(*page), newest_first);
    return n;
}

static const char charge_path[] = "/v1/payment_intents";

enum psp_begin psp_store_begin(psp_store_t *st, const struct psp_charge_request *req,
                               int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    enum psp_begin rc = PSP_BEGIN_ANSWERED;

    fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (answer_from_key(st, req->idempotency_key, charge_path, fp, now_ms, ans))
        goto out;
    if (validate(req, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    reserve_key(st, req->idempotency_key, charge_path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        journal(st, "charge_begin", now_ms, charge_record(req));
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
        journal(st, "release", 0, json_pack("{s:s}", "key", idempotency_key));
    pthread_mutex_unlock(&st->lock);
}

/* Caller holds the lock and reserved a place in intent_index. Keeps the
 * intent (pi borrowed) with its ledger row (taken): the record shares the
 * row with the ledger, so settling the intent later updates the one row its
 * charge has, never adds one. seq orders intents by creation. */
static json_t *add_intent(psp_store_t *st, const char *id, json_t *pi, json_t *row,
                          int64_t created_ms)
{
    int64_t seq = (int64_t)st->next_id++;
    const char *status = json_string_value(json_object_get(pi, "status"));

    json_array_append(st->ledger, row);
    json_t *rec = json_pack("{s:O, s:o, s:I, s:I}", "pi", pi, "row", row, "created_ms",
                            (json_int_t)created_ms, "seq", (json_int_t)seq);
    json_object_set_new(st->intents, id, rec);
    index_append(&st->intent_index, json_integer_value(json_object_get(pi, "created")),
                 seq, rec);
    if (status && !strcmp(status, "processing"))
        json_object_set(st->processing, id, rec);
    return rec;
}

void psp_store_execute(psp_store_t *st, const struct psp_charge_request *req,
                       int64_t now_ms, struct psp_answer *ans)
{
    const struct psp_method *m = find_method(req->payment_method);
    char id[40];
    json_t *pi, *metadata, *body, *row, *apm = NULL;
    int status;

    pthread_mutex_lock(&st->lock);
    if (index_reserve(&st->intent_index, 1) != 0) {
        answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        json_t *e = req->idempotency_key
                        ? json_object_get(st->keys, req->idempotency_key)
                        : NULL;
        if (e && !json_integer_value(json_object_get(e, "done")))
            json_object_del(st->keys, req->idempotency_key);
        goto out;
    }
    fresh_id(st, "pi", st->intents, st->deleted, now_ms, id, sizeof(id));
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
    pi = json_pack("{s:s, s:s, s:I, s:s, s:s, s:s?, s:o?, s:I, s:o}", "id", id,
                   "object", "payment_intent", "amount",
                   (json_int_t)strtoll(req->amount, NULL, 10), "currency",
                   req->currency, "payment_method", req->payment_method, "customer",
                   req->customer, "automatic_payment_methods", apm, "created",
                   (json_int_t)(now_ms / 1000), "metadata", metadata);
    if (m->status) {
        json_object_set_new(pi, "status", json_string(m->status));
        json_object_set_new(pi, "last_payment_error", json_null());
        status = 200;
        body = json_incref(pi);
        st->counters[!strcmp(m->status, "succeeded") ? PSP_C_SUCCEEDED
                                                     : PSP_C_PROCESSING]++;
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
        "currency", req->currency, "outcome", m->status ? m->status : "declined",
        "http_status", status, "at_ms", (json_int_t)now_ms, "settled_at_ms", "injected",
        0, "amended", 0, "deleted", 0);
    add_intent(st, id, pi, row, now_ms);
    observe(st, pi, now_ms);
    answer_json(ans, status, body);
    store_answer(st, req->idempotency_key, ans);
    json_decref(pi);
out:
    if (st->journal)
        journal(st, "charge_execute", now_ms, charge_record(req));
    pthread_mutex_unlock(&st->lock);
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
    }
    json_object_set_new(row, "outcome", json_string(outcome));
    json_object_set_new(row, "settled_at_ms", json_integer(at_ms));
    json_object_del(st->processing, json_string_value(json_object_get(pi, "id")));
    observe(st, pi, at_ms);
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
static void settle_if_due(psp_store_t *st, json_t *rec, int64_t now_ms)
{
    static const struct psp_settlement succeeded = {"succeeded", NULL};
    int64_t created = json_integer_value(json_object_get(rec, "created_ms"));
    if (st->processing_settle_ms > 0 && is_processing(rec) &&
        now_ms - created >= st->processing_settle_ms) {
        apply_settlement(st, rec, &succeeded, created + st->processing_settle_ms);
        /* A read changed the books: kept, since the setting may change. */
        if (st->journal)
            journal(st, "settle_due", now_ms,
                    json_pack("{s:O}", "id",
                              json_object_get(json_object_get(rec, "pi"), "id")));
    }
}

static void answer_no_such_intent(struct psp_answer *ans, const char *id)
{
    char msg[128];
    no_such("payment_intent", id, msg, sizeof(msg));
    answer_error(ans, 404, "invalid_request_error", "resource_missing", "intent", msg);
}

static void settle_refund_if_due(psp_store_t *st, json_t *rec, int64_t now_ms);

int64_t psp_store_settle_due(psp_store_t *st, int64_t now_ms)
{
    const char *id;
    json_t *rec, *tmp;
    int64_t next = -1;

    pthread_mutex_lock(&st->lock);
    json_object_foreach_safe(st->processing, tmp, id, rec)
    {
        settle_if_due(st, rec, now_ms); /* may delete it from processing */
        if (st->processing_settle_ms > 0 && is_processing(rec)) {
            int64_t left = json_integer_value(json_object_get(rec, "created_ms")) +
                           st->processing_settle_ms - now_ms;
            if (next < 0 || left < next)
                next = left;
        }
    }
    json_object_foreach_safe(st->refunds_pending, tmp, id, rec)
    {
        settle_refund_if_due(st, rec, now_ms); /* may delete it from pending */
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
        settle_if_due(st, rec, now_ms);
        answer_json(ans, 200, json_incref(json_object_get(rec, "pi")));
    } else {
        answer_no_such_intent(ans, id);
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
        settle_if_due(st, rec, now_ms);
        /* A copy: the answer is serialised after we let go of the lock. */
        json_array_append_new(data, json_deep_copy(pi));
    }
    pthread_mutex_unlock(&st->lock);
    answer_json(ans, 200,
                json_pack("{s:s, s:o, s:b}", "object", "search_result", "data", data,
                          "has_more", 0));
}

static json_int_t rec_seq(json_t *rec)
{
    return json_integer_value(json_object_get(rec, "seq"));
}

static int intent_of_customer(json_t *rec, const char *customer)
{
    const char *c =
        json_string_value(json_object_get(json_object_get(rec, "pi"), "customer"));
    return c && !strcmp(c, customer);
}

/* Pages hold 1..100 objects: one more tells whether another page follows. */
#define LIST_MAX 100

void psp_store_list(psp_store_t *st, const struct psp_list_query *q, int64_t now_ms,
                    struct psp_answer *ans)
{
    const struct list_entry *page[LIST_MAX + 1];
    int limit = q->limit < 1 ? 1 : q->limit > LIST_MAX ? LIST_MAX : q->limit;
    struct list_scan scan = {
        q->created_gte, q->created_lt, 0, -1, q->customer ? intent_of_customer : NULL,
        q->customer};
    json_t *data = json_array();

    pthread_mutex_lock(&st->lock);
    if (q->starting_after) {
        /* A deleted intent keeps its place: a client may hold it as its
         * cursor across pages. */
        json_t *cursor = json_object_get(st->intents, q->starting_after);
        if (!cursor)
            cursor = json_object_get(st->deleted, q->starting_after);
        if (!cursor) {
            char msg[128];
            no_such("payment_intent", q->starting_after, msg, sizeof(msg));
            answer_error(ans, 400, "invalid_request_error", "resource_missing",
                         "starting_after", msg);
            goto out;
        }
        scan.after_created = json_integer_value(
            json_object_get(json_object_get(cursor, "pi"), "created"));
        scan.after_seq = rec_seq(cursor);
    }
    /* Every intent, at once: unlike search, the list does not lag. */
    size_t n = select_page(&st->intent_index, &scan, page, (size_t)limit + 1);
    for (size_t i = 0; i < n && i < (size_t)limit; i++) {
        settle_if_due(st, page[i]->rec, now_ms);
        /* A copy: the answer is serialised after we let go of the lock. */
        json_array_append_new(data,
                              json_deep_copy(json_object_get(page[i]->rec, "pi")));
    }
    answer_json(ans, 200,
                json_pack("{s:s, s:s, s:b, s:O}", "object", "list", "url",
                          "/v1/payment_intents", "has_more", n > (size_t)limit, "data",
                          data));
out:
    pthread_mutex_unlock(&st->lock);
    json_decref(data);
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
        answer_no_such_intent(ans, id);
    } else {
        /* One that has settled by itself by now is no longer processing. */
        settle_if_due(st, rec, now_ms);
        json_t *pi = json_object_get(rec, "pi");
        if (is_processing(rec)) {
            apply_settlement(st, rec, set, now_ms);
            answer_json(ans, 200, json_incref(pi));
        } else {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "This PaymentIntent's status is %s; only a processing one can be "
                     "settled.",
                     json_string_value(json_object_get(pi, "status")));
            answer_error(ans, 409, "invalid_request_error",
                         "payment_intent_unexpected_state", NULL, msg);
        }
    }
    if (st->journal)
        journal(st, "settle", now_ms,
                json_pack("{s:s, s:s, s:s?}", "id", id, "status", set->status,
                          "decline_code", set->decline_code));
    pthread_mutex_unlock(&st->lock);
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
        answer_no_such_intent(ans, id);
        return NULL;
    }
    settle_if_due(st, rec, now_ms);
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
    answer_json(ans, 400, json_pack("{s:o}", "error", err));
    st->counters[PSP_C_INVALID_400]++;
    return NULL;
}

/* Returns 0 when the parameters are Stripe's, else fills a 400. */
static int validate_cancel(const struct psp_cancel_request *req, struct psp_answer *ans)
{
    static const char *const reasons[] = {"duplicate", "fraudulent",
                                          "requested_by_customer", "abandoned"};
    if (req->unknown_parameter) {
        /* The name comes from the client: printable ASCII, cut. */
        char shown[65], msg[128];
        size_t i;
        for (i = 0; req->unknown_parameter[i] && i < 64; i++) {
            unsigned char c = (unsigned char)req->unknown_parameter[i];
            shown[i] = c > 0x20 && c < 0x7f ? (char)c : '?';
        }
        shown[i] = '\0';
        snprintf(msg, sizeof(msg), "Received unknown parameter: %s", shown);
        answer_error(ans, 400, "invalid_request_error", "parameter_unknown", shown,
                     msg);
        return -1;
    }
    if (!req->cancellation_reason)
        return 0;
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(req->cancellation_reason, reasons[i]))
            return 0;
    answer_error(ans, 400, "invalid_request_error", "parameter_invalid",
                 "cancellation_reason",
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

    fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (!path) {
        answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    if (answer_from_key(st, req->idempotency_key, path, fp, now_ms, ans))
        goto out;
    if (validate_cancel(req, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    if (!cancelable_intent(st, req->payment_intent_id, now_ms, ans))
        goto out;
    reserve_key(st, req->idempotency_key, path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        journal(st, "cancel_begin", now_ms, cancel_record(req));
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
    observe(st, pi, now_ms);
    answer_json(ans, 200, json_incref(pi));
    store_answer(st, req->idempotency_key, ans);
    executed = 1;
out:
    if (st->journal)
        journal(st, "cancel_execute", now_ms, cancel_record(req));
    pthread_mutex_unlock(&st->lock);
    return executed;
}

json_t *psp_store_ledger_json(psp_store_t *st, int64_t now_ms)
{
    const char *id;
    json_t *rec, *counters = json_object();
    pthread_mutex_lock(&st->lock);
    json_object_foreach(st->intents, id, rec) settle_if_due(st, rec, now_ms);
    for (int i = 0; i < PSP_C__COUNT; i++)
        json_object_set_new(counters, counter_names[i], json_integer(st->counters[i]));
    json_object_set_new(counters, "charges_in_flight",
                        json_integer(st->charges_in_flight));
    json_object_set_new(counters, "max_charges_in_flight",
                        json_integer(st->max_charges_in_flight));
    /* A copy: the caller serialises it after we let go of the lock. */
    json_object_foreach(st->refunds, id, rec) settle_refund_if_due(st, rec, now_ms);
    /* What the provider holds now, as an auditor paging its lists sees it. */
    json_object_set_new(counters, "intents",
                        json_integer((json_int_t)json_object_size(st->intents)));
    json_object_set_new(counters, "refund_objects",
                        json_integer((json_int_t)json_object_size(st->refunds)));
    json_t *out =
        json_pack("{s:o, s:o, s:o, s:o, s:o}", "charges", json_deep_copy(st->ledger),
                  "cancels", json_deep_copy(st->cancels), "refunds",
                  json_deep_copy(st->refund_rows), "refund_executions",
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
    st->intent_index.n = st->refund_index.n = 0;
    memset(st->counters, 0, sizeof(st->counters));
    st->max_charges_in_flight = st->charges_in_flight;
    if (st->journal)
        journal(st, "reset", 0, json_object());
    pthread_mutex_unlock(&st->lock);
}

/* ---- refunds ---- */

static const char refund_path[] = "/v1/refunds";

void psp_store_set_refund_settle(psp_store_t *st, int64_t settle_ms)
{
    pthread_mutex_lock(&st->lock);
    st->refund_settle_ms = settle_ms;
    if (st->journal)
        journal(st, "set", 0,
                json_pack("{s:s, s:I}", "name", "refund_settle_ms", "ms",
                          (json_int_t)settle_ms));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_set_event_observer(psp_store_t *st, psp_store_event_fn fn, void *ctx)
{
    pthread_mutex_lock(&st->lock);
    st->event_observer = fn;
    st->event_observer_ctx = ctx;
    pthread_mutex_unlock(&st->lock);
}

/* Caller holds the lock. */
static void observe_event(psp_store_t *st, const char *type, json_t *object,
                          int64_t at_ms)
{
    if (st->event_observer)
        st->event_observer(st->event_observer_ctx, type, object, at_ms);
}

static const char *refund_status(json_t *rec)
{
    const char *s =
        json_string_value(json_object_get(json_object_get(rec, "refund"), "status"));
    return s ? s : "";
}

/* The intent's charge id: Stripe's ch_ beside its pi_. */
static void charge_id_of(const char *pi_id, char *out, size_t outlen)
{
    snprintf(out, outlen, "ch_%s", strncmp(pi_id, "pi_", 3) ? pi_id : pi_id + 3);
}

/* Caller holds the lock. The sum of an intent's refunds in `status`, or of
 * all but the failed ones when status is NULL. */
static long long refunded_sum(psp_store_t *st, json_t *intent_rec, const char *status)
{
    long long sum = 0;
    size_t i;
    json_t *id;
    json_array_foreach(json_object_get(intent_rec, "refunds"), i, id)
    {
        json_t *rec = json_object_get(st->refunds, json_string_value(id));
        const char *s = refund_status(rec);
        if (status ? !strcmp(s, status) : strcmp(s, "failed") != 0)
            sum += json_integer_value(
                json_object_get(json_object_get(rec, "refund"), "amount"));
    }
    return sum;
}

/* Caller holds the lock. The charge.refunded object of an intent: a
 * Stripe charge with amount_refunded and its refunds, newest first. */
static json_t *charge_object(psp_store_t *st, json_t *intent_rec)
{
    json_t *pi = json_object_get(intent_rec, "pi"), *data = json_array(), *id;
    const char *pi_id = json_string_value(json_object_get(pi, "id"));
    json_int_t amount = json_integer_value(json_object_get(pi, "amount"));
    long long refunded = refunded_sum(st, intent_rec, "succeeded");
    json_t *ids = json_object_get(intent_rec, "refunds");
    char ch[300], url[340];

    for (size_t i = json_array_size(ids); i-- > 0;) {
        id = json_array_get(ids, i);
        json_array_append(
            data, json_object_get(json_object_get(st->refunds, json_string_value(id)),
                                  "refund"));
    }
    charge_id_of(pi_id, ch, sizeof(ch));
    snprintf(url, sizeof(url), "/v1/charges/%s/refunds", ch);
    return json_pack("{s:s, s:s, s:I, s:I, s:O, s:s, s:b, s:s, s:O, s:I, s:{s:s, s:o, "
                     "s:b, s:s}}",
                     "id", ch, "object", "charge", "amount", amount, "amount_refunded",
                     (json_int_t)refunded, "currency", json_object_get(pi, "currency"),
                     "payment_intent", pi_id, "refunded", refunded >= amount, "status",
                     "succeeded", "metadata", json_object_get(pi, "metadata"),
                     "created", json_integer_value(json_object_get(pi, "created")),
                     "refunds", "object", "list", "data", data, "has_more", 0, "url",
                     url);
}

/* Caller holds the lock. Counts a refund once more by its current status. */
static void count_refund_status(psp_store_t *st, const char *status, int delta)
{
    enum psp_counter c = !strcmp(status, "succeeded") ? PSP_C_REFUNDS_SUCCEEDED
                         : !strcmp(status, "pending") ? PSP_C_REFUNDS_PENDING
                                                      : PSP_C_REFUNDS_FAILED;
    st->counters[c] += delta;
}

/* Caller holds the lock. Moves a refund to status at at_ms: the refund, its
 * ledger row, the counters and the events (refund.updated; refund.failed;
 * charge.refunded when it succeeded). */
static void apply_refund_settlement(psp_store_t *st, json_t *rec, const char *status,
                                    const char *failure_reason, int64_t at_ms)
{
    json_t *refund = json_object_get(rec, "refund"), *row = json_object_get(rec, "row");
    const char *id = json_string_value(json_object_get(refund, "id"));

    count_refund_status(st, refund_status(rec), -1);
    count_refund_status(st, status, 1);
    st->counters[PSP_C_REFUNDS_SETTLED]++;
    json_object_set_new(refund, "status", json_string(status));
    json_object_set_new(row, "status", json_string(status));
    if (!strcmp(status, "failed")) {
        const char *why = failure_reason ? failure_reason : "expired_or_canceled_card";
        json_object_set_new(refund, "failure_reason", json_string(why));
        json_object_set_new(row, "failure_reason", json_string(why));
    }
    json_object_set_new(row, "settled_at_ms", json_integer(at_ms));
    json_object_del(st->refunds_pending, id);
    observe_event(st, "refund.updated", refund, at_ms);
    if (!strcmp(status, "failed"))
        observe_event(st, "refund.failed", refund, at_ms);
    json_t *irec = json_object_get(
        st->intents, json_string_value(json_object_get(refund, "payment_intent")));
    /* A deleted intent has no charge left to tell about. */
    if (!strcmp(status, "succeeded") && irec) {
        json_t *charge = charge_object(st, irec);
        observe_event(st, "charge.refunded", charge, at_ms);
        json_decref(charge);
    }
}

/* Caller holds the lock. With refund_settle_ms a pending refund reaches its
 * end that long after its creation, settled when first looked at. */
static void settle_refund_if_due(psp_store_t *st, json_t *rec, int64_t now_ms)
{
    int64_t created = json_integer_value(json_object_get(rec, "created_ms"));
    if (st->refund_settle_ms > 0 && !strcmp(refund_status(rec), "pending") &&
        now_ms - created >= st->refund_settle_ms) {
        const char *to = json_string_value(json_object_get(rec, "settle_to"));
        apply_refund_settlement(st, rec, to ? to : "succeeded", NULL,
                                created + st->refund_settle_ms);
        if (st->journal)
            journal(st, "refund_settle_due", now_ms,
                    json_pack("{s:O}", "id",
                              json_object_get(json_object_get(rec, "refund"), "id")));
    }
}

/* Returns 0 when the parameters are Stripe's, else fills a 400; *amount
 * gets the amount asked for (0: the rest). */
static int validate_refund(const struct psp_refund_request *req, long long *amount,
                           struct psp_answer *ans)
{
    static const char *const reasons[] = {"duplicate", "fraudulent",
                                          "requested_by_customer"};
    char *end;

    if (req->unknown_parameter) {
        char shown[65], msg[128];
        size_t i;
        for (i = 0; req->unknown_parameter[i] && i < 64; i++) {
            unsigned char c = (unsigned char)req->unknown_parameter[i];
            shown[i] = c > 0x20 && c < 0x7f ? (char)c : '?';
        }
        shown[i] = '\0';
        snprintf(msg, sizeof(msg), "Received unknown parameter: %s", shown);
        answer_error(ans, 400, "invalid_request_error", "parameter_unknown", shown,
                     msg);
        return -1;
    }
    if (!req->payment_intent || !*req->payment_intent) {
        answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                     "payment_intent", "Missing required param: payment_intent.");
        return -1;
    }
    *amount = 0;
    if (req->amount) {
        errno = 0;
        *amount = strtoll(req->amount, &end, 10);
        if (errno || *end || end == req->amount || *amount < 1 ||
            *amount > 99999999999999LL) {
            answer_error(ans, 400, "invalid_request_error", "parameter_invalid_integer",
                         "amount", "Invalid positive integer: amount.");
            return -1;
        }
    }
    if (!req->reason)
        return 0;
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(req->reason, reasons[i]))
            return 0;
    answer_error(ans, 400, "invalid_request_error", "parameter_invalid", "reason",
                 "Invalid reason: must be one of duplicate, fraudulent or "
                 "requested_by_customer.");
    return -1;
}

/* Caller holds the lock. The intent a refund of `amount` (0: the rest) may
 * execute on, *amount set to what it refunds; else NULL and *ans is the
 * refusal Stripe gives. */
static json_t *refundable_intent(psp_store_t *st, const char *pi_id, long long *amount,
                                 int64_t now_ms, struct psp_answer *ans)
{
    json_t *rec = json_object_get(st->intents, pi_id);
    char msg[200];

    if (!rec) {
        no_such("payment_intent", pi_id, msg, sizeof(msg));
        answer_error(ans, 404, "invalid_request_error", "resource_missing",
                     "payment_intent", msg);
        return NULL;
    }
    settle_if_due(st, rec, now_ms);
    json_t *pi = json_object_get(rec, "pi");
    const char *status = json_string_value(json_object_get(pi, "status"));
    long long total = json_integer_value(json_object_get(pi, "amount"));
    long long left = total - refunded_sum(st, rec, NULL);
    if (!status || strcmp(status, "succeeded") != 0) {
        snprintf(msg, sizeof(msg),
                 "This PaymentIntent does not have a successful charge to refund "
                 "(its status is %s).",
                 status ? status : "unknown");
        answer_error(ans, 400, "invalid_request_error", "charge_not_refundable",
                     "payment_intent", msg);
    } else if (left <= 0) {
        answer_error(ans, 400, "invalid_request_error", "charge_already_refunded", NULL,
                     "This charge has already been refunded.");
    } else if (*amount > left) {
        snprintf(msg, sizeof(msg),
                 "Refund amount (%lld) is greater than unrefunded amount on charge "
                 "(%lld).",
                 *amount, left);
        answer_error(ans, 400, "invalid_request_error", "amount_too_large", "amount",
                     msg);
    } else {
        if (*amount == 0)
            *amount = left;
        return rec;
    }
    st->counters[PSP_C_INVALID_400]++;
    return NULL;
}

enum psp_begin psp_store_refund_begin(psp_store_t *st,
                                      const struct psp_refund_request *req,
                                      int64_t now_ms, struct psp_answer *ans)
{
    char fp[17];
    long long amount;
    enum psp_begin rc = PSP_BEGIN_ANSWERED;

    fingerprint(req->body, fp);
    pthread_mutex_lock(&st->lock);
    st->counters[PSP_C_REQUESTS]++;
    if (answer_from_key(st, req->idempotency_key, refund_path, fp, now_ms, ans))
        goto out;
    if (validate_refund(req, &amount, ans) != 0) {
        st->counters[PSP_C_INVALID_400]++;
        goto out;
    }
    if (!refundable_intent(st, req->payment_intent, &amount, now_ms, ans))
        goto out;
    reserve_key(st, req->idempotency_key, refund_path, fp, now_ms);
    rc = PSP_BEGIN_EXECUTE;
out:
    if (st->journal)
        journal(st, "refund_begin", now_ms, refund_record(req));
    pthread_mutex_unlock(&st->lock);
    return rc;
}

/* Caller holds the lock and reserved a place in refund_index. Keeps the
 * refund (taken) of the intent irec with its ledger row (taken), as
 * psp_store_refund_execute and an injection make them. */
static void add_refund(psp_store_t *st, json_t *irec, json_t *refund, json_t *row,
                       int64_t created_ms, const char *settle_to)
{
    const char *id = json_string_value(json_object_get(refund, "id"));
    int64_t seq = (int64_t)st->next_id++;

    json_array_append(st->refund_rows, row);
    json_t *rec = json_pack("{s:o, s:o, s:I, s:I, s:s}", "refund", refund, "row", row,
                            "created_ms", (json_int_t)created_ms, "seq",
                            (json_int_t)seq, "settle_to", settle_to);
    json_object_set_new(st->refunds, id, rec);
    index_append(&st->refund_index,
                 json_integer_value(json_object_get(refund, "created")), seq, rec);
    if (!json_is_array(json_object_get(irec, "refunds")))
        json_object_set_new(irec, "refunds", json_array());
    json_array_append_new(json_object_get(irec, "refunds"), json_string(id));
    if (!strcmp(refund_status(rec), "pending"))
        json_object_set(st->refunds_pending, id, rec);
}

int psp_store_refund_execute(psp_store_t *st, const struct psp_refund_request *req,
                             int64_t now_ms, struct psp_answer *ans)
{
    long long amount = 0;
    int executed = 0;
    char id[40], ch[300];

    pthread_mutex_lock(&st->lock);
    /* Another refund of the intent may have taken what was left meanwhile
     * (latency): checked again, as begin did. */
    int refused = validate_refund(req, &amount, ans) != 0 ||
                  !refundable_intent(st, req->payment_intent, &amount, now_ms, ans);
    if (!refused && index_reserve(&st->refund_index, 1) != 0) {
        answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        refused = 1;
    }
    if (refused) {
        json_t *e = req->idempotency_key
                        ? json_object_get(st->keys, req->idempotency_key)
                        : NULL;
        if (e && !json_integer_value(json_object_get(e, "done")))
            json_object_del(st->keys, req->idempotency_key);
        goto out;
    }
    json_t *irec = json_object_get(st->intents, req->payment_intent);
    json_t *pi = json_object_get(irec, "pi");
    const struct psp_method *m =
        find_method(json_string_value(json_object_get(pi, "payment_method")));
    const char *how = m ? m->refund : NULL;
    const char *status = !how                     ? "succeeded"
                         : !strcmp(how, "failed") ? "failed"
                                                  : "pending";
    fresh_id(st, "re", st->refunds, NULL, now_ms, id, sizeof(id));
    charge_id_of(req->payment_intent, ch, sizeof(ch));
    json_t *metadata =
        json_is_object(req->metadata) ? json_deep_copy(req->metadata) : json_object();
    json_t *refund =
        json_pack("{s:s, s:s, s:I, s:s, s:O, s:s, s:s, s:s?, s:o, s:I}", "id", id,
                  "object", "refund", "amount", (json_int_t)amount, "charge", ch,
                  "currency", json_object_get(pi, "currency"), "payment_intent",
                  req->payment_intent, "status", status, "reason", req->reason,
                  "metadata", metadata, "created", (json_int_t)(now_ms / 1000));
    if (!strcmp(status, "failed"))
        json_object_set_new(refund, "failure_reason",
                            json_string("lost_or_stolen_card"));
    json_t *row = json_pack(
        "{s:s?, s:s, s:s, s:I, s:O, s:s?, s:O, s:s, s:O?, s:i, s:I, s:n, s:b}",
        "idempotency_key", req->idempotency_key, "provider_refund_id", id,
        "payment_intent_id", req->payment_intent, "amount", (json_int_t)amount,
        "currency", json_object_get(pi, "currency"), "reason", req->reason, "metadata",
        json_object_get(refund, "metadata"), "status", status, "failure_reason",
        json_object_get(refund, "failure_reason"), "http_status", 200, "at_ms",
        (json_int_t)now_ms, "settled_at_ms", "injected", 0);
    add_refund(st, irec, refund, row, now_ms,
               how && !strcmp(how, "pending_fail") ? "failed" : "succeeded");
    if (req->idempotency_key) {
        json_t *n = json_object_get(st->refund_executions, req->idempotency_key);
        json_object_set_new(st->refund_executions, req->idempotency_key,
                            json_integer(json_integer_value(n) + 1));
    }
    st->counters[PSP_C_REFUNDS]++;
    count_refund_status(st, status, 1);
    observe_event(st, "refund.created", refund, now_ms);
    if (!strcmp(status, "failed"))
        observe_event(st, "refund.failed", refund, now_ms);
    if (!strcmp(status, "succeeded")) {
        json_t *charge = charge_object(st, irec);
        observe_event(st, "charge.refunded", charge, now_ms);
        json_decref(charge);
    }
    answer_json(ans, 200, json_incref(refund));
    store_answer(st, req->idempotency_key, ans);
    executed = 1;
out:
    if (st->journal)
        journal(st, "refund_execute", now_ms, refund_record(req));
    pthread_mutex_unlock(&st->lock);
    return executed;
}

static void answer_no_such_refund(struct psp_answer *ans, const char *id)
{
    char msg[128];
    no_such("refund", id, msg, sizeof(msg));
    answer_error(ans, 404, "invalid_request_error", "resource_missing", "id", msg);
}

void psp_store_refund_retrieve(psp_store_t *st, const char *id, int64_t now_ms,
                               struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->refunds, id);
    if (rec) {
        settle_refund_if_due(st, rec, now_ms);
        answer_json(ans, 200, json_deep_copy(json_object_get(rec, "refund")));
    } else {
        answer_no_such_refund(ans, id);
    }
    pthread_mutex_unlock(&st->lock);
}

static int refund_of_intent(json_t *rec, const char *payment_intent)
{
    const char *pi = json_string_value(
        json_object_get(json_object_get(rec, "refund"), "payment_intent"));
    return pi && !strcmp(pi, payment_intent);
}

void psp_store_refund_list(psp_store_t *st, const struct psp_refund_list_query *q,
                           int64_t now_ms, struct psp_answer *ans)
{
    const struct list_entry *page[LIST_MAX + 1];
    int limit = q->limit < 1 ? 1 : q->limit > LIST_MAX ? LIST_MAX : q->limit;
    struct list_scan scan = {q->created_gte,
                             q->created_lt,
                             0,
                             -1,
                             q->payment_intent ? refund_of_intent : NULL,
                             q->payment_intent};
    json_t *data = json_array();

    pthread_mutex_lock(&st->lock);
    if (q->payment_intent && !json_object_get(st->intents, q->payment_intent)) {
        /* As Stripe: the intent filtered on must exist (a deleted one does
         * not), or there is no list at all. */
        char msg[128];
        no_such("payment_intent", q->payment_intent, msg, sizeof(msg));
        answer_error(ans, 404, "invalid_request_error", "resource_missing",
                     "payment_intent", msg);
        goto out;
    }
    if (q->starting_after) {
        json_t *cursor = json_object_get(st->refunds, q->starting_after);
        if (!cursor) {
            char msg[128];
            no_such("refund", q->starting_after, msg, sizeof(msg));
            answer_error(ans, 400, "invalid_request_error", "resource_missing",
                         "starting_after", msg);
            goto out;
        }
        scan.after_created = json_integer_value(
            json_object_get(json_object_get(cursor, "refund"), "created"));
        scan.after_seq = rec_seq(cursor);
    }
    size_t n = select_page(&st->refund_index, &scan, page, (size_t)limit + 1);
    for (size_t i = 0; i < n && i < (size_t)limit; i++) {
        settle_refund_if_due(st, page[i]->rec, now_ms);
        json_array_append_new(data,
                              json_deep_copy(json_object_get(page[i]->rec, "refund")));
    }
    answer_json(ans, 200,
                json_pack("{s:s, s:s, s:b, s:O}", "object", "list", "url", refund_path,
                          "has_more", n > (size_t)limit, "data", data));
out:
    pthread_mutex_unlock(&st->lock);
    json_decref(data);
}

void psp_store_refund_settle(psp_store_t *st, const char *id, const char *status,
                             const char *failure_reason, int64_t now_ms,
                             struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->refunds, id);
    if (!status ||
        (strcmp(status, "succeeded") != 0 && strcmp(status, "failed") != 0)) {
        answer_error(ans, 400, "invalid_request_error", "parameter_invalid", "status",
                     "status must be succeeded or failed");
    } else if (!rec) {
        answer_no_such_refund(ans, id);
    } else {
        settle_refund_if_due(st, rec, now_ms);
        const char *now = refund_status(rec);
        if (!strcmp(now, "pending") ||
            (!strcmp(now, "succeeded") && !strcmp(status, "failed"))) {
            apply_refund_settlement(st, rec, status, failure_reason, now_ms);
            answer_json(ans, 200, json_deep_copy(json_object_get(rec, "refund")));
        } else {
            char msg[160];
            snprintf(msg, sizeof(msg),
                     "This refund's status is %s; it cannot become %s.", now, status);
            answer_error(ans, 409, "invalid_request_error", "refund_unexpected_state",
                         NULL, msg);
        }
    }
    if (st->journal)
        journal(st, "refund_settle", now_ms,
                json_pack("{s:s, s:s?, s:s?}", "id", id, "status", status,
                          "failure_reason", failure_reason));
    pthread_mutex_unlock(&st->lock);
}

/* ---- states made behind the API's back: a broken integration, or a
 * person with dashboard access ---- */

#define INDEX_DIGITS 12
#define INDEX_MAX    999999999999LL
#define AMOUNT_MAX   99999999999999LL

/* tmpl with each "{n}" replaced by n as 12 zero-padded digits, into out
 * (cut to outlen; outlen 0: nothing written). Returns the whole length, as
 * snprintf does. */
static size_t expand(const char *tmpl, long long n, char *out, size_t outlen)
{
    char digits[INDEX_DIGITS + 8];
    size_t len = 0;

    snprintf(digits, sizeof(digits), "%0*lld", INDEX_DIGITS, n);
    for (const char *p = tmpl; *p;) {
        const char *piece = p;
        size_t pl = 1;
        if (!strncmp(p, "{n}", 3)) {
            piece = digits;
            pl = INDEX_DIGITS;
            p += 3;
        } else {
            p++;
        }
        for (size_t i = 0; i < pl; i++, len++)
            if (len + 1 < outlen)
                out[len] = piece[i];
    }
    if (outlen)
        out[len < outlen ? len : outlen - 1] = '\0';
    return len;
}

/* A 400 of the admin API about one member of the body. */
static void answer_bad(struct psp_answer *ans, const char *param, const char *message)
{
    answer_error(ans, 400, "invalid_request_error", "parameter_invalid", param,
                 message);
}

/* 0 when every member of body is one of names (NULL-terminated) and body is
 * an object; else fills a 400. */
static int members_known(json_t *body, const char *const *names, struct psp_answer *ans)
{
    const char *k;
    json_t *v;
    char msg[128];

    if (!json_is_object(body)) {
        answer_bad(ans, NULL, "body must be a JSON object");
        return -1;
    }
    json_object_foreach(body, k, v)
    {
        size_t i;
        for (i = 0; names[i] && strcmp(names[i], k) != 0; i++)
            ;
        if (!names[i]) {
            char shown[72];
            printable(k, shown);
            snprintf(msg, sizeof(msg), "unknown member '%s'", shown);
            answer_bad(ans, NULL, msg);
            return -1;
        }
    }
    return 0;
}

/* body's member name, when present: an integer in min..max into *out (0),
 * absent (0, *out untouched), else a 400 saying so (-1). */
static int member_int(json_t *body, const char *name, long long min, long long max,
                      long long *out, struct psp_answer *ans)
{
    json_t *v = json_object_get(body, name);
    char msg[160];

    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < min ||
        json_integer_value(v) > max) {
        snprintf(msg, sizeof(msg), "%s must be an integer in %lld..%lld", name, min,
                 max);
        answer_bad(ans, name, msg);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

/* Stripe's metadata limits (50 keys of at most 40 characters, no square
 * brackets; string values of at most 500 characters, counted once "{n}" is
 * expanded when `templated`). 0, or -1 with a 400. */
static int metadata_valid(json_t *md, int templated, struct psp_answer *ans)
{
    const char *k;
    json_t *v;
    char msg[160];

    if (!json_is_object(md) || json_object_size(md) > 50) {
        answer_bad(ans, "metadata", "metadata must be an object of at most 50 keys");
        return -1;
    }
    json_object_foreach(md, k, v)
    {
        size_t kl = strlen(k);
        const char *s = json_string_value(v);
        char shown[72];
        printable(k, shown);
        if (kl < 1 || kl > 40 || strpbrk(k, "[]")) {
            snprintf(msg, sizeof(msg),
                     "metadata key '%s' must be 1..40 characters without [ or ]",
                     shown);
            answer_bad(ans, "metadata", msg);
            return -1;
        }
        if (!s || (templated ? expand(s, 0, NULL, 0) : strlen(s)) > 500) {
            snprintf(msg, sizeof(msg),
                     "metadata['%s'] must be a string of at most 500 characters",
                     shown);
            answer_bad(ans, "metadata", msg);
            return -1;
        }
    }
    return 0;
}

/* An injected object's id: 1..255 letters, digits, '_' or '-' (it goes into
 * URLs and the ledger as it is). */
static int object_id_valid(const char *id, size_t len)
{
    return len >= 1 && len <= 255 &&
           strspn(id, "abcdefghijklmnopqrstuvwxyz"
                      "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") == len;
}

/* The intents POST /inject/intents asks for, checked. Strings and metadata
 * point into the body or into the intent it is like. */
struct intent_injection {
    long long count, start, amount, created;
    const char *currency, *customer, *payment_method, *status, *id_template;
    json_t *metadata;
};

/* Caller holds the lock (`like` reads an intent). 0, or -1 with *ans the
 * refusal: 400 for bad input, 404 for an unknown `like`. */
static int injection_parse(psp_store_t *st, json_t *body, int64_t now_ms,
                           struct intent_injection *in, struct psp_answer *ans)
{
    static const char *const names[] = {"count",    "like",   "amount", "currency",
                                        "metadata", "status", "id",     "created",
                                        "start",    NULL};
    static const char *const statuses[] = {"succeeded", "processing",
                                           "requires_payment_method", "canceled"};
    json_t *v;
    char msg[320];

    *in = (struct intent_injection){.count = 1,
                                    .amount = 1000,
                                    .created = now_ms / 1000,
                                    .currency = "usd",
                                    .payment_method = "pm_card_visa",
                                    .status = "succeeded"};
    if (members_known(body, names, ans) != 0)
        return -1;
    if ((v = json_object_get(body, "like")) != NULL) {
        if (!json_is_string(v)) {
            answer_bad(ans, "like", "like must be a payment intent id");
            return -1;
        }
        json_t *rec = json_object_get(st->intents, json_string_value(v));
        if (!rec) {
            no_such("payment_intent", json_string_value(v), msg, sizeof(msg));
            answer_error(ans, 404, "invalid_request_error", "resource_missing", "like",
                         msg);
            return -1;
        }
        json_t *pi = json_object_get(rec, "pi");
        in->amount = json_integer_value(json_object_get(pi, "amount"));
        in->currency = json_string_value(json_object_get(pi, "currency"));
        in->customer = json_string_value(json_object_get(pi, "customer"));
        in->payment_method = json_string_value(json_object_get(pi, "payment_method"));
        in->metadata = json_object_get(pi, "metadata");
    }
    if (member_int(body, "count", 1, 200000, &in->count, ans) != 0 ||
        member_int(body, "start", 0, INDEX_MAX, &in->start, ans) != 0 ||
        member_int(body, "amount", 1, AMOUNT_MAX, &in->amount, ans) != 0 ||
        member_int(body, "created", 0, 253402300799LL, &in->created, ans) != 0)
        return -1;
    if (in->start + in->count - 1 > INDEX_MAX) {
        answer_bad(ans, "start", "start + count - 1 must fit in 12 digits");
        return -1;
    }
    if ((v = json_object_get(body, "currency")) != NULL &&
        !currency_valid(in->currency = json_string_value(v))) {
        answer_bad(ans, "currency", "currency must be three lower-case letters");
        return -1;
    }
    if ((v = json_object_get(body, "metadata")) != NULL) {
        if (metadata_valid(v, 1, ans) != 0)
            return -1;
        in->metadata = v;
    }
    if ((v = json_object_get(body, "status")) != NULL) {
        size_t i;
        in->status = json_string_value(v);
        for (i = 0; i < 4 && (!in->status || strcmp(in->status, statuses[i])); i++)
            ;
        if (i == 4) {
            answer_bad(ans, "status",
                       "status must be succeeded, processing, "
                       "requires_payment_method or canceled");
            return -1;
        }
    }
    if ((v = json_object_get(body, "id")) != NULL) {
        char id[300];
        in->id_template = json_string_value(v);
        size_t len =
            in->id_template ? expand(in->id_template, in->start, id, sizeof(id)) : 0;
        if (!object_id_valid(id, len) || !in->id_template) {
            answer_bad(ans, "id", "id must expand to 1..255 letters, digits, _ or -");
            return -1;
        }
        if (in->count > 1 && !strstr(in->id_template, "{n}")) {
            answer_bad(ans, "id", "id must hold {n} when count is more than 1");
            return -1;
        }
    }
    return 0;
}

/* The metadata of injected intent n (a new reference). */
static json_t *metadata_for(json_t *tmpl, long long n)
{
    json_t *md = json_object(), *v;
    const char *k;

    json_object_foreach(tmpl, k, v)
    {
        const char *s = json_string_value(v);
        size_t len = expand(s, n, NULL, 0);
        char *value = malloc(len + 1);
        if (value) {
            expand(s, n, value, len + 1);
            json_object_set_new(md, k, json_string(value));
        }
        free(value);
    }
    return md;
}

/* Caller holds the lock. Makes injected intent `id` with index n. */
static void inject_intent(psp_store_t *st, const struct intent_injection *in,
                          const char *id, long long n, int64_t now_ms)
{
    json_t *md = metadata_for(in->metadata, n);
    json_t *pi = json_pack(
        "{s:s, s:s, s:I, s:s, s:s, s:s?, s:n, s:I, s:o, s:s, s:n}", "id", id, "object",
        "payment_intent", "amount", (json_int_t)in->amount, "currency", in->currency,
        "payment_method", in->payment_method, "customer", in->customer,
        "automatic_payment_methods", "created", (json_int_t)in->created, "metadata", md,
        "status", in->status, "last_payment_error");
    const char *outcome = in->status;
    enum psp_counter c = PSP_C_SUCCEEDED;
    int http = 200;
    char key[320];

    if (!strcmp(in->status, "processing")) {
        c = PSP_C_PROCESSING;
    } else if (!strcmp(in->status, "requires_payment_method")) {
        json_object_set_new(pi, "last_payment_error",
                            json_pack("{s:s, s:s, s:s, s:s}", "type", "card_error",
                                      "code", "card_declined", "decline_code",
                                      "generic_decline", "message",
                                      "Your card was declined."));
        outcome = "declined";
        c = PSP_C_DECLINED;
        http = 402;
    } else if (!strcmp(in->status, "canceled")) {
        json_object_set_new(pi, "canceled_at", json_integer(in->created));
        json_object_set_new(pi, "cancellation_reason", json_null());
        c = PSP_C_CANCELED;
    }
    snprintf(key, sizeof(key), "inject_%s", id);
    json_t *row = json_pack(
        "{s:s, s:s, s:O?, s:O?, s:s?, s:I, s:s, s:s, s:i, s:I, s:n, s:b, s:b, s:b}",
        "idempotency_key", key, "payment_intent_id", id, "payment_attempt_id",
        json_object_get(md, "payment_attempt_id"), "order_id",
        json_object_get(md, "order_id"), "customer", in->customer, "amount",
        (json_int_t)in->amount, "currency", in->currency, "outcome", outcome,
        "http_status", http, "at_ms", (json_int_t)now_ms, "settled_at_ms", "injected",
        1, "amended", 0, "deleted", 0);
    /* Its creation (created) is when search finds it and when it settles
     * by itself. */
    add_intent(st, id, pi, row,
               in->created == now_ms / 1000 ? now_ms : (int64_t)in->created * 1000);
    json_decref(pi);
    st->counters[c]++;
}

void psp_store_inject_intents(psp_store_t *st, json_t *body, int64_t now_ms,
                              struct psp_answer *ans)
{
    struct intent_injection in;
    json_t *ids = NULL;
    char id[300], msg[400];

    pthread_mutex_lock(&st->lock);
    if (injection_parse(st, body, now_ms, &in, ans) != 0)
        goto out;
    /* All or nothing: every id is checked before any intent is made. A
     * deleted intent's id stays taken, as ids are never reused. */
    for (long long i = 0; in.id_template && i < in.count; i++) {
        expand(in.id_template, in.start + i, id, sizeof(id));
        if (json_object_get(st->intents, id) || json_object_get(st->deleted, id)) {
            snprintf(msg, sizeof(msg), "A PaymentIntent with id '%s' exists already.",
                     id);
            answer_error(ans, 409, "invalid_request_error", "resource_already_exists",
                         "id", msg);
            goto out;
        }
    }
    if (index_reserve(&st->intent_index, (size_t)in.count) != 0 ||
        !(ids = json_array())) {
        answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    for (long long i = 0; i < in.count; i++) {
        if (in.id_template)
            expand(in.id_template, in.start + i, id, sizeof(id));
        else
            fresh_id(st, "pi", st->intents, st->deleted, now_ms, id, sizeof(id));
        inject_intent(st, &in, id, in.start + i, now_ms);
        if (i < 100)
            json_array_append_new(ids, json_string(id));
    }
    answer_json(ans, 201,
                json_pack("{s:I, s:O}", "count", (json_int_t)in.count, "ids", ids));
out:
    if (st->journal)
        journal(st, "inject_intents", now_ms, body_record(body));
    pthread_mutex_unlock(&st->lock);
    json_decref(ids);
}

void psp_store_amend(psp_store_t *st, const char *id, json_t *body, int64_t now_ms,
                     struct psp_answer *ans)
{
    static const char *const names[] = {"amount", "currency", NULL};
    long long amount = 0;
    json_t *cur = json_object_get(body, "currency");

    if (members_known(body, names, ans) != 0 ||
        member_int(body, "amount", 1, AMOUNT_MAX, &amount, ans) != 0)
        return;
    if (!amount && !cur) {
        answer_bad(ans, NULL, "give amount, currency or both");
        return;
    }
    if (cur && !currency_valid(json_string_value(cur))) {
        answer_bad(ans, "currency", "currency must be three lower-case letters");
        return;
    }
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->intents, id);
    if (!rec) {
        answer_no_such_intent(ans, id);
        goto out;
    }
    settle_if_due(st, rec, now_ms);
    json_t *pi = json_object_get(rec, "pi"), *row = json_object_get(rec, "row");
    if (amount) {
        json_object_set_new(pi, "amount", json_integer(amount));
        json_object_set_new(row, "amount", json_integer(amount));
    }
    if (cur) {
        json_object_set_new(pi, "currency", json_string(json_string_value(cur)));
        json_object_set_new(row, "currency", json_string(json_string_value(cur)));
    }
    json_object_set_new(row, "amended", json_true());
    answer_json(ans, 200, json_incref(pi));
out:
    if (st->journal)
        journal(st, "amend", now_ms, id_and_body_record(id, body));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_delete(psp_store_t *st, const char *id, struct psp_answer *ans)
{
    pthread_mutex_lock(&st->lock);
    json_t *rec = json_object_get(st->intents, id);
    if (!rec) {
        answer_no_such_intent(ans, id);
        goto out;
    }
    struct list_entry *e = index_find(&st->intent_index, rec_seq(rec));
    if (e)
        e->live = 0;
    json_object_set_new(json_object_get(rec, "row"), "deleted", json_true());
    /* Kept aside, out of every lookup but a list cursor's. */
    json_object_set(st->deleted, id, rec);
    json_object_del(st->processing, id);
    answer_json(ans, 200, json_pack("{s:b, s:s}", "deleted", 1, "id", id));
    json_object_del(st->intents, id);
out:
    if (st->journal)
        journal(st, "delete", 0, json_pack("{s:s}", "id", id));
    pthread_mutex_unlock(&st->lock);
}

void psp_store_inject_refund(psp_store_t *st, json_t *body, int64_t now_ms,
                             struct psp_answer *ans)
{
    static const char *const names[] = {"payment_intent", "amount",  "status",
                                        "metadata",       "created", NULL};
    static const char *const statuses[] = {"succeeded", "pending", "failed"};
    const char *pi_id = json_string_value(json_object_get(body, "payment_intent"));
    const char *status = "succeeded";
    json_t *v, *md = json_object_get(body, "metadata");
    long long amount = 0, created = now_ms / 1000;
    char id[40], ch[300], key[64], msg[200];
    size_t i;

    if (members_known(body, names, ans) != 0)
        return;
    if (!pi_id) {
        answer_error(ans, 400, "invalid_request_error", "parameter_missing",
                     "payment_intent", "payment_intent must be a payment intent id");
        return;
    }
    if (member_int(body, "amount", 1, AMOUNT_MAX, &amount, ans) != 0 ||
        member_int(body, "created", 0, 253402300799LL, &created, ans) != 0 ||
        (md && metadata_valid(md, 0, ans) != 0))
        return;
    if ((v = json_object_get(body, "status")) != NULL) {
        status = json_string_value(v);
        for (i = 0; i < 3 && (!status || strcmp(status, statuses[i])); i++)
            ;
        if (i == 3) {
            answer_bad(ans, "status", "status must be succeeded, pending or failed");
            return;
        }
    }
    pthread_mutex_lock(&st->lock);
    json_t *irec = json_object_get(st->intents, pi_id);
    if (!irec) {
        no_such("payment_intent", pi_id, msg, sizeof(msg));
        answer_error(ans, 404, "invalid_request_error", "resource_missing",
                     "payment_intent", msg);
        goto out;
    }
    if (index_reserve(&st->refund_index, 1) != 0) {
        answer_error(ans, 500, "api_error", NULL, NULL, "out of memory");
        goto out;
    }
    json_t *pi = json_object_get(irec, "pi");
    /* Out of band: no check of what is left to refund, nor of the intent's
     * status; that is the state an auditor must catch. */
    if (!amount)
        amount = json_integer_value(json_object_get(pi, "amount"));
    fresh_id(st, "re", st->refunds, NULL, now_ms, id, sizeof(id));
    charge_id_of(pi_id, ch, sizeof(ch));
    json_t *refund = json_pack(
        "{s:s, s:s, s:I, s:s, s:O, s:s, s:s, s:n, s:o, s:I}", "id", id, "object",
        "refund", "amount", (json_int_t)amount, "charge", ch, "currency",
        json_object_get(pi, "currency"), "payment_intent", pi_id, "status", status,
        "reason", "metadata", md ? json_deep_copy(md) : json_object(), "created",
        (json_int_t)created);
    if (!strcmp(status, "failed"))
        json_object_set_new(refund, "failure_reason",
                            json_string("lost_or_stolen_card"));
    snprintf(key, sizeof(key), "inject_%s", id);
    json_t *row = json_pack(
        "{s:s, s:s, s:s, s:I, s:O, s:n, s:O, s:s, s:O?, s:i, s:I, s:n, s:b}",
        "idempotency_key", key, "provider_refund_id", id, "payment_intent_id", pi_id,
        "amount", (json_int_t)amount, "currency", json_object_get(pi, "currency"),
        "reason", "metadata", json_object_get(refund, "metadata"), "status", status,
        "failure_reason", json_object_get(refund, "failure_reason"), "http_status", 200,
        "at_ms", (json_int_t)now_ms, "settled_at_ms", "injected", 1);
    add_refund(st, irec, refund, row,
               created == now_ms / 1000 ? now_ms : (int64_t)created * 1000,
               "succeeded");
    count_refund_status(st, status, 1);
    answer_json(ans, 201, json_incref(refund));
out:
    if (st->journal)
        journal(st, "inject_refund", now_ms, body_record(body));
    pthread_mutex_unlock(&st->lock);
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
        settle_refund_if_due(st, rec, now_ms);
    else if (rec)
        settle_if_due(st, rec, now_ms);
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
    } else if (!strcmp(op, "refund_begin") || !strcmp(op, "refund_execute")) {
        refund_from_record(record, &refund);
        if (!strcmp(op, "refund_begin"))
            psp_store_refund_begin(st, &refund, now, &ans);
        else
            psp_store_refund_execute(st, &refund, now, &ans);
    } else if (!strcmp(op, "release")) {
        psp_store_release(st, member_str(record, "key"));
    } else if (!strcmp(op, "settle_due") || !strcmp(op, "refund_settle_due")) {
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
            journal(st, "release", 0, json_pack("{s:s}", "key", key));
        json_object_del(st->keys, key);
    }
    pthread_mutex_unlock(&st->lock);
}
