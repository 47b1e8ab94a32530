#!/usr/bin/env python3
"""The provider goes away (psp-sim killed: connections refused) while
commands keep arriving, for longer than a lease. The workers' breakers open:
no attempt is marked UNKNOWN or FAILED for it, no new provider call starts,
fetching stops (the committed offsets stay put, the lag grows, commands
published meanwhile are not even recorded) and the leases held are renewed.
A worker stopped with SIGTERM while its breaker is open exits at once,
handing its unsent attempts back; the other worker is given its partitions
while paused, and keeps them paused. psp-sim comes back on the same port:
the breaker closes, fetching resumes on every partition, and every attempt
is charged exactly once."""
import signal
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

LEASE_MS = 6000
ENV = {
    "PROVIDER_TIMEOUT_MS": "1000",
    "WORKER_LEASE_MS": str(LEASE_MS),
    "PROVIDER_BREAKER_MIN_CALLS": "5",
    "PROVIDER_BREAKER_OPEN_MS": "1000",
    "PROVIDER_BREAKER_PROBES": "2",
    "REBALANCE_DRAIN_MS": "2000",
    "SHUTDOWN_TIMEOUT_MS": "20000",
}


def statuses(s):
    return dict((r[0], int(r[1])) for r in s.query(
        "SELECT status, count(*) FROM payment_attempts GROUP BY 1"))


def never_unknown_or_failed(s):
    rows = s.query("SELECT payment_attempt_id, new_status, reason FROM attempt_transitions "
                   "WHERE new_status IN ('UNKNOWN', 'FAILED')")
    check(not rows, lambda: "attempts marked UNKNOWN or FAILED during the outage: %s" % rows[:5])


def recorded(s, cmds):
    ids = ",".join("'%s'" % c["payment_attempt_id"] for c in cmds)
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE id IN (%s)" % ids)[0][0])


def committed(s):
    return {p["partition"]: p["committed"] for p in s.lag()["partitions"]}


def renewed_through_outage(s, name):
    """How many attempts `name` claimed more than a lease ago and still
    holds a live lease on: it renewed them."""
    return int(s.query(
        "SELECT count(*) FROM payment_attempts p WHERE p.lease_owner = '{0}' AND "
        "p.lease_expires_at > now() AND (SELECT max(created_at) FROM attempt_transitions t "
        "WHERE t.payment_attempt_id = p.id AND t.new_status = 'PROCESSING' AND "
        "t.actor = '{0}') < now() - make_interval(secs => {1})".format(
            s.worker_ids[name], LEASE_MS / 1000.0))[0][0])


