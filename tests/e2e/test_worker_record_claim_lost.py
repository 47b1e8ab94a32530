#!/usr/bin/env python3
"""A new attempt recorded and claimed by the record statement is called at
once, even when the rest of that record step fails.

The record statement inserts a new attempt PROCESSING with this worker's
lease, and commits. Messages that only the one-live-attempt-per-order index
refused then go through a second statement, which records them REJECTED
(with their outbox event). When that second statement fails (here its
insert into the outbox meets another session's lock; in production, any
error: a dropped connection, a lock timeout), the engine applies none of the
batch's results: the claimed attempt's job is recorded again, reads
RECORDED, and its claim finds the row PROCESSING under a live lease (its own
worker's, which nothing renews and nothing calls for): busy until the lease
expires (WORKER_LEASE_MS, 120 s by default). Before, the new row was
PENDING until a claim took it, and a failure after the insert cost nothing.

Forced: a session holds the outbox table EXCLUSIVE while a batch of a new
attempt and a second attempt of a paid order is recorded; the lock is let
go as soon as the worker reports the second one held. The new attempt must
be charged well within one lease, once."""
import signal

import charged_e2e as e2e
from charged_e2e import check, check_eq

LEASE_MS = 120000


def status_of(s, aid):
    rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)
    return rows[0][0] if rows else None


def scenario(new):
    s = new("record_claim_lost", partitions=1,
            worker_env={"WORKER_LEASE_MS": str(LEASE_MS)})
    w = s.start_worker()
    paid = e2e.new_command()
    s.publish([paid])
    s.wait_settled(1, 60)
    check_eq(status_of(s, paid["payment_attempt_id"]), "SUCCEEDED", "the paid attempt")

    fresh = e2e.new_command()
    second = e2e.new_command(order_id=paid["order_id"])
    proc = s.process(w)
    hold = e2e.Session(s.db)
    try:
        hold.run("BEGIN")
        hold.run("LOCK TABLE outbox IN EXCLUSIVE MODE")
        # Both commands in one record batch: the worker is stopped while
        # they are published, and polls them together.
        e2e.freeze(proc.pid)
        try:
            s.publish([fresh, second])
        finally:
            proc.send_signal(signal.SIGCONT)
        e2e.wait_until("the second attempt's record to meet the outbox lock", lambda: any(
            l.get("payment_attempt_id") == second["payment_attempt_id"]
            for l in s.worker_log(w, "attempt held by another session")), 60, 0.05)
        e2e.log("fresh attempt is", status_of(s, fresh["payment_attempt_id"]),
                "while the outbox is held")
    finally:
        hold.run("ROLLBACK")
        hold.close()

    # Well within one lease: the worker holds the claim it just took.
    deadline = LEASE_MS / 1000.0 / 4
    try:
        e2e.wait_until("the new attempt to be charged and settled", lambda: status_of(
            s, fresh["payment_attempt_id"]) == "SUCCEEDED", deadline, 0.2)
    except e2e.Failure:
        rows = s.query("SELECT status, lease_owner, lease_epoch, lease_expires_at - now()"
                       " FROM payment_attempts WHERE id = '%s'" % fresh["payment_attempt_id"])
        raise e2e.Failure(
            "new attempt %s not settled %ss after the lock went (status, lease owner,"
            " epoch, lease left: %s): its record-and-claim committed, the batch's"
            " REJECTED insert failed, and the claim was dropped with it; its job then"
            " waits for its own worker's lease to expire"
            % (fresh["payment_attempt_id"], deadline, rows))
    s.wait_settled(3, 60)
    check_eq(status_of(s, second["payment_attempt_id"]), "REJECTED", "the second attempt")
    charges = [x for x in s.ledger() if x["idempotency_key"] == fresh["idempotency_key"]]
    check(len(charges) == 1, "key %s charged %d times" % (fresh["idempotency_key"], len(charges)))
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
