#include "provider_breaker.h"

#include <stdlib.h>

struct provider_breaker {
    struct provider_breaker_config cfg;
    enum provider_breaker_state state;
    /* Moves on at every change of state: a ticket of an older generation
     * tells of the provider as it was, and is only counted in flight. */
    uint64_t generation;
    int64_t opened_at; /* OPEN: since when */
    int streak;        /* CLOSED: failures in a row; HALF_OPEN: successes */
    int probe_out;     /* HALF_OPEN: the probe is in flight */
    size_t in_flight;
    uint64_t opens;
};

provider_breaker_t *provider_breaker_new(const struct provider_breaker_config *cfg)
{
    provider_breaker_t *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->cfg = *cfg;
    if (b->cfg.probes < 1)
        b->cfg.probes = 1;
    if (b->cfg.open_ms < 0)
        b->cfg.open_ms = 0;
    b->state = PROVIDER_BREAKER_CLOSED;
    return b;
}

void provider_breaker_free(provider_breaker_t *b)
{
    free(b);
}

static void move_to(provider_breaker_t *b, enum provider_breaker_state s, int64_t now)
{
    b->state = s;
    b->generation++;
    b->streak = 0;
    b->probe_out = 0;
    if (s == PROVIDER_BREAKER_OPEN) {
        b->opened_at = now;
        b->opens++;
    }
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

int provider_breaker_allow(provider_breaker_t *b, int64_t now_ms,
                           struct provider_breaker_ticket *t)
{
    switch (provider_breaker_state(b, now_ms)) {
    case PROVIDER_BREAKER_CLOSED:
        *t = (struct provider_breaker_ticket){b->generation, 0};
        break;
    case PROVIDER_BREAKER_HALF_OPEN:
        if (b->probe_out)
            return 0;
        b->probe_out = 1;
        *t = (struct provider_breaker_ticket){b->generation, 1};
        break;
    case PROVIDER_BREAKER_OPEN:
        return 0;
    }
    b->in_flight++;
    return 1;
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
    return 1;
}

void provider_breaker_record(provider_breaker_t *b,
                             const struct provider_breaker_ticket *t,
                             enum provider_breaker_answer a, int64_t now_ms)
{
    if (!end_ticket(b, t))
        return;
    switch (b->state) {
    case PROVIDER_BREAKER_CLOSED:
        if (a == PROVIDER_BREAKER_SUCCESS) {
            b->streak = 0;
        } else if (b->cfg.failures > 0 && ++b->streak >= b->cfg.failures) {
            move_to(b, PROVIDER_BREAKER_OPEN, now_ms);
        }
        break;
    case PROVIDER_BREAKER_HALF_OPEN:
        if (a == PROVIDER_BREAKER_FAILURE)
            move_to(b, PROVIDER_BREAKER_OPEN, now_ms);
        else if (++b->streak >= b->cfg.probes)
            move_to(b, PROVIDER_BREAKER_CLOSED, now_ms);
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
        return now_ms;
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
    return b->streak;
}

uint64_t provider_breaker_opens(const provider_breaker_t *b)
{
    return b->opens;
}

enum provider_breaker_answer provider_breaker_classify(int http_status)
{
    if (http_status == 0 || http_status == 429 || http_status >= 500)
        return PROVIDER_BREAKER_FAILURE;
    return PROVIDER_BREAKER_SUCCESS;
}
