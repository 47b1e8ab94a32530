#!/usr/bin/env python3
"""SIGTERM with attempts in flight: the worker stops fetching, lets its
provider calls finish, persists them, commits the offsets and exits 0.

And SIGTERM while the worker holds a backlog (WORKER_MAX_IN_FLIGHT=2, one
partition, ten commands, psp-sim stopped so that two calls stay in
flight): the drain finishes the two calls but starts nothing from the
backlog, so no attempt beyond those two is recorded or charged after the
signal; the exit status is 1 (messages taken were left uncommitted), and
a fresh worker charges the other eight, each exactly once."""
import signal
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq


def calls_finish(new):
    s = new("sigterm", psp_args=["--latency-ms", "1500"])
    cmds = [e2e.new_command() for _ in range(30)]
    w = s.start_worker(SHUTDOWN_TIMEOUT_MS=20000)
    s.publish(cmds)
    e2e.wait_until("provider calls in flight", lambda: int(s.query(
        "SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING'")[0][0]) >= 10, 60,
        interval=0.05)
    t0 = time.monotonic()
    rc = s.kill_worker(w, signal.SIGTERM)
    e2e.log("exit status", rc, "after %.1fs" % (time.monotonic() - t0))
    check(rc == 0, "the worker exited %s after SIGTERM, want 0" % rc)
    rows = s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
    statuses = dict((r[0], int(r[1])) for r in rows)
    check("PROCESSING" not in statuses and "PENDING" not in statuses,
          "attempts left unfinished after the drain: %s" % statuses)
    check(statuses.get("SUCCEEDED", 0) >= 10,
          "want the >= 10 calls in flight finished SUCCEEDED: %s" % statuses)
    # What it finished is committed: a fresh worker finds only the rest.
    done = statuses["SUCCEEDED"]
    lag = s.lag()["lag"]
    check(lag == len(cmds) - done, "lag %d, but %d of %d are done" % (lag, done, len(cmds)))
    s.start_worker()
    s.wait_settled(len(cmds), timeout=120)
    s.check_invariants()


def backlog_not_started(new):
    s = new("sigterm_backlog", partitions=1)
    cmds = [e2e.new_command() for _ in range(10)]
    w = s.start_worker(SHUTDOWN_TIMEOUT_MS=20000, WORKER_MAX_IN_FLIGHT=2,
                       # The calls are held for seconds: no time-out meanwhile.
                       PROVIDER_TIMEOUT_MS=20000, WORKER_UNKNOWN_RETRIES=0,
                       WORKER_LEASE_MS=30000)
    e2e.wait_until("the worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    s.psp_freeze()
    s.publish(cmds)
    e2e.wait_until("two calls in flight", lambda: s.admin_metrics(w).get(
        "charged_provider_calls_in_flight") == 2, 30, 0.05)
    started = {r[0] for r in s.query("SELECT id FROM payment_attempts")}
    check_eq(len(started), 2, "attempts recorded with two calls in flight")
    s.workers[w].send_signal(signal.SIGTERM)
    e2e.wait_until("the worker's drain", lambda: s.worker_log(w, "stopping: draining"), 30,
                   0.05)
    s.psp_thaw()
    rc = s.wait_worker_exit(w, 60)
    stopped = s.worker_log(w, "stopped")
    e2e.log("exit status", rc, "; stopped:", stopped[-1] if stopped else None)
    recorded = {r[0] for r in s.query("SELECT id FROM payment_attempts")}
    check_eq(sorted(recorded - started), [],
             "attempts recorded after SIGTERM (backlog messages the drain started)")
    charged = {c["payment_attempt_id"] for c in s.ledger()}
    check_eq(sorted(charged - started), [], "attempts charged after SIGTERM")
    check_eq(s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1"),
             [["SUCCEEDED", "2"]], "the two calls in flight, after the drain")
    check_eq(rc, 1, "exit status with backlog messages left uncommitted")
    s.start_worker()
    s.wait_settled(len(cmds), timeout=120)
    s.check_invariants()
    for c in cmds:
        charges = [x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]]
        check_eq(len(charges), 1, "charges of attempt %s" % c["payment_attempt_id"])


def scenario(new):
    calls_finish(new)
    backlog_not_started(new)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
