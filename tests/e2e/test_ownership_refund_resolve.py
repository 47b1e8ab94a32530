#!/usr/bin/env python3
"""chargectl refund resolve --status SUCCEEDED, without --force, books a
refund that only names ours while our own refund executed under its key
(issue 34, adversary).

Charge A (1,000) succeeds. Refund R (500 of A) executes at psp-sim under
R's key, its answer lost (stall_after past the worker's timeout): R is
UNKNOWN, no provider refund id recorded. Another client of the provider
account refunds A's intent, 500, under its own key, its metadata naming R
and A. psp-sim's ledger: two refunds of A's intent, R's own (under R's key)
and the other client's.

The other client's refund only names R (common/core/ownership: neither
recorded from R's call nor the answer under R's key: unproven). operations.md
says a SUCCEEDED decision "books the provider's refund only when it is
proven this refund's". `chargectl refund resolve R --status SUCCEEDED
--provider-refund-id <the other's>` without --force must be refused and
write nothing; on 4cea748 it books the other client's refund as R
(REFUND_REVIEW_UNPROVEN is returned only when the object shows no intent),
and R's own refund, executed under R's key, is booked nowhere: A's intent
is refunded 1,000 at the provider, 500 in charged's books."""
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq

AMOUNT = 1000
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "600000"}


def refund_row(s, rid):
    # No row yet (the worker has not recorded the command): a row of
    # Nones, so that a wait on its status goes on waiting.
    rows = s.query("SELECT status, coalesce(provider_refund_id, '') FROM refund_attempts"
                   " WHERE id = '%s'" % rid)
    return rows[0] if rows else [None, None, None]


def scenario(new):
    s = new("own_refund_resolve", partitions=1, worker_env=ENV)
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
    check_eq(refund_row(s, rid), ["UNKNOWN", ""], "R (its answer was lost)")

    foreign = other.refund_naming(s, intent, refund, 500)
    check_eq(foreign["status"], "succeeded", "the other client's refund naming R")
    on_intent = sorted(r["provider_refund_id"] for r in s.psp_get("/ledger")["refunds"]
                       if r["payment_intent_id"] == intent and r["status"] == "succeeded")
    check_eq(on_intent, sorted([own[0]["provider_refund_id"], foreign["id"]]),
             "psp-sim's succeeded refunds of A's intent")

    p = s.run([e2e.CHARGECTL, "refund", "resolve", rid, "--status", "SUCCEEDED",
               "--provider-refund-id", foreign["id"], "--reason",
               "the provider shows a refund for R", "--actor", "erin"], check=False)
    err = p.stderr.decode().strip()
    e2e.log("resolve without --force: exit %d, %s" % (p.returncode, err))
    status, prid = refund_row(s, rid)
    refunded = s.query("SELECT refunded_amount FROM payment_attempts WHERE id = '%s'"
                       % aid)[0][0]
    check(status != "SUCCEEDED" or prid != foreign["id"],
          "resolve without --force booked %s (another client's refund that only names R)"
          " as refund R; R's own refund %s, executed under R's key, is booked nowhere:"
          " psp-sim refunded %s twice (%s), charged's books say %s"
          % (foreign["id"], own[0]["provider_refund_id"], intent, on_intent, refunded))
    check_eq(p.returncode, 1, "exit status of resolve without --force")
    check_eq(refund_row(s, rid), ["UNKNOWN", ""], "R after a refused resolve")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
