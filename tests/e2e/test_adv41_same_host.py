#!/usr/bin/env python3
"""Adversary 41: two instances of the example order service on one host, as
its README allows ("more instances in one group share the results topic's
partitions with the same guarantees"), with the default settings.

ORDERS_INSTANCE_ID defaults to the host name, so both instances claim the
same static membership (group.instance.id). The broker fences the older one:
librdkafka raises a fatal error on its consumer. Inbox.consume() logs
"inbox: consumer error" / "consume failed" and waits, for ever, on that dead
consumer: it never makes a new one (run() only remakes the Inbox when an
exception leaves it). When the second instance leaves (SIGTERM, as in
test_order_service), the first, still running and never exiting, applies no
result event again: orders charged at psp-sim are never marked paid.

Fixed: no static membership unless ORDERS_INSTANCE_ID is set (two instances
on one host with the defaults are two dynamic members), and a consumer
fenced or otherwise done for is made anew. The test gives both instances
the same ORDERS_INSTANCE_ID, the harder case (a misconfigured pair): A is
fenced while B runs; B is SIGTERMed; more orders; charged settles them; A
must pay them all within a minute, never having exited."""
import os
import subprocess

import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))


def scenario(new):
    s = new("adv41_same_host")
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    procs = []
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        s.start_worker()
        s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
        s.start_relay(RELAY_POLL_MS=100)
        # One ORDERS_INSTANCE_ID for both: each fences the other out.
        env = oe.service_env(s, orders_db, ORDERS_INSTANCE_ID="orders-same")

        def cli(*args):
            r = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                               timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit (%s)" % (args[0], r.stderr[-500:]))

        def q(sql):
            return [l.split("|") for l in s.psql(orders_db, sql).split()]

        def start(name):
            path = os.path.join(s.dir, name + ".log")
            p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env, stdout=open(path, "ab"),
                                 stderr=subprocess.STDOUT, start_new_session=True)
            procs.append(p)
            e2e.log("started", name, "pid", p.pid)
            return p, path

        def paid_vs_psp():
            return oe.paid_vs_psp(s, orders_db)

        def charged_settled():
            return oe.charged_settled(s, orders_db)

        cli("init")
        a, a_log = start("order_service_a")
        cli("place-orders", "--count", "10")
        e2e.wait_until("the first orders paid", lambda: charged_settled() and
                       (lambda x, y: x and x == y)(*paid_vs_psp()), 90, 0.3)

        # A second instance on the same host joins, then leaves.
        b, b_log = start("order_service_b")
        e2e.wait_until("the second instance given partitions", lambda: b"partitions assigned"
                       in open(b_log, "rb").read(), 60, 0.2)
        e2e.wait_until("A fenced out by B", lambda: b"inbox: unexpected error"
                       in open(a_log, "rb").read(), 60, 0.2)
        b.send_signal(15)
        check_eq(b.wait(timeout=30), 0, "the second instance's exit status on SIGTERM")

        cli("place-orders", "--count", "30")
        e2e.wait_until("charged settled the new orders", lambda: charged_settled() and len(
            q("SELECT order_id FROM order_attempts")) >= 40, 120, 0.3)
        at_psp, paid = oe.wait_paid_as_charged(s, orders_db)
        e2e.log("orders charged at psp-sim %d, paid in the service %d" % (len(at_psp), len(paid)))
        check(a.poll() is None, "instance A exited on its own: %r" % a.poll())
        check_eq(sorted(at_psp - paid), [], "orders charged at psp-sim never paid in the service")
        a.send_signal(15)
        check_eq(a.wait(timeout=30), 0, "instance A's exit status on SIGTERM")
    finally:
        e2e.stack_restore()
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
