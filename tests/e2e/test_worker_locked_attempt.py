#!/usr/bin/env python3
"""A row lock another session holds costs the attempt it holds, never the
worker's batch, and no session of charged sits idle in a transaction
without a bound.

1. peer lock: 21 charges are in flight (psp-sim answers after 2.5 s); a
   session of the test locks one attempt's row as charged's api does
   (SELECT ... FOR NO KEY UPDATE) and keeps it. The 20 others are persisted SUCCEEDED while it holds it; the
   locked one waits, and is persisted once the lock goes. (The batch's
   persist used to wait for the lock, time out, and be retried whole,
   forever: 20 charged attempts stayed PROCESSING.)
2. frozen api: the api applies a webhook for an attempt whose charge is in
   flight; it gets the row lock and is then frozen (SIGSTOP) inside its
   transaction. The database ends that session after its
   idle_in_transaction_session_timeout, its lock goes with it, and the
   worker persists the attempt while the api is still frozen. (With the
   server's defaults the lock stayed for as long as the api was frozen.)
3. uncommitted change: a session of the test updates an order's paid
   attempt and keeps its transaction open; a new attempt of that order
   arrives with 10 unrelated ones. Recording the new one waits on the
   one-live-attempt index for that transaction (SKIP LOCKED cannot help an
   index): it alone waits; the 10 are charged meanwhile, and it is REJECTED
   once the session ends. (The record step failed on its lock timeout every
   few seconds, and the whole worker backed off: nothing settled.)
4. FOR UPDATE held: a session locks one attempt's row FOR UPDATE while
   its call ends; the foreign-key check of its provider_calls row waits on
   that lock. Ten unrelated attempts are still charged and recorded while
   it is held. (The worker took the call log's lock timeout for an outage:
   no outcome of any attempt was written, and it was not ready.)
5. reconciler calls kept: the reconciler re-sends a charge while a session
   holds the row FOR UPDATE; its provider calls cannot be written then, and
   are written once the lock goes. (They were dropped: the charge that took
   the money was missing from provider_calls.) Its settlement found the row
   busy and kept its lease: the reconciler takes its own lease again at its
   next claim, so the attempt settles within seconds, not after the lease
   (RECONCILER_LEASE_MS, 120 s here as by default; 300 s more for a
   PROCESSING one; chaos seed 5's 85 s stall).
6. many held: twenty orders' paid attempts are being changed in one open
   transaction while a second attempt of each arrives: the loop is not
   held up a lock wait per held item, and ten unrelated commands are
   charged meanwhile. (At a second per held item, 2 of 15 unrelated
   commands settled in 60 s.)
The race of each case is forced by holding a lock, not by repetition."""
import signal
import threading

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq


def status_of(s, aid):
    return s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)[0][0]


def count_status(s, ids, status):
    return int(s.query("SELECT count(*) FROM payment_attempts WHERE status = '%s' AND id IN (%s)"
                       % (status, ",".join("'%s'" % i for i in ids)))[0][0])


def peer_lock(new):
    s = new("locked_peer", partitions=3, psp_args=["--latency-ms", "2500"],
            worker_env={"PROVIDER_TIMEOUT_MS": "6000", "WORKER_LEASE_MS": "40000"})
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    cmds = [e2e.new_command() for _ in range(21)]
    locked, others = cmds[0]["payment_attempt_id"], [c["payment_attempt_id"] for c in cmds[1:]]
    s.publish(cmds)
    e2e.wait_until("all 21 claimed, their calls in flight", lambda: count_status(
        s, [locked] + others, "PROCESSING") == 21, 30, 0.05)
    hold = e2e.Session(s.db)
    try:
        hold.run("BEGIN")
        hold.run("SELECT id FROM payment_attempts WHERE id = '%s' FOR NO KEY UPDATE" % locked)
        e2e.wait_until("the 20 unlocked attempts persisted while one row is held",
                       lambda: count_status(s, others, "SUCCEEDED") == 20, 20)
        check_eq(status_of(s, locked), "PROCESSING", "the locked attempt, while held")
        check(s.worker_log(w, "attempt locked by another session"),
              "no log line for the locked attempt")
    finally:
        hold.run("ROLLBACK")
        hold.close()
    e2e.wait_until("the locked attempt persisted once free", lambda: status_of(
        s, locked) == "SUCCEEDED", 30)
    s.wait_settled(21, 60)
    s.check_invariants()


def wait_for_state(s, pid, state, what):
    """Waits (10 s) for backend pid to be in state; on a timeout, logs what
    every session of the scenario's database was doing."""
    try:
        e2e.wait_until(what, lambda: s.query(
            "SELECT state FROM pg_stat_activity WHERE pid = %d" % pid) == [[state]], 10, 0.05)
    except e2e.Failure:
        e2e.log("the session watched was pid", pid)
        for row in s.query("SELECT pid, state, wait_event_type, wait_event,"
                           " left(query, 60) FROM pg_stat_activity"
                           " WHERE datname = current_database()"):
            e2e.log("session", "|".join(row))
        raise


