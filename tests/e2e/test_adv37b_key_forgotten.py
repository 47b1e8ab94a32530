#!/usr/bin/env python3
"""Adversary 37b: a capture's or a void's worker SIGKILLed right after the
provider executed it (failpoints after_capture, after_void), and taken over
once psp-sim has forgotten the step's key (--key-retention-ms 3000,
WORKER_KEY_RETENTION_MS=3000, the lease 2 s, the takeover 5 s after the
kill). The step did execute, under its own key, and our own recorded intent
shows it (captured with amount_received; canceled with our reason):

- capture: psp-sim shows one capture of 700 under the capture's key; the
  capture must end SUCCEEDED 700 (as the reconciler's look by our recorded
  intent decides), the authorization SUCCEEDED captured 700, one ledger
  charge row; never FAILED, and never REQUIRES_REVIEW "not under this key"
  (it was under this key);
- void: psp-sim shows one cancel under the void's key; the void must end
  SUCCEEDED, the attempt VOIDED; never FAILED with its hold given back (the
  authorization then AUTHORIZED at charged while psp-sim released it)."""
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

ENV = {"WORKER_KEY_RETENTION_MS": 3000, "WORKER_LEASE_MS": 2000,
       "PROVIDER_TIMEOUT_MS": 1000, "WORKER_UNKNOWN_RETRIES": 0,
       "RECONCILER_FIRST_LOOK_MS": 500, "RECONCILER_POLL_MS": 200}


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


def killed_then_taken_over(s, cmd, point):
    dying = s.start_worker(CHARGED_FAILPOINT=point, WORKER_MAX_IN_FLIGHT=1, **ENV)
    produce(s, [cmd])
    rc = s.wait_worker_exit(dying, 60)
    died = time.monotonic()
    check(rc == -9, "the worker was to die by SIGKILL at %s, exited %s" % (point, rc))
    e2e.wait_until("5s after the kill", lambda: time.monotonic() - died >= 5, 10, 0.05)
    s.start_worker(**ENV)
    s.start_reconciler(**ENV)


def capture(new):
    s = new("adv37b_key_capture", partitions=1, psp_args=["--key-retention-ms", "3000"])
    w = s.start_worker(**ENV)
    a = authorized(s, 2000)
    s.kill_worker(w)
    cid = str(uuid.uuid4())
    c = {"type": "capture.requested", "version": 1, "capture_id": cid,
         "payment_attempt_id": a["payment_attempt_id"],
         "idempotency_key": "capture:" + cid, "amount": 700}
    killed_then_taken_over(s, c, "after_capture")
    ppid = attempt(s, a)["ppid"]
    e2e.wait_until("the capture settled", lambda: final(s, "capture_attempts", cid) and
                   step(s, "capture_attempts", cid)["status"] != "UNKNOWN", 60)
    got = step(s, "capture_attempts", cid)
    caps = ledger_rows(s, "captures", ppid)
    check_eq([(r["amount"], r["idempotency_key"]) for r in caps],
             [(700, c["idempotency_key"])], "psp-sim: one capture of 700 under its key")
    check_eq(got["status"], "SUCCEEDED", "our own capture, executed under its key (%s)"
             % got["reason"])
    auth = attempt(s, a)
    check_eq((auth["status"], auth["captured"]), ("SUCCEEDED", "700"), "the authorization")
    check_eq(s.query("SELECT kind, amount FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["charge", "700"]], "booked, 700")


def void(new):
    s = new("adv37b_key_void", partitions=1, psp_args=["--key-retention-ms", "3000"])
    w = s.start_worker(**ENV)
    a = authorized(s, 1300)
    s.kill_worker(w)
    vid = str(uuid.uuid4())
    v = {"type": "void.requested", "version": 1, "void_id": vid,
         "payment_attempt_id": a["payment_attempt_id"],
         "idempotency_key": "void:" + vid, "reason": "requested_by_customer"}
    killed_then_taken_over(s, v, "after_void")
    ppid = attempt(s, a)["ppid"]
    e2e.wait_until("the void settled", lambda: final(s, "void_attempts", vid) and
                   step(s, "void_attempts", vid)["status"] != "UNKNOWN", 60)
    got = step(s, "void_attempts", vid)
    check_eq(len(ledger_rows(s, "cancels", ppid)), 1, "psp-sim: one cancel")
    check_eq(ledger_rows(s, "captures", ppid), [], "psp-sim captured nothing")
    check_eq(got["status"], "SUCCEEDED", "our own void, executed under its key (%s)"
             % got["reason"])
    check_eq(attempt(s, a)["status"], "VOIDED", "the authorization")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([capture, void])))
