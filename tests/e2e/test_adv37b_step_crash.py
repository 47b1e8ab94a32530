#!/usr/bin/env python3
"""Adversary 37b: a capture's or a void's worker SIGKILLed between the
provider's answer and the persist (failpoints after_capture, after_void),
with the other step of the same authorization queued behind it, a second
worker taking the redelivery and a reconciler running beside it. Judged from
psp-sim's ledger (captures[], cancels[]) and our tables:

- capture_crash: the authorization of 2000 captured 600, the worker killed
  before persisting; a void of it produced behind the capture. Whatever the
  redelivery, the reconciler and the void do: psp-sim shows one capture of
  600 and no cancel; the capture SUCCEEDED 600, the authorization SUCCEEDED
  captured 600, one ledger charge row of 600, one capture.succeeded; the
  void REJECTED void_after_capture (or authorization_held) and never sent;
- void_crash: the void executed at psp-sim, the worker killed before
  persisting; a capture produced behind it. psp-sim shows one cancel and no
  capture; the void SUCCEEDED, the attempt VOIDED; the capture REJECTED
  (capture_after_void or authorization_held) and never sent, nothing booked."""
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

FAST = {"RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200",
        "WORKER_LEASE_MS": "10000"}


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(captured_amount, 0),"
                   " coalesce(provider_payment_id, ''), coalesce(held_by_id::text, ''),"
                   " coalesce(reason, '') FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"])
    if not rows:
        return {"status": None}
    return dict(zip(("status", "captured", "ppid", "held_by", "reason"), rows[0]))


def authorized(s, amount):
    cmd = e2e.new_command(amount=amount)
    cmd["type"] = "authorization.requested"
    produce(s, [cmd])
    e2e.wait_until("the authorization held",
                   lambda: attempt(s, cmd)["status"] == "AUTHORIZED", 60)
    return cmd


def new_capture(auth, amount=None):
    cid = str(uuid.uuid4())
    cmd = {"type": "capture.requested", "version": 1, "capture_id": cid,
           "payment_attempt_id": auth["payment_attempt_id"],
           "idempotency_key": "capture:" + cid}
    if amount is not None:
        cmd["amount"] = amount
    return cmd


def new_void(auth):
    vid = str(uuid.uuid4())
    return {"type": "void.requested", "version": 1, "void_id": vid,
            "payment_attempt_id": auth["payment_attempt_id"],
            "idempotency_key": "void:" + vid, "reason": "requested_by_customer"}


def step(s, table, sid):
    rows = s.query("SELECT status, coalesce(reason, ''), lease_owner IS NULL FROM %s"
                   " WHERE id = '%s'" % (table, sid))
    if not rows:
        return {"status": None, "reason": "", "free": "t"}
    return dict(zip(("status", "reason", "free"), rows[0]))


def final(s, table, sid):
    got = step(s, table, sid)
    return got["status"] in ("SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW") \
        and got["free"] == "t"


def ledger_rows(s, key, ppid):
    return [r for r in s.psp_get("/ledger")[key] if r.get("payment_intent_id") == ppid]


def die_at(s, point):
    w = s.start_worker(CHARGED_FAILPOINT=point, WORKER_MAX_IN_FLIGHT=1)
    return w


def wait_dead(s, w, point):
    rc = s.wait_worker_exit(w, 60)
    check(rc == -9, "the worker was to die by SIGKILL at %s, exited %s" % (point, rc))
    check(s.worker_log(w, "failpoint reached"), "the worker did not reach %s" % point)


def capture_crash(new):
    s = new("adv37b_capture_crash", partitions=1, worker_env=FAST)
    w = s.start_worker()
    a = authorized(s, 2000)
    s.kill_worker(w)
    c = new_capture(a, 600)
    v = new_void(a)
    point = os.environ.get("ADV37B_CPOINT", "after_capture")
    dying = die_at(s, point)
    produce(s, [c, v])
    wait_dead(s, dying, point)
    ppid = attempt(s, a)["ppid"]
    check_eq(len(ledger_rows(s, "captures", ppid)), 0 if point == "after_claim" else 1,
             "psp-sim captured before the kill")
    s.start_reconciler()
    s.start_worker()
    s.start_worker()
    e2e.wait_until("the capture settled", lambda: final(s, "capture_attempts", c["capture_id"]),
                   90)
    e2e.wait_until("the void settled", lambda: final(s, "void_attempts", v["void_id"]), 90)
    got = step(s, "capture_attempts", c["capture_id"])
    check_eq(got["status"], "SUCCEEDED", "the capture (%s)" % got["reason"])
    auth = attempt(s, a)
    check_eq((auth["status"], auth["captured"]), ("SUCCEEDED", "600"), "the authorization")
    caps = ledger_rows(s, "captures", ppid)
    check_eq([(r["amount"], r["idempotency_key"]) for r in caps],
             [(600, c["idempotency_key"])], "psp-sim: one capture of 600 under its key")
    check_eq(ledger_rows(s, "cancels", ppid), [], "psp-sim canceled nothing")
    vd = step(s, "void_attempts", v["void_id"])
    check_eq(vd["status"], "REJECTED", "the void behind the capture (%s)" % vd["reason"])
    check(vd["reason"].split(":")[0] in ("void_after_capture", "authorization_held"),
          "its reason: %r" % vd["reason"])
    check_eq(s.query("SELECT kind, amount FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["charge", "600"]], "booked once, 600")
    check_eq(s.query("SELECT event_type, count(*) FROM outbox WHERE payment_attempt_id = '%s'"
                     " AND event_type LIKE 'capture.%%' GROUP BY 1 ORDER BY 1"
                     % a["payment_attempt_id"]), [["capture.succeeded", "1"]],
             "one capture.succeeded, nothing else of the capture")


def void_crash(new):
    s = new("adv37b_void_crash", partitions=1, worker_env=FAST)
    w = s.start_worker()
    a = authorized(s, 1700)
    s.kill_worker(w)
    v = new_void(a)
    c = new_capture(a)
    point = os.environ.get("ADV37B_VPOINT", "after_void")
    dying = die_at(s, point)
    produce(s, [v, c])
    wait_dead(s, dying, point)
    ppid = attempt(s, a)["ppid"]
    check_eq(len(ledger_rows(s, "cancels", ppid)), 0 if point == "after_claim" else 1,
             "psp-sim canceled before the kill")
    s.start_reconciler()
    s.start_worker()
    s.start_worker()
    e2e.wait_until("the void settled", lambda: final(s, "void_attempts", v["void_id"]), 90)
    e2e.wait_until("the capture settled",
                   lambda: final(s, "capture_attempts", c["capture_id"]), 90)
    vd = step(s, "void_attempts", v["void_id"])
    check_eq(vd["status"], "SUCCEEDED", "the void (%s)" % vd["reason"])
    check_eq(attempt(s, a)["status"], "VOIDED", "the authorization")
    got = step(s, "capture_attempts", c["capture_id"])
    check_eq(got["status"], "REJECTED", "the capture behind the void (%s)" % got["reason"])
    check(got["reason"].split(":")[0] in ("capture_after_void", "authorization_held"),
          "its reason: %r" % got["reason"])
    check_eq(ledger_rows(s, "captures", ppid), [], "psp-sim captured nothing")
    check_eq(len(ledger_rows(s, "cancels", ppid)), 1, "psp-sim: one cancel")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["0"]], "nothing booked")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([capture_crash, void_crash])))
