#include "psp_limits.h"

#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tokens in thousandths: a rate of r requests/s adds r per ms. */
#define MILLI 1000

struct bucket {
    int64_t milli;   /* tokens * 1000 */
    int64_t last_ms; /* when it was last refilled */
};

struct second {
    int64_t sec; /* monotonic second this slot counts */
    int64_t served, throttled;
};

/* Bucket 0 of a key is its global one, 1 + c its class c's. */
#define PER_KEY (1 + PSP_LC__COUNT)

struct psp_limits {
    pthread_mutex_t lock;
    struct psp_limits_config cfg;
    size_t nkeys;
    struct bucket *buckets; /* nkeys * PER_KEY */
    int64_t throttled[PSP_LC__COUNT];
    struct second series[PSP_LIMITS_SERIES_S];
};

static const char *class_names[PSP_LC__COUNT] = {
    "create", "capture", "refund", "retrieve", "search", "list",
};

const char *psp_limits_class_name(enum psp_limit_class c)
{
    assert(c >= 0 && c < PSP_LC__COUNT);
    return class_names[c];
}

int psp_limits_class_parse(const char *name)
{
    for (int i = 0; i < PSP_LC__COUNT; i++)
        if (name && !strcmp(name, class_names[i]))
            return i;
    return -1;
}

psp_limits_t *psp_limits_new(size_t nkeys)
{
    assert(nkeys > 0);
    psp_limits_t *l = calloc(1, sizeof(*l));
    if (!l)
        return NULL;
    l->buckets = calloc(nkeys * PER_KEY, sizeof(*l->buckets));
    if (!l->buckets) {
        free(l);
        return NULL;
    }
    l->nkeys = nkeys;
    pthread_mutex_init(&l->lock, NULL);
    return l;
}

void psp_limits_free(psp_limits_t *l)
{
    if (!l)
        return;
    pthread_mutex_destroy(&l->lock);
    free(l->buckets);
    free(l);
}

/* The limit bucket i of a key obeys. */
static const struct psp_limit *limit_of(const struct psp_limits_config *cfg, size_t i)
{
    return i == 0 ? &cfg->global : &cfg->classes[i - 1];
}

static int64_t capacity(const struct psp_limit *lim)
{
    return (int64_t)(lim->burst > 0 ? lim->burst : lim->rate) * MILLI;
}

static void refill(struct bucket *b, const struct psp_limit *lim, int64_t now_ms)
{
    int64_t elapsed = now_ms - b->last_ms, cap = capacity(lim);
    if (elapsed > 0 && lim->rate > 0) {
        /* Past a full bucket's worth of time nothing more fits: no overflow. */
        int64_t room = cap - b->milli;
        b->milli = elapsed > room / lim->rate ? cap : b->milli + elapsed * lim->rate;
    }
    if (elapsed > 0)
        b->last_ms = now_ms;
    assert(lim->rate == 0 || (b->milli >= 0 && b->milli <= cap));
}

/* ---- configuration ---- */

static int check_limit(const struct psp_limit *lim, const char *what, char *errbuf,
                       size_t errbuf_size)
{
    if (lim->rate < 0 || lim->rate > PSP_LIMITS_RATE_MAX || lim->burst < 0 ||
        lim->burst > PSP_LIMITS_RATE_MAX) {
        snprintf(errbuf, errbuf_size, "%s: rate and burst must be integers in 0..%ld",
                 what, PSP_LIMITS_RATE_MAX);
        return -1;
    }
    if (lim->rate == 0 && lim->burst > 0) {
        snprintf(errbuf, errbuf_size, "%s: a burst needs a rate (0 is unlimited)",
                 what);
        return -1;
    }
    return 0;
}

int psp_limits_parse_spec(const char *s, struct psp_limit *out, char *errbuf,
                          size_t errbuf_size)
{
    struct psp_limit lim = {0};
    char *end;
    errno = 0;
    lim.rate = strtol(s, &end, 10);
    if (!errno && end != s && *end == ':') {
        const char *b = end + 1;
        lim.burst = strtol(b, &end, 10);
        if (end == b)
            end = (char *)b - 1; /* nothing after ':' */
    }
    if (errno || end == s || *end || !(*s >= '0' && *s <= '9')) {
        snprintf(errbuf, errbuf_size, "'%s' is not N or N:BURST", s);
        return -1;
    }
    if (check_limit(&lim, s, errbuf, errbuf_size) != 0)
        return -1;
    *out = lim;
    return 0;
}

/* A limit in JSON: an integer (the rate, burst the rate) or {"rate": N,
 * "burst": B}. */
