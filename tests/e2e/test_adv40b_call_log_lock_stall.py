#!/usr/bin/env python3
"""Adversary 40b: provider calls whose rows another session holds stall the
worker's whole loop, one lock_timeout per call (engine_flush_call_log).

engine_flush_call_log writes the waiting calls in one statement per kind.
When another session holds one of their payment_attempts rows FOR UPDATE
(the insert's foreign-key check takes FOR KEY SHARE and waits), the
statement ends on the worker's lock_timeout (100 ms) and every entry of the
batch is then written alone, in the same turn, each new entry without the
HELD_PER_TURN bound that the function's comment promises (only entries
with lock_waits > 0 are bounded): N held rows block the loop N x 100 ms in
one turn, where docs/worker.md says "however many rows are held the loop
loses at most a few hundred milliseconds a turn". Nothing else runs meanwhile: no message is fetched or claimed,
no answer read, no lease renewed, on any partition.

The break: 150 charges are claimed and their calls are out (psp-sim
answering after 1.5 s). A test session locks their 150 rows FOR UPDATE
before the answers come. Then one more charge D, on a row nobody holds, is
published. With 5 held rows D settles in 2.1 s (1.5 s of psp-sim); with 30,
5.0 s; with 150 it is not even recorded after 8 s (3 runs of 3; the
loop is inside one flush of up to 150 x 100 ms; PostgreSQL logs ~140
lock timeouts while the rows are held). Money stays safe: everything
settles once the lock goes."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 150
D_WITHIN_S = 8.0


def status_of(s, attempt_id):
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % attempt_id)
    return rows[0][0] if rows else None


def count_status(s, ids, status):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = '%s' AND id IN"
                       " (%s)" % (status, ",".join("'%s'" % i for i in ids)))[0][0])


def scenario(new):
    s = new("adv40b_call_log_lock_stall", partitions=3, psp_args=["--latency-ms", "1500"])
    w = s.start_worker(PROVIDER_TIMEOUT_MS=8000, WORKER_LEASE_MS=60000)
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    cmds = [e2e.new_command() for _ in range(N)]
    ids = [c["payment_attempt_id"] for c in cmds]
    s.publish(cmds)
    e2e.wait_until("all claimed, their calls out",
                   lambda: count_status(s, ids, "PROCESSING") == N, 30, 0.05)
    hold = e2e.Session(s.db)
    d = e2e.new_command()
    try:
        hold.run("BEGIN")
        hold.run("SELECT id FROM payment_attempts WHERE id IN (%s) FOR UPDATE"
                 % ",".join("'%s'" % i for i in ids))
        e2e.wait_until("every answer in", lambda: s.psp_get("/ledger")["counters"][
            "charges_in_flight"] == 0 and len(s.ledger()) == N, 30, 0.05)
        time.sleep(0.3)  # the answers read: the loop is in its flush
        s.publish([d])
        t0 = time.time()
        deadline = t0 + D_WITHIN_S
        while time.time() < deadline and status_of(s, d["payment_attempt_id"]) != "SUCCEEDED":
            time.sleep(0.05)
        took = time.time() - t0
        d_status = status_of(s, d["payment_attempt_id"])
        check(count_status(s, ids, "SUCCEEDED") == 0, "a held row persisted (setup)")
    finally:
        hold.run("ROLLBACK")
        hold.close()
    s.wait_settled(N + 1, 60)
    s.check_invariants()
    e2e.log("D, on a row nobody held, after %.1f s: %s" % (took, d_status))
    check(d_status == "SUCCEEDED",
          "a charge on a row nobody held was %s %.1f s after it was published: the "
          "worker's loop was blocked writing the %d provider calls whose rows another "
          "session held FOR UPDATE, each alone, one lock_timeout each, in one turn "
          "(engine_flush_call_log bounds only entries already held before to "
          "HELD_PER_TURN)" % (d_status or "not recorded", took, N))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
