#!/usr/bin/env python3
"""Adversary 37c: a refund behind a capture that a person must look at.

Another client of the account captures 1 cent of our authorization's intent
(2000). The order service then captures all of it: psp-sim refuses our call
(the intent is captured already), so the capture is REQUIRES_REVIEW
`captured, not under this key`, keeping the hold (docs/messages.md "Whose
capture is it?"). No capture of ours is still to take the money: a person
decides (chargectl capture resolve), however long that takes.

docs/messages.md ("Refund command"): "A refund of an authorization waits
the same way while a capture is still to take it: a capture recorded and
not yet claimed, or one holding the authorization (its call in flight, or
UNKNOWN ...). A refund of an authorization that no capture is to take is
not_refundable at once". The refund claim (refund_store.c SQL_CLAIM) waits
on `held_by = 'capture'` whatever the capture's status: a refund published
then waits for the five minutes of REFUND_ORDER_WINDOW for a capture in
review. Behind it in the same partition (one partition here, as any two
orders sharing one), another order's authorization and a capture of it: the
test requires them to settle in good time, and the refund to be decided
(REJECTED not_refundable) at once.

Fails today (refund_decided): the refund stays PENDING (until the five
minutes pass, then not_refundable), though nothing of ours is to capture;
no money moves wrongly. Scenario blocked passes today: the commands behind
the waiting refund in its partition are not held up by it (kept as a
guard)."""
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
import charged_other_client as other  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

SETTLE_S = 30


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def status(s, table, sid):
    rows = s.query("SELECT status, coalesce(reason, '') FROM %s WHERE id = '%s'" % (table, sid))
    return rows[0] if rows else [None, ""]


def attempt(s, a):
    rows = s.query("SELECT status, coalesce(provider_payment_id, ''), coalesce(held_by, '')"
                   " FROM payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])
    return rows[0] if rows else [None, "", ""]


def new_authorization(amount):
    a = e2e.new_command(amount=amount)
    a["type"] = "authorization.requested"
    return a


def new_capture(a, amount=None):
    cid = str(uuid.uuid4())
    c = {"type": "capture.requested", "version": 1, "capture_id": cid,
         "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "capture:" + cid}
    if amount is not None:
        c["amount"] = amount
    return c


def settled(s, table, sid):
    return status(s, table, sid)[0] in ("SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW")


def in_review(s):
    """An authorization whose capture is REQUIRES_REVIEW, holding it."""
    a = new_authorization(2000)
    produce(s, [a])
    e2e.wait_until("the authorization held", lambda: attempt(s, a)[0] == "AUTHORIZED", 60)
    pi = attempt(s, a)[1]
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % pi, {"amount_to_capture": 1})
    check_eq((st, doc.get("status")), (200, "succeeded"), "another client's 1-cent capture")
    c = new_capture(a)
    produce(s, [c])
    e2e.wait_until("our capture settled", lambda: settled(s, "capture_attempts",
                                                          c["capture_id"]), 60)
    got = status(s, "capture_attempts", c["capture_id"])
    check(got[0] == "REQUIRES_REVIEW" and "not under this key" in got[1],
          "our capture of all, refused as captured already: %s" % got)
    check_eq(attempt(s, a)[2], "capture", "the capture in review keeps the hold")
    return a, c


def refund_decided(new):
    """The refund behind a capture in review is decided at once."""
    s = new("adv37c_refund_review", partitions=1)
    s.start_worker()
    a, _ = in_review(s)
    r = e2e.new_refund(a, 100)
    t0 = time.monotonic()
    produce(s, [r])
    e2e.wait_until("the refund decided", lambda: settled(s, "refund_attempts", r["refund_id"]),
                   SETTLE_S)
    e2e.log("refund decided after %.1fs: %s" % (time.monotonic() - t0,
                                                status(s, "refund_attempts", r["refund_id"])))
    got = status(s, "refund_attempts", r["refund_id"])
    check(got[0] == "REJECTED" and got[1].startswith("not_refundable"),
          "a refund of an authorization no capture is to take: %s" % got)
    check_eq(s.psp_get("/ledger")["refunds"], [], "psp-sim refunded nothing")


def blocked(new):
    """Commands of other orders behind that refund in the partition."""
    s = new("adv37c_refund_review_hol", partitions=1)
    s.start_worker()
    a, _ = in_review(s)
    b = new_authorization(700)
    r = e2e.new_refund(a, 100)
    t0 = time.monotonic()
    produce(s, [r, b])
    e2e.wait_until("another order's authorization behind the refund held",
                   lambda: attempt(s, b)[0] == "AUTHORIZED", SETTLE_S)
    e2e.log("b held after %.1fs" % (time.monotonic() - t0))
    cb = new_capture(b)
    produce(s, [cb])
    e2e.wait_until("its capture settled", lambda: settled(s, "capture_attempts",
                                                          cb["capture_id"]), SETTLE_S)
    check_eq(status(s, "capture_attempts", cb["capture_id"])[0], "SUCCEEDED", "b captured")
    e2e.log("refund of a:", status(s, "refund_attempts", r["refund_id"]))


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([refund_decided, blocked])))
