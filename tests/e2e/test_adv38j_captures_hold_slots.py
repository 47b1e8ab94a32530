#!/usr/bin/env python3
"""Adversary 38j: a card the provider always throttles still stops the
worker when its commands are authorizations with their captures.

Round 10 sets a throttled authorization aside so that it no longer holds a
message (test_adv38i_hot_card_majority). But its capture, behind it in the
partition, finds it PROCESSING and waits for it (capture_store's
CAPTURE_ORDER_WINDOW, 5 minutes): a waiting job takes an in-flight slot
(engine_core_started counts JOB_WAIT). Once WORKER_MAX_IN_FLIGHT such
captures wait, the worker starts nothing else, and every other card's
charge waits behind them; after 5 minutes each capture is REJECTED
(not_authorized: ... is PROCESSING), though its authorization is only
throttled.

The break (branch adv38j, 3 runs of 3): one worker (WORKER_MAX_IN_FLIGHT
10), psp-sim answering every call for pm_card_mastercard 429; 12
authorizations of that card, each followed by its capture (4
partitions). 10 authorizations park after their 429 (none set aside: 10
parked is not yet "parked fill the slots" when each is answered), their
10 captures are recorded and wait for them in the 10 slots; the parked
ones then never get a slot to call again, so they are never answered again
and never set aside. 100 charges of another card published then: 0 of
100 settled in 15 s (psp-sim saw 12 calls in all, all of the card's).
Before the set-aside commit the same (the set-aside is decided on an
answer only), so round 10 does not cover it.

Now a waiting job holds no slot (engine_core_started), and a throttled
job is set aside too when the messages held fill the fetch's bound: every
charge of the other card settles (73 of 100 in the first 15 s, all in
about 25 s). What stays: the captures wait for their authorizations for
up to CAPTURE_ORDER_WINDOW, each holding its message, so with as many
waiting captures as WORKER_MAX_IN_FLIGHT the other cards share what is
left of the worker's held messages (twice WORKER_MAX_IN_FLIGHT), here 2 to
8 of 20 (docs/architecture.md)."""
import time

import authorization_steps as steps
import charged_e2e as e2e
from charged_e2e import check

HOT = "pm_card_mastercard"
N_AUTH = 12
GOOD = 100
MAX_IN_FLIGHT = 10
WITHIN_S = 60


def scenario(new):
    s = new("adv38j_captures_slots", partitions=4)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": HOT, "times": None}]})
    w = s.start_worker(WORKER_MAX_IN_FLIGHT=MAX_IN_FLIGHT)
    s.wait_group_settled([w])
    recs = []
    for i in range(N_AUTH):
        auth = e2e.new_command(amount=500 + i, payment_method=HOT)
        auth["type"] = "authorization.requested"
        recs += [auth, steps.new_capture(auth)]
    steps.produce(s, recs)

    def count(where, table="payment_attempts"):
        return int(s.query("SELECT count(*) FROM %s WHERE %s" % (table, where))[0][0])

    e2e.wait_until("captures waiting for their authorizations",
                   lambda: count("status = 'PENDING'", "capture_attempts") >= MAX_IN_FLIGHT,
                   e2e.scaled(15), 0.2)
    t0 = time.time()
    s.publish([e2e.new_command(amount=20000 + i) for i in range(GOOD)])
    good = "amount >= 20000 AND status = 'SUCCEEDED'"
    try:
        e2e.wait_until("every good charge settled", lambda: count(good) == GOOD, WITHIN_S, 0.5)
    except e2e.Failure:
        pass
    done = count(good)
    auths = s.query("SELECT status, coalesce(reason, ''), lease_owner IS NOT NULL, count(*)"
                    " FROM payment_attempts WHERE capture_method = 'manual' GROUP BY 1, 2, 3")
    caps = s.query("SELECT status, count(*) FROM capture_attempts GROUP BY 1")
    hits = len([h for h in s.psp_get("/faults").get("hits", []) if h["kind"] == "rate_limit"])
    e2e.log("after %.1f s: %d of %d good charges settled; authorizations (status, reason, "
            "leased, n): %s; captures: %s; psp-sim's 429s: %d"
            % (time.time() - t0, done, GOOD, auths, caps, hits))
    check(done == GOOD,
          "%d of %d charges of another card settled in %d s, psp-sim unlimited but for one "
          "card: %d captures wait for their authorizations, each in an in-flight slot "
          "(WORKER_MAX_IN_FLIGHT %d), while the authorizations, parked after their 429, "
          "wait for a slot to call again; psp-sim saw %d calls of the card"
          % (done, GOOD, WITHIN_S, count("status = 'PENDING'", "capture_attempts"),
             MAX_IN_FLIGHT, hits))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
