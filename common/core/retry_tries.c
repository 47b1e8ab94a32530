#include "retry_tries.h"

#include "charged_assert.h"

int retry_tries_count(struct retry_tries *t, enum provider_outcome outcome, int failure,
                      int opened_breaker, int *outage)
{
    CHARGED_ASSERT(t && t->not_executed >= 0 && t->unknown >= 0);
    int spared = failure && opened_breaker && !t->rode_outage;
    if (spared)
        t->rode_outage = 1;
    if (outage)
        *outage = spared;
    if (outcome == PROVIDER_NOT_EXECUTED)
        return spared ? t->not_executed : ++t->not_executed;
    if (outcome == PROVIDER_UNKNOWN)
        return spared ? t->unknown : ++t->unknown;
    return 1;
}

long long retry_backoff_ms(long long base_ms, long long max_ms, int tries,
                           unsigned jitter)
{
    CHARGED_ASSERT(base_ms >= 0 && max_ms >= 0);
    long long d = base_ms;
    for (int i = 1; i < tries && d < max_ms; i++)
        d *= 2;
    if (d > max_ms)
        d = max_ms;
    unsigned h = (jitter * 2654435761u) ^ (unsigned)tries;
    long long wait = d / 2 + (long long)(h % (unsigned long long)(d / 2 + 1));
    /* Jittered within the capped step: never past max_ms. */
    CHARGED_ASSERT(wait >= d / 2 && wait <= d && wait <= max_ms);
    return wait;
}
