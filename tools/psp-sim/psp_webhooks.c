#include "psp_webhooks.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

/* How many recent events GET /webhooks/events can show. */
#define RECENT 1000
/* A held-back event goes out alone when nothing came behind it by then. */
#define HOLD_MAX_MS 1000
/* Salts of the two decisions made per event. */
#define SALT_DUPLICATE 0x6475706cULL
#define SALT_REORDER   0x72656f72ULL

/* One delivery to make: an event's first one, or its duplicate. */
struct item {
    struct item *next; /* queue or held-back stack */
    uint64_t seq;      /* the event's ordinal: its decisions, its recent slot */
    uint64_t gen;      /* the reset generation it belongs to */
    uint64_t order;    /* tie-break in the retry heap: first in, first out */
    int64_t due_ms;    /* in the retry heap */
    char *id, *type, *intent, *body;
    int duplicate;
    int attempts;
};

/* What /webhooks/events shows about an event. */
struct recent {
    uint64_t seq; /* 0: empty slot (ordinals start at 1) */
    char *id, *type, *intent;
    int64_t created;
    int attempts;
    int acknowledged;
};

static const struct {
    const char *status, *type;
} kinds[] = {
    {"succeeded", "payment_intent.succeeded"},
    {"processing", "payment_intent.processing"},
    {"requires_payment_method", "payment_intent.payment_failed"},
    {"canceled", "payment_intent.canceled"},
    /* An authorization (manual capture): its amount_capturable is new. */
    {"requires_capture", "payment_intent.amount_capturable_updated"},
};

struct psp_webhooks {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    int started;
    atomic_int stop; /* read by curl's progress callback without the lock */

    char *url;
    char *secret, *old_secret; /* old_secret: kept through a rotation, or NULL */
    double duplicate_rate, reorder_rate;
    int64_t retry_ms, retry_max_ms, timeout_ms;
    size_t queue_max;
    uint64_t seed;
    char id_prefix[17]; /* random per process: ids never repeat across runs */

    struct item *head, *tail; /* fresh events, in the order they were queued */
    size_t queued;
    struct item **heap; /* retries and duplicates, by (due_ms, order) */
    size_t heap_len, heap_cap;
    struct item *held; /* held back for reordering, newest on top */
    size_t held_len;
    int64_t held_since_ms;
    int in_flight;
    uint64_t in_flight_gen; /* one from before a reset is no longer pending */

    uint64_t gen, next_seq, next_order;
    long long events, delivered, sends, failures, duplicates, reordered, dropped;
    struct recent recent[RECENT];
};

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* splitmix64: a well-mixed 64-bit hash, enough for fair coin flips. */
static uint64_t mix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* Whether the decision `salt` about event seq comes out yes at rate. */
static int decide(const psp_webhooks_t *w, uint64_t seq, uint64_t salt, double rate)
{
    if (rate <= 0)
        return 0;
    double u = (double)(mix(mix(w->seed ^ salt) ^ seq) >> 11) * 0x1.0p-53;
    return u < rate;
}

const char *psp_webhooks_type_for_status(const char *status)
{
    for (size_t i = 0; status && i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strcmp(kinds[i].status, status))
            return kinds[i].type;
    return NULL;
}

const char *psp_webhooks_status_for_type(const char *type)
{
    for (size_t i = 0; type && i < sizeof(kinds) / sizeof(kinds[0]); i++)
        if (!strcmp(kinds[i].type, type))
            return kinds[i].status;
    return NULL;
}

int psp_webhooks_check_config(const struct psp_webhooks_config *cfg, char *errbuf,
                              size_t errbuf_size)
{
    if (cfg->secret && !*cfg->secret) {
        snprintf(errbuf, errbuf_size, "the signing secret must not be empty");
        return -1;
    }
    if (!cfg->url)
        return 0;
    if ((strncmp(cfg->url, "http://", 7) != 0 &&
         strncmp(cfg->url, "https://", 8) != 0) ||
        strlen(cfg->url) > 2048) {
        snprintf(errbuf, errbuf_size, "'%.64s%s' is not an http:// or https:// URL",
                 cfg->url, strlen(cfg->url) > 64 ? "..." : "");
        return -1;
    }
    if (!cfg->secret) {
        snprintf(errbuf, errbuf_size, "a webhook url needs a signing secret");
        return -1;
    }
    return 0;
}

