#!/usr/bin/env python3
"""Adversary 38i: one card the provider always throttles, a third of the
commands, must not stop the worker charging every other card; and what it
sets aside is charged once, later, by the reconciler.

The break (branch adv38i, three runs): one worker, psp-sim answering every
request about pm_card_mastercard 429, 8,000 charges on pm_card_visa with
one for that card after every second: 3,933 of the 8,000 settled in 20 s,
then none. The card's commands parked, each holding its message and lease,
until they filled the messages the worker may hold (2 x
WORKER_MAX_IN_FLIGHT) and it fetched nothing more, sending only the card's
retries. (The pace that had cut the worker to 1-2/s on the same answers is
fixed in provider_pace: a unit test.)

Now, once parked jobs fill WORKER_MAX_IN_FLIGHT, a throttled one is set
aside: PROCESSING, reason provider_throttled, unleased, its next look due
when its park would have ended; its offset may be committed. Here
WORKER_MAX_IN_FLIGHT is 100, so that the worker holds 200 at most and the
break needs ~600 commands, not ~6,000.

1. every good charge settles within the deadline, none of the card's is
   FAILED, and those set aside are as said;
2. psp-sim stops throttling the card, a reconciler starts: every command
   settles SUCCEEDED, each charged once at the provider (its ledger), and
   every offset is committed."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

THROTTLED = "pm_card_mastercard"
GOOD = int(os.environ.get("ADV_N", "2000"))
GOOD_PER_HOT = 2  # one of the card's after every second good one
MAX_IN_FLIGHT = 100
WITHIN_S = 20


def scenario(new):
    s = new("adv38i_hot_majority", partitions=12)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": THROTTLED,
         "times": None}]})
    w = s.start_worker(WORKER_MAX_IN_FLIGHT=MAX_IN_FLIGHT)
    s.wait_group_settled([w])
    cmds = []
    for i in range(GOOD):
        cmds.append(e2e.new_command(amount=20000 + i))
        if i % GOOD_PER_HOT == GOOD_PER_HOT - 1:
            cmds.append(e2e.new_command(amount=500, payment_method=THROTTLED))
    hot = len(cmds) - GOOD
    t0 = time.time()
    s.publish(cmds)

    def count(where):
        return int(s.query("SELECT count(*) FROM payment_attempts WHERE " + where)[0][0])

    good = "status = 'SUCCEEDED' AND amount >= 20000"
    done = 0
    deadline = t0 + e2e.scaled(WITHIN_S)
    while time.time() < deadline:
        done = count(good)
        if done >= GOOD:
            break
        time.sleep(0.5)
    took = time.time() - t0
    by = dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts GROUP BY 1"))
    aside = count("amount = 500 AND status = 'PROCESSING' AND lease_owner IS NULL"
                  " AND next_check_at IS NOT NULL AND reason LIKE 'provider_throttled:%'")
    e2e.log("after %.1f s: attempts by status %s; the card's set aside: %d of %d"
            % (took, by, aside, hot))
    check(by.get("FAILED", 0) == 0, "throttled charges became FAILED: %s" % by)
    check(done >= GOOD,
          "%d of %d good charges settled in %.0f s, psp-sim unlimited, with one command "
          "for a card psp-sim always answers 429 after every %d good ones: the card's "
          "parked commands fill the messages the worker may hold and it fetches no more"
          % (done, GOOD, took, GOOD_PER_HOT))
    # All but the parked ones (at most MAX_IN_FLIGHT) are set aside.
    check(aside >= hot - MAX_IN_FLIGHT,
          "only %d of the card's %d commands set aside for the reconciler (at most %d "
          "may stay parked)" % (aside, hot, MAX_IN_FLIGHT))
    check(len(s.worker_log(w, "throttled by the provider; set aside")) >= aside,
          "the worker did not say each set-aside")

    # The card is served again: the worker's parked ones and the reconciler's
    # looks at the set-aside ones charge each once.
    s.psp_put("/faults", {"seed": 1, "rules": []})
    s.start_reconciler()
    s.wait_settled(len(cmds), 120)
    e2e.wait_until("every command SUCCEEDED",
                   lambda: count("status = 'SUCCEEDED'") == len(cmds), 60)
    s.check_invariants()
    ledger = [c for c in s.ledger() if c["outcome"] == "succeeded"]
    check(len(ledger) == len(cmds),
          "%d charges at the provider for %d commands" % (len(ledger), len(cmds)))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
