/* retry_tries: how a provider's answers count against a record's tries,
 * and the back-off before the next try. One rule for every operation: the
 * engine counts and waits with it, and charge_policy's table decides with
 * the count. */
#ifndef CHARGED_RETRY_TRIES_H
#define CHARGED_RETRY_TRIES_H

#include "provider_outcome.h"

/* The answers counted against a record (per claim; rode_outage for as
 * long as the worker holds the message). */
struct retry_tries {
    int not_executed; /* answers that were not executed (and sends never made) */
    int unknown;      /* answers of unknown outcome */
    int rode_outage;  /* one of its failures opened the breaker: that one counted
                         no try, and no later one is spared */
};

/* Counts one answer against t and returns the tries to decide it with.
 * failure: the breaker counts the answer as a failure of the provider;
 * opened_breaker: recording it opened the breaker. The failure that opens
 * the breaker counts no try, once per t: a lone record whose failures
 * opened it in an outage would otherwise be settled UNKNOWN by the outage
 * itself. Every other failure counts, as it would without a breaker (calls
 * in flight when it opened too): a record the provider refuses every time
 * (a poisoned one, one of many failing at once after a close) still uses
 * up its tries instead of being sent again and again. *outage (may be
 * NULL) says whether this answer was spared as the outage's. */
int retry_tries_count(struct retry_tries *t, enum provider_outcome outcome, int failure,
                      int opened_breaker, int *outage);

/* The back-off before try number `tries` + 1: base_ms * 2^(tries-1),
 * capped at max_ms, then jittered into [d/2, d] by `jitter` (a record's
 * own number, so that records retried together spread out). */
long long retry_backoff_ms(long long base_ms, long long max_ms, int tries,
                           unsigned jitter);

#endif
