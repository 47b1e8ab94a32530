/* psp-sim: a payment provider speaking the subset of Stripe's PaymentIntents
 * API that charged uses, with Stripe's idempotency semantics, injectable
 * faults and a ledger of what it actually charged.
 *
 * Two listeners: the provider API (/v1/...) and an admin API (ledger, reset,
 * faults, webhooks) on its own port. Delays and stalls suspend the connection
 * and a timer thread resumes it, so thousands of slow requests cost no
 * threads. With --webhook-url, every change of an intent's status becomes a
 * signed event that psp_webhooks delivers from a thread of its own. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "psp_faults.h"
#include "psp_journal.h"
#include "psp_store.h"
#include "psp_webhooks.h"

#define MAX_BODY 65536
/* A year: longer than any card network holds an authorization. */
#define AUTHORIZATION_EXPIRY_MAX 31536000000LL

static volatile sig_atomic_t stop_requested;

static psp_store_t *store;
static psp_faults_t *faults;
static psp_webhooks_t *webhooks;
static psp_journal_t *journal; /* --state-file; NULL: in memory only */
static char *api_key;

static int parse_long(const char *s, long min, long max, long *out);

enum req_state { ST_RECEIVING, ST_DELAYED, ST_STALLED };

struct form_pair {
    char *k, *v;
};

struct req {
    enum req_state state;
    struct MHD_Connection *conn;
    char *body;
    size_t len;
    int too_large;
    struct form_pair *form;
    size_t nform;
    int form_bad; /* a name or value decoded to a NUL byte or non-UTF-8 */
    char *idem_key;
    enum req_op { OP_CHARGE, OP_CANCEL, OP_REFUND, OP_CAPTURE } op;
    struct psp_charge_request charge;
    struct psp_cancel_request cancel;
    struct psp_capture_request capture;
    struct psp_refund_request refund;
    json_t *metadata; /* a refund's metadata[...] */
    char *intent_id;  /* a cancel's or a capture's, from the URL */
    uint64_t seq;
    int executing; /* the key is reserved: execute or release */
    int charging;  /* a charge request, counted in flight until freed */
};

/* ---- timer: resumes suspended connections when they are due ---- */

struct timer_entry {
    int64_t due_ms;
    struct MHD_Connection *conn;
};

static pthread_mutex_t timer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cond = PTHREAD_COND_INITIALIZER;
static struct timer_entry *heap;
static size_t heap_len, heap_cap;
static int timer_stop;

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void heap_swap(size_t a, size_t b)
{
    struct timer_entry t = heap[a];
    heap[a] = heap[b];
    heap[b] = t;
}

/* Suspends conn and schedules its resumption after delay_ms. */
static void suspend_for(struct MHD_Connection *conn, int64_t delay_ms)
{
    MHD_suspend_connection(conn);
    pthread_mutex_lock(&timer_lock);
    if (heap_len == heap_cap) {
        size_t ncap = heap_cap ? heap_cap * 2 : 1024;
        struct timer_entry *n = realloc(heap, ncap * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&timer_lock);
            MHD_resume_connection(conn);
            return;
        }
        heap = n;
        heap_cap = ncap;
    }
    size_t i = heap_len++;
    heap[i] = (struct timer_entry){now_ms() + delay_ms, conn};
    while (i > 0 && heap[(i - 1) / 2].due_ms > heap[i].due_ms) {
        heap_swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    pthread_cond_signal(&timer_cond);
    pthread_mutex_unlock(&timer_lock);
}

static struct MHD_Connection *heap_pop(void)
{
    struct MHD_Connection *c = heap[0].conn;
    heap[0] = heap[--heap_len];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_len && heap[l].due_ms < heap[m].due_ms)
            m = l;
        if (r < heap_len && heap[r].due_ms < heap[m].due_ms)
            m = r;
        if (m == i)
            break;
        heap_swap(i, m);
        i = m;
    }
    return c;
}

static void *timer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&timer_lock);
    for (;;) {
        if (heap_len == 0) {
            if (timer_stop)
                break;
            pthread_cond_wait(&timer_cond, &timer_lock);
            continue;
        }
        int64_t wait = heap[0].due_ms - now_ms();
        if (wait > 0 && !timer_stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += wait / 1000;
            ts.tv_nsec += (wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&timer_cond, &timer_lock, &ts);
            continue;
        }
        /* Due (or shutting down: every suspended connection must resume
         * before the daemon stops). */
        MHD_resume_connection(heap_pop());
    }
    pthread_mutex_unlock(&timer_lock);
    return NULL;
}

/* ---- webhooks: every change of an intent's status is an event ---- */

/* The store calls this under its lock, in the order of each intent's
 * changes; queuing never blocks the request that made the change. */
static void on_intent_change(void *ctx, json_t *intent, int64_t at_ms)
{
    const char *type = psp_webhooks_type_for_status(
        json_string_value(json_object_get(intent, "status")));
    if (type)
        psp_webhooks_enqueue(ctx, type, intent, at_ms / 1000, NULL, NULL, 0);
}

/* Refund events (refund.*, charge.refunded) come with their type. */
static void on_store_event(void *ctx, const char *type, json_t *object, int64_t at_ms)
{
    psp_webhooks_enqueue(ctx, type, object, at_ms / 1000, NULL, NULL, 0);
}

/* With --processing-settle-ms an intent settles when it is next read; with
 * webhooks someone must read it when it is due, or its event never comes.
 * At most 100 ms late: the setting can change at run time. */
static pthread_mutex_t settler_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t settler_cond = PTHREAD_COND_INITIALIZER;
static int settler_stop;

static void *settler_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&settler_lock);
    while (!settler_stop) {
        pthread_mutex_unlock(&settler_lock);
        int64_t next = psp_store_settle_due(store, now_ms());
        pthread_mutex_lock(&settler_lock);
        if (settler_stop)
            break;
        int64_t wait = next < 0 || next > 100 ? 100 : next < 1 ? 1 : next;
        int64_t due = now_ms() + wait;
        struct timespec ts = {.tv_sec = due / 1000, .tv_nsec = (due % 1000) * 1000000};
        pthread_cond_timedwait(&settler_cond, &settler_lock, &ts);
    }
    pthread_mutex_unlock(&settler_lock);
    return NULL;
}

/* ---- request helpers ---- */

