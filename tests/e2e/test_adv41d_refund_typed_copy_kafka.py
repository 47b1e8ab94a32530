#!/usr/bin/env python3
"""Adversary 41d, on the real stack: charged reverses a paid order's charge
(a refund-by-hand at the provider: the provider's payment_failed webhook
after the success puts it in REQUIRES_REVIEW, a person resolves it FAILED
with chargectl), and the order service never unpays the order: a forger
who reads the results topic wrote, for each of the two real events, a
refund-typed copy (the event's own event_id, type refund.succeeded,
refund_id = the charge's payment_attempt_id, any other attempt) to another
partition, read before the real events. processed_events' key (event_id,
subject_id) of the copy is the real charge event's; note_event() finds no
refund of that id and wakes nothing; the real events are "duplicates". The
attempt's row holds a FINAL answer (SUCCEEDED), so the confirmer never asks
again by itself (test_adv41d_refund_typed_copy.py shows it on the inbox
alone).

How the copies are read first, as test_adv41c_stolen_event_id_kafka.py:
the service was stopped for a moment (a deploy) while charged reversed the
charge; the forger had written 3 MB of junk to the charge's results
partition before (the service's first fetch takes 1 MB of a partition);
the copies are on another partition. The junk is what anyone may write; it
ends in inbox_rejects.

Must hold: an order whose only attempt charged says FAILED is not paid,
and payment_reversed is raised for it. Before ba8e20e it stayed paid
(an order paid without money), no alarm, and the attempt is never asked
about again."""
import json
import os
import subprocess
import time
import uuid
import zlib

import charged_api
import charged_e2e as e2e
import order_service_e2e as oe
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
SERVICE = os.path.join(SOURCE, "examples", "order_service", "order_service.py")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))
RESULT_PARTITIONS = 3  # charged_e2e.Scenario's results topic


def partition_of(key):
    """librdkafka's default partitioner (consistent_random: CRC-32 of the key)."""
    return zlib.crc32(key.encode()) % RESULT_PARTITIONS


