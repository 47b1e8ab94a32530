#!/usr/bin/env python3
"""Adversary 37b: two workers on one capture (or void) message. The first
worker's call is held in flight at psp-sim (latency 6 s) and the worker is
SIGSTOPped; its lease (9 s) expires and a second worker, given the message
again (the first one's session timed out of the group), takes the step over
and sends it under the same key; then the first worker is SIGCONTinued with
its own answer in hand. psp-sim must show one capture (one cancel), our books
one booking, one success event; the step SUCCEEDED."""
import json
import os
import signal
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check_eq  # noqa: E402

ENV = {"WORKER_LEASE_MS": "9000", "PROVIDER_TIMEOUT_MS": "8000",
       "WORKER_UNKNOWN_RETRIES": "0", "WORKER_RETRY_MAX_MS": "200",
       "RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200"}


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def attempt(s, a):
    rows = s.query("SELECT status, coalesce(captured_amount, 0), provider_payment_id"
                   " FROM payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])
    return rows[0] if rows else [None, None, None]


def run(new, kind):
    s = new("adv37b_two_" + kind, partitions=1)
    w = s.start_worker()
    a = e2e.new_command(amount=2400)
    a["type"] = "authorization.requested"
    produce(s, [a])
    e2e.wait_until("held", lambda: attempt(s, a)[0] == "AUTHORIZED", 60)
    s.kill_worker(w)
    ppid = attempt(s, a)[2]
    sid = str(uuid.uuid4())
    if kind == "capture":
        cmd = {"type": "capture.requested", "version": 1, "capture_id": sid,
               "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "capture:" + sid,
               "amount": 900}
        table = "capture_attempts"
    else:
        cmd = {"type": "void.requested", "version": 1, "void_id": sid,
               "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "void:" + sid,
               "reason": "abandoned"}
        table = "void_attempts"
    s.psp_put("/faults", {"latency_ms": 6000, "rules": []})
    first = s.start_worker(**ENV)
    time.sleep(3)
    produce(s, [cmd])
    e2e.wait_until("the first worker's call out", lambda: s.query(
        "SELECT status FROM %s WHERE id = '%s'" % (table, sid)) == [["PROCESSING"]], 30, 0.05)
    time.sleep(0.5)
    s.workers[first].send_signal(signal.SIGSTOP)
    second = s.start_worker(**ENV)
    s.start_reconciler(**ENV)
    e2e.wait_until("taken over", lambda: s.query(
        "SELECT count(*) FROM %s WHERE id = '%s' AND lease_epoch > 1" % (table, sid))
        != [["0"]], 60, 0.1)
    time.sleep(8)
    s.psp_put("/faults", {}, method="DELETE")
    s.workers[first].send_signal(signal.SIGCONT)
    e2e.wait_until("settled", lambda: s.query(
        "SELECT status FROM %s WHERE id = '%s' AND lease_owner IS NULL" % (table, sid))
        in ([["SUCCEEDED"]], [["FAILED"]], [["REQUIRES_REVIEW"]]), 90, 0.2)
    time.sleep(4)
    led = s.psp_get("/ledger")
    got = s.query("SELECT status, coalesce(reason, '') FROM %s WHERE id = '%s'" % (table, sid))[0]
    e2e.log("transitions", s.query("SELECT old_status, new_status, cause, actor, left(coalesce("
                                   "reason, ''), 60) FROM %s WHERE %s = '%s' ORDER BY id"
                                   % (table.replace("attempts", "transitions"),
                                      kind + "_id", sid)))
    if kind == "capture":
        check_eq(len([c for c in led["captures"] if c["payment_intent_id"] == ppid]), 1,
                 "psp-sim: one capture")
        check_eq(got[0], "SUCCEEDED", "the capture (%s)" % got[1])
        check_eq(attempt(s, a)[:2], ["SUCCEEDED", "900"], "the authorization")
        check_eq(s.query("SELECT kind, amount FROM ledger_entries WHERE payment_attempt_id = '%s'"
                         % a["payment_attempt_id"]), [["charge", "900"]], "booked once")
        ev = "capture.%"
    else:
        check_eq(len([c for c in led["cancels"] if c["payment_intent_id"] == ppid]), 1,
                 "psp-sim: one cancel")
        check_eq(got[0], "SUCCEEDED", "the void (%s)" % got[1])
        check_eq(attempt(s, a)[0], "VOIDED", "the authorization")
        ev = "void.%"
    check_eq(s.query("SELECT event_type, count(*) FROM outbox WHERE payment_attempt_id = '%s'"
                     " AND event_type LIKE '%s' GROUP BY 1" % (a["payment_attempt_id"], ev)),
             [[kind + ".succeeded", "1"]], "one success event, nothing else")


def capture(new):
    run(new, "capture")


def void(new):
    run(new, "void")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([capture, void])))
