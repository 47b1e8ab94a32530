#include "provider_client.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/crypto.h>

#include "card_data.h"
#include "utf8_text.h"

#define MAX_ANSWER (1024 * 1024)
/* Bytes curl reads from the socket at a time, per transfer. */
#define PROVIDER_RECEIVE_BUFFER 4096L

/* One request in flight: its handle, what it wrote and what came back. */
struct provider_xfer {
    CURL *easy;
    struct curl_slist *headers;
    char *body;   /* form body sent */
    char *answer; /* body received */
    size_t answer_len;
    size_t bytes_out; /* request bytes curl reported sent */
    int sends;        /* times the request's headers went out */
    void *opaque;
    struct provider_call call;  /* what was asked: how the answer is classified */
    struct provider_xfer *next; /* in the client's list of async transfers */
};

struct provider_client {
    char *base_url;
    char *auth_header;    /* "Authorization: Bearer ..." */
    char *version_header; /* "Stripe-Version: ...", or NULL */
    long timeout_ms;
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    CURLM *multi;
    struct provider_xfer *async; /* started, unfinished or untaken */
    size_t in_flight;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access a, void *u)
{
    provider_client_t *pc = u;
    (void)h;
    (void)a;
    pthread_mutex_lock(&pc->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *u)
{
    provider_client_t *pc = u;
    (void)h;
    pthread_mutex_unlock(&pc->share_locks[data]);
}

provider_client_t *provider_client_new(const char *base_url, const char *api_key,
                                       const char *api_version, long timeout_ms,
                                       char *errbuf, size_t errbuf_size)
{
    provider_client_t *pc;
    size_t n;

    if (!base_url || strncmp(base_url, "http", 4) != 0) {
        snprintf(errbuf, errbuf_size, "provider base url must be http(s)://...");
        return NULL;
    }
    if (!api_key || !*api_key || strpbrk(api_key, "\r\n")) {
        snprintf(errbuf, errbuf_size, "provider api key is empty or malformed");
        return NULL;
    }
    pthread_once(&curl_once, curl_init_once);
    pc = calloc(1, sizeof(*pc));
    if (!pc)
        goto oom;
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&pc->share_locks[i], NULL);
    pc->base_url = strdup(base_url);
    n = strlen(api_key) + 32;
    pc->auth_header = malloc(n);
    if (!pc->base_url || !pc->auth_header)
        goto oom;
    snprintf(pc->auth_header, n, "Authorization: Bearer %s", api_key);
    if (api_version && *api_version) {
        if (strpbrk(api_version, "\r\n")) {
            snprintf(errbuf, errbuf_size, "provider api version is malformed");
            provider_client_free(pc);
            return NULL;
        }
        n = strlen(api_version) + 20;
        if (!(pc->version_header = malloc(n)))
            goto oom;
        snprintf(pc->version_header, n, "Stripe-Version: %s", api_version);
    }
    n = strlen(pc->base_url);
    while (n > 0 && pc->base_url[n - 1] == '/')
        pc->base_url[--n] = '\0';
    pc->timeout_ms = timeout_ms;
    pc->share = curl_share_init();
    pc->multi = curl_multi_init();
    if (!pc->share || !pc->multi)
        goto oom;
    curl_share_setopt(pc->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(pc->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(pc->share, CURLSHOPT_USERDATA, pc);
    curl_share_setopt(pc->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    curl_share_setopt(pc->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    /* Many charges at once share few connections when the provider allows it. */
    curl_multi_setopt(pc->multi, CURLMOPT_MAX_HOST_CONNECTIONS, 0L);
    return pc;
oom:
    snprintf(errbuf, errbuf_size, "provider client: out of memory");
    provider_client_free(pc);
    return NULL;
}

static void xfer_free(struct provider_xfer *x)
{
    if (!x)
        return;
    if (x->easy)
        curl_easy_cleanup(x->easy);
    curl_slist_free_all(x->headers);
    free(x->body);
    free(x->answer);
    free(x);
}

void provider_client_free(provider_client_t *pc)
{
    if (!pc)
        return;
    provider_client_abandon_all(pc);
    if (pc->multi)
        curl_multi_cleanup(pc->multi);
    if (pc->share)
        curl_share_cleanup(pc->share);
    if (pc->auth_header) {
        /* Leave no copy of the secret in freed memory. */
        OPENSSL_cleanse(pc->auth_header, strlen(pc->auth_header));
        free(pc->auth_header);
    }
    free(pc->version_header);
    free(pc->base_url);
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_destroy(&pc->share_locks[i]);
    free(pc);
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *u)
{
    struct provider_xfer *x = u;
    size_t n = size * nmemb;
    if (x->answer_len + n > MAX_ANSWER)
        return 0; /* aborts: an answer this large is not the provider's */
    char *b = realloc(x->answer, x->answer_len + n + 1);
    if (!b)
        return 0;
    x->answer = b;
    memcpy(x->answer + x->answer_len, ptr, n);
    x->answer_len += n;
    x->answer[x->answer_len] = '\0';
    return n;
}

/* The wire, as curl saw it: counts request bytes actually sent. Only called
 * with CURLOPT_VERBOSE; nothing is printed. */
static int on_debug(CURL *h, curl_infotype type, char *data, size_t size, void *u)
{
    struct provider_xfer *x = u;
    (void)h;
    (void)data;
    if (type == CURLINFO_HEADER_OUT || type == CURLINFO_DATA_OUT)
        x->bytes_out += size;
    if (type == CURLINFO_HEADER_OUT)
        x->sends++;
    return 0;
}

/* Appends one header line (copied); 0 / -1, the list intact on failure. */
static int add_header(struct provider_xfer *x, const char *line)
{
    struct curl_slist *h = curl_slist_append(x->headers, line);
    if (!h)
        return -1;
    x->headers = h;
    return 0;
}

static struct provider_xfer *xfer_new(provider_client_t *pc, const char *url,
                                      char *body, int with_share)
{
    struct provider_xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        free(body);
        return NULL;
    }
    x->body = body;
    x->easy = curl_easy_init();
    if (!x->easy || add_header(x, pc->auth_header) || add_header(x, "Expect:") ||
        (pc->version_header && add_header(x, pc->version_header))) {
        xfer_free(x);
        return NULL;
    }
    CURL *e = x->easy;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, pc->timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS,
                     pc->timeout_ms < 5000 ? pc->timeout_ms : 5000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(e, CURLOPT_DEBUGFUNCTION, on_debug);
    curl_easy_setopt(e, CURLOPT_DEBUGDATA, x);
    curl_easy_setopt(e, CURLOPT_VERBOSE, 1L);
    curl_easy_setopt(e, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(e, CURLOPT_PRIVATE, x);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_USERAGENT, "charged/1");
    /* A provider's answer is a few KiB; curl's 16 KiB receive buffer per
     * transfer was most of a worker's memory with thousands in flight. */
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, PROVIDER_RECEIVE_BUFFER);
    if (with_share)
        curl_easy_setopt(e, CURLOPT_SHARE, pc->share);
    if (body) {
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    }
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, x->headers);
    return x;
}

/* Appends "&name=escaped(value)" to a growing form body. (curl_easy_escape
 * needs no handle since libcurl 7.82.) */
static int form_add(char **body, size_t *len, const char *name, const char *value)
{
    char *ev = curl_easy_escape(NULL, value, 0);
    char *en = curl_easy_escape(NULL, name, 0);
    int rc = -1;
    if (!ev || !en)
        goto out;
    size_t add = strlen(en) + strlen(ev) + 2;
    char *b = realloc(*body, *len + add + 1);
    if (!b)
        goto out;
    *body = b;
    *len += (size_t)sprintf(b + *len, "%s%s=%s", *len ? "&" : "", en, ev);
    rc = 0;
out:
    curl_free(ev);
    curl_free(en);
    return rc;
}

/* A POST of body (taken: owned by the transfer, or freed) to the base url
 * and path, with an Idempotency-Key the caller has checked. NULL with errbuf
 * on failure. */
static struct provider_xfer *post_xfer(provider_client_t *pc, const char *path,
                                       char *body, const char *idempotency_key,
                                       int with_share, char *errbuf, size_t errbuf_size)
{
    char url[1024], *hdr = NULL;
    struct provider_xfer *x = NULL;

    if ((size_t)snprintf(url, sizeof(url), "%s%s", pc->base_url, path) >= sizeof(url)) {
        snprintf(errbuf, errbuf_size, "provider url too long");
        free(body);
        return NULL;
    }
    x = xfer_new(pc, url, body, with_share);
    if (!x)
        goto oom;
    size_t hl = strlen(idempotency_key) + 20;
    hdr = malloc(hl);
    if (!hdr)
        goto oom;
    snprintf(hdr, hl, "Idempotency-Key: %s", idempotency_key);
    if (add_header(x, hdr))
        goto oom;
    curl_easy_setopt(x->easy, CURLOPT_HTTPHEADER, x->headers);
    goto out;
oom:
    snprintf(errbuf, errbuf_size, "provider client: out of memory");
    xfer_free(x);
    x = NULL;
out:
    free(hdr);
    return x;
}

static struct provider_xfer *charge_xfer(provider_client_t *pc,
                                         const struct provider_charge *ch,
                                         int with_share, char *errbuf,
                                         size_t errbuf_size)
{
    char amount[32], currency[8], *body = NULL;
    size_t len = 0;
    struct provider_xfer *x = NULL;

    if (!ch->idempotency_key || !*ch->idempotency_key ||
        strpbrk(ch->idempotency_key, "\r\n")) {
        snprintf(errbuf, errbuf_size, "charge without a usable idempotency key");
        goto out;
    }
    snprintf(amount, sizeof(amount), "%lld", ch->amount);
    snprintf(currency, sizeof(currency), "%s", ch->currency ? ch->currency : "");
    for (char *p = currency; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    /* automatic_payment_methods without redirects: recent API versions
     * refuse a server-side confirm without a return_url otherwise. A saved
     * card belongs to its customer, so the customer goes along. */
    if (form_add(&body, &len, "amount", amount) ||
        form_add(&body, &len, "currency", currency) ||
        form_add(&body, &len, "payment_method", ch->payment_method) ||
        form_add(&body, &len, "confirm", "true") ||
        form_add(&body, &len, "off_session", "true") ||
        form_add(&body, &len, "automatic_payment_methods[enabled]", "true") ||
        form_add(&body, &len, "automatic_payment_methods[allow_redirects]", "never") ||
        (ch->customer_id && *ch->customer_id &&
         form_add(&body, &len, "customer", ch->customer_id)) ||
        form_add(&body, &len, "metadata[payment_attempt_id]", ch->payment_attempt_id) ||
        form_add(&body, &len, "metadata[order_id]", ch->order_id))
        goto oom;
    x = post_xfer(pc, "/v1/payment_intents", body, ch->idempotency_key, with_share,
                  errbuf, errbuf_size);
    body = NULL; /* owned by x, or freed */
    if (!x)
        goto out;
    x->call.amount = ch->amount;
    snprintf(x->call.currency, sizeof(x->call.currency), "%s", currency);
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s",
             ch->payment_attempt_id ? ch->payment_attempt_id : "");
    goto out;
oom:
    snprintf(errbuf, errbuf_size, "provider client: out of memory");
out:
    free(body);
    return x;
}

/* Provider text is bounded and made valid UTF-8 here, before anything
 * stores or logs it: a message cut mid-character once jammed every batch.
 * It is anyone's to write (a decline code, metadata): its card numbers are
 * masked on the way in, so no reason, event, log or finding carries one. */
static void copy_str(char *dst, size_t size, const char *src)
{
    card_data_copy_masked(dst, size, src);
}

/* A provider object id is a key we look the object up by, not text: a
 * masked one would name another object. Bounded and valid UTF-8 only. */
static void copy_id(char *dst, size_t size, const char *src)
{
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
        return len;
    }
    return 0;
}

