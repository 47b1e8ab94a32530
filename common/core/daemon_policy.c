#include "daemon_policy.h"

#include <limits.h>

#include "charged_assert.h"

#define BACKOFF_FIRST_MS  250
#define BACKOFF_MAX_MS    5000
#define FINISH_RESERVE_MS 2000
#define FLUSH_MAX_MS      1000

int64_t daemon_policy_earliest(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

int daemon_policy_wait_ms(int64_t now, int64_t due)
{
    if (due <= now)
        return 0;
    /* Both are clock_now_ms() values or 0 (due now), never negative: the
     * difference cannot overflow. */
    int64_t left = due - now;
    CHARGED_ASSERT(left > 0);
    return left > INT_MAX ? INT_MAX : (int)left;
}

int64_t daemon_policy_backoff_ms(int64_t last_ms)
{
    if (last_ms <= 0)
        return BACKOFF_FIRST_MS;
    int64_t next = last_ms >= BACKOFF_MAX_MS / 2 ? BACKOFF_MAX_MS : last_ms * 2;
    CHARGED_ASSERT(next > last_ms || next == BACKOFF_MAX_MS);
    CHARGED_ASSERT(next > 0 && next <= BACKOFF_MAX_MS);
    return next;
}

int64_t daemon_policy_drain_deadline(int64_t stopping_at, long long shutdown_ms)
{
    CHARGED_ASSERT(shutdown_ms >= 0); /* a setting, checked at load */
    long long reserve =
        shutdown_ms / 4 < FINISH_RESERVE_MS ? shutdown_ms / 4 : FINISH_RESERVE_MS;
    int64_t deadline = stopping_at + shutdown_ms - reserve;
    /* The drain ends after the stop and before the shutdown's end. */
    CHARGED_ASSERT(deadline >= stopping_at && deadline <= stopping_at + shutdown_ms);
    return deadline;
}

int daemon_policy_flush_ms(int64_t stopping_at, long long shutdown_ms, int64_t now)
{
    int64_t rest = stopping_at + shutdown_ms - now;
    int ms = rest > FLUSH_MAX_MS ? FLUSH_MAX_MS : rest > 0 ? (int)rest : 0;
    CHARGED_ASSERT(ms >= 0 && ms <= FLUSH_MAX_MS);
    return ms;
}
