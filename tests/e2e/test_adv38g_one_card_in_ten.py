#!/usr/bin/env python3
"""Adversary 38g, break: 38f's "one card paces all" is still there at one
command in ten. The fix (PACE_CUT_SHARE) lets a first 429 cut the worker's
whole pace when first 429s are at least a twentieth of the answers of this
second and the last. Commands for an object the provider throttles (Stripe:
1,000 updates per PaymentIntent an hour, lock_timeout on one object;
psp-sim: a rate_limit rule for one payment method) are then a twentieth of
the answers whatever the pace, as soon as they are a twentieth of the
inflow: each second halves the pace again, down to where two seconds bring
fewer than PACE_CUT_ANSWERS (40) answers, ~20 req/s, while every other
charge would go through at once (psp-sim has no limit, no budget is set).

One worker, psp-sim with no limiter, a rate_limit rule for
pm_card_throttled; 6,000 good charges with one for the throttled card after
every 9th (one in ten): the good ones must settle within 25 s (the worker
alone does thousands a second here; the break holds it at tens)."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

THROTTLED = "pm_card_throttled"
N = int(os.environ.get("ADV_N", "6000"))
BAD_EVERY = int(os.environ.get("ADV_BAD_EVERY", "9"))  # one throttled after every 9th
WITHIN_S = 25


def scenario(new):
    s = new("adv38g_one_in_ten", partitions=12)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": THROTTLED,
         "times": None}]})
    w = s.start_worker()
    s.wait_group_settled([w])
    cmds = []
    for i in range(N):
        cmds.append(e2e.new_command(amount=20000 + i))
        if i % BAD_EVERY == BAD_EVERY - 1:
            cmds.append(e2e.new_command(amount=500, payment_method=THROTTLED))
    t0 = time.time()
    s.publish(cmds)

    def good_done():
        return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'"
                           " AND amount >= 20000")[0][0])

    done = 0
    deadline = t0 + e2e.scaled(WITHIN_S)
    while time.time() < deadline:
        done = good_done()
        if done >= N:
            break
        time.sleep(0.5)
    took = time.time() - t0
    series = [(q["at"] - int(t0), q["served"]) for q in s.psp_get("/rate-limits")["per_second"]
              if q["at"] >= int(t0)]
    paces = [l.get("pace_per_s") for l in s.worker_log(w, "throttled by the provider")]
    e2e.log("psp-sim per second from publish (at, served):", series)
    e2e.log("the worker's pace at each 429 (every 20th):", paces[::20], "last:", paces[-1:])
    by = dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts GROUP BY 1"))
    e2e.log("attempts by status:", by)
    check(by.get("FAILED", 0) == 0, "throttled charges became FAILED: %s" % by)
    check(done >= N,
          "%d of %d good charges settled in %.0f s, psp-sim unlimited, with one command "
          "in %d for a card psp-sim throttles: first 429s are a tenth of the answers at "
          "any pace, over PACE_CUT_SHARE's twentieth, so each second halves the whole "
          "worker's pace (at the last 429: %s)"
          % (done, N, took, BAD_EVERY + 1, paces[-1:]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
