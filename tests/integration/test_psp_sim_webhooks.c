/* psp-sim's webhooks, delivered for real on loopback to a receiver run by the
 * test, which checks each Stripe-Signature itself: one signed event per
 * change of an intent's status, retries until a 2xx, duplicates, reordering
 * under a seed, secret rotation, crafted events, a bounded queue, a
 * shutdown that does not wait for a dead receiver, and a secret that is
 * never printed. */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "psp_sim_process.h"
#include "test_env.h"

#define MAX_DELIVERIES 256
#define MAX_V1         4

/* ---- the receiver: records every POST and checks its signature ---- */

struct delivery {
    char *body;
    json_t *event; /* parsed body */
    char content_type[64];
    long long t;       /* the signature's timestamp */
    int v1_count;      /* v1 values in the header */
    int v1_by[MAX_V1]; /* which of the receiver's secrets made each v1; -1: none */
    int answered;      /* the status the receiver answered */
};

struct receiver {
    struct MHD_Daemon *d;
    char url[64];
    pthread_mutex_t lock;
    pthread_cond_t cond;
    const char *secrets[3]; /* the secrets a v1 is checked against */
    int fail_first;         /* answer non-2xx to the first N requests */
    size_t n;               /* requests recorded */
    struct delivery dl[MAX_DELIVERIES];
};

struct upload {
    char *p;
    size_t n;
};

static void hmac_hex(const char *secret, long long t, const char *body, char out[65])
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    size_t n = strlen(body) + 32;
    char *msg = malloc(n);
    int m = snprintf(msg, n, "%lld.%s", t, body);
    HMAC(EVP_sha256(), secret, (int)strlen(secret), (unsigned char *)msg, (size_t)m,
         mac, &len);
    free(msg);
    for (unsigned i = 0; i < len; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
}

/* Parses "t=<unix>,v1=<hex>[,v1=<hex>...]" and finds which secret made each
 * v1, the way a receiver verifies it. */
static void verify(struct receiver *rc, struct delivery *d, const char *header)
{
    char buf[1024], *save = NULL;
    d->t = -1;
    snprintf(buf, sizeof(buf), "%s", header ? header : "");
    for (char *part = strtok_r(buf, ",", &save); part;
         part = strtok_r(NULL, ",", &save)) {
        if (!strncmp(part, "t=", 2))
            d->t = atoll(part + 2);
        else if (!strncmp(part, "v1=", 3) && d->v1_count < MAX_V1)
            d->v1_count++;
    }
    snprintf(buf, sizeof(buf), "%s", header ? header : "");
    int k = 0;
    for (char *part = strtok_r(buf, ",", &save); part;
         part = strtok_r(NULL, ",", &save)) {
        if (strncmp(part, "v1=", 3) != 0 || k >= MAX_V1)
            continue;
        d->v1_by[k] = -1;
        for (int s = 0; s < 3 && rc->secrets[s]; s++) {
            char want[65];
            hmac_hex(rc->secrets[s], d->t, d->body, want);
            if (!strcmp(want, part + 3))
                d->v1_by[k] = s;
        }
        k++;
    }
}

static enum MHD_Result on_hook(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version,
                               const char *data, size_t *size, void **con_cls)
{
    static const int failures[] = {500, 400, 503, 404};
    struct receiver *rc = cls;
    struct upload *u = *con_cls;
    (void)url;
    (void)method;
    (void)version;

    if (!u) {
        *con_cls = calloc(1, sizeof(*u));
        return *con_cls ? MHD_YES : MHD_NO;
    }
    if (*size) {
        u->p = realloc(u->p, u->n + *size + 1);
        memcpy(u->p + u->n, data, *size);
        u->n += *size;
        u->p[u->n] = '\0';
        *size = 0;
        return MHD_YES;
    }
    const char *sig =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Stripe-Signature");
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
    int status = 200;
    pthread_mutex_lock(&rc->lock);
    if (rc->n < (size_t)rc->fail_first)
        status = failures[rc->n % 4];
    if (rc->n < MAX_DELIVERIES) {
        struct delivery *d = &rc->dl[rc->n];
        d->body = strdup(u->p ? u->p : "");
        d->event = json_loads(d->body, 0, NULL);
        snprintf(d->content_type, sizeof(d->content_type), "%s", ct ? ct : "");
        d->answered = status;
        verify(rc, d, sig);
    }
    rc->n++;
    pthread_cond_broadcast(&rc->cond);
    pthread_mutex_unlock(&rc->lock);

    struct MHD_Response *resp =
        MHD_create_response_from_buffer(2, "{}", MHD_RESPMEM_PERSISTENT);
    enum MHD_Result r = MHD_queue_response(c, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return r;
}

static void on_done(void *cls, struct MHD_Connection *c, void **con_cls,
                    enum MHD_RequestTerminationCode toe)
{
    struct upload *u = *con_cls;
    (void)cls;
    (void)c;
    (void)toe;
    if (u)
        free(u->p);
    free(u);
    *con_cls = NULL;
}

static struct receiver *receiver_start(const char *s0, const char *s1, const char *s2,
                                       int fail_first)
{
    struct receiver *rc = calloc(1, sizeof(*rc));
    struct sockaddr_in sa = {0};
    ck_assert_ptr_nonnull(rc);
    pthread_mutex_init(&rc->lock, NULL);
    pthread_cond_init(&rc->cond, NULL);
    rc->secrets[0] = s0;
    rc->secrets[1] = s1;
    rc->secrets[2] = s2;
    rc->fail_first = fail_first;
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    rc->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_hook,
                             rc, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_NOTIFY_COMPLETED,
                             on_done, NULL, MHD_OPTION_END);
    ck_assert_ptr_nonnull(rc->d);
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(rc->d, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(rc->url, sizeof(rc->url), "http://127.0.0.1:%u/v1/webhooks/provider",
             (unsigned)info->port);
    return rc;
}

static void receiver_stop(struct receiver *rc)
{
    MHD_stop_daemon(rc->d);
    for (size_t i = 0; i < rc->n && i < MAX_DELIVERIES; i++) {
        free(rc->dl[i].body);
        json_decref(rc->dl[i].event);
    }
    pthread_cond_destroy(&rc->cond);
    pthread_mutex_destroy(&rc->lock);
    free(rc);
}

/* Waits until the receiver has recorded n requests, or fails after 15 s. A
 * recorded delivery never changes, so the caller may read dl[0..n) after. */
static void receiver_wait(struct receiver *rc, size_t n)
{
    long long deadline = test_env_now_ms() + 15000;
    pthread_mutex_lock(&rc->lock);
    while (rc->n < n) {
        long long left = deadline - test_env_now_ms();
        if (left <= 0)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += left / 1000;
        ts.tv_nsec += (left % 1000) * 1000000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        pthread_cond_timedwait(&rc->cond, &rc->lock, &ts);
    }
    size_t got = rc->n;
    pthread_mutex_unlock(&rc->lock);
    ck_assert_msg(got >= n, "the receiver got %zu requests in 15 s, want %zu", got, n);
}

static size_t receiver_count(struct receiver *rc)
{
    pthread_mutex_lock(&rc->lock);
    size_t n = rc->n;
    pthread_mutex_unlock(&rc->lock);
    return n;
}

/* A socket that listens but never accepts: connections open (the kernel's
 * backlog takes them) and no answer ever comes. */
static int silent_listener(char *url, size_t url_size)
{
    struct sockaddr_in sa = {0};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    snprintf(url, url_size, "http://127.0.0.1:%d/hook", ntohs(sa.sin_port));
    return fd;
}

/* ---- talking to psp-sim ---- */

struct answer {
    long status;
    char *body;
    size_t len;
    json_t *json;
};

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *u)
{
    struct answer *a = u;
    size_t n = size * nmemb;
    a->body = realloc(a->body, a->len + n + 1);
    memcpy(a->body + a->len, ptr, n);
    a->len += n;
    a->body[a->len] = '\0';
    return n;
}

