#!/usr/bin/env python3
"""Adversary 38d, break: after a raise, only a message's FIRST 429 may cut
the restarted pace (engine_provider: `!j->res.throttled || j->throttles ==
1`), and for 2 s none may (PACE_RESTART_GRACE_MS). With a backlog that the
provider already throttled (every job parked once or more), no 429 after the
grace is a first one: the pace stays unpaced for as long as the backlog
lasts and the parked jobs come back all together, far over the provider's
limit, where before the raise the pace held them near it.

psp-sim 5 req/s with Retry-After, 100 ms latency; the budget 100 (list 10).
One raise of a class the worker never sends (list 10 -> 20: the auditor's),
or any raise. Counted from psp-sim's per-second series: 429s in the 4 s
from 3 s after the raise (past the grace) against the 4 s before it."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

N = int(os.environ.get("ADV_N", "120"))
RAISE = os.environ.get("ADV_RAISE", "--class list=20").split()


def scenario(new):
    s = new("adv38d_parked", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", "100", "--rate-limit-retry-after"])
    s.set_limits("--global", "100", "--class", "list=10", actor="adv38d")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 5, e2e.scaled(30), 0.1)
    time.sleep(2)  # every job throttled once or more; the pace near 5 req/s
    a0 = int(time.time()) + 1
    time.sleep(a0 + 4 - time.time())
    s.set_limits(*RAISE, actor="adv38d")
    raised = time.time()
    b0 = int(raised) + 3  # past the 2 s grace
    time.sleep(b0 + 4 + 1.2 - time.time())
    series = s.psp_get("/rate-limits")["per_second"]
    left = int(s.query("SELECT count(*) FROM payment_attempts WHERE status IN "
                       "('PENDING', 'PROCESSING')")[0][0]) + N - len(s.attempts())
    sa, ta = s.psp_window(a0, a0 + 4)
    sb, tb = s.psp_window(b0, b0 + 4)
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - a0, q["served"], q["throttled"]) for q in series if q["at"] >= a0],
            "raised at", round(raised - a0, 2), "charges left:", left)
    e2e.log("before: %d served %d throttled; 3-7 s after the raise: %d served %d throttled"
            % (sa, ta, sb, tb))
    check(sa >= 10 and left > 0, "no traffic to judge (served %d, left %d)" % (sa, left))
    check(tb <= 2 * ta + 8,
          "3-7 s after one raise (%s), past its 2 s grace, psp-sim answered %d requests "
          "429 (%d served) against %d (%d served) in the 4 s before: the parked jobs' "
          "429s are not first ones and cut nothing, so the restarted pace stays unpaced "
          "and the backlog hammers the provider that throttles it"
          % (" ".join(RAISE), tb, sb, ta, sa))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
