#!/usr/bin/env python3
"""Adversary 40d: outcomes of charges nobody holds wait seconds in a
persist task behind calls whose rows another session holds, and their
leases expire meanwhile, ours, PROCESSING, unrenewed.

calls_write (engine_store.c) writes a batch of calls; when another
session's lock holds some of their payment_attempts rows (the foreign-key
check of provider_calls waits, lock_timeout 100 ms), every entry not held
before is then tried alone, each up to ALONE_LOCK_TIMEOUT (5 ms), all in
the same task (HELD_PER_TURN bounds only entries held before), and only
then are the task's outcomes written. The outcomes of that task are
in_lane for all of it, and engine_renew_leases skips in_lane jobs ("an
outcome a lane writes now is not renewed": it assumes the write is
quick); on main's HEAD the renewal also waits for the persist lane itself
(f712405 moved it there).

Forced: psp-sim frozen, N=900 charges A are claimed and their calls sent;
a test session locks their rows FOR UPDATE; psp-sim is thawed and the
answers come at once; M=20 charges B (rows nobody holds) are published,
claimed and answered within the same few hundred ms, their calls and
outcomes in a persist task with A's. B's outcomes wait behind A's 900
tries alone: B settles 5.2-5.9 s after the thaw, and with
WORKER_LEASE_MS=4000 (renewed every third) the test sees 20 of 20 B rows
PROCESSING with lease_expires_at in the past, ours (main's HEAD f712405:
3 runs of 3; the build before f712405, 3018122, with the renewals on a lane
of their own: 2 of 2, the same numbers, so the in_lane skip is the cause,
not the lane sharing). An expired lease on an attempt whose outcome is not
written lets the reconciler take it over once its grace passes
(attempt_store.c's SQL_CLAIM_DUE), and the worker's outcome is then fenced.
And against docs/worker.md's "a statement that waits for another session's
lock holds the rows it names and nothing else": B's rows were never held."""
import time

import charged_e2e as e2e
from charged_e2e import check

N = 900
M = 20
ENV = {
    "PROVIDER_TIMEOUT_MS": "3000",
    "WORKER_UNKNOWN_RETRIES": "0",
    "WORKER_LEASE_MS": "4000",
}


def in_list(ids):
    return ",".join("'%s'" % i for i in ids)


def count_status(s, ids, status):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = '%s' AND id IN"
                       " (%s)" % (status, in_list(ids)))[0][0])


def scenario(new):
    s = new("adv40d_renewal_behind_held_calls", partitions=3)
    w = s.start_worker(**ENV)
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    a = [e2e.new_command() for _ in range(N)]
    b = [e2e.new_command() for _ in range(M)]
    aids = [c["payment_attempt_id"] for c in a]
    bids = [c["payment_attempt_id"] for c in b]
    hold = e2e.Session(s.db)
    thawed = False
    expired_max, b_seen = 0, 0
    try:
        s.psp_freeze()
        s.publish(a)
        e2e.wait_until("A claimed, its calls out",
                       lambda: count_status(s, aids, "PROCESSING") == N, 30, 0.05)
        e2e.wait_until("A's calls sent", lambda: s.admin_metrics(w).get(
            "charged_provider_calls_in_flight", 0) == N, 30, 0.05)
        hold.run("BEGIN")
        hold.run("SELECT id FROM payment_attempts WHERE id IN (%s) FOR UPDATE" % in_list(aids))
        s.psp_thaw()
        thawed = True
        t0 = time.time()
        e2e.wait_until("A answered", lambda: s.admin_metrics(w).get(
            "charged_provider_calls_in_flight", 0) == 0, 30, 0.02)
        s.publish(b)
        # B's leases: 4 s, renewed every 1.3 s while the lane lets them.
        deadline = time.time() + 12
        while time.time() < deadline:
            r = s.query("SELECT count(*) FILTER (WHERE status = 'PROCESSING'),"
                        " count(*) FILTER (WHERE status = 'PROCESSING'"
                        "   AND lease_expires_at < now()),"
                        " count(*) FILTER (WHERE status = 'SUCCEEDED')"
                        " FROM payment_attempts WHERE id IN (%s)" % in_list(bids))[0]
            b_seen = max(b_seen, int(r[0]))
            expired_max = max(expired_max, int(r[1]))
            if int(r[2]) == M:
                break
            time.sleep(0.1)
        b_done = time.time() - t0
        a_calls = int(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id"
                              " IN (%s)" % in_list(aids))[0][0])
    finally:
        if not thawed:
            s.psp_thaw()
        hold.run("ROLLBACK")
        hold.close()
    e2e.log("B: %d of %d PROCESSING at most; at most %d of them with their lease expired;"
            " all settled %.1f s after the thaw; A's calls written while held: %d"
            % (b_seen, M, expired_max, b_done, a_calls))
    s.wait_settled(N + M, 60)
    s.check_invariants()
    check(b_seen > 0, "B was never seen PROCESSING (setup)")
    check(expired_max == 0,
          "%d of %d charges nobody held were PROCESSING, ours, with their lease expired "
          "(WORKER_LEASE_MS=4000, renewed every third): their outcomes waited in a persist "
          "task behind %d newly held calls tried alone, and renewals skip in_lane jobs"
          % (expired_max, M, N))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