def scenario(new):
    s = new("adv41d_typed_kafka", worker_env={"RECONCILER_SEARCH_LAG_MS": "0"})
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        env = oe.service_env(s, orders_db)
        api_port = int(env["CHARGED_API_URL"].rsplit(":", 1)[1])

        def cli(*args):
            r = subprocess.run([PYTHON, SERVICE] + list(args), env=env, capture_output=True,
                               timeout=60)
            check_eq(r.returncode, 0, "order_service %s exit (%s)" % (args[0], r.stderr[-500:]))

        def q(sql):
            return oe.rows(s, orders_db, sql)

        log_path = os.path.join(s.dir, "order_service.log")

        def start_service():
            return subprocess.Popen([PYTHON, SERVICE, "run"], env=env,
                                    stdout=open(log_path, "ab"), stderr=subprocess.STDOUT,
                                    start_new_session=True)

        def charged_status(a):
            return s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % a)[0][0]

        cli("init")
        s.start_worker()
        s.start_relay(RELAY_POLL_MS=100)
        p = start_service()
        cli("place-orders", "--count", "4")
        at_psp, paid = oe.wait_paid_as_charged(s, orders_db)
        check_eq(paid, at_psp, "orders paid = orders psp-sim charged, before the reversal")
        target_order, target = q(
            "SELECT o.order_id, o.paid_attempt_id FROM orders o WHERE paid AND NOT EXISTS "
            "(SELECT 1 FROM order_refunds r WHERE r.order_id = o.order_id) "
            "ORDER BY seq LIMIT 1")[0]
        part = partition_of(target)
        e2e.log("target order %s, attempt %s, results partition %d" % (target_order, target,
                                                                      part))
        p.send_signal(15)  # a deploy
        check_eq(p.wait(timeout=60), 0, "the order service's exit status on SIGTERM")
        p = None

        # The forger's junk ahead of what comes next on the charge's partition.
        junk = "".join(json.dumps({"key": target, "value": "x" * 1000}) + "\n"
                       for _ in range(3000))
        s.tool("produce", s.topics["results"], stdin=junk.encode())

        # charged reverses the charge: the provider's failure after the
        # success (REQUIRES_REVIEW), then a person: refunded by hand, FAILED.
        ppid, amount, currency = s.query(
            "SELECT provider_payment_id, amount, currency FROM payment_attempts "
            "WHERE id = '%s'" % target)[0]
        st, doc = charged_api.post_webhook(api_port, charged_api.event(
            "payment_failed", {"id": target, "order_id": target_order, "amount": int(amount),
                               "currency": currency, "ppid": ppid},
            created=int(time.time()) + 2))
        check_eq(st, 200, "the provider's webhook answered (%r)" % (doc,))
        e2e.wait_until("the target in REQUIRES_REVIEW", lambda: charged_status(target) ==
                       "REQUIRES_REVIEW", e2e.scaled(30), 0.3)
        r = s.run([e2e.CHARGECTL, "attempt", "resolve", target, "--failed", "--force",
                   "--reason", "refunded by hand at the provider", "--actor", "dave"],
                  check=False)
        check_eq(r.returncode, 0, "chargectl attempt resolve --failed (%r)" % r.stderr[-300:])
        check_eq(charged_status(target), "FAILED", "charged's status of the target")
        e2e.wait_until("charged's result events published", lambda: s.query(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]],
            e2e.scaled(60), 0.3)

        dump = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines()
                if l.strip()]
        real = [json.loads(m["value"]) for m in dump if m["value"].startswith("{") and
                json.loads(m["value"]).get("payment_attempt_id") == target and
                json.loads(m["value"]).get("type") in ("charge.requires_review",
                                                        "charge.failed")]
        check_eq(sorted(e["type"] for e in real), ["charge.failed", "charge.requires_review"],
                 "the reversal's events")
        key = next(k for k in (str(uuid.uuid4()) for _ in range(100)) if partition_of(k) != part)
        copies = "".join(json.dumps({"key": key, "value": json.dumps({
            "event_id": e["event_id"], "type": "refund.succeeded", "refund_id": target,
            "payment_attempt_id": str(uuid.uuid4()), "order_id": str(uuid.uuid4()),
            "amount": 1})}) + "\n" for e in real)
        s.tool("produce", s.topics["results"], stdin=copies.encode())

        p = start_service()
        ends = json.loads(s.tool("lag", "nobody-" + s.tag, s.topics["results"]))
        end = dict((x["partition"], x["end"]) for x in ends["partitions"])

        def caught_up():
            pos = dict((int(a), int(b)) for a, b in q(
                "SELECT kafka_partition, next_offset FROM consumer_positions"))
            return all(pos.get(k, 0) >= v for k, v in end.items())
        e2e.wait_until("the service read every result message", caught_up, e2e.scaled(120), 0.5)
        # What the inbox made due (in the batch's own transaction) answered.
        e2e.wait_until("the confirmer's questions answered", lambda: q(
            "SELECT (SELECT count(*) FROM order_attempts WHERE confirm_due) + (SELECT count(*) "
            "FROM order_refunds WHERE confirm_due)") == [["0"]], e2e.scaled(60), 0.3)

        check_eq(charged_status(target), "FAILED", "charged's status of the target, at the end")
        e2e.log("the service: order %s; attempt %s; alarms %s" % (
            q("SELECT paid, paid_attempt_id FROM orders WHERE order_id = '%s'" % target_order),
            q("SELECT confirmed_status, applied_status, confirm_due FROM order_attempts "
              "WHERE payment_attempt_id = '%s'" % target),
            q("SELECT kind FROM order_alarms WHERE order_id = '%s'" % target_order)))
        e2e.log("processed_events of the reversal's event ids: %s" % q(
            "SELECT type, kafka_partition, kafka_offset FROM processed_events WHERE event_id "
            "IN (%s)" % ",".join("'%s'" % e["event_id"] for e in real)))
        check_eq(q("SELECT paid FROM orders WHERE order_id = '%s'" % target_order), [["f"]],
                 "the order whose only attempt charged says FAILED: paid")
        check_eq(q("SELECT kind FROM order_alarms WHERE order_id = '%s'" % target_order),
                 [["payment_reversed"]], "the target order's alarms")
        check(p.poll() is None, "the order service exited on its own")
        p.send_signal(15)
        check_eq(p.wait(timeout=60), 0, "the order service's exit status on SIGTERM")
        p = None
    finally:
        e2e.stack_restore()
        if p is not None and p.poll() is None:
            os.killpg(p.pid, 9)
            p.wait()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
