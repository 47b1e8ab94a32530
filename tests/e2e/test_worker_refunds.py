#!/usr/bin/env python3
"""Refunds through the worker, against real Kafka, PostgreSQL and psp-sim,
judged from psp-sim's ledger:

- basics: partial then the rest, an over-refund and a refund of a declined
  charge REJECTED before any provider call, a duplicate delivery, a
  conflicting resend (a dead letter that leaves the first untouched), a bad
  command (its own reason), and a late conflicting resend of the charge;
- race: two refunds of one charge, each 60% of it, reach two workers at
  once (two consumer groups, so each worker holds both): one SUCCEEDED, the
  other REJECTED exceeds_charge, one provider refund per charge;
- crash: a worker killed right after psp-sim executed a refund, before it
  persisted: the next owner settles it SUCCEEDED, executed once;
- row_lock: a session holds a charge's row lock (FOR UPDATE, never
  committed) while a refund of it, a refund of another charge and a new
  charge reach the worker in one batch: only the held refund waits; the
  others settle within their first lease, and the held one after the
  lock goes;
- call_log_lock: a charge's and a refund's provider calls written
  together while the refund's charge row is held: the charge's call is
  written once, the refund's once the lock goes."""
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402


def charge_all(s, cmds):
    s.publish(cmds)
    s.wait_settled(len(cmds), 60)


def status_of(s, refund_id):
    rows = s.query("SELECT status, coalesce(reason, '') FROM refund_attempts"
                   " WHERE id = '%s'" % refund_id)
    return tuple(rows[0]) if rows else (None, None)


def dead_letters_by_reason(s):
    """Each dead letter once (a letter may be produced again after a
    crash: dlq.id names it), by its dlq.reason."""
    letters = {}
    for d in s.dead_letters():
        h = dict((x[0], x[1]) for x in d["headers"])
        letters.setdefault(h["dlq.id"], h)
    out = {}
    for h in letters.values():
        out.setdefault(h["dlq.reason"], []).append(h)
    return out


def basics(new):
    s = new("refund_basics", partitions=3)
    s.start_worker()
    a = e2e.new_command(amount=1000)
    b = e2e.new_command(amount=500)
    declined = e2e.new_command(amount=700, payment_method="pm_card_chargeDeclined")
    charge_all(s, [a, b, declined])
    check_eq(s.query("SELECT status FROM payment_attempts WHERE id = '%s'"
                     % declined["payment_attempt_id"]), [["FAILED"]], "the declined charge")

    partial = e2e.new_refund(a, 400)
    rest = e2e.new_refund(a, 600, reason="duplicate")
    over = e2e.new_refund(b, 501)
    full_b = e2e.new_refund(b, 500, reason="fraudulent", metadata={"ticket": "T-1"})
    not_refundable = e2e.new_refund(declined, 100)
    conflicting = dict(full_b, amount=499)
    late_charge_resend = dict(a, amount=999)
    # One producer, in this order: within a charge's partition a refund
    # follows the one before it.
    s.publish([partial, over, full_b, full_b, not_refundable])
    s.wait_refunds_settled(4, 60)
    s.publish([rest, conflicting, late_charge_resend])
    s.produce_raw([{"key": a["payment_attempt_id"],
                    "value": json.dumps(dict(e2e.new_refund(a, 1), reason="because"))}])
    s.wait_refunds_settled(5, 60)
    e2e.wait_until("every command consumed", lambda: s.lag()["lag"] == 0, 60)

    check_eq(status_of(s, partial["refund_id"])[0], "SUCCEEDED", "the partial refund")
    check_eq(status_of(s, rest["refund_id"])[0], "SUCCEEDED", "the rest of the charge")
    check_eq(status_of(s, full_b["refund_id"])[0], "SUCCEEDED", "b's full refund")
    st, why = status_of(s, over["refund_id"])
    check(st == "REJECTED" and why.startswith("exceeds_charge"), "over-refund: %s %s" % (st, why))
    st, why = status_of(s, not_refundable["refund_id"])
    check(st == "REJECTED" and why.startswith("not_refundable"),
          "refund of a declined charge: %s %s" % (st, why))
    check_eq(s.query("SELECT amount FROM refund_attempts WHERE id = '%s'"
                     % full_b["refund_id"]), [["500"]], "the first of a conflicting resend")
    check_eq(s.query("SELECT refunded_amount, amount FROM payment_attempts WHERE id = '%s'"
                     % a["payment_attempt_id"]), [["1000", "1000"]], "a, refunded in full")
    dls = dead_letters_by_reason(s)
    check_eq(len(dls.get("idempotency_key_conflict", [])), 2,
             "conflicting resends (the refund's and the charge's) dead-lettered")
    check_eq(len(dls.get("schema_violation", [])), 1, "the refund with a bad reason")
    events = dict((r[0], int(r[1])) for r in s.query(
        "SELECT event_type, count(*) FROM outbox WHERE refund_id IS NOT NULL GROUP BY 1"))
    check_eq(events, {"refund.succeeded": 3, "refund.rejected": 2}, "refund events")
    check_eq(s.query("SELECT metadata->>'ticket' FROM refund_attempts WHERE id = '%s'"
                     % full_b["refund_id"]), [["T-1"]], "the refund's metadata")
    s.check_invariants()
    s.check_refund_invariants()
    check_eq(len(s.psp_get("/ledger")["refunds"]), 3, "provider refunds")


