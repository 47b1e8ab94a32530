"""An authorization's steps as the e2e scenarios drive and read them: the
commands (authorization, capture, void) produced on their attempt's key,
and their rows, events and psp-sim's ledger read back."""
import json
import uuid

import charged_e2e as e2e
from charged_e2e import check_eq


def produce(s, cmds, partition=None):
    """cmds keyed by their authorization; on one partition when given (the
    key's own partition otherwise)."""
    recs = [{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds]
    for r in recs:
        if partition is not None:
            r["partition"] = partition
    s.produce_raw(recs)


def authorized(s, amount):
    cmd = e2e.new_command(amount=amount)
    cmd["type"] = "authorization.requested"
    produce(s, [cmd])
    e2e.wait_until("the authorization held", lambda: attempt(s, cmd)["status"]
                   not in ("", "PENDING", "PROCESSING"), 60)
    check_eq(attempt(s, cmd)["status"], "AUTHORIZED", "the authorization")
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


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(captured_amount, 0), coalesce(provider_payment_id,"
                   " ''), coalesce(held_by, ''), coalesce(held_by_id::text, '')"
                   " FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
    if not rows:
        return {"status": ""}
    return dict(zip(("status", "captured", "ppid", "held_by", "held_by_id"), rows[0]))


def step(s, cmd):
    """A capture's or a void's row: status, reason's code, holds, leased."""
    table, key = (("capture_attempts", "capture_id") if "capture_id" in cmd
                  else ("void_attempts", "void_id"))
    rows = s.query("SELECT status, split_part(coalesce(reason, ''), ':', 1), holds,"
                   " lease_owner IS NOT NULL FROM %s WHERE id = '%s'" % (table, cmd[key]))
    if not rows:
        return {"status": ""}
    return dict(zip(("status", "code", "holds", "leased"), rows[0]))


def settled(s, cmd, *statuses):
    got = step(s, cmd)
    return got["status"] in (statuses or ("SUCCEEDED", "FAILED", "REJECTED", "UNKNOWN",
                                          "REQUIRES_REVIEW")) and got["leased"] == "f"


def wait_step(s, cmd, *statuses):
    e2e.wait_until("%s settled" % cmd["type"], lambda: settled(s, cmd, *statuses), 60)
    return step(s, cmd)


def events(s, cmd):
    key = "capture_id" if "capture_id" in cmd else "void_id"
    return sorted(r[0] for r in s.query("SELECT event_type FROM outbox WHERE payload->>'%s'"
                                        " = '%s'" % (key, cmd[key])))


def at_psp(s, auth):
    """psp-sim's captures and voids of the authorization's intent."""
    ppid = attempt(s, auth)["ppid"]
    led = s.psp_get("/ledger")
    return ([c for c in led.get("captures", []) if c.get("payment_intent_id") == ppid],
            [c for c in led.get("cancels", []) if c.get("payment_intent_id") == ppid])


def booked(s, auth):
    return s.query("SELECT kind, amount FROM ledger_entries WHERE payment_attempt_id = '%s'"
                   % auth["payment_attempt_id"])
