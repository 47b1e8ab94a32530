#!/usr/bin/env python3
"""Provider answers are read and persisted while a statement of the same
worker waits for a lock.

Each database stage of the worker runs on a lane of its own (docs/worker.md,
"The loop"): a record statement that waits for a lock another session holds
holds the rows it names and nothing else. Forced: a trigger on
payment_attempts makes the insert of one attempt wait for an
advisory lock this test holds, for as long as it holds it (each wait ends
at the worker's lock_timeout and the trigger waits again, so the statement
never gives up). While the record statement waits, charges already sent
to the provider (500 ms each) are answered: their outcomes must be read and
persisted before the lock goes, with the record statement still waiting.

Before the lanes, the one thread waited inside that statement: no answer
was read until the lock went (or the statement timed out after 10 s)."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 20
HOLD_KEY = 4242
HELD_AMOUNT = 4242  # the one command whose record waits
LATENCY_MS = 1500  # the provider's: its answers come during the record's wait
PERSISTED_WITHIN_S = 8.0



def count(s, sql):
    return int(s.query(sql)[0][0])


def record_waiting(s):
    """The worker's statement waits for the advisory lock this test holds."""
    return count(s, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND NOT granted AND objid = %d" % HOLD_KEY) > 0


def scenario(new):
    s = new("worker_answers_beside_lock", partitions=3, psp_args=["--latency-ms", str(LATENCY_MS)])
    e2e.hold_statements(s, HOLD_KEY, "INSERT", "NEW.amount = %d" % HELD_AMOUNT)
    w = s.start_worker(PROVIDER_TIMEOUT_MS=4000, WORKER_LEASE_MS=30000)
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    sent = [e2e.new_command(amount=1000) for _ in range(N)]
    held = e2e.new_command(amount=HELD_AMOUNT)
    ids = ",".join("'%s'" % c["payment_attempt_id"] for c in sent)
    hold = e2e.Session(s.db)
    try:
        hold.run("SELECT pg_advisory_lock(%d)" % HOLD_KEY)
        s.publish(sent)
        # Sent to the provider: claimed, their answers 500 ms away.
        e2e.wait_until("the charges are with the provider", lambda: count(
            s, "SELECT count(*) FROM payment_attempts WHERE id IN (%s)"
               " AND status = 'PROCESSING'" % ids) == N, 30, 0.02)
        s.publish([held])
        e2e.wait_until("the worker's record statement waits for the lock",
                       lambda: record_waiting(s), 30, 0.02)
        settled_before = count(s, "SELECT count(*) FROM payment_attempts WHERE id IN (%s)"
                                  " AND status <> 'PROCESSING'" % ids)
        t0 = time.time()
        deadline = t0 + PERSISTED_WITHIN_S
        settled = 0
        while time.time() < deadline:
            settled = count(s, "SELECT count(*) FROM payment_attempts WHERE id IN (%s)"
                               " AND status = 'SUCCEEDED'" % ids)
            if settled == N:
                break
            time.sleep(0.05)
        took = time.time() - t0
        still_waiting = record_waiting(s)
        held_recorded = count(s, "SELECT count(*) FROM payment_attempts WHERE id = '%s'"
                                 % held["payment_attempt_id"])
    finally:
        hold.run("SELECT pg_advisory_unlock(%d)" % HOLD_KEY)
        hold.close()
    e2e.log("%d of %d settled when the record's wait began, %d %.1f s into it; the "
            "record still waits: %s" % (settled_before, N, settled, took, still_waiting))
    check(settled_before < N,
          "every answer came before the record statement waited: the scenario proved "
          "nothing (the provider answers in %d ms)" % LATENCY_MS)
    check(settled == N,
          "only %d of %d charges the provider answered were persisted in %.0f s while "
          "the worker's record statement waited for a lock: the answers waited for it"
          % (settled, N, PERSISTED_WITHIN_S))
    check(still_waiting and held_recorded == 0,
          "the record statement did not wait for the lock the whole time: the scenario "
          "forced nothing")
    # The lock gone, the held command is recorded and charged once.
    s.wait_settled(N + 1, 60)
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
