#!/usr/bin/env python3
"""Adversary 41: a poison message on the results topic stalls the example
order service for good.

examples/order_service/README.md: "A message that is not a readable result
event is logged and skipped, its position moved on." parse_event() catches
TypeError/ValueError from json.loads and uuid, but two kinds of unreadable
message raise before that:
- {"type": [1]}: `ev.get("type") in REFUND_TYPES` is a set lookup of a list,
  TypeError (unhashable), raised outside the try;
- "[[[[...": json.loads raises RecursionError (a RuntimeError).
The exception leaves apply_batch() (its transaction rolls back, the position
does not move), Inbox.apply() (it catches psycopg.Error only), Inbox.run()
(closes the consumer) and run() logs "inbox: unexpected error" and makes a new
Inbox, which seeks to the stored position and reads the same message again:
a crash loop, for ever. Every result event behind it on its partition is
never applied: orders charged at psp-sim are never marked paid, their refunds
never decided, second attempts after a decline never made.

The test: orders charged normally; then the poison lands on every partition
of the results topic (one record per key, many keys); more orders; charged
settles them all (every attempt terminal, every result event published); the
service should apply all of them within a minute. It does not."""
import json
import os
import subprocess
import sys
import uuid

import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))
POISON = ['{"type":[1]}', "[" * 50000]


def scenario(new):
    s = new("adv41_poison")
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        s.start_worker()
        s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
        s.start_relay(RELAY_POLL_MS=100)
        env = oe.service_env(s, orders_db, ORDERS_INSTANCE_ID="orders-1")

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

        # 1. Before the poison: the service pays what psp-sim charged.
        cli("place-orders", "--count", "10")
        e2e.wait_until("the first orders paid", lambda: charged_settled() and
                       (lambda a, b: a and a == b)(*paid_vs_psp()), 90, 0.3)

        # 2. Unreadable messages on the results topic, on every partition.
        recs = [{"key": str(uuid.uuid4()), "value": v, "headers": []}
                for _ in range(12) for v in POISON]
        s.tool("produce", s.topics["results"], stdin="".join(
            json.dumps(r) + "\n" for r in recs).encode())
        parts = set(m["partition"] for m in
                    (json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines()
                     if l.strip()) if m["value"] in POISON)
        e2e.log("poison on partitions", sorted(parts))

        # 3. More orders, charged and settled by charged.
        cli("place-orders", "--count", "30")
        e2e.wait_until("charged settled the new orders", lambda: charged_settled() and len(
            q("SELECT order_id FROM order_attempts")) >= 40, 120, 0.3)

        # 4. The service should apply every result event behind the poison.
        at_psp, paid = oe.wait_paid_as_charged(s, orders_db)
        loops = open(log_path, "rb").read().count(b"inbox: unexpected error")
        e2e.log("orders charged at psp-sim %d, paid in the service %d, inbox restarts %d" % (
            len(at_psp), len(paid), loops))
        check_eq(sorted(at_psp - paid), [], "orders charged at psp-sim never paid in the service")
        check_eq(loops, 0, "the inbox's restarts on an unreadable result message")
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
