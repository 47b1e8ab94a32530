#!/usr/bin/env python3
"""Adversary 41: SIGTERM does not stop the example order service while its
PostgreSQL hangs (a hung host: connections open, nothing answers).

README: "SIGTERM finishes the batch and exits 0"; test_order_service allows
it 30 s. The handler only sets `stop`; the main thread leaves its consume
loop, but run() then joins the publisher, which is blocked in a query on its
open connection (publish_once()'s SELECT after idle()'s 1 s wait): psycopg
has no statement timeout, no TCP keepalive or user timeout is set, and
nothing cancels it. The process stays until PostgreSQL answers again: a
supervisor's grace period runs out and it is SIGKILLed instead. (Money is
safe: the outbox and inbox survive a SIGKILL; this is the SIGTERM claim.)

The test: the service runs and has paid its first orders; PostgreSQL is
frozen (deploy/stack.sh pg-freeze); SIGTERM; it must exit 0 within 30 s.

Then the broker away: orders placed meanwhile leave the publisher waiting
for acknowledgements that cannot come (message.timeout.ms is 30 s). A
SIGTERM ends that wait: the service stops cleanly ("order service
stopped"), not by leaving a stuck thread after STOP_GRACE_S, and the
commands it could not send are sent by the next instance once the broker
is back (same rows, same bytes)."""
import os
import subprocess
import time

import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))


def scenario(new):
    s = new("adv41_sigterm_outages")
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    frozen = False
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        s.start_worker()
        s.start_relay(RELAY_POLL_MS=100)
        env = oe.service_env(s, orders_db, ORDERS_INSTANCE_ID="orders-1")
        for args in (["init"], ["place-orders", "--count", "10"]):
            r = subprocess.run([PYTHON, SERVICE] + args, env=env, capture_output=True, timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit" % args[0])
        log_path = os.path.join(s.dir, "order_service.log")
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env, stdout=open(log_path, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        e2e.wait_until("the service applying results", lambda: int(s.psql(
            orders_db, "SELECT count(*) FROM processed_events").split()[0]) >= 10, 90, 0.3)

        e2e.pg_freeze()
        frozen = True
        # Not a wait for a condition: long enough that the publisher (one
        # query a second at the most) is inside a query the frozen server
        # never answers, the case under test.
        time.sleep(3)
        t0 = time.time()
        p.send_signal(15)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        e2e.log("SIGTERM with PostgreSQL hung: exit %r after %.1f s" % (rc, time.time() - t0))
        check(rc is not None, "the order service still running 30 s after SIGTERM "
              "(PostgreSQL hung)")
        check_eq(rc, 0, "the order service's exit status on SIGTERM")
        p = None
        e2e.pg_thaw()
        frozen = False

        # The broker away, commands waiting in the publisher: SIGTERM.
        log_path = os.path.join(s.dir, "order_service_2.log")
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env, stdout=open(log_path, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        e2e.wait_until("the second instance consuming", lambda: b"partitions assigned" in
                       open(log_path, "rb").read(), 60, 0.2)
        e2e.kafka_kill()
        r = subprocess.run([PYTHON, SERVICE, "place-orders", "--count", "5"], env=env,
                           capture_output=True, timeout=60)
        check_eq(r.returncode, 0, "order_service place-orders exit")
        # The outage is the fault, not a wait: the publisher has tried to send.
        time.sleep(3)
        p.send_signal(15)
        try:
            rc = p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            rc = None
        check_eq(rc, 0, "the order service's exit status on SIGTERM (broker away)")
        p = None
        out = open(log_path, "rb").read()
        check(b"order service stopped\"" in out and b"left unfinished" not in out,
              "the stop with the broker away was not clean: %s" % out[-600:].decode("utf-8",
                                                                                  "replace"))
        e2e.kafka_start()
        p = subprocess.Popen([PYTHON, SERVICE, "run"], env=env, stdout=open(log_path, "ab"),
                             stderr=subprocess.STDOUT, start_new_session=True)
        e2e.wait_until("the commands of the outage sent by the next instance", lambda: s.psql(
            orders_db, "SELECT count(*) FROM outbox WHERE sent_at IS NULL").split() == ["0"],
            60, 0.3)
        p.send_signal(15)
        check_eq(p.wait(timeout=30), 0, "the order service's exit status on SIGTERM")
        p = None
    finally:
        if frozen:
            e2e.pg_thaw()
        e2e.stack_restore()
        if p is not None and p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
