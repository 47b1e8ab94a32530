#!/usr/bin/env python3
"""Regression scenario (fails against the reconciler as of this writing):
every provider call the reconciler makes is in provider_calls
(docs/reconciler.md, "What it writes"), including an answer lost on a
pooled connection that curl re-sent with the same key, as the worker
records it (worker.c on_call_done: one 'unknown' row "connection closed
without an answer; re-sent with the same key" per res.resent).

The worker's POST answers 500 before executing (error_before, once), so
the attempt is UNKNOWN and nothing is charged. The reconciler searches
(not found), then POSTs on the same pooled connection: psp-sim executes it
and drops the answer (drop_after, once); curl re-sends it, psp-sim replays
it. psp-sim saw two POSTs from the reconciler, one of which charged; the
reconciler records one, 'succeeded' and replayed, which reads as if an
earlier call (the worker's 500) had executed."""
import charged_e2e as e2e
from charged_e2e import check, check_eq

WORKER = {"WORKER_UNKNOWN_RETRIES": 0, "RECONCILER_FIRST_LOOK_MS": 0,
          "PROVIDER_TIMEOUT_MS": 1000, "WORKER_LEASE_MS": 5000}


def scenario(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("rec_resent", psp_args=["--fault", "error_before=1@%s#1" % key,
                                    "--fault", "drop_after=1@%s#1" % key])
    s.start_worker(**WORKER)
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq(s.query("SELECT status FROM payment_attempts"), [["UNKNOWN"]], "worker's status")
    r = s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100,
                           PROVIDER_TIMEOUT_MS=1000)
    e2e.wait_until("SUCCEEDED", lambda: s.query("SELECT status FROM payment_attempts")
                   == [["SUCCEEDED"]], 30, 0.1)
    hits = [h["kind"] for h in s.psp_get("/faults")["hits"] if h["key"] == key]
    check_eq(hits, ["error_before", "drop_after"], "faults psp-sim injected for the key")
    check_eq(len(s.ledger()), 1, "psp-sim charges")
    charges = s.query("SELECT outcome, replayed::text, coalesce(error, '') FROM provider_calls "
                      "WHERE operation = 'charge' AND actor = '%s' ORDER BY id"
                      % s.worker_ids[r])
    e2e.log("the reconciler's charge rows:", charges)
    check(len(charges) == 2 and charges[0][0] == "unknown",
          "psp-sim answered the reconciler's first POST by closing the connection after "
          "charging (drop_after) and curl re-sent it (replayed); want that lost answer "
          "recorded as a call of its own, as the worker does; provider_calls of the "
          "reconciler: %s; attempt_count %s" % (
              charges, s.query("SELECT attempt_count FROM payment_attempts")))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
