#!/usr/bin/env python3
"""Adversary 38, break: a member paused inside its refresh transaction (a
stopped pod, a VM pause, a partition that keeps the TCP connection) holds
the provider_budget row lock that every refresh of the fleet needs, until
the server ends its session (idle_in_transaction_session_timeout, 5 s).
Every other member's refresh times out on the lock (then 200 ms), each keeps its
share until its lease ends (1 s), then sends nothing: the whole fleet stops,
though docs/architecture.md says a member cut off ("a partition, a pause")
costs only its own share for one lease plus one refresh period.

Forced, not hoped for: the test holds the settings row lock for a moment,
waits until worker A's refresh queues behind it, SIGSTOPs A, and lets go:
A's backend takes the lock and sits idle in the transaction while A is
stopped. Worker B has charges queued the whole time. Counted from psp-sim's
per-second series: B must go on sending while A is frozen."""
import os
import time

import charged_e2e as e2e
from charged_e2e import check

LIMIT = 20
PG_PORT = int(os.environ.get("CHARGED_PG_PORT", "55721"))
FREEZE_S = 4.2  # under the server's 5 s idle_in_transaction_session_timeout


def pg_ports(pid):
    """Local TCP ports of pid's connections to PostgreSQL."""
    inodes = set()
    for fd in os.listdir("/proc/%d/fd" % pid):
        try:
            t = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if t.startswith("socket:["):
            inodes.add(t[8:-1])
    ports = set()
    for table in ("/proc/%d/net/tcp" % pid, "/proc/%d/net/tcp6" % pid):
        with open(table) as f:
            for line in f.readlines()[1:]:
                c = line.split()
                if c[9] in inodes and int(c[2].rsplit(":", 1)[1], 16) == PG_PORT:
                    ports.add(int(c[1].rsplit(":", 1)[1], 16))
    return ports


def freeze_in_refresh(s, pid):
    """Stops pid while its backend holds the budget's settings row lock,
    idle in the transaction; returns when it is so."""
    holder, watch = e2e.Session(s.db), e2e.Session(s.db)
    for attempt in range(20):
        ports = ",".join(str(p) for p in pg_ports(pid)) or "0"
        holder.run("BEGIN")
        holder.run("SELECT 1 FROM provider_budget WHERE account = 'default' FOR UPDATE")
        queued = False
        for _ in range(40):
            if watch.run("SELECT count(*) FROM pg_stat_activity WHERE client_port IN (%s)"
                         " AND wait_event_type = 'Lock'" % ports)[0][0] != "0":
                queued = True
                break
            time.sleep(0.01)
        if queued:
            e2e.freeze(pid)
        holder.run("COMMIT")
        if queued:
            # A's backend takes the lock and goes idle in the transaction;
            # seen at once (polled, not after a fixed sleep: a fixed budget
            # may end that transaction within a few hundred ms).
            held = "0"
            deadline = time.time() + 0.3
            while held == "0" and time.time() < deadline:
                held = watch.run("SELECT count(*) FROM pg_stat_activity WHERE client_port"
                                 " IN (%s) AND state = 'idle in transaction'" % ports)[0][0]
                time.sleep(0.005)
            if held != "0":
                e2e.log("worker frozen holding the settings row lock (try %d)" % attempt)
                holder.close()
                watch.close()
                return
            os.kill(pid, 18)  # SIGCONT: its lock wait timed out; again
        time.sleep(0.1)
    raise e2e.Failure("could not freeze the worker inside its refresh")


def scenario(new):
    s = new("adv38_frozen", partitions=4,
            psp_args=["--rate-limit", str(LIMIT)])
    s.set_limits("--global", str(LIMIT), actor="adv38")
    a, b = s.start_worker(), s.start_worker()
    s.wait_group_settled([a, b])
    s.publish([e2e.new_command(amount=100 + i) for i in range(400)])
    e2e.wait_until("charges flowing", lambda: len(s.ledger()) >= 40, e2e.scaled(30), 0.1)
    pid = s.process(a).pid
    freeze_in_refresh(s, pid)
    frozen_at = time.time()
    time.sleep(FREEZE_S)
    os.kill(pid, 18)  # SIGCONT
    time.sleep(1.5)
    series = s.psp_get("/rate-limits")["per_second"]
    e2e.log("psp-sim per second (at - frozen, served, throttled):",
            [(round(q["at"] - frozen_at, 1), q["served"], q["throttled"]) for q in series])
    left = s.query("SELECT count(*) FROM payment_attempts WHERE status IN "
                   "('PENDING', 'PROCESSING')")[0][0]
    check(int(left) > 0, "the charges ran out: no demand to judge the freeze by")
    # A's share for one lease plus a refresh may be lost; B's may not. The
    # whole seconds from 1.5 s after the freeze to its end:
    lo, hi = frozen_at + 1.5, frozen_at + FREEZE_S
    secs = list(range(int(lo) + 1, int(hi)))  # every whole second inside, even empty ones
    check(secs, "no whole second inside the freeze")
    during = {q["at"]: q["served"] for q in series}
    starved = [t for t in secs if during.get(t, 0) < LIMIT // 4]
    check(not starved,
          "while one worker was frozen inside its budget refresh, the fleet sent %s "
          "requests in the whole seconds %s (limit %d/s, worker B had charges queued): "
          "one paused member stopped every member"
          % ([during.get(t, 0) for t in secs], [round(t - frozen_at, 1) for t in secs],
             LIMIT))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