static void req_free(struct req *r)
{
    if (!r)
        return;
    if (r->executing)
        psp_store_release(store, r->idem_key);
    if (r->charging)
        psp_store_charge_ended(store);
    for (size_t i = 0; i < r->nform; i++) {
        free(r->form[i].k);
        free(r->form[i].v);
    }
    free(r->form);
    free(r->body);
    free(r->idem_key);
    free(r->intent_id);
    json_decref(r->metadata);
    free(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    req_free(*con_cls);
    *con_cls = NULL;
}

static enum MHD_Result respond(struct MHD_Connection *conn, int status, char *body,
                               int replayed)
{
    struct MHD_Response *resp;
    enum MHD_Result rc;

    /* Whatever the answer tells of must be on disk before it is sent. */
    psp_journal_sync(journal);
    if (!body)
        body = strdup("{}");
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (replayed)
        MHD_add_response_header(resp, "Idempotent-Replayed", "true");
    rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

static enum MHD_Result respond_json(struct MHD_Connection *conn, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    return respond(conn, status, s, 0);
}

static enum MHD_Result respond_error(struct MHD_Connection *conn, int status,
                                     const char *type, const char *message)
{
    return respond_json(
        conn, status,
        json_pack("{s:{s:s, s:s}}", "error", "type", type, "message", message));
}

/* One name or value of a form body: '+' is a space in forms (MHD_http_unescape
 * leaves it alone), then %XX as libmicrohttpd decodes it. Sets *bad when the
 * result holds a NUL byte or is not UTF-8: no parameter can be either. */
static char *form_decode(const char *s, size_t n, int *bad)
{
    char *out = strndup(s, n);
    if (!out)
        return NULL;
    for (char *p = out; (p = strchr(p, '+')) != NULL; p++)
        *p = ' ';
    size_t len = MHD_http_unescape(out);
    json_t *probe = json_stringn(out, len); /* NULL when not UTF-8 or has NUL */
    if (!probe || len != strlen(out))
        *bad = 1;
    json_decref(probe);
    return out;
}

/* Splits the raw body on '&' and '=' (names like metadata[order_id] are
 * plain names here) and decodes each part. -1: out of memory. */
static int parse_form(struct req *r)
{
    const char *p = r->body ? r->body : "";
    while (*p) {
        const char *amp = strchr(p, '&');
        size_t n = amp ? (size_t)(amp - p) : strlen(p);
        const char *eq = memchr(p, '=', n);
        if (n > 0) {
            struct form_pair *f = realloc(r->form, (r->nform + 1) * sizeof(*f));
            if (!f)
                return -1;
            r->form = f;
            f = &r->form[r->nform++];
            f->k = form_decode(p, eq ? (size_t)(eq - p) : n, &r->form_bad);
            f->v = eq ? form_decode(eq + 1, n - (size_t)(eq - p) - 1, &r->form_bad)
                      : strdup("");
            if (!f->k || !f->v)
                return -1;
        }
        p += n + (amp ? 1 : 0);
    }
    return 0;
}

static const char *form_get(const struct req *r, const char *k)
{
    for (size_t i = 0; i < r->nform; i++)
        if (!strcmp(r->form[i].k, k))
            return r->form[i].v;
    return NULL;
}

static int authorized(struct MHD_Connection *conn)
{
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    unsigned char want[SHA256_DIGEST_LENGTH], got[SHA256_DIGEST_LENGTH];
    if (!auth || strncmp(auth, "Bearer ", 7) != 0)
        return 0;
    auth += 7;
    /* Digests of equal length, compared in constant time: neither the
     * key's bytes nor its length leak through timing. */
    SHA256((const unsigned char *)api_key, strlen(api_key), want);
    SHA256((const unsigned char *)auth, strlen(auth), got);
    return CRYPTO_memcmp(want, got, sizeof(want)) == 0;
}

/* ---- the provider API ---- */

/* Executes the reserved request: 1, or 0 when the store refused it after
 * all (the key given back: no fault to add). */
static int execute_op(struct req *r, struct psp_answer *ans)
{
    switch (r->op) {
    case OP_CANCEL:
        return psp_store_cancel_execute(store, &r->cancel, now_ms(), ans);
    case OP_REFUND:
        return psp_store_refund_execute(store, &r->refund, now_ms(), ans);
    case OP_CAPTURE:
        return psp_store_capture_execute(store, &r->capture, now_ms(), ans);
    case OP_CHARGE:
        break;
    }
    psp_store_execute(store, &r->charge, now_ms(), ans);
    return 1;
}

/* Executes the reserved charge, cancel, capture or refund, then applies
 * the after-execute faults. */
static enum MHD_Result execute_and_answer(struct req *r)
{
    struct psp_answer ans = {0};
    const char *key = r->idem_key;
    /* A rule for a payment method is about charges: a cancel, a capture or
     * a refund names none. */
    const char *pm = r->op == OP_CHARGE ? r->charge.payment_method : NULL;

    int executed = execute_op(r, &ans);
    r->executing = 0;
    if (!executed) /* refused, the key given back: no fault to add */
        return respond(r->conn, ans.status, ans.body, 0);
    if (psp_faults_hit(faults, PSP_FAULT_DROP_AFTER, key, pm, r->seq)) {
        free(ans.body);
        return MHD_NO; /* closes the connection without an answer */
    }
    if (psp_faults_hit(faults, PSP_FAULT_STALL_AFTER, key, pm, r->seq)) {
        free(ans.body);
        r->state = ST_STALLED;
        suspend_for(r->conn, psp_faults_stall_ms(faults));
        return MHD_YES;
    }
    if (psp_faults_hit(faults, PSP_FAULT_ERROR_AFTER, key, pm, r->seq)) {
        free(ans.body);
        return respond_error(
            r->conn, 500, "api_error",
            "An unexpected error occurred (injected after executing).");
    }
    return respond(r->conn, ans.status, ans.body, ans.replayed);
}

static int utf8(const char *s)
{
    json_t *probe = json_string(s); /* NULL when it is not UTF-8 */
    json_decref(probe);
    return probe != NULL;
}

/* What every POST checks before its parameters: its size, its form and its
 * Idempotency-Key (kept in r->idem_key). 0, or -1 with *rc the refusal. */
static int take_form_and_key(struct req *r, enum MHD_Result *rc)
{
    /* Of the headers only this one matters: Stripe-Version and the like are
     * ignored, the simulator speaks one API version. */
    const char *hk =
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Idempotency-Key");

    r->charging = 1;
    psp_store_charge_began(store);
    if (r->too_large)
        *rc =
            respond_error(r->conn, 413, "invalid_request_error", "Request too large.");
    else if (parse_form(r) != 0)
        *rc = respond_error(r->conn, 500, "api_error", "out of memory");
    else if (r->form_bad)
        *rc = respond_error(r->conn, 400, "invalid_request_error",
                            "Form parameters must be UTF-8 without NUL bytes.");
    else if (hk && (!*hk || strlen(hk) > 255))
        *rc = respond_error(r->conn, 400, "invalid_request_error",
                            "Idempotency-Key must be 1..255 characters.");
    else if (hk && !utf8(hk))
        /* Kept in the ledger and the state file, which are JSON. */
        *rc = respond_error(r->conn, 400, "invalid_request_error",
                            "Idempotency-Key must be UTF-8.");
    else if (hk && !(r->idem_key = strdup(hk)))
        *rc = respond_error(r->conn, 500, "api_error", "out of memory");
    else
        return 0;
    return -1;
}

/* The faults before executing, then the store's begin; the key stays
 * reserved over any latency, and a request with it meanwhile gets 409, as
 * at a real provider. */
static enum MHD_Result begin_and_execute(struct req *r)
{
    struct psp_answer ans = {0};
    const char *pm = r->op == OP_CHARGE ? r->charge.payment_method : NULL;
    enum psp_begin begun;

    r->seq = psp_faults_next_seq(faults, r->idem_key);
    if (psp_faults_hit(faults, PSP_FAULT_RATE_LIMIT, r->idem_key, pm, r->seq))
        return respond_error(r->conn, 429, "rate_limit_error",
                             "Too many requests (injected).");
    if (psp_faults_hit(faults, PSP_FAULT_ERROR_BEFORE, r->idem_key, pm, r->seq))
        return respond_error(r->conn, 500, "api_error",
                             "An unexpected error occurred (injected, not executed).");
    begun =
        r->op == OP_CANCEL   ? psp_store_cancel_begin(store, &r->cancel, now_ms(), &ans)
        : r->op == OP_REFUND ? psp_store_refund_begin(store, &r->refund, now_ms(), &ans)
        : r->op == OP_CAPTURE
            ? psp_store_capture_begin(store, &r->capture, now_ms(), &ans)
            : psp_store_begin(store, &r->charge, now_ms(), &ans);
    if (begun == PSP_BEGIN_ANSWERED)
        return respond(r->conn, ans.status, ans.body, ans.replayed);
    r->executing = 1;
    int64_t delay = psp_faults_latency_ms(faults, r->idem_key, r->seq);
    if (delay > 0) {
        r->state = ST_DELAYED;
        suspend_for(r->conn, delay);
        return MHD_YES;
    }
    return execute_and_answer(r);
}

static enum MHD_Result create_intent(struct req *r)
{
    enum MHD_Result rc;

    if (take_form_and_key(r, &rc) != 0)
        return rc;
    r->op = OP_CHARGE;
    r->charge = (struct psp_charge_request){
        .idempotency_key = r->idem_key,
        .amount = form_get(r, "amount"),
        .currency = form_get(r, "currency"),
        .payment_method = form_get(r, "payment_method"),
        .confirm = form_get(r, "confirm"),
        .capture_method = form_get(r, "capture_method"),
        .payment_attempt_id = form_get(r, "metadata[payment_attempt_id]"),
        .order_id = form_get(r, "metadata[order_id]"),
        .customer = form_get(r, "customer"),
        .apm_enabled = form_get(r, "automatic_payment_methods[enabled]"),
        .apm_allow_redirects =
            form_get(r, "automatic_payment_methods[allow_redirects]"),
        .body = r->body ? r->body : "",
    };
    return begin_and_execute(r);
}

/* POST /v1/payment_intents/<id>/cancel: takes r->intent_id. */
static enum MHD_Result cancel_intent(struct req *r)
{
    enum MHD_Result rc;
    const char *unknown = NULL;

    if (take_form_and_key(r, &rc) != 0)
        return rc;
    for (size_t i = 0; i < r->nform && !unknown; i++)
        if (strcmp(r->form[i].k, "cancellation_reason") != 0)
            unknown = r->form[i].k;
    r->op = OP_CANCEL;
    r->cancel = (struct psp_cancel_request){
        .idempotency_key = r->idem_key,
        .payment_intent_id = r->intent_id,
        .cancellation_reason = form_get(r, "cancellation_reason"),
        .unknown_parameter = unknown,
        .body = r->body ? r->body : "",
    };
    return begin_and_execute(r);
}

/* POST /v1/payment_intents/<id>/capture: takes r->intent_id;
 * amount_to_capture, any other parameter is refused by the store. */
static enum MHD_Result capture_intent(struct req *r)
{
    enum MHD_Result rc;
    const char *unknown = NULL;

    if (take_form_and_key(r, &rc) != 0)
        return rc;
    for (size_t i = 0; i < r->nform && !unknown; i++)
        if (strcmp(r->form[i].k, "amount_to_capture") != 0)
            unknown = r->form[i].k;
    r->op = OP_CAPTURE;
    r->capture = (struct psp_capture_request){
        .idempotency_key = r->idem_key,
        .payment_intent_id = r->intent_id,
        .amount_to_capture = form_get(r, "amount_to_capture"),
        .unknown_parameter = unknown,
        .body = r->body ? r->body : "",
    };
    return begin_and_execute(r);
}

/* POST /v1/refunds: payment_intent, amount, reason and metadata[...]; any
 * other parameter is refused by the store. */
static enum MHD_Result create_refund(struct req *r)
{
    enum MHD_Result rc;
    const char *unknown = NULL;

    if (take_form_and_key(r, &rc) != 0)
        return rc;
    if (!(r->metadata = json_object()))
        return respond_error(r->conn, 500, "api_error", "out of memory");
    for (size_t i = 0; i < r->nform; i++) {
        const char *k = r->form[i].k;
        size_t n = strlen(k);
        if (n > 10 && !strncmp(k, "metadata[", 9) && k[n - 1] == ']') {
            char *name = strndup(k + 9, n - 10);
            if (name)
                json_object_set_new(r->metadata, name, json_string(r->form[i].v));
            free(name);
        } else if (strcmp(k, "payment_intent") && strcmp(k, "amount") &&
                   strcmp(k, "reason") && !unknown) {
            unknown = k;
        }
    }
    r->op = OP_REFUND;
    r->refund = (struct psp_refund_request){
        .idempotency_key = r->idem_key,
        .payment_intent = form_get(r, "payment_intent"),
        .amount = form_get(r, "amount"),
        .reason = form_get(r, "reason"),
        .metadata = r->metadata,
        .unknown_parameter = unknown,
        .body = r->body ? r->body : "",
    };
    return begin_and_execute(r);
}

/* "/<id><suffix>" -> <id> (a copy), else NULL. */
static char *intent_target(const char *rest, const char *suffix)
{
    size_t sl = strlen(suffix), n = strlen(rest);
    if (n <= 1 + sl || rest[0] != '/' || strcmp(rest + n - sl, suffix) != 0)
        return NULL;
    char *id = strndup(rest + 1, n - 1 - sl);
    if (id && strchr(id, '/')) {
        free(id);
        return NULL;
    }
    return id;
}

/* metadata['payment_attempt_id']:'<id>' -> <id> */
static char *parse_search(const char *q)
{
    const char *prefix = "metadata['payment_attempt_id']:'";
    size_t pl = strlen(prefix), n;
    if (!q || strncmp(q, prefix, pl) != 0)
        return NULL;
    q += pl;
    n = strlen(q);
    if (n < 1 || q[n - 1] != '\'')
        return NULL;
    char *id = strndup(q, n - 1);
    if (id && strchr(id, '\'')) {
        free(id);
        return NULL;
    }
    return id;
}

/* The list's query, as Stripe takes it: created (exact), created[gt],
 * [gte], [lt], [lte] in unix seconds, limit 1..100 (default 10),
 * starting_after, customer. Anything else is refused, as Stripe refuses an
 * unknown parameter. */
struct list_args {
    struct psp_list_query q;
    int refunds; /* GET /v1/refunds: payment_intent instead of customer */
    const char *payment_intent;
    char bad[160];
};

static enum MHD_Result list_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                                const char *value)
{
    static const char *bounds[] = {"created", "created[gt]", "created[gte]",
                                   "created[lt]", "created[lte]"};
    struct list_args *a = cls;
    long v;
    (void)kind;
    if (a->bad[0])
        return MHD_NO;
    for (int i = 0; i < 5; i++) {
        if (strcmp(key, bounds[i]) != 0)
            continue;
        if (!value || parse_long(value, 0, LONG_MAX - 1, &v) != 0) {
            snprintf(a->bad, sizeof(a->bad), "Invalid integer: %s.", key);
            return MHD_NO;
        }
        /* All as [gte, lt). */
        int64_t gte = i == 0 || i == 2 ? v : i == 1 ? v + 1 : INT64_MIN;
        int64_t lt = i == 0 ? v + 1 : i == 3 ? v : i == 4 ? v + 1 : INT64_MAX;
        if (gte > a->q.created_gte)
            a->q.created_gte = gte;
        if (lt < a->q.created_lt)
            a->q.created_lt = lt;
        return MHD_YES;
    }
    if (!strcmp(key, "limit")) {
        if (!value || parse_long(value, 1, 100, &v) != 0) {
            snprintf(a->bad, sizeof(a->bad), "limit must be an integer from 1 to 100.");
            return MHD_NO;
        }
        a->q.limit = (int)v;
    } else if (!strcmp(key, "starting_after") && value && *value) {
        a->q.starting_after = value;
    } else if (!a->refunds && !strcmp(key, "customer") && value && *value) {
        a->q.customer = value;
    } else if (a->refunds && !strcmp(key, "payment_intent") && value && *value) {
        a->payment_intent = value;
    } else {
        /* Key and value come from the client: printable ASCII, cut. */
        char shown[65];
        size_t i;
        for (i = 0; key[i] && i < 64; i++)
            shown[i] = key[i] > 0x20 && key[i] < 0x7f ? key[i] : '?';
        shown[i] = '\0';
        snprintf(a->bad, sizeof(a->bad), "Received unknown parameter: %s", shown);
        return MHD_NO;
    }
    return MHD_YES;
}

static enum MHD_Result list_intents(struct req *r)
{
    struct psp_answer ans = {0};
    struct list_args a = {.q = {INT64_MIN, INT64_MAX, 10, NULL, NULL}};

    psp_store_count(store, PSP_C_REQUESTS);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, list_arg, &a);
    if (a.bad[0])
        return respond_error(r->conn, 400, "invalid_request_error", a.bad);
    psp_store_list(store, &a.q, now_ms(), &ans);
    return respond(r->conn, ans.status, ans.body, 0);
}

