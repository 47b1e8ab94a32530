#!/usr/bin/env python3
"""Captures (issue 37) through the worker, against real Kafka, PostgreSQL and
psp-sim, judged from psp-sim's ledger (`captures[]`, `charges[]`,
`refunds[]`: what the provider did) and our tables:

- all: an authorization captured whole, the capture delivered twice, is one
  capture at psp-sim (the amount authorized), the attempt SUCCEEDED with
  captured_amount, one ledger 'charge' row of that amount and one
  capture.succeeded with the contract's fields. A second capture of the
  same authorization (another capture_id) is REJECTED already_captured
  before any call: psp-sim still shows one capture;
- partial: a capture of part is that amount at psp-sim, the rest released;
  a refund of more than was captured is REJECTED (exceeds_charge: refunds
  are bound by the capture), psp-sim refunds nothing; a capture under the
  authorization's key, or this capture's id with another amount, is a
  dead letter idempotency_key_conflict, never sent;
- lost: psp-sim captures and drops the answer (drop_after on the capture's
  key, the worker asking no more, its call the first on its connection):
  UNKNOWN, capture.unknown, never FAILED,
  the hold kept; the reconciler's look (the capture again under its key: a
  replay) settles it SUCCEEDED, and psp-sim shows exactly one capture;
- expired: the authorization expired at psp-sim (PUT
  /authorization-expiry, waited until psp-sim shows it canceled): the
  capture is FAILED authorization_expired, the hold given back, and
  psp-sim captured nothing."""
import json
import os
import signal
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
import json_schema_check as jsc  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402


def new_authorization(**extra):
    cmd = e2e.new_command(**extra)
    cmd["type"] = "authorization.requested"
    return cmd


def new_capture(auth, amount=None):
    capture = str(uuid.uuid4())
    cmd = {"type": "capture.requested", "version": 1, "capture_id": capture,
           "payment_attempt_id": auth["payment_attempt_id"],
           "idempotency_key": "capture:" + capture, "metadata": {"shipment": "s-1"}}
    if amount is not None:
        cmd["amount"] = amount
    return cmd


def produce(s, cmds):
    for c in cmds:
        if c["type"] == "capture.requested":
            check(jsc.check(COMMAND, c), "%s: %s" % (c, jsc.errors(COMMAND, c)))
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def authorized(s, amount):
    """A new authorization of amount, AUTHORIZED at psp-sim."""
    a = new_authorization(amount=amount)
    produce(s, [a])
    e2e.wait_until("the authorization held", lambda: attempt(s, a)["status"] == "AUTHORIZED",
                   60)
    return a


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(captured_amount, 0),"
                   " coalesce(provider_payment_id, ''), coalesce(held_by_id::text, '')"
                   " FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
    if not rows:
        return {"status": None}
    return dict(zip(("status", "captured", "ppid", "held_by"), rows[0]))


def capture(s, cmd):
    rows = s.query("SELECT status, coalesce(reason, ''), coalesce(captured_amount, 0),"
                   " lease_owner IS NULL FROM capture_attempts WHERE id = '%s'"
                   % cmd["capture_id"])
    if not rows:
        return {"status": None}
    return dict(zip(("status", "reason", "captured", "unleased"), rows[0]))


def settled(s, cmd, *statuses):
    got = capture(s, cmd)
    return got["status"] in statuses and got["unleased"] == "t"


def wait_capture(s, cmd, statuses=("SUCCEEDED", "FAILED", "REJECTED", "UNKNOWN",
                                   "REQUIRES_REVIEW")):
    e2e.wait_until("capture %s settled" % cmd["capture_id"],
                   lambda: settled(s, cmd, *statuses), 60)
    return capture(s, cmd)


EVENT = jsc.load("capture-result-event.schema.json")
COMMAND = jsc.load("capture-command.schema.json")


def events(s, auth, prefix="capture."):
    """The capture events of auth's attempt, each valid by the schema."""
    for (payload,) in s.query("SELECT payload FROM outbox WHERE payment_attempt_id = '%s'"
                              " AND event_type LIKE 'capture.%%'" % auth["payment_attempt_id"]):
        ev = json.loads(payload)
        check(jsc.check(EVENT, ev), "%s: %s" % (ev, jsc.errors(EVENT, ev)))
    return sorted(r[0] for r in s.query(
        "SELECT event_type FROM outbox WHERE payment_attempt_id = '%s'"
        " AND event_type LIKE '%s%%'" % (auth["payment_attempt_id"], prefix)))