def scenario(new):
    s = new("breaker_refused", partitions=12, worker_env=ENV)
    w1 = s.start_worker()
    w2 = s.start_worker()
    first = [e2e.new_command() for _ in range(40)]
    s.publish(first)
    s.wait_settled(len(first), timeout=120)
    # No rebalance left in the air: w1 must keep what it takes during the
    # outage. A cooperative rebalance still moving partitions from w1 to w2
    # would take attempts out of w1's hands, and w1 would hold nothing to
    # renew.
    s.wait_group_settled([w1, w2])

    # Nothing is in flight: the ledger read before the kill is complete.
    s.psp_kill()
    during = [e2e.new_command() for _ in range(60)]
    s.publish(during)
    for w in (w1, w2):
        e2e.wait_until("%s's breaker to open" % w,
                       lambda: s.worker_log(w, "provider breaker opened: "), 60)
        e2e.wait_until("%s to pause fetching" % w,
                       lambda: s.worker_log(w, "fetching paused"), 30)
    # Not ready while the breaker holds fetching; the metrics say why.
    e2e.wait_until("w1's /readyz to say the breaker is open", lambda: s.admin_get(
        w1, "/readyz") == (503, "not ready: provider breaker open\n"), 30)
    m = s.admin_metrics(w1)
    check(m.get("charged_provider_breaker_state", 0) >= 1 and
          m.get("charged_provider_breaker_opens_total", 0) >= 1,
          lambda: "w1's breaker metrics while open: %s" % {
              k: v for k, v in m.items() if "breaker" in k or k == "charged_ready"})
    check_eq(m.get("charged_ready"), 0.0, "w1's charged_ready while open")
    opened = s.worker_log(w1, "provider breaker opened: ")[0]
    e2e.log("w1:", opened)
    check("refused" in opened.get("error", "").lower() or
          "connect" in opened.get("error", "").lower(),
          "the breaker should open on refused connections: %s" % opened)

    # SIGTERM while open: no call to wait for, so it does not wait for its
    # deadline; what it did not send goes back, leases released.
    t0 = time.monotonic()
    s.workers[w2].send_signal(signal.SIGTERM)
    rc = s.wait_worker_exit_or_kill(w2, 20)
    e2e.log("w2 exited", rc, "after %.1fs" % (time.monotonic() - t0))
    check_eq(rc, 1, "w2's exit status (attempts left to the next owner)")
    check(s.worker_log(w2, "provider breaker open: calls not sent are left"),
          "w2 should stop draining because of the open breaker")
    held = s.query("SELECT count(*) FROM payment_attempts WHERE lease_owner = '%s' "
                   "AND lease_expires_at > now()" % s.worker_ids[w2])[0][0]
    check_eq(held, "0", "attempts still leased by w2 after its exit")

    # w1 is given w2's partitions while its breaker is open: they wait too.
    e2e.wait_until("w1 to be given w2's partitions, paused", lambda: [
        l for l in s.worker_log(w1, "partitions assigned") if l.get("paused") == "true"], 60)
    # The commits w2 made on its way out have landed.
    before = committed(s)
    late = [e2e.new_command() for _ in range(60)]
    s.publish(late)
    reopened = len(s.worker_log(w1, "provider breaker opened again"))
    # Two more failed probes: the worker has been turning its loop all along.
    e2e.wait_until("two more failed probes of w1", lambda: len(
        s.worker_log(w1, "provider breaker opened again")) >= reopened + 2, 60)
    # The outage outlasts the leases of the attempts waiting for the breaker:
    # they are renewed all along, not lost.
    e2e.wait_until("w1 to hold leases it took more than a lease ago",
                   lambda: renewed_through_outage(s, w1) > 0, 60)
    never_unknown_or_failed(s)
    check_eq(recorded(s, late), 0, "commands published while paused that were taken")
    check_eq(committed(s), before, "committed offsets while paused")
    check(s.lag()["lag"] >= len(late), "the lag grows while paused: %s" % s.lag())
    # The probes are look-ups that charge nothing, and they failed: no
    # attempt was sent to the provider to find out whether it is back.
    probes = s.worker_log(w1, "provider breaker probe answered")
    check(probes and all(l.get("answer") == "failure" for l in probes),
          "w1's probes of the killed provider: %s" % probes[:3])
    # A refused connection is a definite "not sent", whatever it was: a
    # first call, a retry or a probe.
    refused = s.query("SELECT outcome, count(*) FROM provider_calls WHERE http_status IS NULL "
                      "GROUP BY 1")
    check(refused and all(r[0] == "not_executed" for r in refused),
          "calls to the killed provider, by outcome: %s" % refused)

    s.psp_restart()
    e2e.wait_until("w1's breaker to close",
                   lambda: s.worker_log(w1, "provider breaker closed"), 60)
    s.wait_settled(len(first) + len(during) + len(late), timeout=180)
    e2e.wait_until("w1 ready again", lambda: s.admin_get(w1, "/readyz")[0] == 200, 30)
    check_eq(s.admin_metrics(w1).get("charged_provider_breaker_state"), 0.0,
             "w1's breaker state once closed")
    never_unknown_or_failed(s)
    counts = s.check_invariants()
    check_eq(counts, {"SUCCEEDED": len(first) + len(during) + len(late)},
             "attempts by status")
    check_eq(len(s.ledger()), len(first) + len(during) + len(late),
             "charges at the provider (one per attempt)")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