/* Appends n bytes of src to out (of size), as far as they fit. */
static void put(char *out, size_t size, size_t *at, const char *src, size_t n)
{
    while (n-- > 0 && *at + 1 < size)
        out[(*at)++] = *src++;
}

void provider_client_redact(char *dst, size_t size, const char *src)
{
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
    tmp[at] = '\0';
    copy_str(dst, size, tmp);
}

/* An error's code and decline_code, each where it has one. */
static void take_codes(json_t *err, struct provider_result *res)
{
    const char *code = json_string_value(json_object_get(err, "code"));
    const char *decline = json_string_value(json_object_get(err, "decline_code"));
    if (code)
        copy_str(res->code, sizeof(res->code), code);
    if (decline)
        copy_str(res->decline_code, sizeof(res->decline_code), decline);
}

/* Fills result fields from a provider object (a PaymentIntent's, where it
 * has them): its id, status, amount, currency and attempt. */
static void take_object(json_t *pi, struct provider_result *res)
{
    const char *id = json_string_value(json_object_get(pi, "id"));
    copy_id(res->provider_payment_id, sizeof(res->provider_payment_id),
            provider_outcome_id_ok(id) ? id : "");
    copy_str(res->intent_status, sizeof(res->intent_status),
             json_string_value(json_object_get(pi, "status")));
    res->amount = json_integer_value(json_object_get(pi, "amount"));
    copy_str(res->currency, sizeof(res->currency),
             json_string_value(json_object_get(pi, "currency")));
    copy_str(res->intent_attempt_id, sizeof(res->intent_attempt_id),
             json_string_value(json_object_get(json_object_get(pi, "metadata"),
                                               "payment_attempt_id")));
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

/* An intent's own status, as an outcome. */
static enum provider_outcome intent_outcome(const char *status)
{
    if (!strcmp(status, "succeeded"))
        return PROVIDER_SUCCEEDED;
    if (!strcmp(status, "processing"))
        return PROVIDER_PROCESSING;
    if (!strcmp(status, "requires_payment_method") || !strcmp(status, "canceled"))
        return PROVIDER_DECLINED;
    /* requires_action, requires_confirmation...: off-session charges should
     * not end here; a human decides. */
    return PROVIDER_REQUIRES_REVIEW;
}

static void classify_charge(int http, json_t *doc, struct provider_result *res)
{
    json_t *err = json_object_get(doc, "error");
    const char *type = json_string_value(json_object_get(err, "type"));

    if (http >= 200 && http < 300) {
        const char *st = json_string_value(json_object_get(doc, "status"));
        if (!json_is_object(doc) || !st) {
            res->outcome = PROVIDER_UNKNOWN;
            copy_str(res->error, sizeof(res->error), "2xx answer without an intent");
            return;
        }
        if (!provider_outcome_id_ok(json_string_value(json_object_get(doc, "id")))) {
            /* It may have executed, but we could never find it again. */
            res->outcome = PROVIDER_UNKNOWN;
            copy_str(res->error, sizeof(res->error),
                     "2xx answer with an unusable intent id");
            return;
        }
        take_intent(doc, res);
        res->outcome = intent_outcome(st);
        if (res->outcome == PROVIDER_DECLINED)
            copy_str(res->error, sizeof(res->error), "intent not paid");
        else if (res->outcome == PROVIDER_REQUIRES_REVIEW)
            /* The status as take_intent kept it: the provider's own text may
             * hold control bytes or be cut mid-character here. */
            snprintf(res->error, sizeof(res->error), "intent status '%s'",
                     res->intent_status);
        return;
    }
    if (err) {
        take_codes(err, res);
        provider_client_redact(res->param, sizeof(res->param),
                               json_string_value(json_object_get(err, "param")));
        /* Masked here, once: the message echoes what we sent (a customer,
         * a card token), and no reason, event or log may carry it. */
        provider_client_redact(res->error, sizeof(res->error),
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
                copy_str(res->error, sizeof(res->error), "402 without a card error");
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

/* An operation's answer (start_post): as a charge's, but a 2xx object with
 * a usable id is the operation done, whatever status the object has now (a
 * cancel's intent is canceled), and a 404 resource_missing is the
 * provider's word that the object is not there: final, as a 400. The
 * object a 4xx carries (Stripe's error.payment_intent) is taken too: it
 * says what state refused the operation. */
static void classify_operation(int http, json_t *doc, struct provider_result *res)
{
    json_t *err = json_object_get(doc, "error");

    if (http >= 200 && http < 300) {
        if (!json_is_object(doc) ||
            !provider_outcome_id_ok(json_string_value(json_object_get(doc, "id")))) {
            /* It may have executed, but we could never say on what. */
            res->outcome = PROVIDER_UNKNOWN;
            copy_str(res->error, sizeof(res->error),
                     "2xx answer without a usable object id");
            return;
        }
        take_object(doc, res);
        res->outcome = PROVIDER_SUCCEEDED;
        return;
    }
    const char *code = json_string_value(json_object_get(err, "code"));
    if (http == 404 && code && !strcmp(code, "resource_missing")) {
        take_codes(err, res);
        provider_client_redact(res->param, sizeof(res->param),
                               json_string_value(json_object_get(err, "param")));
        provider_client_redact(res->error, sizeof(res->error),
                               json_string_value(json_object_get(err, "message")));
        res->outcome = PROVIDER_INVALID;
        return;
    }
    classify_charge(http, doc, res);
    json_t *pi = json_object_get(err, "payment_intent");
    if (http >= 400 && http < 500 && json_is_object(pi))
        take_object(pi, res);
}

/* Fills result fields from a Refund object: its id, status, amount,
 * currency and metadata[refund_id]. */
static void take_refund(json_t *re, struct provider_result *res)
{
    const char *id = json_string_value(json_object_get(re, "id"));
    copy_id(res->provider_payment_id, sizeof(res->provider_payment_id),
            provider_outcome_id_ok(id) ? id : "");
    copy_str(res->intent_status, sizeof(res->intent_status),
             json_string_value(json_object_get(re, "status")));
    res->amount = json_integer_value(json_object_get(re, "amount"));
    copy_str(res->currency, sizeof(res->currency),
             json_string_value(json_object_get(re, "currency")));
    copy_str(res->intent_attempt_id, sizeof(res->intent_attempt_id),
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
            provider_client_redact(res->code, sizeof(res->code), why);
        else
            copy_str(res->code, sizeof(res->code),
                     !strcmp(st, "failed") ? "refund_failed" : "refund_canceled");
        snprintf(res->error, sizeof(res->error), "refund %s: %s", st, res->code);
    } else {
        /* A status we do not know: a human decides. */
        res->outcome = PROVIDER_REQUIRES_REVIEW;
        provider_client_redact(res->intent_status, sizeof(res->intent_status), st);
        snprintf(res->error, sizeof(res->error), "refund status '%s'",
                 res->intent_status);
    }
}

/* A refund's answer to its POST: a 2xx refund by its status, anything else
 * as an operation's (a 404 resource_missing, no such intent, is final). */
static void classify_refund(const struct provider_call *call, int http, json_t *doc,
                            struct provider_result *res)
{
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
        copy_str(res->error, sizeof(res->error), "2xx answer without a usable refund");
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
        copy_str(res->error, sizeof(res->error),
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
        copy_str(res->error, sizeof(res->error), "no refund for this refund attempt");
        return;
    }
    take_refund(best, res);
    refund_outcome(best, res);
}

/* A charge's intent must be the one we asked for: the same amount and
 * currency, and our attempt in its metadata. An answer that says otherwise
 * is not a success we can book: a human looks. Fields the answer does not
 * carry are not judged. */
static void check_intent_matches(const struct provider_call *call, json_t *doc,
                                 struct provider_result *res)
{
    if (res->outcome != PROVIDER_SUCCEEDED && res->outcome != PROVIDER_PROCESSING)
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
    copy_str(res->error, sizeof(res->error), why);
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
        enum provider_outcome o = intent_outcome(st ? st : "");
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
        copy_str(res->error, sizeof(res->error), "no intent for this attempt");
        return;
    }
    take_intent(best, res);
    res->outcome = intent_outcome(res->intent_status);
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
    return 0;
}

static void classify_lookup(int http, json_t *doc, enum provider_lookup kind,
                            int refund, const char *attempt_id,
                            struct provider_result *res)
{
    static const char *objects[] = {"payment_intent", "search_result", "list"};
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
            copy_str(res->error, sizeof(res->error),
                     refund ? "no such refund" : "no such payment intent");
        } else {
            res->outcome = PROVIDER_UNKNOWN;
            copy_str(res->error, sizeof(res->error),
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
            copy_str(res->error, sizeof(res->error), "refund without a usable id");
            return;
        }
        res->matches = 1;
        take_refund(doc, res);
        refund_outcome(doc, res);
        return;
    }
    if (kind == PROVIDER_LOOKUP_RETRIEVE) {
        res->matches = 1;
        take_intent(doc, res);
        res->outcome = intent_outcome(res->intent_status);
        return;
    }
    json_t *data = json_object_get(doc, "data");
    if (!json_is_array(data) ||
        (kind == PROVIDER_LOOKUP_LIST && take_cursor(doc, data, res))) {
        res->outcome = PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "%s answered without %s",
                 objects[kind],
                 json_is_array(data) ? "a usable has_more and cursor" : "a data list");
        return;
    }
    /* A search is asked for the attempt; a list holds everyone's intents
     * (a refunds' list, the intent's refunds of every refund attempt). */
    if (refund)
        take_best_refund(data, attempt_id, res);
    else
        take_best(data, kind == PROVIDER_LOOKUP_LIST ? attempt_id : NULL, res);
}

void provider_client_classify(const struct provider_call *call, int http_status,
                              const char *replayed, const char *body, size_t body_len,
                              struct provider_result *res)
{
    res->http_status = http_status;
    res->replayed = replayed && !strcasecmp(replayed, "true");
    json_error_t jerr;
    json_t *doc = body ? json_loadb(body, body_len, 0, &jerr) : NULL;
    if (call->lookup)
        classify_lookup(http_status, doc, call->kind, call->refund, call->attempt_id,
                        res);
    else if (call->refund)
        classify_refund(call, http_status, doc, res);
    else if (call->operation)
        classify_operation(http_status, doc, res);
    else {
        classify_charge(http_status, doc, res);
        check_intent_matches(call, doc, res);
    }
    json_decref(doc);
}

/* Turns a finished transfer into a result. */
static void finish(struct provider_xfer *x, CURLcode cc, struct provider_result *res)
{
    long http = 0;
    curl_off_t total_us = 0;

    memset(res, 0, sizeof(*res));
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &http);
    curl_easy_getinfo(x->easy, CURLINFO_TOTAL_TIME_T, &total_us);
    res->latency_ms = (long)(total_us / 1000);
    res->sent = x->bytes_out > 0;
    res->resent = x->sends > 1 ? x->sends - 1 : 0;
    struct curl_header *replayed = NULL;
    if (curl_easy_header(x->easy, "Idempotent-Replayed", 0, CURLH_HEADER, -1,
                         &replayed) != CURLHE_OK)
        replayed = NULL;

    if (cc != CURLE_OK) {
        res->http_status = 0;
        res->replayed = replayed && !strcasecmp(replayed->value, "true");
        /* Only the wire decides: nothing sent means nothing executed. */
        res->outcome = res->sent ? PROVIDER_UNKNOWN : PROVIDER_NOT_EXECUTED;
        snprintf(res->error, sizeof(res->error), "%s%s", curl_easy_strerror(cc),
                 res->sent ? " (after the request was sent)" : " (nothing sent)");
        return;
    }
    provider_client_classify(&x->call, (int)http, replayed ? replayed->value : NULL,
                             x->answer, x->answer_len, res);
}