/* GET /v1/refunds: as the intents' list, by payment_intent instead of
 * customer. */
static enum MHD_Result list_refunds(struct req *r)
{
    struct psp_answer ans = {0};
    struct list_args a = {.q = {INT64_MIN, INT64_MAX, 10, NULL, NULL}, .refunds = 1};

    psp_store_count(store, PSP_C_REQUESTS);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, list_arg, &a);
    if (a.bad[0])
        return respond_error(r->conn, 400, "invalid_request_error", a.bad);
    struct psp_refund_list_query q = {a.q.created_gte, a.q.created_lt, a.q.limit,
                                      a.q.starting_after, a.payment_intent};
    psp_store_refund_list(store, &q, now_ms(), &ans);
    return respond(r->conn, ans.status, ans.body, 0);
}

/* /v1/refunds[/<id>] */
static enum MHD_Result refunds_api(struct req *r, const char *rest, const char *method)
{
    struct psp_answer ans = {0};

    if (!strcmp(method, "POST") && !*rest)
        return create_refund(r);
    if (!strcmp(method, "GET") && !*rest)
        return list_refunds(r);
    if (!strcmp(method, "GET") && rest[0] == '/' && rest[1] && !strchr(rest + 1, '/')) {
        psp_store_count(store, PSP_C_REQUESTS);
        psp_store_refund_retrieve(store, rest + 1, now_ms(), &ans);
        return respond(r->conn, ans.status, ans.body, 0);
    }
    return respond_error(r->conn, 405, "invalid_request_error", "Method not allowed.");
}

static enum MHD_Result provider_api(struct req *r, const char *url, const char *method)
{
    struct psp_answer ans = {0};
    const char *base = "/v1/payment_intents", *refunds = "/v1/refunds";
    size_t bl = strlen(base), rl = strlen(refunds);

    if (!strncmp(url, refunds, rl) && (url[rl] == '\0' || url[rl] == '/')) {
        if (!authorized(r->conn))
            return respond_error(r->conn, 401, "invalid_request_error",
                                 "Invalid API Key provided.");
        return refunds_api(r, url + rl, method);
    }
    if (strncmp(url, base, bl) != 0 || (url[bl] != '\0' && url[bl] != '/'))
        return respond_error(r->conn, 404, "invalid_request_error",
                             "Unrecognized request URL.");
    if (!authorized(r->conn))
        return respond_error(r->conn, 401, "invalid_request_error",
                             "Invalid API Key provided.");
    if (!strcmp(method, "POST") && url[bl] == '\0')
        return create_intent(r);
    if (!strcmp(method, "POST") &&
        (r->intent_id = intent_target(url + bl, "/cancel")) != NULL)
        return cancel_intent(r);
    if (!strcmp(method, "POST") &&
        (r->intent_id = intent_target(url + bl, "/capture")) != NULL)
        return capture_intent(r);
    if (!strcmp(method, "GET") && url[bl] == '\0')
        return list_intents(r);
    if (!strcmp(method, "GET") && !strcmp(url + bl, "/search")) {
        psp_store_count(store, PSP_C_REQUESTS);
        char *id = parse_search(
            MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "query"));
        if (!id)
            return respond_error(
                r->conn, 400, "invalid_request_error",
                "query must be metadata['payment_attempt_id']:'<id>'.");
        psp_store_search(store, id, now_ms(), &ans);
        free(id);
        return respond(r->conn, ans.status, ans.body, 0);
    }
    if (!strcmp(method, "GET") && url[bl] == '/' && url[bl + 1] &&
        !strchr(url + bl + 1, '/')) {
        psp_store_count(store, PSP_C_REQUESTS);
        psp_store_retrieve(store, url + bl + 1, now_ms(), &ans);
        return respond(r->conn, ans.status, ans.body, 0);
    }
    return respond_error(r->conn, 405, "invalid_request_error", "Method not allowed.");
}

/* ---- the admin API ---- */

/* "<prefix><id><suffix>" -> <id> (a copy) when id is not empty and holds
 * no '/', else NULL. */
static char *path_id(const char *url, const char *prefix, const char *suffix)
{
    size_t pl = strlen(prefix), sl = strlen(suffix), n = strlen(url);
    if (n <= pl + sl || strncmp(url, prefix, pl) != 0 ||
        strcmp(url + n - sl, suffix) != 0)
        return NULL;
    char *id = strndup(url + pl, n - pl - sl);
    if (id && strchr(id, '/')) {
        free(id);
        return NULL;
    }
    return id;
}

/* POST /refunds/<id>/settle {"status":"succeeded"|"failed",
 * "failure_reason":...} */
static enum MHD_Result settle_refund(struct req *r, const char *id)
{
    struct psp_answer ans = {0};
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr), *v;
    json_t *why = json_object_get(body, "failure_reason");
    const char *k, *reason = json_string_value(why);
    size_t n = reason ? strlen(reason) : 0;

    if (!json_is_object(body)) {
        json_decref(body);
        return respond_error(r->conn, 400, "invalid_request_error",
                             "body must be a JSON object");
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "status") && strcmp(k, "failure_reason")) {
            json_decref(body);
            return respond_error(r->conn, 400, "invalid_request_error",
                                 "members: status, failure_reason");
        }
    }
    /* It goes into every answer about the refund: Stripe's shape only. */
    if (why && !json_is_null(why) &&
        (n < 1 || n > 64 ||
         strspn(reason, "abcdefghijklmnopqrstuvwxyz0123456789_") != n)) {
        json_decref(body);
        return respond_error(r->conn, 400, "invalid_request_error",
                             "failure_reason must be 1..64 of a-z, 0-9 and _");
    }
    psp_store_refund_settle(store, id,
                            json_string_value(json_object_get(body, "status")), reason,
                            now_ms(), &ans);
    json_decref(body);
    return respond(r->conn, ans.status, ans.body, 0);
}

/* POST /intents/<id>/settle {"status":..., "decline_code":...} */
static enum MHD_Result settle_intent(struct req *r, const char *id)
{
    char err[256];
    struct psp_settlement set;
    struct psp_answer ans = {0};
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);

    if (!body || psp_settlement_parse(body, &set, err, sizeof(err)) != 0) {
        json_decref(body);
        return respond_error(r->conn, 400, "invalid_request_error",
                             body ? err : "body is not JSON");
    }
    psp_store_settle(store, id, &set, now_ms(), &ans);
    json_decref(body);
    return respond(r->conn, ans.status, ans.body, 0);
}