static void answer_free(struct answer *a)
{
    free(a->body);
    json_decref(a->json);
    memset(a, 0, sizeof(*a));
}

/* admin: 1 for the admin port (no key), 0 for the provider API. */
static struct answer http(struct psp_sim_process *p, int admin, const char *method,
                          const char *path, const char *key, const char *body)
{
    struct answer a = {0};
    struct curl_slist *h = NULL;
    char url[512], hdr[512];
    CURL *e = curl_easy_init();
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", admin ? p->admin_port : p->port,
             path);
    if (!admin) {
        h = curl_slist_append(h, "Authorization: Bearer " PSP_SIM_TEST_KEY);
        if (key) {
            snprintf(hdr, sizeof(hdr), "Idempotency-Key: %s", key);
            h = curl_slist_append(h, hdr);
        }
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    if (body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    CURLcode cc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a.status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    ck_assert_msg(cc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(cc));
    if (a.body)
        a.json = json_loads(a.body, 0, NULL);
    return a;
}

static struct answer charge(struct psp_sim_process *p, const char *key,
                            const char *attempt, const char *pm)
{
    char body[512];
    snprintf(body, sizeof(body),
             "amount=1999&currency=eur&payment_method=%s&confirm=true&off_session=true"
             "&metadata%%5Bpayment_attempt_id%%5D=%s&metadata%%5Border_id%%5D=o-%s",
             pm, attempt, attempt);
    return http(p, 0, "POST", "/v1/payment_intents", key, body);
}

/* Charges and returns the new intent's id (the caller frees it). */
static char *charge_id(struct psp_sim_process *p, const char *key, const char *attempt,
                       const char *pm)
{
    struct answer a = charge(p, key, attempt, pm);
    json_t *pi = a.status == 402 ? json_object_get(json_object_get(a.json, "error"),
                                                   "payment_intent")
                                 : a.json;
    const char *id = json_string_value(json_object_get(pi, "id"));
    ck_assert_msg(id != NULL, "charge %s answered %ld: %s", key, a.status, a.body);
    char *out = strdup(id);
    answer_free(&a);
    return out;
}

static void settle(struct psp_sim_process *p, const char *id, const char *body)
{
    char path[128];
    snprintf(path, sizeof(path), "/intents/%s/settle", id);
    struct answer a = http(p, 1, "POST", path, NULL, body);
    ck_assert_msg(a.status == 200, "settle %s answered %ld", id, a.status);
    answer_free(&a);
}

static json_t *retrieve(struct psp_sim_process *p, const char *id)
{
    char path[128];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s", id);
    struct answer a = http(p, 0, "GET", path, NULL, NULL);
    ck_assert_int_eq(a.status, 200);
    json_t *j = json_incref(a.json);
    answer_free(&a);
    return j;
}

static long long stat_of(struct psp_sim_process *p, const char *name)
{
    json_t *s = psp_sim_admin(p, "GET", "/webhooks", NULL);
    ck_assert_msg(json_is_integer(json_object_get(s, name)), "no counter '%s'", name);
    long long v = json_integer_value(json_object_get(s, name));
    json_decref(s);
    return v;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* Waits until psp-sim has nothing pending, or fails after 15 s. */
static void wait_drained(struct psp_sim_process *p)
{
    long long deadline = test_env_now_ms() + 15000;
    while (stat_of(p, "pending") != 0) {
        ck_assert_msg(test_env_now_ms() < deadline,
                      "deliveries still pending after 15 s");
        pause_ms(10);
    }
}

static const char *jstr(json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}

static json_t *data_object(const struct delivery *d)
{
    return json_object_get(json_object_get(d->event, "data"), "object");
}

/* The shape every event has, and a signature by secret number `by` alone. */
static void check_event(const struct delivery *d, int by)
{
    long long now = (long long)time(NULL);
    ck_assert_msg(d->event != NULL, "the body is not JSON: %s", d->body);
    ck_assert_str_eq(d->content_type, "application/json");
    ck_assert_msg(!strncmp(jstr(d->event, "id"), "evt_", 4), "id %s",
                  jstr(d->event, "id"));
    ck_assert_str_eq(jstr(d->event, "object"), "event");
    ck_assert(json_is_false(json_object_get(d->event, "livemode")));
    ck_assert(json_is_integer(json_object_get(d->event, "created")));
    ck_assert_str_eq(jstr(data_object(d), "object"), "payment_intent");
    ck_assert_msg(d->t >= now - 300 && d->t <= now + 1, "t=%lld, now %lld", d->t, now);
    ck_assert_int_eq(d->v1_count, 1);
    ck_assert_msg(d->v1_by[0] == by, "v1 made by secret %d, want %d", d->v1_by[0], by);
}

/* The index of the delivery with this type about this intent, or fails. */
static size_t find(struct receiver *rc, size_t n, const char *type, const char *intent)
{
    for (size_t i = 0; i < n; i++)
        if (!strcmp(jstr(rc->dl[i].event, "type"), type) &&
            !strcmp(jstr(data_object(&rc->dl[i]), "id"), intent))
            return i;
    ck_abort_msg("no %s event about %s", type, intent);
    return 0;
}

static void setup(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

/* ---- the tests ---- */

START_TEST(each_status_change_is_one_signed_event)
{
    const char *secret = "whsec_test_each_change";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    char env[128];
    /* The secret from the environment, so that it is not on the command line. */
    snprintf(env, sizeof(env), "PSP_SIM_WEBHOOK_SECRET=%s", secret);
    const char *envs[] = {env, NULL};
    const char *args[] = {"--webhook-url", rc->url, NULL};
    sim.env = envs;
    psp_sim_start(&sim, args);

    struct answer ok = charge(&sim, "k-ok", "a-ok", "pm_card_visa");
    ck_assert_int_eq(ok.status, 200);
    struct answer again = charge(&sim, "k-ok", "a-ok", "pm_card_visa"); /* a replay */
    ck_assert_int_eq(again.status, 200);
    struct answer dec = charge(&sim, "k-dec", "a-dec", "pm_card_chargeDeclined");
    ck_assert_int_eq(dec.status, 402);
    char *proc = charge_id(&sim, "k-proc", "a-proc", "pm_card_processing");
    settle(&sim, proc, "{\"status\":\"succeeded\"}");
    char *proc2 = charge_id(&sim, "k-proc2", "a-proc2", "pm_card_processing");
    settle(&sim, proc2,
           "{\"status\":\"requires_payment_method\",\"decline_code\":\"insufficient_"
           "funds\"}");
    char *proc3 = charge_id(&sim, "k-proc3", "a-proc3", "pm_card_processing");
    settle(&sim, proc3, "{\"status\":\"canceled\"}");

    /* Eight changes: the replay is none. */
    receiver_wait(rc, 8);
    wait_drained(&sim);
    ck_assert_uint_eq(receiver_count(rc), 8);
    for (size_t i = 0; i < 8; i++) {
        check_event(&rc->dl[i], 0);
        for (size_t j = 0; j < i; j++)
            ck_assert_str_ne(jstr(rc->dl[i].event, "id"), jstr(rc->dl[j].event, "id"));
    }
    const char *ok_id = jstr(ok.json, "id");
    json_t *dec_pi =
        json_object_get(json_object_get(dec.json, "error"), "payment_intent");
    const char *dec_id = jstr(dec_pi, "id");

    /* data.object is the intent exactly as the API showed it then. */
    size_t i_ok = find(rc, 8, "payment_intent.succeeded", ok_id);
    ck_assert(json_equal(data_object(&rc->dl[i_ok]), ok.json));
    ck_assert_str_eq(jstr(json_object_get(data_object(&rc->dl[i_ok]), "metadata"),
                          "payment_attempt_id"),
                     "a-ok");
    size_t i_dec = find(rc, 8, "payment_intent.payment_failed", dec_id);
    ck_assert(json_equal(data_object(&rc->dl[i_dec]), dec_pi));

    /* Each processing intent: processing first, then how it settled, as
     * retrieve shows it now. */
    const struct {
        const char *id, *then, *status;
    } settled[] = {
        {proc, "payment_intent.succeeded", "succeeded"},
        {proc2, "payment_intent.payment_failed", "requires_payment_method"},
        {proc3, "payment_intent.canceled", "canceled"},
    };
    for (size_t k = 0; k < 3; k++) {
        size_t a = find(rc, 8, "payment_intent.processing", settled[k].id);
        size_t b = find(rc, 8, settled[k].then, settled[k].id);
        ck_assert_uint_lt(a, b);
        ck_assert_str_eq(jstr(data_object(&rc->dl[a]), "status"), "processing");
        ck_assert_str_eq(jstr(data_object(&rc->dl[b]), "status"), settled[k].status);
        json_t *now = retrieve(&sim, settled[k].id);
        ck_assert(json_equal(data_object(&rc->dl[b]), now));
        json_decref(now);
    }
    json_t *code = json_object_get(
        json_object_get(
            data_object(&rc->dl[find(rc, 8, "payment_intent.payment_failed", proc2)]),
            "last_payment_error"),
        "decline_code");
    ck_assert_str_eq(json_string_value(code), "insufficient_funds");

    ck_assert_int_eq(stat_of(&sim, "delivered"), 8);
    ck_assert_int_eq(stat_of(&sim, "sends"), 8);
    ck_assert_int_eq(stat_of(&sim, "failures"), 0);
    ck_assert_int_eq(stat_of(&sim, "events"), 8);
    json_t *st = psp_sim_admin(&sim, "GET", "/webhooks", NULL);
    ck_assert_str_eq(jstr(st, "url"), rc->url);
    json_decref(st);

    /* The last events, oldest first, each acknowledged. */
    json_t *ev = psp_sim_admin(&sim, "GET", "/webhooks/events?limit=3", NULL);
    json_t *list = json_object_get(ev, "events");
    ck_assert_uint_eq(json_array_size(list), 3);
    for (size_t k = 0; k < 3; k++) {
        json_t *e = json_array_get(list, k);
        ck_assert_str_eq(jstr(e, "id"), jstr(rc->dl[5 + k].event, "id"));
        ck_assert_str_eq(jstr(e, "type"), jstr(rc->dl[5 + k].event, "type"));
        ck_assert_str_eq(jstr(e, "intent"), jstr(data_object(&rc->dl[5 + k]), "id"));
        ck_assert(json_is_true(json_object_get(e, "acknowledged")));
        ck_assert_int_eq(json_integer_value(json_object_get(e, "attempts")), 1);
    }
    json_decref(ev);
    struct answer bad = http(&sim, 1, "GET", "/webhooks/events?limit=0", NULL, NULL);
    ck_assert_int_eq(bad.status, 400);

    psp_sim_stop(&sim);
    receiver_stop(rc);
    answer_free(&ok);
    answer_free(&again);
    answer_free(&dec);
    answer_free(&bad);
    free(proc);
    free(proc2);
    free(proc3);
}
END_TEST

START_TEST(an_intent_that_settles_by_itself_is_delivered_unread)
{
    const char *secret = "whsec_test_self_settle";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {
        "--webhook-url", rc->url, "--webhook-secret", secret, "--processing-settle-ms",
        "300",           NULL};
    psp_sim_start(&sim, args);
    char *id = charge_id(&sim, "k-self", "a-self", "pm_card_processing");

    /* Nobody reads the intent: its success must come anyway. */
    receiver_wait(rc, 2);
    check_event(&rc->dl[0], 0);
    check_event(&rc->dl[1], 0);
    ck_assert_str_eq(jstr(rc->dl[0].event, "type"), "payment_intent.processing");
    ck_assert_str_eq(jstr(rc->dl[1].event, "type"), "payment_intent.succeeded");
    ck_assert_str_eq(jstr(data_object(&rc->dl[1]), "id"), id);
    ck_assert_str_eq(jstr(data_object(&rc->dl[1]), "status"), "succeeded");
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_t *row = json_array_get(json_object_get(l, "charges"), 0);
    ck_assert_str_eq(jstr(row, "outcome"), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(row, "settled_at_ms")) -
                         json_integer_value(json_object_get(row, "at_ms")),
                     300);
    ck_assert_int_eq(json_integer_value(json_object_get(rc->dl[1].event, "created")),
                     json_integer_value(json_object_get(row, "settled_at_ms")) / 1000);
    json_decref(l);
    psp_sim_stop(&sim);
    receiver_stop(rc);
    free(id);
}
END_TEST

/* A cancel through the API is a change as any other; its replay is none. */
START_TEST(a_cancel_is_one_canceled_event)
{
    const char *secret = "whsec_test_cancel";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url", rc->url, "--webhook-secret", secret, NULL};
    psp_sim_start(&sim, args);
    char *id = charge_id(&sim, "k-cw", "a-cw", "pm_card_processing");
    char path[160];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s/cancel", id);
    struct answer c = http(&sim, 0, "POST", path, "k-cw-cancel", "");
    ck_assert_int_eq(c.status, 200);
    struct answer again = http(&sim, 0, "POST", path, "k-cw-cancel", "");
    ck_assert_int_eq(again.status, 200);

    receiver_wait(rc, 2);
    wait_drained(&sim);
    ck_assert_uint_eq(receiver_count(rc), 2);
    check_event(&rc->dl[1], 0);
    ck_assert_str_eq(jstr(rc->dl[0].event, "type"), "payment_intent.processing");
    ck_assert_str_eq(jstr(rc->dl[1].event, "type"), "payment_intent.canceled");
    ck_assert(json_equal(data_object(&rc->dl[1]), c.json));
    psp_sim_stop(&sim);
    receiver_stop(rc);
    answer_free(&c);
    answer_free(&again);
    free(id);
}
END_TEST

START_TEST(a_failed_delivery_is_retried_until_2xx)
{
    const char *secret = "whsec_test_retry";
    /* 500, 400, 503, then 200: every non-2xx is a failure. */
    struct receiver *rc = receiver_start(secret, NULL, NULL, 3);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url",
                          rc->url,
                          "--webhook-secret",
                          secret,
                          "--webhook-retry-ms",
                          "10",
                          NULL};
    psp_sim_start(&sim, args);
    char *id = charge_id(&sim, "k-retry", "a-retry", "pm_card_visa");
    receiver_wait(rc, 4);
    wait_drained(&sim);
    ck_assert_uint_eq(receiver_count(rc), 4);
    ck_assert_int_eq(rc->dl[0].answered, 500);
    ck_assert_int_eq(rc->dl[3].answered, 200);
    for (size_t i = 0; i < 4; i++) {
        check_event(&rc->dl[i], 0);
        ck_assert_str_eq(rc->dl[i].body, rc->dl[0].body);
    }
    ck_assert_str_eq(jstr(data_object(&rc->dl[0]), "id"), id);
    ck_assert_int_eq(stat_of(&sim, "delivered"), 1);
    ck_assert_int_eq(stat_of(&sim, "sends"), 4);
    ck_assert_int_eq(stat_of(&sim, "failures"), 3);
    json_t *ev = psp_sim_admin(&sim, "GET", "/webhooks/events", NULL);
    json_t *e = json_array_get(json_object_get(ev, "events"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(e, "attempts")), 4);
    ck_assert(json_is_true(json_object_get(e, "acknowledged")));
    json_decref(ev);
    psp_sim_stop(&sim);

    /* Nobody listening: connection errors are failures too, retried while
     * the charge itself was answered at once. */
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/hook", psp_sim_free_port());
    struct psp_sim_process down = {0};
    const char *args2[] = {"--webhook-url",
                           url,
                           "--webhook-secret",
                           secret,
                           "--webhook-retry-ms",
                           "10",
                           "--webhook-retry-max-ms",
                           "20",
                           NULL};
    psp_sim_start(&down, args2);
    struct answer a = charge(&down, "k-down", "a-down", "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    long long deadline = test_env_now_ms() + 15000;
    while (stat_of(&down, "failures") < 3) {
        ck_assert_msg(test_env_now_ms() < deadline, "no retries to a closed port");
        pause_ms(10);
    }
    ck_assert_int_eq(stat_of(&down, "delivered"), 0);
    ck_assert_int_eq(stat_of(&down, "pending"), 1);
    psp_sim_stop(&down);
    answer_free(&a);
    receiver_stop(rc);
    free(id);
}
END_TEST

START_TEST(duplicate_rate_one_sends_every_event_twice)
{
    const char *secret = "whsec_test_dup";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url",
                          rc->url,
                          "--webhook-secret",
                          secret,
                          "--webhook-duplicate-rate",
                          "1",
                          "--webhook-retry-ms",
                          "10",
                          NULL};
    psp_sim_start(&sim, args);
    for (int i = 0; i < 3; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-dup-%d", i);
        free(charge_id(&sim, key, key + 2, "pm_card_visa"));
    }
    receiver_wait(rc, 6);
    wait_drained(&sim);
    ck_assert_uint_eq(receiver_count(rc), 6);
    for (size_t i = 0; i < 6; i++) {
        size_t same = 0;
        check_event(&rc->dl[i], 0);
        for (size_t j = 0; j < 6; j++)
            if (!strcmp(jstr(rc->dl[i].event, "id"), jstr(rc->dl[j].event, "id"))) {
                ck_assert_str_eq(rc->dl[i].body, rc->dl[j].body);
                same++;
            }
        ck_assert_uint_eq(same, 2);
    }
    ck_assert_int_eq(stat_of(&sim, "delivered"), 3);
    ck_assert_int_eq(stat_of(&sim, "duplicates"), 3);
    ck_assert_int_eq(stat_of(&sim, "sends"), 6);
    psp_sim_stop(&sim);
    receiver_stop(rc);
}
END_TEST

/* Runs psp-sim with a reorder rate and `seed`, makes n charges one after the
 * other and writes the attempt ids in the order their events arrived. */
static void reordered_run(const char *seed, int n, char order[][16],
                          long long *reordered)
{
    const char *secret = "whsec_test_reorder";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url",
                          rc->url,
                          "--webhook-secret",
                          secret,
                          "--webhook-reorder-rate",
                          "0.5",
                          "--seed",
                          seed,
                          NULL};
    psp_sim_start(&sim, args);
    for (int i = 0; i < n; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-%d", i);
        free(charge_id(&sim, key, key + 2, "pm_card_visa"));
    }
    receiver_wait(rc, (size_t)n);
    wait_drained(&sim);
    ck_assert_uint_eq(receiver_count(rc), (size_t)n);
    for (int i = 0; i < n; i++) {
        check_event(&rc->dl[i], 0);
        snprintf(order[i], 16, "%s",
                 jstr(json_object_get(data_object(&rc->dl[i]), "metadata"),
                      "payment_attempt_id"));
    }
    *reordered = stat_of(&sim, "reordered");
    ck_assert_int_eq(stat_of(&sim, "delivered"), n);
    psp_sim_stop(&sim);
    receiver_stop(rc);
}

