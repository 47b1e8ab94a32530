#!/usr/bin/env python3
"""A capture's (and a void's) persist meets its row locked by another
session, which lets go unchanged between the persist's statements.

The worker persists a capture's success in one transaction of two
statements: the authorization's booking (capture_store_book: SUCCEEDED,
captured_amount, the ledger's charge row), then the capture's own row. Both
lock the capture's row SKIP LOCKED (a peer's lock never holds the worker).
Adversary 37b read the window: a session holding the row at the first
statement and letting go before the second has the booking skip the
capture, and the second write it SUCCEEDED with nothing booked, so to
REQUIRES_REVIEW "could not be booked": money captured at psp-sim that our
books do not show. The void's persist has the same shape (the
authorization's move, then the void's row).

The window is forced, not hoped for: a psql session takes the step's row
FOR UPDATE while its call is held at psp-sim (latency), and a SHARE lock on
the step's transitions table, which only the second statement writes. It
lets go of both (unchanged) as soon as either the worker's second statement
waits on that table (the booking has run: the window is open) or the worker
says its persist met a locked row and will try again. Then, from psp-sim's
ledger and our tables: the capture SUCCEEDED with 700, its authorization
SUCCEEDED with 700 and one charge row of 700 in the ledger, psp-sim one
capture of 700; the void SUCCEEDED, its authorization VOIDED, psp-sim one
cancel. Each step's persist ran (or tried) with the row held: the worker
said so, or its second statement waited."""
import json
import os
import sys
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

BUSY = "attempt locked by another session"


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def one(s, sql):
    rows = s.query(sql)
    return rows[0] if rows else None


def authorize(s, amount):
    a = e2e.new_command(amount=amount)
    a["type"] = "authorization.requested"
    produce(s, [a])
    e2e.wait_until("the authorization held", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % a["payment_attempt_id"])
        == [["AUTHORIZED"]], 60)
    return a


def held_across_persist(s, table, transitions, sid):
    """Holds the step's row from the middle of its call until its persist
    has run into it (see the module's text); says which way it did."""
    e2e.wait_until("the step in flight", lambda: one(
        s, "SELECT status FROM %s WHERE id = '%s'" % (table, sid)) == ["PROCESSING"],
        30, interval=0.02)
    busy_before = len(s.worker_log("w1", BUSY))
    hold = e2e.Session(s.db)
    hold.run("BEGIN")
    check_eq(hold.run("SELECT status FROM %s WHERE id = '%s' FOR UPDATE" % (table, sid)),
             [["PROCESSING"]], "the step's row held, its call still in flight")
    hold.run("LOCK TABLE %s IN SHARE MODE" % transitions)
    # Waits in the server, so that the second statement's lock_timeout
    # (100 ms) never runs out before the row is let go.
    result = {}

    def let_go():
        result["rows"] = hold.run(
            "DO $$ BEGIN LOOP"
            "  EXIT WHEN EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted"
            "    AND relation = '%s'::regclass)"
            "    OR EXISTS (SELECT 1 FROM persist_lock_release);"
            "  PERFORM pg_sleep(0.001); END LOOP; END $$" % transitions, timeout=60)
        result["waited"] = hold.run("SELECT NOT EXISTS (SELECT 1 FROM persist_lock_release)")
        hold.run("ROLLBACK")
    t = threading.Thread(target=let_go)
    t.start()
    try:
        e2e.wait_until("the persist to meet the held row", lambda: not t.is_alive() or len(
            s.worker_log("w1", BUSY)) > busy_before, 30, interval=0.02)
    finally:
        s.query("INSERT INTO persist_lock_release VALUES (1) RETURNING 1")
        t.join(e2e.scaled(60))
        hold.close()
    way = "its second statement waited" if result.get("waited") == [["t"]] else \
        "the worker found it busy"
    e2e.log("the %s's persist met its held row: %s" % (table, way))
    s.query("DELETE FROM persist_lock_release RETURNING 1")


def settled(s, table, sid):
    return one(s, "SELECT status FROM %s WHERE id = '%s'" % (table, sid))[0] not in (
        "PENDING", "PROCESSING")


def scenario(new):
    s = new("step_persist_lock", partitions=1)
    s.query("CREATE TABLE persist_lock_release (x int); SELECT 1")
    s.start_worker()
    a = authorize(s, 2000)
    b = authorize(s, 900)
    s.psp_put("/faults", {"latency_ms": 1500, "rules": []})

    cid = str(uuid.uuid4())
    produce(s, [{"type": "capture.requested", "version": 1, "capture_id": cid,
                 "payment_attempt_id": a["payment_attempt_id"],
                 "idempotency_key": "capture:" + cid, "amount": 700}])
    held_across_persist(s, "capture_attempts", "capture_transitions", cid)
    e2e.wait_until("the capture settled", lambda: settled(s, "capture_attempts", cid), 60)
    check_eq(one(s, "SELECT status, coalesce(reason, ''), captured_amount FROM"
                 " capture_attempts WHERE id = '%s'" % cid), ["SUCCEEDED", "", "700"],
             "our capture, executed at psp-sim")
    check_eq(one(s, "SELECT status, captured_amount FROM payment_attempts WHERE id = '%s'"
                 % a["payment_attempt_id"]), ["SUCCEEDED", "700"], "its authorization")
    check_eq(s.query("SELECT kind, amount FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["charge", "700"]], "booked once, 700")

    vid = str(uuid.uuid4())
    produce(s, [{"type": "void.requested", "version": 1, "void_id": vid,
                 "payment_attempt_id": b["payment_attempt_id"],
                 "idempotency_key": "void-" + uuid.uuid4().hex,
                 "reason": "requested_by_customer"}])
    held_across_persist(s, "void_attempts", "void_transitions", vid)
    e2e.wait_until("the void settled", lambda: settled(s, "void_attempts", vid), 60)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(one(s, "SELECT status, coalesce(reason, '') FROM void_attempts WHERE id = '%s'"
                 % vid), ["SUCCEEDED", ""], "our void, executed at psp-sim")
    check_eq(one(s, "SELECT status FROM payment_attempts WHERE id = '%s'"
                 % b["payment_attempt_id"]), ["VOIDED"], "its authorization")

    ledger = s.psp_get("/ledger")
    check_eq([(x["amount"], x["idempotency_key"]) for x in ledger["captures"]],
             [(700, "capture:" + cid)], "psp-sim captured 700 once, under our key")
    check_eq(len(ledger["cancels"]), 1, "psp-sim canceled once")

if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
