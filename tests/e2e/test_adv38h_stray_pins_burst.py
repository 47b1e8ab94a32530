#!/usr/bin/env python3
"""Adversary 38h, break: two stray 429s in a quiet window pin the worker's
pace at the quiet rate, and a burst that follows is held to it for a
minute, against a provider with no limit at all.

An overrun is PACE_CUT_429S (2) counted 429s and a PACE_CUT_SHARE-th (a
twentieth) of the window's answers. A twentieth protects a busy window
(psp-sim's 3% fault, a stray among thousands); a quiet one has 10-40
answers, so two strays among them are "an overrun" (Stripe answers 429 for
a lock held on an object too, and another client of the account may take a
burst). The cut then sets the limit to the rate the provider served in the
window: what the worker had to send at a quiet time, not what the provider
can take. Nothing lifts it but the climb (1/limit or 5% of a call/s per
answer: +1/s a second under 20/s, 5% a second above), so a burst arriving
later runs at ~10/s, then ~20/s ten seconds on, and ~40/s after half a
minute: psp-sim takes thousands a second.

One worker, psp-sim with no limiter and a rate_limit rule for the first two
requests about pm_card_visa (then none: the strays of one quiet second),
no budget set. 20 charges one at a time (a quiet second or two, 2 of them
answered 429 once), then, once they settled, 2,000 charges at once: they
must settle within 15 s (the worker alone does thousands a second here)."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

QUIET = int(os.environ.get("ADV_QUIET", "20"))  # published one at a time
IDLE_S = float(os.environ.get("ADV_IDLE_S", "0"))  # then nothing for this long
N = int(os.environ.get("ADV_N", "2000"))
WITHIN_S = 15


def scenario(new, name="adv38h_stray"):
    s = new(name, partitions=4)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": "pm_card_visa",
         "times": 2}]})
    w = s.start_worker()
    s.wait_group_settled([w])
    for i in range(QUIET):
        s.publish([e2e.new_command(amount=100 + i)])
    e2e.wait_until("the quiet charges settled", lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'")[0][0]) >= QUIET,
        e2e.scaled(30), 0.2)
    strays = s.worker_log(w, "throttled by the provider")
    e2e.log("429s in the quiet part:", len(strays))
    check(len(strays) == 2, "expected the 2 strays, got %d 429s" % len(strays))
    time.sleep(IDLE_S)  # the quiet hour, shortened
    t0 = time.time()
    s.publish([e2e.new_command(amount=20000 + i, payment_method="pm_card_mastercard")
               for i in range(N)])

    def burst_done():
        return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'"
                           " AND amount >= 20000")[0][0])

    done = 0
    deadline = t0 + e2e.scaled(WITHIN_S)
    while time.time() < deadline:
        done = burst_done()
        if done >= N:
            break
        time.sleep(0.5)
    took = time.time() - t0
    series = [(q["at"] - int(t0), q["served"], q["throttled"])
              for q in s.psp_get("/rate-limits")["per_second"] if q["at"] >= int(t0) - 10]
    e2e.log("psp-sim per second from the burst's publish (at, served, throttled):", series)
    by = dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts GROUP BY 1"))
    e2e.log("attempts by status:", by)
    check(by.get("FAILED", 0) == 0, "throttled charges became FAILED: %s" % by)
    check(done >= N,
          "%d of %d charges settled in %.0f s against psp-sim with no limit: two stray "
          "429s among the ~%d answers of a quiet window are PACE_CUT_429S and over "
          "PACE_CUT_SHARE's twentieth, so the pace was cut to the rate served at that "
          "quiet time, and only the climb (+1/s a second, 5%% above 20/s) lifts it"
          % (done, N, took, QUIET + 2))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
