#!/usr/bin/env python3
"""Adversary 41b: result events forged from the commands topic move nothing.

An attempt's id is no secret: every charge command on the commands topic
carries it, and it is the command's key. Whoever reads that topic and can
write the results topic forges a charge.succeeded of it (the service, on
an event alone, marked the order paid with no money taken: found by the
adversary, all 10 orders) or a charge.failed of it (on an event alone the
service would try the order again: a second attempt, new id and key, while
charged still processes the first: two charges).

The test: orders placed while charged's worker is stopped (their commands
wait on the commands topic; nothing reaches psp-sim); a charge.succeeded
forged for half of them, a charge.failed for the others. Once the service
has asked charged's api about every one (it answers 404: no record), no
order is paid and no second attempt made. Then the worker and relay start:
every order psp-sim charges is paid in the service, and a second attempt
exists only where charged's first FAILED."""
import json
import os
import subprocess
import time
import uuid

import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))


def forge(c, etype):
    """A result event of command c, as anyone reading the commands topic can write it."""
    return {"key": c["payment_attempt_id"], "headers": [], "value": json.dumps({
        "event_id": str(uuid.uuid4()), "type": etype, "version": 1,
        "payment_attempt_id": c["payment_attempt_id"], "order_id": c["order_id"],
        "amount": c["amount"], "currency": c["currency"],
        "status": etype.split(".")[1].upper(),
        "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})}


def scenario(new):
    s = new("adv41b_forged")
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        env = oe.service_env(s, orders_db)  # charged's api; no worker yet

        def cli(*args):
            r = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                               timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit (%s)" % (args[0], r.stderr[-500:]))

        def q(sql):
            return oe.rows(s, orders_db, sql)

        log_path = os.path.join(s.dir, "order_service.log")
        cli("init")
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env, stdout=open(log_path, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        cli("place-orders", "--count", "10")
        e2e.wait_until("the charge commands sent", lambda: q(
            "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [["0"]], 60, 0.3)

        cmds = [json.loads(m["value"]) for m in
                (json.loads(l) for l in s.tool("dump", s.topics["commands"]).splitlines()
                 if l.strip())]
        cmds = [c for c in cmds if c.get("type") == "charge.requested"]
        check_eq(len(cmds), 10, "charge commands on the commands topic")
        forged = ([forge(c, "charge.succeeded") for c in cmds[:5]] +
                  [forge(c, "charge.failed") for c in cmds[5:]])
        s.tool("produce", s.topics["results"], stdin="".join(
            json.dumps(r) + "\n" for r in forged).encode())

        # Every forged event read, and charged asked about its attempt.
        e2e.wait_until("the service asked charged about every forged event", lambda: q(
            "SELECT count(*) FROM order_attempts WHERE last_event_type IS NOT NULL AND "
            "confirmed_at IS NOT NULL") == [["10"]], 60, 0.3)
        check_eq(q("SELECT count(*) FROM orders WHERE paid"), [["0"]],
                 "orders paid on forged charge.succeeded events")
        check_eq(q("SELECT count(*) FROM order_attempts WHERE attempt_no > 1"), [["0"]],
                 "second attempts made on forged charge.failed events")
        check_eq(len(s.ledger()), 0, "calls at psp-sim with no worker running")

        # Now charged runs: the same orders are charged and paid for real.
        s.start_worker()
        s.start_relay(RELAY_POLL_MS=100)
        at_psp, paid = oe.wait_paid_as_charged(s, orders_db)
        e2e.log("orders charged at psp-sim %d, paid in the service %d" % (len(at_psp), len(paid)))
        check(at_psp, "no order charged once the worker ran")
        check_eq(sorted(paid), sorted(at_psp), "orders paid in the service against psp-sim")
        charged = dict((a["id"], a["status"]) for a in s.attempts())
        for order, first in q("SELECT order_id, payment_attempt_id FROM order_attempts a WHERE "
                              "attempt_no = 1 AND EXISTS (SELECT 1 FROM order_attempts b "
                              "WHERE b.order_id = a.order_id AND b.attempt_no = 2)"):
            check_eq(charged.get(first), "FAILED", "charged's first attempt of %s, tried "
                     "again" % order)
        check(p.poll() is None, "the order service exited on its own")
        p.send_signal(15)
        check_eq(p.wait(timeout=30), 0, "the order service's exit status on SIGTERM")
        p = None
    finally:
        e2e.stack_restore()
        if p is not None and p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
