#!/usr/bin/env python3
"""Broker kills on the production profile's Kafka during load: SIGKILL of
the node that leads a partition of the commands topic, then of the one
that leads a partition of the results topic, then of the workers' group
coordinator, each brought back before the next (deploy/production/kafka.sh
kill / start). Commands keep being published (as the order service) while
each node is down: with replication factor 3 and min.insync.replicas=2 the
two others take every write.

Nothing is lost, nothing is charged twice, no result is missing: judged
from psp-sim's ledger (check_invariants), the attempts (one per command)
and the results topic (every attempt's event, read as the order service).

Skips (77) unless CHARGED_PROD_STACK_DIR names a running production stack.
It leaves the stack with its three nodes up (or fails saying which is not)."""
import json

import prod_kafka
from prod_kafka import e2e, kafka_sh
from charged_e2e import check, check_eq

N = 300
EVENT_OF = {"SUCCEEDED": "charge.succeeded", "FAILED": "charge.failed"}


def commands(n):
    """n charge commands, every tenth for a card the provider declines."""
    return [e2e.new_command(payment_method="pm_card_chargeDeclined" if i % 10 == 0
                            else "pm_card_visa") for i in range(n)]


def kill_each(s, while_down):
    """SIGKILL the node that leads partition 0 of s's commands topic, then
    the one that leads partition 0 of its results topic, then its workers'
    group coordinator, each started again (kafka.sh start returns once the
    three nodes answer) before the next; while_down(i) runs while the i-th
    is down. The nodes killed, in order."""
    victims = [
        ("leader of %s partition 0" % s.topics["commands"],
         lambda: kafka_sh("leader", s.topics["commands"], "0")),
        ("leader of %s partition 0" % s.topics["results"],
         lambda: kafka_sh("leader", s.topics["results"], "0")),
        ("coordinator of group %s" % s.group, lambda: kafka_sh("coordinator", s.group)),
    ]
    killed = []
    try:
        for i, (what, find) in enumerate(victims):
            node = find().strip()
            e2e.log("SIGKILL node %s, the %s" % (node, what))
            kafka_sh("kill", node)
            killed.append(node)
            while_down(i)
            kafka_sh("start")
    finally:
        kafka_sh("start")
    check(len(killed) == 3, "nodes killed: %s" % killed)
    return killed


def check_results(s, attempts):
    """Every attempt's result event, of the type its status calls for, on
    the results topic (read as the order service)."""
    want = {a["id"]: EVENT_OF[a["status"]] for a in attempts}

    def all_results():
        got = {}
        for m in s.results():
            got.setdefault(m["key"], set()).add(json.loads(m["value"])["type"])
        missing = [aid for aid, t in want.items() if t not in got.get(aid, ())]
        return got if not missing else None
    e2e.wait_until("every attempt's result event on the results topic", all_results, 120)


def scenario(new):
    s = new("prod_kills")
    s.start_worker()
    s.start_worker()
    s.start_relay(RELAY_POLL_MS="100")
    cmds = commands(N)
    chunks = [cmds[i:i + N // 6] for i in range(0, N, N // 6)]
    s.publish(chunks[0])
    killed = kill_each(s, lambda i: s.publish(chunks[1 + i]))  # while it is down
    s.publish(chunks[4] + chunks[5])

    s.wait_settled(N, timeout=300)
    s.check_invariants()
    attempts = s.attempts()
    check_eq(len(attempts), N, "attempts recorded")
    check_eq(sum(a["status"] == "FAILED" for a in attempts), N // 10, "declined attempts")
    check_results(s, attempts)
    e2e.log("%d attempts settled once, every result published; nodes killed: %s"
            % (N, killed))


if __name__ == "__main__":
    prod_kafka.stack_dir_or_skip()
    e2e.Scenario = prod_kafka.ProdScenario  # main()'s factory makes (and closes) these
    raise SystemExit(e2e.main(scenario))
