/* psp_api: the provider API, Stripe's PaymentIntents and Refunds subset:
 * each POST's form and key, the faults around its execution, the GETs. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "psp_sim.h"

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

/* Which accepted key the request bears (its account), or -1. */
static int authorized(struct MHD_Connection *conn)
{
    const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND,
                                                   MHD_HTTP_HEADER_AUTHORIZATION);
    unsigned char want[SHA256_DIGEST_LENGTH], got[SHA256_DIGEST_LENGTH];
    int which = -1;
    if (!auth || strncmp(auth, "Bearer ", 7) != 0)
        return -1;
    auth += 7;
    /* Digests of equal length, compared in constant time, every key
     * compared: neither a key's bytes nor its length leak through timing. */
    SHA256((const unsigned char *)auth, strlen(auth), got);
    for (size_t i = 0; i < psp_sim_napi_keys; i++) {
        const char *k = psp_sim_api_keys[i];
        SHA256((const unsigned char *)k, strlen(k), want);
        if (CRYPTO_memcmp(want, got, sizeof(want)) == 0)
            which = (int)i;
    }
    return which;
}

/* Stripe's 429 for a rate limit; Retry-After when retry_after_s > 0. */
static enum MHD_Result rate_limited(struct MHD_Connection *conn, long retry_after_s)
{
    char secs[24];
    json_t *j = psp_limits_error_json();
    char *body = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    snprintf(secs, sizeof(secs), "%ld", retry_after_s);
    return psp_sim_respond_with(conn, 429, body,
                                retry_after_s > 0 ? "Retry-After" : NULL, secs);
}

/* ---- the provider API ---- */

/* Executes the reserved request: 1, or 0 when the store refused it after
 * all (the key given back: no fault to add). */
static int execute_op(struct req *r, struct psp_answer *ans)
{
    switch (r->op) {
    case OP_CANCEL:
        return psp_store_cancel_execute(psp_sim_store, &r->cancel, psp_sim_now_ms(),
                                        ans);
    case OP_REFUND:
        return psp_store_refund_execute(psp_sim_store, &r->refund, psp_sim_now_ms(),
                                        ans);
    case OP_CAPTURE:
        return psp_store_capture_execute(psp_sim_store, &r->capture, psp_sim_now_ms(),
                                         ans);
    case OP_CHARGE:
        break;
    }
    psp_store_execute(psp_sim_store, &r->charge, psp_sim_now_ms(), ans);
    return 1;
}

/* Executes the reserved charge, cancel, capture or refund, then applies
 * the after-execute faults. */
enum MHD_Result psp_sim_execute_and_answer(struct req *r)
{
    struct psp_answer ans = {0};
    const char *key = r->idem_key;
    /* A rule for a payment method is about charges: a cancel, a capture or
     * a refund names none. */
    const char *pm = r->op == OP_CHARGE ? r->charge.payment_method : NULL;

    int executed = execute_op(r, &ans);
    r->executing = 0;
    if (!executed) /* refused, the key given back: no fault to add */
        return psp_sim_respond(r->conn, ans.status, ans.body, 0);
    if (psp_faults_hit(psp_sim_faults, PSP_FAULT_DROP_AFTER, key, pm, r->seq)) {
        free(ans.body);
        return MHD_NO; /* closes the connection without an answer */
    }
    if (psp_faults_hit(psp_sim_faults, PSP_FAULT_STALL_AFTER, key, pm, r->seq)) {
        free(ans.body);
        r->state = ST_STALLED;
        psp_sim_suspend_for(r->conn, psp_faults_stall_ms(psp_sim_faults));
        return MHD_YES;
    }
    if (psp_faults_hit(psp_sim_faults, PSP_FAULT_ERROR_AFTER, key, pm, r->seq)) {
        free(ans.body);
        return psp_sim_respond_error(
            r->conn, 500, "api_error",
            "An unexpected error occurred (injected after executing).");
    }
    return psp_sim_respond(r->conn, ans.status, ans.body, ans.replayed);
}

