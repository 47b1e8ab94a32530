#!/usr/bin/env python3
"""A refund event that only names our refund never settles it, and never
gives its reservation back (issue 34, break 3).

Charge C (1,000) succeeds. Refund R (500 of it) executes at psp-sim but its
answer is lost (stall_after), so R is UNKNOWN and holds no provider refund
id. Another client of the same account refunds the same intent under its
own key, its metadata naming R; that refund fails (refund.failed, sent by
psp-sim to the api). It only names R: R must stay unsettled and keep its
reservation. Then R's own refund succeeds at psp-sim, and the reconciler,
refunding again under R's key (the provider's replay is R's own answer),
settles R on it.

On e1a768a the api took the other refund as R's: R went PROCESSING on its
refund.created and FAILED on its refund.failed, its 500 given back to the
refundable total while R's own refund executed (a re-sent refund would
refund 1,000 of a 1,000 charge whose books say 500). Judged from psp-sim's
ledger (R's key refunded, succeeded) and the database (R's status, its
provider refund id, the attempt's refunded amount, the events' records)."""
import charged_api as api
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq

ENV = {"WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "600000"}


def refund_row(s, rid):
    # No row yet (the worker has not recorded the command): a row of
    # Nones, so that a wait on its status goes on waiting.
    rows = s.query("SELECT status, coalesce(provider_refund_id, ''), coalesce(reason, '')"
                   " FROM refund_attempts WHERE id = '%s'" % rid)
    return rows[0] if rows else [None, None, None]


def scenario(new):
    port = e2e.free_port()
    s = new("own_refund", partitions=1, psp_args=api.psp_webhook_args(port), worker_env=ENV)
    api.start_api(s, port=port)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)

    # Refunds of this card stay pending until psp-sim's admin API settles them.
    charge = e2e.new_command(amount=1000, payment_method="pm_card_refundPendingFail")
    s.publish([charge])
    e2e.wait_until("C to succeed", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'"
        % charge["payment_attempt_id"]) == [["SUCCEEDED"]], 60)
    intent = s.query("SELECT provider_payment_id FROM payment_attempts WHERE id = '%s'"
                     % charge["payment_attempt_id"])[0][0]

    refund = e2e.new_refund(charge, 500)
    rid = refund["refund_id"]
    # Executed, its answer held past the worker's timeout (2 s) and lost.
    s.psp_put("/faults", {"stall_ms": 3000, "rules": [
        {"kind": "stall_after", "probability": 1, "key": refund["idempotency_key"],
         "times": 1}]})
    s.publish([refund])
    e2e.wait_until("R to be UNKNOWN", lambda: refund_row(s, rid)[0] == "UNKNOWN", 60)
    own = [r for r in s.psp_get("/ledger")["refunds"]
           if r["idempotency_key"] == refund["idempotency_key"]]
    check_eq(len(own), 1, "refunds under R's key")
    check_eq(refund_row(s, rid)[1], "", "R's provider refund id (its answer was lost)")

    foreign = other.refund_naming(s, intent, refund, 500)
    e2e.log("the other client's refund naming R:", foreign["id"], foreign["status"])
    s.psp_put("/refunds/%s/settle" % foreign["id"], {"status": "failed"}, method="POST")
    e2e.wait_until("the api to record the foreign refund.failed", lambda: [
        e for e in other.webhook_events(s, foreign["id"]) if e[0] == "refund.failed"], 30)
    status, prid, reason = refund_row(s, rid)
    check(status != "FAILED",
          "R settled FAILED (%s) by refund %s that only names it, while its own refund "
          "%s executed under its key" % (reason, foreign["id"], own[0]["provider_refund_id"]))
    check(prid != foreign["id"], "R holds the foreign refund %s as its own" % prid)
    check_eq(status, "UNKNOWN", "R after the foreign refund's events")
    reserved = s.query("SELECT refund_reserved FROM payment_attempts WHERE id = '%s'"
                       % charge["payment_attempt_id"])[0][0]
    check_eq(int(reserved), 500, "C's reservation while R is unsettled")
    for etype, outcome, why in other.webhook_events(s, foreign["id"]):
        check(outcome in ("ignored", "needs_review", "unmatched", "unproven"),
              "the foreign refund's %s was %s" % (etype, outcome))
        check(outcome != "ignored" or "only names" in why,
              "the foreign refund's %s: reason %r" % (etype, why))

    # R's own refund succeeds; the reconciler's refund again under R's key
    # is the proof.
    s.psp_put("/refunds/%s/settle" % own[0]["provider_refund_id"], {"status": "succeeded"},
              method="POST")
    s.start_reconciler(RECONCILER_POLL_MS="100", RECONCILER_SCHEDULE_MS="300")
    e2e.wait_until("R to succeed", lambda: refund_row(s, rid)[0] in ("SUCCEEDED", "FAILED",
                                                                     "REQUIRES_REVIEW"), 60)
    status, prid, reason = refund_row(s, rid)
    check_eq(status, "SUCCEEDED", "R's status (%s)" % reason)
    check_eq(prid, own[0]["provider_refund_id"], "R's provider refund id")
    check_eq(s.query("SELECT refunded_amount FROM payment_attempts WHERE id = '%s'"
                     % charge["payment_attempt_id"]), [["500"]], "C's refunded amount")
    check_eq(s.query("SELECT count(*) FROM refund_attempts WHERE provider_refund_id = '%s'"
                     % foreign["id"]), [["0"]], "refunds holding the foreign refund")
    s.check_refund_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
