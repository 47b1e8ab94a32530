#!/usr/bin/env python3
"""A record-and-claim given up at its deadline, which then commits, costs
the new attempt no more than the deadline.

The worker gives a statement up DATABASE_TIMEOUT_MS + 1 s after sending it
when its server does not answer, and closes the session; a server frozen
while the session sat idle reads the statement once it runs again, runs it
and commits (test_worker_db_given_up_commits). When that statement is the
record of a new attempt, it has inserted the row PROCESSING under this
worker's lease: the worker, which never saw the answer, records the attempt
again, reads RECORDED, and its claim is busy on its own lease, which
nothing renews and nothing calls for, until WORKER_LEASE_MS (120 s by
default) has passed. (When a new row was PENDING, the second record's claim
took it at once.)

Forced: the worker's idle database sessions are stopped (SIGSTOP) before a
new command is published; once the worker has given the record statement
up, they are continued. The attempt must be charged, once, well within one
lease."""
import os
import signal

import charged_e2e as e2e
from charged_e2e import check, check_eq

DB_TIMEOUT_MS = 1000
LEASE_MS = 120000
RECORD_SQL = "WITH v AS (  SELECT * FROM unnest($1::uuid[], $2::uuid[]%"


def status_of(s, aid):
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)
    return rows[0][0] if rows else None


def scenario(new):
    e2e.stack_check()
    s = new("record_given_up", partitions=1, worker_env={"WORKER_LEASE_MS": str(LEASE_MS)})
    w = s.start_worker(DATABASE_TIMEOUT_MS=DB_TIMEOUT_MS)
    warm = e2e.new_command()
    s.publish([warm])
    s.wait_settled(1, 60)
    # The worker's sessions, idle once the first attempt settled.
    pids = e2e.wait_until("the worker's sessions idle", lambda: [int(r[0]) for r in s.query(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
        " AND state = 'idle'")], 10, 0.05)
    fresh = e2e.new_command()
    aid = fresh["payment_attempt_id"]
    given_up = lambda: [l for l in s.worker_log(w, "database step failed")
                        if "did not answer within" in l.get("error", "")]
    stopped = []
    try:
        for pid in pids:
            e2e.freeze(pid)
            stopped.append(pid)
        s.publish([fresh])
        e2e.wait_until("a statement given up at its deadline", given_up, 30)
        e2e.log("given up: %s" % given_up()[0])
        check_eq(given_up()[0].get("stage"), "record", "the stage of the given-up statement")
    finally:
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    # The given-up statement was the record: it committed once continued.
    e2e.wait_until("the given-up record to commit", lambda: s.query(
        "SELECT reason FROM attempt_transitions WHERE payment_attempt_id = '%s'" % aid)
        == [["recorded and claimed"]] or status_of(s, aid) == "SUCCEEDED", 30, 0.05)

    deadline = LEASE_MS / 1000.0 / 4
    try:
        e2e.wait_until("the new attempt to be charged and settled",
                       lambda: status_of(s, aid) == "SUCCEEDED", deadline, 0.2)
    except e2e.Failure:
        rows = s.query("SELECT status, lease_owner, lease_epoch, lease_expires_at - now()"
                       " FROM payment_attempts WHERE id = '%s'" % aid)
        raise e2e.Failure(
            "new attempt %s not settled %ss after its given-up record committed (status,"
            " lease owner, epoch, lease left: %s): the record claimed it for this worker,"
            " which never saw the answer; its next record reads RECORDED and its claim"
            " waits for its own lease to expire" % (aid, deadline, rows))
    s.wait_settled(2, 60)
    charges = [x for x in s.ledger() if x["idempotency_key"] == fresh["idempotency_key"]]
    check(len(charges) == 1, "key %s charged %d times" % (fresh["idempotency_key"], len(charges)))
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
