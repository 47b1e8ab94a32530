#!/usr/bin/env python3
"""Adversary 38b, break: after the provider throttled, a raised limit is not
followed within 2 s (issue 38: "The fleet follows within 2 s").

The provider lowers its limit first (psp-sim 20 -> 2 req/s: 429s), the
operator follows with the budget (2), then both are raised to 100. The
budget's shares follow in a refresh; the worker does not: each 429 halved
its own pace (provider_pace, AIMD, floor 1/s), which then grows by about
1 req/s per second below 20 and 5% a second above. With hundreds of charges queued
and 100 req/s allowed, the worker sends ~5/s for seconds after the raise.

One worker (one member: no rounding of shares), Retry-After off."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 900  # demand past +5 s at 100 req/s once the raise is followed


def scenario(new):
    s = new("adv38b_raise", partitions=4, psp_args=["--rate-limit", "20"])
    s.set_limits("--global", "20", actor="adv38b")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 20, e2e.scaled(30), 0.1)
    s.psp_put("/rate-limits", {"global": 2})  # the provider lowers its limit
    time.sleep(2)
    s.set_limits("--global", "2", actor="adv38b")  # the operator follows
    time.sleep(2)
    s.psp_put("/rate-limits", {"global": 100})
    s.set_limits("--global", "100", actor="adv38b")
    raised = time.time()
    time.sleep(6)
    series = s.psp_get("/rate-limits")["per_second"]
    throttled = sum(q["throttled"] for q in series)
    left = int(s.query("SELECT count(*) FROM payment_attempts WHERE status IN "
                       "('PENDING', 'PROCESSING')")[0][0]) + N - len(s.attempts())
    after = {q["at"]: q["served"] for q in series if q["at"] >= int(raised)}
    secs = range(int(raised) + 2, int(raised) + 5)  # whole seconds from +2 s
    sent = [after.get(t, 0) for t in secs]
    e2e.log("psp-sim per second since the raise:", sorted(after.items()),
            "throttled in all:", throttled, "charges left:", left)
    check(throttled > 0, "psp-sim throttled nothing: the scenario did not happen")
    check(left > 0, "the charges ran out: no demand to judge the raise by")
    check(min(sent) >= 40,
          "2-5 s after the limit was raised from 2 to 100 req/s (budget and provider), with "
          "%d charges queued, the worker sent %s per second: its own 429 pace (halved at "
          "the provider's lowering, +1/s a second) does not follow a raise" % (left, sent))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
