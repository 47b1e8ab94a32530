#!/usr/bin/env python3
"""Adversary 38j: the commands one throttled card has set aside stop the
reconciler for every other record.

A set-aside command is the reconciler's: it sends it again under its key
when due. When the provider answers that call 429, the reconciler takes it
as the account's word (issue 38's "slower"): it hands the rest of its batch
back and every kind waits, 1 s, then 2, 4, 8 ... up to 60 s while the 429s
go on (reconcile_look_throttled_ms, look_at_due). But a card the provider
throttles by itself (adversary 38i's) answers 429 to every look at its own
records and to nothing else: the reconciler then looks at one of that
card's records per wait, and a record of any other card due after them,
whose look the provider would answer at once, waits behind every one of
them (ORDER BY next_check_at). Before the set-aside the card's commands
stayed parked in the worker and never reached the reconciler's queue.

The break (branch adv38j, 3 runs of 3): one worker (WORKER_MAX_IN_FLIGHT
4), psp-sim answering every charge of pm_card_mastercard 429 (no
Retry-After). First 4 charges of pm_card_visa that psp-sim executes and
answers 500 (WORKER_UNKNOWN_RETRIES 0): UNKNOWN, due for the reconciler's
first look 8 s later (RECONCILER_FIRST_LOOK_MS). Then 20 of the card's
charges: 16 set aside within 2 s, due at once. A reconciler starts: 15 s
later 0 of the 4 are settled; the reconciler made 5 calls in those 15 s,
each a look at one of the card's records answered 429 (at 0, 1, 3, 7 and
15 s). Without the card's commands (ADV_N_HOT=0) the reconciler's first
look settles the 4 SUCCEEDED 8 s after they went UNKNOWN (their charge sent
again under their key, answered from the provider's store). Each
throttled look at a card the provider throttles by itself should not hold
the other records back (the worker's pace learned the same in round 9)."""
import os

import charged_e2e as e2e
from charged_e2e import check

HOT = "pm_card_mastercard"
N_HOT = int(os.environ.get("ADV_N_HOT", "20"))
N_GOOD = 4
MAX_IN_FLIGHT = 4
FIRST_LOOK_MS = 8000
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": str(FIRST_LOOK_MS),
       "RECONCILER_POLL_MS": "200"}
WITHIN_S = 15


def scenario(new):
    s = new("adv38j_aside_stalls", partitions=4, worker_env=ENV)
    s.psp_put("/faults", {"seed": 1, "rules": [
        {"kind": "rate_limit", "probability": 1.0, "payment_method": HOT, "times": None},
        {"kind": "error_after", "probability": 1.0, "payment_method": "pm_card_visa",
         "times": N_GOOD}]})
    w = s.start_worker(WORKER_MAX_IN_FLIGHT=MAX_IN_FLIGHT)
    s.wait_group_settled([w])

    def count(where):
        return int(s.query("SELECT count(*) FROM payment_attempts WHERE " + where)[0][0])

    aside = ("payment_method = '%s' AND status = 'PROCESSING' AND lease_owner IS NULL"
             " AND reason LIKE 'provider_throttled:%%'" % HOT)
    # The good charges first, before the card's 429s cut the worker's pace:
    # UNKNOWN, due for a look FIRST_LOOK_MS later, after the card's.
    good = [e2e.new_command(amount=20000 + i) for i in range(N_GOOD)]
    s.publish(good)
    e2e.wait_until("the good charges UNKNOWN",
                   lambda: count("amount >= 20000 AND status = 'UNKNOWN'") == N_GOOD,
                   e2e.scaled(20), 0.2)
    if N_HOT:
        s.publish([e2e.new_command(amount=500 + i, payment_method=HOT) for i in range(N_HOT)])
    e2e.wait_until("the card's commands set aside", lambda: count(aside) >= N_HOT - MAX_IN_FLIGHT,
                   e2e.scaled(FIRST_LOOK_MS / 1000.0), 0.2)
    e2e.log("set aside:", count(aside), "of", N_HOT, "; due:", s.query(
        "SELECT payment_method, status, min(next_check_at - now()), max(next_check_at - now())"
        " FROM payment_attempts WHERE next_check_at IS NOT NULL GROUP BY 1, 2"))

    s.start_reconciler()
    settled = "amount >= 20000 AND status = 'SUCCEEDED'"
    try:
        e2e.wait_until("the good charges settled by the reconciler",
                       lambda: count(settled) == N_GOOD, WITHIN_S, 0.5)
    except e2e.Failure:
        pass
    done = count(settled)
    calls = s.query("SELECT p.payment_method, c.outcome, count(*) FROM provider_calls c"
                    " JOIN payment_attempts p ON p.id = c.payment_attempt_id"
                    " WHERE c.actor LIKE 'r%' GROUP BY 1, 2 ORDER BY 1, 2")
    e2e.log("the reconciler's calls:", calls)
    check(done == N_GOOD,
          "%d of %d UNKNOWN charges of another card settled %d s after the reconciler "
          "started: the %d commands set aside for a card psp-sim always throttles go "
          "first, and each 429 to one of them makes the whole reconciler wait (1, 2, 4 "
          "... 60 s): the card's 429s are taken for the account's"
          % (done, N_GOOD, WITHIN_S, count(aside)))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