int provider_client_charge(provider_client_t *pc, const struct provider_charge *ch,
                           struct provider_result *res)
{
    char err[256];
    struct provider_xfer *x = charge_xfer(pc, ch, 1, err, sizeof(err));
    if (!x) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_NOT_EXECUTED;
        copy_str(res->error, sizeof(res->error), err);
        return 0;
    }
    finish(x, curl_easy_perform(x->easy), res);
    xfer_free(x);
    return 0;
}

static int lookup(provider_client_t *pc, const char *url, enum provider_lookup kind,
                  int refund, const char *attempt_id, struct provider_result *res)
{
    struct provider_xfer *x = xfer_new(pc, url, NULL, 1);
    if (!x) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_UNKNOWN;
        copy_str(res->error, sizeof(res->error), "provider client: out of memory");
        return 0;
    }
    x->call.lookup = 1;
    x->call.kind = kind;
    x->call.refund = refund;
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s",
             attempt_id ? attempt_id : "");
    curl_easy_setopt(x->easy, CURLOPT_HTTPGET, 1L);
    finish(x, curl_easy_perform(x->easy), res);
    /* A look-up that never got an answer says nothing about the intent. */
    if (res->http_status == 0)
        res->outcome = PROVIDER_UNKNOWN;
    xfer_free(x);
    return 0;
}

