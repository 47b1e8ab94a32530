/* daemon_policy: the arithmetic of a role's loop (worker/roles/daemon),
 * apart so that it is decided in one place and tested without a process:
 * how long the loop may sleep before its step is due, how long a role
 * backs off after a failed database step, and how the shutdown's time is
 * shared between the drain and finish(). Times are clock_now_ms() values. */
#ifndef CHARGED_DAEMON_POLICY_H
#define CHARGED_DAEMON_POLICY_H

#include <stdint.h>

/* The earlier of two times a step is due. */
int64_t daemon_policy_earliest(int64_t a, int64_t b);

/* How long the loop sleeps at `now` when its step is next due at `due`: 0
 * when it is due already (any time not after now), else the time left, at
 * most INT_MAX ms (what poll() takes; the loop then sleeps again). */
int daemon_policy_wait_ms(int64_t now, int64_t due);

/* The back-off after a failed database step, given the one before (0 after
 * a success): 250 ms, doubling while the failures last, at most 5 s. */
int64_t daemon_policy_backoff_ms(int64_t last_ms);

/* When the drain must end after a stop signal at `stopping_at`: the
 * shutdown's time less a quarter of it, at most 2 s, kept for finish(). */
int64_t daemon_policy_drain_deadline(int64_t stopping_at, long long shutdown_ms);

/* How long finish() may wait for acknowledgements at `now`: what is left of
 * the shutdown's time, at most 1 s, and 0 once it is spent. */
int daemon_policy_flush_ms(int64_t stopping_at, long long shutdown_ms, int64_t now);

#endif