static void secret_free(char *s)
{
    if (s) {
        OPENSSL_cleanse(s, strlen(s));
        free(s);
    }
}

static void item_free(struct item *it)
{
    if (!it)
        return;
    free(it->id);
    free(it->type);
    free(it->intent);
    free(it->body);
    free(it);
}

/* ---- the retry heap (caller holds the lock) ---- */

static int heap_less(const struct item *a, const struct item *b)
{
    return a->due_ms < b->due_ms || (a->due_ms == b->due_ms && a->order < b->order);
}

static int heap_push(psp_webhooks_t *w, struct item *it)
{
    if (w->heap_len == w->heap_cap) {
        size_t ncap = w->heap_cap ? w->heap_cap * 2 : 64;
        struct item **n = realloc(w->heap, ncap * sizeof(*n));
        if (!n)
            return -1;
        w->heap = n;
        w->heap_cap = ncap;
    }
    it->order = w->next_order++;
    size_t i = w->heap_len++;
    w->heap[i] = it;
    while (i > 0 && heap_less(w->heap[i], w->heap[(i - 1) / 2])) {
        struct item *t = w->heap[i];
        w->heap[i] = w->heap[(i - 1) / 2];
        w->heap[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
    return 0;
}

static struct item *heap_pop(psp_webhooks_t *w)
{
    struct item *top = w->heap[0];
    w->heap[0] = w->heap[--w->heap_len];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < w->heap_len && heap_less(w->heap[l], w->heap[m]))
            m = l;
        if (r < w->heap_len && heap_less(w->heap[r], w->heap[m]))
            m = r;
        if (m == i)
            break;
        struct item *t = w->heap[i];
        w->heap[i] = w->heap[m];
        w->heap[m] = t;
        i = m;
    }
    return top;
}

/* Caller holds the lock. Deliveries waiting or in flight. */
static size_t pending(const psp_webhooks_t *w)
{
    return w->queued + w->heap_len + w->held_len +
           (w->in_flight && w->in_flight_gen == w->gen ? 1 : 0);
}

/* Caller holds the lock. The recent slot of event seq, or NULL once it has
 * been overwritten (or reset). */
static struct recent *recent_of(psp_webhooks_t *w, uint64_t seq)
{
    struct recent *r = &w->recent[seq % RECENT];
    return r->seq == seq ? r : NULL;
}

/* Caller holds the lock. Puts the held-back events ahead of everything
 * else, newest first: each then goes out after the one behind it. Should
 * the heap be out of memory, they stay held and go at the next chance. */
static void release_held(psp_webhooks_t *w, int reordered)
{
    while (w->held) {
        struct item *it = w->held;
        it->due_ms = 0;
        if (heap_push(w, it) != 0)
            return;
        w->held = it->next;
        w->held_len--;
        if (reordered)
            w->reordered++;
    }
}

/* ---- one delivery ---- */

/* hex HMAC-SHA256(secret, "<t>.<body>") into out[65]. */
static int sign(const char *secret, long long t, const char *body, char out[65])
{
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    size_t n = strlen(body) + 32;
    char *msg = malloc(n);
    if (!msg)
        return -1;
    int len = snprintf(msg, n, "%lld.%s", t, body);
    unsigned char *ok = HMAC(EVP_sha256(), secret, (int)strlen(secret),
                             (const unsigned char *)msg, (size_t)len, mac, &mac_len);
    free(msg);
    if (!ok || mac_len != 32)
        return -1;
    for (unsigned i = 0; i < mac_len; i++)
        snprintf(out + 2 * i, 3, "%02x", mac[i]);
    return 0;
}

