#!/usr/bin/env python3
"""Adversary 38e, break: the budget and the provider raise their limits
together, and past the restart's 2 s grace two 429s that are not the
provider's answer to our rate (another client's, a fault) come back first
in a second. Judged at the second of them (2 of 2 answers), they refuted
the raise: the worker went back to the pace it had under the old limits
(a few calls/s) against a provider that now takes 300, and climbed from
there at about +1/s a second. Judged on their window (a second, or 20
answers), 2 of many refute nothing. And the first of them, with two calls
out, had cut the pace to 1/s by itself (half of what was sent in the last
second): fewer than five calls are no rate to halve.

psp-sim 8 req/s, 150 ms latency, the budget 100, 60 charges: the
worker's pace is cut near 8/s (a cut needs forty answers). Then psp-sim
and the budget 300; past the grace, with the worker idle, psp-sim answers the next two requests 429 (a fault rule, two
times) and 2,500 charges are published. Counted from psp-sim's per-second
series: requests served in the 3 s from 1 s after the two 429s."""
import time

import charged_e2e as e2e
from charged_e2e import check

N_BEFORE = 60
N_AFTER = 2500
LATENCY_MS = 150


def paces(s, w):
    return [float(line["pace_per_s"]) for line in
            s.worker_log(w, "throttled by the provider") if "pace_per_s" in line]


def scenario(new):
    s = new("adv38e_stray", partitions=4,
            psp_args=["--rate-limit", "8", "--latency-ms", str(LATENCY_MS)])
    s.set_limits("--global", "100", actor="adv38e")
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i) for i in range(N_BEFORE)])
    s.wait_settled(N_BEFORE, e2e.scaled(60))
    before = paces(s, w)
    check(before and 0 < before[-1] <= 16,
          "psp-sim at 8/s did not pace the worker (paces logged: %s)" % before)

    s.psp_put("/rate-limits", {"global": 300})  # the provider raises ...
    s.set_limits("--global", "300", actor="adv38e")  # ... and the operator follows
    e2e.wait_until("the pace restarted",
                   lambda: s.worker_log(w, "provider budget settings changed"),
                   e2e.scaled(10), 0.1)
    time.sleep(2.5)  # past the restart's 2 s grace: a 429 now is judged
    s.psp_put("/faults", {"latency_ms": LATENCY_MS,
                          "rules": [{"kind": "rate_limit", "probability": 1, "times": 2}]})
    s.publish([e2e.new_command(amount=1000 + i) for i in range(N_AFTER)])
    e2e.wait_until("the two stray 429s answered",
                   lambda: len(s.psp_get("/faults").get("hits", [])) >= 2,
                   e2e.scaled(20), 0.05)
    hit = time.time()
    t0 = int(hit) + 1
    e2e.wait_until("the window observed", lambda: time.time() >= t0 + 3.2, 10, 0.1)
    series = s.psp_get("/rate-limits")["per_second"]
    served = sum(q["served"] for q in series if t0 <= q["at"] < t0 + 3)
    left = N_BEFORE + N_AFTER - int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status NOT IN "
        "('PENDING', 'PROCESSING')")[0][0])
    after = paces(s, w)[len(before):]
    e2e.log("pace before the raise:", before[-1], "paces at the 429s after it:", after,
            "psp-sim served in 3 s from 1 s after them:", served, "charges left:", left)
    check(left > 0, "the charges ran out: no demand to judge the pace by")
    back = [p for p in after if 0 < p <= before[-1]]  # 0: unpaced
    # 100 in 3 s: back at the old pace (16/s at most, then about +1/s a
    # second) it is under 60; the new limits (300) allow 900.
    check(served >= 100 and not back,
          "two stray 429s past the grace of a raise the provider shared put back the pace "
          "from before it: %d served in 3 s (the old limit was 8/s, the new 300/s), paces "
          "%s after the 429s against %.1f before the raise" % (served, after, before[-1]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