START_TEST(reorder_rate_delivers_out_of_order_yet_everything_under_a_seed)
{
    enum { N = 20 };
    char first[N][16], second[N][16];
    long long r1, r2;
    int late = 0;
    reordered_run("7", N, first, &r1);
    /* Every charge's event arrived once; some after the one made next. */
    for (int i = 0; i < N; i++) {
        char want[16];
        int seen = 0, at = -1, next_at = -1;
        snprintf(want, sizeof(want), "%d", i);
        for (int j = 0; j < N; j++) {
            char next[16];
            snprintf(next, sizeof(next), "%d", i + 1);
            if (!strcmp(first[j], want)) {
                seen++;
                at = j;
            }
            if (!strcmp(first[j], next))
                next_at = j;
        }
        ck_assert_msg(seen == 1, "attempt %d's event arrived %d times", i, seen);
        if (next_at >= 0 && next_at < at)
            late++;
    }
    ck_assert_msg(late > 0, "no event arrived after the one behind it");
    ck_assert_int_gt(r1, 0);
    /* The same seed and the same charges: the same order. */
    reordered_run("7", N, second, &r2);
    for (int i = 0; i < N; i++)
        ck_assert_str_eq(first[i], second[i]);
    ck_assert_int_eq(r1, r2);
}
END_TEST