static void retrieve_url(provider_client_t *pc, const char *payment_intent_id,
                         char *url, size_t size)
{
    char *id = curl_easy_escape(NULL, payment_intent_id ? payment_intent_id : "", 0);
    snprintf(url, size, "%s/v1/payment_intents/%s", pc->base_url, id ? id : "");
    curl_free(id);
}

int provider_client_retrieve(provider_client_t *pc, const char *payment_intent_id,
                             struct provider_result *res)
{
    char url[1024];
    retrieve_url(pc, payment_intent_id, url, sizeof(url));
    return lookup(pc, url, PROVIDER_LOOKUP_RETRIEVE, 0, NULL, res);
}

int provider_client_search(provider_client_t *pc, const char *payment_attempt_id,
                           struct provider_result *res)
{
    char url[1024], q[256];
    snprintf(q, sizeof(q), "metadata['payment_attempt_id']:'%s'", payment_attempt_id);
    char *eq = curl_easy_escape(NULL, q, 0);
    snprintf(url, sizeof(url), "%s/v1/payment_intents/search?query=%s", pc->base_url,
             eq ? eq : "");
    curl_free(eq);
    return lookup(pc, url, PROVIDER_LOOKUP_SEARCH, 0, NULL, res);
}

int provider_client_list(provider_client_t *pc, const char *payment_attempt_id,
                         long long created_gte, long long created_lt,
                         const char *starting_after, struct provider_result *res)
{
    char url[1024];
    char *after = starting_after && *starting_after
                      ? curl_easy_escape(NULL, starting_after, 0)
                      : NULL;
    /* Brackets percent-encoded, as a form encoder sends them. */
    snprintf(url, sizeof(url),
             "%s/v1/payment_intents?created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld"
             "&limit=100%s%s",
             pc->base_url, created_gte, created_lt, after ? "&starting_after=" : "",
             after ? after : "");
    curl_free(after);
    return lookup(pc, url, PROVIDER_LOOKUP_LIST, 0, payment_attempt_id, res);
}

