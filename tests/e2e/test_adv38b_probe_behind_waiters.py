#!/usr/bin/env python3
"""Adversary 38b, break: an open breaker and the budget's gate wait for each
other: the worker never sends again.

A job asks the gate only once the breaker lets it (engine_start_calls:
pace, breaker, then budget_waits). A refund the gate told to wait keeps its
ticket "waiting" in the gate (budget_gate_ask: g->waiting[refund][refund])
while it is parked; when the breaker opens meanwhile, the job stops asking
(provider_breaker_allow is false, the job `continue`s) but its ticket stays
counted. The breaker's probe asks the same gate at priority `charge`, below
`refund`: budget_gate_ask makes it wait for 1 + the waiters above it on the
global bucket, which holds at most one token (BUDGET_GATE_BURST_MS 0). Two
tokens never come: no probe is ever sent, the breaker stays half-open, the
refunds wait for the breaker, the worker is not ready, for good.

One worker, a budget of 1 req/s, 20 refunds queued (they wait for the
budget); psp-sim then fails every request (500 before executing) until the
breaker opens, and is healed 2 s later. With the breaker's probe sent, the
refunds go on at 1/s; here none does (and no probe is sent)."""
import time

import charged_e2e as e2e
from charged_e2e import check

ENV = {"PROVIDER_BREAKER_MIN_CALLS": "2", "PROVIDER_BREAKER_WINDOW_MS": "2000",
       "PROVIDER_BREAKER_OPEN_MS": "300", "PROVIDER_BREAKER_PROBES": "1"}
N = 20


def settled(s):
    return int(s.query("SELECT count(*) FROM refund_attempts"
                       " WHERE status NOT IN ('PENDING', 'PROCESSING')")[0][0])


def scenario(new):
    s = new("adv38b_probe_waiters", partitions=2, worker_env=ENV)
    w = s.start_worker()
    s.wait_group_settled([w])
    charges = [e2e.new_command(amount=1000 + i) for i in range(4)]
    s.publish(charges)
    s.wait_settled(4, e2e.scaled(30))
    s.set_limits("--global", "1", actor="adv38b")
    time.sleep(0.5)  # the worker's next refresh holds the 1 req/s share
    s.publish([e2e.new_refund(charges[i % 4], 10 + i) for i in range(N)])
    e2e.wait_until("refunds flowing", lambda: settled(s) >= 2, e2e.scaled(20), 0.1)
    s.psp_put("/faults", {"rules": [{"kind": "error_before", "probability": 1}]})
    e2e.wait_until("the breaker open", lambda: s.worker_log(w, "provider breaker opened"),
                   e2e.scaled(15), 0.1)
    time.sleep(2)  # refunds pile up behind the open breaker, their tickets held
    s.psp_put("/faults", {}, method="DELETE")
    before = settled(s)
    healed = time.time()
    try:
        e2e.wait_until("three more refunds settled after the heal",
                       lambda: settled(s) - before >= 3, 8, 0.2)
    except e2e.Failure:
        pass  # said below, with what psp-sim saw
    after = settled(s)
    probes = len(s.worker_log(w, "provider breaker probe answered"))
    series = s.psp_get("/rate-limits")["per_second"]
    e2e.log("refunds settled before/after the heal:", before, after, "probes:", probes,
            "psp-sim per second since the heal:",
            [(q["at"] - int(healed), q["served"]) for q in series if q["at"] >= int(healed)])
    check(after - before >= 3,
          "%.0f s after psp-sim healed, %d more refunds settled (%d of %d; budget 1 req/s, "
          "%d breaker probes in all): the breaker's probe waits behind the gate's "
          "tickets of refunds that wait for the breaker"
          % (time.time() - healed, after - before, after, N, probes))

if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