START_TEST(rotation_signs_with_the_new_secret_and_the_old_while_kept)
{
    const char *a = "whsec_test_rot_a", *b = "whsec_test_rot_b",
               *c = "whsec_test_rot_c";
    struct receiver *rc = receiver_start(a, b, c, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url", rc->url, "--webhook-secret", a, NULL};
    psp_sim_start(&sim, args);
    free(charge_id(&sim, "k-rot-1", "a-rot-1", "pm_card_visa"));
    receiver_wait(rc, 1);
    check_event(&rc->dl[0], 0);

    struct answer r = http(&sim, 1, "POST", "/webhook-secret", NULL,
                           "{\"secret\":\"whsec_test_rot_b\",\"keep_old\":true}");
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "signing_secrets")), 2);
    ck_assert_ptr_null(strstr(r.body, b));
    free(charge_id(&sim, "k-rot-2", "a-rot-2", "pm_card_visa"));
    receiver_wait(rc, 2);
    /* Two v1 values: the new secret's, then the old one's. */
    ck_assert_int_eq(rc->dl[1].v1_count, 2);
    ck_assert_int_eq(rc->dl[1].v1_by[0], 1);
    ck_assert_int_eq(rc->dl[1].v1_by[1], 0);

    struct answer r2 = http(&sim, 1, "POST", "/webhook-secret", NULL,
                            "{\"secret\":\"whsec_test_rot_c\"}");
    ck_assert_int_eq(r2.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r2.json, "signing_secrets")),
                     1);
    free(charge_id(&sim, "k-rot-3", "a-rot-3", "pm_card_visa"));
    receiver_wait(rc, 3);
    check_event(&rc->dl[2], 2);

    /* Bad bodies are refused without a word of what they held. */
    static const char *const bad[] = {
        "{}",
        "{\"secret\":\"\"}",
        "{\"secret\":\"whsec_probe_value\",\"keep_old\":\"yes\"}",
        "{\"secret\":\"whsec_probe_value\",\"bogus\":1}",
        "{\"secret\":\"whsec_probe_value\"",
        "[\"whsec_probe_value\"]",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct answer x = http(&sim, 1, "POST", "/webhook-secret", NULL, bad[i]);
        ck_assert_msg(x.status == 400, "%s answered %ld", bad[i], x.status);
        ck_assert_ptr_null(strstr(x.body, "whsec_probe_value"));
        answer_free(&x);
    }
    ck_assert_int_eq(stat_of(&sim, "signing_secrets"), 1);
    psp_sim_stop(&sim);
    receiver_stop(rc);
    answer_free(&r);
    answer_free(&r2);
}
END_TEST