/* Caller holds the lock. "Stripe-Signature: t=...,v1=...[,v1=...]". */
static int signature_header(psp_webhooks_t *w, const char *body, char *out, size_t size)
{
    char a[65], b[65];
    long long t = (long long)time(NULL);
    if (sign(w->secret, t, body, a) != 0 ||
        (w->old_secret && sign(w->old_secret, t, body, b) != 0))
        return -1;
    if (w->old_secret)
        snprintf(out, size, "Stripe-Signature: t=%lld,v1=%s,v1=%s", t, a, b);
    else
        snprintf(out, size, "Stripe-Signature: t=%lld,v1=%s", t, a);
    return 0;
}

static size_t discard(char *ptr, size_t size, size_t nmemb, void *u)
{
    (void)ptr;
    (void)u;
    return size * nmemb;
}

/* Ends a transfer early when psp-sim stops, whatever its timeout. */
static int on_progress(void *u, curl_off_t dt, curl_off_t dn, curl_off_t ut,
                       curl_off_t un)
{
    (void)dt;
    (void)dn;
    (void)ut;
    (void)un;
    return atomic_load(&((psp_webhooks_t *)u)->stop) ? 1 : 0;
}

/* POSTs body; 0 on a 2xx, else -1 with why (which never holds a secret:
 * only the signature, never the key, is in the request). */
