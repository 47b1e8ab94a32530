#!/usr/bin/env python3
"""Adversary 41b: an order of 1 minor unit (a valid amount: docs/messages.md,
1 to 100000000000) stalls the example order service's inbox for good.

refund_policy.refund_for(seq, amount) asks every REFUND_EVERY-th paid order
(seq % 5 == 0, seq % 10 != 0) for a half refund: amount // 2. For amount 1
that is 0. apply_charge_event() calls add_refund(..., 0, "duplicate") in the
batch's transaction; order_refunds.amount has CHECK (amount > 0): the INSERT
raises a psycopg IntegrityError, the whole batch rolls back, its positions do
not move, and Inbox.apply() retries the same batch "after a database
failure" for ever. A legitimate charge.succeeded event is now a poison
message: every result event in that batch and behind it (every partition in
it) is never applied. Orders charged at psp-sim are never marked paid, their
refunds never asked for, declined orders never tried again.

The test places ten orders of 1 cent through the service's own add_attempt
(order number 5 is a half-refund one), then thirty ordinary orders with
place-orders; charged settles all of them; the service should mark every
order psp-sim charged as paid within a minute. It does not."""
import json
import os
import subprocess

import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE_DIR = os.path.join(SOURCE, "examples", "order_service")
SERVICE = os.path.join(SERVICE_DIR, "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))

# Orders of one cent, placed as place_orders() places them (one transaction:
# the order, its first attempt and charge command through add_attempt).
PLACE_CENT_ORDERS = r"""
import os, sys, uuid
sys.path.insert(0, sys.argv[1])
import psycopg
import order_service as svc
with psycopg.connect(os.environ["ORDERS_DATABASE_URL"]) as conn:
    with conn.transaction(), conn.cursor() as cur:
        for _ in range(int(sys.argv[2])):
            order = str(uuid.uuid4())
            cur.execute("INSERT INTO orders (order_id, amount, currency) VALUES (%s, %s, %s)",
                        (order, 1, "EUR"))
            svc.add_attempt(cur, order, 1, 1, "EUR", "pm_card_visa")
"""


def scenario(new):
    s = new("adv41b_one_cent")
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        s.start_worker()
        s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
        s.start_relay(RELAY_POLL_MS=100)
        env = oe.service_env(s, orders_db)

        def cli(*args):
            r = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                               timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit (%s)" % (args[0], r.stderr[-500:]))

        def q(sql):
            return [l.split("|") for l in s.psql(orders_db, sql).split()]

        log_path = os.path.join(s.dir, "order_service.log")
        cli("init")
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env, stdout=open(log_path, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)

        def paid_vs_psp():
            return oe.paid_vs_psp(s, orders_db)

        def charged_settled():
            return oe.charged_settled(s, orders_db)

        # 1. Ten orders of one cent (valid amounts), then thirty ordinary ones.
        r = subprocess.run([PYTHON, "-c", PLACE_CENT_ORDERS, SERVICE_DIR, "10"], env=env,
                           capture_output=True, timeout=60)
        check_eq(r.returncode, 0, "placing one-cent orders (%s)" % r.stderr[-500:])
        cli("place-orders", "--count", "30")

        # 2. charged settles every one of them.
        e2e.wait_until("charged settled every order", lambda: charged_settled() and len(
            q("SELECT order_id FROM order_attempts")) >= 40, 150, 0.3)

        # 3. The service should mark every order psp-sim charged as paid.
        at_psp, paid = oe.wait_paid_as_charged(s, orders_db)
        retries = open(log_path, "rb").read().count(b"inbox: batch not applied, retrying")
        e2e.log("orders charged at psp-sim %d, paid in the service %d, batch retries %d" % (
            len(at_psp), len(paid), retries))
        check(len(at_psp) >= 30, "psp-sim charged the orders (%d)" % len(at_psp))
        check_eq(sorted(at_psp - paid), [], "orders charged at psp-sim never paid in the service")
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
