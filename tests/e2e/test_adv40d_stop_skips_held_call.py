#!/usr/bin/env python3
"""Adversary 40d: the stop's last write of the calls' log skips a call
whose row another session held a moment before: a charge that took the
money is missing from provider_calls after a clean stop.

engine_finish promises "a call that took money is never left out of
provider_calls by a clean stop", and round 3's mend (f712405) has the last
write (engine_flush_call_log) tried whatever the database's back-off. But
the write itself, calls_write, skips every entry another session's lock
held before while that entry's own back-off runs (`e->lock_waits > 0 &&
e->next_at > now`), and beyond HELD_PER_TURN of them: at the stop there is
no later turn, and the entry leaves with the process.

Forced: charge A's call is out (psp-sim answers after 1.5 s); a test
session locks A's payment_attempts row FOR UPDATE before the answer. The
calls' batch meets the lock (the foreign-key check of provider_calls waits,
lock_timeout 100 ms), A's entry is tried alone, held again, and waits its
back-off (retry_backoff_ms(WORKER_RETRY_BASE_MS=16000, tries 1, no jitter):
8 s). One second after the answer the lock goes (COMMIT), and SIGTERM
follows: the drain waits for A (its outcome waits for its call) until its
deadline (SHUTDOWN_TIMEOUT_MS=4000: 3 s), and the last write finds A's
entry still in its back-off, on a row nobody holds. On main's HEAD
(f712405): psp-sim charged A, provider_calls has no row of A (3 runs of
3). The retry settings only make the window wide: with the defaults (200
ms doubling to 10 s) a row held for a few seconds leaves the same back-off."""
import signal
import time

import charged_e2e as e2e
from charged_e2e import check, check_eq

ENV = {
    # One back-off step of 8 s for a held call's entry (tries 1, no jitter).
    "WORKER_RETRY_BASE_MS": "16000",
    "WORKER_RETRY_MAX_MS": "16000",
    "WORKER_UNKNOWN_RETRIES": "0",
    "PROVIDER_TIMEOUT_MS": "8000",
    "WORKER_LEASE_MS": "30000",
    # The drain lasts 3 s (a quarter, at most 2 s, kept for the rest).
    "SHUTDOWN_TIMEOUT_MS": "4000",
}


def scenario(new):
    a = e2e.new_command()
    aid = a["payment_attempt_id"]
    s = new("adv40d_stop_skips_held_call", partitions=1,
            psp_args=["--latency-ms", "1500"], worker_env=ENV)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    hold = e2e.Session(s.db)
    in_tx = False
    try:
        s.publish([a])
        e2e.wait_until("A's call out", lambda: s.psp_get("/ledger")["counters"][
            "charges_in_flight"] == 1, 30, 0.02)
        hold.run("BEGIN")
        in_tx = True
        locked = hold.run("SELECT id FROM payment_attempts WHERE id = '%s' FOR UPDATE" % aid)
        e2e.log("locked:", locked)
        e2e.wait_until("psp-sim charged A", lambda: any(
            x["idempotency_key"] == a["idempotency_key"] for x in s.ledger()), 30, 0.02)
        # The answer read, its call's entry meets the lock (100 ms, then
        # 5 ms alone) and waits its 8 s back-off.
        time.sleep(1.0)
        hold.run("COMMIT")
        in_tx = False
        s.process(w).send_signal(signal.SIGTERM)
        t0 = time.time()
        rc = s.wait_worker_exit_or_kill(w, 20)
        took = time.time() - t0
    finally:
        if in_tx:
            hold.run("ROLLBACK")
        hold.close()
    charged = [x for x in s.ledger() if x["idempotency_key"] == a["idempotency_key"]]
    calls = s.query("SELECT operation, outcome FROM provider_calls"
                    " WHERE payment_attempt_id = '%s'" % aid)
    status = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)
    e2e.log("stop took %.1f s, exit %s; psp-sim charges of A: %d; A's status %s; "
            "provider_calls of A: %s" % (took, rc, len(charged), status, calls))
    check_eq(len(charged), 1, "psp-sim charges of A (setup)")
    check(any(c[0] == "charge" for c in calls),
          "psp-sim charged A, but provider_calls has no call of A after the worker "
          "stopped cleanly (exit %s in %.1f s): its entry, held by a row lock released "
          "before the SIGTERM, was still in its back-off at the last write, and "
          "calls_write skips such entries (engine_flush_call_log)" % (rc, took))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
