#include "provider_pace.h"

#include <stddef.h>
#include <string.h>

#include "charged_assert.h"

void provider_pace_init(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    *p = (struct provider_pace){.refilled = now_ms,
                                .since = now_ms,
                                .grace_until = INT64_MIN,
                                .quiet_ms = PACE_QUIET_MS,
                                .quiet_until = INT64_MIN};
}

/* The bucket holds a tenth of a second's calls, at least one. */
static double burst(const struct provider_pace *p)
{
    double b = p->limit / 10.0;
    return b < 1.0 ? 1.0 : b;
}

static void refill(struct provider_pace *p, int64_t now_ms)
{
    if (now_ms > p->refilled) {
        p->tokens += (double)(now_ms - p->refilled) * p->limit / 1000.0;
        if (p->tokens > burst(p))
            p->tokens = burst(p);
        p->refilled = now_ms;
    }
    CHARGED_ASSERT(p->tokens >= 0.0 && p->tokens <= burst(p));
}

int provider_pace_take(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL && p->limit >= 0.0);
    if (p->limit > 0.0) {
        refill(p, now_ms);
        if (p->tokens < 1.0)
            return 0;
        p->tokens -= 1.0;
    }
    return 1;
}

int64_t provider_pace_next_ms(const struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    if (p->limit <= 0.0)
        return now_ms;
    double tokens = p->tokens;
    if (now_ms > p->refilled)
        tokens += (double)(now_ms - p->refilled) * p->limit / 1000.0;
    if (tokens >= 1.0)
        return now_ms;
    int64_t wait = (int64_t)((1.0 - tokens) * 1000.0 / p->limit) + 1;
    CHARGED_ASSERT(wait > 0);
    return now_ms + wait;
}

/* The object's slot in the window: its own, a free one, or one that holds
 * only served answers (lost: it said nothing of 429s); NULL when every
 * probe holds 429s of other objects. */
static struct pace_object *slot_of(struct provider_pace *p, uint64_t object)
{
    struct pace_object *spare = NULL;
    for (int i = 0; i < PACE_OBJECT_PROBES; i++) {
        struct pace_object *o = &p->objects[(object + (uint64_t)i) % PACE_OBJECTS];
        if (o->id == object)
            return o;
        if (!spare && (o->id == 0 || o->throttled == 0))
            spare = o;
    }
    if (spare)
        *spare = (struct pace_object){.id = object};
    return spare;
}

static void window_reset(struct provider_pace *p, int64_t now_ms)
{
    p->since = now_ms;
    p->answers = p->throttled = 0;
    memset(p->objects, 0, sizeof(p->objects));
}

/* A restart's window was judged: an overrun refutes it (no restart for
 * the quiet time, doubled for the next), PACE_CONFIRM_WINDOWS clean ones
 * confirm it (the quiet back to its least). */
static void restart_judged(struct provider_pace *p, int overrun, int64_t now_ms)
{
    if (p->judging == 0)
        return;
    if (overrun) {
        p->judging = 0;
        p->quiet_until = now_ms + p->quiet_ms;
        p->quiet_ms =
            p->quiet_ms * 2 > PACE_QUIET_MAX_MS ? PACE_QUIET_MAX_MS : p->quiet_ms * 2;
    } else if (--p->judging == 0) {
        p->quiet_ms = PACE_QUIET_MS;
    }
}

/* The window is judged: 429s about objects that got nothing else while
 * others were served are set aside; an overrun of the rest cuts the limit
 * to the rate the provider served. */
