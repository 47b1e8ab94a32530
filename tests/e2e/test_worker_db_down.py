#!/usr/bin/env python3
"""PostgreSQL down: a worker keeps running, and shuts down on time.

A. A worker started while PostgreSQL is down keeps running; commands
   published meanwhile (chargectl publish needs only Kafka) are all
   SUCCEEDED, and committed, within 30 s of the database coming back; the
   invariants hold. While it holds them with the database down, it waits
   for the database's back-off instead of spinning: its CPU time over that
   window (utime + stime of /proc/<pid>/stat) stays under a quarter of the
   window's wall time (a loop that spins takes a whole core).

B. Whatever its jobs' state, a worker exits within SHUTDOWN_TIMEOUT_MS of
   SIGTERM: with provider calls in flight and PostgreSQL gone (so nothing
   can be persisted), SIGTERM with SHUTDOWN_TIMEOUT_MS=3000 ends it within
   3 s (+2 s slack), with status 1 because work was left unfinished (0 only
   if it really finished everything). The same with PostgreSQL up but
   provider calls that outlast the deadline. Afterwards a fresh worker takes
   the attempts over and nothing is charged twice.

PostgreSQL is restarted in a finally block whatever happens."""
import os
import signal
import subprocess
import time

import charged_e2e as e2e

SHUTDOWN_MS = 3000
SLACK_S = 2.0


def log_tail(s, name, n=5):
    try:
        with open("%s/%s.log" % (s.dir, name), "rb") as f:
            lines = f.read().decode(errors="replace").splitlines()
        return "\n    ".join(l[:400] for l in lines[-n:])
    except OSError:
        return "(no log)"


def assert_running(s, name, what):
    rc = s.workers[name].poll()
    if rc is not None:
        raise e2e.Failure("worker %s exited with status %s %s; last log lines:\n    %s"
                          % (name, rc, what, log_tail(s, name)))


def hold_running(s, name, seconds, what):
    """Keeps a fault active for `seconds`, failing as soon as the worker exits."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert_running(s, name, what)
        time.sleep(0.1)
    assert_running(s, name, what)


def count(s, sql):
    return int(s.query(sql)[0][0])


def cpu_seconds(pid):
    """User plus system CPU time process pid has used, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of proc(5); fields[0] is field 3.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# The share of one core the worker may use while the database is down:
# waiting for its back-off costs next to nothing, spinning takes it all.
MAX_CPU_SHARE = 0.25


def case_start_while_down(s):
    cmds = [e2e.new_command() for _ in range(20)]
    ids = ",".join("'%s'" % c["payment_attempt_id"] for c in cmds)
    try:
        e2e.pg_stop_immediate()
        t_start = time.monotonic()
        w = s.start_worker()
        hold_running(s, w, 5.0, "while PostgreSQL was down")
        e2e.log("worker still running %.1fs after it started with PostgreSQL down"
                % (time.monotonic() - t_start))
        s.publish(cmds)  # only Kafka is needed for this
        e2e.log("published", len(cmds), "commands with PostgreSQL down")
        # A record step failed: the worker holds the commands.
        e2e.wait_until("the worker's record step failing", lambda: assert_running(
            s, w, "while PostgreSQL was down") or [
                l for l in s.worker_log(w, "database step failed")
                if l.get("stage") == "record"], 30, interval=0.1)
        pid = s.workers[w].pid
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        hold_running(s, w, 3.0, "while PostgreSQL was down")
        cpu, wall = cpu_seconds(pid) - cpu0, time.monotonic() - t0
        e2e.log("worker CPU time with PostgreSQL down, holding the commands: %.2fs in "
                "%.2fs" % (cpu, wall))
        e2e.check(cpu < MAX_CPU_SHARE * wall,
                  "the worker used %.2fs of CPU in %.2fs with PostgreSQL down (more than "
                  "%d%% of a core): it does not wait for the database's back-off"
                  % (cpu, wall, MAX_CPU_SHARE * 100))
        e2e.pg_start()
        t_back = time.monotonic()
    finally:
        e2e.stack_restore()

    def all_done():
        assert_running(s, w, "after PostgreSQL came back")
        n = count(s, "SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED' "
                     "AND id IN (%s)" % ids)
        return n == len(cmds) and s.lag()["lag"] == 0
    try:
        e2e.wait_until("all 20 SUCCEEDED and committed within 30s of PostgreSQL's restart",
                       all_done, 30 - (time.monotonic() - t_back), interval=0.25)
    except e2e.Failure as e:
        rows = s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
        raise e2e.Failure("%s: attempts %s, lag %s; last log lines of %s:\n    %s" % (
            e, dict((r[0], int(r[1])) for r in rows), s.lag()["lag"], w, log_tail(s, w)))
    e2e.log("all %d SUCCEEDED and committed %.1fs after PostgreSQL came back"
            % (len(cmds), time.monotonic() - t_back))
    s.check_invariants()
    assert_running(s, w, "at the end")


