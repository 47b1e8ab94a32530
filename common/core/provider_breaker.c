#include "provider_breaker.h"

#include <stdlib.h>

#include "charged_assert.h"

struct bucket {
    int64_t start; /* of its slice of time; a bucket older than the window is empty */
    int calls, failures; /* answers other than 429, and failures among them */
    int throttled;       /* 429s */
};

struct provider_breaker {
    struct provider_breaker_config cfg;
    long long bucket_ms;
    enum provider_breaker_state state;
    /* Moves on at every change of state: a ticket of an older generation
     * tells of the provider as it was, and is only counted in flight. */
    uint64_t generation;
    int64_t opened_at;                     /* OPEN: since when */
    struct bucket window[BREAKER_BUCKETS]; /* CLOSED: the last window_ms */
    int streak;                            /* HALF_OPEN: probe successes in a row */
    int probe_out;                         /* HALF_OPEN: the probe is in flight */
    int probation; /* CLOSED by a probe: the first calls decide */
    int probation_out, probation_done, probation_failures;
    /* CLOSED: the first 429 since the last other answer (INT64_MIN: the
     * last answer was not a 429): nothing but 429s since then. */
    int64_t throttled_since;
    size_t in_flight;
    uint64_t opens;
};

static void clear_window(provider_breaker_t *b)
{
    for (int i = 0; i < BREAKER_BUCKETS; i++)
        b->window[i] = (struct bucket){INT64_MIN, 0, 0, 0};
    b->throttled_since = INT64_MIN;
}

provider_breaker_t *provider_breaker_new(const struct provider_breaker_config *cfg)
{
    CHARGED_ASSERT(cfg);
    provider_breaker_t *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->cfg = *cfg;
    if (b->cfg.probes < 1)
        b->cfg.probes = 1;
    if (b->cfg.min_calls < 1)
        b->cfg.min_calls = 1;
    if (b->cfg.failure_rate < 0)
        b->cfg.failure_rate = 0;
    if (b->cfg.open_ms < 0)
        b->cfg.open_ms = 0;
    if (b->cfg.window_ms < BREAKER_BUCKETS)
        b->cfg.window_ms = BREAKER_BUCKETS;
    b->bucket_ms = b->cfg.window_ms / BREAKER_BUCKETS;
    CHARGED_ASSERT(b->bucket_ms > 0);
    b->state = PROVIDER_BREAKER_CLOSED;
    clear_window(b);
    return b;
}

void provider_breaker_free(provider_breaker_t *b)
{
    free(b);
}

static void move_to(provider_breaker_t *b, enum provider_breaker_state s, int64_t now)
{
    /* Every move is to another state (closed -> open -> half open -> open
     * or closed): one that stays put is a bug in the table of moves. */
    CHARGED_ASSERT((unsigned)s <= PROVIDER_BREAKER_OPEN && s != b->state);
    b->state = s;
    b->generation++;
    b->streak = 0;
    b->probe_out = 0;
    b->probation = b->probation_out = b->probation_done = b->probation_failures = 0;
    /* A closed breaker starts from nothing: the failures that opened it
     * are about the provider as it was. */
    clear_window(b);
    if (s == PROVIDER_BREAKER_OPEN) {
        b->opened_at = now;
        b->opens++;
    }
}

/* The bucket for now's slice of time, emptied if it last held an older one. */
static struct bucket *bucket_at(provider_breaker_t *b, int64_t now)
{
    CHARGED_ASSERT(b->bucket_ms > 0);
    int64_t slice = now >= 0 ? now / b->bucket_ms : -((-now - 1) / b->bucket_ms) - 1;
    struct bucket *k = &b->window[(size_t)(slice % BREAKER_BUCKETS + BREAKER_BUCKETS) %
                                  BREAKER_BUCKETS];
    int64_t start = slice * b->bucket_ms;
    if (k->start != start)
        *k = (struct bucket){start, 0, 0, 0};
    return k;
}

