#!/usr/bin/env python3
"""The old owner of a partition is stopped (SIGTERM) while a call it
detached at a revocation is still in flight.

w1 (WORKER_MAX_IN_FLIGHT=2) has one call out on each of two partitions,
held at psp-sim by SIGSTOP. w2 joins, w1 drains the partition it loses
past REBALANCE_DRAIN_MS and detaches the call still out. Then w1 gets
SIGTERM: it has no partition's message of its own left unfinished but
the call on the partition it kept, and the detached one. It must exit
within SHUTDOWN_TIMEOUT_MS plus a margin, and with a status that says
whether it left work unfinished. The attempt whose detached call was out
keeps its lease (not released: the call may reach the provider), so w2
waits for it to expire, then sends again under the same key. psp-sim
then goes on. Every attempt is charged exactly once and settles once;
the invariants hold.
"""
import time
import zlib

import charged_e2e as e2e
from charged_e2e import check, check_eq

PARTITIONS = 2
ENV = {
    "WORKER_MAX_IN_FLIGHT": "2",
    "REBALANCE_DRAIN_MS": "1000",
    "PROVIDER_TIMEOUT_MS": "4000",
    "WORKER_UNKNOWN_RETRIES": "0",
    "WORKER_LEASE_MS": "9000",
    "SHUTDOWN_TIMEOUT_MS": "2000",
}


def command_on(partition, **fields):
    while True:
        c = e2e.new_command(**fields)
        if zlib.crc32(c["payment_attempt_id"].encode()) % PARTITIONS == partition:
            return c


def logged(s, name, msg, **fields):
    return [l for l in s.worker_log(name, msg)
            if all(l.get(k) == v for k, v in fields.items())]


def scenario(new):
    s = new("detached_sigterm", partitions=PARTITIONS, worker_env=ENV)
    w1 = s.start_worker()
    e2e.wait_until("w1 ready", lambda: s.admin_get(w1, "/readyz")[0] == 200, 60)
    a = [command_on(p) for p in range(PARTITIONS)]
    s.psp_freeze()
    s.publish(a)
    e2e.wait_until("w1's two calls in flight", lambda: s.admin_metrics(w1).get(
        "charged_provider_calls_in_flight", 0) == 2, 30, 0.05)
    w2 = s.start_worker()
    drained = e2e.wait_until("w1 giving up a partition", lambda: logged(
        s, w1, "revoked partitions drained"), 60, 0.05)[0]
    lost = int(drained["partitions"])
    held = a[lost]
    t0 = time.monotonic()
    s.workers[w1].send_signal(15)
    rc = s.wait_worker_exit_or_kill(w1, 2 + 4 + 5)
    took = time.monotonic() - t0
    e2e.log("w1 exit status", rc, "after %.1fs" % took)
    lease = s.query("SELECT status, coalesce(lease_owner, ''), "
                    "extract(epoch FROM lease_expires_at - now()) > 0 FROM payment_attempts "
                    "WHERE id = '%s'" % held["payment_attempt_id"])
    e2e.log("held attempt after w1's exit:", lease)
    check_eq(lease, [["PROCESSING", s.worker_ids[w1], "t"]],
             "the attempt whose call w1 had out at its exit (status, lease owner, lease "
             "still running): a lease released under a call in flight lets a peer send "
             "under its key meanwhile")
    s.psp_thaw()
    s.wait_settled(len(a), timeout=90)
    s.check_invariants()
    counters = s.psp_get("/ledger")["counters"]
    e2e.log("psp-sim counters:", counters)
    for c in a:
        charges = [x for x in s.ledger() if x["idempotency_key"] == c["idempotency_key"]]
        check_eq(len(charges), 1, "charges of attempt %s" % c["payment_attempt_id"])
        ends = s.query("SELECT count(*) FROM attempt_transitions WHERE payment_attempt_id = "
                       "'%s' AND new_status IN ('SUCCEEDED','FAILED')" % c["payment_attempt_id"])
        check_eq(ends, [["1"]], "settlements of %s" % c["payment_attempt_id"])
    actors = s.query("SELECT actor FROM attempt_transitions WHERE payment_attempt_id = "
                     "'%s' AND new_status = 'SUCCEEDED'" % held["payment_attempt_id"])
    check_eq(actors, [[s.worker_ids[w2]]], "who settled the attempt w1 left in flight")
    check(rc != 0, "w1 exited 0 though it left a call in flight unfinished (rc %r)" % rc)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