static int limit_from_json(json_t *v, const char *what, struct psp_limit *out,
                           char *errbuf, size_t errbuf_size)
{
    struct psp_limit lim = {0};
    json_t *m;
    const char *k;

    if (json_is_integer(v)) {
        lim.rate = (long)json_integer_value(v);
    } else if (json_is_object(v)) {
        json_object_foreach(v, k, m)
        {
            long *target = !strcmp(k, "rate")    ? &lim.rate
                           : !strcmp(k, "burst") ? &lim.burst
                                                 : NULL;
            if (!target || !json_is_integer(m) ||
                json_integer_value(m) > PSP_LIMITS_RATE_MAX ||
                json_integer_value(m) < 0) {
                snprintf(errbuf, errbuf_size,
                         "%s: members are rate and burst, integers in 0..%ld", what,
                         PSP_LIMITS_RATE_MAX);
                return -1;
            }
            *target = (long)json_integer_value(m);
        }
    } else {
        snprintf(errbuf, errbuf_size,
                 "%s must be an integer (requests/s) or {\"rate\": N, \"burst\": B}",
                 what);
        return -1;
    }
    if (json_is_integer(v) &&
        (json_integer_value(v) < 0 || json_integer_value(v) > PSP_LIMITS_RATE_MAX))
        lim.rate = -1; /* refused below, with the range */
    if (check_limit(&lim, what, errbuf, errbuf_size) != 0)
        return -1;
    *out = lim;
    return 0;
}

static int classes_from_json(json_t *classes, struct psp_limits_config *cfg,
                             char *errbuf, size_t errbuf_size)
{
    const char *k;
    json_t *v;
    if (!json_is_object(classes)) {
        snprintf(errbuf, errbuf_size, "classes must be an object of class: limit");
        return -1;
    }
    json_object_foreach(classes, k, v)
    {
        int c = psp_limits_class_parse(k);
        char what[96];
        if (c < 0) {
            snprintf(errbuf, errbuf_size,
                     "unknown class '%.32s': create, capture, refund, retrieve, "
                     "search or list",
                     k);
            return -1;
        }
        snprintf(what, sizeof(what), "classes.%s", k);
        if (limit_from_json(v, what, &cfg->classes[c], errbuf, errbuf_size) != 0)
            return -1;
    }
    return 0;
}

int psp_limits_config_from_json(json_t *j, struct psp_limits_config *out, char *errbuf,
                                size_t errbuf_size)
{
    struct psp_limits_config cfg = {0};
    const char *k;
    json_t *v;

    if (!json_is_object(j)) {
        snprintf(errbuf, errbuf_size, "body must be a JSON object");
        return -1;
    }
    json_object_foreach(j, k, v)
    {
        if (!strcmp(k, "global")) {
            if (limit_from_json(v, "global", &cfg.global, errbuf, errbuf_size) != 0)
                return -1;
        } else if (!strcmp(k, "classes")) {
            if (classes_from_json(v, &cfg, errbuf, errbuf_size) != 0)
                return -1;
        } else if (!strcmp(k, "retry_after")) {
            if (!json_is_boolean(v)) {
                snprintf(errbuf, errbuf_size, "retry_after must be true or false");
                return -1;
            }
            cfg.retry_after = json_is_true(v);
        } else {
            snprintf(errbuf, errbuf_size,
                     "unknown member '%.32s': global, classes, retry_after", k);
            return -1;
        }
    }
    *out = cfg;
    return 0;
}

void psp_limits_set(psp_limits_t *l, const struct psp_limits_config *cfg,
                    int64_t now_ms)
{
    pthread_mutex_lock(&l->lock);
    for (size_t k = 0; k < l->nkeys; k++) {
        for (size_t i = 0; i < PER_KEY; i++) {
            struct bucket *b = &l->buckets[k * PER_KEY + i];
            const struct psp_limit *old = limit_of(&l->cfg, i), *lim = limit_of(cfg, i);
            refill(b, old, now_ms);
            int64_t cap = capacity(lim);
            if (old->rate == 0 || b->milli > cap)
                b->milli = cap;
            b->last_ms = now_ms;
        }
    }
    l->cfg = *cfg;
    pthread_mutex_unlock(&l->lock);
}

void psp_limits_get(psp_limits_t *l, struct psp_limits_config *out)
{
    pthread_mutex_lock(&l->lock);
    *out = l->cfg;
    pthread_mutex_unlock(&l->lock);
}

/* ---- requests ---- */

static struct second *second_of(psp_limits_t *l, int64_t now_ms)
{
    int64_t sec = now_ms / 1000;
    struct second *s = &l->series[sec % PSP_LIMITS_SERIES_S];
    if (s->sec != sec)
        *s = (struct second){.sec = sec};
    return s;
}

