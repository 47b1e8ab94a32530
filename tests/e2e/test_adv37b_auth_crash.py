#!/usr/bin/env python3
"""Adversary 37b: the authorization's worker SIGKILLed while its call is held
at psp-sim (latency 3 s: psp-sim authorizes after the worker is gone), with a
capture of 500 and a void of the same authorization queued right behind it in
the partition; a new worker and the reconciler take the redelivery. psp-sim
must show one authorization and, of the capture and the void, at most one
executed; our books must match it: the capture SUCCEEDED 500 and booked once
(the void REJECTED), or the capture REJECTED and nothing captured."""
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

ENV = {"WORKER_LEASE_MS": "5000", "PROVIDER_TIMEOUT_MS": "4000",
       "WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "500",
       "RECONCILER_POLL_MS": "200"}


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def scenario(new):
    s = new("adv37b_auth_crash", partitions=1, worker_env=ENV)
    a = e2e.new_command(amount=1800)
    a["type"] = "authorization.requested"
    cid, vid = str(uuid.uuid4()), str(uuid.uuid4())
    c = {"type": "capture.requested", "version": 1, "capture_id": cid,
         "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "capture:" + cid,
         "amount": 500}
    v = {"type": "void.requested", "version": 1, "void_id": vid,
         "payment_attempt_id": a["payment_attempt_id"], "idempotency_key": "void:" + vid,
         "reason": "duplicate"}
    s.psp_put("/faults", {"latency_ms": 3000, "rules": []})
    w = s.start_worker()
    time.sleep(2)
    produce(s, [a, c, v])
    e2e.wait_until("the authorization's call out", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])
        == [["PROCESSING"]], 30, 0.05)
    time.sleep(0.3)
    s.kill_worker(w)
    time.sleep(4)
    s.psp_put("/faults", {}, method="DELETE")
    s.start_worker()
    s.start_reconciler()

    def st(table, sid):
        r = s.query("SELECT status, coalesce(reason, '') FROM %s WHERE id = '%s'" % (table, sid))
        return r[0] if r else [None, ""]
    fin = ("SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW")
    e2e.wait_until("both steps settled", lambda: st("capture_attempts", cid)[0] in fin and
                   st("void_attempts", vid)[0] in fin, 120, 0.3)
    led = s.psp_get("/ledger")
    p = s.query("SELECT status, coalesce(captured_amount, 0), provider_payment_id FROM"
                " payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])[0]
    e2e.log("attempt", p, "capture", st("capture_attempts", cid), "void", st("void_attempts", vid))
    auths = [x for x in led["charges"] if x.get("idempotency_key") == a["idempotency_key"]]
    check_eq(len(auths), 1, "one authorization at psp-sim")
    caps = [x for x in led["captures"] if x["payment_intent_id"] == p[2]]
    cans = [x for x in led["cancels"] if x["payment_intent_id"] == p[2]]
    check(not (caps and cans), "captured and canceled: %s %s" % (caps, cans))
    booked = s.query("SELECT coalesce(sum(amount), 0) FROM ledger_entries WHERE"
                     " payment_attempt_id = '%s' AND kind = 'charge'" % a["payment_attempt_id"])
    if caps:
        check_eq((st("capture_attempts", cid)[0], p[0], p[1], booked[0][0]),
                 ("SUCCEEDED", "SUCCEEDED", "500", "500"), "captured at psp-sim: our books")
    else:
        check_eq(booked, [["0"]], "nothing captured, nothing booked")
        check(st("capture_attempts", cid)[0] != "SUCCEEDED", "no capture SUCCEEDED")
    if cans:
        check_eq((st("void_attempts", vid)[0], p[0]), ("SUCCEEDED", "VOIDED"), "voided")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
