#!/usr/bin/env python3
"""Adversary 37b: a refund published right behind its capture.

The order service captures 800 of an authorization of 2000 at shipment and,
the customer returning part of it at once, refunds 300: two commands on the
commands topic, keyed by the authorization's payment_attempt_id, so one
partition, in order. psp-sim holds the capture's call 1.5 s (latency), so the
refund reaches its claim while the capture is in flight (the authorization
AUTHORIZED, held by the capture).

docs/messages.md ("Refund command"): a refund that reaches the claim while
its charge is still PENDING or PROCESSING "(published right behind it) waits
for the charge to settle ... instead of being rejected for it"; and ("Capture
command") once captured, "Refunds are then bound by the amount captured".
Today the refund is REJECTED `not_refundable: payment attempt ... is
AUTHORIZED` at once, though the capture it follows then SUCCEEDS with 800:
the refund's claim waits only on PENDING/PROCESSING attempts, not on a capture
that holds the authorization. No money moves wrongly (psp-sim refunds
nothing), but a valid refund, sent in order, is refused for good (a REJECTED
refund stays so). This test expects the refund to wait for the capture and
succeed: 300 refunded at psp-sim, one refund ledger row."""
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check_eq  # noqa: E402


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def status(s, table, sid):
    rows = s.query("SELECT status, coalesce(reason, '') FROM %s WHERE id = '%s'" % (table, sid))
    return rows[0] if rows else [None, ""]


def scenario(new):
    s = new("adv37b_refund_behind", partitions=1)
    s.start_worker()
    a = e2e.new_command(amount=2000)
    a["type"] = "authorization.requested"
    produce(s, [a])
    e2e.wait_until("the authorization held", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])
        == [["AUTHORIZED"]], 60)
    s.psp_put("/faults", {"latency_ms": 1500, "rules": []})
    cid = str(uuid.uuid4())
    c = {"type": "capture.requested", "version": 1, "capture_id": cid,
         "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "capture:" + cid,
         "amount": 800}
    r = e2e.new_refund(a, 300)
    produce(s, [c, r])
    e2e.wait_until("the capture and the refund settled", lambda:
                   status(s, "capture_attempts", cid)[0] in ("SUCCEEDED", "FAILED",
                                                             "REQUIRES_REVIEW")
                   and status(s, "refund_attempts", r["refund_id"])[0] in (
                       "SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW"), 60)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(status(s, "capture_attempts", cid)[0], "SUCCEEDED", "the capture of 800")
    got = status(s, "refund_attempts", r["refund_id"])
    check_eq(got[0], "SUCCEEDED",
             "the refund of 300 published right behind its capture (%s)" % got[1])
    check_eq([x["amount"] for x in s.psp_get("/ledger")["refunds"]], [300],
             "psp-sim refunded 300")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
