#!/usr/bin/env python3
"""Kafka 3.x compatibility: the worker's core scenarios against Kafka 3.9.

The stack and every other test run Kafka 4.x; users still run 3.x. This
starts a second, Kafka-only broker of deploy/kafka/pom.xml's
kafka.compat.version (deploy/stack.sh kafka-start with
CHARGED_KAFKA_VERSION=compat) on ports of its own, beside the test stack's
PostgreSQL, checks from the broker's own log that it is that version, and
runs each scenario below against it as a subprocess. Each scenario asserts
what it always asserts (counted from psp-sim's ledger and the database);
this test fails when any of them fails, naming it.

Ports: the test stack's Kafka port + 5 (broker) and + 6 (controller), or
CHARGED_TEST_COMPAT_KAFKA_PORT and that + 1."""
import os
import re
import shutil
import subprocess
import sys
import time

import charged_e2e as e2e

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
# Consumption and commit, dead letters, the cooperative rebalance, static
# membership, the relay's publishing, W3C trace context through headers.
# Then a worker under KIP-848's consumer protocol, which a 3.x broker does
# not serve. The crash points and one order's attempts are not run again
# here: they test the order of the database and provider steps and the
# database's order guard, not the broker's part, and a restarted worker
# resuming from its group's committed offsets on 3.9 is what sigterm,
# rebalance and static membership already show.
SCENARIOS = [
    "test_worker_sigterm.py",
    "test_worker_bad_input.py",
    "test_worker_rebalance.py",
    "test_worker_static_membership.py",
    "test_worker_oversized_dead_letter.py",
    "test_relay.py",
    "test_worker_traceparent.py",
]


def pom_property(name):
    with open(os.path.join(ROOT, "deploy", "kafka", "pom.xml"), encoding="utf-8") as f:
        return re.search(r"<%s>([^<]+)</%s>" % (re.escape(name), re.escape(name)), f.read()).group(1)


def consumer_protocol_says_why(env, version):
    """KIP-848 needs a 4.x broker: against 3.x a consumer-protocol worker is
    never assigned anything. It must say so in its log rather than sit
    there unready without a word; and it consumes nothing meanwhile."""
    os.environ.update(env)
    e2e.GROUP_PROTOCOL = "consumer"
    s = e2e.Scenario("kip848_on_kafka3")
    try:
        s.publish([e2e.new_command() for _ in range(3)])
        w = s.start_worker()
        line = e2e.wait_until("the consumer-protocol worker to warn that it has no partitions",
                              lambda: s.worker_log(w, "no partitions assigned for 30 s"), 90)
        e2e.check("Kafka 4.0" in str(line), "the warning does not name Kafka 4.0: %s" % line)
        n = int(s.query("SELECT count(*) FROM payment_attempts")[0][0])
        e2e.check(n == 0, "a consumer-protocol worker on Kafka %s recorded %d attempts" % (
            version, n))
        e2e.log("ok   a consumer-protocol worker on Kafka %s warned and took nothing" % version)
    finally:
        s.close()
        e2e.GROUP_PROTOCOL = "classic"


def main():
    want = pom_property("kafka.compat.version")
    main_kafka = int(os.environ["CHARGED_TEST_KAFKA"].rsplit(":", 1)[1])
    port = int(os.environ.get("CHARGED_TEST_COMPAT_KAFKA_PORT") or main_kafka + 5)
    stack_dir = os.path.join(os.path.abspath(e2e.BUILD), "compat-kafka")
    shutil.rmtree(stack_dir, ignore_errors=True)
    env = dict(os.environ)
    env.update({
        "CHARGED_STACK_DIR": stack_dir,
        "CHARGED_KAFKA_VERSION": "compat",
        "CHARGED_KAFKA_PORT": str(port),
        "CHARGED_KAFKA_CONTROLLER_PORT": str(port + 1),
        "CHARGED_TEST_KAFKA": "127.0.0.1:%d" % port,
    })
    env.pop("CHARGED_KAFKA_JARS", None)
    stack = e2e.STACK
    failed = []
    try:
        p = subprocess.run([stack, "kafka-start"], env=env, capture_output=True,
                           stdin=subprocess.DEVNULL, timeout=e2e.scaled(300))
        if p.returncode != 0:
            raise e2e.Failure("deploy/stack.sh kafka-start (Kafka %s) exited %d: %s" % (
                want, p.returncode, p.stderr.decode()[-2000:]))
        with open(os.path.join(stack_dir, "kafka.log"), encoding="utf-8", errors="replace") as f:
            running = re.findall(r"Kafka version: (\S+)", f.read())
        e2e.check(running and running[-1] == want,
                  "the compatibility broker runs Kafka %s, want %s" % (running, want))
        e2e.log("Kafka %s up on 127.0.0.1:%d" % (want, port))
        for name in SCENARIOS:
            t0 = time.monotonic()
            r = subprocess.run([sys.executable, os.path.join(HERE, name)], env=env,
                               stdin=subprocess.DEVNULL, capture_output=True)
            took = time.monotonic() - t0
            if r.returncode != 0:
                failed.append(name)
                e2e.log("FAIL %s on Kafka %s after %.0fs; its output ends:\n%s" % (
                    name, want, took, r.stdout.decode(errors="replace")[-3000:] +
                    r.stderr.decode(errors="replace")[-2000:]))
            else:
                e2e.log("ok   %s on Kafka %s (%.0fs)" % (name, want, took))
        consumer_protocol_says_why(env, want)
    finally:
        subprocess.run([stack, "kafka-kill"], env=env, capture_output=True,
                       stdin=subprocess.DEVNULL)
    e2e.check(not failed, "on Kafka %s these scenarios failed: %s" % (want, failed))
    print("1 passed, 0 failed")


if __name__ == "__main__":
    try:
        main()
    except e2e.Failure as f:
        print("FAIL:", f)
        print("0 passed, 1 failed")
        sys.exit(1)
