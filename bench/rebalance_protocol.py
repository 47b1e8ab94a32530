#!/usr/bin/env python3
"""Rebalances under the two group protocols, side by side in one invocation:
the classic protocol with the cooperative-sticky assignor (the worker's
default) against KIP-848's consumer protocol (KAFKA_GROUP_PROTOCOL=consumer),
the same workload for both, rounds alternating (classic, consumer, classic,
consumer, ...) so that whatever else the machine does hits both alike.

One round, in its own scenario (database, topics, group, psp-sim): two
workers share 12 partitions while commands arrive at a fixed rate (RATE a
second, in a batch every 0.25 s, by one producer that stays up; psp-sim
answers in 100-300 ms, no faults). After a steady stretch:
  join   a third worker starts;
  leave  the first gets SIGTERM while it holds claimed attempts;
  crash  the second gets SIGKILL while it holds claimed attempts (the group
         notices when its session times out: 6 s, the harness's
         KAFKA_SESSION_TIMEOUT_MS and deploy/stack.sh's broker-side
         group.consumer.session.timeout.ms);
each phase waits until the group is stable again (the live members hold the
12 partitions between them, and none logged a rebalance for 4 s) and 2 s
more. Then publishing stops and every attempt settles; the harness's
invariants (charged once, offsets committed) must hold.

What is measured, from the workers' JSON logs (partitions assigned / revoked
/ drained / lost, attempt settled), attempt_transitions, provider_calls,
psp-sim's counters and the workers' /metrics:
  join   start of the new worker -> its first non-empty assignment, and ->
         the group stable (the last rebalance line of any member); the
         partitions whose owner changed, the partitions revoked from the
         existing members, and how long those paused (the longest gap
         between two settled attempts of the partition around the
         handover; at this rate a partition settles one every ~0.12 s),
         against the longest gap of the partitions they kept;
  leave, crash  the signal -> the first attempt of each partition the
         member held settled by another worker (median and the last
         partition), and -> the group stable; for the crash also -> the
         last attempt it had claimed settled by another (its lease,
         WORKER_LEASE_MS=12000, has to expire first);
  duplicate work, per phase: extra provider charge calls (provider_calls
         rows beyond one per attempt, and psp-sim's replayed + in_use_409
         answers, which also count calls a killed worker could not log),
         attempts claimed by more than one worker, commands redelivered
         (charged_messages_total{outcome="already_settled"}: a command the
         new owner got after its previous owner had settled it), in-flight
         work given up (outcome "released") and "partitions lost" lines;
  throughput  attempts settled a second from the event until the group is
         stable (1 s at least), and in the worst second (sliding by 0.1 s)
         from the event until 1 s after that, each as a ratio to the steady
         stretch before the join.
Per protocol the table shows the median over the rounds and [min-max];
with CHARGED_BENCH_JSON=FILE every round's numbers are written there too.

What it showed (librdkafka 2.14.2, Kafka 4.4, 3 rounds each): the consumer
protocol gives a new worker its first partitions sooner (about 1.1 s against
1.8 s: no JoinGroup/SyncGroup rounds, the broker hands out freed partitions
at the next heartbeat, the rest one heartbeat later) and notices a crash
sooner once the session expires (the partitions are worked on again ~1 s
earlier); a SIGTERM leave is as quick or a little quicker under classic.
Neither does duplicate work on a join or a leave (no extra provider call,
no attempt claimed twice, nothing redelivered, nothing lost); a crash costs
both the same (the commands after the last commit come back, the claimed
attempts wait out their lease). Under both, every member whose assignment
changes stops taking messages on all its partitions, kept ones included,
for about a second: librdkafka pauses the whole assignment while a
rebalance callback is outstanding (until its incremental assign or
unassign; rdkafka_cgrp.c, rd_kafka_rebalance_op_incr), drops what it had
fetched and fetches again once resumed, and the worker unassigns revoked
partitions only once they are drained.

Needs the test stack (see bench/worker_throughput.py) with Kafka >= 4.0 for
the consumer protocol (deploy/stack.sh's is). Each round takes about a
minute and a half.

  python3 bench/rebalance_protocol.py [ROUNDS [RATE]]     (defaults: 3, 100)
"""
import calendar
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "e2e"))
import charged_e2e as e2e  # noqa: E402

