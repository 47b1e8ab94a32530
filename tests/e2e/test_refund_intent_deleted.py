#!/usr/bin/env python3
"""A refund whose charge's intent the provider no longer has must not be
called unrefunded (issue 34, adversary round 2: a 404 read as an empty
list).

Charge A (1,000) succeeds. Refund R (500) executes at psp-sim but its
answer is lost (stall_after): R is UNKNOWN, no provider refund id, A's 500
reserved. Once no call under R's key may still execute (its last call
older than WORKER_KEY_RETENTION_MS, no lease), the provider drops A's
intent (psp-sim DELETE /intents/<id>): the list of that intent's refunds
answers 404 resource_missing. It looked at nothing, so it is no evidence
that no refund executed: psp-sim's ledger shows R's key refunded 500.

1. resolve_failed: chargectl refund resolve R --status FAILED is refused
   (the provider did not answer the list), nothing written: R UNKNOWN, A's
   500 still reserved.
2. reconciler: the reconciler's look at R past its key's window (the list
   of A's refunds) records the list's answer as no evidence and leaves R
   UNKNOWN, reserved; never FAILED never_executed.

Scenarios can be run alone: test_refund_intent_deleted.py reconciler"""
import charged_e2e as e2e
from charged_e2e import check, check_eq
import test_reconciler_branches as rb

AMOUNT = 1000
RETENTION = 3000
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "600000"}


def refund_row(s, rid):
    # No row yet (the worker has not recorded the command): a row of
    # Nones, so that a wait on its status goes on waiting.
    rows = s.query("SELECT status, coalesce(provider_refund_id, ''), coalesce(reason, '')"
                   " FROM refund_attempts WHERE id = '%s'" % rid)
    return rows[0] if rows else [None, None, None]


def reserved(s, aid):
    return int(s.query("SELECT refund_reserved FROM payment_attempts WHERE id = '%s'"
                       % aid)[0][0])


def refunded_then_deleted(new, name):
    """A's refund R executed, its answer lost, its key past the window, and
    A's intent gone from the provider: (scenario, A's id, R's id)."""
    s = new(name, partitions=1, worker_env=ENV)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    charge = e2e.new_command(amount=AMOUNT)
    aid = charge["payment_attempt_id"]
    s.publish([charge])
    e2e.wait_until("A to succeed", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % aid) == [["SUCCEEDED"]], 60)
    intent = s.query("SELECT provider_payment_id FROM payment_attempts WHERE id = '%s'"
                     % aid)[0][0]
    refund = e2e.new_refund(charge, 500)
    rid = refund["refund_id"]
    s.psp_put("/faults", {"stall_ms": 3000, "rules": [
        {"kind": "stall_after", "probability": 1, "key": refund["idempotency_key"],
         "times": 1}]})
    s.publish([refund])
    e2e.wait_until("R to be UNKNOWN", lambda: refund_row(s, rid)[0] == "UNKNOWN", 60)
    own = [r for r in s.psp_get("/ledger")["refunds"]
           if r["idempotency_key"] == refund["idempotency_key"]]
    check_eq([(r["payment_intent_id"], r["amount"], r["status"]) for r in own],
             [(intent, 500, "succeeded")], "psp-sim's refunds under R's key")
    e2e.wait_until("R's key past WORKER_KEY_RETENTION_MS, no lease", lambda: s.query(
        "SELECT coalesce(lease_expires_at > now(), false) FROM refund_attempts"
        " WHERE id = '%s'" % rid)[0][0] in ("f", "false") and float(s.query(
            "SELECT extract(epoch FROM now() - max(coalesce(recorded_at, started_at)))"
            " * 1000 FROM provider_calls WHERE refund_id = '%s'" % rid)[0][0])
        > RETENTION + 500, 30)
    s.psp_put("/intents/%s" % intent, {}, method="DELETE")
    check_eq(reserved(s, aid), 500, "A's reservation while R is unsettled")
    return s, aid, rid


def resolve_failed(new):
    s, aid, rid = refunded_then_deleted(new, "refund_deleted_resolve")
    p = s.run([e2e.CHARGECTL, "refund", "resolve", rid, "--status", "FAILED", "--reason",
               "the provider lists no refund for R", "--actor", "erin"], check=False,
              extra_env={"WORKER_KEY_RETENTION_MS": str(RETENTION)})
    err = p.stderr.decode().strip()
    e2e.log("resolve FAILED: exit %d %s" % (p.returncode, err))
    check(refund_row(s, rid)[0] != "FAILED",
          "R resolved FAILED on a list the provider answered 404 (exit %d), A's"
          " reservation now %d, although psp-sim refunded 500 under R's key"
          % (p.returncode, reserved(s, aid)))
    check_eq(p.returncode, 1, "exit status of resolve FAILED")
    check("did not answer" in err and "404" in err,
          "the refusal says the list was not answered: %r" % err)
    check_eq(refund_row(s, rid)[0], "UNKNOWN", "R after the refused resolve")
    check_eq(reserved(s, aid), 500, "A's reservation")


def reconciler(new):
    s, aid, rid = refunded_then_deleted(new, "refund_deleted_reconciler")
    s.psql(s.db, "UPDATE refund_attempts SET next_check_at = now() WHERE id = '%s'" % rid)
    r = s.start_reconciler(WORKER_KEY_RETENTION_MS=RETENTION, **rb.RECONCILER)
    lists = "SELECT outcome FROM provider_calls WHERE refund_id = '%s'" \
            " AND operation = 'list_refunds' ORDER BY id" % rid
    e2e.wait_until("the reconciler's list of A's refunds", lambda: s.query(lists), 30)
    check_eq(s.stop_reconciler(r), 0, "the reconciler's exit after SIGTERM")
    row = refund_row(s, rid)
    e2e.log("R after the reconciler's look:", row, "its list calls:", s.query(lists))
    check(row[0] != "FAILED",
          "the reconciler settled R FAILED (%s) on a list the provider answered 404,"
          " although psp-sim refunded 500 under R's key" % row[2])
    check_eq(row[0], "UNKNOWN", "R after the reconciler's look")
    check_eq([o for (o,) in s.query(lists)][:1], ["unknown"],
             "the list's outcome, recorded")
    check_eq(reserved(s, aid), 500, "A's reservation")


SCENARIOS = [resolve_failed, reconciler]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
