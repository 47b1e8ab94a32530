#!/usr/bin/env python3
"""Adversary 38g, break: a sender under 20 req/s is never paced, whatever
share of its requests the provider answers 429. A first 429 cuts the pace
only once this second and the last brought PACE_CUT_ANSWERS (40) answers;
a worker whose budget share is 15 req/s (an operator's budget above the
account's real limit: Stripe's test mode is 25/s, its Search API 20/s, a
limit lowered by the provider) never brings 40 answers in two seconds, so
no 429 ever cuts it: it keeps sending 15/s against a provider that takes 5,
two requests in three answered 429, for as long as the backlog lasts.

One worker, budget global 15, psp-sim limited to 5 req/s (100 ms latency),
300 charges: in the 10 s from 8 s after they were published, psp-sim's
429s must not outnumber what it served by much (a pace near its 5/s)."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 300
BUDGET = 15
FROM_S = 8
WINDOW_S = 10


def scenario(new):
    s = new("adv38g_slow", partitions=4,
            psp_args=["--rate-limit", "5", "--latency-ms", "100"])
    s.set_limits("--global", str(BUDGET), actor="adv38g")
    w = s.start_worker()
    s.wait_group_settled([w])
    t0 = time.time()
    s.publish([e2e.new_command(amount=100 + i) for i in range(N)])
    e2e.wait_until("a first 429", lambda: s.worker_log(
        w, "throttled by the provider"), e2e.scaled(30), 0.2)
    a0 = int(t0) + FROM_S
    time.sleep(max(0.0, a0 + WINDOW_S + 1.2 - time.time()))
    served, throttled = s.psp_window(a0, a0 + WINDOW_S)
    series = s.psp_get("/rate-limits")["per_second"]
    e2e.log("psp-sim per second from publish (at, served, throttled):",
            [(q["at"] - int(t0), q["served"], q["throttled"]) for q in series
             if q["at"] >= int(t0)])
    paces = [l.get("pace_per_s") for l in s.worker_log(w, "throttled by the provider")]
    e2e.log("the pace at the 429s (every 10th):", paces[::10], "last:", paces[-1:])
    by = dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts GROUP BY 1"))
    e2e.log("attempts by status:", by)
    check(by.get("FAILED", 0) == 0, "throttled charges became FAILED: %s" % by)
    check(served >= 10, "psp-sim served %d in the window: no traffic to judge" % served)
    check(throttled <= served + 10,
          "psp-sim (5 req/s) answered %d requests 429 and served %d in %d s from %d s "
          "after %d charges were published, the worker's budget share %d req/s: under "
          "20 answers a second (PACE_CUT_ANSWERS in two seconds) no 429 cuts the pace, "
          "so the worker keeps sending at its share (pace at the last 429: %s)"
          % (throttled, served, WINDOW_S, FROM_S, N, BUDGET, paces[-1:]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
