#!/usr/bin/env python3
"""A worker fleet and the relay on the production profile's Kafka: three
brokers, SASL_SSL with SCRAM-SHA-512, per-role ACLs (tests/production/
prod_kafka.py). Each process reaches Kafka only as its role's principal.

200 commands are published as the order service (charged-orders), a few of
them declined cards, and one malformed record that must become a dead
letter (the worker's Write on the DLQ). Two workers (charged-worker, one of
them at LOG_LEVEL debug with librdkafka's security and conf debug on)
charge them; a relay (charged-relay) publishes the result events. Judged
from psp-sim's ledger (check_invariants), the results topic read back as
the order service (every attempt's event, the type its status calls for),
the DLQ, and the logs: no process ever wrote a role's password. Then
writes the ACL table does not grant (the worker or the relay to the
commands topic, the order service to the results or dead-letter topic...)
are refused.

Skips (77) unless CHARGED_PROD_STACK_DIR names a running production stack."""
import json
import os

import prod_kafka
from prod_kafka import e2e
from charged_e2e import check, check_eq

N = 200
EVENT_OF = {"SUCCEEDED": "charge.succeeded", "FAILED": "charge.failed",
            "REJECTED": "charge.rejected", "REQUIRES_REVIEW": "charge.requires_review"}


def passwords():
    d = os.path.join(os.environ["CHARGED_PROD_STACK_DIR"], "kafka-prod", "secrets")
    out = []
    for name in os.listdir(d):
        with open(os.path.join(d, name)) as f:
            out.append(f.read().strip())
    return out


def scenario(new):
    s = new("prod_kafka")
    w1 = s.start_worker(LOG_LEVEL="debug", KAFKA_DEBUG="security,conf")
    s.start_worker()
    s.start_relay(RELAY_POLL_MS="100")

    cmds = [e2e.new_command(payment_method="pm_card_chargeDeclined" if i % 10 == 0
                            else "pm_card_visa") for i in range(N)]
    bad = e2e.new_command()
    s.tool("produce", s.topics["commands"], role="orders", stdin=(json.dumps(
        {"key": bad["payment_attempt_id"], "headers": [],
         "value": '{"type": "charge.requested", '}) + "\n").encode())
    s.publish(cmds)
    s.wait_settled(N, timeout=240)
    s.check_invariants()

    attempts = s.attempts()
    check_eq(len(attempts), N, "attempts recorded")
    statuses = {a["status"] for a in attempts}
    check(statuses <= {"SUCCEEDED", "FAILED"}, "statuses: %s" % statuses)
    check_eq(sum(a["status"] == "FAILED" for a in attempts), N // 10, "declined attempts")

    # The relay published every attempt's result, readable by the order service.
    want = {a["id"]: EVENT_OF[a["status"]] for a in attempts}

    def all_results():
        got = {}
        for m in s.results():
            got.setdefault(m["key"], set()).add(json.loads(m["value"])["type"])
        missing = [aid for aid, t in want.items() if t not in got.get(aid, ())]
        return got if not missing else None
    e2e.wait_until("every attempt's result event on the results topic", all_results, 120)

    letters = e2e.wait_until("the malformed record's dead letter", lambda: (
        lambda d: d if d else None)(s.dead_letters()), 60)
    check_eq(len(letters), 1, "dead letters")
    check_eq(letters[0]["key"], bad["payment_attempt_id"], "the dead letter's key")

    # The debug worker really logged librdkafka's SASL handshake: the check
    # below looks at a log that had the chance to leak.
    check(any(l.get("facility") in ("SASL", "SECURITY") for l in s.worker_log(w1)),
          "worker w1 logged no SASL debug line")
    secrets = passwords()
    for name in os.listdir(s.dir):
        with open(os.path.join(s.dir, name), "rb") as f:
            text = f.read().decode(errors="replace")
        for p in secrets:
            check(p not in text, "a role's password is in %s" % name)
    e2e.log("%d attempts settled, %d results, 1 dead letter; no password in %d logs"
            % (N, len(want), len(os.listdir(s.dir))))

    # Each principal has only its own ACLs: writes the ACL table does not
    # grant are refused (chargectl publish as that principal, to that topic).
    for role, topic in (("worker", "commands"), ("relay", "commands"), ("orders", "results"),
                        ("orders", "dlq"), ("ctl", "results"), ("console", "commands")):
        env = prod_kafka.role_env(role)
        env["CHARGE_COMMANDS_TOPIC"] = s.topics[topic]
        cmd = e2e.new_command()
        p = s.run([e2e.CHARGECTL, "publish", "--file", "-"], check=False, extra_env=env,
                  stdin=(json.dumps(cmd) + "\n").encode())
        # Refused ("Topic authorization failed"; a principal allowed to
        # Describe the topic sees its produce request fail and purged).
        check(p.returncode != 0 and b"not published" in p.stderr,
              "charged-%s wrote to the %s topic (exit %d: %s)"
              % (role, topic, p.returncode, p.stderr.decode()[-300:]))
        keys = {json.loads(l)["key"] for l in s.tool("dump", s.topics[topic]).splitlines()
                if l.strip()}
        check(cmd["payment_attempt_id"] not in keys,
              "charged-%s's refused command is on the %s topic" % (role, topic))


if __name__ == "__main__":
    prod_kafka.stack_dir_or_skip()
    e2e.Scenario = prod_kafka.ProdScenario  # main()'s factory makes (and closes) these
    raise SystemExit(e2e.main(scenario))
