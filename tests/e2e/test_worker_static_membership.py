#!/usr/bin/env python3
"""Static group membership: three workers with group instance ids
(KAFKA_GROUP_INSTANCE_ID, or POD_NAME when that is not set) and a session
timeout of 30 s. One is stopped with SIGTERM and started again with the
same id, then another (the group's first member): no rebalance happens (the other two get no assignment or
revocation at all, since a static member leaves the group without a
LeaveGroup and comes back within the session timeout), and the restarted
one gets its very partitions back. The same restart without instance ids
does rebalance, so that this test can tell the two apart. Every attempt
is charged once either way. A POD_NAME Kafka would refuse is a bad
setting (exit 2)."""
import signal
import subprocess

import charged_e2e as e2e
from charged_e2e import check, check_eq

ENV = {"KAFKA_SESSION_TIMEOUT_MS": "30000", "KAFKA_HEARTBEAT_INTERVAL_MS": "1000"}
CALLBACKS = ("partitions assigned", "partitions revoked; draining them", "partitions lost")


def held(s, name):
    """The partitions `name` holds now, from its assignment log lines."""
    parts = set()
    for l in s.worker_log(name):
        got = {int(p) for p in l.get("partitions", "").split(",") if p}
        if l.get("msg") == "partitions assigned":
            parts |= got
        elif l.get("msg") in ("revoked partitions drained", "lost partitions given up"):
            parts -= got
    return parts


def callbacks(s, name):
    return [l for l in s.worker_log(name) if l.get("msg") in CALLBACKS]


def balanced(s, names):
    sets = [held(s, n) for n in names]
    return (all(len(p) == 4 for p in sets) and set().union(*sets) == set(range(12))
            and sets)


def restart(new, static):
    name = "static" if static else "dynamic"
    s = new(name, partitions=12, worker_env=ENV)
    ids = {}
    if static:
        # a by KAFKA_GROUP_INSTANCE_ID (which wins over POD_NAME), b too,
        # c by POD_NAME alone.
        ids = {"a": dict(KAFKA_GROUP_INSTANCE_ID="member-a", POD_NAME="ignored-a"),
               "b": dict(KAFKA_GROUP_INSTANCE_ID="member-b"),
               "c": dict(POD_NAME="charged-worker-c")}
    wa = s.start_worker(**ids.get("a", {}))
    e2e.wait_until("a to hold every partition", lambda: len(held(s, wa)) == 12, 60)
    wb = s.start_worker(**ids.get("b", {}))
    wc = s.start_worker(**ids.get("c", {}))
    e2e.wait_until("4 partitions each", lambda: balanced(s, (wa, wb, wc)), 90)
    if static:
        for w, want in ((wa, "member-a"), (wb, "member-b"), (wc, "charged-worker-c")):
            check_eq(s.worker_log(w, "worker started")[0].get("group_instance_id"), want,
                     "%s's group instance id" % w)
    first = [e2e.new_command() for _ in range(60)]
    s.publish(first)
    s.wait_settled(len(first), timeout=120)

    # Restart c, then (static only) a, the group's first member.
    members = {"a": wa, "b": wb, "c": wc}
    results = []
    for who in ("c", "a") if static else ("c",):
        others = [w for k, w in members.items() if k != who]
        before = {w: len(callbacks(s, w)) for w in others}
        old = held(s, members[who])
        rc = s.kill_worker(members[who], signal.SIGTERM)
        check_eq(rc, 0, "the stopped worker's exit status")
        members[who] = again = s.start_worker(**ids.get(who, {}))
        e2e.wait_until("the restarted worker to hold 4 partitions", lambda: len(
            held(s, again)) == 4 and balanced(s, list(members.values())), 90)
        # Work through every partition: the group has settled on an assignment.
        more = [e2e.new_command() for _ in range(60)]
        s.publish(more)
        first += more
        s.wait_settled(len(first), timeout=120)
        after = {w: len(callbacks(s, w)) for w in others}
        e2e.log(name, "restarted", who, "callbacks of the others before", before, "after",
                after, "partitions", sorted(old), "then", sorted(held(s, again)))
        results.append((before, after, old, held(s, again)))
    counts = s.check_invariants()
    check_eq(counts, {"SUCCEEDED": len(first)}, "attempts by status")
    return results


def bad_pod_name(s):
    env = s.env({"POD_NAME": "charged worker/1"})
    env.pop("KAFKA_GROUP_INSTANCE_ID", None)
    p = subprocess.run([e2e.CHARGED, "worker"], env=env, capture_output=True, timeout=60)
    check_eq(p.returncode, 2, "exit status with a bad POD_NAME")
    check("POD_NAME" in p.stderr.decode(), "the error should name POD_NAME: %r" % p.stderr)


def scenario(new):
    for before, after, old, again in restart(new, static=True):
        check_eq(after, before, "assignment callbacks of the other static members")
        check_eq(again, old, "partitions of the restarted static member")

    [(before, after, old, again)] = restart(new, static=False)
    check(any(after[w] > before[w] for w in before),
          "without instance ids the restart should rebalance the others: %s -> %s"
          % (before, after))

    s = new("static_bad", partitions=1)
    bad_pod_name(s)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