static void judge(struct provider_pace *p, int64_t now_ms)
{
    int answers = p->answers, throttled = p->throttled;
    int served = p->answers - p->throttled;
    /* The PACE_OBJECTS_APART objects with most 429s among those that got
     * nothing else: a few objects throttled by themselves. Many such are
     * the account's overrun (a backlog's retries, each about its own
     * payment method). */
    char apart[PACE_OBJECTS] = {0};
    for (int k = 0; served > 0 && k < PACE_OBJECTS_APART; k++) {
        int best = -1;
        for (int i = 0; i < PACE_OBJECTS; i++) {
            const struct pace_object *o = &p->objects[i];
            if (!apart[i] && o->id != 0 && o->served == 0 && o->throttled >= 2 &&
                (best < 0 || o->throttled > p->objects[best].throttled))
                best = i;
        }
        if (best < 0)
            break;
        apart[best] = 1;
        answers -= p->objects[best].throttled;
        throttled -= p->objects[best].throttled;
    }
    CHARGED_ASSERT(throttled >= 0 && answers >= throttled);
    int overrun =
        throttled >= PACE_CUT_429S && (int64_t)throttled * PACE_CUT_SHARE >= answers;
    restart_judged(p, overrun, now_ms);
    if (!overrun)
        return;
    int64_t span = now_ms - p->since;
    if (span < PACE_WINDOW_MS)
        span = PACE_WINDOW_MS;
    double rate = (double)served * 1000.0 / (double)span;
    if (p->limit > 0.0 && rate > p->limit)
        rate = p->limit;
    if (rate < PACE_MIN_PER_S)
        rate = PACE_MIN_PER_S;
    refill(p, now_ms);
    if (p->limit <= 0.0)
        p->tokens = 0.0; /* unpaced until now: the overrun spent them */
    p->limit = rate;
    if (p->tokens > burst(p))
        p->tokens = burst(p);
    CHARGED_ASSERT(p->limit >= PACE_MIN_PER_S);
}

void provider_pace_answer(struct provider_pace *p, int throttled, uint64_t object,
                          int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL && p->limit >= 0.0);
    int64_t age = now_ms - p->since;
    /* A window opened in a restart's grace answers the old limits. */
    if (p->answers > 0 && p->since < p->grace_until && now_ms >= p->grace_until)
        window_reset(p, now_ms);
    if (p->answers > 0 &&
        (age >= PACE_WINDOW_MAX_MS ||
         (age >= PACE_WINDOW_MS && p->answers >= PACE_WINDOW_ANSWERS))) {
        if (now_ms >= p->grace_until)
            judge(p, now_ms);
        window_reset(p, now_ms);
    }
    if (p->answers == 0)
        window_reset(p, now_ms);
    p->answers++;
    p->throttled += throttled != 0;
    struct pace_object *o = object ? slot_of(p, object) : NULL;
    if (o) { /* none: a 429 no slot holds counts as the account's */
        o->served += !throttled;
        o->throttled += throttled != 0;
    }
    if (!throttled && p->limit > 0.0 && p->limit < PACE_MAX_PER_S)
        p->limit += 1.0 / p->limit > PACE_STEP_SHARE ? 1.0 / p->limit : PACE_STEP_SHARE;
}

int provider_pace_restart(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    if (p->quiet_until != INT64_MIN && now_ms < p->quiet_until)
        return 0; /* the provider did not follow the last raise */
    p->limit = 0.0;
    p->tokens = 0.0;
    p->refilled = now_ms;
    /* One being judged or in its grace keeps both: raises in a row would
     * hold off every judgement. */
    if (p->judging == 0) {
        p->grace_until = now_ms + PACE_RESTART_GRACE_MS;
        p->judging = PACE_CONFIRM_WINDOWS;
    }
    CHARGED_ASSERT(provider_pace_next_ms(p, now_ms) == now_ms);
    return 1;
}

double provider_pace_limit(const struct provider_pace *p)
{
    CHARGED_ASSERT(p != NULL);
    return p->limit;
}

uint64_t provider_pace_object(const char *name)
{
    if (!name || !*name)
        return 0;
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (const unsigned char *c = (const unsigned char *)name; *c; c++)
        h = (h ^ *c) * 1099511628211ULL;
    return h ? h : 1;
}
