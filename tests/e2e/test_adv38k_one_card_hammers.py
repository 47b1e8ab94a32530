#!/usr/bin/env python3
"""Adversary 38k: with one card for every record, an account-wide 429 no
longer stops the reconciler's round.

dd8c1de takes the first 429 of a batch for its record's object alone (the
payment method, for a charge) and goes on with the batch; only a 429 about
another object stops the round. When every record due is of one card (one
customer's saved card paying many orders, the e2e default card), a 429 of
the account's limit is taken for that card's, every time: every look of the
batch is sent right after the provider said to wait (Retry-After), and the
next batch follows at once. Records of two cards stop at the second 429.

The break: 40 charges of one card left UNKNOWN (psp-sim executes them and
answers 500; WORKER_UNKNOWN_RETRIES 0); psp-sim then limits the account to
1 request a second (burst 1) and sends Retry-After (1 s); a reconciler
starts (RECONCILER_BATCH 16). Measured: the 429s psp-sim sent the reconciler
in its first 8 s, beside the same run with the 40 charges alternating
between psp-sim's two cards (where the round stops at the second card's
429): 231 against 23 (over 1 s allowed a second), the reconciler's looks
going on at about 29 a second after each was told to wait a second."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 40
WATCH_S = 8
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "0",
       "RECONCILER_POLL_MS": "200"}
CARDS = ["pm_card_visa", "pm_card_mastercard"]


def run(new, name, cards):
    s = new(name, partitions=4, worker_env=ENV, psp_args=["--fault", "error_after=1"])
    w = s.start_worker()
    s.wait_group_settled([w])
    s.publish([e2e.new_command(amount=100 + i, payment_method=cards[i % len(cards)])
               for i in range(N)])
    e2e.wait_until("%d attempts UNKNOWN" % N, lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'UNKNOWN'")[0][0]) == N,
        e2e.scaled(30), 0.2)
    s.psp_put("/faults", {}, method="DELETE")
    s.psp_put("/rate-limits", {"global": {"rate": 1, "burst": 1}, "retry_after": True})
    t0 = int(time.time()) + 1
    s.start_reconciler(RECONCILER_BATCH="16")
    e2e.wait_until("%d s of looks" % WATCH_S, lambda: time.time() >= t0 + WATCH_S,
                   WATCH_S + 5, 0.2)
    served, throttled = s.psp_window(t0, t0 + WATCH_S)
    e2e.log("%s: %d s: psp-sim served %d, throttled %d" % (name, WATCH_S, served, throttled))
    s.psp_put("/rate-limits", {})
    s.wait_settled(N, 60)
    s.check_invariants()
    return served, throttled


def scenario(new):
    spread = run(new, "adv38k_cards_spread", CARDS)
    one = run(new, "adv38k_one_card", CARDS[:1])
    check(one[1] <= 2 * spread[1] + WATCH_S,
          "the reconciler drew %d 429s in %d s from an account limited to 1/s (Retry-After "
          "1 s) when all %d records are of one card, %d when they are of %d cards: a 429 of "
          "the account is taken for the card's alone, so no round stops"
          % (one[1], WATCH_S, N, spread[1], len(CARDS)))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
