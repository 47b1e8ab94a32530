#!/usr/bin/env python3
"""Adversary 38h, break: 38g's one card in ten, spread over twenty cards.
The pace now sets apart the 429s about an object that got nothing else in
the window, but only PACE_OBJECTS_APART (8) such objects a window: the
commands for a ninth throttled card and beyond count as the account's
overrun. Twenty cards the provider throttles by themselves (Stripe: a lock
on each, or a PaymentIntent's 1,000 updates an hour; psp-sim: a rate_limit
rule per payment method), their commands one in ten of the inflow, are as
many 429s as one card's were, and they cut the whole worker as 38g's did,
while every other charge would go through at once (psp-sim has no limit,
no budget is set).

One worker, psp-sim with no limiter, a rate_limit rule for each of
pm_card_throttled_0..19 (never served: they are only ever answered 429);
12,000 good charges with one for a throttled card (in turn) after every
9th: the good ones must settle within 25 s. With ADV_CARDS=1 (38g's one
card) they do, in ~5 s (psp-sim ~5,500 requests/s throughout); with 20,
psp-sim's requests fall 5,384, 4,374, 2,657, 1,271, 399, 148 ... 3 a second
and 9,653 settle (the pace 2.1/s at the last 429). At 6,000 good charges
both pass: the first seconds take them all before the pace falls."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

CARDS = int(os.environ.get("ADV_CARDS", "20"))
THROTTLED = ["pm_card_throttled_%d" % k for k in range(CARDS)]
N = int(os.environ.get("ADV_N", "12000"))
BAD_EVERY = int(os.environ.get("ADV_BAD_EVERY", "9"))  # one throttled after every 9th
WITHIN_S = 25


def scenario(new):
    s = new("adv38h_cards", partitions=12)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": pm, "times": None}
        for pm in THROTTLED]})
    w = s.start_worker()
    s.wait_group_settled([w])
    cmds = []
    for i in range(N):
        cmds.append(e2e.new_command(amount=20000 + i))
        if i % BAD_EVERY == BAD_EVERY - 1:
            cmds.append(e2e.new_command(
                amount=500, payment_method=THROTTLED[(i // BAD_EVERY) % CARDS]))
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
          "in %d for one of %d cards psp-sim throttles: only PACE_OBJECTS_APART (8) "
          "objects a window are set apart, the other cards' 429s count as the "
          "account's overrun, over PACE_CUT_SHARE's twentieth, and cut the whole "
          "worker's pace to what was served (at the last 429: %s)"
          % (done, N, took, BAD_EVERY + 1, CARDS, paces[-1:]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