PROTOCOLS = ("classic", "consumer")
PARTITIONS = 12
PSP = ["--seed", "7", "--latency-ms", "100", "--latency-jitter-ms", "200"]
WARMUP_S, STEADY_S, AFTER_S, QUIET_S = 4, 8, 2, 4
TICK_S = 0.25
REBALANCE = ("partitions assigned", "partitions revoked; draining them",
             "revoked partitions drained", "partitions lost", "lost partitions given up")
TERMINAL = ("SUCCEEDED", "FAILED", "UNKNOWN", "REJECTED", "REQUIRES_REVIEW")


def parts_of(line):
    return {int(p) for p in str(line.get("partitions", "")).split(",") if p}


class Logs:
    """The workers' JSON log lines, read as they grow, each with "at" (its
    ts, epoch seconds)."""

    def __init__(self, s):
        self.s, self.pos, self.lines = s, {}, {}

    def of(self, name):
        path = os.path.join(self.s.dir, name + ".log")
        lines = self.lines.setdefault(name, [])
        with open(path, "rb") as f:
            f.seek(self.pos.get(name, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line still being written waits
        self.pos[name] = self.pos.get(name, 0) + end
        for raw in data[:end].splitlines():
            try:
                line = json.loads(raw)
                ts, frac = line["ts"].rstrip("Z").split(".")
            except (ValueError, KeyError, AttributeError, TypeError):
                continue  # not a log line
            line["at"] = (calendar.timegm(time.strptime(ts, "%Y-%m-%dT%H:%M:%S"))
                          + int(frac[:3].ljust(3, "0")) / 1000.0)
            lines.append(line)
        return lines

    def held(self, name, until=None):
        """The partitions `name` holds (assigned, not yet drained or given up)."""
        parts = set()
        for l in self.of(name):
            if until is not None and l["at"] > until:
                break
            if l["msg"] == "partitions assigned":
                parts |= parts_of(l)
            elif l["msg"] in ("revoked partitions drained", "lost partitions given up"):
                parts -= parts_of(l)
        return parts


class Traffic(threading.Thread):
    """Publishes new commands at `rate` a second, a batch every TICK_S,
    until stopped, through one kafka_test_tool producer that stays up (a
    chargectl publish per batch costs more than a tick on a busy machine),
    keyed by attempt id as chargectl publishes them."""

    def __init__(self, s, rate):
        super().__init__(daemon=True)
        self.s, self.batch = s, max(1, int(round(rate * TICK_S)))
        self.published, self.late, self.error = 0, 0, None
        self.stop = threading.Event()
        self.p = subprocess.Popen([e2e.KAFKA_TOOL, "produce", s.topics["commands"]],
                                  stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, env=s.env())

    def run(self):
        try:
            next_at = time.monotonic()
            while not self.stop.is_set():
                cmds = [e2e.new_command() for _ in range(self.batch)]
                self.p.stdin.write("".join(json.dumps({
                    "key": c["payment_attempt_id"], "value": json.dumps(c)}) + "\n"
                    for c in cmds).encode())
                self.p.stdin.flush()
                self.published += len(cmds)
                next_at += TICK_S
                left = next_at - time.monotonic()
                if left < 0:
                    self.late += 1  # could not keep the rate: said in the report
                    next_at = time.monotonic()
                elif self.stop.wait(left):
                    return
        except Exception as e:  # reported by finish()
            self.error = e

    def finish(self):
        self.stop.set()
        self.join(timeout=e2e.scaled(60))
        e2e.check(not self.is_alive(), "publishing did not end")
        self.p.stdin.close()
        err = self.p.stderr.read().decode()
        rc = self.p.wait(timeout=e2e.scaled(60))
        if self.error or rc != 0:
            raise e2e.Failure("publishing failed: %s (kafka_test_tool exited %s: %s)"
                              % (self.error, rc, err[-500:]))

    def partitions(self):
        """{attempt id: partition} of everything published."""
        return dict((m["key"], m["partition"]) for m in (
            json.loads(l) for l in self.s.tool("dump", self.s.topics["commands"]).splitlines()
            if l.strip()))


def wait_stable(s, logs, live, since, what):
    """Until the live members hold the partitions between them, each some,
    and none logged a rebalance for QUIET_S; returns when the last of those
    lines was logged (epoch seconds)."""
    def stable():
        sets = [logs.held(n) for n in live]
        if any(not p for p in sets) or sum(len(p) for p in sets) != PARTITIONS or \
                set().union(*sets) != set(range(PARTITIONS)):
            return None
        stamps = [l["at"] for n in live for l in logs.of(n)
                  if l["msg"] in REBALANCE and l["at"] >= since]
        if not stamps or time.time() - max(stamps) < QUIET_S:
            return None
        return max(stamps)
    return e2e.wait_until("the group stable after the %s" % what, stable, 120, 0.25)


def held_by(s, worker_id):
    return {r[0] for r in s.query(
        "SELECT id FROM payment_attempts WHERE status = 'PROCESSING' AND lease_owner = '%s' "
        "AND lease_expires_at > now()" % worker_id)}


def snapshot(s, names):
    """{name: {outcome: count}} of charged_messages_total, and psp-sim's counters."""
    m = {}
    for n in names:
        series = s.admin_metrics(n)
        m[n] = dict((k.split('"')[1], v) for k, v in series.items()
                    if k.startswith("charged_messages_total{"))
        m[n]["rebalance callbacks"] = sum(v for k, v in series.items()
                                          if k.startswith("charged_rebalances_total{"))
    return m, s.psp_get("/ledger")["counters"]


def outcome_delta(before, after, outcome):
    """Messages with `outcome` between two snapshots, over the workers of
    the later one (a worker started since counts from 0)."""
    return sum(after[n].get(outcome, 0) - before.get(n, {}).get(outcome, 0) for n in after)


def one_round(new, proto, rate):
    e2e.GROUP_PROTOCOL = proto  # read by Scenario.env() for every process it starts
    s = new("rb_" + proto, partitions=PARTITIONS, psp_args=PSP)
    logs = Logs(s)
    w1, w2 = s.start_worker(), s.start_worker()
    wait_stable(s, logs, [w1, w2], 0, "start")
    traffic = Traffic(s, rate)
    traffic.start()
    try:
        ev = run_phases(s, logs, traffic, w1, w2)
    finally:
        traffic.stop.set()
    traffic.finish()
    s.wait_settled(traffic.published, timeout=300)
    ev["final"] = snapshot(s, [ev["w3"]])
    s.check_invariants()
    r = analyse(s, logs, traffic, ev)
    r["late publishes"] = traffic.late
    s.close()
    return r


def run_phases(s, logs, traffic, w1, w2):
    ev = {"w1": w1, "w2": w2}
    time.sleep(WARMUP_S)
    ev["steady"] = time.time()
    time.sleep(STEADY_S)

    ev["snap_join"] = snapshot(s, [w1, w2])
    ev["held_join"] = {w1: logs.held(w1), w2: logs.held(w2)}
    ev["join"] = time.time()
    w3 = ev["w3"] = s.start_worker()
    ev["stable_join"] = wait_stable(s, logs, [w1, w2, w3], ev["join"], "join")
    time.sleep(AFTER_S)

    for phase, who, sig, live in (("leave", w1, signal.SIGTERM, [w2, w3]),
                                  ("crash", w2, signal.SIGKILL, [w3])):
        wid = s.worker_ids[who]
        e2e.wait_until("%s holding claimed attempts" % who, lambda: held_by(s, wid), 60, 0.05)
        ev["snap_" + phase] = snapshot(s, [w1, w2, w3] if phase == "leave" else [w2, w3])
        ev["held_" + phase] = logs.held(who)
        ev["claimed_" + phase] = held_by(s, wid)
        ev[phase] = time.time()
        rc = s.kill_worker(who, sig)
        if sig == signal.SIGTERM:
            e2e.check(rc == 0, "%s left by SIGTERM with status %s" % (who, rc))
        ev["stable_" + phase] = wait_stable(s, logs, live, ev[phase], phase)
        time.sleep(AFTER_S)
    ev["end"] = time.time()
    return ev


def analyse(s, logs, traffic, ev):
    w1, w2, w3 = ev["w1"], ev["w2"], ev["w3"]
    names = (w1, w2, w3)
    part = traffic.partitions()
    settles = sorted((l["at"], n, l["payment_attempt_id"]) for n in names
                     for l in logs.of(n) if l["msg"] == "attempt settled")
    by_part = {}
    for at, n, aid in settles:
        if aid in part:
            by_part.setdefault(part[aid], []).append((at, n))
    r = {}

    def rate(t0, t1):
        return sum(1 for at, _, _ in settles if t0 <= at < t1) / max(t1 - t0, 1e-9)
    steady = rate(ev["steady"], ev["join"])
    r["steady settled/s"] = steady

    def throughput(phase, t0, t1):
        """From the event until the group is stable (1 s at least); and the
        worst second (sliding, by 0.1 s) from the event until 1 s after."""
        r[phase + ": throughput in the window / steady"] = rate(t0, max(t1, t0 + 1)) / steady
        worst = min(rate(t0 + i / 10.0, t0 + i / 10.0 + 1) for i in range(int((t1 - t0) * 10) + 1))
        r[phase + ": worst 1 s / steady"] = worst / steady

    def max_gap(p, t0, t1):
        """The longest time partition p went without a settled attempt in [t0, t1]."""
        ts = [t0] + [at for at, _ in by_part.get(p, []) if t0 < at < t1] + [t1]
        return max(b - a for a, b in zip(ts, ts[1:]))

    r["steady: longest gap of a partition (s)"] = max(
        max_gap(p, ev["steady"], ev["join"]) for p in range(PARTITIONS))

    # ---- join ----
    join, stable = ev["join"], ev["stable_join"]
    first = [l["at"] for l in logs.of(w3) if l["msg"] == "partitions assigned" and parts_of(l)]
    r["join: new worker's first assignment (s)"] = first[0] - join if first else float("nan")
    r["join: group stable (s)"] = stable - join
    before, after = {}, {}
    for n, ps in ev["held_join"].items():
        for p in ps:
            before[p] = n
    for n in names:
        for p in logs.held(n, until=stable):
            after[p] = n
    r["join: partitions moved"] = sum(1 for p in range(PARTITIONS) if before.get(p) != after.get(p))
    revoked = {}
    for n in (w1, w2):
        for l in logs.of(n):
            if l["msg"] == "partitions revoked; draining them" and join <= l["at"] <= stable:
                for p in parts_of(l):
                    revoked.setdefault(p, l["at"])
    r["join: partitions revoked from existing members"] = sum(
        len(parts_of(l)) for n in (w1, w2) for l in logs.of(n)
        if l["msg"] == "partitions revoked; draining them" and join <= l["at"] <= stable)
    gaps = [max_gap(p, at - 0.5, stable + AFTER_S) for p, at in revoked.items()]
    kept = [max_gap(p, join, stable + AFTER_S) for p in range(PARTITIONS) if p not in revoked]
    r["join: revoked partitions' pause, median (s)"] = statistics.median(gaps) if gaps else 0
    r["join: revoked partitions' pause, max (s)"] = max(gaps) if gaps else 0
    r["join: kept partitions' longest gap (s)"] = max(kept) if kept else 0
    throughput("join", join, stable)

    # ---- leave and crash ----
    for phase, who in (("leave", w1), ("crash", w2)):
        t0, stable = ev[phase], ev["stable_" + phase]
        back = []
        for p in ev["held_" + phase]:
            later = [at for at, n in by_part.get(p, []) if at >= t0 and n != who]
            back.append(later[0] - t0 if later else float("inf"))
        r[phase + ": partitions it held"] = len(back)
        r[phase + ": its partitions processed by others, median (s)"] = statistics.median(back)
        r[phase + ": its partitions processed by others, last (s)"] = max(back)
        r[phase + ": group stable (s)"] = stable - t0
        throughput(phase, t0, stable)
    claimed = ev["claimed_crash"]
    if claimed:
        rows = s.query("SELECT payment_attempt_id, actor, extract(epoch FROM created_at) "
                       "FROM attempt_transitions WHERE new_status IN (%s) AND "
                       "payment_attempt_id IN ('%s')" % (
                           ", ".join("'%s'" % t for t in TERMINAL), "','".join(claimed)))
        others = [float(t) - ev["crash"] for _, actor, t in rows if actor != s.worker_ids[w2]]
        r["crash: its claimed attempts settled by others, last (s)"] = max(others or [0])

    # ---- duplicate work, per phase ----
    windows = (("join", ev["join"], ev["leave"]), ("leave", ev["leave"], ev["crash"]),
               ("crash", ev["crash"], float("inf")))

    def phase_of(t):
        for name, t0, t1 in windows:
            if t0 <= t < t1:
                return name
        return None
    calls = s.query("SELECT payment_attempt_id, extract(epoch FROM started_at) FROM "
                    "provider_calls WHERE operation = 'charge' ORDER BY payment_attempt_id, "
                    "started_at")
    extra, claims, seen = {}, {}, set()
    for aid, t in calls:
        if aid in seen:
            extra[phase_of(float(t))] = extra.get(phase_of(float(t)), 0) + 1
        seen.add(aid)
    rows = s.query("SELECT payment_attempt_id, actor, extract(epoch FROM created_at) FROM "
                   "attempt_transitions WHERE new_status = 'PROCESSING' ORDER BY "
                   "payment_attempt_id, created_at")
    actors = {}
    for aid, actor, t in rows:
        a = actors.setdefault(aid, set())
        if a and actor not in a and len(a) == 1:
            claims[phase_of(float(t))] = claims.get(phase_of(float(t)), 0) + 1
        a.add(actor)
    snaps = [ev["snap_join"], ev["snap_leave"], ev["snap_crash"], ev["final"]]
    for i, (phase, t0, t1) in enumerate(windows):
        (m0, c0), (m1, c1) = snaps[i], snaps[i + 1]
        r[phase + ": extra provider charge calls (provider_calls)"] = extra.get(phase, 0)
        r[phase + ": extra provider charge calls (psp-sim)"] = sum(
            c1[k] - c0[k] for k in ("replayed", "in_use_409"))
        r[phase + ": attempts claimed by more than one worker"] = claims.get(phase, 0)
        r[phase + ": commands redelivered (already settled)"] = outcome_delta(
            m0, m1, "already_settled")
        r[phase + ": in-flight work given up (released)"] = outcome_delta(m0, m1, "released")
        r[phase + ": rebalance callbacks, members that stay"] = outcome_delta(
            m0, m1, "rebalance callbacks")
        r[phase + ": partitions lost (log lines)"] = sum(
            1 for n in names for l in logs.of(n)
            if l["msg"] == "partitions lost" and t0 <= l["at"] < t1)
    return r


def fmt(v):
    if v != v:
        return "n/a"
    if v == float("inf"):
        return "never"
    return "%d" % v if float(v).is_integer() and abs(v) >= 1 or v == 0 else "%.2f" % v


def summary(values):
    vals = [v for v in values if v == v]
    if not vals:
        return "n/a"
    med = statistics.median(vals)
    return "%s [%s-%s]" % (fmt(med), fmt(min(vals)), fmt(max(vals)))


def main(new):
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    rate = int(sys.argv[2]) if len(sys.argv) > 2 else 100
    results = dict((p, []) for p in PROTOCOLS)
    for i in range(rounds):
        for proto in PROTOCOLS:
            e2e.log("round %d/%d, %s" % (i + 1, rounds, proto))
            r = one_round(new, proto, rate)
            results[proto].append(r)
            e2e.log("round %d %s: %s" % (i + 1, proto, json.dumps(r, sort_keys=True)))
    keys = list(results[PROTOCOLS[0]][0])
    width = max(len(k) for k in keys)
    print()
    print("%d rounds per protocol, alternating; %d commands/s, %d partitions, provider "
          "100-300 ms; median [min-max] over the rounds" % (rounds, rate, PARTITIONS))
    print("classic = classic protocol, cooperative-sticky; consumer = KIP-848")
    print()
    print("| %-*s | %-22s | %-22s |" % (width, "", "classic", "consumer"))
    print("|%s|%s|%s|" % ("-" * (width + 2), "-" * 24, "-" * 24))
    for k in keys:
        print("| %-*s | %-22s | %-22s |" % (width, k, *(
            summary([r.get(k, float("nan")) for r in results[p]]) for p in PROTOCOLS)))
    out = os.environ.get("CHARGED_BENCH_JSON")
    if out:
        with open(out, "w") as f:
            json.dump(results, f, indent=1, sort_keys=True)


if __name__ == "__main__":
    sys.exit(e2e.main(main))
