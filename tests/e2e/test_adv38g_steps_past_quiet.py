#!/usr/bin/env python3
"""Adversary 38g, break: the steps of 38f, kept up for longer than the fix's
quiet time. After a refutation a raise restarts nothing for
PACE_RESTART_CONFIRM_MS (10 s); the next raise after that restarts the pace
again, with a new 2 s grace in which the worker is unpaced and no 429 cuts
it, and so on every ~12 s for as long as the steps go on. Each grace sends
at the budget's rate (100-150/s) against a provider at 5/s: the fleet
overruns the provider for about a sixth of the time, for good.

test_adv38f_stepped_raises_unpace judges 6 s from 3.5 s after the steps
began, inside the 10 s quiet: this one judges 24 s (two more raises past
the quiet). Same setup: psp-sim 5 req/s (100 ms), budget global 100,
stepped 100/150 every 0.5 s; psp-sim's 429s in the stepped window against
the same length before it."""
import datetime
import os
import time

import charged_e2e as e2e
from charged_e2e import check

WINDOW_S = int(os.environ.get("ADV_WINDOW_S", "24"))
QUIET_S = 6
LAT = os.environ.get("ADV_LAT", "100")
STEP_S = float(os.environ.get("ADV_STEP_S", "0.5"))
LEAD_S = 3.5  # the first raise's grace and its window of answers


def scenario(new):
    s = new("adv38g_steps", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", LAT])
    s.set_limits("--global", "100", actor="adv38g")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(600)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 5, e2e.scaled(30), 0.1)
    time.sleep(2)  # the pace settles near the provider's 5 req/s
    a0 = int(time.time()) + 1
    time.sleep(a0 + QUIET_S - time.time())
    # The steps start LEAD_S before the window judged: the first raise's
    # grace (2 s unpaced, then its window of answers) is the design's cost
    # of following a raise; what must not happen is that the next raises
    # hold it open.
    steps_from = time.time()
    b0 = int(steps_from + LEAD_S) + 1
    n = 0
    while time.time() < b0 + WINDOW_S:
        n += 1
        # the worker's own limit: raised, lowered, raised, ...
        s.set_limits("--global", "%d" % (150 if n % 2 else 100), actor="adv38g")
        time.sleep(STEP_S)
    time.sleep(1.2)
    series = s.psp_get("/rate-limits")["per_second"]
    sa, ta = s.psp_window(a0, a0 + QUIET_S)
    sb, tb = s.psp_window(b0, b0 + WINDOW_S)
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - a0, q["served"], q["throttled"]) for q in series if q["at"] >= a0])
    e2e.log("quiet window: %d served %d throttled; global stepped: %d served %d throttled"
            % (sa, ta, sb, tb))
    check(sa >= 10, "the worker sent almost nothing in the quiet window: no traffic to judge")
    restarts = [epoch(l["ts"]) for l in s.worker_log(
        w, "provider budget settings changed; the pace starts afresh")]
    later = [t for t in restarts if steps_from + LEAD_S < t < b0 + WINDOW_S]
    around = []
    for t in later:
        _, before = s.psp_window(int(t) - 2, int(t))
        _, during = s.psp_window(int(t), int(t) + 3)
        around.append((round(t - steps_from, 1), before, during))
    e2e.log("the pace restarted at (s after the steps began):",
            [round(t - steps_from, 1) for t in restarts])
    e2e.log("later restarts (s after the steps began, 429s in the 2 s before, in the 3 s"
            " from it):", around)
    check(not later,
          "the global limit stepped 100/150 every %.1f s for %.1f s (each raise far above "
          "the provider's 5/s, which never followed): the pace restarted %d more times "
          "after the first raise was refuted %s (s after the steps began, psp-sim's 429s "
          "in the 2 s before, in the 3 s from it): each 10 s after a refutation the next "
          "raise restarts it, 2 s unpaced at the budget's rate; psp-sim answered %d "
          "creates 429 (%d served) in the stepped %d s against %d (%d served) in the %d s "
          "before" % (STEP_S, WINDOW_S + LEAD_S, len(later), around, tb, sb, WINDOW_S,
                      ta, sa, QUIET_S))


def epoch(ts):
    """A log line's RFC 3339 ts as epoch seconds."""
    return datetime.datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
