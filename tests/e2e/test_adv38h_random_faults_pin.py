#!/usr/bin/env python3
"""Adversary 38h, break: psp-sim's random rate_limit fault at 5% pins the
worker's pace at a quiet rate, and a burst that follows is held to it,
against a provider with no limit at all.

An overrun is PACE_CUT_429S (2) counted 429s and a PACE_CUT_SHARE-th (a
twentieth) of a window's answers. At 10-20 answers a second, two faults in
one window (a quarter of the windows at 5%) are "an overrun", and the cut
sets the limit to the rate served at that quiet time (~20/s). Nothing but
the climb (+1/s a second under 20/s, 5% a second above) lifts it, so a
burst of 3,000 charges that psp-sim would take in a second or two runs at
~15-30 a second.

One worker, psp-sim with no limiter and --fault rate_limit=0.05 (seed 1),
no budget set. 200 charges, 10 at a time (~7 s), then 3,000 at once: they
must settle within 10 s. Measured: the pace 18-23/s at the quiet part's
429s, then 152, 263 and 181 of 3,000 in 10 s (3 of 3 runs; with the
batches 0.4 s further apart the pace was ~12/s and 363 settled in 20 s).
The same 5% fault with 10,000 charges at once cuts nothing: 4.7% of the
answers in its busy windows."""
import time

import charged_e2e as e2e
from charged_e2e import check

BATCHES, BATCH = 20, 10
N = 3000
WITHIN_S = 10


def scenario(new):
    s = new("adv38h_faults", partitions=12, psp_args=["--fault", "rate_limit=0.05"])
    w = s.start_worker()
    s.wait_group_settled([w])
    for k in range(BATCHES):
        s.publish([e2e.new_command(amount=100 + k * BATCH + i) for i in range(BATCH)])
    e2e.wait_until("the quiet charges settled", lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'")[0][0]) >=
        BATCHES * BATCH, e2e.scaled(30), 0.2)
    paces = [l.get("pace_per_s") for l in s.worker_log(w, "throttled by the provider")]
    e2e.log("the pace at the quiet part's 429s:", paces)
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
    by = dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts GROUP BY 1"))
    e2e.log("attempts by status:", by)
    check(by.get("FAILED", 0) == 0, "throttled charges became FAILED: %s" % by)
    check(done >= N,
          "%d of %d charges settled in %.0f s against psp-sim with no limit and a 5%% "
          "random rate_limit fault: two faults in a quiet window are an overrun "
          "(PACE_CUT_429S, over PACE_CUT_SHARE's twentieth), the pace cut to the quiet "
          "rate served (the pace at the quiet part's 429s: %s)" % (done, N, took, paces))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
