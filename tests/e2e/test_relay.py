#!/usr/bin/env python3
"""charged relay: every outbox event reaches the results topic, in order per
attempt, whatever kills the relays.

A worker charges 2,000 attempts against psp-sim with faults (so attempts
pass through UNKNOWN and are settled later by a reconciler: two events for
some attempts), while two relays run: one leads (an advisory lock), the
other stands by. The leader is SIGKILLed repeatedly and restarted. At the
end: no outbox row is left unpublished; every event_id of the outbox is on
the topic with the outbox's payload; a duplicate only ever repeats an
event_id already seen (a relay killed between produce and mark publishes
again); and each attempt's events appear on its partition in the order of
its transitions (attempt_transitions.id, drawn under the attempt's row
lock), never judged by a timestamp."""
import json
import os
import random
import signal
import subprocess
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

N = 2000
EVENT_OF = {"UNKNOWN": "charge.unknown", "SUCCEEDED": "charge.succeeded",
            "FAILED": "charge.failed", "REJECTED": "charge.rejected",
            "REQUIRES_REVIEW": "charge.requires_review"}


def start_relay(s, relays, name):
    out = open(os.path.join(s.dir, name + ".log"), "ab")
    env = s.env({"WORKER_ID": "%s-%d" % (name, time.monotonic_ns() % 100000),
                 "RELAY_POLL_MS": "100", "RELAY_BATCH": "200"})
    relays[name] = subprocess.Popen([e2e.CHARGED, "relay"], stdout=out, stderr=out, env=env)
    e2e.log("started relay", name, "pid", relays[name].pid)


def leader(s, relays):
    """The relay holding the advisory lock, by its backend's pid -> our pid
    is not visible; ask the relays' logs instead: the last to log 'leading'."""
    best = None
    for name, p in relays.items():
        if p.poll() is not None:
            continue
        with open(os.path.join(s.dir, name + ".log"), "rb") as f:
            lines = [l for l in f.read().decode(errors="replace").splitlines()
                     if '"msg":"leading' in l]
        if lines:
            ts = json.loads(lines[-1])["ts"]
            if best is None or ts > best[0]:
                best = (ts, name)
    return best[1] if best else None


def scenario(new):
    s = new("relay", psp_args=["--latency-ms", "2", "--latency-jitter-ms", "8",
                               "--fault", "drop_after=0.05", "--fault", "error_after=0.05",
                               "--seed", str(random.randrange(1 << 30))])
    relays = {}
    try:
        run(s, relays)
    finally:
        for p in relays.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def run(s, relays):
    s.start_worker(WORKER_UNKNOWN_RETRIES=0, RECONCILER_FIRST_LOOK_MS=0)
    s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
    start_relay(s, relays, "relay1")
    start_relay(s, relays, "relay2")
    cmds = [e2e.new_command() for _ in range(N)]
    s.publish(cmds)

    # Kill the leader five times while events flow, restarting it each time.
    kills = 0
    for k in range(5):
        e2e.wait_until("a leading relay", lambda: leader(s, relays), 60, 0.2)
        time.sleep(random.uniform(0.3, 1.2))  # let it publish for a while
        name = leader(s, relays)
        relays[name].send_signal(signal.SIGKILL)
        relays[name].wait(timeout=e2e.scaled(30))
        kills += 1
        e2e.log("killed leading relay", name)
        start_relay(s, relays, "relay%d" % (3 + k))

    s.wait_settled(N, timeout=300)
    e2e.wait_until("nothing UNKNOWN or PROCESSING", lambda: s.query(
        "SELECT count(*) FROM payment_attempts WHERE status IN ('UNKNOWN','PROCESSING')")
        == [["0"]], 120)
    e2e.wait_until("every outbox row published", lambda: s.query(
        "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]], 120)
    s.check_invariants()

    outbox = s.query("SELECT event_id, payment_attempt_id, payload::text FROM outbox")
    written = dict((r[0], (r[1], json.loads(r[2]))) for r in outbox)
    # The event types each attempt's transitions call for, in their order.
    order = {}
    for aid, status in s.query("SELECT payment_attempt_id, new_status FROM attempt_transitions"
                               " ORDER BY id"):
        if status in EVENT_OF:
            order.setdefault(aid, []).append(EVENT_OF[status])

    msgs = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines()
            if l.strip()]
    seen, dups, on_topic = set(), 0, {}
    for m in sorted(msgs, key=lambda m: (m["partition"], m["offset"])):
        headers = dict((h[0], h[1]) for h in m["headers"])
        eid = headers.get("event_id")
        check(eid in written, "message at %s:%s has an unknown event_id %r"
              % (m["partition"], m["offset"], eid))
        attempt, payload = written[eid]
        check_eq(m["key"], attempt, "key of event %s" % eid)
        check_eq(json.loads(m["value"]), payload, "payload of event %s" % eid)
        if eid in seen:
            dups += 1  # a duplicate repeats an event_id already seen
            continue
        seen.add(eid)
        on_topic.setdefault(attempt, []).append(payload["type"])
    missing = set(written) - seen
    check(not missing, "%d outbox events never reached the topic, e.g. %s"
          % (len(missing), sorted(missing)[:3]))
    out_of_order = [a for a in order if on_topic.get(a) != order[a]]
    check(not out_of_order, "events out of order for %d attempts, e.g. %s: transitions %s, topic %s"
          % (len(out_of_order), out_of_order[:1], order.get(out_of_order[0]) if out_of_order
             else None, on_topic.get(out_of_order[0]) if out_of_order else None))
    multi = sum(1 for a in order if len(order[a]) > 1)
    e2e.log("relay: %d events for %d attempts (%d with several), %d messages, %d duplicates,"
            " %d leader kills" % (len(written), len(order), multi, len(msgs), dups, kills))
    check(multi > 0, "no attempt had more than one event: the order check proved nothing")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