int provider_client_retrieve_refund(provider_client_t *pc, const char *refund_id,
                                    struct provider_result *res)
{
    char url[1024];
    char *id = curl_easy_escape(NULL, refund_id ? refund_id : "", 0);
    snprintf(url, sizeof(url), "%s/v1/refunds/%s", pc->base_url, id ? id : "");
    curl_free(id);
    return lookup(pc, url, PROVIDER_LOOKUP_RETRIEVE, 1, NULL, res);
}

int provider_client_list_refunds(provider_client_t *pc, const char *payment_intent,
                                 const char *refund_id, const char *starting_after,
                                 struct provider_result *res)
{
    char url[1024];
    char *pi = curl_easy_escape(NULL, payment_intent ? payment_intent : "", 0);
    char *after = starting_after && *starting_after
                      ? curl_easy_escape(NULL, starting_after, 0)
                      : NULL;
    snprintf(url, sizeof(url), "%s/v1/refunds?payment_intent=%s&limit=100%s%s",
             pc->base_url, pi ? pi : "", after ? "&starting_after=" : "",
             after ? after : "");
    curl_free(pi);
    curl_free(after);
    return lookup(pc, url, PROVIDER_LOOKUP_LIST, 1, refund_id ? refund_id : "", res);
}

/* Hands x to the multi handle; on failure frees it. 0 / -1. */
static int start_async(provider_client_t *pc, struct provider_xfer *x, void *opaque,
                       char *errbuf, size_t errbuf_size)
{
    x->opaque = opaque;
    if (curl_multi_add_handle(pc->multi, x->easy) != CURLM_OK) {
        snprintf(errbuf, errbuf_size, "provider client: cannot start transfer");
        xfer_free(x);
        return -1;
    }
    x->next = pc->async;
    pc->async = x;
    pc->in_flight++;
    return 0;
}

