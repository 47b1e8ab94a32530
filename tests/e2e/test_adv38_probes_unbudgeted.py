#!/usr/bin/env python3
"""Adversary 38, break: the worker's breaker probes are never asked of the
fleet's provider budget (engine_provider.c start_probe calls
provider_client_start_probe, which has no gate), so a worker whose breaker
flaps sends requests on top of its share.

The fleet's budget and psp-sim's limiter are both 5 requests/s. One worker;
every charge psp-sim receives fails before executing (500, `error_before`),
so the breaker opens, waits PROVIDER_BREAKER_OPEN_MS, probes (the probe's
400 closes it), and the next charges open it again. The charges are paced by
the budget; the probes are not. Counted from psp-sim's per-second series
(served + throttled: what arrived), never from logs: the arrivals over the
run must stay within 5/s and one per member of the budget."""
import time

import charged_e2e as e2e
from charged_e2e import check

LIMIT = 5
RUN_S = 8
ENV = {
    "PROVIDER_BREAKER_MIN_CALLS": "2",
    "PROVIDER_BREAKER_WINDOW_MS": "1000",
    "PROVIDER_BREAKER_OPEN_MS": "50",
    "PROVIDER_BREAKER_PROBES": "3",
}


def scenario(new):
    s = new("adv38_probes", partitions=4, worker_env=ENV,
            psp_args=["--rate-limit", str(LIMIT), "--fault", "error_before=1"])
    s.set_limits("--global", str(LIMIT), actor="adv38")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(200)])
    time.sleep(RUN_S)
    series = s.psp_get("/rate-limits")["per_second"]
    e2e.log("psp-sim per second (at, served, throttled):",
            [(q["at"] - series[0]["at"], q["served"], q["throttled"]) for q in series])
    full = series[1:-1]  # whole seconds only
    check(full, "no whole second in psp-sim's series")
    arrived = sum(q["served"] + q["throttled"] for q in full)
    members = max(1, len(s.query("SELECT 1 FROM provider_budget_members")))
    check(arrived <= LIMIT * len(full) + members,
          "%d requests reached psp-sim in %d whole seconds under a fleet budget of %d/s "
          "(one member): the breaker's probes are sent outside the budget"
          % (arrived, len(full), LIMIT))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
