#!/usr/bin/env python3
"""429 is not an outage (issue 38): the worker's breaker stays closed while
the provider throttles.

One worker, no fleet budget (PROVIDER_BUDGET=0: nothing paces it but the
provider's answers) and a breaker set to open at 20% failures over 2 s
with 10 calls. psp-sim answers 30% of all requests 429 before executing
(its random rate_limit fault): the first burst of 40 calls alone would open
a breaker that counted a 429 as a failure. Asserted from psp-sim's ledger
and the worker's metrics: every charge executed once and SUCCEEDED, 429s
were answered, and the breaker never opened. (That nothing but 429s for a
whole window opens it is test_provider_breaker's
nothing_but_429s_for_a_whole_window_opens_it: on the real stack the
worker's pace slows its calls under the window's minimum first.)"""
import charged_e2e as e2e
from charged_e2e import check, check_eq

N = 40
ENV = {
    "PROVIDER_BUDGET": "0",
    "PROVIDER_BREAKER_FAILURE_RATE": "20",
    "PROVIDER_BREAKER_MIN_CALLS": "10",
    "PROVIDER_BREAKER_WINDOW_MS": "2000",
}


def metric(s, w, prefix):
    return int(sum(v for k, v in s.admin_metrics(w).items() if k.startswith(prefix)))


def throttle(s, probability):
    s.psp_put("/faults", {"seed": 7, "rules": [
        {"kind": "rate_limit", "probability": probability, "times": None}]})


def charged(s):
    return len([c for c in s.ledger() if not c.get("injected")])


def scenario(new):
    s = new("breaker_throttled", partitions=2)
    throttle(s, 0.3)
    w = s.start_worker(**ENV)
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=300 + i) for i in range(N)])
    s.wait_settled(N, e2e.scaled(60))
    s.check_invariants()
    check_eq(charged(s), N, "charges psp-sim executed, 30% of its answers 429")
    statuses = s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
    check_eq([(r[0], int(r[1])) for r in statuses], [("SUCCEEDED", N)],
             "attempts after a provider that throttled 30% of its answers")
    throttled = metric(s, w, "charged_provider_throttled_total")
    e2e.log("throttled answers the worker saw:", throttled)
    check(throttled >= N // 6, "only %d 429s: the scenario did not throttle" % throttled)
    check_eq(metric(s, w, "charged_provider_breaker_opens_total"), 0,
             "breaker openings under throttling alone")

    check_eq(s.exited_workers(), [], "workers that exited")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
