#!/usr/bin/env python3
"""Adversary 38b, break: at a limit of 1 req/s, psp-sim's limiter set to the
same number answers 429 to about a quarter of the fleet's requests (issue
38: a limiter set to the budget's numbers answers almost no 429, <= 0.1%).

One worker (one member), budget and psp-sim both 1 req/s (psp-sim's burst:
the rate, 1). The gate's bucket holds one token (BUDGET_GATE_BURST_MS 0)
and refills at exactly the limit, so it spaces sends exactly 1000 ms apart
at the sender; they arrive with a few ms of jitter, and any two that
arrive less than 1000 ms apart find psp-sim's one-token bucket short by a
few ms: 429. Counted from psp-sim's per-second series."""
import time

import charged_e2e as e2e
from charged_e2e import check

RUN_S = 11


def scenario(new):
    s = new("adv38b_one_rps", partitions=4, psp_args=["--rate-limit", "1"])
    s.set_limits("--global", "1", actor="adv38b")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(40)])
    time.sleep(RUN_S)
    series = s.psp_get("/rate-limits")["per_second"]
    served = sum(q["served"] for q in series)
    throttled = sum(q["throttled"] for q in series)
    e2e.log("psp-sim per second (served, throttled):",
            [(q["served"], q["throttled"]) for q in series])
    check(served >= 5, "the worker sent almost nothing (%d): no traffic to judge" % served)
    check(throttled == 0,
          "psp-sim at the budget's own 1 req/s answered %d of %d requests 429: the gate "
          "spaces sends exactly 1 s apart and arrival jitter does the rest"
          % (throttled, served + throttled))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