def sigterm_within(s, name, limit):
    """SIGTERM, then the exit status and how long it took; Failure (and
    SIGKILL) when the worker outlives `limit` seconds."""
    p = s.workers[name]
    t0 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        # Too late already; give it a while longer only to say how late.
        try:
            rc = p.wait(timeout=10)
            late = "exited with status %d only %.1fs after SIGTERM" % (
                rc, time.monotonic() - t0)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=30)
            late = "still ran %.1fs after SIGTERM; killed it" % (time.monotonic() - t0)
        del s.workers[name]
        raise e2e.Failure("worker %s %s (SHUTDOWN_TIMEOUT_MS=%d, allowed %.1fs); "
                          "last log lines:\n    %s"
                          % (name, late, SHUTDOWN_MS, limit, log_tail(s, name)))
    del s.workers[name]
    took = time.monotonic() - t0
    e2e.log("worker %s exited with status %d %.2fs after SIGTERM" % (name, rc, took))
    return rc, took


def unfinished(s, ids):
    """Attempts among ids not settled, missing, or messages not committed."""
    open_ = count(s, "SELECT count(*) FROM payment_attempts WHERE id IN (%s) AND "
                     "(status = 'PENDING' OR status = 'PROCESSING')" % ",".join(
                         "'%s'" % i for i in ids))
    recorded = count(s, "SELECT count(*) FROM payment_attempts WHERE id IN (%s)" % ",".join(
        "'%s'" % i for i in ids))
    return open_ + (len(ids) - recorded), s.lag()["lag"]


def expect_status(rc, left, lag, what):
    want = 1 if (left or lag) else 0
    if rc != want:
        raise e2e.Failure("%s: exit status %d, but %d attempts were unfinished and %d messages "
                          "uncommitted (want status %d)" % (what, rc, left, lag, want))


def warm_up(s, name):
    """One command through the worker, so that it has joined the group."""
    c = e2e.new_command()
    s.publish([c])
    e2e.wait_until("the worker's first charge", lambda: assert_running(s, name, "warming up")
                   or s.query("SELECT status FROM payment_attempts WHERE id = '%s'"
                              % c["payment_attempt_id"]) == [["SUCCEEDED"]], 60)
    return c


def case_shutdown_with_database_down(s):
    w = s.start_worker(SHUTDOWN_TIMEOUT_MS=SHUTDOWN_MS)
    warm_up(s, w)
    cmds = [e2e.new_command() for _ in range(20)]
    ids = [c["payment_attempt_id"] for c in cmds]
    try:
        s.publish(cmds)
        e2e.wait_until("provider calls in flight", lambda: count(
            s, "SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING'") >= 5, 30,
            interval=0.05)
        e2e.pg_stop_immediate()
        hold_running(s, w, 1.0, "after PostgreSQL went away, before SIGTERM")
        rc, took = sigterm_within(s, w, SHUTDOWN_MS / 1000.0 + SLACK_S)
        e2e.pg_start()
    finally:
        e2e.stack_restore()
    left, lag = unfinished(s, ids)
    e2e.log("after the exit: %d of %d attempts unfinished, lag %d" % (left, len(ids), lag))
    expect_status(rc, left, lag, "SIGTERM with PostgreSQL down")
    # What it left is taken over once its leases expire; nothing twice.
    s.start_worker()
    s.wait_settled(len(cmds) + 1, timeout=90)
    s.check_invariants()


def case_shutdown_with_calls_outlasting_it(s):
    w = s.start_worker(SHUTDOWN_TIMEOUT_MS=SHUTDOWN_MS)
    warm_up(s, w)
    cmds = [e2e.new_command() for _ in range(10)]
    ids = [c["payment_attempt_id"] for c in cmds]
    s.publish(cmds)
    e2e.wait_until("provider calls in flight", lambda: count(
        s, "SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING'") >= 5, 30,
        interval=0.05)
    rc, took = sigterm_within(s, w, SHUTDOWN_MS / 1000.0 + SLACK_S)
    left, lag = unfinished(s, ids)
    e2e.log("after the exit: %d of %d attempts unfinished, lag %d" % (left, len(ids), lag))
    expect_status(rc, left, lag, "SIGTERM with provider calls outlasting the deadline")
    s.start_worker()
    s.wait_settled(len(cmds) + 1, timeout=90)
    s.check_invariants()


CASES = [
    (case_start_while_down, lambda new: new("db_down_start")),
    (case_shutdown_with_database_down,
     lambda new: new("db_down_shutdown", psp_args=["--latency-ms", "1500"])),
    # Provider answers take 6 s; the shutdown deadline is 3 s.
    (case_shutdown_with_calls_outlasting_it,
     lambda new: new("shutdown_slow_provider", psp_args=["--latency-ms", "6000"], worker_env={
         "PROVIDER_TIMEOUT_MS": "7000", "WORKER_UNKNOWN_RETRIES": "0",
         "WORKER_LEASE_MS": "8000"})),
]


def scenario(new):
    e2e.stack_check()
    t0 = time.monotonic()
    problems = []
    for case, make in CASES:
        t = time.monotonic()
        e2e.log("==", case.__name__)
        s = make(new)
        try:
            case(s)
            e2e.log("== %s passed (%.0fs)" % (case.__name__, time.monotonic() - t))
        except (e2e.Failure, AssertionError) as e:
            e2e.log("== %s FAILED (%.0fs): %s" % (case.__name__, time.monotonic() - t, e))
            problems.append("%s: %s" % (case.__name__, e))
        finally:
            s.close()
    e2e.log("all cases took %.0fs" % (time.monotonic() - t0))
    if problems:
        raise e2e.Failure("\n  - " + "\n  - ".join(problems))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
