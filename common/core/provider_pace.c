#include "provider_pace.h"

#include <stddef.h>

#include "charged_assert.h"

void provider_pace_init(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    *p = (struct provider_pace){.refilled = now_ms,
                                .cut_at = INT64_MIN,
                                .grace_until = INT64_MIN,
                                .before_restart = -1.0,
                                .refuted_at = INT64_MIN,
                                .second = now_ms};
}

/* The counted second moves on: the one just ended becomes the last. */
static void count_second(struct provider_pace *p, int64_t now_ms)
{
    if (now_ms - p->second < 1000)
        return;
    int next = now_ms - p->second < 2000;
    p->last_second = next ? p->started : 0;
    p->answered[1] = next ? p->answered[0] : 0;
    p->throttled[1] = next ? p->throttled[0] : 0;
    p->started = p->answered[0] = p->throttled[0] = 0;
    p->second = now_ms;
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
    }
    if (now_ms > p->refilled)
        p->refilled = now_ms;
    CHARGED_ASSERT(p->tokens >= 0.0 && p->tokens <= burst(p));
}

int provider_pace_take(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL && p->limit >= 0.0);
    count_second(p, now_ms);
    if (p->limit > 0.0) {
        refill(p, now_ms);
        if (p->tokens < 1.0)
            return 0;
        p->tokens -= 1.0;
    }
    p->started++;
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

/* Past a restart's grace, this answer counted in its window: does the
 * window, full now, refute the restart? A window PACE_JUDGE_MS old and
 * not full is dropped unjudged: too few answers to tell. */
static int refutes(struct provider_pace *p, int throttled, int64_t now_ms)
{
    if (p->judged > 0 && now_ms - p->judged_since >= PACE_JUDGE_MS)
        p->judged = p->judged_429 = 0;
    if (p->judged == 0)
        p->judged_since = now_ms;
    p->judged++;
    p->judged_429 += throttled != 0;
    if (p->judged < PACE_JUDGE_ANSWERS)
        return 0;
    int refute = p->judged_429 >= PACE_REFUTE_429S &&
                 p->judged_429 * PACE_REFUTE_SHARE > p->judged;
    p->judged = p->judged_429 = 0;
    return refute;
}

/* 429s refuted the restart: the limit from before it, if it had one (1);
 * else (unpaced before) the first cut decides (0). */
static int refuted(struct provider_pace *p, int64_t now_ms)
{
    double back = p->before_restart;
    p->before_restart = -1.0;
    p->refuted_at = now_ms;
    if (back <= 0.0)
        return 0;
    refill(p, now_ms);
    p->limit = back;
    if (p->tokens > burst(p))
        p->tokens = burst(p);
    p->cut_at = now_ms;
    return 1;
}

void provider_pace_answer(struct provider_pace *p, int throttled, int first,
                          int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL && p->limit >= 0.0);
    count_second(p, now_ms);
    /* Only first 429s: a throttled object's retries answer 429 again and
     * again, and would make its share anything. */
    p->answered[0]++;
    p->throttled[0] += throttled && first;
    if (p->before_restart >= 0.0 && p->grace_until != INT64_MIN &&
        now_ms - p->grace_until >= PACE_RESTART_CONFIRM_MS)
        p->before_restart = -1.0; /* the raise was the provider's too */
    if (p->before_restart >= 0.0 && now_ms >= p->grace_until &&
        refutes(p, throttled, now_ms) && refuted(p, now_ms))
        return;
    if (!throttled) {
        if (p->limit > 0.0 && p->limit < PACE_MAX_PER_S)
            p->limit +=
                1.0 / p->limit > PACE_STEP_SHARE ? 1.0 / p->limit : PACE_STEP_SHARE;
        return;
    }
    if (now_ms < p->grace_until)
        return; /* a restart's grace: the old limits' answer */
    if (!first)
        return; /* a repeat of one message's overrun */
    if (p->cut_at != INT64_MIN && now_ms - p->cut_at < PACE_CUT_MS)
        return; /* the same overrun */
    int answers = p->answered[0] + p->answered[1];
    if (answers < PACE_CUT_ANSWERS)
        return; /* too few answers to tell an overrun from a stray */
    if ((p->throttled[0] + p->throttled[1]) * PACE_CUT_SHARE < answers)
        return; /* a 429 among many answers: about one object, not our rate */
    refill(p, now_ms);
    if (p->limit <= 0.0) {
        /* Unpaced until now: half of what was started in the last second. */
        int seen = p->started > p->last_second ? p->started : p->last_second;
        if (seen < PACE_MIN_SAMPLE)
            return; /* no rate to halve: a stray's, or too few to matter */
        p->limit = seen / 2.0;
        p->tokens = 0.0;
    } else {
        p->limit /= 2.0;
    }
    if (p->limit < PACE_MIN_PER_S)
        p->limit = PACE_MIN_PER_S;
    if (p->tokens > burst(p))
        p->tokens = burst(p);
    p->cut_at = now_ms;
    CHARGED_ASSERT(p->limit >= PACE_MIN_PER_S);
}

int provider_pace_restart(struct provider_pace *p, int64_t now_ms)
{
    CHARGED_ASSERT(p != NULL);
    count_second(p, now_ms);
    if (p->refuted_at != INT64_MIN && now_ms - p->refuted_at < PACE_RESTART_CONFIRM_MS)
        return 0; /* the provider did not follow the last raise */
    /* A restart not yet refuted nor confirmed: this one keeps its older
     * limit, its grace and its window, or raises in a row would hold off
     * every judgement. */
    int chained = p->before_restart >= 0.0;
    if (!chained)
        p->before_restart = p->limit;
    p->limit = 0.0;
    p->tokens = 0.0;
    p->refilled = now_ms;
    p->cut_at = INT64_MIN;
    if (!chained) {
        p->grace_until = now_ms + PACE_RESTART_GRACE_MS;
        p->judged = p->judged_429 = 0;
    }
    CHARGED_ASSERT(provider_pace_next_ms(p, now_ms) == now_ms);
    return 1;
}

double provider_pace_limit(const struct provider_pace *p)
{
    CHARGED_ASSERT(p != NULL);
    return p->limit;
}