int psp_limits_take(psp_limits_t *l, size_t key, enum psp_limit_class c, int64_t now_ms,
                    long *retry_after_s)
{
    assert(key < l->nkeys && c >= 0 && c < PSP_LC__COUNT);
    size_t idx[2] = {0, 1 + (size_t)c};
    int64_t wait_ms = 0;
    int ok = 1;

    *retry_after_s = 0;
    pthread_mutex_lock(&l->lock);
    for (int i = 0; i < 2; i++) {
        struct bucket *b = &l->buckets[key * PER_KEY + idx[i]];
        const struct psp_limit *lim = limit_of(&l->cfg, idx[i]);
        if (lim->rate == 0)
            continue;
        refill(b, lim, now_ms);
        if (b->milli < MILLI) {
            int64_t w = (MILLI - b->milli + lim->rate - 1) / lim->rate;
            wait_ms = w > wait_ms ? w : wait_ms;
            ok = 0;
        }
    }
    for (int i = 0; i < 2 && ok; i++)
        if (limit_of(&l->cfg, idx[i])->rate > 0)
            l->buckets[key * PER_KEY + idx[i]].milli -= MILLI;
    struct second *s = second_of(l, now_ms);
    if (ok) {
        s->served++;
    } else {
        s->throttled++;
        l->throttled[c]++;
        if (l->cfg.retry_after)
            *retry_after_s = (long)((wait_ms + 999) / 1000);
    }
    pthread_mutex_unlock(&l->lock);
    return ok;
}

/* ---- what it tells ---- */

static json_t *throttled_locked(psp_limits_t *l)
{
    json_t *o = json_object();
    for (int c = 0; c < PSP_LC__COUNT; c++)
        json_object_set_new(o, class_names[c], json_integer(l->throttled[c]));
    return o;
}

json_t *psp_limits_throttled_json(psp_limits_t *l)
{
    pthread_mutex_lock(&l->lock);
    json_t *o = throttled_locked(l);
    pthread_mutex_unlock(&l->lock);
    return o;
}

static json_t *limit_json(const struct psp_limit *lim)
{
    return json_pack("{s:I, s:I}", "rate", (json_int_t)lim->rate, "burst",
                     (json_int_t)(capacity(lim) / MILLI));
}

json_t *psp_limits_json(psp_limits_t *l, int64_t now_ms, int64_t wall_ms)
{
    json_t *classes = json_object(), *series = json_array();
    int64_t now_s = now_ms / 1000, wall_s = wall_ms / 1000;

    pthread_mutex_lock(&l->lock);
    for (int c = 0; c < PSP_LC__COUNT; c++)
        json_object_set_new(classes, class_names[c], limit_json(&l->cfg.classes[c]));
    for (int64_t sec = now_s - PSP_LIMITS_SERIES_S + 1; sec <= now_s; sec++) {
        const struct second *s =
            &l->series[(sec % PSP_LIMITS_SERIES_S + PSP_LIMITS_SERIES_S) %
                       PSP_LIMITS_SERIES_S];
        if (s->sec != sec || (s->served == 0 && s->throttled == 0))
            continue;
        json_array_append_new(series, json_pack("{s:I, s:I, s:I}", "at",
                                                (json_int_t)(wall_s - (now_s - sec)),
                                                "served", (json_int_t)s->served,
                                                "throttled", (json_int_t)s->throttled));
    }
    json_t *out =
        json_pack("{s:o, s:o, s:b, s:o, s:o}", "global", limit_json(&l->cfg.global),
                  "classes", classes, "retry_after", l->cfg.retry_after, "throttled",
                  throttled_locked(l), "per_second", series);
    pthread_mutex_unlock(&l->lock);
    return out;
}

void psp_limits_reset(psp_limits_t *l, int64_t now_ms)
{
    pthread_mutex_lock(&l->lock);
    memset(l->throttled, 0, sizeof(l->throttled));
    memset(l->series, 0, sizeof(l->series));
    for (size_t k = 0; k < l->nkeys; k++)
        for (size_t i = 0; i < PER_KEY; i++)
            l->buckets[k * PER_KEY + i] =
                (struct bucket){capacity(limit_of(&l->cfg, i)), now_ms};
    pthread_mutex_unlock(&l->lock);
}

json_t *psp_limits_error_json(void)
{
    /* What Stripe sends for a rate limit (its API since 2015-09-18: 429
     * with code rate_limit). */
    return json_pack("{s:{s:s, s:s, s:s, s:s}}", "error", "type",
                     "invalid_request_error", "code", "rate_limit", "message",
                     "Request rate limit exceeded. Learn more about rate limits here "
                     "https://stripe.com/docs/rate-limits.",
                     "doc_url", "https://stripe.com/docs/error-codes/rate-limit");
}
