#!/usr/bin/env python3
"""A conflicting resend in the same batch as its original.

One payment_attempt_id, two messages published before any worker runs, so
that one fetch and one record batch hold both: the original (key K, amount
1000) and a resend of the same attempt under key K:other for 2000. The
provider executes the original's charge and then holds its answer; while
that call is in flight the test makes the attempt's lease expire. The resend
must never be charged: it is a dead letter idempotency_key_conflict, the
provider holds one charge for the attempt (the stored row's key and amount),
and the attempt ends SUCCEEDED with that charge's id."""
import json

import charged_e2e as e2e
from charged_e2e import check, check_eq

STALL_MS = 4000
ENV = {
    # The held answer (4 s) ends before the call's timeout: the provider hangs
    # up, the worker retries the same key and gets the replay.
    "PROVIDER_TIMEOUT_MS": 8000,
    "WORKER_LEASE_MS": 40000,  # > 8000 * (3 + 1) + 500 * 3
}


def headers(d):
    return dict((h[0], h[1]) for h in d["headers"])


def scenario(new):
    s = new("conflict_in_batch")
    original = e2e.new_command(amount=1000)
    aid, key = original["payment_attempt_id"], original["idempotency_key"]
    resend = dict(original, idempotency_key=key + ":other", amount=2000)
    s.psp_put("/faults", {"stall_ms": STALL_MS, "rules": [
        {"kind": "stall_after", "key": key, "probability": 1, "times": 1}]})
    s.publish([original, resend])  # keyed by the attempt: one partition, in order
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["commands"]).splitlines() if l]
    check(len(msgs) == 2 and msgs[0]["partition"] == msgs[1]["partition"],
          "want both messages on one partition: %s" % msgs)
    offset_of = dict((json.loads(m["value"])["idempotency_key"], m["offset"]) for m in msgs)
    s.start_worker(**ENV)

    def in_flight():
        rows = s.query("SELECT status, lease_owner IS NOT NULL FROM payment_attempts "
                       "WHERE id = '%s'" % aid)
        charged = [c for c in s.ledger() if c["payment_attempt_id"] == aid]
        return rows == [["PROCESSING", "t"]] and charged
    e2e.wait_until("the original's call executed and its answer held", in_flight, 30, 0.05)
    expired = s.query("UPDATE payment_attempts SET lease_expires_at = now() - interval '1 second' "
                      "WHERE id = '%s' AND status = 'PROCESSING' RETURNING lease_epoch" % aid)
    check(expired, "the attempt was no longer PROCESSING when its lease was to expire")
    e2e.log("lease of", aid, "expired by the test while its call is held; epoch", expired[0][0])

    s.wait_settled(1, timeout=60)

    stored = s.query("SELECT idempotency_key, amount, status, coalesce(provider_payment_id, '') "
                     "FROM payment_attempts WHERE id = '%s'" % aid)
    check(len(stored) == 1, "want one stored row for attempt %s: %s" % (aid, stored))
    stored_key, stored_amount, status, ppid = stored[0]
    stored_amount = int(stored_amount)
    check((stored_key, stored_amount) in ((key, 1000), (key + ":other", 2000)),
          "the stored row is neither message (key and amount): %s" % stored)
    other = resend if stored_key == key else original
    e2e.log("stored row: key", stored_key, "amount", stored_amount, "status", status)

    charges = [c for c in s.ledger() if c["payment_attempt_id"] == aid or
               c["idempotency_key"] in (key, key + ":other")]
    e2e.log("provider charges for the attempt:",
            [(c["idempotency_key"], c["amount"], c["payment_intent_id"]) for c in charges])
    check(len(charges) <= 1,
          "the provider charged attempt %s %d times: %s" % (
              aid, len(charges), [(c["idempotency_key"], c["amount"]) for c in charges]))
    check(not [c for c in charges if c["idempotency_key"] == other["idempotency_key"]],
          "the conflicting message (key %s) was charged" % other["idempotency_key"])
    for c in charges:
        check(c["idempotency_key"] == stored_key and int(c["amount"]) == stored_amount,
              "charge %s does not match the stored row (%s, %d)" % (c, stored_key, stored_amount))

    letters = s.dead_letters()
    conflicts = [d for d in letters
                 if headers(d).get("dlq.reason") == "idempotency_key_conflict"]
    check(len(conflicts) == 1 and len(letters) == 1,
          "want exactly one dead letter, idempotency_key_conflict, for the resend; got %s" %
          [(headers(d).get("dlq.reason"), d["value"]) for d in letters])
    d = conflicts[0]
    check(json.loads(d["value"]) == other,
          "the dead letter is not the message that conflicts with the stored row: %s" % d["value"])
    h = headers(d)
    check_eq(h.get("dlq.original.offset"), str(offset_of[other["idempotency_key"]]),
             "dlq.original.offset of the dead letter (headers %s)" % h)
    check_eq(d["key"], aid, "the dead letter's Kafka key")

    check(status == "SUCCEEDED", "the attempt ended %s" % status)
    check(len(charges) == 1 and ppid == charges[0]["payment_intent_id"],
          "the attempt's provider_payment_id %r is not its one charge %s" % (ppid, charges))
    lag = s.lag()
    check_eq(lag["lag"], 0, "lag of the group (%s)" % lag)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
