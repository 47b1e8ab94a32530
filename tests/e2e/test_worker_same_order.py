#!/usr/bin/env python3
"""The same order paid twice at once (phone and laptop: two attempts, two
keys), for many orders, with two workers: each order is charged once; the
other attempt is REJECTED with its reason before any provider call; both
attempts have their result event in the outbox. And a key re-sent with
another amount is a dead letter idempotency_key_conflict that leaves the
first attempt unchanged."""
import charged_e2e as e2e
from charged_e2e import check, check_eq

ORDERS = 50


def same_order(s):
    pairs = []
    for _ in range(ORDERS):
        a = e2e.new_command(amount=1500)
        b = e2e.new_command(order_id=a["order_id"], amount=1500)
        pairs.append((a, b))
    s.publish([c for p in pairs for c in p])
    s.wait_settled(2 * ORDERS, timeout=180)
    s.check_invariants()
    for a, b in pairs:
        rows = s.query("SELECT id, status, coalesce(reason, '') FROM payment_attempts "
                       "WHERE order_id = '%s' ORDER BY status" % a["order_id"])
        statuses = sorted(r[1] for r in rows)
        check_eq(statuses, ["REJECTED", "SUCCEEDED"],
                 "statuses of order %s's two attempts (%s)" % (a["order_id"], rows))
        rejected = [r for r in rows if r[1] == "REJECTED"][0]
        check(rejected[2].startswith(("order_has_live_attempt", "order_already_paid")),
              "the REJECTED attempt's reason names neither the live attempt nor the paid "
              "order: %s" % rejected)
        charges = [c for c in s.ledger() if c["order_id"] == a["order_id"]]
        check(len(charges) == 1, "order %s charged %d times, want once: %s" % (
            a["order_id"], len(charges), charges))
        check(charges[0]["payment_attempt_id"] != rejected[0],
              "the rejected attempt %s was charged" % rejected[0])
        events = s.query("SELECT payment_attempt_id, event_type FROM outbox "
                         "WHERE payment_attempt_id IN ('%s', '%s')" %
                         (a["payment_attempt_id"], b["payment_attempt_id"]))
        types = sorted(e[1] for e in events)
        check_eq(types, ["charge.rejected", "charge.succeeded"],
                 "result events of order %s (%s)" % (a["order_id"], events))


def key_conflict(s):
    first = e2e.new_command(amount=2500)
    s.publish([first])
    s.wait_settled(1, timeout=120)
    other = dict(first, amount=9900)
    s.publish([other])
    letters = e2e.wait_until("the conflict's dead letter", lambda: [
        d for d in s.dead_letters()
        if dict((h[0], h[1]) for h in d["headers"]).get("dlq.reason") == "idempotency_key_conflict"
    ], 60)
    check(len(letters) == 1, "want one idempotency_key_conflict dead letter, got %d: %s" % (
        len(letters), letters))
    s.wait_settled(1, timeout=60)
    rows = s.query("SELECT amount, status FROM payment_attempts WHERE id = '%s'" %
                   first["payment_attempt_id"])
    check_eq(rows, [["2500", "SUCCEEDED"]], "the first attempt after the conflicting resend")
    charges = [c for c in s.ledger() if c["idempotency_key"] == first["idempotency_key"]]
    check(len(charges) == 1 and charges[0]["amount"] == 2500,
          "want one charge of 2500 under the key: %s" % charges)


def scenario(new):
    s = new("same_order")
    s.start_worker()
    s.start_worker()
    same_order(s)
    key_conflict(s)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