def psp_captures(s, ppid):
    return [c for c in s.psp_get("/ledger")["captures"]
            if c.get("payment_intent_id") == ppid]


def dead_letter_reasons(s):
    out = {}
    for d in s.dead_letters():
        h = dict((x[0], x[1]) for x in d["headers"])
        out.setdefault(h["dlq.reason"], set()).add(h.get("dlq.id"))
    return dict((k, len(v)) for k, v in out.items())


def ledger(s, auth):
    return s.query("SELECT kind, amount, provider_payment_id FROM ledger_entries"
                   " WHERE payment_attempt_id = '%s'" % auth["payment_attempt_id"])


def all_of_it(new):
    s = new("capture_all", partitions=3)
    s.start_worker()
    a = authorized(s, 2500)
    c = new_capture(a)
    produce(s, [c, c])
    got = wait_capture(s, c)
    check_eq((got["status"], got["captured"]), ("SUCCEEDED", "2500"), "the capture")
    auth = attempt(s, a)
    check_eq((auth["status"], auth["captured"], auth["held_by"]), ("SUCCEEDED", "2500", ""),
             "the authorization captured, its hold spent")
    rows = psp_captures(s, auth["ppid"])
    check_eq(len(rows), 1, "one capture at psp-sim")
    check_eq((rows[0]["amount"], rows[0]["idempotency_key"]), (2500, c["idempotency_key"]),
             "psp-sim captured all, under the capture's key")
    check_eq(ledger(s, a), [["charge", "2500", auth["ppid"]]], "one ledger charge row")
    check_eq(events(s, a), ["capture.succeeded"], "one capture.succeeded")
    payload = json.loads(s.query("SELECT payload FROM outbox WHERE event_type ="
                                 " 'capture.succeeded' AND payment_attempt_id = '%s'"
                                 % a["payment_attempt_id"])[0][0])
    for k in ("event_id", "capture_id", "payment_attempt_id", "order_id", "amount",
              "currency", "provider_payment_id", "occurred_at"):
        check(k in payload, "the event carries %s: %s" % (k, payload))
    check_eq((payload["capture_id"], payload["amount"], payload["provider_payment_id"]),
             (c["capture_id"], 2500, auth["ppid"]), "the event's fields")
    check("reason" not in payload, "a success has no reason: %s" % payload)

    # Redelivered once settled, and a second capture of the authorization.
    second = new_capture(a, 100)
    produce(s, [c, second])
    got2 = wait_capture(s, second)
    check_eq(got2["status"], "REJECTED", "a second capture of one authorization")
    check(got2["reason"].startswith("already_captured"), "its reason: %r" % got2["reason"])
    e2e.wait_until("the redelivery consumed", lambda: s.lag()["lag"] == 0, 60)
    check_eq(len(psp_captures(s, auth["ppid"])), 1, "psp-sim still one capture")
    check_eq(events(s, a), ["capture.rejected", "capture.succeeded"],
             "no second success; the rejection published")
    check_eq(s.query("SELECT count(*) FROM provider_calls WHERE capture_id = '%s'"
                     % c["capture_id"]), [["1"]], "one provider call for the capture")