int provider_client_start_charge(provider_client_t *pc,
                                 const struct provider_charge *ch, void *opaque,
                                 char *errbuf, size_t errbuf_size)
{
    /* The multi handle keeps its own connection cache. */
    struct provider_xfer *x = charge_xfer(pc, ch, 0, errbuf, errbuf_size);
    if (!x)
        return -1;
    return start_async(pc, x, opaque, errbuf, errbuf_size);
}

/* A path we can append to the base url as it is: '/', then printable ASCII
 * without spaces (the caller escapes ids). */
static int usable_path(const char *path)
{
    if (!path || path[0] != '/')
        return 0;
    for (const unsigned char *p = (const unsigned char *)path; *p; p++)
        if (*p <= 0x20 || *p >= 0x7f)
            return 0;
    return 1;
}

/* start_post's work, handing the transfer back (NULL with errbuf) so that
 * a caller can say how its answer is classified before it starts. */
static struct provider_xfer *operation_xfer(provider_client_t *pc, const char *path,
                                            const char *form_body,
                                            const char *idempotency_key, char *errbuf,
                                            size_t errbuf_size)
{
    if (!usable_path(path)) {
        snprintf(errbuf, errbuf_size, "post to an unusable path");
        return NULL;
    }
    if (!idempotency_key || !*idempotency_key || strpbrk(idempotency_key, "\r\n")) {
        snprintf(errbuf, errbuf_size, "post without a usable idempotency key");
        return NULL;
    }
    /* Always a body, if empty: that makes it a POST. */
    char *body = strdup(form_body ? form_body : "");
    if (!body) {
        snprintf(errbuf, errbuf_size, "provider client: out of memory");
        return NULL;
    }
    /* The multi handle keeps its own connection cache, as for charges. */
    struct provider_xfer *x =
        post_xfer(pc, path, body, idempotency_key, 0, errbuf, errbuf_size);
    if (x)
        x->call.operation = 1;
    return x;
}

int provider_client_start_post(provider_client_t *pc, const char *path,
                               const char *form_body, const char *idempotency_key,
                               void *opaque, char *errbuf, size_t errbuf_size)
{
    struct provider_xfer *x =
        operation_xfer(pc, path, form_body, idempotency_key, errbuf, errbuf_size);
    if (!x)
        return -1;
    return start_async(pc, x, opaque, errbuf, errbuf_size);
}

int provider_client_start_refund(provider_client_t *pc, const struct provider_refund *r,
                                 void *opaque, char *errbuf, size_t errbuf_size)
{
    char amount[32], *body = NULL;
    size_t len = 0;
    int rc = -1;

    if (!r->payment_intent || !*r->payment_intent || !r->refund_id ||
        strlen(r->refund_id) >= sizeof(((struct provider_call *)0)->attempt_id)) {
        snprintf(errbuf, errbuf_size, "refund without a payment intent or refund id");
        return -1;
    }
    snprintf(amount, sizeof(amount), "%lld", r->amount);
    if (form_add(&body, &len, "payment_intent", r->payment_intent) ||
        form_add(&body, &len, "amount", amount) ||
        (r->reason && *r->reason && form_add(&body, &len, "reason", r->reason)) ||
        form_add(&body, &len, "metadata[refund_id]", r->refund_id) ||
        form_add(&body, &len, "metadata[payment_attempt_id]",
                 r->payment_attempt_id ? r->payment_attempt_id : "")) {
        snprintf(errbuf, errbuf_size, "provider client: out of memory");
        goto out;
    }
    struct provider_xfer *x = operation_xfer(pc, "/v1/refunds", body,
                                             r->idempotency_key, errbuf, errbuf_size);
    if (!x)
        goto out;
    x->call.refund = 1;
    x->call.amount = r->amount;
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s", r->refund_id);
    rc = start_async(pc, x, opaque, errbuf, errbuf_size);
out:
    free(body);
    return rc;
}

