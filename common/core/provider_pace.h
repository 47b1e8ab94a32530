/* provider_pace: how fast one process starts provider calls, cut when the
 * provider's 429s show that it overruns the account's rate, raised again
 * while the pace holds calls back and the provider answers them.
 *
 * Pure: no clock, no I/O; the caller passes the time (monotonic ms). It
 * starts unpaced (limit 0: calls start as fast as they come).
 *
 * Answers are judged in windows: a window opens at its first answer and
 * is judged once it is PACE_WINDOW_MS old with PACE_WINDOW_ANSWERS answers
 * or with a call held back by the pace in it, or PACE_WINDOW_MAX_MS old
 * with any. An answer to a call sent before the last cut or restart is the
 * old rate's and judges nothing.
 *
 * An overrun is a window in which the process was pushing (more calls
 * waited to start, at some moment, than the provider served in the
 * window: a sender at its demand is not slowed by stray 429s, another
 * client's or a fault's) and at least PACE_CUT_429S of its counted 429s
 * were a PACE_CUT_SHARE-th of its counted answers. Every 429 counts, a
 * retry's too, except those about objects (the payment method, the
 * payment intent) the provider throttles by themselves: each with half of
 * its answers 429s or more while every other object's were served with
 * under a tenth, and they few (PACE_OBJECTS_FEW) or the lesser part of the
 * window, or known so from the last PACE_KNOWN_MS (Stripe's 1,000
 * updates per PaymentIntent an hour, a lock; psp-sim's rule for a payment
 * method): an account's overrun answers 429 whatever the object. An
 * overrun cuts the limit to the rate the provider served in it (from its
 * first answer to its last; floor PACE_MIN_PER_S): its bucket lets its
 * rate through.
 *
 * Raises: each judged window in which the pace held a call back and that
 * was no overrun raises the limit by PACE_STEP_PER_S, doubled for each
 * such window in a row since the last cut (1, 2, 4 ... calls/s): from a
 * few calls a second to hundreds in seconds. It keeps a fleet that
 * overruns one account at the account's rate, with few 429s; it does not
 * share the account evenly among the fleet (the first to ask after each
 * token gets it): that is the fleet budget's work (budget_alloc.h).
 *
 * A raise of the fleet's budget (issue 38) restarts it: unpaced, so that
 * a pace cut under the old limits does not bind under the new ones. For
 * PACE_RESTART_GRACE_MS nothing is judged (a provider raising its own a
 * moment later); the next PACE_CONFIRM_WINDOWS windows confirm the raise
 * or refute it: an overrun among them cuts as above, and no raise restarts
 * the pace for a quiet time that starts at PACE_QUIET_MS and doubles with
 * each refutation in a row, up to PACE_QUIET_MAX_MS: an operator stepping
 * the budget over a provider that never follows costs one restart's
 * overrun per quiet time, fewer and fewer. A confirmed raise sets the
 * quiet back to PACE_QUIET_MS. */
#ifndef CHARGED_PROVIDER_PACE_H
#define CHARGED_PROVIDER_PACE_H

#include <stddef.h>
#include <stdint.h>

#define PACE_MIN_PER_S      1.0 /* the floor: a throttled sender still sends */
#define PACE_MAX_PER_S      1e6 /* beyond: unpaced */
#define PACE_STEP_PER_S     1.0 /* the first raise; doubled for each in a row */
#define PACE_STEP_DOUBLINGS 20
#define PACE_WINDOW_MS      1000
#define PACE_WINDOW_ANSWERS 10
#define PACE_WINDOW_MAX_MS  5000
#define PACE_CUT_429S       2 /* one stray 429 is no overrun */
/* A tenth of the answers: psp-sim's faults of 3-5% are not an overrun. */
#define PACE_CUT_SHARE 10
/* Objects a window tells apart (by hash); a 429 about one it cannot hold
 * counts as the account's. */
#define PACE_OBJECTS       64
#define PACE_OBJECT_PROBES 8
#define PACE_OBJECTS_FEW   8
/* Objects found throttled by themselves are remembered this long (and at
 * most PACE_KNOWN of them): their retries come back before new calls, so a
 * window may hold little else, and nothing else served. */
#define PACE_KNOWN            32
#define PACE_KNOWN_MS         10000
#define PACE_RESTART_GRACE_MS 2000
#define PACE_CONFIRM_WINDOWS  3
#define PACE_QUIET_MS         30000
#define PACE_QUIET_MAX_MS     300000

struct pace_object {
    uint64_t id; /* 0: a free slot */
    int served, throttled;
};

struct pace_known {
    uint64_t id;
    int64_t until;
};

/* One answer of the provider. */
struct pace_answer {
    int throttled; /* a 429 */
    uint64_t
        object; /* provider_pace_object of what the call was about; 0: none known */
    int64_t sent_ms; /* when its call was started (the caller's clock) */
};

struct provider_pace {
    double limit;     /* calls/s; 0: unpaced */
    double tokens;    /* calls that may start now */
    int64_t refilled; /* tokens as of */
    /* the window */
    int64_t since, last_at; /* its first answer, its last */
    int answers, throttled; /* every answer, every 429 */
    int held;               /* the pace held a call back in it */
    size_t waiting;         /* the most calls waiting to start in it */
    struct pace_object objects[PACE_OBJECTS];
    struct pace_known known[PACE_KNOWN]; /* objects throttled by themselves */
    int64_t changed_at;                  /* the last cut or restart (INT64_MIN: none) */
    int steps;                           /* raises in a row since */
    int64_t grace_until;                 /* a restart's grace: nothing judged before */
    int judging;         /* a restart's windows still to judge (0: none) */
    int64_t quiet_ms;    /* the quiet the next refutation imposes */
    int64_t quiet_until; /* no restart before (INT64_MIN: none) */
};

void provider_pace_init(struct provider_pace *p, int64_t now_ms);
/* May a call start now? 1 (and it is counted), or 0: wait until
 * provider_pace_next_ms (and the pace knows it holds calls back). */
int provider_pace_take(struct provider_pace *p, int64_t now_ms);
/* A call waited for the pace (the caller asked provider_pace_next_ms and
 * did not take): the pace binds, and a window without an overrun raises it. */
void provider_pace_held(struct provider_pace *p);
/* When a call may next start (now_ms when one may now). */
int64_t provider_pace_next_ms(const struct provider_pace *p, int64_t now_ms);
/* An answer came back; `waiting`: the calls that wait to start now (held
 * back, parked after a 429, over the process's capacity). */
void provider_pace_answer(struct provider_pace *p, const struct pace_answer *a,
                          size_t waiting, int64_t now_ms);
/* The budget's limits were raised: unpaced, under a grace, unless a
 * refutation's quiet holds or another restart is being judged (0: the
 * pace stays as it is). 1: restarted. */
int provider_pace_restart(struct provider_pace *p, int64_t now_ms);
/* The limit in calls/s (0: unpaced), for the metric and the log. */
double provider_pace_limit(const struct provider_pace *p);
/* An object's name as struct pace_answer takes it (never 0; NULL or "" is
 * 0: none). */
uint64_t provider_pace_object(const char *name);

#endif
