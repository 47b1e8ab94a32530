/* provider_breaker: stop calling a provider that is down, and find out when
 * it is back.
 *
 * Pure: no clock, no I/O; the caller passes the time (monotonic ms).
 *
 *   CLOSED     calls go. It opens when, over the last `window_ms`, at least
 *              `min_calls` calls ended and at least `failure_rate` percent
 *              of them failed.
 *   OPEN       no call starts. `open_ms` after it opened it is HALF_OPEN.
 *   HALF_OPEN  one probe at a time. `probes` successes in a row close it
 *              (with an empty window); a failure opens it again for another
 *              `open_ms`.
 *   CLOSED, on probation, after a probe closed it: the first `probes`
 *              calls go, no more at once; if they fail at `failure_rate`,
 *              it opens again at once. A probe the provider refuses before
 *              executing tells that it answers, not that charges work (a
 *              front end that validates while execution fails): without a
 *              probation, a whole window of calls went into such an outage
 *              at every close.
 *
 * A rate, not a streak: with hundreds of calls in flight, "failures in a
 * row" cannot tell a provider that fails one call in five (degraded: every
 * retry with its key gets through) from one that is down, and a streak
 * opened the breaker again and again under 20% errors. The window is cut
 * into BREAKER_BUCKETS buckets that age out one by one (resilience4j's
 * time-based window); `min_calls` keeps a handful of calls from deciding.
 *
 * What counts as a failure: an answer that says the provider, not the
 * request, is in trouble: 5xx, or no answer at all (connection refused or
 * lost, a timeout). Every other answer, a decline, a 400 or a 409 included,
 * shows a provider that works. A 429 is neither: it says we are over our
 * rate budget (the sender slows down, provider_pace.h), not that the
 * provider is down, so it is left out of the rate (calls and failures
 * alike). Only when nothing but 429s came back for a whole `window_ms`
 * (at least `min_calls` of them, no other answer since the first) does it
 * open, as an outage would; a probe answered 429 while half-open is still
 * nothing but 429s, and opens it again; on probation a 429 decides
 * nothing. Each call takes a ticket when it
 * is allowed and hands it back with its answer (or unused); a call that was
 * allowed before the breaker last changed state still ends and is counted
 * in flight, but its answer changes nothing: it tells of the provider as it
 * was. */
#ifndef CHARGED_PROVIDER_BREAKER_H
#define CHARGED_PROVIDER_BREAKER_H

#include <stddef.h>
#include <stdint.h>

/* The numbers are the breaker-state metric's values. */
enum provider_breaker_state {
    PROVIDER_BREAKER_CLOSED = 0,
    PROVIDER_BREAKER_HALF_OPEN = 1,
    PROVIDER_BREAKER_OPEN = 2,
};

enum provider_breaker_answer {
    PROVIDER_BREAKER_SUCCESS = 0, /* the provider answered */
    PROVIDER_BREAKER_FAILURE,     /* 5xx, or no answer */
    PROVIDER_BREAKER_THROTTLED,   /* 429: over our budget, not a failure */
};

/* Buckets of the sliding window. */
#define BREAKER_BUCKETS 10

struct provider_breaker_config {
    int failure_rate;    /* percent of failures that opens it (1..100); 0: never */
    int min_calls;       /* calls in the window before the rate is judged (>= 1) */
    long long window_ms; /* the window the rate is taken over (>= BREAKER_BUCKETS) */
    long long open_ms;   /* how long it stays open before probing */
    int probes;          /* probe successes in a row that close it (>= 1) */
};

/* What a call was allowed under; the caller keeps it until the call ends. */
struct provider_breaker_ticket {
    uint64_t generation;
    int probe;
    int probation; /* one of the first calls after a close */
};

typedef struct provider_breaker provider_breaker_t;

/* NULL when out of memory. Copies cfg. */
provider_breaker_t *provider_breaker_new(const struct provider_breaker_config *cfg);
void provider_breaker_free(provider_breaker_t *b);

/* The state at now_ms: an open breaker whose cool-down has passed becomes
 * half-open here. */
enum provider_breaker_state provider_breaker_state(provider_breaker_t *b,
                                                   int64_t now_ms);

/* "closed", "half_open", "open". */
const char *provider_breaker_state_name(enum provider_breaker_state s);

/* May a call start now? 1 and *t filled (the caller must end it with
 * record() or cancel()), or 0: not closed, or on probation with its calls
 * all taken. */
int provider_breaker_allow(provider_breaker_t *b, int64_t now_ms,
                           struct provider_breaker_ticket *t);

/* May a probe start now? 1 and *t filled, or 0: not half-open, or a probe
 * is in flight. */
int provider_breaker_allow_probe(provider_breaker_t *b, int64_t now_ms,
                                 struct provider_breaker_ticket *t);

/* 1 while the calls after a close decide whether it stays closed. */
int provider_breaker_on_probation(const provider_breaker_t *b);

/* The call of ticket t ended with answer a. */
void provider_breaker_record(provider_breaker_t *b,
                             const struct provider_breaker_ticket *t,
                             enum provider_breaker_answer a, int64_t now_ms);

/* Ticket t was not used after all (the call could not be started), or its
 * call was abandoned: it counts neither way. */
void provider_breaker_cancel(provider_breaker_t *b,
                             const struct provider_breaker_ticket *t);

/* When allow() or allow_probe() may next say yes: now_ms when one would
 * now; the end of the cool-down while open; INT64_MAX while a probe, or
 * every call of the probation, is in flight (their answers decide). */
int64_t provider_breaker_next_allow_ms(provider_breaker_t *b, int64_t now_ms);

/* Calls allowed and not yet recorded or cancelled. */
size_t provider_breaker_in_flight(const provider_breaker_t *b);

/* The window while closed, as of now_ms: calls ended and failures among
 * them (429s are neither). */
void provider_breaker_window(provider_breaker_t *b, int64_t now_ms, int *calls,
                             int *failures);

/* Probe successes in a row while half-open; 0 otherwise. */
int provider_breaker_streak(const provider_breaker_t *b);

/* How many times it opened (the first time or again after a probe). */
uint64_t provider_breaker_opens(const provider_breaker_t *b);

/* How the answer to a call counts, from its HTTP status (0: none). */
enum provider_breaker_answer provider_breaker_classify(int http_status);

#endif
