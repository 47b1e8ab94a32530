#!/usr/bin/env python3
"""Adversary 37b: a refund published right behind its capture.

The order service captures 800 of an authorization of 2000 at shipment and,
the customer returning part of it at once, refunds 300: two commands on the
commands topic, keyed by the authorization's payment_attempt_id, so one
partition, in order. psp-sim holds the capture's call 1.5 s (latency), so the
refund reaches its claim while the capture is in flight (the authorization
AUTHORIZED, held by the capture; or, in one batch, the capture recorded and
not yet claimed: a batch's refunds claim first).

docs/messages.md ("Refund command"): a refund that reaches the claim while a
capture is still to take its authorization (recorded, in flight, UNKNOWN)
waits for it, as one behind its charge waits; once captured, "Refunds are
then bound by the amount captured". Once (adversary 37b) the refund was
REJECTED `not_refundable: payment attempt ... is AUTHORIZED` at once, though
the capture it followed then SUCCEEDED with 800.

Checked here, with no sleeps (each step waits for its condition):
- a refund of an authorization that nothing captures is REJECTED at once,
  `not_refundable ... is AUTHORIZED (nothing captured)`;
- capture then refund: when the capture is seen in flight, the refund is
  still PENDING (its claim ran and waited); the capture SUCCEEDS 800, then
  the refund SUCCEEDS: 300 refunded at psp-sim, one refund ledger row;
- void then refund of another authorization: the refund is REJECTED
  not_refundable (nothing a capture could take comes before it), psp-sim
  refunds nothing of it."""
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def status(s, table, sid):
    rows = s.query("SELECT status, coalesce(reason, '') FROM %s WHERE id = '%s'" % (table, sid))
    return rows[0] if rows else [None, ""]


def authorize(s, amounts):
    cmds = []
    for amount in amounts:
        a = e2e.new_command(amount=amount)
        a["type"] = "authorization.requested"
        cmds.append(a)
    produce(s, cmds)
    for a in cmds:
        e2e.wait_until("the authorization held", lambda: s.query(
            "SELECT status FROM payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])
            == [["AUTHORIZED"]], 60)
    return cmds


def settled(s, table, sid):
    return status(s, table, sid)[0] in ("SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW")


def scenario(new):
    s = new("adv37b_refund_behind", partitions=1)
    s.start_worker()
    a, b = authorize(s, [2000, 1500])

    # Nothing captured, nothing to wait for: refused at once.
    r0 = e2e.new_refund(a, 100)
    produce(s, [r0])
    e2e.wait_until("the refund of nothing captured settled",
                   lambda: settled(s, "refund_attempts", r0["refund_id"]), 30)
    got = status(s, "refund_attempts", r0["refund_id"])
    check_eq(got, ["REJECTED", "not_refundable: payment attempt %s is AUTHORIZED (nothing "
                   "captured)" % a["payment_attempt_id"]], "a refund before any capture")

    s.psp_put("/faults", {"latency_ms": 1500, "rules": []})
    cid = str(uuid.uuid4())
    c = {"type": "capture.requested", "version": 1, "capture_id": cid,
         "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "capture:" + cid,
         "amount": 800}
    r = e2e.new_refund(a, 300)
    produce(s, [c, r])
    e2e.wait_until("the capture in flight", lambda: status(s, "capture_attempts", cid)[0]
                   not in (None, "PENDING"), 30, interval=0.05)
    got = status(s, "refund_attempts", r["refund_id"])
    check_eq(got[0], "PENDING", "the refund while its capture is in flight (%s)" % got[1])
    e2e.wait_until("the capture and the refund settled", lambda:
                   settled(s, "capture_attempts", cid)
                   and settled(s, "refund_attempts", r["refund_id"]), 60)
    check_eq(status(s, "capture_attempts", cid)[0], "SUCCEEDED", "the capture of 800")
    got = status(s, "refund_attempts", r["refund_id"])
    check_eq(got[0], "SUCCEEDED",
             "the refund of 300 published right behind its capture (%s)" % got[1])

    # Behind a void: nothing a capture could take comes before the refund.
    v = {"type": "void.requested", "version": 1, "void_id": str(uuid.uuid4()),
         "payment_attempt_id": b["payment_attempt_id"],
         "idempotency_key": "void-" + uuid.uuid4().hex, "reason": "requested_by_customer"}
    rv = e2e.new_refund(b, 200)
    produce(s, [v, rv])
    e2e.wait_until("the void and its refund settled", lambda:
                   settled(s, "void_attempts", v["void_id"])
                   and settled(s, "refund_attempts", rv["refund_id"]), 60)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(status(s, "void_attempts", v["void_id"])[0], "SUCCEEDED", "the void")
    got = status(s, "refund_attempts", rv["refund_id"])
    check(got[0] == "REJECTED" and got[1].startswith(
        "not_refundable: payment attempt %s is " % b["payment_attempt_id"]),
        "the refund behind a void is refused: %s" % got)
    check_eq([x["amount"] for x in s.psp_get("/ledger")["refunds"]], [300],
             "psp-sim refunded 300, of the capture only")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE kind = 'refund'"), [["1"]],
             "one refund booked")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