static int post(psp_webhooks_t *w, CURL *e, const char *url, const char *sig,
                const char *body, int64_t timeout_ms, char *why, size_t why_size)
{
    char cerr[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = NULL, *h2;
    long status = 0;
    int rc = -1;

    h2 = curl_slist_append(h, "Content-Type: application/json");
    if (h2)
        h = h2;
    h2 = h2 ? curl_slist_append(h, sig) : NULL;
    if (h2)
        h = h2;
    /* No 100-continue round trip before bodies over 1 KiB. */
    h2 = h2 ? curl_slist_append(h, "Expect:") : NULL;
    if (!h2) {
        snprintf(why, why_size, "out of memory");
        goto out;
    }
    h = h2;
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_POST, 1L);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(e, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
    curl_easy_setopt(e, CURLOPT_USERAGENT, "psp-sim webhooks");
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, discard);
    curl_easy_setopt(e, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(e, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(e, CURLOPT_XFERINFODATA, w);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, cerr);
    CURLcode cc = curl_easy_perform(e);
    curl_easy_setopt(e, CURLOPT_ERRORBUFFER, NULL);
    if (cc != CURLE_OK) {
        snprintf(why, why_size, "%s", *cerr ? cerr : curl_easy_strerror(cc));
        goto out;
    }
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    if (status < 200 || status > 299) {
        snprintf(why, why_size, "answered %ld", status);
        goto out;
    }
    rc = 0;
out:
    curl_slist_free_all(h);
    return rc;
}

/* Caller holds the lock. The back-off before attempt n + 1 (n >= 1). */
static int64_t backoff_ms(const psp_webhooks_t *w, int n)
{
    int64_t b = w->retry_ms;
    for (int i = 1; i < n && b < w->retry_max_ms; i++)
        b *= 2;
    return b < w->retry_max_ms ? b : w->retry_max_ms;
}

/* Caller holds the lock. An acknowledged delivery: counted, and perhaps
 * its event sent once more. Takes it. */
static void acknowledged(psp_webhooks_t *w, struct item *it)
{
    struct recent *r = recent_of(w, it->seq);
    if (it->duplicate) {
        w->duplicates++;
        item_free(it);
        return;
    }
    w->delivered++;
    if (r)
        r->acknowledged = 1;
    if (!decide(w, it->seq, SALT_DUPLICATE, w->duplicate_rate)) {
        item_free(it);
        return;
    }
    /* The same event again, later: same id and body, signed when sent. */
    it->duplicate = 1;
    it->attempts = 0;
    it->due_ms = now_ms() + w->retry_ms;
    if (pending(w) >= w->queue_max || heap_push(w, it) != 0) {
        w->dropped++;
        item_free(it);
    }
}

/* Caller holds the lock. A failed delivery goes back with a back-off. */
static void failed(psp_webhooks_t *w, struct item *it, const char *why)
{
    int64_t wait = backoff_ms(w, it->attempts);
    w->failures++;
    /* Attempts 1, 2, 4, 8...: a dead receiver does not flood the log. */
    if ((it->attempts & (it->attempts - 1)) == 0)
        fprintf(stderr,
                "psp-sim: webhook %s (%s%s) attempt %d failed: %s; retrying in "
                "%" PRId64 " ms\n",
                it->id, it->type, it->duplicate ? ", duplicate" : "", it->attempts, why,
                wait);
    it->due_ms = now_ms() + wait;
    if (heap_push(w, it) != 0) {
        w->dropped++;
        item_free(it);
    }
}

/* Caller holds the lock. Waits for news until at most due_ms (< 0: none). */
static void wait_until(psp_webhooks_t *w, int64_t due_ms)
{
    if (due_ms < 0) {
        pthread_cond_wait(&w->wake, &w->lock);
        return;
    }
    struct timespec ts = {.tv_sec = due_ms / 1000,
                          .tv_nsec = (due_ms % 1000) * 1000000};
    pthread_cond_timedwait(&w->wake, &w->lock, &ts);
}

static void *deliver_main(void *arg)
{
    psp_webhooks_t *w = arg;
    CURL *e = curl_easy_init(); /* one handle: its connection is kept alive */
    char sig[256], why[CURL_ERROR_SIZE + 32];

    pthread_mutex_lock(&w->lock);
    while (!atomic_load(&w->stop)) {
        int64_t now = now_ms();
        struct item *it = NULL;
        int fresh = 0;

        if (w->heap_len && w->heap[0]->due_ms <= now) {
            it = heap_pop(w);
        } else if (w->head) {
            it = w->head;
            w->head = it->next;
            if (!w->head)
                w->tail = NULL;
            w->queued--;
            fresh = 1;
        } else if (w->held && now - w->held_since_ms >= HOLD_MAX_MS) {
            release_held(w, 0); /* nothing came behind: not reordered */
            continue;
        }
        if (!it) {
            int64_t due = w->heap_len ? w->heap[0]->due_ms : -1;
            if (w->held && (due < 0 || w->held_since_ms + HOLD_MAX_MS < due))
                due = w->held_since_ms + HOLD_MAX_MS;
            wait_until(w, due);
            continue;
        }
        if (fresh && decide(w, it->seq, SALT_REORDER, w->reorder_rate)) {
            if (!w->held)
                w->held_since_ms = now;
            it->next = w->held;
            w->held = it;
            w->held_len++;
            continue;
        }

        /* Signed now, with the secrets in force now. */
        int signed_ok = signature_header(w, it->body, sig, sizeof(sig)) == 0;
        char *url = strdup(w->url);
        int64_t timeout = w->timeout_ms;
        w->in_flight = 1;
        w->in_flight_gen = it->gen;
        it->attempts++;
        pthread_mutex_unlock(&w->lock);
        int rc = -1;
        if (!e || !url || !signed_ok)
            snprintf(why, sizeof(why), "out of memory");
        else
            rc = post(w, e, url, sig, it->body, timeout, why, sizeof(why));
        free(url);
        pthread_mutex_lock(&w->lock);
        w->in_flight = 0;
        if (it->gen != w->gen || atomic_load(&w->stop)) {
            item_free(it); /* reset meanwhile, or stopping */
            continue;
        }
        w->sends++;
        struct recent *r = recent_of(w, it->seq);
        if (r)
            r->attempts++;
        if (rc == 0)
            acknowledged(w, it);
        else
            failed(w, it, why);
        if (fresh)
            release_held(w, 1);
    }
    pthread_mutex_unlock(&w->lock);
    curl_easy_cleanup(e);
    return NULL;
}

/* ---- the public face ---- */

psp_webhooks_t *psp_webhooks_new(const struct psp_webhooks_config *cfg)
{
    unsigned char rnd[8];
    psp_webhooks_t *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    atomic_init(&w->stop, 0);
    w->duplicate_rate = cfg->duplicate_rate;
    w->reorder_rate = cfg->reorder_rate;
    w->retry_ms = cfg->retry_ms;
    w->retry_max_ms = cfg->retry_max_ms;
    w->timeout_ms = cfg->timeout_ms;
    w->queue_max = cfg->queue_max;
    w->seed = cfg->seed;
    w->next_seq = 1;
    if (RAND_bytes(rnd, sizeof(rnd)) != 1) {
        uint64_t x = mix((uint64_t)now_ms() ^ ((uint64_t)getpid() << 32));
        memcpy(rnd, &x, sizeof(rnd));
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(w->id_prefix + 2 * i, 3, "%02x", rnd[i]);
    if ((cfg->url && !(w->url = strdup(cfg->url))) ||
        (cfg->secret && !(w->secret = strdup(cfg->secret)))) {
        psp_webhooks_free(w);
        return NULL;
    }
    if (w->url) {
        if (pthread_create(&w->thread, NULL, deliver_main, w) != 0) {
            psp_webhooks_free(w);
            return NULL;
        }
        w->started = 1;
    }
    return w;
}

/* Caller holds the lock. Drops every waiting delivery. */
static void drop_pending(psp_webhooks_t *w)
{
    struct item *it;
    while ((it = w->head) != NULL) {
        w->head = it->next;
        item_free(it);
    }
    w->tail = NULL;
    while ((it = w->held) != NULL) {
        w->held = it->next;
        item_free(it);
    }
    for (size_t i = 0; i < w->heap_len; i++)
        item_free(w->heap[i]);
    w->queued = w->held_len = w->heap_len = 0;
}

/* Caller holds the lock. */
static void clear_recent(psp_webhooks_t *w)
{
    for (size_t i = 0; i < RECENT; i++) {
        free(w->recent[i].id);
        free(w->recent[i].type);
        free(w->recent[i].intent);
        memset(&w->recent[i], 0, sizeof(w->recent[i]));
    }
}

void psp_webhooks_free(psp_webhooks_t *w)
{
    if (!w)
        return;
    if (w->started) {
        pthread_mutex_lock(&w->lock);
        atomic_store(&w->stop, 1);
        pthread_cond_signal(&w->wake);
        pthread_mutex_unlock(&w->lock);
        pthread_join(w->thread, NULL);
        size_t left = pending(w);
        if (left)
            fprintf(stderr, "psp-sim: stopping with %zu webhook deliveries pending\n",
                    left);
    }
    drop_pending(w);
    clear_recent(w);
    free(w->heap);
    free(w->url);
    secret_free(w->secret);
    secret_free(w->old_secret);
    pthread_cond_destroy(&w->wake);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

enum psp_webhooks_queued psp_webhooks_enqueue(psp_webhooks_t *w, const char *type,
                                              json_t *intent, int64_t created_s,
                                              const char *id, char *id_out,
                                              size_t id_out_size)
{
    char fresh[48];
    enum psp_webhooks_queued rc = PSP_WH_DROPPED;
    struct item *it = NULL;
    json_t *event = NULL;

    pthread_mutex_lock(&w->lock);
    if (!w->url) {
        rc = PSP_WH_DISABLED;
        goto out;
    }
    if (pending(w) >= w->queue_max) {
        w->dropped++;
        goto out;
    }
    uint64_t seq = w->next_seq++;
    if (!id) {
        snprintf(fresh, sizeof(fresh), "evt_%s%08" PRIx64, w->id_prefix, seq);
        id = fresh;
    }
    const char *intent_id = json_string_value(json_object_get(intent, "id"));
    /* Stripe's order of members; the intent exactly as the API shows it. */
    event = json_pack("{s:s, s:s, s:s, s:I, s:b, s:{s:O}}", "id", id, "object", "event",
                      "type", type, "created", (json_int_t)created_s, "livemode", 0,
                      "data", "object", intent);
    it = calloc(1, sizeof(*it));
    if (!event || !it)
        goto drop;
    it->seq = seq;
    it->gen = w->gen;
    it->id = strdup(id);
    it->type = strdup(type);
    it->intent = strdup(intent_id ? intent_id : "");
    it->body = json_dumps(event, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!it->id || !it->type || !it->intent || !it->body)
        goto drop;

    struct recent *r = &w->recent[seq % RECENT];
    free(r->id);
    free(r->type);
    free(r->intent);
    *r = (struct recent){.seq = seq,
                         .id = strdup(it->id),
                         .type = strdup(it->type),
                         .intent = strdup(it->intent),
                         .created = created_s};
    if (w->tail)
        w->tail->next = it;
    else
        w->head = it;
    w->tail = it;
    w->queued++;
    w->events++;
    it = NULL;
    pthread_cond_signal(&w->wake);
    rc = PSP_WH_QUEUED;
    if (id_out)
        snprintf(id_out, id_out_size, "%s", id);
    goto out;
drop:
    w->dropped++;
out:
    pthread_mutex_unlock(&w->lock);
    item_free(it);
    json_decref(event);
    return rc;
}

int psp_webhooks_rotate(psp_webhooks_t *w, const char *secret, int keep_old,
                        char *errbuf, size_t errbuf_size)
{
    if (!secret || !*secret) {
        snprintf(errbuf, errbuf_size, "secret must be a non-empty string");
        return -1;
    }
    char *s = strdup(secret);
    if (!s) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return -1;
    }
    pthread_mutex_lock(&w->lock);
    secret_free(w->old_secret);
    w->old_secret = NULL;
    if (keep_old)
        w->old_secret = w->secret;
    else
        secret_free(w->secret);
    w->secret = s;
    pthread_mutex_unlock(&w->lock);
    return 0;
}

json_t *psp_webhooks_stats_json(psp_webhooks_t *w)
{
    pthread_mutex_lock(&w->lock);
    json_t *j = json_pack(
        "{s:s?, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:i}", "url", w->url, "pending",
        (json_int_t)pending(w), "delivered", (json_int_t)w->delivered, "sends",
        (json_int_t)w->sends, "failures", (json_int_t)w->failures, "duplicates",
        (json_int_t)w->duplicates, "reordered", (json_int_t)w->reordered, "dropped",
        (json_int_t)w->dropped, "events", (json_int_t)w->events, "signing_secrets",
        (w->secret ? 1 : 0) + (w->old_secret ? 1 : 0));
    pthread_mutex_unlock(&w->lock);
    return j;
}

json_t *psp_webhooks_events_json(psp_webhooks_t *w, size_t limit)
{
    json_t *list = json_array();
    pthread_mutex_lock(&w->lock);
    uint64_t last = w->next_seq - 1, n = limit < RECENT ? limit : RECENT;
    uint64_t first = last >= n ? last - n + 1 : 1;
    for (uint64_t seq = first; seq <= last; seq++) {
        struct recent *r = recent_of(w, seq);
        if (!r)
            continue; /* before a reset */
        json_array_append_new(list,
                              json_pack("{s:s, s:s, s:s, s:I, s:i, s:b}", "id", r->id,
                                        "type", r->type, "intent", r->intent, "created",
                                        (json_int_t)r->created, "attempts", r->attempts,
                                        "acknowledged", r->acknowledged));
    }
    pthread_mutex_unlock(&w->lock);
    return json_pack("{s:o}", "events", list);
}

void psp_webhooks_reset(psp_webhooks_t *w)
{
    pthread_mutex_lock(&w->lock);
    drop_pending(w);
    clear_recent(w);
    w->gen++;
    w->events = w->delivered = w->sends = w->failures = 0;
    w->duplicates = w->reordered = w->dropped = 0;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
}