int psp_sim_utf8(const char *s)
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
    psp_store_charge_began(psp_sim_store);
    if (r->too_large)
        *rc = psp_sim_respond_error(r->conn, 413, "invalid_request_error",
                                    "Request too large.");
    else if (parse_form(r) != 0)
        *rc = psp_sim_respond_error(r->conn, 500, "api_error", "out of memory");
    else if (r->form_bad)
        *rc = psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                    "Form parameters must be UTF-8 without NUL bytes.");
    else if (hk && (!*hk || strlen(hk) > 255))
        *rc = psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                    "Idempotency-Key must be 1..255 characters.");
    else if (hk && !psp_sim_utf8(hk))
        /* Kept in the ledger and the state file, which are JSON. */
        *rc = psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                    "Idempotency-Key must be UTF-8.");
    else if (hk && !(r->idem_key = strdup(hk)))
        *rc = psp_sim_respond_error(r->conn, 500, "api_error", "out of memory");
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

    r->seq = psp_faults_next_seq(psp_sim_faults, r->idem_key);
    if (psp_faults_hit(psp_sim_faults, PSP_FAULT_RATE_LIMIT, r->idem_key, pm, r->seq))
        return rate_limited(r->conn, 0);
    if (psp_faults_hit(psp_sim_faults, PSP_FAULT_ERROR_BEFORE, r->idem_key, pm, r->seq))
        return psp_sim_respond_error(
            r->conn, 500, "api_error",
            "An unexpected error occurred (injected, not executed).");
    begun =
        r->op == OP_CANCEL
            ? psp_store_cancel_begin(psp_sim_store, &r->cancel, psp_sim_now_ms(), &ans)
        : r->op == OP_REFUND
            ? psp_store_refund_begin(psp_sim_store, &r->refund, psp_sim_now_ms(), &ans)
        : r->op == OP_CAPTURE
            ? psp_store_capture_begin(psp_sim_store, &r->capture, psp_sim_now_ms(),
                                      &ans)
            : psp_store_begin(psp_sim_store, &r->charge, psp_sim_now_ms(), &ans);
    if (begun == PSP_BEGIN_ANSWERED)
        return psp_sim_respond(r->conn, ans.status, ans.body, ans.replayed);
    r->executing = 1;
    int64_t delay = psp_faults_latency_ms(psp_sim_faults, r->idem_key, r->seq);
    if (delay > 0) {
        r->state = ST_DELAYED;
        psp_sim_suspend_for(r->conn, delay);
        return MHD_YES;
    }
    return psp_sim_execute_and_answer(r);
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
        return psp_sim_respond_error(r->conn, 500, "api_error", "out of memory");
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
        if (!value || psp_sim_parse_long(value, 0, LONG_MAX - 1, &v) != 0) {
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
        if (!value || psp_sim_parse_long(value, 1, 100, &v) != 0) {
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

    psp_store_count(psp_sim_store, PSP_C_REQUESTS);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, list_arg, &a);
    if (a.bad[0])
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error", a.bad);
    psp_store_list(psp_sim_store, &a.q, psp_sim_now_ms(), &ans);
    return psp_sim_respond(r->conn, ans.status, ans.body, 0);
}

/* GET /v1/refunds: as the intents' list, by payment_intent instead of
 * customer. */
static enum MHD_Result list_refunds(struct req *r)
{
    struct psp_answer ans = {0};
    struct list_args a = {.q = {INT64_MIN, INT64_MAX, 10, NULL, NULL}, .refunds = 1};

    psp_store_count(psp_sim_store, PSP_C_REQUESTS);
    MHD_get_connection_values(r->conn, MHD_GET_ARGUMENT_KIND, list_arg, &a);
    if (a.bad[0])
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error", a.bad);
    struct psp_refund_list_query q = {a.q.created_gte, a.q.created_lt, a.q.limit,
                                      a.q.starting_after, a.payment_intent};
    psp_store_refund_list(psp_sim_store, &q, psp_sim_now_ms(), &ans);
    return psp_sim_respond(r->conn, ans.status, ans.body, 0);
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
        psp_store_count(psp_sim_store, PSP_C_REQUESTS);
        psp_store_refund_retrieve(psp_sim_store, rest + 1, psp_sim_now_ms(), &ans);
        return psp_sim_respond(r->conn, ans.status, ans.body, 0);
    }
    return psp_sim_respond_error(r->conn, 405, "invalid_request_error",
                                 "Method not allowed.");
}

