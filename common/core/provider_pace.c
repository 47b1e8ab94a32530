#include "provider_pace.h"

#include <string.h>

#include "charged_assert.h"

void provider_pace_init(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    *p = (struct provider_pace){.refilled = now_ms,
                                .since = now_ms,
                                .changed_at = INT64_MIN,
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

/* A new limit (0: unpaced), its bucket no fuller than it holds. */
static void set_limit(struct provider_pace *p, double limit, int64_t now_ms)
{
    refill(p, now_ms);
    if (p->limit <= 0.0 && limit > 0.0)
        p->tokens = 0.0; /* unpaced until now: whatever went, went */
    p->limit = limit;
    if (p->tokens > burst(p))
        p->tokens = burst(p);
    CHARGED_ASSERT(p->limit == 0.0 || p->limit >= PACE_MIN_PER_S);
}

int provider_pace_take(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL && p->limit >= 0.0);
    if (p->limit > 0.0) {
        refill(p, now_ms);
        if (p->tokens < 1.0) {
            p->held = 1;
            return 0;
        }
        p->tokens -= 1.0;
    }
    return 1;
}

void provider_pace_held(struct provider_pace *p)
{
    CHARGED_ASSERT(p != NULL);
    p->held = 1;
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

static void window_clear(struct provider_pace *p)
{
    p->answers = p->throttled = p->held = 0;
    p->waiting = 0;
    memset(p->objects, 0, sizeof(p->objects));
}

/* A restart's window was judged: an overrun refutes it (no restart for
 * the quiet time, doubled for the next), PACE_CONFIRM_WINDOWS others
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

/* What a window counts: its answers and 429s but those about objects the
 * provider throttles by themselves: each with PACE_CUT_429S 429s or more,
 * at least half of its answers, while the answers about every other object
 * were served, under a PACE_CUT_SHARE-th of them 429s. An account's
 * overrun answers 429 whatever the object, so the others show it. */
struct counted {
    int answers, throttled;
};

static int self_throttled(const struct pace_object *o)
{
    return o->id != 0 && o->throttled >= PACE_CUT_429S && o->throttled >= o->served;
}

/* Is `id` among the objects known to be throttled by themselves? */
static struct pace_known *known_of(struct provider_pace *p, uint64_t id, int64_t now_ms)
{
    for (int i = 0; i < PACE_KNOWN; i++)
        if (p->known[i].id == id && now_ms < p->known[i].until)
            return &p->known[i];
    return NULL;
}

/* Remembers `id` as throttled by itself until PACE_KNOWN_MS from now (in
 * the slot of the one that ends first). */
static void know(struct provider_pace *p, uint64_t id, int64_t now_ms)
{
    struct pace_known *k = known_of(p, id, now_ms);
    if (!k) {
        k = &p->known[0];
        for (int i = 1; i < PACE_KNOWN; i++)
            if (p->known[i].until < k->until)
                k = &p->known[i];
    }
    k->id = id;
    k->until = now_ms + PACE_KNOWN_MS;
}

static struct counted count_window(struct provider_pace *p, int64_t now_ms)
{
    struct counted c = {p->answers, p->throttled}, hot = {0, 0}, known = {0, 0};
    int objects = 0;
    for (int i = 0; i < PACE_OBJECTS; i++) {
        const struct pace_object *o = &p->objects[i];
        if (!self_throttled(o))
            continue;
        hot.answers += o->served + o->throttled;
        hot.throttled += o->throttled;
        objects++;
        if (known_of(p, o->id, now_ms)) {
            known.answers += o->served + o->throttled;
            known.throttled += o->throttled;
        }
    }
    int rest = c.answers - hot.answers, rest_429 = c.throttled - hot.throttled;
    /* And they are few, or the lesser part of the window: a backlog's
     * retries after an account's overrun, each about its own card, are
     * many objects and most of the answers. */
    if (hot.answers > 0 && (objects <= PACE_OBJECTS_FEW || hot.answers <= rest) &&
        rest > rest_429 && rest_429 * PACE_CUT_SHARE < rest) {
        for (int i = 0; i < PACE_OBJECTS; i++)
            if (self_throttled(&p->objects[i]))
                know(p, p->objects[i].id, now_ms);
        c.answers = rest;
        c.throttled = rest_429;
    } else if (known.answers > 0) {
        /* Objects known from recent windows stay apart, even in one whose
         * answers are nearly all theirs (their retries come back first). */
        c.answers -= known.answers;
        c.throttled -= known.throttled;
    }
    CHARGED_ASSERT(c.throttled >= 0 && c.answers >= c.throttled);
    return c;
}

static void judge(struct provider_pace *p, int64_t now_ms)
{
    struct counted c = count_window(p, now_ms);
    int served = p->answers - p->throttled;
    double share = c.answers > 0 ? (double)c.throttled / c.answers : 0.0;
    int pushing = p->waiting > (size_t)served;
    int64_t span = p->last_at - p->since;
    if (span < PACE_WINDOW_MS)
        span = PACE_WINDOW_MS;

    int overrun =
        pushing && c.throttled >= PACE_CUT_429S && share * PACE_CUT_SHARE >= 1.0;
    restart_judged(p, overrun, now_ms);
    if (overrun) {
        double rate = (double)served * 1000.0 / (double)span;
        if (p->limit > 0.0 && rate > p->limit)
            rate = p->limit;
        if (rate < PACE_MIN_PER_S)
            rate = PACE_MIN_PER_S;
        set_limit(p, rate, now_ms);
        p->steps = 0;
        p->changed_at = now_ms;
    } else if (p->held && p->limit > 0.0) {
        double step = PACE_STEP_PER_S * (double)(1L << p->steps);
        if (p->steps < PACE_STEP_DOUBLINGS)
            p->steps++;
        set_limit(p, p->limit + step > PACE_MAX_PER_S ? 0.0 : p->limit + step, now_ms);
    }
}

void provider_pace_answer(struct provider_pace *p, const struct pace_answer *a,
                          size_t waiting, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL && a != NULL && p->limit >= 0.0);
    if (p->changed_at != INT64_MIN && a->sent_ms < p->changed_at)
        return; /* sent before the last cut or restart: the old rate's */
    if (p->answers > 0) {
        int64_t age = now_ms - p->since;
        if (p->since < p->grace_until && now_ms >= p->grace_until) {
            window_clear(p); /* opened in a restart's grace: the old limits' */
        } else if (age >= PACE_WINDOW_MAX_MS ||
                   (age >= PACE_WINDOW_MS &&
                    (p->answers >= PACE_WINDOW_ANSWERS || p->held))) {
            if (now_ms >= p->grace_until)
                judge(p, now_ms);
            window_clear(p);
        }
    }
    if (p->answers == 0)
        p->since = now_ms;
    p->last_at = now_ms;
    p->answers++;
    p->throttled += a->throttled != 0;
    if (waiting > p->waiting)
        p->waiting = waiting;
    struct pace_object *o = a->object ? slot_of(p, a->object) : NULL;
    if (o) { /* none: a 429 no slot holds counts as the account's */
        o->served += !a->throttled;
        o->throttled += a->throttled != 0;
    }
}

int provider_pace_restart(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    if (p->quiet_until != INT64_MIN && now_ms < p->quiet_until)
        return 0; /* the provider did not follow the last raise */
    if (p->judging > 0)
        return 0; /* one is being judged, unpaced: raises in a row would
                     hold off every judgement */
    set_limit(p, 0.0, now_ms);
    p->tokens = 0.0;
    p->refilled = now_ms;
    p->changed_at = now_ms;
    p->steps = 0;
    window_clear(p);
    p->grace_until = now_ms + PACE_RESTART_GRACE_MS;
    p->judging = PACE_CONFIRM_WINDOWS;
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
