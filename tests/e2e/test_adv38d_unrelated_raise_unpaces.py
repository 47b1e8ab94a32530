#!/usr/bin/env python3
"""Adversary 38d, break: raising the limit of a class the worker never sends
(`--class list=...`, the auditor's) restarts the worker's 429 pace for its
creates, and the 2 s grace after the restart (PACE_RESTART_GRACE_MS) lets no
429 cut it: an operator toggling an unrelated class's limit (lower, raise,
lower, ...) keeps the worker at the budget's rate against a provider that
throttles its creates.

Fix under attack (27aa098): only a raise (budget_settings_raised) restarts
the pace, but a raise of ANY class counts, and each one buys 2 s without a
cut. The provider's real limit (psp-sim 5 req/s, 100 ms latency) is under
the budget (global 100): the pace is what keeps the worker near it.
Counted from psp-sim's per-second series: the window with list toggled
between 10 and 20 every 0.5 s against the same length before it."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

WINDOW_S = int(os.environ.get("ADV_WINDOW_S", "6"))
LAT = os.environ.get("ADV_LAT", "100")
STEP_S = float(os.environ.get("ADV_STEP_S", "0.5"))


def scenario(new):
    s = new("adv38d_unrel", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", LAT])
    s.set_limits("--global", "100", "--class", "list=10", actor="adv38d")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(600)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 5, e2e.scaled(30), 0.1)
    time.sleep(2)  # the pace settles near the provider's 5 req/s
    a0 = int(time.time()) + 1
    time.sleep(a0 + WINDOW_S - time.time())
    b0 = int(time.time()) + 1
    time.sleep(b0 - time.time())
    n = 0
    while time.time() < b0 + WINDOW_S:
        n += 1
        # the auditor's class, never a create: lowered, raised, lowered, ...
        s.set_limits("--class", "list=%d" % (20 if n % 2 else 10), actor="adv38d")
        time.sleep(STEP_S)
    time.sleep(1.2)
    series = s.psp_get("/rate-limits")["per_second"]
    sa, ta = s.psp_window(a0, a0 + WINDOW_S)
    sb, tb = s.psp_window(b0, b0 + WINDOW_S)
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - a0, q["served"], q["throttled"]) for q in series if q["at"] >= a0])
    e2e.log("quiet window: %d served %d throttled; list toggled: %d served %d throttled"
            % (sa, ta, sb, tb))
    check(sa >= 10, "the worker sent almost nothing in the quiet window: no traffic to judge")
    check(tb <= 2 * ta + 3,
          "the list class's limit (the auditor's; the worker sends only creates) toggled "
          "10/20 every %.1f s for %d s: psp-sim answered %d creates 429 (%d served), against "
          "%d (%d served) in the %d s before: a raise of an unrelated class restarts the "
          "worker's create pace with 2 s in which no 429 cuts it, and the worker hammers the "
          "provider that throttles it" % (STEP_S, WINDOW_S, tb, sb, ta, sa, WINDOW_S))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