/* "/<id>" (one segment, not empty), "/<id>/<op>" with op given. */
static int one_id(const char *rest, const char *op)
{
    const char *slash = rest[0] == '/' && rest[1] ? strchr(rest + 1, '/') : NULL;
    if (rest[0] != '/' || !rest[1] || rest[1] == '/')
        return 0;
    return op ? slash && !strcmp(slash + 1, op) : !slash;
}

/* The endpoint class of a request (rest: after /v1/payment_intents or
 * /v1/refunds), or -1 when it names no endpoint (answered 404 or 405,
 * unlimited). */
static int endpoint_class(int refunds, const char *rest, const char *method)
{
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (refunds)
        return post && !*rest              ? PSP_LC_REFUND
               : get && !*rest             ? PSP_LC_LIST
               : get && one_id(rest, NULL) ? PSP_LC_RETRIEVE
                                           : -1;
    if (post)
        return !*rest                                              ? PSP_LC_CREATE
               : one_id(rest, "capture") || one_id(rest, "cancel") ? PSP_LC_CAPTURE
                                                                   : -1;
    if (!get)
        return -1;
    return !*rest                     ? PSP_LC_LIST
           : !strcmp(rest, "/search") ? PSP_LC_SEARCH
           : one_id(rest, NULL)       ? PSP_LC_RETRIEVE
                                      : -1;
}

/* The key (401 without an accepted one), then its rate limits, before
 * anything else is looked at: 1 with *rc the refusal, else 0. */
static int over_limit(struct req *r, int refunds, const char *rest, const char *method,
                      enum MHD_Result *rc)
{
    int key = authorized(r->conn), c = endpoint_class(refunds, rest, method);
    long retry_after_s = 0;

    if (key < 0) {
        *rc = psp_sim_respond_error(r->conn, 401, "invalid_request_error",
                                    "Invalid API Key provided.");
        return 1;
    }
    if (c < 0 || psp_limits_take(psp_sim_limits, (size_t)key, (enum psp_limit_class)c,
                                 psp_sim_mono_ms(), &retry_after_s))
        return 0;
    *rc = rate_limited(r->conn, retry_after_s);
    return 1;
}

enum MHD_Result psp_sim_provider_api(struct req *r, const char *url, const char *method)
{
    struct psp_answer ans = {0};
    const char *base = "/v1/payment_intents", *refunds = "/v1/refunds";
    size_t bl = strlen(base), rl = strlen(refunds);
    enum MHD_Result rc;

    if (!strncmp(url, refunds, rl) && (url[rl] == '\0' || url[rl] == '/')) {
        if (over_limit(r, 1, url + rl, method, &rc))
            return rc;
        return refunds_api(r, url + rl, method);
    }
    if (strncmp(url, base, bl) != 0 || (url[bl] != '\0' && url[bl] != '/'))
        return psp_sim_respond_error(r->conn, 404, "invalid_request_error",
                                     "Unrecognized request URL.");
    if (over_limit(r, 0, url + bl, method, &rc))
        return rc;
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
        psp_store_count(psp_sim_store, PSP_C_REQUESTS);
        char *id = parse_search(
            MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "query"));
        if (!id)
            return psp_sim_respond_error(
                r->conn, 400, "invalid_request_error",
                "query must be metadata['payment_attempt_id']:'<id>'.");
        psp_store_search(psp_sim_store, id, psp_sim_now_ms(), &ans);
        free(id);
        return psp_sim_respond(r->conn, ans.status, ans.body, 0);
    }
    if (!strcmp(method, "GET") && url[bl] == '/' && url[bl + 1] &&
        !strchr(url + bl + 1, '/')) {
        psp_store_count(psp_sim_store, PSP_C_REQUESTS);
        psp_store_retrieve(psp_sim_store, url + bl + 1, psp_sim_now_ms(), &ans);
        return psp_sim_respond(r->conn, ans.status, ans.body, 0);
    }
    return psp_sim_respond_error(r->conn, 405, "invalid_request_error",
                                 "Method not allowed.");
}