/* The admin calls whose JSON body the store checks itself. */
enum store_call { CALL_INJECT_INTENTS, CALL_INJECT_REFUND, CALL_AMEND };

static enum MHD_Result with_json_body(struct req *r, enum store_call call,
                                      const char *id)
{
    struct psp_answer ans = {0};
    json_error_t jerr;
    json_t *body;

    if (r->too_large)
        return respond_error(r->conn, 413, "invalid_request_error",
                             "Request too large.");
    if (!(body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr)))
        return respond_error(r->conn, 400, "invalid_request_error", "body is not JSON");
    switch (call) {
    case CALL_INJECT_INTENTS:
        psp_store_inject_intents(store, body, now_ms(), &ans);
        break;
    case CALL_INJECT_REFUND:
        psp_store_inject_refund(store, body, now_ms(), &ans);
        break;
    case CALL_AMEND:
        psp_store_amend(store, id, body, now_ms(), &ans);
        break;
    }
    json_decref(body);
    return respond(r->conn, ans.status, ans.body, 0);
}

/* PUT /<name> {"<member>": <integer in min..max>}: one delay setting. */
static enum MHD_Result put_ms(struct req *r, const char *member, json_int_t min,
                              json_int_t max, void (*set)(psp_store_t *, int64_t))
{
    json_error_t jerr;
    json_t *cfg = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
    json_t *ms = json_object_get(cfg, member);
    if (!json_is_integer(ms) || json_integer_value(ms) < min ||
        json_integer_value(ms) > max) {
        char err[160];
        snprintf(err, sizeof(err), "body must be {\"%s\": <integer %lld..%lld>}",
                 member, (long long)min, (long long)max);
        json_decref(cfg);
        return respond_error(r->conn, 400, "invalid_request_error", err);
    }
    set(store, json_integer_value(ms));
    json_decref(cfg);
    return respond_json(r->conn, 200, json_pack("{s:b}", "ok", 1));
}

/* A delay in 0..86400000 ms. */
static enum MHD_Result put_delay(struct req *r, const char *member,
                                 void (*set)(psp_store_t *, int64_t))
{
    return put_ms(r, member, 0, 86400000, set);
}

/* As the intent would be had it entered `status`: crafted events may
 * contradict what psp-sim knows. */
static void override_status(json_t *pi, const char *status)
{
    const char *now = json_string_value(json_object_get(pi, "status"));
    if (now && !strcmp(now, status))
        return;
    json_object_set_new(pi, "status", json_string(status));
    if (!strcmp(status, "requires_payment_method")) {
        if (!json_is_object(json_object_get(pi, "last_payment_error")))
            json_object_set_new(pi, "last_payment_error",
                                json_pack("{s:s, s:s, s:s, s:s}", "type", "card_error",
                                          "code", "card_declined", "decline_code",
                                          "generic_decline", "message",
                                          "Your card was declined."));
    } else {
        json_object_set_new(pi, "last_payment_error", json_null());
    }
    if (!strcmp(status, "canceled"))
        json_object_set_new(pi, "canceled_at", json_integer(now_ms() / 1000));
}

/* Event ids go into logs: printable ASCII without spaces, 1..255. */
static int event_id_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= 0x20 || s[i] >= 0x7f)
            return 0;
    return n >= 1 && n <= 255;
}

/* POST /webhooks/emit {"intent":"pi_..." or "object":{...}, "type":...,
 * "created":<unix>, "id":"evt_..."}: a crafted event, queued as any other. */
static enum MHD_Result emit_event(struct req *r)
{
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
    json_t *pi = NULL, *v, *object = json_object_get(body, "object");
    json_t *intent = json_object_get(body, "intent");
    const char *k, *type = json_string_value(json_object_get(body, "type"));
    const char *status = psp_webhooks_status_for_type(type), *id = NULL;
    json_int_t created = now_ms() / 1000;
    char err[200] = "", evt[300];
    int http = 400;
    enum MHD_Result rc;

    if (!json_is_object(body)) {
        snprintf(err, sizeof(err), "body must be a JSON object");
        goto out;
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "intent") && strcmp(k, "object") && strcmp(k, "type") &&
            strcmp(k, "created") && strcmp(k, "id")) {
            snprintf(err, sizeof(err), "unknown member '%.64s'", k);
            goto out;
        }
    }
    if (!status) {
        snprintf(err, sizeof(err),
                 "type must be payment_intent.succeeded, payment_intent.processing, "
                 "payment_intent.payment_failed, payment_intent.canceled or "
                 "payment_intent.amount_capturable_updated");
        goto out;
    }
    if ((v = json_object_get(body, "created")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(err, sizeof(err),
                     "created must be an integer >= 0 (unix seconds)");
            goto out;
        }
        created = json_integer_value(v);
    }
    if ((v = json_object_get(body, "id")) != NULL &&
        !event_id_valid(id = json_string_value(v))) {
        snprintf(err, sizeof(err),
                 "id must be 1..255 printable ASCII characters without spaces");
        goto out;
    }
    if (!intent == !object || (intent && !json_is_string(intent)) ||
        (object && !json_is_object(object))) {
        snprintf(err, sizeof(err),
                 "give either intent (a payment intent id) or object (a PaymentIntent "
                 "object)");
        goto out;
    }
    if (object) {
        pi = json_incref(object); /* sent as given, about any intent */
    } else {
        struct psp_answer ans = {0};
        psp_store_retrieve(store, json_string_value(intent), now_ms(), &ans);
        if (ans.status != 200) {
            json_decref(body);
            return respond(r->conn, ans.status, ans.body, 0);
        }
        pi = json_loads(ans.body, 0, &jerr);
        free(ans.body);
        if (!pi) {
            http = 500;
            snprintf(err, sizeof(err), "out of memory");
            goto out;
        }
        override_status(pi, status);
    }
    switch (psp_webhooks_enqueue(webhooks, type, pi, created, id, evt, sizeof(evt))) {
    case PSP_WH_QUEUED: {
        /* type points into body: the answer is made before body goes. */
        json_t *ans = json_pack("{s:s, s:s}", "id", evt, "type", type);
        json_decref(pi);
        json_decref(body);
        return respond_json(r->conn, 200, ans);
    }
    case PSP_WH_DISABLED:
        http = 409;
        snprintf(err, sizeof(err),
                 "psp-sim runs without --webhook-url: it sends no events");
        break;
    case PSP_WH_DROPPED:
        http = 503;
        snprintf(err, sizeof(err), "the webhook queue is full: the event was dropped");
        break;
    }
out:
    rc = respond_error(r->conn, http, "invalid_request_error", err);
    json_decref(pi);
    json_decref(body);
    return rc;
}

/* POST /webhook-secret {"secret":"...","keep_old":true|false}. Nothing
 * about the body is echoed: it holds a secret. */
static enum MHD_Result rotate_secret(struct req *r)
{
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr), *v;
    json_t *keep = json_object_get(body, "keep_old");
    const char *k;
    char err[160] = "";

    if (!json_is_object(body)) {
        snprintf(err, sizeof(err), "body must be a JSON object");
        goto out;
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "secret") && strcmp(k, "keep_old")) {
            snprintf(err, sizeof(err), "unknown member '%.64s'", k);
            goto out;
        }
    }
    if (keep && !json_is_boolean(keep)) {
        snprintf(err, sizeof(err), "keep_old must be true or false");
        goto out;
    }
    if (psp_webhooks_rotate(webhooks,
                            json_string_value(json_object_get(body, "secret")),
                            json_is_true(keep), err, sizeof(err)) != 0)
        goto out;
    json_decref(body);
    json_t *stats = psp_webhooks_stats_json(webhooks);
    json_t *ans = json_pack("{s:b, s:O}", "ok", 1, "signing_secrets",
                            json_object_get(stats, "signing_secrets"));
    json_decref(stats);
    return respond_json(r->conn, 200, ans);
out:
    json_decref(body);
    return respond_error(r->conn, 400, "invalid_request_error", err);
}

/* GET /webhooks/events?limit=N (1..1000, default 100) */
static enum MHD_Result list_events(struct req *r)
{
    const char *s =
        MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
    long limit = 100;
    if (s && parse_long(s, 1, 1000, &limit) != 0)
        return respond_error(r->conn, 400, "invalid_request_error",
                             "limit must be an integer in 1..1000");
    return respond_json(r->conn, 200,
                        psp_webhooks_events_json(webhooks, (size_t)limit));
}

