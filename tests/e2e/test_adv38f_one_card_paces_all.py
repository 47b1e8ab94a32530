#!/usr/bin/env python3
"""Adversary 38f, break: whose 429 is it? A few commands whose own object
the provider throttles (Stripe: "1,000 updates per PaymentIntent per hour";
psp-sim: a rate_limit rule for one payment method) cut the whole worker's
pace, though the account's limit is nowhere near: every other charge gets
through at once.

provider_pace halves the worker's rate at each message's first 429 (at
most once a second); only a repeat of one message's 429 cuts nothing. So a
steady trickle of commands for a throttled object, one in fifty, halves
the pace about every second while the other 49 succeed: from ~2,000/s to a
few per second, the halvings outrunning the +5%/s of the successes. A 429
about one object is taken as the account's overrun.

One worker, psp-sim with no limiter and no budget set, a rate_limit rule for
pm_card_throttled (probability 1). 8,000 good charges alone: psp-sim's mean
requests/s (inner seconds); then 20,000 good ones with one for the
throttled card after every 50th: psp-sim's requests/s in seconds +4..+8 of
that batch must be at least a third of the first mean."""
import time

import charged_e2e as e2e
from charged_e2e import check

THROTTLED = "pm_card_throttled"
N1 = 8000    # good charges alone
N2 = 20000   # good charges with the throttled card's among them
BAD_EVERY = 50
WATCH = (4, 9)  # the seconds of the mixed batch compared (from its first)


def served(s, since):
    """psp-sim's requests per second from the second after `since`."""
    return [q["served"] for q in s.psp_get("/rate-limits")["per_second"]
            if q["at"] > since]


def scenario(new):
    s = new("adv38f_one_card", partitions=12)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": THROTTLED,
         "times": None}]})
    w = s.start_worker()
    s.wait_group_settled([w])

    t0 = int(time.time())
    s.publish([e2e.new_command(amount=1000 + i) for i in range(N1)])
    s.wait_settled(N1, e2e.scaled(60))
    alone = served(s, t0)
    inner = alone[1:-1] or alone
    base = sum(inner) / len(inner)

    mixed = []
    for i in range(N2):
        mixed.append(e2e.new_command(amount=20000 + i))
        if i % BAD_EVERY == BAD_EVERY - 1:
            mixed.append(e2e.new_command(amount=500, payment_method=THROTTLED))
    t1 = int(time.time())
    s.publish(mixed)
    e2e.wait_until("%d s of the mixed batch" % WATCH[1], lambda: len(served(s, t1)) >
                   WATCH[1], e2e.scaled(60), 0.2)
    series = served(s, t1)
    watched = series[WATCH[0]:WATCH[1]]
    rate = sum(watched) / len(watched)
    paces = [l.get("pace_per_s") for l in s.worker_log(w, "throttled by the provider")]
    e2e.log("psp-sim per second, good charges alone:", alone, "mean %.0f/s" % base)
    e2e.log("psp-sim per second, one in %d for a throttled card:" % (BAD_EVERY + 1), series)
    e2e.log("the worker's pace at each 429 (every 10th):", paces[::10])
    # A third of the rate alone, or 250/s on a machine too loaded to say:
    # the break held it at 42-56.
    check(rate >= min(base / 3, 250),
          "one command in %d for a throttled card held the worker at %.0f req/s in "
          "seconds +%d..+%d (%s) against %.0f/s without them: each message's first 429 "
          "halves the whole worker's pace, though psp-sim has no limit"
          % (BAD_EVERY + 1, rate, WATCH[0], WATCH[1] - 1, watched, base))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
