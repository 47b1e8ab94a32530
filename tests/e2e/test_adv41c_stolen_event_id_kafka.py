#!/usr/bin/env python3
"""Adversary 41c, on the real stack: a forger who reads and writes the
results topic takes the event_id of charged's refund.succeeded first, and
the order service never counts a refund charged made (psp-sim paid it out).

test_adv41c_stolen_event_id.py shows the hole on the inbox alone: the
event_id is recorded in processed_events before note_event() knows the
event is one of ours, so a copy of a real event's id that names another
refund, read first, makes the real event a "duplicate"; a refund is asked
about only when an event made it due, so nothing asks again. Here, with
Kafka, the order service, charged's worker, relay and api and psp-sim, the
copy IS read first: the service was stopped for a moment (a deploy) while
charged paid its refunds; the forger, who sees every refund command on the
commands topic (keyed by the refunded charge), wrote 3 MB of junk to that
charge's results partition before the refund's event (the service's first
fetch takes 1 MB of a partition), read the real refund.succeeded once the
relay published it and wrote the copy to another partition. The junk is
what the README already allows anyone to write ("a forger can make the
service ask charged many times"); it ends in inbox_rejects.

The test: 20 orders (refund_policy: the 5th, 10th, ... refund once paid);
charged's api down while the charge events arrive (nothing paid, nothing
refunded yet), the relay stopped, the api back (orders paid, refunds sent
and paid by psp-sim, their events held in charged's outbox), the service
stopped; the junk and, after the relay published, the copy of one refund's
event; the service started again. Every refund charged says SUCCEEDED must
be counted: the other refunds are, the one whose id was taken never is."""
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
    s = new("adv41c_stolen_kafka")
    check(os.access(PYTHON, os.X_OK), "%s missing: run deploy/install-deps.sh" % PYTHON)
    p = None
    try:
        orders_db_name = s.tag.lower() + "_orders"
        s.psql(s.admin_db, 'CREATE DATABASE "%s"' % orders_db_name)
        orders_db = s.db.rsplit("/", 1)[0] + "/" + orders_db_name
        env = oe.service_env(s, orders_db)
        api_name = list(s.apis)[0]
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

        cli("init")
        charged_api.stop_api(s, api_name)  # no answer yet: nothing paid, nothing refunded
        s.start_worker()
        relay = s.start_relay(RELAY_POLL_MS=100)
        p = start_service()
        cli("place-orders", "--count", "20")
        e2e.wait_until("every charge event applied by the service", lambda: q(
            "SELECT count(*) FROM order_attempts WHERE last_event_type IS NULL") == [["0"]],
            e2e.scaled(90), 0.3)
        s.stop_relay(relay)
        charged_api.start_api(s, port=api_port)

        def refunds_paid():
            ours = q("SELECT refund_id FROM order_refunds")
            if not ours or q("SELECT count(*) FROM outbox WHERE sent_at IS NULL") != [["0"]]:
                return False
            st = dict((r["id"], r["status"]) for r in s.refunds())
            return all(st.get(r) == "SUCCEEDED" for r, in ours)
        e2e.wait_until("the service's refunds sent and SUCCEEDED at charged", refunds_paid,
                       e2e.scaled(90), 0.3)
        e2e.wait_until("every attempt of the service settled and confirmed (second attempts "
                       "after declines too)", lambda: q(
                           "SELECT count(*) FROM order_attempts WHERE coalesce(confirmed_status, "
                           "'') NOT IN ('SUCCEEDED', 'FAILED', 'REJECTED')") == [["0"]] and q(
                           "SELECT count(*) FROM outbox WHERE sent_at IS NULL") == [["0"]],
                       e2e.scaled(90), 0.3)
        p.send_signal(15)
        check_eq(p.wait(timeout=60), 0, "the order service's exit status on SIGTERM")
        p = None

        refunds = q("SELECT refund_id, payment_attempt_id, amount FROM order_refunds "
                    "ORDER BY refund_id")
        target_refund, target_attempt, _ = refunds[0]
        part = partition_of(target_attempt)
        e2e.log("refunds %d; the target %s of attempt %s, results partition %d" % (
            len(refunds), target_refund, target_attempt, part))
        junk = "".join(json.dumps({"key": target_attempt, "value": "x" * 1000}) + "\n"
                       for _ in range(3000))
        s.tool("produce", s.topics["results"], stdin=junk.encode())

        s.start_relay(RELAY_POLL_MS=100)
        e2e.wait_until("charged's result events published", lambda: s.query(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]],
            e2e.scaled(60), 0.3)
        dump = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines()
                if l.strip()]
        real = [m for m in dump if m["value"].startswith("{") and
                json.loads(m["value"]).get("refund_id") == target_refund and
                json.loads(m["value"]).get("type") == "refund.succeeded"]
        check_eq(len(real), 1, "refund.succeeded events of the target refund")
        check_eq(real[0]["partition"], part, "the target's results partition")
        copy = json.loads(real[0]["value"])
        copy.update({"refund_id": str(uuid.uuid4()), "payment_attempt_id": str(uuid.uuid4()),
                     "order_id": str(uuid.uuid4())})
        key = next(k for k in (str(uuid.uuid4()) for _ in range(100)) if partition_of(k) != part)
        s.tool("produce", s.topics["results"],
               stdin=(json.dumps({"key": key, "value": json.dumps(copy)}) + "\n").encode())

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

        charged_st = dict((r["id"], r["status"]) for r in s.refunds())
        counted = dict(q("SELECT refund_id, counted FROM order_refunds"))
        e2e.log("charged: %s; the service counted: %s" % (
            {r[:8]: charged_st.get(r) for r, _, _ in refunds},
            {r[:8]: c for r, c in counted.items()}))
        check_eq(charged_st.get(target_refund), "SUCCEEDED", "charged's status of the target")
        for r, _, _ in refunds:
            check_eq(counted.get(r), "t", "refund %s (charged: SUCCEEDED) counted by the "
                     "service%s" % (r, ", its event id taken first" if r == target_refund
                                    else ""))
        check_eq(q("SELECT count(*) FROM processed_events WHERE event_id = '%s' AND "
                   "refund_id = '%s'" % (copy["event_id"], target_refund)), [["1"]],
                 "the real refund.succeeded recorded as the one of its event id")
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