def race(new):
    s = new("refund_race", partitions=3)
    s.start_worker()
    charges = [e2e.new_command(amount=1000) for _ in range(10)]
    charge_all(s, charges)
    # A second worker in a group of its own: each of the two holds every
    # refund, and both claim them at once.
    other_group = s.group + "-b"
    w2 = s.start_worker(KAFKA_GROUP_ID=other_group)
    e2e.wait_until("the second worker ready", lambda: s.admin_get(w2, "/readyz")[0] == 200, 60)
    refunds = []
    for c in charges:
        refunds += [e2e.new_refund(c, 600), e2e.new_refund(c, 600)]
    s.publish(refunds)
    s.wait_refunds_settled(len(refunds), 60)
    for c in charges:
        rows = s.query("SELECT status, count(*) FROM refund_attempts"
                       " WHERE payment_attempt_id = '%s' GROUP BY 1 ORDER BY 1"
                       % c["payment_attempt_id"])
        check_eq(rows, [["REJECTED", "1"], ["SUCCEEDED", "1"]],
                 "the two 60%% refunds of %s" % c["payment_attempt_id"])
    check_eq(int(s.query("SELECT count(*) FROM refund_attempts WHERE status = 'REJECTED'"
                         " AND reason LIKE 'exceeds_charge%'")[0][0]), 10,
             "refunds rejected exceeds_charge")
    rows = s.psp_get("/ledger")["refunds"]
    check_eq(len(rows), 10, "provider refunds (one per charge)")
    s.check_refund_invariants()


def crash(new):
    s = new("refund_crash", partitions=3, worker_env={
        "WORKER_LEASE_MS": "4000", "PROVIDER_TIMEOUT_MS": "1000", "WORKER_UNKNOWN_RETRIES": "1"})
    first = s.start_worker()
    c = e2e.new_command(amount=1000)
    charge_all(s, [c])
    s.kill_worker(first, signal.SIGTERM)
    dying = s.start_worker(CHARGED_FAILPOINT="after_refund")
    r = e2e.new_refund(c, 250)
    s.publish([r])
    s.wait_worker_exit(dying, 60)
    check(s.worker_log(dying, "failpoint reached"), "the worker did not die at after_refund")
    check_eq(len(s.psp_get("/ledger")["refunds"]), 1, "refunds executed before the crash")
    check_eq(status_of(s, r["refund_id"])[0], "PROCESSING", "the refund when its worker died")
    s.start_worker()
    s.wait_refunds_settled(1, 60)
    check_eq(status_of(s, r["refund_id"])[0], "SUCCEEDED", "the refund after the takeover")
    check_eq(s.psp_get("/ledger")["refund_executions"], {r["idempotency_key"]: 1},
             "executions of the refund's key")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE refund_id = '%s'"
                     % r["refund_id"]), [["1"]], "ledger rows of the refund")
    e2e.wait_until("every command committed", lambda: s.lag()["lag"] == 0, 60)
    s.check_refund_invariants()


