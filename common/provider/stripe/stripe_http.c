#include "stripe_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>

#include "charged_assert.h"

#define MAX_ANSWER (1024 * 1024)
/* Bytes curl reads from the socket at a time, per transfer. */
#define STRIPE_RECEIVE_BUFFER 4096L

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

static void share_lock(CURL *h, curl_lock_data data, curl_lock_access a, void *u)
{
    struct stripe_client *pc = u;
    (void)h;
    (void)a;
    CHARGED_ASSERT((unsigned)data < CURL_LOCK_DATA_LAST);
    pthread_mutex_lock(&pc->share_locks[data]);
}

static void share_unlock(CURL *h, curl_lock_data data, void *u)
{
    struct stripe_client *pc = u;
    (void)h;
    CHARGED_ASSERT((unsigned)data < CURL_LOCK_DATA_LAST);
    pthread_mutex_unlock(&pc->share_locks[data]);
}

void *stripe_open(const char *base_url, const char *api_key, const char *api_version,
                  long timeout_ms, struct charged_error *err)
{
    struct stripe_client *pc;
    size_t n;

    CHARGED_ASSERT(err != NULL);
    if (!base_url || strncmp(base_url, "http", 4) != 0) {
        charged_error_set(err, "provider base url must be http(s)://...");
        return NULL;
    }
    if (!api_key || !*api_key || strpbrk(api_key, "\r\n")) {
        charged_error_set(err, "provider api key is empty or malformed");
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
            charged_error_set(err, "provider api version is malformed");
            stripe_close(pc);
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
    charged_error_set(err, "provider client: out of memory");
    stripe_close(pc);
    return NULL;
}

void stripe_xfer_free(struct stripe_xfer *x)
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

void stripe_close(void *impl)
{
    struct stripe_client *pc = impl;
    if (!pc)
        return;
    stripe_abandon_all(pc);
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
    struct stripe_xfer *x = u;
    size_t n = size * nmemb;
    CHARGED_ASSERT(x->answer_len <= MAX_ANSWER);
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
    struct stripe_xfer *x = u;
    (void)h;
    (void)data;
    if (type == CURLINFO_HEADER_OUT || type == CURLINFO_DATA_OUT)
        x->bytes_out += size;
    if (type == CURLINFO_HEADER_OUT)
        x->sends++;
    return 0;
}

/* Appends one header line (copied); 0 / -1, the list intact on failure. */
static int add_header(struct stripe_xfer *x, const char *line)
{
    CHARGED_ASSERT(x != NULL && line != NULL);
    struct curl_slist *h = curl_slist_append(x->headers, line);
    if (!h)
        return -1;
    x->headers = h;
    return 0;
}

struct stripe_xfer *stripe_xfer_new(struct stripe_client *pc, const char *url,
                                    char *body, int with_share)
{
    CHARGED_ASSERT(pc != NULL && url != NULL);
    struct stripe_xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        free(body);
        return NULL;
    }
    x->body = body;
    x->easy = curl_easy_init();
    if (!x->easy || add_header(x, pc->auth_header) || add_header(x, "Expect:") ||
        (pc->version_header && add_header(x, pc->version_header))) {
        stripe_xfer_free(x);
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
    curl_easy_setopt(e, CURLOPT_BUFFERSIZE, STRIPE_RECEIVE_BUFFER);
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
int stripe_form_add(char **body, size_t *len, const char *name, const char *value)
{
    CHARGED_ASSERT(body != NULL && len != NULL && name != NULL);
    CHARGED_ASSERT(*len == 0 || (*body && strlen(*body) == *len));
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
 * and path, with an Idempotency-Key the caller has checked. NULL with err
 * on failure. */
struct stripe_xfer *stripe_post_xfer(struct stripe_client *pc, const char *path,
                                     char *body, const char *idempotency_key,
                                     int with_share, struct charged_error *err)
{
    /* The caller checked the key: one line, never empty. */
    CHARGED_ASSERT(idempotency_key != NULL && *idempotency_key);
    char url[1024], *hdr = NULL;
    struct stripe_xfer *x = NULL;

    if ((size_t)snprintf(url, sizeof(url), "%s%s", pc->base_url, path) >= sizeof(url)) {
        charged_error_set(err, "provider url too long");
        free(body);
        return NULL;
    }
    x = stripe_xfer_new(pc, url, body, with_share);
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
    charged_error_set(err, "provider client: out of memory");
    stripe_xfer_free(x);
    x = NULL;
out:
    free(hdr);
    return x;
}

/* A throttled answer's Retry-After (seconds), as the result's bounded
 * milliseconds; nothing for any other answer. */
void stripe_retry_after(struct stripe_xfer *x, struct provider_result *res)
{
    CHARGED_ASSERT(x != NULL && res != NULL);
    struct curl_header *h = NULL;
    if (!res->throttled ||
        curl_easy_header(x->easy, "Retry-After", 0, CURLH_HEADER, -1, &h) != CURLHE_OK)
        return;
    res->retry_after_ms = provider_outcome_retry_after_ms(h->value);
    CHARGED_ASSERT(res->retry_after_ms <= PROVIDER_RETRY_AFTER_MAX_MS);
}

/* Turns a finished transfer into a result. */
void stripe_finish(struct stripe_xfer *x, CURLcode cc, struct provider_result *res)
{
    CHARGED_ASSERT(x != NULL && x->easy != NULL && res != NULL);
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
    stripe_classify(&x->call, (int)http, replayed ? replayed->value : NULL, x->answer,
                    x->answer_len, res);
    stripe_retry_after(x, res);
}

void stripe_lookup(struct stripe_client *pc, const char *url, enum provider_lookup kind,
                   int refund, const char *attempt_id, struct provider_result *res)
{
    struct stripe_xfer *x = stripe_xfer_new(pc, url, NULL, 1);
    if (!x) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_UNKNOWN;
        stripe_copy_str(res->error, sizeof(res->error),
                        "provider client: out of memory");
        return;
    }
    x->call.lookup = 1;
    x->call.kind = kind;
    x->call.refund = refund;
    snprintf(x->call.attempt_id, sizeof(x->call.attempt_id), "%s",
             attempt_id ? attempt_id : "");
    curl_easy_setopt(x->easy, CURLOPT_HTTPGET, 1L);
    stripe_finish(x, curl_easy_perform(x->easy), res);
    /* A look-up that never got an answer says nothing about the intent. */
    if (res->http_status == 0)
        res->outcome = PROVIDER_UNKNOWN;
    CHARGED_ASSERT(res->http_status != 0 || res->outcome == PROVIDER_UNKNOWN);
    stripe_xfer_free(x);
}

/* Hands x to the multi handle; on failure frees it: CHARGED_RETRY. */
enum charged_rc stripe_start_async(struct stripe_client *pc, struct stripe_xfer *x,
                                   void *opaque, struct charged_error *err)
{
    CHARGED_ASSERT(pc != NULL && x != NULL && x->easy != NULL);
    x->opaque = opaque;
    if (curl_multi_add_handle(pc->multi, x->easy) != CURLM_OK) {
        charged_error_set(err, "provider client: cannot start transfer");
        stripe_xfer_free(x);
        return CHARGED_RETRY;
    }
    x->next = pc->async;
    x->prev = NULL;
    if (pc->async)
        pc->async->prev = x;
    pc->async = x;
    pc->in_flight++;
    return CHARGED_OK;
}

void stripe_perform(void *impl, int timeout_ms, const int *wake_fds, size_t n_wake)
{
    struct stripe_client *pc = impl;
    struct curl_waitfd wake[PROVIDER_WAKE_FDS_MAX];
    int running = 0;
    CHARGED_ASSERT(n_wake <= PROVIDER_WAKE_FDS_MAX);
    if (pc->in_flight == 0 && n_wake == 0)
        return;
    if (pc->in_flight > 0)
        curl_multi_perform(pc->multi, &running);
    /* A transfer that ended in that perform (an answer that came while the
     * caller was busy) is the caller's at once: no wait, which nothing of
     * its socket would end. */
    CHARGED_ASSERT(running >= 0 && (size_t)running <= pc->in_flight);
    if ((size_t)running < pc->in_flight)
        return;
    /* One poll over the transfers' sockets and the caller's fds: curl's own
     * timers shorten it, so nothing of curl's waits for the timeout. */
    for (size_t i = 0; i < n_wake; i++)
        wake[i] = (struct curl_waitfd){.fd = wake_fds[i], .events = CURL_WAIT_POLLIN};
    if (timeout_ms > 0 && (running > 0 || n_wake > 0)) {
        curl_multi_poll(pc->multi, n_wake ? wake : NULL, (unsigned)n_wake, timeout_ms,
                        NULL);
        if (pc->in_flight > 0)
            curl_multi_perform(pc->multi, &running);
    }
}

int stripe_next_done(void *impl, struct provider_result *res, void **opaque)
{
    struct stripe_client *pc = impl;
    int left;
    CURLMsg *m;
    while ((m = curl_multi_info_read(pc->multi, &left))) {
        struct stripe_xfer *x = NULL;
        if (m->msg != CURLMSG_DONE)
            continue;
        CURLcode cc = m->data.result;
        curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        CHARGED_ASSERT(x != NULL && pc->in_flight > 0);
        curl_multi_remove_handle(pc->multi, x->easy);
        /* Every transfer the multi handle has is listed. */
        CHARGED_ASSERT(x->prev ? x->prev->next == x : pc->async == x);
        CHARGED_ASSERT(!x->next || x->next->prev == x);
        if (x->prev)
            x->prev->next = x->next;
        else
            pc->async = x->next;
        if (x->next)
            x->next->prev = x->prev;
        x->next = x->prev = NULL;
        stripe_finish(x, cc, res);
        if (x->call.lookup && res->http_status == 0)
            res->outcome = PROVIDER_UNKNOWN;
        *opaque = x->opaque;
        pc->in_flight--;
        stripe_xfer_free(x);
        return 1;
    }
    return 0;
}

size_t stripe_in_flight(const void *impl)
{
    const struct stripe_client *pc = impl;
    return pc->in_flight;
}

void stripe_abandon_all(void *impl)
{
    struct stripe_client *pc = impl;
    while (pc->async) {
        struct stripe_xfer *x = pc->async;
        pc->async = x->next;
        if (pc->async)
            pc->async->prev = NULL;
        curl_multi_remove_handle(pc->multi, x->easy);
        stripe_xfer_free(x);
    }
    pc->in_flight = 0;
}

/* A GET over the wire, its answer as answer_json's. */
json_t *stripe_get_json(struct stripe_client *pc, const char *url,
                        struct provider_result *res)
{
    json_t *doc = NULL;
    memset(res, 0, sizeof(*res));
    res->outcome = PROVIDER_UNKNOWN;
    struct stripe_xfer *x = stripe_xfer_new(pc, url, NULL, 1);
    if (!x) {
        stripe_copy_str(res->error, sizeof(res->error),
                        "provider client: out of memory");
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
    doc = stripe_answer_json((int)http, x->answer, x->answer_len, res);
    stripe_retry_after(x, res);
    CHARGED_ASSERT(!doc || res->outcome == PROVIDER_SUCCEEDED);
out:
    stripe_xfer_free(x);
    return doc;
}
