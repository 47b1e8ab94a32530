#!/usr/bin/env python3
"""A worker exits within SHUTDOWN_TIMEOUT_MS whatever its jobs' state, and
at once on a second SIGTERM.

The provider takes 15 s over every charge (psp-sim --latency-ms 15000),
longer than any shutdown bound here (9 s at most, ASan slack included), so the worker's calls are still in flight
when it is told to stop.
  A. SHUTDOWN_TIMEOUT_MS=3000: one SIGTERM; the worker exits within 3 s
     (+2 s slack) with status 1 (work left unfinished).
  B. SHUTDOWN_TIMEOUT_MS=60000: SIGTERM, and a second one 0.5 s later; the
     worker exits within 2 s of the second, with status 1.
The slack (not SHUTDOWN_TIMEOUT_MS) is stretched by CHARGED_TEST_TIMEOUT_SCALE
for slow builds; it stays below the provider's 15 s.
Neither leaves an attempt FAILED. After each, with psp-sim's latency set
back to 0 through its admin API (and any lease the worker left behind
expired by the test rather than waited out), a fresh worker settles every
attempt once the provider is done with the abandoned calls, and the
invariants hold (lag 0, no key charged twice).

The two cases run in two scenarios, the second while the first one's
abandoned calls are still held at its provider, so that the test waits for
the provider's 15 s once, not twice."""
import signal
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

LATENCY_S = 15
SLOW = {
    "PROVIDER_TIMEOUT_MS": 65000,
    "WORKER_LEASE_MS": 200000,
    "WORKER_UNKNOWN_RETRIES": 0,
}
N = 5
SLACK_S = e2e.scaled(2.0)  # process exit after the deadline; slow under ASan


def start_case(new, name, shutdown_ms):
    s = new(name, psp_args=["--latency-ms", str(LATENCY_S * 1000)])
    s.cmds = [e2e.new_command() for _ in range(N)]
    w = s.start_worker(SHUTDOWN_TIMEOUT_MS=shutdown_ms, **SLOW)
    s.publish(s.cmds)

    def in_flight():
        processing = int(s.query("SELECT count(*) FROM payment_attempts "
                                 "WHERE status = 'PROCESSING'")[0][0])
        return processing >= 1 and s.psp_get("/ledger")["counters"]["requests"] >= 1
    e2e.wait_until("a provider call in flight", in_flight, 30, 0.05)
    s.calls_started = time.monotonic()
    e2e.log(name, ": calls in flight:", s.psp_get("/ledger")["counters"]["requests"])
    return s, w


def after_exit(s, name, rc, want_within, elapsed):
    e2e.log(name, ": worker exited %s after %.2fs" % (rc, elapsed))
    check(rc == 1, "%s: the worker exited %s after %.2fs; want status 1 (work left "
          "unfinished)" % (name, rc, elapsed))
    check(elapsed <= want_within, "%s: exit took %.2fs, more than %.1fs" % (
        name, elapsed, want_within))
    rows = s.query("SELECT status, count(*) FROM payment_attempts GROUP BY 1")
    statuses = dict((r[0], int(r[1])) for r in rows)
    check("FAILED" not in statuses, "%s: attempts FAILED at shutdown: %s" % (name, statuses))
    # Leases the worker did not release would keep a fresh worker away for
    # WORKER_LEASE_MS (200 s). Exiting without releasing them is allowed (they
    # expire); the test makes them expire now instead of waiting.
    held = s.query("UPDATE payment_attempts SET lease_expires_at = now() - interval '1 second' "
                   "WHERE status = 'PROCESSING' AND lease_owner IS NOT NULL "
                   "AND lease_expires_at > now() RETURNING id")
    e2e.log(name, ": after the exit:", statuses, "; leases left held (expired by the test):",
            len(held))


def resume(s):
    """Latency back to 0 and a fresh, ordinary worker."""
    s.psp_put("/faults", {}, method="DELETE")
    faults = s.psp_get("/faults")
    check_eq(faults.get("latency_ms"), 0, "psp-sim's latency after DELETE /faults (%s)" % faults)
    s.start_worker()


def finish(s, name):
    # The abandoned calls are held at the provider until their 15 s are up.
    left = s.calls_started + LATENCY_S + 30 - time.monotonic()
    s.wait_settled(N, timeout=max(left, 20))
    counts = s.check_invariants()
    check("FAILED" not in counts, "%s: attempts FAILED: %s" % (name, counts))
    for c in s.cmds:
        charges = [x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]]
        check(len(charges) <= 1, "%s: key %s charged %d times: %s" % (
            name, c["idempotency_key"], len(charges), charges))
    e2e.log(name, ": settled by a fresh worker:", counts)


def scenario(new):
    # Case A: one SIGTERM, SHUTDOWN_TIMEOUT_MS=3000.
    a, wa = start_case(new, "shutdown_a", 3000)
    t0 = time.monotonic()
    a.workers[wa].send_signal(signal.SIGTERM)
    bound = 3.0 + SLACK_S
    try:
        rc = a.wait_worker_exit_or_kill(wa, bound - (time.monotonic() - t0))
    except e2e.Failure:
        raise e2e.Failure("case A: no exit within %.1fs of SIGTERM (SHUTDOWN_TIMEOUT_MS=3000 + "
                          "%.1fs) with provider calls in flight; killed it with SIGKILL"
                          % (bound, SLACK_S)) from None
    after_exit(a, "case A", rc, bound, time.monotonic() - t0)
    resume(a)

    # Case B: SIGTERM, then a second SIGTERM 0.5 s later, SHUTDOWN_TIMEOUT_MS=60000.
    b, wb = start_case(new, "shutdown_b", 60000)
    p = b.workers[wb]
    p.send_signal(signal.SIGTERM)
    t_first = time.monotonic()
    e2e.wait_until("0.5s after the first SIGTERM",
                   lambda: p.poll() is not None or time.monotonic() - t_first >= 0.5, 5, 0.02)
    check(p.poll() is None, "case B: the worker exited %s on the first SIGTERM, with calls in "
          "flight and SHUTDOWN_TIMEOUT_MS=60000" % p.returncode)
    t1 = time.monotonic()
    p.send_signal(signal.SIGTERM)
    try:
        rc = b.wait_worker_exit_or_kill(wb, SLACK_S - (time.monotonic() - t1))
    except e2e.Failure:
        raise e2e.Failure("case B: no exit within %.1fs of the second SIGTERM; killed it with "
                          "SIGKILL" % SLACK_S) from None
    after_exit(b, "case B", rc, SLACK_S, time.monotonic() - t1)
    resume(b)

    finish(a, "case A")
    finish(b, "case B")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