static enum MHD_Result admin_api(struct req *r, const char *url, const char *method)
{
    char err[256], *target;
    if (!strcmp(url, "/health"))
        return respond_json(r->conn, 200, json_pack("{s:b}", "ok", 1));
    if (!strcmp(url, "/ledger") && !strcmp(method, "GET"))
        return respond_json(r->conn, 200, psp_store_ledger_json(store, now_ms()));
    if (!strcmp(url, "/reset") && !strcmp(method, "POST")) {
        psp_store_reset(store);
        psp_webhooks_reset(webhooks);
        return respond_json(r->conn, 200, json_pack("{s:b}", "reset", 1));
    }
    if (!strcmp(url, "/faults") && !strcmp(method, "GET"))
        return respond_json(r->conn, 200, psp_faults_json(faults));
    if (!strcmp(url, "/faults") && (!strcmp(method, "PUT") || !strcmp(method, "POST") ||
                                    !strcmp(method, "DELETE"))) {
        json_error_t jerr;
        json_t *cfg = !strcmp(method, "DELETE")
                          ? json_object()
                          : json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
        if (!cfg)
            return respond_error(r->conn, 400, "invalid_request_error",
                                 "body is not JSON");
        int rc = psp_faults_configure(faults, cfg, err, sizeof(err));
        json_decref(cfg);
        if (rc != 0)
            return respond_error(r->conn, 400, "invalid_request_error", err);
        return respond_json(r->conn, 200, psp_faults_json(faults));
    }
    if (!strcmp(url, "/retention") && !strcmp(method, "PUT")) {
        json_error_t jerr;
        json_t *cfg = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
        json_t *ms = json_object_get(cfg, "key_retention_ms");
        if (!json_is_integer(ms) || json_integer_value(ms) < 0) {
            json_decref(cfg);
            return respond_error(r->conn, 400, "invalid_request_error",
                                 "body must be {\"key_retention_ms\": <integer >= 0>}");
        }
        psp_store_set_retention(store, json_integer_value(ms));
        json_decref(cfg);
        return respond_json(r->conn, 200, json_pack("{s:b}", "ok", 1));
    }
    if (!strcmp(url, "/search-lag") && !strcmp(method, "PUT"))
        return put_delay(r, "search_lag_ms", psp_store_set_search_lag);
    if (!strcmp(url, "/processing-settle") && !strcmp(method, "PUT"))
        return put_delay(r, "processing_settle_ms", psp_store_set_processing_settle);
    if (!strcmp(url, "/webhooks") && !strcmp(method, "GET"))
        return respond_json(r->conn, 200, psp_webhooks_stats_json(webhooks));
    if (!strcmp(url, "/webhooks/events") && !strcmp(method, "GET"))
        return list_events(r);
    if (!strcmp(url, "/webhooks/emit") && !strcmp(method, "POST"))
        return emit_event(r);
    if (!strcmp(url, "/webhook-secret") && !strcmp(method, "POST"))
        return rotate_secret(r);
    if (!strcmp(url, "/authorization-expiry") && !strcmp(method, "PUT"))
        return put_ms(r, "authorization_expiry_ms", 1, AUTHORIZATION_EXPIRY_MAX,
                      psp_store_set_authorization_expiry);
    if (!strcmp(url, "/refund-settle") && !strcmp(method, "PUT"))
        return put_delay(r, "refund_settle_ms", psp_store_set_refund_settle);
    if (!strcmp(url, "/inject/intents") && !strcmp(method, "POST"))
        return with_json_body(r, CALL_INJECT_INTENTS, NULL);
    if (!strcmp(url, "/inject/refunds") && !strcmp(method, "POST"))
        return with_json_body(r, CALL_INJECT_REFUND, NULL);
    if (!strcmp(method, "POST") &&
        (target = path_id(url, "/refunds/", "/settle")) != NULL) {
        enum MHD_Result rc = settle_refund(r, target);
        free(target);
        return rc;
    }
    if (!strcmp(method, "POST") &&
        (target = path_id(url, "/intents/", "/settle")) != NULL) {
        enum MHD_Result rc = settle_intent(r, target);
        free(target);
        return rc;
    }
    if (!strcmp(method, "POST") &&
        (target = path_id(url, "/intents/", "/amend")) != NULL) {
        enum MHD_Result rc = with_json_body(r, CALL_AMEND, target);
        free(target);
        return rc;
    }
    if (!strcmp(method, "DELETE") && (target = path_id(url, "/intents/", "")) != NULL) {
        struct psp_answer ans = {0};
        psp_store_delete(store, target, &ans);
        free(target);
        return respond(r->conn, ans.status, ans.body, 0);
    }
    return respond_error(r->conn, 404, "invalid_request_error",
                         "no such admin endpoint");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    int admin = cls != NULL;
    struct req *r = *con_cls;
    (void)version;