int provider_client_start_probe(provider_client_t *pc, void *opaque, char *errbuf,
                                size_t errbuf_size)
{
    char url[1024];
    /* The charge endpoint, as charges use it, with a body the provider
     * refuses before it executes anything: an amount of 0, no payment
     * method, no confirm. Even a provider that took it would only create an
     * unconfirmed intent, which charges nobody. */
    char *body = strdup("amount=0&currency=usd&metadata%5Bcharged_probe%5D=breaker");
    snprintf(url, sizeof(url), "%s/v1/payment_intents", pc->base_url);
    struct provider_xfer *x = body ? xfer_new(pc, url, body, 0) : NULL;
    if (!x) {
        snprintf(errbuf, errbuf_size, "provider client: out of memory");
        return -1;
    }
    return start_async(pc, x, opaque, errbuf, errbuf_size);
}

void provider_client_perform(provider_client_t *pc, int timeout_ms)
{
    int running = 0;
    if (pc->in_flight == 0)
        return;
    curl_multi_perform(pc->multi, &running);
    if (timeout_ms > 0 && running > 0) {
        curl_multi_poll(pc->multi, NULL, 0, timeout_ms, NULL);
        curl_multi_perform(pc->multi, &running);
    }
}

int provider_client_next_done(provider_client_t *pc, struct provider_result *res,
                              void **opaque)
{
    int left;
    CURLMsg *m;
    while ((m = curl_multi_info_read(pc->multi, &left))) {
        struct provider_xfer *x = NULL, **pp;
        if (m->msg != CURLMSG_DONE)
            continue;
        CURLcode cc = m->data.result;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        curl_multi_remove_handle(pc->multi, x->easy);
        for (pp = &pc->async; *pp; pp = &(*pp)->next) {
            if (*pp == x) {
                *pp = x->next;
                break;
            }
        }
        finish(x, cc, res);
        if (x->call.lookup && res->http_status == 0)
            res->outcome = PROVIDER_UNKNOWN;
        *opaque = x->opaque;
        pc->in_flight--;
        xfer_free(x);
        return 1;
    }
    return 0;
}

size_t provider_client_in_flight(const provider_client_t *pc)
{
    return pc->in_flight;
}

void provider_client_abandon_all(provider_client_t *pc)
{
    while (pc->async) {
        struct provider_xfer *x = pc->async;
        pc->async = x->next;
        curl_multi_remove_handle(pc->multi, x->easy);
        xfer_free(x);
    }
    pc->in_flight = 0;
}

/* Printable ASCII only, bounded: what a listed object carries goes into
 * SQL parameters and log lines, and one odd byte must not fail a page. */
static void copy_ascii_id(char *dst, size_t size, const char *src)
{
    size_t i = 0;
    for (; src && src[i] && i + 1 < size; i++) {
        unsigned char c = (unsigned char)src[i];
        dst[i] = c >= 0x20 && c < 0x7f ? (char)c : '?';
    }
    dst[i] = '\0';
}

/* The same for its text (status, currency, metadata), card numbers masked
 * as every provider text is (copy_str). */
static void copy_ascii(char *dst, size_t size, const char *src)
{
    copy_str(dst, size, src);
    copy_ascii_id(dst, size, dst);
}

static const char *str_field(json_t *o, const char *key)
{
    const char *v = json_string_value(json_object_get(o, key));
    return v ? v : "";
}

/* One listed object into *obj; -1 when it is not an object of `what` with
 * an id. */
static int read_listed(json_t *o, enum provider_list_of what,
                       struct provider_listed *obj)
{
    const char *type = what == PROVIDER_LIST_REFUNDS ? "refund" : "payment_intent";
    memset(obj, 0, sizeof(*obj));
    if (!json_is_object(o) || strcmp(str_field(o, "object"), type) != 0 ||
        !*str_field(o, "id"))
        return -1;
    json_t *md = json_object_get(o, "metadata");
    copy_ascii_id(obj->id, sizeof(obj->id), str_field(o, "id"));
    copy_ascii(obj->status, sizeof(obj->status), str_field(o, "status"));
    copy_ascii(obj->currency, sizeof(obj->currency), str_field(o, "currency"));
    obj->amount = json_integer_value(json_object_get(o, "amount"));
    obj->created = json_integer_value(json_object_get(o, "created"));
    /* An empty one is no more ours than none. */
    obj->has_attempt_metadata = *str_field(md, "payment_attempt_id") != '\0';
    copy_ascii(obj->payment_attempt_id, sizeof(obj->payment_attempt_id),
               str_field(md, "payment_attempt_id"));
    copy_ascii(obj->order_id, sizeof(obj->order_id), str_field(md, "order_id"));
    copy_ascii(obj->refund_id, sizeof(obj->refund_id), str_field(md, "refund_id"));
    /* A refund names its intent as an id, or expanded as an object. */
    json_t *pi = json_object_get(o, "payment_intent");
    copy_ascii_id(obj->payment_intent, sizeof(obj->payment_intent),
                  json_is_object(pi) ? str_field(pi, "id") : json_string_value(pi));
    return 0;
}

/* A GET's answer, parsed here, not classified: *doc the JSON of a 200 (the
 * caller decrefs it), or NULL with res->outcome and res->error set. */