START_TEST(emit_queues_crafted_events)
{
    const char *secret = "whsec_test_emit";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url", rc->url, "--webhook-secret", secret, NULL};
    psp_sim_start(&sim, args);
    char *id = charge_id(&sim, "k-emit", "a-emit", "pm_card_visa");
    receiver_wait(rc, 1);

    /* A stale, contradicting event: failed, about an intent that succeeded. */
    char body[512];
    snprintf(body, sizeof(body),
             "{\"intent\":\"%s\",\"type\":\"payment_intent.payment_failed\","
             "\"created\":1000,\"id\":\"evt_crafted_1\"}",
             id);
    struct answer e1 = http(&sim, 1, "POST", "/webhooks/emit", NULL, body);
    ck_assert_int_eq(e1.status, 200);
    ck_assert_str_eq(jstr(e1.json, "id"), "evt_crafted_1");
    receiver_wait(rc, 2);
    check_event(&rc->dl[1], 0);
    ck_assert_str_eq(jstr(rc->dl[1].event, "id"), "evt_crafted_1");
    ck_assert_str_eq(jstr(rc->dl[1].event, "type"), "payment_intent.payment_failed");
    ck_assert_int_eq(json_integer_value(json_object_get(rc->dl[1].event, "created")),
                     1000);
    json_t *pi = data_object(&rc->dl[1]);
    ck_assert_str_eq(jstr(pi, "id"), id);
    ck_assert_str_eq(jstr(pi, "status"), "requires_payment_method");
    ck_assert_str_eq(jstr(json_object_get(pi, "last_payment_error"), "code"),
                     "card_declined");
    ck_assert_str_eq(jstr(json_object_get(pi, "metadata"), "payment_attempt_id"),
                     "a-emit");
    /* psp-sim's own intent did not change. */
    json_t *now = retrieve(&sim, id);
    ck_assert_str_eq(jstr(now, "status"), "succeeded");

    /* Without id and created: a new id, now, and the intent as it is. */
    snprintf(body, sizeof(body),
             "{\"intent\":\"%s\",\"type\":\"payment_intent.succeeded\"}", id);
    struct answer e2 = http(&sim, 1, "POST", "/webhooks/emit", NULL, body);
    ck_assert_int_eq(e2.status, 200);
    receiver_wait(rc, 3);
    check_event(&rc->dl[2], 0);
    ck_assert_str_eq(jstr(rc->dl[2].event, "id"), jstr(e2.json, "id"));
    ck_assert_str_ne(jstr(rc->dl[2].event, "id"), jstr(rc->dl[0].event, "id"));
    ck_assert(json_equal(data_object(&rc->dl[2]), now));
    ck_assert_int_ge(json_integer_value(json_object_get(rc->dl[2].event, "created")),
                     (long long)time(NULL) - 60);

    /* Any PaymentIntent object, about an intent psp-sim never made. */
    const char *foreign = "{\"id\":\"pi_foreign\",\"object\":\"payment_intent\","
                          "\"amount\":5,\"currency\":\"eur\",\"status\":\"succeeded\","
                          "\"metadata\":{\"payment_attempt_id\":\"a-foreign\"}}";
    snprintf(body, sizeof(body),
             "{\"object\":%s,\"type\":\"payment_intent.succeeded\"}", foreign);
    struct answer e3 = http(&sim, 1, "POST", "/webhooks/emit", NULL, body);
    ck_assert_int_eq(e3.status, 200);
    receiver_wait(rc, 4);
    check_event(&rc->dl[3], 0);
    json_t *want = json_loads(foreign, 0, NULL);
    ck_assert(json_equal(data_object(&rc->dl[3]), want));
    json_decref(want);

    static const struct {
        const char *body;
        long status;
    } bad[] = {
        {"{\"intent\":\"pi_nope\",\"type\":\"payment_intent.succeeded\"}", 404},
        {"{\"intent\":\"pi_x\",\"type\":\"charge.succeeded\"}", 400},
        {"{\"intent\":\"pi_x\",\"object\":{},\"type\":\"payment_intent.succeeded\"}",
         400},
        {"{\"type\":\"payment_intent.succeeded\"}", 400},
        {"{\"object\":[],\"type\":\"payment_intent.succeeded\"}", 400},
        {"{\"object\":{},\"type\":\"payment_intent.succeeded\",\"x\":1}", 400},
        {"{\"object\":{},\"type\":\"payment_intent.succeeded\",\"created\":-1}", 400},
        {"{\"object\":{},\"type\":\"payment_intent.succeeded\",\"id\":\"a b\"}", 400},
        {"not json", 400},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct answer x = http(&sim, 1, "POST", "/webhooks/emit", NULL, bad[i].body);
        ck_assert_msg(x.status == bad[i].status, "%s answered %ld, want %ld",
                      bad[i].body, x.status, bad[i].status);
        answer_free(&x);
    }
    wait_drained(&sim);
    ck_assert_int_eq(stat_of(&sim, "events"), 4);
    psp_sim_stop(&sim);

    /* Without --webhook-url nothing is sent, crafted or not. */
    struct psp_sim_process plain = {0};
    psp_sim_start(&plain, NULL);
    struct answer x = http(&plain, 1, "POST", "/webhooks/emit", NULL,
                           "{\"object\":{},\"type\":\"payment_intent.succeeded\"}");
    ck_assert_int_eq(x.status, 409);
    free(charge_id(&plain, "k-plain", "a-plain", "pm_card_visa"));
    ck_assert_int_eq(stat_of(&plain, "events"), 0);
    json_t *st = psp_sim_admin(&plain, "GET", "/webhooks", NULL);
    ck_assert(json_is_null(json_object_get(st, "url")));
    json_decref(st);
    psp_sim_stop(&plain);

    json_decref(now);
    answer_free(&e1);
    answer_free(&e2);
    answer_free(&e3);
    answer_free(&x);
    receiver_stop(rc);
    free(id);
}
END_TEST