def frozen_api(new):
    s = new("locked_frozen_api", partitions=3, psp_args=["--latency-ms", "4000"],
            worker_env={"PROVIDER_TIMEOUT_MS": "10000", "WORKER_LEASE_MS": "60000"})
    name, port = api.start_api(s)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    cmd = e2e.new_command()
    aid = cmd["payment_attempt_id"]
    s.publish([cmd])
    e2e.wait_until("the attempt claimed, its call in flight",
                   lambda: status_of(s, aid) == "PROCESSING" if s.query(
                       "SELECT 1 FROM payment_attempts WHERE id = '%s'" % aid) else False,
                   30, 0.05)
    attempt = {"id": aid, "order_id": cmd["order_id"], "amount": cmd["amount"],
               "currency": cmd["currency"]}
    # A processing event changes nothing for a PROCESSING attempt: what the
    # api does after it wakes up cannot disturb the outcome checked below.
    ev = api.event("processing", attempt)
    hold = e2e.Session(s.db)
    apiproc = s.apis[name]
    answer = {}
    t = threading.Thread(target=lambda: answer.update(r=api.post_webhook(port, ev)))
    stopped = False
    try:
        hold.run("BEGIN")
        hold.run("SELECT id FROM payment_attempts WHERE id = '%s' FOR NO KEY UPDATE" % aid)
        t.start()
        # The api's backend is the one session waiting for the row lock in
        # the api's locking statement (the worker's skip locked rows). The
        # rest of the case watches that pid, so that another session's
        # passing state can neither stand in for it nor hide it.
        api_pid = e2e.wait_until("the api to wait for the row lock", lambda: [
            r[0] for r in s.query(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock' AND pid NOT IN (%d, pg_backend_pid())"
                " AND query LIKE '%%FOR NO KEY UPDATE OF p'" % hold.pid)], 30, 0.05)
        check_eq(len(api_pid), 1, "sessions waiting for the row lock: %s" % api_pid)
        api_pid = int(api_pid[0])
        e2e.freeze(apiproc.pid)
        stopped = True
        hold.run("ROLLBACK")
        # The api's session now holds the lock, idle in its transaction,
        # its process frozen.
        wait_for_state(s, api_pid, "idle in transaction",
                       "the frozen api's session idle in transaction with the lock")
        e2e.wait_until("the worker to persist the attempt while the api is frozen",
                       lambda: status_of(s, aid) == "SUCCEEDED", 30)
        check_eq(apiproc.poll(), None, "the api process (still frozen)")
    finally:
        hold.close()
        if stopped:
            apiproc.send_signal(signal.SIGCONT)
        t.join(e2e.scaled(60))
    check(not t.is_alive(), "the webhook was never answered")
    e2e.log("the api answered the delivery it was frozen in with", answer["r"][0])
    check(answer["r"][0] in (200, 503), "webhook answer %s" % (answer["r"],))
    s.wait_settled(1, 60)
    check_eq(status_of(s, aid), "SUCCEEDED", "the attempt at the end")
    s.check_invariants()


def uncommitted_change(new):
    s = new("locked_uncommitted", partitions=3)
    w = s.start_worker()
    paid = e2e.new_command()
    s.publish([paid])
    s.wait_settled(1, 60)
    check_eq(status_of(s, paid["payment_attempt_id"]), "SUCCEEDED", "the order's first attempt")
    second = e2e.new_command(order_id=paid["order_id"])
    others = [e2e.new_command() for _ in range(10)]
    hold = e2e.Session(s.db)
    try:
        hold.run("BEGIN")
        hold.run("UPDATE payment_attempts SET reason = 'held by the test' WHERE id = '%s'"
                 % paid["payment_attempt_id"])
        s.publish([second] + others)
        e2e.wait_until("the 10 unrelated attempts charged while the order's row is being "
                       "changed", lambda: count_status(
                           s, [c["payment_attempt_id"] for c in others], "SUCCEEDED") == 10, 30)
        check_eq(s.query("SELECT count(*) FROM payment_attempts WHERE id = '%s'"
                         % second["payment_attempt_id"]), [["0"]],
                 "the order's second attempt, while the change is open")
        check(s.worker_log(w, "attempt held by another session's transaction"),
              "no log line for the held attempt")
    finally:
        hold.run("ROLLBACK")
        hold.close()
    e2e.wait_until("the second attempt rejected once the change is gone", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % second["payment_attempt_id"])
        == [["REJECTED"]], 30)
    s.wait_settled(12, 60)
    s.check_invariants()