void provider_breaker_window(provider_breaker_t *b, int64_t now_ms, int *calls,
                             int *failures)
{
    CHARGED_ASSERT(calls && failures);
    *calls = *failures = 0;
    if (b->state != PROVIDER_BREAKER_CLOSED)
        return;
    for (int i = 0; i < BREAKER_BUCKETS; i++) {
        const struct bucket *k = &b->window[i];
        /* Buckets whose slice lies in the last window_ms (the current one
         * included). */
        if (k->start != INT64_MIN && k->start > now_ms - b->cfg.window_ms &&
            k->start <= now_ms) {
            *calls += k->calls;
            *failures += k->failures;
        }
    }
    CHARGED_ASSERT(*failures <= *calls);
}

enum provider_breaker_state provider_breaker_state(provider_breaker_t *b,
                                                   int64_t now_ms)
{
    if (b->state == PROVIDER_BREAKER_OPEN && now_ms - b->opened_at >= b->cfg.open_ms)
        move_to(b, PROVIDER_BREAKER_HALF_OPEN, now_ms);
    return b->state;
}

const char *provider_breaker_state_name(enum provider_breaker_state s)
{
    switch (s) {
    case PROVIDER_BREAKER_CLOSED:
        return "closed";
    case PROVIDER_BREAKER_HALF_OPEN:
        return "half_open";
    case PROVIDER_BREAKER_OPEN:
        return "open";
    }
    return "unknown";
}

/* Every call of the probation is taken (in flight or ended). */
static int probation_full(const provider_breaker_t *b)
{
    return b->probation && b->probation_out + b->probation_done >= b->cfg.probes;
}

int provider_breaker_allow(provider_breaker_t *b, int64_t now_ms,
                           struct provider_breaker_ticket *t)
{
    if (provider_breaker_state(b, now_ms) != PROVIDER_BREAKER_CLOSED ||
        probation_full(b))
        return 0;
    *t = (struct provider_breaker_ticket){b->generation, 0, b->probation};
    b->probation_out += b->probation;
    b->in_flight++;
    /* A probation lets through its calls and no more. */
    CHARGED_ASSERT(!b->probation ||
                   b->probation_out + b->probation_done <= b->cfg.probes);
    return 1;
}

int provider_breaker_allow_probe(provider_breaker_t *b, int64_t now_ms,
                                 struct provider_breaker_ticket *t)
{
    if (provider_breaker_state(b, now_ms) != PROVIDER_BREAKER_HALF_OPEN || b->probe_out)
        return 0;
    CHARGED_ASSERT(t);
    b->probe_out = 1;
    *t = (struct provider_breaker_ticket){b->generation, 1, 0};
    b->in_flight++;
    return 1;
}

int provider_breaker_on_probation(const provider_breaker_t *b)
{
    return b->probation;
}

/* Ends ticket t's stay in flight; 1 when its answer is about the provider
 * as it is now (same generation). */
static int end_ticket(provider_breaker_t *b, const struct provider_breaker_ticket *t)
{
    if (b->in_flight > 0)
        b->in_flight--;
    if (t->generation != b->generation)
        return 0;
    if (t->probe)
        b->probe_out = 0;
    if (t->probation && b->probation_out > 0)
        b->probation_out--;
    return 1;
}

/* 429s in the window as of now_ms. */
static int window_throttled(const provider_breaker_t *b, int64_t now_ms)
{
    int n = 0;
    for (int i = 0; i < BREAKER_BUCKETS; i++) {
        const struct bucket *k = &b->window[i];
        if (k->start != INT64_MIN && k->start > now_ms - b->cfg.window_ms &&
            k->start <= now_ms)
            n += k->throttled;
    }
    CHARGED_ASSERT(n >= 0);
    return n;
}

/* A 429 while closed: counted apart; it opens the breaker only when
 * nothing but 429s came back for a whole window. */
static void record_throttled(provider_breaker_t *b, int64_t now_ms)
{
    CHARGED_ASSERT(b->state == PROVIDER_BREAKER_CLOSED);
    bucket_at(b, now_ms)->throttled++;
    if (b->throttled_since == INT64_MIN)
        b->throttled_since = now_ms;
    if (b->cfg.failure_rate > 0 && now_ms - b->throttled_since >= b->cfg.window_ms &&
        window_throttled(b, now_ms) >= b->cfg.min_calls)
        move_to(b, PROVIDER_BREAKER_OPEN, now_ms);
}