def partial(new):
    s = new("capture_partial", partitions=1)
    s.start_worker()
    a = authorized(s, 2000)
    c = new_capture(a, 600)
    produce(s, [c])
    got = wait_capture(s, c)
    check_eq((got["status"], got["captured"]), ("SUCCEEDED", "600"), "the partial capture")
    auth = attempt(s, a)
    check_eq((auth["status"], auth["captured"]), ("SUCCEEDED", "600"), "captured 600")
    rows = psp_captures(s, auth["ppid"])
    check_eq(len(rows), 1, "one capture at psp-sim")
    check_eq((rows[0]["amount"], rows[0].get("amount_released")), (600, 1400),
             "psp-sim captured 600 and released the rest")
    check_eq(ledger(s, a), [["charge", "600", auth["ppid"]]], "booked what was captured")

    over = e2e.new_refund(a, 1000)
    s.publish([over])
    e2e.wait_until("the refund settled", lambda: s.query(
        "SELECT status FROM refund_attempts WHERE id = '%s'" % over["refund_id"])
        in ([["REJECTED"]], [["SUCCEEDED"]], [["FAILED"]]), 60)
    row = s.query("SELECT status, reason FROM refund_attempts WHERE id = '%s'"
                  % over["refund_id"])[0]
    check_eq(row[0], "REJECTED", "a refund of more than was captured")
    check(row[1].startswith("exceeds_charge"), "its reason: %r" % row[1])
    check_eq(s.psp_get("/ledger")["refunds"], [], "psp-sim refunded nothing")

    # Keys and ids reused: the authorization's key, and this capture's id
    # with another amount, are conflicts (dead letters), never sent.
    stolen = dict(new_capture(a, 100), idempotency_key=a["idempotency_key"])
    changed = dict(c, amount=700)
    produce(s, [stolen, changed])
    e2e.wait_until("the conflicts dead-lettered",
                   lambda: dead_letter_reasons(s).get("idempotency_key_conflict") == 2, 60)
    check_eq(capture(s, stolen)["status"], None, "the stolen key recorded nothing")
    check_eq(capture(s, c)["captured"], "600", "the first capture untouched")
    check_eq(len(psp_captures(s, auth["ppid"])), 1, "psp-sim still one capture")


def lost(new):
    s = new("capture_lost", partitions=1, worker_env={
        "WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200"})
    w = s.start_worker()
    a = authorized(s, 1500)
    # A worker of its own for the capture: its call is the first on a new
    # connection, so the HTTP client does not send it again itself (it does
    # on a pooled connection closed unanswered, and psp-sim's replay would
    # then answer it): the answer is lost for good.
    s.kill_worker(w, signal.SIGTERM)
    s.start_worker()
    c = new_capture(a)
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": c["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [c])
    got = wait_capture(s, c)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(got["status"], "UNKNOWN", "a lost answer (never FAILED)")
    check(got["reason"].startswith("outcome_unknown"), "its reason: %r" % got["reason"])
    auth = attempt(s, a)
    check_eq((auth["status"], auth["held_by"]), ("AUTHORIZED", c["capture_id"]),
             "the hold kept while in doubt")
    check_eq(events(s, a), ["capture.unknown"], "one capture.unknown")
    check_eq(len(psp_captures(s, auth["ppid"])), 1, "psp-sim executed it")
    check_eq(ledger(s, a), [], "nothing booked in doubt")

    s.start_reconciler()
    got = wait_capture(s, c, ("SUCCEEDED", "FAILED", "REQUIRES_REVIEW"))
    check_eq((got["status"], got["captured"]), ("SUCCEEDED", "1500"),
             "settled on psp-sim's evidence")
    auth = attempt(s, a)
    check_eq((auth["status"], auth["captured"]), ("SUCCEEDED", "1500"), "captured")
    check_eq(len(psp_captures(s, auth["ppid"])), 1, "psp-sim shows exactly one capture")
    check_eq(ledger(s, a), [["charge", "1500", auth["ppid"]]], "booked once")
    check_eq(events(s, a), ["capture.succeeded", "capture.unknown"], "then capture.succeeded")


def expired(new):
    s = new("capture_expired", partitions=1)
    s.start_worker()
    a = authorized(s, 900)
    ppid = attempt(s, a)["ppid"]
    s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 1})

    def canceled():
        rows = [r for r in s.psp_get("/ledger")["charges"] if r.get("payment_intent_id",
                                                                  r.get("id")) == ppid]
        return bool(rows) and rows[0].get("outcome") == "canceled"
    e2e.wait_until("psp-sim shows the authorization canceled", canceled, 30)
    c = new_capture(a)
    produce(s, [c])
    got = wait_capture(s, c)
    check_eq(got["status"], "FAILED", "a capture after expiry")
    check(got["reason"].startswith("authorization_expired"), "its reason: %r" % got["reason"])
    check_eq(attempt(s, a)["held_by"], "", "the hold given back")
    check_eq(psp_captures(s, ppid), [], "psp-sim captured nothing")
    check_eq(events(s, a), ["capture.failed"], "one capture.failed")
    check_eq(ledger(s, a), [], "nothing booked")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([all_of_it, partial, lost, expired])))
