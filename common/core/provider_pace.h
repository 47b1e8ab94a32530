/* provider_pace: how fast one process starts provider calls, cut to what
 * the provider served when its 429s show an overrun of the account's
 * rate, and raised again by its other answers.
 *
 * Pure: no clock, no I/O; the caller passes the time (monotonic ms). It
 * starts unpaced (limit 0: calls start as fast as they come).
 *
 * Answers are judged in windows: a window opens at its first answer and
 * is judged once it is PACE_WINDOW_MS old with PACE_WINDOW_ANSWERS
 * answers, or PACE_WINDOW_MAX_MS old with any. Every 429 counts, a
 * retry's too (a backlog's retries are most of an overrun), except those
 * about an object that got nothing but 429s in the window while others
 * were served (the PACE_OBJECTS_APART with most; more such objects are the
 * account's overrun, a backlog's retries each about its own card): a 429 about one
 * object (Stripe's 1,000 updates per PaymentIntent an hour, a lock held by another
 * request; psp-sim's rule for one payment method) says nothing of the account's rate,
 * and slowing every other call would not lift it. A window is an overrun when its
 * counted 429s are at least PACE_CUT_429S and a PACE_CUT_SHARE-th of its counted
 * answers: the limit becomes the rate the provider served in it (never above the limit
 * it had; at least PACE_MIN_PER_S). The provider's bucket lets through exactly its
 * rate, so that is the rate to send at; three workers overrunning one account each get
 * their share of it. Every other answer adds 1/limit or PACE_STEP_SHARE of a call/s,
 * the larger: at a steady rate about one call/s more every second at low rates and 5%
 * at high ones, until a window says it is too high. Calls are let through a token
 * bucket of a tenth of a second's calls.
 *
 * A raise of the fleet's budget (issue 38) restarts it: unpaced, so that
 * a pace cut under the old limits does not bind for seconds under the new
 * ones. For PACE_RESTART_GRACE_MS nothing is judged (those answers are
 * the old limits', or a provider raising its own a moment later); then
 * PACE_CONFIRM_WINDOWS windows confirm the raise or refute it: an overrun
 * among them cuts as above, and no raise restarts the pace for a quiet
 * time that starts at PACE_QUIET_MS and doubles with each refutation in a
 * row, up to PACE_QUIET_MAX_MS: an operator stepping the budget over a
 * provider that never follows costs one restart's overrun per quiet time,
 * fewer and fewer (adversary 38f, 38g). A confirmed raise sets the quiet
 * back to PACE_QUIET_MS. */
#ifndef CHARGED_PROVIDER_PACE_H
#define CHARGED_PROVIDER_PACE_H

#include <stdint.h>

#define PACE_MIN_PER_S      1.0  /* the floor: a throttled sender still sends */
#define PACE_STEP_SHARE     0.05 /* least added per answer that was not a 429 */
#define PACE_MAX_PER_S      1e6  /* beyond: as good as unpaced */
#define PACE_WINDOW_MS      1000
#define PACE_WINDOW_ANSWERS 10
#define PACE_WINDOW_MAX_MS  5000
#define PACE_CUT_429S       2 /* one stray 429 (another client's, a fault) is no overrun */
#define PACE_CUT_SHARE      20 /* a twentieth of the answers: psp-sim's 3% fault is not */
/* Objects a window tells apart (by hash); a 429 about one it cannot hold
 * counts as the account's. */
#define PACE_OBJECTS          64
#define PACE_OBJECT_PROBES    8
#define PACE_OBJECTS_APART    8 /* at most this many set apart in a window */
#define PACE_RESTART_GRACE_MS 2000
#define PACE_CONFIRM_WINDOWS  3
#define PACE_QUIET_MS         30000
#define PACE_QUIET_MAX_MS     300000

struct pace_object {
    uint64_t id; /* 0: a free slot */
    int served, throttled;
};

struct provider_pace {
    double limit;           /* calls/s; 0: unpaced */
    double tokens;          /* calls that may start now */
    int64_t refilled;       /* tokens as of */
    int64_t since;          /* the window's first answer */
    int answers, throttled; /* in the window: every answer, every 429 */
    struct pace_object objects[PACE_OBJECTS];
    int64_t grace_until; /* a restart's grace: nothing judged before */
    int judging;         /* a restart's windows still to judge (0: none) */
    int64_t quiet_ms;    /* the quiet the next refutation imposes */
    int64_t quiet_until; /* no restart before (INT64_MIN: none) */
};

void provider_pace_init(struct provider_pace *p, int64_t now_ms);
/* May a call start now? 1 (and it is counted), or 0: wait until
 * provider_pace_next_ms. */
int provider_pace_take(struct provider_pace *p, int64_t now_ms);
/* When a call may next start (now_ms when one may now). */
int64_t provider_pace_next_ms(const struct provider_pace *p, int64_t now_ms);
/* An answer came back, throttled (a 429) or not, about `object`
 * (provider_pace_object of the payment method or the payment intent the
 * call was about; 0: none known, judged as the account's). */
void provider_pace_answer(struct provider_pace *p, int throttled, uint64_t object,
                          int64_t now_ms);
/* The budget's limits were raised: unpaced, under a grace, unless a
 * refutation's quiet holds (0: the pace stays). A restart within another's
 * grace or judging keeps that one's. 1: restarted. */
int provider_pace_restart(struct provider_pace *p, int64_t now_ms);
/* The limit in calls/s (0: unpaced), for the metric and the log. */
double provider_pace_limit(const struct provider_pace *p);
/* An object's name as provider_pace_answer takes it (never 0; NULL or ""
 * is 0: none). */
uint64_t provider_pace_object(const char *name);

#endif