START_TEST(a_dead_receiver_blocks_neither_charges_nor_shutdown)
{
    char url[64];
    int fd = silent_listener(url, sizeof(url));
    struct psp_sim_process sim = {0};
    /* A minute per delivery: only the shutdown can end the one in flight. */
    const char *args[] = {"--webhook-url",
                          url,
                          "--webhook-secret",
                          "whsec_test_dead",
                          "--webhook-timeout-ms",
                          "60000",
                          "--webhook-queue-max",
                          "2",
                          NULL};
    psp_sim_start(&sim, args);
    for (int i = 0; i < 5; i++) {
        char key[32];
        snprintf(key, sizeof(key), "k-dead-%d", i);
        struct answer a = charge(&sim, key, key + 2, "pm_card_visa");
        ck_assert_int_eq(a.status, 200); /* answered within the client's 5 s */
        answer_free(&a);
    }
    /* The queue holds two (one in flight): the others were dropped. */
    ck_assert_int_eq(stat_of(&sim, "pending"), 2);
    ck_assert_int_eq(stat_of(&sim, "dropped"), 3);
    ck_assert_int_eq(stat_of(&sim, "events"), 2);
    struct answer e = http(&sim, 1, "POST", "/webhooks/emit", NULL,
                           "{\"object\":{},\"type\":\"payment_intent.succeeded\"}");
    ck_assert_int_eq(e.status, 503);
    answer_free(&e);
    ck_assert_int_eq(stat_of(&sim, "dropped"), 4);

    /* /reset forgets them (the one in flight no longer counts). */
    json_decref(psp_sim_admin(&sim, "POST", "/reset", NULL));
    ck_assert_int_eq(stat_of(&sim, "pending"), 0);
    ck_assert_int_eq(stat_of(&sim, "dropped"), 0);
    ck_assert_int_eq(stat_of(&sim, "events"), 0);
    json_t *ev = psp_sim_admin(&sim, "GET", "/webhooks/events", NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(ev, "events")), 0);
    json_decref(ev);

    /* SIGTERM ends it while a delivery hangs, long before its timeout. */
    int st;
    pid_t pid = sim.pid;
    kill(pid, SIGTERM);
    long long deadline = test_env_now_ms() + 10000;
    pid_t got;
    while ((got = waitpid(pid, &st, WNOHANG)) == 0 && test_env_now_ms() < deadline)
        pause_ms(10);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
    }
    sim.pid = 0;
    ck_assert_msg(got == pid, "psp-sim did not exit within 10 s of SIGTERM");
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(fd);
}
END_TEST