def for_update_held(new):
    s = new("locked_for_update", partitions=2)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    cmd = e2e.new_command()
    aid = cmd["payment_attempt_id"]
    s.psp_put("/faults", {"rules": [{"kind": "stall_after", "key": cmd["idempotency_key"],
                                     "times": 1}]})
    s.publish([cmd])
    e2e.wait_until("its charge executed, the answer held", lambda: any(
        c["payment_attempt_id"] == aid for c in s.ledger()), 60, 0.05)
    others = [e2e.new_command() for _ in range(10)]
    hold = e2e.Session(s.db)
    try:
        hold.run("BEGIN")
        hold.run("SELECT id FROM payment_attempts WHERE id = '%s' FOR UPDATE" % aid)
        # Its call ends (the held answer times out): its provider_calls row
        # now waits on the lock. Only then come the others.
        e2e.wait_until("the held attempt's call to end", lambda: [
            l for l in s.worker_log(w, "provider answered")
            if l.get("payment_attempt_id") == aid], 30)
        s.publish(others)
        ids = [c["payment_attempt_id"] for c in others]
        e2e.wait_until("the 10 unrelated attempts charged and persisted while one row is"
                       " held FOR UPDATE", lambda: count_status(s, ids, "SUCCEEDED") == 10, 30)
        check_eq(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id IN (%s)"
                         % ",".join("'%s'" % i for i in ids)), [["10"]],
                 "their calls recorded")
        check_eq(s.admin_get(w, "/readyz")[0], 200, "worker readiness with one row held")
    finally:
        hold.run("ROLLBACK")
        hold.close()
    s.wait_settled(11, 60)
    check(int(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'"
                      % aid)[0][0]) >= 1, "the held attempt's calls were never recorded")
    s.check_invariants()


def reconciler_calls_kept(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("locked_reconciler_calls", psp_args=["--fault", "error_before=1@%s" % key])
    s.start_worker(WORKER_UNKNOWN_RETRIES="0", RECONCILER_FIRST_LOOK_MS="0",
                   PROVIDER_TIMEOUT_MS="1000", WORKER_LEASE_MS="5000")
    s.publish([cmd])
    s.wait_settled(1, 60)
    check_eq(status_of(s, aid), "UNKNOWN", "the worker's outcome")
    # The re-sent charge takes 4 s: the test locks the row meanwhile.
    s.psp_put("/faults", {"latency_ms": 4000})
    r = s.start_reconciler(RECONCILER_SCHEDULE_MS="200", RECONCILER_POLL_MS="100",
                           PROVIDER_TIMEOUT_MS="6000", RECONCILER_LEASE_MS="120000",
                           RECONCILER_SEARCH_LAG_MS="0")
    e2e.wait_until("the reconciler's claim", lambda: s.query(
        "SELECT 1 FROM payment_attempts WHERE id = '%s' AND lease_owner = '%s'"
        % (aid, s.worker_ids[r])), 60, 0.02)
    hold = e2e.Session(s.db)
    try:
        hold.run("BEGIN")
        hold.run("SELECT id FROM payment_attempts WHERE id = '%s' FOR UPDATE" % aid)
        e2e.wait_until("the reconciler to try to write its calls under the lock",
                       lambda: s.worker_log(r, "provider calls held by another session") or
                       s.worker_log(r, "provider call not recorded") or
                       s.worker_log(r, "provider calls not recorded"), 30)
    finally:
        hold.run("ROLLBACK")
        hold.close()
    e2e.wait_until("the attempt settled, well before the reconciler's lease ran out",
                   lambda: status_of(s, aid) not in ("UNKNOWN", "PROCESSING"), 20)
    charges = [c for c in s.ledger() if c["idempotency_key"] == key]
    recorded = int(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'"
                           " AND operation = 'charge' AND actor = '%s'"
                           % (aid, s.worker_ids[r]))[0][0])
    e2e.wait_until("the reconciler's charge calls recorded", lambda: int(s.query(
        "SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s' AND operation ="
        " 'charge' AND actor = '%s'" % (aid, s.worker_ids[r]))[0][0]) >= len(charges), 30)
    e2e.log("psp-sim charges of the key: %d; the reconciler's recorded: %d"
            % (len(charges), recorded))
    s.check_invariants()


def many_held(new):
    s = new("locked_many", partitions=3)
    s.start_worker()
    paid = [e2e.new_command() for _ in range(20)]
    s.publish(paid)
    s.wait_settled(20, 60)
    seconds = [e2e.new_command(order_id=c["order_id"]) for c in paid]
    others = [e2e.new_command() for _ in range(10)]
    hold = e2e.Session(s.db)
    try:
        hold.run("BEGIN")
        hold.run("UPDATE payment_attempts SET reason = 'held by the test' WHERE id IN (%s)"
                 % ",".join("'%s'" % c["payment_attempt_id"] for c in paid))
        s.publish(seconds)
        s.publish(others)
        e2e.wait_until("the 10 unrelated attempts charged while 20 orders are held",
                       lambda: count_status(s, [c["payment_attempt_id"] for c in others],
                                            "SUCCEEDED") == 10, 30)
    finally:
        hold.run("ROLLBACK")
        hold.close()
    e2e.wait_until("the 20 second attempts rejected", lambda: count_status(
        s, [c["payment_attempt_id"] for c in seconds], "REJECTED") == 20, 60)
    s.wait_settled(50, 60)
    s.check_invariants()


def scenario(new):
    import os
    only = os.environ.get("LOCK_CASE")
    for case in (peer_lock, frozen_api, uncommitted_change, for_update_held,
                 reconciler_calls_kept, many_held):
        if not only or only == case.__name__:
            e2e.log("== case", case.__name__)
            case(new)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
