#!/usr/bin/env python3
"""Adversary 38c, break: a raise is still not followed within 2 s when the
provider's own raise lands a moment after the budget's (issue 38: "The
fleet follows within 2 s").

The fix of adversary 38b (provider_pace_restart on a new settings version)
starts the worker's 429 pace afresh, but keeps the starts counted under the
old limits, "so that the next 429 halves what was sent since". The operator
raises the budget from 2 to 100 req/s and the provider's limit follows
600 ms later (two systems: they never change in the same instant). In those
600 ms the unpaced worker meets the provider's old limit: one 429, and the
pace is cut to half of the last second's ~2 req/s, 1 req/s, then grows by
about 1 req/s a second: 1-5 req/s for seconds against 100 allowed by both.
Without the skew (provider first: test_adv38b_raise_not_followed) the
same run sends 89-98/s.

One worker (one member), Retry-After off; counted from psp-sim's series."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 900
SKEW_S = 0.6


def scenario(new):
    s = new("adv38c_raise_skew", partitions=4, psp_args=["--rate-limit", "20"])
    s.set_limits("--global", "20", actor="adv38c")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 20, e2e.scaled(30), 0.1)
    s.psp_put("/rate-limits", {"global": 2})  # the provider lowers its limit
    time.sleep(2)
    s.set_limits("--global", "2", actor="adv38c")  # the operator follows
    time.sleep(2)
    s.set_limits("--global", "100", actor="adv38c")  # the operator raises the budget ...
    raised = time.time()
    time.sleep(SKEW_S)
    s.psp_put("/rate-limits", {"global": 100})  # ... and the provider's raise lands
    time.sleep(6)
    series = s.psp_get("/rate-limits")["per_second"]
    left = int(s.query("SELECT count(*) FROM payment_attempts WHERE status IN "
                       "('PENDING', 'PROCESSING')")[0][0]) + N - len(s.attempts())
    after = {q["at"]: q["served"] for q in series if q["at"] >= int(raised)}
    sent = [after.get(t, 0) for t in range(int(raised) + 2, int(raised) + 5)]
    e2e.log("psp-sim per second since the raise:", sorted(after.items()),
            "charges left:", left)
    check(left > 0, "the charges ran out: no demand to judge the raise by")
    check(min(sent) >= 40,
          "2-5 s after the budget was raised from 2 to 100 req/s and the provider %.1f s "
          "later, with %d charges queued, the worker sent %s per second: one 429 in the "
          "skew cut its restarted pace to half of the old limit's second (1/s)"
          % (SKEW_S, left, sent))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
