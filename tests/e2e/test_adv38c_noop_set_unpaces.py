#!/usr/bin/env python3
"""Adversary 38c, break: a `chargectl provider limits set` that changes
nothing restarts every worker's 429 pace, so a fleet that the provider
throttles hammers it again at each such set.

The fix of adversary 38b's raise (provider_pace_restart on a change of the
budget's settings version) restarts the pace on ANY version change, and the
version is bumped by every `limits set`, even one writing the same numbers
(an operator's script re-applying its config, the console's form saved as
is). The provider's real limit (psp-sim 5 req/s, 100 ms latency) is
under the budget (100): the pace is what keeps the worker near it. Repeating the same set every 0.5 s, the worker goes back
to the budget's rate until the next 429s cut it: psp-sim's 429s multiply.
Counted from psp-sim's per-second series."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

WINDOW_S = int(os.environ.get("ADV_WINDOW_S", "6"))
LAT = os.environ.get("ADV_LAT", "100")


def throttled_in(series, t0, t1):
    return sum(q["throttled"] for q in series if t0 <= q["at"] < t1), \
        sum(q["served"] for q in series if t0 <= q["at"] < t1)


def scenario(new):
    s = new("adv38c_noop", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", LAT])
    s.set_limits("--global", "100", actor="adv38c")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(400)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 5, e2e.scaled(30), 0.1)
    time.sleep(2)  # the pace settles near the provider's 5 req/s
    a0 = int(time.time()) + 1
    time.sleep(a0 + WINDOW_S - time.time())
    b0 = int(time.time()) + 1
    time.sleep(b0 - time.time())
    while time.time() < b0 + WINDOW_S:
        s.set_limits("--global", "100", actor="adv38c")  # the same numbers: nothing changes
        time.sleep(0.5)
    time.sleep(1.2)
    series = s.psp_get("/rate-limits")["per_second"]
    ta, sa = throttled_in(series, a0, a0 + WINDOW_S)
    tb, sb = throttled_in(series, b0, b0 + WINDOW_S)
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - a0, q["served"], q["throttled"]) for q in series if q["at"] >= a0])
    e2e.log("quiet window: %d served %d throttled; no-op sets: %d served %d throttled"
            % (sa, ta, sb, tb))
    check(sa >= 10, "the worker sent almost nothing in the quiet window: no traffic to judge")
    check(tb <= 2 * ta + 3,
          "`limits set` with the same numbers every 0.5 s for %d s: psp-sim answered %d "
          "requests 429 (%d served), against %d (%d served) in the %d s before without "
          "sets: a set that changes nothing restarts the 429 pace and the worker hammers "
          "the provider that throttles it" % (WINDOW_S, tb, sb, ta, sa, WINDOW_S))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
