#!/usr/bin/env python3
"""Adversary 40c: a revocation's give-up waits, on the loop, for a lane's
statement that waits for another session's lock.

The lanes' promise (docs/worker.md, top): a statement that waits for a lock
"holds the rows it names and nothing else: answers are still read and
persisted". engine_detach (called by give_up when a revoked partition's
drain deadline passes) starts with engine_lanes_collect(eng, 1), which waits
on the loop's thread for every lane's task to end. A record statement held
by another session's lock (here: a trigger that waits for an advisory lock
this test holds, as in test_worker_answers_beside_lock) then holds the whole
loop, inside give_up, until the statement ends (DATABASE_TIMEOUT_MS at
most): no answer is read, no outcome persisted, nothing fetched.

Forced: w1 has one charge call in flight on each of 2 partitions (psp-sim
frozen), then a third command whose record waits for the held lock. w2
joins; w1 loses a partition whose call is still out, so its drain deadline
(REBALANCE_DRAIN_MS, 1 s) passes and give_up runs. psp-sim is thawed
after that: both answers come at once. With the loop free, they are
persisted within a turn (well under a second); on main's HEAD (182ba31)
0 of 2 are persisted in 6 s, while the record statement still waits: the
loop sits in stage_lane_wait until the test lets the lock go."""
import time
import zlib

import charged_e2e as e2e
from charged_e2e import check, check_eq

PARTITIONS = 2
HOLD_KEY = 4343
HELD_AMOUNT = 4343  # the one command whose record waits
PERSISTED_WITHIN_S = 6.0
ENV = {
    "REBALANCE_DRAIN_MS": "1000",
    # The calls are held for seconds: they must not time out meanwhile.
    "PROVIDER_TIMEOUT_MS": "20000",
    "WORKER_UNKNOWN_RETRIES": "0",
    "WORKER_LEASE_MS": "30000",
    # The held record statement must outlast the check, not end by itself.
    "DATABASE_TIMEOUT_MS": "30000",
}



def command_on(partition, **fields):
    """A command the producer's default partitioner (CRC32 of the key)
    puts on partition."""
    while True:
        c = e2e.new_command(**fields)
        if zlib.crc32(c["payment_attempt_id"].encode()) % PARTITIONS == partition:
            return c


def count(s, sql):
    return int(s.query(sql)[0][0])


def record_waiting(s):
    return count(s, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                    " AND NOT granted AND objid = %d" % HOLD_KEY) > 0


def in_flight(s, name):
    return s.admin_metrics(name).get("charged_provider_calls_in_flight", 0)


def scenario(new):
    s = new("adv40c_revoke_waits_lane", partitions=PARTITIONS, worker_env=ENV)
    e2e.hold_statements(s, HOLD_KEY, "INSERT", "NEW.amount = %d" % HELD_AMOUNT)
    w1 = s.start_worker()
    e2e.wait_until("w1 ready", lambda: s.admin_get(w1, "/readyz")[0] == 200, 60)
    a = [command_on(p) for p in range(PARTITIONS)]
    held = command_on(0, amount=HELD_AMOUNT)
    ids = ",".join("'%s'" % c["payment_attempt_id"] for c in a)
    hold = e2e.Session(s.db)
    thawed = False
    try:
        hold.run("SELECT pg_advisory_lock(%d)" % HOLD_KEY)
        s.psp_freeze()
        s.publish(a)
        e2e.wait_until("w1's two calls in flight", lambda: in_flight(s, w1) == 2, 30, 0.05)
        s.publish([held])
        e2e.wait_until("w1's record statement waits for the lock",
                       lambda: record_waiting(s), 30, 0.02)
        w2 = s.start_worker()
        revoked = e2e.wait_until("w1 losing a partition", lambda: s.worker_log(
            w1, "partitions revoked; draining them"), 60, 0.05)[0]
        e2e.log("w1 revoked:", revoked.get("partitions"))
        # Its call is out: the drain deadline (1 s) passes, give_up runs.
        time.sleep(1.5)
        s.psp_thaw()
        thawed = True
        t0 = time.time()
        settled = 0
        while time.time() < t0 + PERSISTED_WITHIN_S:
            settled = count(s, "SELECT count(*) FROM payment_attempts WHERE id IN (%s)"
                               " AND status = 'SUCCEEDED'" % ids)
            if settled == len(a):
                break
            time.sleep(0.05)
        took = time.time() - t0
        still_waiting = record_waiting(s)
        gave_up = bool(s.worker_log(w1, "revoked partitions drained"))
    finally:
        if not thawed:
            s.psp_thaw()
        hold.run("SELECT pg_advisory_unlock(%d)" % HOLD_KEY)
        hold.close()
    e2e.log("%d of %d answered charges persisted %.1f s after the answers; the record "
            "statement still waits: %s; w1's give-up done: %s"
            % (settled, len(a), took, still_waiting, gave_up))
    check(still_waiting,
          "the record statement did not wait for the lock the whole time: the scenario "
          "forced nothing")
    check(settled == len(a),
          "only %d of %d answered charges were persisted in %.0f s after psp-sim answered "
          "(give-up done: %s): w1's loop waited in engine_detach's engine_lanes_collect "
          "for a record statement another session's lock held"
          % (settled, len(a), PERSISTED_WITHIN_S, gave_up))
    # The lock gone, everything settles, each charged once.
    s.wait_settled(len(a) + 1, 60)
    s.check_invariants()
    for c in a + [held]:
        charges = [x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]]
        check_eq(len(charges), 1, "charges of attempt %s" % c["payment_attempt_id"])
    s.kill_worker(w2)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