/* Whether the file holds needle. */
static int file_has(const char *path, const char *needle)
{
    FILE *f = fopen(path, "r");
    char *buf;
    size_t n;
    ck_assert_ptr_nonnull(f);
    buf = calloc(1, 1 << 20);
    n = fread(buf, 1, (1 << 20) - 1, f);
    fclose(f);
    buf[n] = '\0';
    int has = strstr(buf, needle) != NULL;
    free(buf);
    return has;
}

START_TEST(the_secret_is_never_printed)
{
    const char *s1 = "whsec_SeCrEt_from_flag_1", *s2 = "whsec_SeCrEt_rotated_2";
    const char *s3 = "whsec_SeCrEt_from_env_3";
    char log[] = "/tmp/psp_sim_webhooks_log_XXXXXX";
    int lfd = mkstemp(log);
    ck_assert_int_ge(lfd, 0);
    close(lfd);
    /* Failures and duplicates: every log line webhooks can write. */
    struct receiver *rc = receiver_start(s1, s2, NULL, 2);
    struct psp_sim_process sim = {0};
    char env[128];
    snprintf(env, sizeof(env), "PSP_SIM_WEBHOOK_SECRET=%s", s3);
    const char *envs[] = {env, NULL};
    const char *args[] = {"--webhook-url",
                          rc->url,
                          "--webhook-secret",
                          s1,
                          "--webhook-retry-ms",
                          "10",
                          "--webhook-duplicate-rate",
                          "1",
                          NULL};
    sim.env = envs;
    sim.stderr_path = log;
    psp_sim_start(&sim, args);
    free(charge_id(&sim, "k-s1", "a-s1", "pm_card_visa"));
    receiver_wait(rc, 4); /* two failures, the delivery, its duplicate */
    /* The flag wins over the environment. */
    ck_assert_int_eq(rc->dl[2].v1_by[0], 0);
    char body[128];
    snprintf(body, sizeof(body), "{\"secret\":\"%s\",\"keep_old\":true}", s2);
    json_decref(psp_sim_admin(&sim, "POST", "/webhook-secret", body));
    free(charge_id(&sim, "k-s2", "a-s2", "pm_card_visa"));
    receiver_wait(rc, 6);
    wait_drained(&sim);
    ck_assert_int_eq(rc->dl[4].v1_by[0], 1);

    static const char *const paths[] = {"/webhooks", "/webhooks/events", "/ledger",
                                        "/faults", "/health"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        struct answer a = http(&sim, 1, "GET", paths[i], NULL, NULL);
        ck_assert_int_eq(a.status, 200);
        ck_assert_msg(!strstr(a.body, "SeCrEt"), "%s shows a secret: %s", paths[i],
                      a.body);
        answer_free(&a);
    }
    psp_sim_stop(&sim);
    ck_assert_ptr_null(strstr(sim.first_line, "SeCrEt"));
    /* It did log (the failures), and no secret in it. */
    ck_assert_msg(file_has(log, "webhook"), "psp-sim logged no webhook failure");
    ck_assert_msg(!file_has(log, "SeCrEt"), "psp-sim's stderr holds a secret");

    /* Nor when it refuses its flags. */
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        FILE *f = freopen(log, "w", stderr);
        (void)f;
        execl(PSP_SIM_PATH, PSP_SIM_PATH, "--webhook-url", "ftp://nowhere",
              "--webhook-secret", s1, (char *)NULL);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2);
    ck_assert(file_has(log, "psp-sim: --webhook-url"));
    ck_assert(!file_has(log, "SeCrEt"));
    unlink(log);
    receiver_stop(rc);
}
END_TEST

