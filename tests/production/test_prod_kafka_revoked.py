#!/usr/bin/env python3
"""A revoked ACL on the production profile's Kafka, while the worker runs
(an operator's mistake, a rotated policy: what shows up at 3 a.m.):

- group_read: its principal loses Read on its consumer group;
- dlq_write: it loses Write on the dead-letter topic, and a malformed
  command arrives;
- relay_write: the relay's principal loses Write on the results topic.

The role must then fail readiness (/readyz 503) naming the permission it
lacks, say so in one log line (not one per retry), and keep running: no
exit, so no crash loop of restarts that would not bring the permission
back. Once the ACL is granted again it is ready again and charges what was
published meanwhile, each once (psp-sim's ledger, check_invariants); the
dead letter is on its topic once.

Skips (77) unless CHARGED_PROD_STACK_DIR names a running production stack."""
import json
import time

import prod_kafka
from prod_kafka import e2e
from charged_e2e import check, check_eq


def ready(s, name):
    return s.admin_get(name, "/readyz")


def worker_charging(s, n):
    """A worker started, n commands charged by it, and it ready: its name
    and the commands."""
    w = s.start_worker()
    first = [e2e.new_command() for _ in range(n)]
    s.publish(first)
    s.wait_settled(len(first), timeout=120)
    e2e.wait_until("the worker ready", lambda: ready(s, w)[0] == 200, 60)
    return w, first


def revoke_group_read(s, w, hold_s, while_denied):
    """Revokes Read on s's group from the worker's principal while worker
    w runs: /readyz 503 naming the permission, one log line, no exit for
    hold_s (while_denied() runs first); then grants it again and waits for
    w to be ready."""
    s.revoke("worker", "group", s.group, "Read")
    want = "Read on group %s" % s.group

    def denied():
        status, body = ready(s, w)
        return body if status == 503 and want in body else None
    body = e2e.wait_until("/readyz 503 naming the missing permission", denied, 90)
    e2e.log("readyz:", body.strip())
    while_denied()

    # Still denied a while later: the worker runs on, says it once.
    t_end = time.monotonic() + e2e.scaled(hold_s)
    while time.monotonic() < t_end:
        check(s.process(w).poll() is None, "the worker exited (%s) on a revoked ACL: "
              "a crash loop under a supervisor" % s.process(w).returncode)
        check(denied() is not None, "/readyz stopped naming the missing permission")
        time.sleep(0.5)
    lines = s.worker_log(w, "kafka denies a permission")
    e2e.log("log lines naming it:", len(lines), lines[:2])
    check_eq([l.get("permission") for l in lines], [want],
             "the denial's log lines (one, naming the permission)")
    check(not s.worker_log(w, "consumer error"), "consumer errors logged beside it")

    s.grant("worker", "group", s.group, "Read")
    e2e.wait_until("the worker ready again", lambda: ready(s, w)[0] == 200, 120)


def group_read(new):
    s = new("prod_revoked")
    w, first = worker_charging(s, 20)

    # Published while denied: nothing may be lost or charged twice.
    second = [e2e.new_command() for _ in range(20)]
    revoke_group_read(s, w, 15, lambda: s.publish(second))
    s.wait_settled(len(first) + len(second), timeout=180)
    s.check_invariants()
    check_eq(s.process(w).poll(), None, "the worker's exit status (still running)")


def dlq_write(new):
    s = new("prod_revoked_dlq")
    w, first = worker_charging(s, 5)

    s.revoke("worker", "topic", s.topics["dlq"], "Write")
    want = "Write on topic %s" % s.topics["dlq"]
    bad = e2e.new_command()
    s.tool("produce", s.topics["commands"], role="orders", stdin=(json.dumps(
        {"key": bad["payment_attempt_id"], "headers": [],
         "value": '{"type": "charge.requested", '}) + "\n").encode())
    second = [e2e.new_command() for _ in range(5)]
    s.publish(second)

    def denied():
        status, body = ready(s, w)
        return body if status == 503 and want in body else None
    body = e2e.wait_until("/readyz 503 naming the missing permission", denied, 90)
    e2e.log("readyz:", body.strip())
    # The good commands are charged meanwhile; the dead letter waits.
    e2e.wait_until("the other commands charged", lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'")[0][0])
        == len(first) + len(second), 60)
    t_end = time.monotonic() + e2e.scaled(10)
    while time.monotonic() < t_end:
        check(s.process(w).poll() is None, "the worker exited (%s) on a revoked ACL"
              % s.process(w).returncode)
        check(denied() is not None, "/readyz stopped naming the missing permission")
        time.sleep(0.5)
    check_eq(s.dead_letters(), [], "dead letters while Write is denied")
    lines = s.worker_log(w, "kafka denies a permission")
    check_eq([l.get("permission") for l in lines], [want],
             "the denial's log lines (one, naming the permission)")
    check(not s.worker_log(w, "dead letter not acknowledged"),
          "a retry line per dead-letter attempt beside it")

    s.grant("worker", "topic", s.topics["dlq"], "Write")
    e2e.wait_until("the worker ready again", lambda: ready(s, w)[0] == 200, 120)
    letters = e2e.wait_until("the dead letter", lambda: s.dead_letters() or None, 60)
    check_eq([l["key"] for l in letters], [bad["payment_attempt_id"]], "dead letters' keys")
    s.wait_settled(len(first) + len(second), timeout=120)
    s.check_invariants()


def relay_write(new):
    s = new("prod_revoked_relay")
    s.start_worker()
    rl = s.start_relay(RELAY_POLL_MS="100")
    first = [e2e.new_command() for _ in range(5)]
    s.publish(first)
    s.wait_settled(len(first), timeout=120)
    e2e.wait_until("the relay ready", lambda: ready(s, rl)[0] == 200, 60)

    s.revoke("relay", "topic", s.topics["results"], "Write")
    want = "Write on topic %s" % s.topics["results"]
    second = [e2e.new_command() for _ in range(5)]
    s.publish(second)

    def denied():
        status, body = ready(s, rl)
        return body if status == 503 and want in body else None
    body = e2e.wait_until("/readyz 503 naming the missing permission", denied, 90)
    e2e.log("readyz:", body.strip())
    t_end = time.monotonic() + e2e.scaled(10)
    while time.monotonic() < t_end:
        check(s.process(rl).poll() is None, "the relay exited (%s) on a revoked ACL"
              % s.process(rl).returncode)
        check(denied() is not None, "/readyz stopped naming the missing permission")
        time.sleep(0.5)
    lines = s.worker_log(rl, "kafka denies a permission")
    check_eq([l.get("permission") for l in lines], [want],
             "the denial's log lines (one, naming the permission)")
    check(not s.worker_log(rl, "result events not acknowledged"),
          "a line per refused batch beside it")

    s.grant("relay", "topic", s.topics["results"], "Write")
    e2e.wait_until("the relay ready again", lambda: ready(s, rl)[0] == 200, 120)
    s.wait_settled(len(first) + len(second), timeout=120)
    s.check_invariants()
    ids = {c["payment_attempt_id"] for c in first + second}
    e2e.wait_until("every attempt's result on the topic", lambda: ids <= {
        m["key"] for m in s.results()}, 60)


if __name__ == "__main__":
    prod_kafka.stack_dir_or_skip()
    e2e.Scenario = prod_kafka.ProdScenario  # main()'s factory makes (and closes) these
    raise SystemExit(e2e.main(e2e.run_scenarios([group_read, dlq_write, relay_write])))
