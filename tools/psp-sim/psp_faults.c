#include "psp_faults.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct psp_rule {
    enum psp_fault_kind kind;
    double probability;
    char *key;
    char *payment_method;
    long times; /* < 0: no limit */
    long fired;
};

struct psp_faults {
    pthread_mutex_t lock;
    uint64_t seed;
    int64_t latency_ms, jitter_ms, stall_ms;
    struct psp_rule *rules;
    size_t nrules;
    json_t *seq;  /* key -> requests seen */
    json_t *hits; /* every injected fault: {kind, key, seq} */
    uint64_t anon_seq;
};

static const char *kind_names[PSP_FAULT__COUNT] = {
    "error_before", "rate_limit", "error_after", "stall_after", "drop_after",
};

const char *psp_fault_name(enum psp_fault_kind kind)
{
    return kind_names[kind];
}

int psp_fault_parse(const char *name)
{
    for (int i = 0; i < PSP_FAULT__COUNT; i++)
        if (name && !strcmp(name, kind_names[i]))
            return i;
    return -1;
}

psp_faults_t *psp_faults_new(uint64_t seed)
{
    psp_faults_t *f = calloc(1, sizeof(*f));
    if (!f)
        return NULL;
    pthread_mutex_init(&f->lock, NULL);
    f->seed = seed;
    f->stall_ms = 30000;
    f->seq = json_object();
    f->hits = json_array();
    return f;
}

static void clear_rules(psp_faults_t *f)
{
    for (size_t i = 0; i < f->nrules; i++) {
        free(f->rules[i].key);
        free(f->rules[i].payment_method);
    }
    free(f->rules);
    f->rules = NULL;
    f->nrules = 0;
}

void psp_faults_free(psp_faults_t *f)
{
    if (!f)
        return;
    clear_rules(f);
    json_decref(f->seq);
    json_decref(f->hits);
    pthread_mutex_destroy(&f->lock);
    free(f);
}

static int add_locked(psp_faults_t *f, enum psp_fault_kind kind, double probability,
                      const char *key, const char *pm, long times)
{
    struct psp_rule *n = realloc(f->rules, (f->nrules + 1) * sizeof(*n));
    if (!n)
        return -1;
    f->rules = n;
    n = &f->rules[f->nrules];
    *n = (struct psp_rule){.kind = kind, .probability = probability, .times = times};
    n->key = key ? strdup(key) : NULL;
    n->payment_method = pm ? strdup(pm) : NULL;
    f->nrules++;
    return 0;
}

int psp_faults_add(psp_faults_t *f, enum psp_fault_kind kind, double probability,
                   const char *key, const char *payment_method, long times)
{
    pthread_mutex_lock(&f->lock);
    int rc = add_locked(f, kind, probability, key, payment_method, times);
    pthread_mutex_unlock(&f->lock);
    return rc;
}

void psp_faults_set_latency(psp_faults_t *f, int64_t fixed_ms, int64_t jitter_ms)
{
    pthread_mutex_lock(&f->lock);
    f->latency_ms = fixed_ms;
    f->jitter_ms = jitter_ms;
    pthread_mutex_unlock(&f->lock);
}

void psp_faults_set_stall(psp_faults_t *f, int64_t stall_ms)
{
    pthread_mutex_lock(&f->lock);
    f->stall_ms = stall_ms;
    pthread_mutex_unlock(&f->lock);
}

static int get_int(json_t *cfg, const char *name, int64_t min, int64_t *out,
                   char *errbuf, size_t errbuf_size)
{
    json_t *v = json_object_get(cfg, name);
    if (!v)
        return 0;
    if (!json_is_integer(v) || json_integer_value(v) < min) {
        snprintf(errbuf, errbuf_size, "'%s' must be an integer >= %lld", name,
                 (long long)min);
        return -1;
    }
    *out = json_integer_value(v);
    return 0;
}

int psp_faults_configure(psp_faults_t *f, json_t *cfg, char *errbuf, size_t errbuf_size)
{
    int64_t seed = (int64_t)f->seed, lat = 0, jit = 0, stall = 30000;
    json_t *rules = json_object_get(cfg, "rules"), *r;
    size_t i;

    if (!json_is_object(cfg)) {
        snprintf(errbuf, errbuf_size, "fault configuration must be a JSON object");
        return -1;
    }
    if (get_int(cfg, "seed", 0, &seed, errbuf, errbuf_size) ||
        get_int(cfg, "latency_ms", 0, &lat, errbuf, errbuf_size) ||
        get_int(cfg, "latency_jitter_ms", 0, &jit, errbuf, errbuf_size) ||
        get_int(cfg, "stall_ms", 0, &stall, errbuf, errbuf_size))
        return -1;
    if (rules && !json_is_array(rules)) {
        snprintf(errbuf, errbuf_size, "'rules' must be an array");
        return -1;
    }
    json_array_foreach(rules, i, r)
    {
        json_t *p = json_object_get(r, "probability");
        json_t *t = json_object_get(r, "times");
        json_t *k = json_object_get(r, "key"),
               *pm = json_object_get(r, "payment_method");
        if (psp_fault_parse(json_string_value(json_object_get(r, "kind"))) < 0) {
            snprintf(errbuf, errbuf_size,
                     "rule %zu: 'kind' must be one of error_before, "
                     "rate_limit, error_after, stall_after, "
                     "drop_after",
                     i);
            return -1;
        }
        if (p && (!json_is_number(p) || json_number_value(p) < 0 ||
                  json_number_value(p) > 1)) {
            snprintf(errbuf, errbuf_size, "rule %zu: 'probability' must be 0..1", i);
            return -1;
        }
        if ((t && !json_is_null(t) && !json_is_integer(t)) ||
            (k && !json_is_null(k) && !json_is_string(k)) ||
            (pm && !json_is_null(pm) && !json_is_string(pm))) {
            snprintf(errbuf, errbuf_size,
                     "rule %zu: 'times' is an integer, 'key' and 'payment_method' "
                     "strings",
                     i);
            return -1;
        }
    }
    pthread_mutex_lock(&f->lock);
    clear_rules(f);
    f->seed = (uint64_t)seed;
    f->latency_ms = lat;
    f->jitter_ms = jit;
    f->stall_ms = stall;
    json_object_clear(f->seq);
    json_array_clear(f->hits);
    f->anon_seq = 0;
    json_array_foreach(rules, i, r)
    {
        json_t *p = json_object_get(r, "probability");
        json_t *t = json_object_get(r, "times");
        add_locked(f, psp_fault_parse(json_string_value(json_object_get(r, "kind"))),
                   p ? json_number_value(p) : 1.0,
                   json_string_value(json_object_get(r, "key")),
                   json_string_value(json_object_get(r, "payment_method")),
                   json_is_integer(t) ? (long)json_integer_value(t) : -1);
    }
    pthread_mutex_unlock(&f->lock);
    return 0;
}