    if (!r) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return MHD_NO;
        r->conn = conn;
        *con_cls = r;
        return MHD_YES;
    }
    switch (r->state) {
    case ST_RECEIVING:
        break;
    case ST_DELAYED:
        return execute_and_answer(r);
    case ST_STALLED:
        return MHD_NO; /* the client has given up by now; hang up */
    }
    if (*upload_data_size) {
        if (r->len + *upload_data_size > MAX_BODY) {
            r->too_large = 1;
        } else {
            char *n = realloc(r->body, r->len + *upload_data_size + 1);
            if (!n)
                return MHD_NO;
            r->body = n;
            memcpy(r->body + r->len, upload_data, *upload_data_size);
            r->len += *upload_data_size;
            r->body[r->len] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* Ids in a changing request's URL go into the state file, which is
     * JSON: such a URL that is not UTF-8 names nothing psp-sim could hold.
     * (A GET keeps nothing of it, and answers 404 for the id as it is.) */
    if (strcmp(method, "GET") != 0 && !utf8(url))
        return respond_error(conn, 404, "invalid_request_error",
                             "Unrecognized request URL: not UTF-8.");
    return admin ? admin_api(r, url, method) : provider_api(r, url, method);
}

/* ---- start-up ---- */

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: psp-sim [options]\n"
        "\n"
        "A payment provider for tests: Stripe's PaymentIntents subset of the charged\n"
        "contract, Stripe's idempotency semantics, injected faults and a ledger.\n"
        "\n"
        "Options:\n"
        "  --host ADDR              listen address [127.0.0.1]\n"
        "  --port N                 provider API port; 0: one the kernel picks "
        "[12111]\n"
        "  --admin-port N           admin API port; 0: one the kernel picks [12112]\n"
        "  --api-key KEY            accepted secret (Authorization: Bearer KEY);\n"
        "                           default: $PSP_SIM_API_KEY, else sk_test_charged\n"
        "  --key-retention-ms N     idempotency keys are forgotten after N ms "
        "[86400000]\n"
        "  --threads N              HTTP threads, 1..1024 [2]\n"
        "  --max-connections N      concurrent connections, 1..1000000 [8192]\n"
        "  --seed N                 seed of fault and webhook decisions [1]\n"
        "  --latency-ms N           added to every charge and cancel while its key is\n"
        "                           held [0]\n"
        "  --latency-jitter-ms N    plus a random 0..N ms [0]\n"
        "  --stall-ms N             how long stall_after holds an answer [30000]\n"
        "  --search-lag-ms N        search finds an intent only N ms after its\n"
        "                           creation, as Stripe's lags; retrieve at once [0]\n"
        "  --processing-settle-ms N a processing intent succeeds N ms after its\n"
        "                           creation; 0: only when settled by the admin\n"
        "                           API [0]\n"
        "  --refund-settle-ms N     a pending refund reaches its end N ms after its\n"
        "                           creation; 0: only when settled by the admin\n"
        "                           API [0]\n"
        "                           (the delays: at most 86400000)\n"
        "  --authorization-expiry-ms N\n"
        "                           a requires_capture intent (capture_method=manual)\n"
        "                           is canceled, cancellation_reason automatic, N ms\n"
        "                           after its authorization; 1..31536000000\n"
        "                           [604800000, 7 days]\n"
        "  --fault KIND=P[@TARGET][#TIMES]\n"
        "                           inject KIND with probability P (0..1), optionally\n"
        "                           only for idempotency key TARGET (or payment "
        "method\n"
        "                           TARGET when it starts with pm_), at most TIMES "
        "times.\n"
        "                           Repeatable. KIND is one of:\n"
        "                             error_before  answer 500, nothing executed\n"
        "                             rate_limit    answer 429, nothing executed\n"
        "                             error_after   execute, then answer 500\n"
        "                             stall_after   execute, then hold the answer for\n"
        "                                           --stall-ms and hang up\n"
        "                             drop_after    execute, then close unanswered\n"
        "                           Cancels, captures and refunds get them too, but "
        "for a\n"
        "                           payment method TARGET: only charges name one.\n"
        "  --webhook-url URL        POST an event to URL (http:// or https://) on "
        "every\n"
        "                           change of an intent's status; none: no events\n"
        "  --webhook-secret S       signing secret; default: $PSP_SIM_WEBHOOK_SECRET\n"
        "                           (required with --webhook-url; never printed)\n"
        "  --webhook-duplicate-rate P\n"
        "                           probability (0..1) that an acknowledged event is\n"
        "                           sent once more, --webhook-retry-ms later [0]\n"
        "  --webhook-reorder-rate P probability (0..1) that an event is held back\n"
        "                           until the one behind it has been sent (1 s at\n"
        "                           most) [0]\n"
        "  --webhook-retry-ms N     first back-off after a failed delivery, doubling\n"
        "                           [100]\n"
        "  --webhook-retry-max-ms N back-off cap [2000]\n"
        "  --webhook-timeout-ms N   one delivery's limit, connecting included [5000]\n"
        "  --webhook-queue-max N    deliveries waiting or in flight, at most; more\n"
        "                           are dropped and counted [100000]\n"
        "  --state-file PATH        keep the books in PATH, an append-only journal\n"
        "                           (one JSON record a line, fsync'd before the\n"
        "                           answer), replayed at start: intents, keys with\n"
        "                           their answers and first-use times, refunds,\n"
        "                           cancels, ledger, counters and settings survive\n"
        "                           a restart, a SIGKILL too (a torn last line is\n"
        "                           dropped). Lost: requests in flight (their keys\n"
        "                           are free again), webhook deliveries and events,\n"
        "                           faults, charges_in_flight. Restart it with the\n"
        "                           same flags: they (defaults too) replace the\n"
        "                           settings replayed (PUT /retention...). Default:\n"
        "                           none, all in memory\n"
        "  --help                   this text\n"
        "\n"
        "Once both ports listen, psp-sim prints one line on stdout (its only\n"
        "output there; logs go to stderr), with the ports it bound:\n"
        "  psp-sim listening port=41234 admin_port=41235\n"
        "\n"
        "Provider API (Authorization: Bearer required):\n"
        "  POST /v1/payment_intents           form body: amount, currency (lower "
        "case),\n"
        "                                     payment_method, confirm=true, "
        "off_session,\n"
        "                                     metadata[...], customer=cus_<letters "
        "or\n"
        "                                     digits> (else 400 resource_missing),\n"
        "                                     capture_method=automatic|manual "
        "(manual:\n"
        "                                     200 requires_capture, amount_capturable\n"
        "                                     the amount, amount_received 0),\n"
        "                                     automatic_payment_methods[enabled]=true|"
        "false,\n"
        "                                     "
        "automatic_payment_methods[allow_redirects]=\n"
        "                                     always|never; Idempotency-Key header "
        "(the\n"
        "                                     whole body is its fingerprint; a key\n"
        "                                     belongs to the endpoint it was first\n"
        "                                     used on, elsewhere 400\n"
        "                                     idempotency_error); Stripe-Version is\n"
        "                                     ignored\n"
        "  POST /v1/payment_intents/<id>/cancel\n"
        "                                     form body: cancellation_reason=\n"
        "                                     duplicate|fraudulent|\n"
        "                                     requested_by_customer|abandoned\n"
        "                                     (optional; any other parameter is 400);\n"
        "                                     Idempotency-Key as for a charge (same\n"
        "                                     keys, retention, replays, 409, 400).\n"
        "                                     200: the intent, status canceled,\n"
        "                                     canceled_at, cancellation_reason; 400\n"
        "                                     payment_intent_unexpected_state when it\n"
        "                                     is succeeded or canceled; 404\n"
        "                                     resource_missing for an unknown id;\n"
        "                                     refusals are not stored under the key\n"
        "  POST /v1/payment_intents/<id>/capture\n"
        "                                     form body: amount_to_capture (optional;\n"
        "                                     default all of amount_capturable; any\n"
        "                                     other parameter is 400); "
        "Idempotency-Key\n"
        "                                     as for a charge. 200: the intent,\n"
        "                                     succeeded, amount_received the amount\n"
        "                                     captured, amount_capturable 0 (the rest\n"
        "                                     released); 400 amount_too_large beyond\n"
        "                                     amount_capturable; 400\n"
        "                                     payment_intent_unexpected_state when it\n"
        "                                     is not requires_capture (captured,\n"
        "                                     voided, expired); both with the intent\n"
        "                                     in error.payment_intent; 404 unknown "
        "id;\n"
        "                                     refusals are not stored under the key\n"
        "  GET  /v1/payment_intents?created[gte]=<unix>&created[lt]=<unix>&limit=N\n"
        "       &starting_after=<id>   the list (also created, created[gt],\n"
        "                                     created[lte], customer): newest first\n"
        "                                     (by created, then by creation), limit\n"
        "                                     1..100 [10], has_more; consistent:\n"
        "                                     --search-lag-ms does not apply; a\n"
        "                                     deleted intent (DELETE /intents/<id>)\n"
        "                                     is not listed but still works as\n"
        "                                     starting_after\n"
        "  GET  /v1/payment_intents/<id>\n"
        "  GET  "
        "/v1/payment_intents/search?query=metadata['payment_attempt_id']:'<id>'\n"
        "  Test payment methods: pm_card_visa, pm_card_mastercard (succeed),\n"
        "  pm_card_processing (processing until settled: see\n"
        "  --processing-settle-ms and POST /intents/<id>/settle),\n"
        "  pm_card_chargeDeclined, pm_card_chargeDeclinedInsufficientFunds\n"
        "  (402 card_error). An unknown id is 404 resource_missing.\n"
        "  POST /v1/refunds                   form body: payment_intent, amount\n"
        "                                     (omitted: the rest), reason=duplicate|\n"
        "                                     fraudulent|requested_by_customer,\n"
        "                                     metadata[...]; Idempotency-Key as for a\n"
        "                                     charge. 200: the refund {id re_...,\n"
        "                                     object, amount, charge, currency,\n"
        "                                     payment_intent, status, reason, "
        "metadata,\n"
        "                                     created, failure_reason when failed};\n"
        "                                     404 resource_missing: unknown intent;\n"
        "                                     400 charge_not_refundable: intent not\n"
        "                                     succeeded; 400 amount_too_large: beyond\n"
        "                                     the intent's amount less its refunds\n"
        "                                     that did not fail; 400\n"
        "                                     charge_already_refunded: nothing left;\n"
        "                                     refusals are not stored under the key\n"
        "  GET  /v1/refunds/<id>\n"
        "  GET  /v1/refunds?payment_intent=<pi>&created[gte]=&created[lt]=&limit=N\n"
        "       &starting_after=<re id>       as the intents' list; without\n"
        "                                     payment_intent: every refund; 404\n"
        "                                     resource_missing for an intent it\n"
        "                                     does not have (or deleted)\n"
        "  Refunds of an intent charged with pm_card_refundPending are pending,\n"
        "  then succeed; pm_card_refundPendingFail: pending, then fail\n"
        "  (expired_or_canceled_card); both settle after --refund-settle-ms or by\n"
        "  POST /refunds/<id>/settle. pm_card_refundFail: failed at once\n"
        "  (lost_or_stolen_card). Any other succeeded intent: succeeded. The three\n"
        "  charge as pm_card_visa does.\n"
        "  Intents to cancel: an authorization (requires_capture: a void), a\n"
        "  declined one (requires_payment_method) or a\n"
        "  pm_card_processing one (processing until it settles; never with\n"
        "  --processing-settle-ms 0).\n"
        "\n"
        "Admin API (no auth; bind it to loopback):\n"
        "  GET    /health     {\"ok\":true}\n"
        "  GET    /ledger     every executed charge (idempotency_key,\n"
        "                     payment_intent_id, payment_attempt_id, order_id,\n"
        "                     customer, amount, currency, outcome, http_status,\n"
        "                     at_ms, settled_at_ms) in \"charges\", every executed\n"
        "                     cancel (idempotency_key, payment_intent_id,\n"
        "                     cancellation_reason, previous_status, http_status,\n"
        "                     at_ms) in \"cancels\", and counters; outcome is the\n"
        "                     intent's current one (succeeded, processing,\n"
        "                     declined, canceled); charges_in_flight: charge\n"
        "                     requests received and not yet done with,\n"
        "                     max_charges_in_flight: the most at once; every\n"
        "                     executed refund (idempotency_key,\n"
        "                     provider_refund_id, payment_intent_id, amount,\n"
        "                     currency, reason, metadata, status as it is now,\n"
        "                     failure_reason, http_status, at_ms, settled_at_ms)\n"
        "                     in \"refunds\", refunds executed per refund key in\n"
        "                     \"refund_executions\"; counters refunds,\n"
        "                     refunds_succeeded, refunds_pending,\n"
        "                     refunds_failed, refunds_settled (their status\n"
        "                     counters count injected refunds too, as the outcome\n"
        "                     counters count injected intents); each charge row\n"
        "                     has injected, amended and deleted (true or false),\n"
        "                     each refund row injected; counters intents (those\n"
        "                     psp-sim holds now, deleted ones excluded) and\n"
        "                     refund_objects (refunds it holds). Manual capture:\n"
        "                     every charge row has kind (charge, or\n"
        "                     authorization: outcome requires_capture until\n"
        "                     captured, then succeeded with amount the amount\n"
        "                     captured, or canceled; amount_authorized,\n"
        "                     amount_capturable, amount_received); every cancel\n"
        "                     row kind (cancel, or void with amount_released);\n"
        "                     \"captures\" (kind capture: idempotency_key,\n"
        "                     payment_intent_id, payment_attempt_id, amount,\n"
        "                     amount_to_capture, amount_released, at_ms) and\n"
        "                     \"expiries\" (kind expiry, cancellation_reason\n"
        "                     automatic, amount_released, at_ms); counters\n"
        "                     requires_capture, captures, voids,\n"
        "                     authorizations_expired\n"
        "  POST   /reset      forget keys, intents (injected, amended and deleted\n"
        "                     ones too), refunds, ledger and counters\n"
        "  GET    /faults     fault configuration, how often each rule fired, and\n"
        "                     every fault injected (kind, key, seq)\n"
        "  PUT    /faults     replace it: {\"seed\":1,\"latency_ms\":5,\n"
        "                     \"latency_jitter_ms\":15,\"stall_ms\":30000,\"rules\":\n"
        "                     "
        "[{\"kind\":\"drop_after\",\"probability\":0.1,\"key\":null,\n"
        "                     \"payment_method\":null,\"times\":null}]}\n"
        "  DELETE /faults     no faults, no latency\n"
        "  PUT    /retention  {\"key_retention_ms\":N}\n"
        "  PUT    /search-lag {\"search_lag_ms\":N}  (as --search-lag-ms)\n"
        "  PUT    /authorization-expiry {\"authorization_expiry_ms\":N}\n"
        "                     (as --authorization-expiry-ms)\n"
        "  PUT    /processing-settle {\"processing_settle_ms\":N}\n"
        "                     (as --processing-settle-ms)\n"
        "  POST   /intents/<id>/settle\n"
        "                     {\"status\":\"succeeded\"},\n"
        "                     {\"status\":\"requires_payment_method\",\n"
        "                      \"decline_code\":\"insufficient_funds\"} (default\n"
        "                     generic_decline) or {\"status\":\"canceled\"}: settles\n"
        "                     a processing intent (its ledger row's outcome becomes\n"
        "                     succeeded, declined or canceled); 409 when it is not\n"
        "                     processing, 404 unknown id, 400 bad body\n"
        "  POST   /inject/intents\n"
        "                     {\"count\":1..200000 [1],\"like\":\"pi_...\",\n"
        "                     \"amount\":N,\"currency\":\"usd\",\"metadata\":{...},\n"
        "                     \"status\":\"succeeded\",\"id\":\"pi_bulk{n}\",\n"
        "                     \"created\":<unix>,\"start\":0}, every member\n"
        "                     optional: intents made behind the API's back, as a\n"
        "                     broken integration or the dashboard makes them.\n"
        "                     like: copy that intent's amount, currency,\n"
        "                     customer, payment_method and metadata (members\n"
        "                     given override; without it amount 1000,\n"
        "                     currency usd, pm_card_visa, no customer, metadata\n"
        "                     {}); status succeeded, processing,\n"
        "                     requires_payment_method (declined) or canceled;\n"
        "                     id: default fresh pi_ ids; created: default now;\n"
        "                     metadata values are strings (Stripe's limits:\n"
        "                     50 keys of 1..40 characters, values of 500).\n"
        "                     {n} in id and in metadata values becomes the\n"
        "                     index, start..start+count-1, as 12 zero-padded\n"
        "                     digits; id must hold it when count > 1 and expand\n"
        "                     to 1..255 letters, digits, _ or -. Each is a\n"
        "                     whole intent (retrieve, list, search, cancel,\n"
        "                     settle, refunds) with a ledger row (idempotency_key\n"
        "                     inject_<id>, injected true). No webhook is queued.\n"
        "                     201 {\"count\":N,\"ids\":[the first 100 at most]};\n"
        "                     404 unknown like; 409 when an id is taken (a\n"
        "                     deleted intent's too): nothing made; 400 bad body\n"
        "  POST   /intents/<id>/amend\n"
        "                     {\"amount\":N} and/or {\"currency\":\"eur\"}: the\n"
        "                     intent changed after the fact; its ledger row shows\n"
        "                     the new values and amended true. No webhook. 200\n"
        "                     the intent, 404 unknown id, 400 bad body\n"
        "  DELETE /intents/<id>\n"
        "                     the provider no longer has it: retrieve, search,\n"
        "                     list, cancel and refunds of it are as for an\n"
        "                     unknown id, but a list's starting_after naming it\n"
        "                     keeps its place; its ledger row stays, deleted\n"
        "                     true, and so do its refunds. No webhook. 200\n"
        "                     {\"deleted\":true,\"id\":...}, 404 unknown id\n"
        "  PUT    /refund-settle {\"refund_settle_ms\":N}  (as --refund-settle-ms)\n"
        "  POST   /refunds/<id>/settle\n"
        "                     {\"status\":\"succeeded\"} or {\"status\":\"failed\",\n"
        "                     \"failure_reason\":\"...\"} (default\n"
        "                     expired_or_canceled_card): settles a pending refund,\n"
        "                     or fails a succeeded one (as Stripe's refunds that\n"
        "                     fail later); 409 otherwise, 404 unknown id\n"
        "  POST   /inject/refunds\n"
        "                     {\"payment_intent\":\"pi_...\",\"amount\":N,\n"
        "                     \"status\":\"succeeded\"|\"pending\"|\"failed\",\n"
        "                     \"metadata\":{...},\"created\":<unix>}: a refund made\n"
        "                     out of band, without checking the intent's status\n"
        "                     or what is left to refund (so more than charged\n"
        "                     can be refunded); amount: default the intent's.\n"
        "                     In the refunds list and retrieve, and in the\n"
        "                     ledger's refunds (idempotency_key inject_<re id>,\n"
        "                     injected true); a failed one has failure_reason\n"
        "                     lost_or_stolen_card, a pending one settles as any.\n"
        "                     No webhook. 201 the refund, 404 unknown intent,\n"
        "                     400 bad body\n"
        "  GET    /webhooks   deliveries: {\"url\",\"pending\",\"delivered\" (events\n"
        "                     acknowledged with 2xx),\"sends\" (HTTP attempts),\n"
        "                     \"failures\",\"duplicates\",\"reordered\",\"dropped\",\n"
        "                     \"events\" (queued),\"signing_secrets\"}\n"
        "  GET    /webhooks/events?limit=N\n"
        "                     the last N events queued (1..1000, default 100):\n"
        "                     id, type, intent, created, attempts, acknowledged\n"
        "  POST   /webhooks/emit\n"
        "                     "
        "{\"intent\":\"pi_...\",\"type\":\"payment_intent.succeeded\",\n"
        "                     \"created\":<unix, default now>,\"id\":<default new>}:\n"
        "                     queues a crafted event about a known intent (its\n"
        "                     current state, the status set to match type), or\n"
        "                     with \"object\":{...} instead of \"intent\" about any\n"
        "                     PaymentIntent object, sent as given; 409 without\n"
        "                     --webhook-url, 503 when the queue is full\n"
        "  POST   /webhook-secret\n"
        "                     {\"secret\":\"...\",\"keep_old\":false}: sign with the\n"
        "                     new secret from now on; keep_old: with the old one\n"
        "                     too (a second v1), as during a rotation\n"
        "\n"
        "Webhooks: each change of an intent's status (created succeeded, processing\n"
        "or declined; settled by the admin API or by --processing-settle-ms;\n"
        "canceled by POST /v1/payment_intents/<id>/cancel or by its authorization's\n"
        "expiry; authorized; captured) is an\n"
        "event {\"id\":\"evt_...\",\"object\":\"event\",\"type\",\"created\",\n"
        "\"livemode\":false,\"data\":{\"object\":<the PaymentIntent as retrieve shows\n"
        "it>}}; type: payment_intent.succeeded, payment_intent.processing,\n"
        "payment_intent.payment_failed, payment_intent.canceled or\n"
        "payment_intent.amount_capturable_updated (requires_capture). Each is POSTed\n"
        "with Content-Type: application/json and Stripe-Signature: t=<unix>,\n"
        "v1=<hex HMAC-SHA256(secret, \"<t>.<body>\")>, signed at each send, and\n"
        "sent again until the receiver answers 2xx.\n"
        "Refunds: refund.created when one is made, refund.updated when its status\n"
        "changes, refund.failed when it fails (made failed, or later), with the\n"
        "refund as data.object; charge.refunded each time a refund succeeds, with\n"
        "the intent's charge {id ch_..., object charge, amount, amount_refunded,\n"
        "currency, payment_intent, refunded, status, metadata, created, refunds}.\n"
        "POST /reset also drops pending deliveries and zeroes their counters.\n"
        "Injections, amendments and deletions (admin API) queue no event; later\n"
        "changes of an injected intent or refund (settle, cancel) do.\n"
        "\n"
        "Exit status: 0 after SIGTERM/SIGINT, 1 when it cannot listen or use its\n"
        "--state-file, 2 on bad usage.\n");
}

