#!/usr/bin/env python3
"""SIGTERM with attempts in flight: the worker stops fetching, lets its
provider calls finish, persists them, commits the offsets and exits 0."""
import signal
import time

import charged_e2e as e2e
from charged_e2e import check


def scenario(new):
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


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