json_t *psp_faults_json(psp_faults_t *f)
{
    json_t *rules = json_array();
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->nrules; i++) {
        struct psp_rule *r = &f->rules[i];
        json_array_append_new(
            rules, json_pack("{s:s, s:f, s:s?, s:s?, s:I, s:I}", "kind",
                             kind_names[r->kind], "probability", r->probability, "key",
                             r->key, "payment_method", r->payment_method, "times",
                             (json_int_t)r->times, "fired", (json_int_t)r->fired));
    }
    json_t *out =
        json_pack("{s:I, s:I, s:I, s:I, s:o, s:o}", "seed", (json_int_t)f->seed,
                  "latency_ms", (json_int_t)f->latency_ms, "latency_jitter_ms",
                  (json_int_t)f->jitter_ms, "stall_ms", (json_int_t)f->stall_ms,
                  "rules", rules, "hits", json_deep_copy(f->hits));
    pthread_mutex_unlock(&f->lock);
    return out;
}

uint64_t psp_faults_next_seq(psp_faults_t *f, const char *key)
{
    uint64_t seq;
    pthread_mutex_lock(&f->lock);
    if (key) {
        json_t *v = json_object_get(f->seq, key);
        seq = v ? (uint64_t)json_integer_value(v) : 0;
        json_object_set_new(f->seq, key, json_integer((json_int_t)(seq + 1)));
    } else {
        seq = f->anon_seq++;
    }
    pthread_mutex_unlock(&f->lock);
    return seq;
}

/* splitmix64 over (seed, salt, key, seq): a uniform draw in [0, 1). */
static double draw(uint64_t seed, uint64_t salt, const char *key, uint64_t seq)
{
    uint64_t h = seed ^ (salt * 0x9e3779b97f4a7c15ULL) ^ (seq * 0xbf58476d1ce4e5b9ULL);
    for (const unsigned char *p = (const unsigned char *)(key ? key : ""); *p; p++)
        h = (h ^ *p) * 0x100000001b3ULL;
    h += 0x9e3779b97f4a7c15ULL;
    h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ULL;
    h = (h ^ (h >> 27)) * 0x94d049bb133111ebULL;
    h ^= h >> 31;
    return (double)(h >> 11) / (double)(1ULL << 53);
}

int psp_faults_hit(psp_faults_t *f, enum psp_fault_kind kind, const char *key,
                   const char *payment_method, uint64_t seq)
{
    int hit = 0;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->nrules && !hit; i++) {
        struct psp_rule *r = &f->rules[i];
        if (r->kind != kind || (r->times >= 0 && r->fired >= r->times))
            continue;
        if (r->key && (!key || strcmp(r->key, key) != 0))
            continue;
        if (r->payment_method &&
            (!payment_method || strcmp(r->payment_method, payment_method) != 0))
            continue;
        if (draw(f->seed, 1 + i * 7 + (uint64_t)kind, key, seq) < r->probability) {
            r->fired++;
            hit = 1;
            json_array_append_new(f->hits, json_pack("{s:s, s:s?, s:I}", "kind",
                                                     kind_names[kind], "key", key,
                                                     "seq", (json_int_t)seq));
        }
    }
    pthread_mutex_unlock(&f->lock);
    return hit;
}

int64_t psp_faults_latency_ms(psp_faults_t *f, const char *key, uint64_t seq)
{
    pthread_mutex_lock(&f->lock);
    int64_t ms = f->latency_ms;
    if (f->jitter_ms > 0)
        ms += (int64_t)(draw(f->seed, 999, key, seq) * (double)(f->jitter_ms + 1));
    pthread_mutex_unlock(&f->lock);
    return ms;
}

int64_t psp_faults_stall_ms(psp_faults_t *f)
{
    pthread_mutex_lock(&f->lock);
    int64_t ms = f->stall_ms;
    pthread_mutex_unlock(&f->lock);
    return ms;
}