static json_t *answer_json(int http, const char *body, size_t body_len,
                           struct provider_result *res)
{
    json_error_t jerr;
    json_t *doc = body ? json_loadb(body, body_len, 0, &jerr) : NULL;
    res->http_status = http;
    if (http == 404) {
        const char *code =
            json_string_value(json_object_get(json_object_get(doc, "error"), "code"));
        res->outcome = code && !strcmp(code, "resource_missing") ? PROVIDER_NOT_FOUND
                                                                 : PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "answered 404%s",
                 res->outcome == PROVIDER_NOT_FOUND ? " resource_missing" : "");
        json_decref(doc);
        return NULL;
    }
    if (http != 200 || !json_is_object(doc)) {
        res->outcome = http >= 400 && http < 500 && http != 429 ? PROVIDER_INVALID
                                                                : PROVIDER_UNKNOWN;
        snprintf(res->error, sizeof(res->error), "answered %d%s", http,
                 http == 200 ? " without a JSON object" : "");
        json_decref(doc);
        return NULL;
    }
    res->outcome = PROVIDER_SUCCEEDED;
    return doc;
}

/* A GET over the wire, its answer as answer_json's. */
static json_t *get_json(provider_client_t *pc, const char *url,
                        struct provider_result *res)
{
    json_t *doc = NULL;
    memset(res, 0, sizeof(*res));
    res->outcome = PROVIDER_UNKNOWN;
    struct provider_xfer *x = xfer_new(pc, url, NULL, 1);
    if (!x) {
        copy_str(res->error, sizeof(res->error), "provider client: out of memory");
        return NULL;
    }
    curl_easy_setopt(x->easy, CURLOPT_HTTPGET, 1L);
    CURLcode cc = curl_easy_perform(x->easy);
    long http = 0;
    curl_easy_getinfo(x->easy, CURLINFO_RESPONSE_CODE, &http);
    if (cc != CURLE_OK) {
        res->http_status = 0;
        snprintf(res->error, sizeof(res->error), "%s", curl_easy_strerror(cc));
        goto out;
    }
    doc = answer_json((int)http, x->answer, x->answer_len, res);
out:
    xfer_free(x);
    return doc;
}

/* A list page's JSON into *page (res->outcome SUCCEEDED), or res->outcome
 * INVALID and an empty page. */
static void read_page(json_t *doc, enum provider_list_of what,
                      struct provider_page *page, struct provider_result *res)
{
    json_t *data = json_object_get(doc, "data"), *o;
    size_t i;
    if (strcmp(str_field(doc, "object"), "list") != 0 || !json_is_array(data) ||
        json_array_size(data) > PROVIDER_PAGE_MAX ||
        !json_is_boolean(json_object_get(doc, "has_more"))) {
        res->outcome = PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "list answer is not a list page");
        goto out;
    }
    json_array_foreach(data, i, o)
    {
        if (read_listed(o, what, &page->items[i]) != 0) {
            res->outcome = PROVIDER_INVALID;
            snprintf(res->error, sizeof(res->error),
                     "list item %zu is not a %s with an id", i,
                     what == PROVIDER_LIST_REFUNDS ? "refund" : "payment intent");
            page->n = 0;
            goto out;
        }
        page->n++;
    }
    page->has_more = json_is_true(json_object_get(doc, "has_more"));
    /* More to come, yet nothing to start the next page after: no cursor,
     * no evidence. */
    if (page->has_more && page->n == 0) {
        res->outcome = PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "list page empty with has_more");
    }
out:
    if (res->outcome != PROVIDER_SUCCEEDED) {
        page->n = 0;
        page->has_more = 0;
    }
}

void provider_client_parse_page(enum provider_list_of what, int http_status,
                                const char *body, size_t body_len,
                                struct provider_page *page, struct provider_result *res)
{
    memset(res, 0, sizeof(*res));
    page->n = 0;
    page->has_more = 0;
    json_t *doc = answer_json(http_status, body, body_len, res);
    if (doc)
        read_page(doc, what, page, res);
    json_decref(doc);
}

int provider_client_list_page(provider_client_t *pc, enum provider_list_of what,
                              long long created_gte, long long created_lt,
                              const char *starting_after, struct provider_page *page,
                              struct provider_result *res)
{
    char url[1024];
    char *after = starting_after && *starting_after
                      ? curl_easy_escape(NULL, starting_after, 0)
                      : NULL;
    page->n = 0;
    page->has_more = 0;
    snprintf(url, sizeof(url),
             "%s/v1/%s?created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld&limit=%d%s%s",
             pc->base_url,
             what == PROVIDER_LIST_REFUNDS ? "refunds" : "payment_intents", created_gte,
             created_lt, PROVIDER_PAGE_MAX, after ? "&starting_after=" : "",
             after ? after : "");
    curl_free(after);
    json_t *doc = get_json(pc, url, res);
    if (doc)
        read_page(doc, what, page, res);
    json_decref(doc);
    return 0;
}

int provider_client_fetch(provider_client_t *pc, enum provider_list_of what,
                          const char *id, struct provider_listed *obj,
                          struct provider_result *res)
{
    char url[1024];
    char *eid = curl_easy_escape(NULL, id ? id : "", 0);
    memset(obj, 0, sizeof(*obj));
    snprintf(url, sizeof(url), "%s/v1/%s/%s", pc->base_url,
             what == PROVIDER_LIST_REFUNDS ? "refunds" : "payment_intents",
             eid ? eid : "");
    curl_free(eid);
    json_t *doc = get_json(pc, url, res);
    if (!doc)
        return 0;
    if (read_listed(doc, what, obj) != 0 || strcmp(obj->id, id) != 0) {
        res->outcome = PROVIDER_INVALID;
        snprintf(res->error, sizeof(res->error), "answer is not the object asked for");
    }
    json_decref(doc);
    return 0;
}