void provider_breaker_record(provider_breaker_t *b,
                             const struct provider_breaker_ticket *t,
                             enum provider_breaker_answer a, int64_t now_ms)
{
    int calls, failures;
    CHARGED_ASSERT(t &&
                   (a == PROVIDER_BREAKER_SUCCESS || a == PROVIDER_BREAKER_FAILURE ||
                    a == PROVIDER_BREAKER_THROTTLED));
    if (!end_ticket(b, t))
        return;
    if (a == PROVIDER_BREAKER_THROTTLED && b->state == PROVIDER_BREAKER_CLOSED) {
        /* On probation too: a 429 says nothing of whether charges work;
         * its place in the probation is free again (end_ticket). */
        record_throttled(b, now_ms);
        return;
    }
    if (a == PROVIDER_BREAKER_THROTTLED)
        a = PROVIDER_BREAKER_FAILURE; /* half-open: still nothing but 429s */
    switch (b->state) {
    case PROVIDER_BREAKER_CLOSED: {
        b->throttled_since = INT64_MIN;
        struct bucket *k = bucket_at(b, now_ms);
        k->calls++;
        k->failures += a == PROVIDER_BREAKER_FAILURE;
        if (t->probation && b->probation) {
            b->probation_done++;
            b->probation_failures += a == PROVIDER_BREAKER_FAILURE;
            if (b->probation_done >= b->cfg.probes) {
                if (b->cfg.failure_rate > 0 &&
                    (long long)b->probation_failures * 100 >=
                        (long long)b->cfg.failure_rate * b->probation_done) {
                    move_to(b, PROVIDER_BREAKER_OPEN, now_ms);
                    break;
                }
                b->probation = 0; /* the calls after the close went through */
            }
        }
        if (a != PROVIDER_BREAKER_FAILURE || b->cfg.failure_rate == 0)
            break;
        provider_breaker_window(b, now_ms, &calls, &failures);
        /* failures / calls >= rate %, in integers. */
        if (calls >= b->cfg.min_calls &&
            (long long)failures * 100 >= (long long)b->cfg.failure_rate * calls)
            move_to(b, PROVIDER_BREAKER_OPEN, now_ms);
        break;
    }
    case PROVIDER_BREAKER_HALF_OPEN:
        if (a == PROVIDER_BREAKER_FAILURE) {
            move_to(b, PROVIDER_BREAKER_OPEN, now_ms);
        } else if (++b->streak >= b->cfg.probes) {
            move_to(b, PROVIDER_BREAKER_CLOSED, now_ms);
            b->probation = 1;
        }
        break;
    case PROVIDER_BREAKER_OPEN:
        break; /* no ticket of this generation exists */
    }
}

void provider_breaker_cancel(provider_breaker_t *b,
                             const struct provider_breaker_ticket *t)
{
    end_ticket(b, t);
}

int64_t provider_breaker_next_allow_ms(provider_breaker_t *b, int64_t now_ms)
{
    switch (provider_breaker_state(b, now_ms)) {
    case PROVIDER_BREAKER_CLOSED:
        return probation_full(b) ? INT64_MAX : now_ms;
    case PROVIDER_BREAKER_HALF_OPEN:
        return b->probe_out ? INT64_MAX : now_ms;
    case PROVIDER_BREAKER_OPEN:
        break;
    }
    return b->opened_at + b->cfg.open_ms;
}

size_t provider_breaker_in_flight(const provider_breaker_t *b)
{
    return b->in_flight;
}

int provider_breaker_streak(const provider_breaker_t *b)
{
    return b->state == PROVIDER_BREAKER_HALF_OPEN ? b->streak : 0;
}

uint64_t provider_breaker_opens(const provider_breaker_t *b)
{
    return b->opens;
}

enum provider_breaker_answer provider_breaker_classify(int http_status)
{
    if (http_status == 429)
        return PROVIDER_BREAKER_THROTTLED;
    if (http_status == 0 || http_status >= 500)
        return PROVIDER_BREAKER_FAILURE;
    return PROVIDER_BREAKER_SUCCESS;
}