static int parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A probability: a number in 0..1. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 1))
        return -1;
    *out = v;
    return 0;
}

/* KIND=P[@TARGET][#TIMES] */
static int parse_fault(const char *spec)
{
    char buf[512], *eq, *at, *hash, *end;
    long times = -1;
    int kind;
    double p;

    snprintf(buf, sizeof(buf), "%s", spec);
    eq = strchr(buf, '=');
    if (!eq)
        return -1;
    *eq = '\0';
    kind = psp_fault_parse(buf);
    hash = strchr(eq + 1, '#');
    if (hash) {
        *hash = '\0';
        if (parse_long(hash + 1, 0, LONG_MAX, &times) != 0)
            return -1;
    }
    at = strchr(eq + 1, '@');
    if (at)
        *at++ = '\0';
    errno = 0;
    p = strtod(eq + 1, &end);
    if (kind < 0 || errno || end == eq + 1 || *end || p < 0 || p > 1)
        return -1;
    int is_pm = at && !strncmp(at, "pm_", 3);
    return psp_faults_add(faults, (enum psp_fault_kind)kind, p,
                          at && !is_pm ? at : NULL, is_pm ? at : NULL, times);
}

/* The long name of the option whose getopt value is val. */
static const char *flag_name(const struct option *opts, int val)
{
    for (; opts->name; opts++)
        if (opts->val == val)
            return opts->name;
    return "?";
}

static int replay_record(void *ctx, json_t *record)
{
    return psp_store_replay(ctx, record);
}

static void journal_record(void *ctx, json_t *record)
{
    psp_journal_append(ctx, record);
}

