/* provider_pace: how fast one process starts provider calls, lowered by
 * the provider's 429s and raised again by its other answers (AIMD, as
 * TCP's congestion window).
 *
 * Pure: no clock, no I/O; the caller passes the time (monotonic ms). It
 * starts unpaced (limit 0: calls start as fast as they come). The first
 * 429 sets the limit to half the calls started in the last second (at
 * least PACE_MIN_PER_S; none when they were fewer than PACE_MIN_SAMPLE);
 * each later 429 halves it, at most once a second (a burst of 429s
 * answers one overrun); every other answer adds 1/limit
 * or PACE_STEP_SHARE of a call/s, the larger: at a steady rate the limit
 * climbs by about one call/s every second at low rates (the classic
 * additive step, one per round) and by 5% a second at high ones, until a
 * 429 says it is too high. Calls are let through a token bucket of a
 * tenth of a second's calls (at least one).
 *
 * It paces this process alone; the fleet-wide budget (issue 38) sits on
 * top of it, and a change of the budget's settings starts it afresh
 * (provider_pace_restart). */
#ifndef CHARGED_PROVIDER_PACE_H
#define CHARGED_PROVIDER_PACE_H

#include <stdint.h>

#define PACE_MIN_PER_S  1.0  /* the floor: a throttled sender still sends */
#define PACE_STEP_SHARE 0.05 /* least added per answer that was not a 429 */
#define PACE_CUT_MS     1000 /* one halving per this long */
#define PACE_MAX_PER_S  1e6  /* beyond: as good as unpaced */
/* After a restart, 429s cut nothing for this long: they answer calls sent
 * under the old limits, or a provider that changes its limit a moment
 * after the budget did; the fleet's budget still bounds the sending. */
#define PACE_RESTART_GRACE_MS 2000
/* A restart no 429 refuted for this long past its grace was the
 * provider's too: the pace before it is forgotten. And for this long
 * after a refutation a raise restarts nothing: the provider did not follow
 * the last one (adversary 38f: a raise every second, each restart a grace
 * of its own, kept the worker unpaced while the steps went on). */
#define PACE_RESTART_CONFIRM_MS 10000
/* 429s refute a restart when a window of PACE_JUDGE_ANSWERS answers past
 * its grace holds at least PACE_REFUTE_429S of them and more than
 * 1/PACE_REFUTE_SHARE of the window: the provider did not raise. One or
 * two stray 429s (another client's, a fault) do not; they cut as any
 * first 429 does. A window is judged whole, never at its first 429s
 * (adversary 38e: two 429s first in a second, 2 of 2, refuted a raise the
 * provider had made too); one that has not filled PACE_JUDGE_MS after its
 * first answer is dropped unjudged: so few answers are no flood to stop. */
#define PACE_REFUTE_429S   2
#define PACE_REFUTE_SHARE  5
#define PACE_JUDGE_ANSWERS 10
#define PACE_JUDGE_MS      1000
/* An unpaced sender's first 429 cuts only when it started this many calls
 * or more in the last second: fewer say nothing of a rate to halve, and
 * the pace they would set (1-2/s, at a burst's start) climbs back about
 * +1/s a second (adversary 38e: one stray 429 as a backlog began). */
#define PACE_MIN_SAMPLE 5
/* A first 429 cuts only when this second and the last brought
 * PACE_CUT_ANSWERS answers or more (fewer tell nothing: at a backlog's
 * start the first two answers were two strays, and one 429 of a
 * throttled card among the first 20 is a twentieth) and first 429s are at
 * least 1/PACE_CUT_SHARE of them: a 429 about one object (Stripe's
 * 1,000 updates per PaymentIntent an hour; another request holding it)
 * is no overrun of the account's rate. One command in 51 for a throttled
 * card halved the pace every second, from ~3,000 req/s to 42-56
 * (adversary 38f). A real overrun answers 429 to the share it overruns
 * by, and its retries raise that share until it cuts. */
#define PACE_CUT_SHARE   20
#define PACE_CUT_ANSWERS (2 * PACE_CUT_SHARE)

struct provider_pace {
    double limit;             /* calls/s; 0: unpaced */
    double tokens;            /* calls that may start now */
    int64_t refilled;         /* tokens as of */
    int64_t cut_at;           /* the last halving (INT64_MIN: none) */
    int64_t grace_until;      /* a restart's grace: no cut before (INT64_MIN: none) */
    double before_restart;    /* the limit before a restart no 429 has refuted yet
                                 (-1: none) */
    int64_t refuted_at;       /* the last refutation (INT64_MIN: none) */
    int64_t judged_since;     /* past a restart's grace: the window's first answer */
    int judged, judged_429;   /* answers in it (0: none open), and 429s of them */
    int64_t second;           /* start of the current second of counted starts */
    int started, last_second; /* starts in it, and in the one before */
    int answered[2], throttled[2]; /* answers and first 429s in it [0] and
                                      the one before [1] */
};

void provider_pace_init(struct provider_pace *p, int64_t now_ms);
/* May a call start now? 1 (and it is counted), or 0: wait until
 * provider_pace_next_ms. */
int provider_pace_take(struct provider_pace *p, int64_t now_ms);
/* When a call may next start (now_ms when one may now). */
int64_t provider_pace_next_ms(const struct provider_pace *p, int64_t now_ms);
/* An answer came back: throttled (a 429) lowers the limit, any other
 * raises it. first: the message's first 429 (a repeat of one message's
 * overrun cuts nothing), but that 429s past a restart's grace, any
 * message's, refute the restart once a window of answers fills with
 * PACE_REFUTE_429S of them, over a PACE_REFUTE_SHARE-th of its answers: the
 * limit goes back to what it was before it (the provider did not raise
 * with the budget). */
void provider_pace_answer(struct provider_pace *p, int throttled, int first,
                          int64_t now_ms);
/* Starts afresh (unpaced, as at init): the limits the pace answered to
 * were raised (issue 38: the fleet's budget settings), and a pace cut
 * under the old ones would bind for seconds under the new (from 1/s,
 * about +1/s a second). For PACE_RESTART_GRACE_MS a 429 cuts nothing (it
 * answers the old limits, or a provider raising its own a moment later);
 * 429s after it (PACE_REFUTE_*) put back the limit from before the
 * restart, and AIMD goes on from there. A restart while another is not
 * yet refuted or confirmed keeps that one's grace and window; within
 * PACE_RESTART_CONFIRM_MS of a refutation it does nothing. 1: restarted,
 * 0: not (the pace stays). */
int provider_pace_restart(struct provider_pace *p, int64_t now_ms);
/* The limit in calls/s (0: unpaced), for the metric and the log. */
double provider_pace_limit(const struct provider_pace *p);

#endif
