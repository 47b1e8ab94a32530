#!/usr/bin/env python3
"""429 is not an outage (issue 38): the worker's breaker stays closed while
the provider throttles, and opens only when nothing but 429s comes back for
a whole window.

One worker, no fleet budget (PROVIDER_BUDGET=0: nothing paces it but the
provider's answers) and a breaker set to open at 20% failures over 2 s
with 5 calls. psp-sim answers half of all requests 429 before executing
(its random rate_limit fault): a breaker that counted a 429 as a failure
would open within its first window. Asserted from psp-sim's ledger and the
worker's metrics: every charge of the first batch executed once and
SUCCEEDED, hundreds of 429s were answered, and the breaker never opened.
Then psp-sim answers every request 429 for longer than a window: the
breaker opens (a provider that only throttles is as good as down); once
psp-sim answers again it closes and the second batch is charged once each."""
import charged_e2e as e2e
from charged_e2e import check, check_eq

N = 30
ENV = {
    "PROVIDER_BUDGET": "0",
    "PROVIDER_BREAKER_FAILURE_RATE": "20",
    "PROVIDER_BREAKER_MIN_CALLS": "5",
    "PROVIDER_BREAKER_WINDOW_MS": "2000",
    "PROVIDER_BREAKER_OPEN_MS": "1000",
    "PROVIDER_BREAKER_PROBES": "1",
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
    throttle(s, 0.5)
    w = s.start_worker(**ENV)
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=300 + i) for i in range(N)])
    s.wait_settled(N, e2e.scaled(60))
    s.check_invariants()
    check_eq(charged(s), N, "charges psp-sim executed, half its answers 429")
    statuses = s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
    check_eq([(r[0], int(r[1])) for r in statuses], [("SUCCEEDED", N)],
             "attempts after a provider that throttled half of its answers")
    throttled = metric(s, w, "charged_provider_throttled_total")
    e2e.log("throttled answers the worker saw:", throttled)
    check(throttled >= N // 2, "only %d 429s: the scenario did not throttle" % throttled)
    check_eq(metric(s, w, "charged_provider_breaker_opens_total"), 0,
             "breaker openings under throttling alone")

    # Nothing but 429s for a whole window: the breaker opens.
    throttle(s, 1.0)
    s.publish([e2e.new_command(amount=500 + i) for i in range(N)])
    e2e.wait_until("the breaker open after a window of nothing but 429s",
                   lambda: metric(s, w, "charged_provider_breaker_opens_total") >= 1,
                   e2e.scaled(20), 0.2)
    check_eq(charged(s), N, "charges executed while every answer was 429")
    s.psp_put("/faults", {}, method="DELETE")
    s.wait_settled(2 * N, e2e.scaled(60))
    s.check_invariants()
    check_eq(charged(s), 2 * N, "charges psp-sim executed in all")
    check_eq(metric(s, w, "charged_provider_breaker_state"), 0,
             "the breaker once psp-sim answers again (0: closed)")
    check_eq(s.exited_workers(), [], "workers that exited")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