/* Bound ports as libmicrohttpd reports them: with --port 0 the kernel chose. */
static unsigned bound_port(struct MHD_Daemon *d)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"host", required_argument, NULL, 'H'},
        {"port", required_argument, NULL, 'p'},
        {"admin-port", required_argument, NULL, 'a'},
        {"api-key", required_argument, NULL, 'k'},
        {"key-retention-ms", required_argument, NULL, 'r'},
        {"threads", required_argument, NULL, 't'},
        {"max-connections", required_argument, NULL, 'c'},
        {"seed", required_argument, NULL, 's'},
        {"latency-ms", required_argument, NULL, 'l'},
        {"latency-jitter-ms", required_argument, NULL, 'j'},
        {"stall-ms", required_argument, NULL, 'S'},
        {"fault", required_argument, NULL, 'f'},
        {"search-lag-ms", required_argument, NULL, 'L'},
        {"processing-settle-ms", required_argument, NULL, 'P'},
        {"refund-settle-ms", required_argument, NULL, 'R'},
        {"authorization-expiry-ms", required_argument, NULL, 'X'},
        {"webhook-url", required_argument, NULL, 'U'},
        {"webhook-secret", required_argument, NULL, 'W'},
        {"webhook-duplicate-rate", required_argument, NULL, 'D'},
        {"webhook-reorder-rate", required_argument, NULL, 'O'},
        {"webhook-retry-ms", required_argument, NULL, 'B'},
        {"webhook-retry-max-ms", required_argument, NULL, 'M'},
        {"webhook-timeout-ms", required_argument, NULL, 'T'},
        {"webhook-queue-max", required_argument, NULL, 'Q'},
        {"state-file", required_argument, NULL, 'J'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    const char *host = "127.0.0.1";
    long port = 12111, admin_port = 12112, retention = 86400000L, threads = 2;
    long max_conn = 8192, seed = 1, latency = 0, jitter = 0, stall = 30000;
    long search_lag = 0, settle = 0, refund_settle = 0;
    long auth_expiry = PSP_AUTHORIZATION_EXPIRY_MS;
    long wh_retry = 100, wh_retry_max = 2000, wh_timeout = 5000, wh_queue = 100000;
    double wh_duplicate = 0, wh_reorder = 0;
    const char *wh_url = NULL, *wh_secret = getenv("PSP_SIM_WEBHOOK_SECRET");
    const char *state_file = NULL;
    int secret_from_flag = 0;
    /* Numeric flags and the values each takes: ports are 0 (the kernel
     * picks) to 65535, counts go to libmicrohttpd as unsigned, and delays
     * stop at a day so that now + delay cannot overflow. */
    const struct {
        int val;
        long *target, min, max;
    } nums[] = {
        {'p', &port, 0, 65535},
        {'a', &admin_port, 0, 65535},
        {'r', &retention, 0, LONG_MAX},
        {'t', &threads, 1, 1024},
        {'c', &max_conn, 1, 1000000},
        {'s', &seed, 0, LONG_MAX},
        {'l', &latency, 0, 86400000},
        {'j', &jitter, 0, 86400000},
        {'S', &stall, 0, 86400000},
        {'L', &search_lag, 0, 86400000},
        {'P', &settle, 0, 86400000},
        {'R', &refund_settle, 0, 86400000},
        {'B', &wh_retry, 1, 86400000},
        {'M', &wh_retry_max, 1, 86400000},
        {'T', &wh_timeout, 1, 86400000},
        {'Q', &wh_queue, 1, 10000000},
        {'X', &auth_expiry, 1, AUTHORIZATION_EXPIRY_MAX},
    };
    const char *fault_specs[64];
    int nfaults = 0, c, rc = 1, key_from_flag = 0;
    struct MHD_Daemon *d = NULL, *ad = NULL;
    pthread_t timer, settler;
    int settler_started = 0;
    struct sockaddr_in sa = {0}, asa = {0};
    sigset_t block, old;

    api_key = getenv("PSP_SIM_API_KEY") ? strdup(getenv("PSP_SIM_API_KEY"))
                                        : strdup("sk_test_charged");
    opterr = 0; /* we say it ourselves, in one line */
    /* The leading ':' makes a missing value ':' (optopt names the flag). */
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
        size_t i;
        switch (c) {
        case 'H':
            host = optarg;
            continue;
        case 'k':
            free(api_key);
            api_key = strdup(optarg);
            key_from_flag = 1;
            continue;
        case 'U':
            wh_url = optarg;
            continue;
        case 'J':
            state_file = optarg;
            continue;
        case 'W':
            wh_secret = optarg;
            secret_from_flag = 1;
            continue;
        case 'D':
        case 'O':
            if (parse_rate(optarg, c == 'D' ? &wh_duplicate : &wh_reorder) != 0) {
                fprintf(stderr, "psp-sim: --%s: '%s' is not a number in 0..1\n",
                        flag_name(opts, c), optarg);
                free(api_key);
                return 2;
            }
            continue;
        case 'f':
            if (nfaults == 64) {
                fprintf(stderr, "psp-sim: --fault: at most 64 of them\n");
                free(api_key);
                return 2;
            }
            fault_specs[nfaults++] = optarg;
            continue;
        case 'h':
            usage(stdout);
            free(api_key);
            return 0;
        case ':':
            fprintf(stderr, "psp-sim: --%s needs a value (see psp-sim --help)\n",
                    flag_name(opts, optopt));
            free(api_key);
            return 2;
        default:
            break;
        }
        for (i = 0; i < sizeof(nums) / sizeof(nums[0]) && nums[i].val != c; i++)
            ;
        if (i == sizeof(nums) / sizeof(nums[0])) {
            fprintf(stderr, "psp-sim: bad option '%s' (see psp-sim --help)\n",
                    argv[optind - 1]);
            free(api_key);
            return 2;
        }
        if (parse_long(optarg, nums[i].min, nums[i].max, nums[i].target) != 0) {
            char range[64];
            if (nums[i].max == LONG_MAX)
                snprintf(range, sizeof(range), ">= %ld", nums[i].min);
            else
                snprintf(range, sizeof(range), "in %ld..%ld", nums[i].min, nums[i].max);
            fprintf(stderr, "psp-sim: --%s: '%s' is not an integer %s\n",
                    flag_name(opts, c), optarg, range);
            free(api_key);
            return 2;
        }
    }
    if (optind != argc || !*api_key) {
        if (optind != argc)
            fprintf(stderr, "psp-sim: unexpected argument '%s'\n", argv[optind]);
        else
            fprintf(stderr, "psp-sim: %s must not be empty\n",
                    key_from_flag ? "--api-key" : "PSP_SIM_API_KEY");
        free(api_key);
        return 2;
    }
    struct psp_webhooks_config whc = {
        .url = wh_url,
        .secret = wh_secret,
        .duplicate_rate = wh_duplicate,
        .reorder_rate = wh_reorder,
        .retry_ms = wh_retry,
        .retry_max_ms = wh_retry_max,
        .timeout_ms = wh_timeout,
        .queue_max = (size_t)wh_queue,
        .seed = (uint64_t)seed,
    };
    char err[256];
    /* Never the secret itself in these lines. */
    if (wh_secret && !*wh_secret) {
        fprintf(stderr, "psp-sim: %s must not be empty\n",
                secret_from_flag ? "--webhook-secret" : "PSP_SIM_WEBHOOK_SECRET");
        free(api_key);
        return 2;
    }
    if (wh_url && !wh_secret) {
        fprintf(stderr, "psp-sim: --webhook-url needs a signing secret "
                        "(--webhook-secret or PSP_SIM_WEBHOOK_SECRET)\n");
        free(api_key);
        return 2;
    }
    if (psp_webhooks_check_config(&whc, err, sizeof(err)) != 0) {
        fprintf(stderr, "psp-sim: --webhook-url: %s\n", err);
        free(api_key);
        return 2;
    }
    /* Before any thread: curl's global set-up is not thread-safe. */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    store = psp_store_new(retention);
    if (state_file) {
        /* The books as they were (no webhook is queued for them: no observer
         * yet), less what was in flight; then this run's changes follow. */
        journal = psp_journal_open(state_file, replay_record, store, err, sizeof(err));
        if (!journal) {
            fprintf(stderr, "psp-sim: --state-file: '%s': %s\n", state_file, err);
            goto out;
        }
        psp_store_set_journal(store, journal_record, journal);
        psp_store_release_reserved(store);
    }
    /* The flags of this run win over the settings replayed. */
    psp_store_set_retention(store, retention);
    psp_store_set_search_lag(store, search_lag);
    psp_store_set_processing_settle(store, settle);
    psp_store_set_refund_settle(store, refund_settle);
    psp_store_set_authorization_expiry(store, auth_expiry);
    faults = psp_faults_new((uint64_t)seed);
    psp_faults_set_latency(faults, latency, jitter);
    psp_faults_set_stall(faults, stall);
    for (int i = 0; i < nfaults; i++) {
        if (parse_fault(fault_specs[i]) != 0) {
            fprintf(stderr, "psp-sim: --fault: '%s' is not KIND=P[@TARGET][#TIMES]\n",
                    fault_specs[i]);
            rc = 2;
            goto out;
        }
    }
    sa.sin_family = asa.sin_family = AF_INET;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1) {
        fprintf(stderr, "psp-sim: --host: '%s' is not an IPv4 address\n", host);
        rc = 2;
        goto out;
    }
    asa.sin_addr = sa.sin_addr;
    sa.sin_port = htons((uint16_t)port);
    asa.sin_port = htons((uint16_t)admin_port);

    /* Every thread started from here on inherits the blocked signals; only
     * sigsuspend below takes them. */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    struct sigaction act = {0};
    act.sa_handler = on_signal;
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    pthread_create(&timer, NULL, timer_main, NULL);
    webhooks = psp_webhooks_new(&whc);
    if (!webhooks) {
        fprintf(stderr, "psp-sim: cannot start webhook deliveries\n");
        goto stop;
    }
    if (wh_url) {
        psp_store_set_observer(store, on_intent_change, webhooks);
        psp_store_set_event_observer(store, on_store_event, webhooks);
        settler_started = pthread_create(&settler, NULL, settler_main, NULL) == 0;
    }

    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TURBO;
    d = MHD_start_daemon(
        flags, (uint16_t)port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR, &sa,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned)threads, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)max_conn, MHD_OPTION_CONNECTION_TIMEOUT, 300u,
        MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u, MHD_OPTION_NOTIFY_COMPLETED,
        on_completed, NULL, MHD_OPTION_END);
    ad = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL,
                          (uint16_t)admin_port, NULL, NULL, on_request, (void *)1,
                          MHD_OPTION_SOCK_ADDR, &asa, MHD_OPTION_NOTIFY_COMPLETED,
                          on_completed, NULL, MHD_OPTION_END);
    unsigned bound = d ? bound_port(d) : 0, admin_bound = ad ? bound_port(ad) : 0;
    if (!bound || !admin_bound) {
        fprintf(stderr, "psp-sim: cannot listen on %s:%ld / %s:%ld\n", host, port, host,
                admin_port);
    } else {
        /* Both sockets listen already: whoever reads this line may connect.
         * It is the only thing written to stdout (logs go to stderr). */
        printf("psp-sim listening port=%u admin_port=%u\n", bound, admin_bound);
        fflush(stdout);
        fprintf(stderr, "psp-sim: listening on http://%s:%u (admin http://%s:%u)\n",
                host, bound, host, admin_bound);
        while (!stop_requested)
            sigsuspend(&old);
        rc = 0;
    }
stop:
    pthread_mutex_lock(&timer_lock);
    timer_stop = 1;
    pthread_cond_signal(&timer_cond);
    pthread_mutex_unlock(&timer_lock);
    pthread_join(timer, NULL);
    if (d)
        MHD_stop_daemon(d);
    if (ad)
        MHD_stop_daemon(ad);
    free(heap);
    if (settler_started) {
        pthread_mutex_lock(&settler_lock);
        settler_stop = 1;
        pthread_cond_signal(&settler_cond);
        pthread_mutex_unlock(&settler_lock);
        pthread_join(settler, NULL);
    }
    /* No request runs any more: nothing queues from here on. */
    psp_store_set_observer(store, NULL, NULL);
    psp_store_set_event_observer(store, NULL, NULL);
    psp_webhooks_free(webhooks);
out:
    psp_faults_free(faults);
    psp_store_free(store);
    psp_journal_free(journal);
    free(api_key);
    curl_global_cleanup();
    return rc;
}
