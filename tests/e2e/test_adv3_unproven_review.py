#!/usr/bin/env python3
"""Adversary 3, break 3: money another client took in our attempt's name
stays `unproven` at the api and `pending` at the auditor for as long as the
attempt sits in review: nobody is paged.

The claim of the `unproven` outcome (docs/api.md, webhook_event.c): a
success that only names an attempt whose own call is in flight or unknown
is recorded and pages no one, because "the attempt's own call or the
reconciler's replay under its key settles it; an intent that stays no
attempt's own is reported by the auditor (foreign_intent, and
charged_twice/charged_unbooked if it took money), which pages."

Steps, on the real worker, api, reconciler and auditor with psp-sim:
1. Attempt A's charge is answered 500 before executing, every time
   (error_before on A's key): the worker leaves A UNKNOWN; nothing of A's
   own is ever charged.
2. Another client of the account charges X (succeeded, money) with
   metadata naming A and A's order. psp-sim delivers
   payment_intent.succeeded: the api records it `unproven` (A's call is
   unknown): no ChargedWebhookFlagged page.
3. The reconciler's replays under A's key are refused; past the key's
   window its search finds only X, which only names A: found_unproven, A
   goes REQUIRES_REVIEW with no intent of its own.
4. The auditor judges X by rule 17 (not booked, succeeded, not foreign, the
   attempt it names is unsettled): pending, and pending again at every
   look, for as long as A is in review. No charged_unbooked, no
   foreign_intent: no page. A's review itself pages no one either.

So the rule's promise fails exactly when the attempt's own call cannot
settle it: the money stays unproven and unpaged. Before `unproven` the
same event was `flagged` (a page). Judged from psp-sim's ledger (X
succeeded, A's key never executed), the database (the event's outcome,
A's status, audit_findings, audit_pending)."""
import charged_api as api
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq
import test_auditor_adversary as adv
import test_reconciler_branches as rb

RETENTION, LAG = 3000, 1000
PAGING = ("charged_unbooked", "charged_twice")


def findings_of(s, obj):
    return {f["kind"]: (f["attempt"], f["other"]) for f in adv.findings(s)
            if f["object"] == obj}


def unproven_then_review(new):
    cmd = e2e.new_command(amount=2600)
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    port = e2e.free_port()
    s = new("adv3_unproven_review", partitions=1, psp_args=api.psp_webhook_args(port) + [
        "--key-retention-ms", str(RETENTION), "--fault", "error_before=1@%s" % key])
    api.start_api(s, port=port)
    t0 = int(adv.db_now(s)) - 1
    s.start_worker(**dict(rb.WORKER, WORKER_KEY_RETENTION_MS=RETENTION))
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq(rb.attempt(s, aid)["status"], "UNKNOWN", "A after its refused call")

    x = other.charge_naming(s, cmd, "pm_card_visa")
    check_eq(x["status"], "succeeded", "the other client's charge naming A")
    events = e2e.wait_until("the api to record X's success", lambda: [
        e for e in other.webhook_events(s, x["id"])
        if e[0] == "payment_intent.succeeded"], 30)
    e2e.log("X", x["id"], "webhook outcomes", events)
    check_eq([e[1] for e in events], ["unproven"], "X's webhook outcome (no page)")

    s.start_reconciler(**dict(rb.RECONCILER, WORKER_KEY_RETENTION_MS=RETENTION,
                              RECONCILER_SEARCH_LAG_MS=LAG))
    a = rb.wait_status(s, aid, ["REQUIRES_REVIEW"], 60, stays=rb.OPEN)
    e2e.log("A in review:", a["reason"], "intent recorded: %r" % a["ppid"])
    check_eq(a["ppid"], "", "A's own intent (none was ever charged)")
    ledger = {c["payment_intent_id"]: c for c in s.ledger()}
    check_eq(ledger[x["id"]]["outcome"], "succeeded", "X at psp-sim: money taken")
    check_eq([c for c in s.ledger() if c["idempotency_key"] == key and
              c["outcome"] == "succeeded"], [], "A's own key charged")

    au = s.start_auditor(AUDITOR_FROM=t0, **adv.AUDITOR)
    adv.wait_watermark(s, int(adv.db_now(s)) + 1, timeout=e2e.scaled(30))
    try:
        e2e.wait_until("a paging finding on X", lambda: set(findings_of(s, x["id"])) &
                       set(PAGING), e2e.scaled(20))
    except e2e.Failure:
        pending = s.query("SELECT object_id FROM audit_pending")
        flagged = s.query("SELECT count(*) FROM processed_webhook_events"
                          " WHERE outcome = 'flagged'")[0][0]
        check(False, "X (%s, %d %s, succeeded at psp-sim, metadata naming attempt %s) is"
              " money taken in our attempt's name, yet: its webhook was %r (flagged events:"
              " %s), A is REQUIRES_REVIEW with no intent of its own, and the auditor's"
              " findings on X are %s with audit_pending %s: no page"
              % (x["id"], x["amount"], x["currency"], aid, events[0][1], flagged,
                 findings_of(s, x["id"]), pending))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


SCENARIOS = [unproven_then_review]

if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
