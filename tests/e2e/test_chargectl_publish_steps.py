#!/usr/bin/env python3
"""chargectl publish --file takes every command the worker takes (issue
37): authorization.requested, capture.requested and void.requested, as it
takes charge.requested and refund.requested, each validated by the
worker's own parser before anything is sent and keyed by the
payment_attempt_id it names. tools/demo_authorize.py publishes its shop's
commands so.

One file: two authorizations; a second file: a partial capture of the
first, a void of the second. Judged from psp-sim's ledger: one capture of
the asked amount, one void. A file with a bad capture (amount 0) or a void
of an unknown reason is refused, exit 2, nothing sent."""
import json
import os
import subprocess
import tempfile
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq


def publish(s, cmds):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", dir=s.dir, delete=False) as f:
        f.writelines(json.dumps(c) + "\n" for c in cmds)
    return subprocess.run([e2e.CHARGECTL, "publish", "--file", f.name, "--json"],
                          capture_output=True, env=s.env())


def step(kind, auth, **fields):
    sid = str(uuid.uuid4())
    c = {"type": kind + ".requested", "version": 1, kind + "_id": sid,
         "payment_attempt_id": auth["payment_attempt_id"], "idempotency_key": kind + ":" + sid}
    c.update(fields)
    return c


def status(s, table, id_):
    r = s.query("SELECT status FROM %s WHERE id = '%s'" % (table, id_))
    return r[0][0] if r else None


def scenario(new):
    s = new("ctl_publish_steps", partitions=2)
    s.start_worker()
    auths = [dict(e2e.new_command(amount=a), type="authorization.requested")
             for a in (4200, 3100)]
    p = publish(s, auths)
    check_eq(p.returncode, 0, "publish of authorizations (%s)" % p.stderr.decode()[-300:])
    keys = [json.loads(l)["payment_attempt_id"] for l in p.stdout.decode().split()]
    check_eq(keys, [a["payment_attempt_id"] for a in auths], "keyed by payment_attempt_id")
    for a in auths:
        e2e.wait_until("authorized", lambda: status(s, "payment_attempts",
                                                    a["payment_attempt_id"]) == "AUTHORIZED", 60)

    # Refused whole: nothing of the file is sent.
    for bad in (step("capture", auths[0], amount=0), step("void", auths[1], reason="bored")):
        good = step("capture", auths[0])
        p = publish(s, [good, bad])
        check_eq(p.returncode, 2, "publish of %s (%s)" % (bad, p.stdout.decode()))
        check("command 2 is invalid (schema_violation)" in p.stderr.decode(),
              "says which and why: %r" % p.stderr.decode())

    cap = step("capture", auths[0], amount=4000)
    void = step("void", auths[1], reason="requested_by_customer")
    p = publish(s, [cap, void])
    check_eq(p.returncode, 0, "publish of a capture and a void (%s)" % p.stderr.decode()[-300:])
    e2e.wait_until("the capture and the void settled", lambda: (
        status(s, "capture_attempts", cap["capture_id"]),
        status(s, "void_attempts", void["void_id"])) == ("SUCCEEDED", "SUCCEEDED"), 60)
    led = s.psp_get("/ledger")
    intent = {c["payment_attempt_id"]: c["payment_intent_id"] for c in led["charges"]}
    check_eq([(c["payment_intent_id"], c["amount"]) for c in led.get("captures", [])],
             [(intent[auths[0]["payment_attempt_id"]], 4000)],
             "psp-sim's captures: the one asked, of what was asked")
    check_eq([c["payment_intent_id"] for c in led.get("cancels", []) if c.get("kind") == "void"],
             [intent[auths[1]["payment_attempt_id"]]], "psp-sim's voids")
    check_eq(s.dead_letters(), [], "dead letters")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
