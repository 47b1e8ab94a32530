#!/usr/bin/env python3
"""The provider stops answering (psp-sim stopped with SIGSTOP: connections
are accepted, requests sent, nothing answered) with calls in flight, while
commands keep arriving, for longer than a lease. The calls in flight time
out after sending (outcome unknown); the breaker opens on them and they
count no try: no attempt is marked UNKNOWN or FAILED. A second worker joins
while the first is paused: the partitions it takes from the paused one are
fetched by it. psp-sim goes on (SIGCONT) with the requests it had
received: the breakers close; the second worker leaves, and the partitions
the first had given up while paused come back to it and are fetched. Every
attempt is charged exactly once (the re-sent keys are replayed)."""
import signal
import threading

import charged_e2e as e2e
from charged_e2e import check, check_eq

LEASE_MS = 8000
# Timeouts before the breaker opens count tries (charge_policy_count_try:
# only the one that opens it is spared). With 1 s timeouts and no back-off
# to speak of, an attempt used three tries in the 3 s a loaded machine took
# to open the breaker and was settled UNKNOWN (a fresh-clone run, 9068378).
# Five tries outlast the opening by far; the outage outlasts five tries.
# (The lease must outlast them: the worker refuses a shorter one.)
RETRIES = 4
ENV = {
    "PROVIDER_TIMEOUT_MS": "1000",
    "WORKER_UNKNOWN_RETRIES": str(RETRIES),
    "WORKER_LEASE_MS": str(LEASE_MS),
    "PROVIDER_BREAKER_MIN_CALLS": "5",
    "PROVIDER_BREAKER_OPEN_MS": "1000",
    "PROVIDER_BREAKER_PROBES": "2",
    "REBALANCE_DRAIN_MS": "2000",
}


class Publisher(threading.Thread):
    """Publishes a batch of commands every 0.3 s until stopped."""

    def __init__(self, s):
        super().__init__(daemon=True)
        self.s, self.sent, self.error = s, [], None
        self.stop = threading.Event()

    def run(self):
        try:
            while not self.stop.is_set():
                batch = [e2e.new_command() for _ in range(10)]
                self.s.publish(batch)
                self.sent.extend(batch)
                self.stop.wait(0.3)
        except Exception as e:  # reported by finish()
            self.error = e

    def finish(self):
        self.stop.set()
        self.join(timeout=e2e.scaled(60))
        check(self.error is None, lambda: "publishing failed: %s" % self.error)
        return self.sent


def never_unknown_or_failed(s):
    rows = s.query("SELECT payment_attempt_id, new_status, reason FROM attempt_transitions "
                   "WHERE new_status IN ('UNKNOWN', 'FAILED')")
    check(not rows, lambda: "attempts marked UNKNOWN or FAILED during the outage: %s" % rows[:5])


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
    s = new("breaker_stall", partitions=12, worker_env=ENV, psp_args=["--latency-ms", "200"])
    w1 = s.start_worker()
    pub = Publisher(s)
    pub.start()
    try:
        e2e.wait_until("charges flowing, calls in flight", lambda: len(s.ledger()) >= 30 and int(
            s.query("SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING' "
                    "AND lease_owner IS NOT NULL")[0][0]) >= 3, 60, interval=0.05)
        s.psp_freeze()
        e2e.wait_until("w1's breaker to open",
                       lambda: s.worker_log(w1, "provider breaker opened: "), 60)
        e2e.log("w1:", s.worker_log(w1, "provider breaker opened: ")[0])
        # The call whose failure opened it (a call that timed out after
        # sending) counted no try.
        late = [l for l in s.worker_log(w1, "provider answered") if l.get("outage") == "true"]
        check(late, "want the call whose failure opened the breaker")
        check(any(l.get("outcome") == "unknown" for l in late),
              "want a call that timed out after sending to have opened it")

        # A worker joins while w1 is paused: w1 drains and gives up what it is
        # revoked (its unsent calls wait for the next owner), w2 fetches it.
        revoked = len(s.worker_log(w1, "revoked partitions drained"))
        w2 = s.start_worker()
        e2e.wait_until("w1 to give partitions up while paused", lambda: len(
            s.worker_log(w1, "revoked partitions drained")) > revoked, 60)
        e2e.wait_until("w2's breaker to open",
                       lambda: s.worker_log(w2, "provider breaker opened: "), 60)
        reopened = len(s.worker_log(w1, "provider breaker opened again"))
        e2e.wait_until("two more failed probes of w1", lambda: len(
            s.worker_log(w1, "provider breaker opened again")) >= reopened + 2, 60)
        # The probes are look-ups, which time out against the frozen
        # provider: no attempt is sent while the breaker is not closed, so
        # none is called more often than its retries allow.
        probes = s.worker_log(w1, "provider breaker probe answered")
        check(probes and all(l.get("answer") == "failure" for l in probes),
              "w1's probes of the frozen provider: %s" % probes[:3])
        calls = s.query("SELECT max(n) FROM (SELECT count(*) AS n FROM provider_calls "
                        "GROUP BY payment_attempt_id) c")[0][0]
        check(int(calls or 0) <= RETRIES + 1, "an attempt was called %s times" % calls)
        # The outage outlasts the leases of the attempts waiting for the breaker:
        # they are renewed all along, not lost.
        e2e.wait_until("w1 to hold leases it took more than a lease ago",
                       lambda: renewed_through_outage(s, w1) > 0, 60)
        never_unknown_or_failed(s)
        s.psp_thaw()
        for w in (w1, w2):
            e2e.wait_until("%s's breaker to close" % w,
                           lambda: s.worker_log(w, "provider breaker closed"), 60)
        # w2 leaves: w1 is given back the partitions it gave up while paused,
        # now with its breaker closed. They must be fetched (librdkafka keeps
        # a pause past the assignment; w1 resumed them when giving them up).
        assigned = len(s.worker_log(w1, "partitions assigned"))
        s.kill_worker(w2, signal.SIGTERM)
        e2e.wait_until("w1 to be given w2's partitions", lambda: [
            l for l in s.worker_log(w1, "partitions assigned")[assigned:]
            if l.get("count") != "0"], 60)
    finally:
        sent = pub.finish()
    e2e.log("published", len(sent), "commands")
    s.wait_settled(len(sent), timeout=180)
    never_unknown_or_failed(s)
    counts = s.check_invariants()
    check_eq(counts, {"SUCCEEDED": len(sent)}, "attempts by status")
    check_eq(len(s.ledger()), len(sent), "charges at the provider (one per attempt)")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
