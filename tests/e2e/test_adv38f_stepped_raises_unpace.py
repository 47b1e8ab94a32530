#!/usr/bin/env python3
"""Adversary 38f, break: a budget whose global limit is raised every second
or so (an operator or a script stepping it, lower, raise, lower, ...; each
raise well above the provider's real limit) keeps the worker unpaced for as
long as the steps go on: every raise restarts the 429 pace
(provider_pace_restart) with a new 2 s grace in which no 429 cuts it and no
window judges the restart, and the next raise comes before the grace ends.
The worker then sends at the budget's rate against a provider that answers
it 429: the refutation (38d/38e's fix) never gets its window.

The fix under attack (9db8c08, 275b8c3): a raise counts only for the global
limit or a class the member asks, and a restart is refuted by a window of
answers past its grace. The provider's real limit (psp-sim 5 req/s, 100 ms
latency) is under the budget (global 100..150): the pace is what keeps the
worker near it. Counted from psp-sim's per-second series: the window with
the global limit stepped 100/150 every 0.5 s (a raise every second) against
the same length before it, from 3.5 s after the steps began (the first
raise's own grace is the design's cost of following a raise)."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

WINDOW_S = int(os.environ.get("ADV_WINDOW_S", "6"))
LAT = os.environ.get("ADV_LAT", "100")
STEP_S = float(os.environ.get("ADV_STEP_S", "0.5"))
LEAD_S = 3.5  # the first raise's grace and its window of answers


def scenario(new):
    s = new("adv38f_steps", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", LAT])
    s.set_limits("--global", "100", actor="adv38f")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(600)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 5, e2e.scaled(30), 0.1)
    time.sleep(2)  # the pace settles near the provider's 5 req/s
    a0 = int(time.time()) + 1
    time.sleep(a0 + WINDOW_S - time.time())
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
        s.set_limits("--global", "%d" % (150 if n % 2 else 100), actor="adv38f")
        time.sleep(STEP_S)
    time.sleep(1.2)
    series = s.psp_get("/rate-limits")["per_second"]
    sa, ta = s.psp_window(a0, a0 + WINDOW_S)
    sb, tb = s.psp_window(b0, b0 + WINDOW_S)
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - a0, q["served"], q["throttled"]) for q in series if q["at"] >= a0])
    e2e.log("quiet window: %d served %d throttled; global stepped: %d served %d throttled"
            % (sa, ta, sb, tb))
    check(sa >= 10, "the worker sent almost nothing in the quiet window: no traffic to judge")
    check(tb <= 2 * ta + 3,
          "the global limit stepped 100/150 every %.1f s for %d s (a raise every second, "
          "each far above the provider's 5/s): psp-sim answered %d creates 429 (%d served), "
          "against %d (%d served) in the %d s before: each raise restarts the worker's pace "
          "with a new 2 s grace, so no 429 cuts it and no window refutes the raise while "
          "the steps go on" % (STEP_S, WINDOW_S, tb, sb, ta, sa, WINDOW_S))

if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