/* A refund is refund.created, then charge.refunded when it succeeded; a
 * pending one that fails is refund.created, refund.updated, refund.failed;
 * each signed as the intents' events are. */
START_TEST(refunds_are_refund_and_charge_refunded_events)
{
    const char *secret = "whsec_test_refunds";
    struct receiver *rc = receiver_start(secret, NULL, NULL, 0);
    struct psp_sim_process sim = {0};
    const char *args[] = {"--webhook-url", rc->url, "--webhook-secret", secret, NULL};
    psp_sim_start(&sim, args);
    char *pi = charge_id(&sim, "k-rw", "a-rw", "pm_card_visa");
    char body[256], path[160];
    snprintf(body, sizeof(body),
             "payment_intent=%s&amount=500&metadata%%5Brefund_id%%5D=rw-1", pi);
    struct answer r = http(&sim, 0, "POST", "/v1/refunds", "k-rw-1", body);
    ck_assert_int_eq(r.status, 200);
    char *pf = charge_id(&sim, "k-rwf", "a-rwf", "pm_card_refundPendingFail");
    snprintf(body, sizeof(body),
             "payment_intent=%s&amount=700&metadata%%5Brefund_id%%5D=rw-2", pf);
    struct answer p = http(&sim, 0, "POST", "/v1/refunds", "k-rw-2", body);
    ck_assert_str_eq(jstr(p.json, "status"), "pending");
    snprintf(path, sizeof(path), "/refunds/%s/settle", jstr(p.json, "id"));
    struct answer s = http(&sim, 1, "POST", path, NULL, "{\"status\":\"failed\"}");
    ck_assert_int_eq(s.status, 200);

    receiver_wait(rc, 7);
    wait_drained(&sim);
    ck_assert_uint_eq(receiver_count(rc), 7);
    static const char *const want[] = {"payment_intent.succeeded",
                                       "refund.created",
                                       "charge.refunded",
                                       "payment_intent.succeeded",
                                       "refund.created",
                                       "refund.updated",
                                       "refund.failed"};
    for (size_t i = 0; i < 7; i++) {
        ck_assert_str_eq(jstr(rc->dl[i].event, "type"), want[i]);
        ck_assert_int_eq(rc->dl[i].v1_count, 1);
        ck_assert_int_eq(rc->dl[i].v1_by[0], 0);
    }
    ck_assert(json_equal(data_object(&rc->dl[1]), r.json));
    json_t *ch = data_object(&rc->dl[2]);
    ck_assert_str_eq(jstr(ch, "object"), "charge");
    ck_assert_str_eq(jstr(ch, "payment_intent"), pi);
    ck_assert_int_eq(json_integer_value(json_object_get(ch, "amount_refunded")), 500);
    ck_assert_str_eq(
        jstr(json_array_get(json_object_get(json_object_get(ch, "refunds"), "data"), 0),
             "id"),
        jstr(r.json, "id"));
    ck_assert_str_eq(jstr(data_object(&rc->dl[5]), "status"), "failed");
    ck_assert_str_eq(jstr(data_object(&rc->dl[6]), "failure_reason"),
                     "expired_or_canceled_card");
    ck_assert(json_equal(data_object(&rc->dl[6]), s.json));
    psp_sim_stop(&sim);
    receiver_stop(rc);
    answer_free(&r);
    answer_free(&p);
    answer_free(&s);
    free(pi);
    free(pf);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("psp_sim_webhooks");
    TCase *tc = tcase_create("webhooks");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, NULL);
    tcase_add_test(tc, each_status_change_is_one_signed_event);
    tcase_add_test(tc, an_intent_that_settles_by_itself_is_delivered_unread);
    tcase_add_test(tc, a_cancel_is_one_canceled_event);
    tcase_add_test(tc, refunds_are_refund_and_charge_refunded_events);
    tcase_add_test(tc, a_failed_delivery_is_retried_until_2xx);
    tcase_add_test(tc, duplicate_rate_one_sends_every_event_twice);
    tcase_add_test(tc, reorder_rate_delivers_out_of_order_yet_everything_under_a_seed);
    tcase_add_test(tc, rotation_signs_with_the_new_secret_and_the_old_while_kept);
    tcase_add_test(tc, emit_queues_crafted_events);
    tcase_add_test(tc, a_dead_receiver_blocks_neither_charges_nor_shutdown);
    tcase_add_test(tc, the_secret_is_never_printed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