def row_lock(new):
    # A lease far longer than the wait below: an item whose claim was lost
    # would only be taken over once it expired.
    s = new("refund_row_lock", partitions=1, worker_env={"WORKER_LEASE_MS": "120000"})
    first = s.start_worker()
    a = e2e.new_command(amount=1000)
    b = e2e.new_command(amount=1000)
    charge_all(s, [a, b])
    s.kill_worker(first, signal.SIGTERM)
    held = e2e.Session(s.db)
    held.run("BEGIN")
    held.run("SELECT 1 FROM payment_attempts WHERE id = '%s' FOR UPDATE"
             % a["payment_attempt_id"])
    of_a = e2e.new_refund(a, 300)
    of_b = e2e.new_refund(b, 300)
    c = e2e.new_command(amount=700)
    # All in the one partition before a worker runs: they are fetched,
    # recorded and claimed as one batch of both kinds.
    s.publish([of_a, c, of_b])
    s.start_worker()

    def others_settled():
        st_c = s.query("SELECT status FROM payment_attempts WHERE id = '%s'"
                       % c["payment_attempt_id"])
        return st_c == [["SUCCEEDED"]] and status_of(s, of_b["refund_id"])[0] == "SUCCEEDED"
    e2e.wait_until("the charge and the other refund settled while a's row is held",
                   others_settled, 30)
    check_eq(status_of(s, of_a["refund_id"])[0], "PENDING", "the held refund")
    check_eq(s.query("SELECT count(*) FROM attempt_transitions WHERE payment_attempt_id"
                     " = '%s' AND reason LIKE 'lease expired%%'" % c["payment_attempt_id"]),
             [["0"]], "takeovers of the new charge")
    held.run("COMMIT")
    held.close()
    s.wait_refunds_settled(2, 60)
    check_eq(status_of(s, of_a["refund_id"])[0], "SUCCEEDED", "the held refund, let go")
    e2e.wait_until("every command committed", lambda: s.lag()["lag"] == 0, 60)
    s.check_invariants()
    s.check_refund_invariants()


def call_log_lock(new):
    s = new("refund_call_log_lock", partitions=1, worker_env={
        "PROVIDER_TIMEOUT_MS": "30000", "WORKER_LEASE_MS": "200000"})
    s.start_worker()
    a = e2e.new_command(amount=1000)
    charge_all(s, [a])
    # Both calls wait in a frozen psp-sim, their claims committed; the
    # charge row is taken then, and both answers come in one turn.
    s.psp_freeze()
    r = e2e.new_refund(a, 300)
    c = e2e.new_command(amount=700)
    s.publish([r, c])
    held = e2e.Session(s.db)
    try:
        e2e.wait_until("both claimed", lambda: s.query(
            "SELECT (SELECT status FROM refund_attempts WHERE id = '%s'),"
            " (SELECT status FROM payment_attempts WHERE id = '%s')"
            % (r["refund_id"], c["payment_attempt_id"])) == [["PROCESSING", "PROCESSING"]], 30)
        held.run("BEGIN")
        held.run("SELECT 1 FROM payment_attempts WHERE id = '%s' FOR UPDATE"
                 % a["payment_attempt_id"])
    finally:
        s.psp_thaw()
    e2e.wait_until("the charge settled while a's row is held", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % c["payment_attempt_id"])
        == [["SUCCEEDED"]], 30)
    held.run("COMMIT")
    held.close()
    s.wait_refunds_settled(1, 60)
    check_eq(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'"
                     % c["payment_attempt_id"]), [["1"]], "provider calls of the charge")
    check_eq(s.query("SELECT count(*) FROM provider_calls WHERE refund_id = '%s'"
                     % r["refund_id"]), [["1"]], "provider calls of the refund")
    e2e.wait_until("every command committed", lambda: s.lag()["lag"] == 0, 60)
    s.check_invariants()
    s.check_refund_invariants()


def behind(new):
    """A refund published right behind its charge reaches the claim while
    the charge's call is in flight (psp-sim answers after 500 ms): it waits
    for the charge and is refunded, not rejected for it."""
    s = new("refund_behind", partitions=1, psp_args=["--latency-ms", "500"])
    s.start_worker()
    c = e2e.new_command(amount=800)
    r = e2e.new_refund(c, 800)
    s.publish([c, r])
    s.wait_refunds_settled(1, 60)
    check_eq(status_of(s, r["refund_id"]), ("SUCCEEDED", ""), "the refund behind its charge")
    s.check_refund_invariants()


def scenario(new):
    only = os.environ.get("REFUND_CASE")
    for case in (basics, race, crash, row_lock, call_log_lock, behind):
        if not only or only == case.__name__:
            e2e.log("== case", case.__name__)
            case(new)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
