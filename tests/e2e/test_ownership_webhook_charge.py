#!/usr/bin/env python3
"""A decline of someone else's intent never fails our in-flight attempt
(issue 34, break 1).

Attempt A's call is held 4 s at psp-sim before it executes. Meanwhile
another client of the same account charges under its own key, with a
declined card and metadata naming A and A's order (metadata is anyone's to
write). psp-sim sends payment_intent.payment_failed about that intent to
the api. The intent only names A: charged recorded no intent of A's own
yet, so it proves nothing and must not move A. A's own call then succeeds
under A's key and settles A SUCCEEDED.

On e1a768a the api settled A FAILED on the foreign decline (lease ended,
epoch bumped); A's own success was then dropped by the worker ("lease lost
before persisting"), and the order service would charge the order again.
Judged from psp-sim's ledger (A's key charged and succeeded) and the
database (A's status, its intent, its transitions, the event's record)."""
import charged_api as api
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq

HOLD_MS = 4000
ENV = {"PROVIDER_TIMEOUT_MS": "10000", "WORKER_LEASE_MS": "30000",
       "WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "600000"}


def scenario(new):
    port = e2e.free_port()
    s = new("own_webhook_charge", partitions=1, psp_args=api.psp_webhook_args(port),
            worker_env=ENV)
    api.start_api(s, port=port)
    w = s.start_worker()
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)

    cmd = e2e.new_command(amount=4200)
    aid = cmd["payment_attempt_id"]
    # Every charge arriving now is held HOLD_MS before it executes; A's
    # keeps its hold once the latency is gone.
    s.psp_put("/faults", {"latency_ms": HOLD_MS, "rules": []})
    s.publish([cmd])
    e2e.wait_until("A's call to be held at psp-sim",
                   lambda: s.psp_get("/ledger")["counters"]["charges_in_flight"] >= 1, 30)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid),
             [["PROCESSING"]], "A while its call is held")

    foreign = other.charge_naming(s, cmd, "pm_card_chargeDeclined")
    e2e.log("the other client's declined intent naming A:", foreign["id"])
    events = e2e.wait_until("the api to record the foreign decline", lambda: [
        e for e in other.webhook_events(s, foreign["id"])
        if e[0] == "payment_intent.payment_failed"], 30)
    check(not any(c["payment_intent_id"] == foreign["id"] and
                  c["idempotency_key"] == cmd["idempotency_key"] for c in s.ledger()),
          "the foreign intent is under A's key")

    # A's own call executes once its hold is over, and settles A.
    own = e2e.wait_until("A's own charge to execute at psp-sim", lambda: [
        c for c in s.ledger() if c["idempotency_key"] == cmd["idempotency_key"]], 30)
    check_eq(len(own), 1, "charges under A's key")
    check_eq(own[0]["outcome"], "succeeded", "A's own charge at psp-sim")
    e2e.wait_until("A to leave PROCESSING", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s'" % aid) != [["PROCESSING"]], 30)
    status, ppid, reason = s.query(
        "SELECT status, coalesce(provider_payment_id, ''), coalesce(reason, '')"
        " FROM payment_attempts WHERE id = '%s'" % aid)[0]
    # Whatever came later (A's own success makes a FAILED attempt
    # REQUIRES_REVIEW), the foreign decline must never have moved A.
    by_webhook = s.query(
        "SELECT old_status, new_status, coalesce(reason, '') FROM attempt_transitions"
        " WHERE payment_attempt_id = '%s' AND cause = 'webhook' ORDER BY id" % aid)
    check(not by_webhook,
          "A moved by webhooks %s: a decline of intent %s that only names it, while its "
          "own charge %s succeeded under its key (A is now %s)"
          % (by_webhook, foreign["id"], own[0]["payment_intent_id"], status))
    check_eq(status, "SUCCEEDED", "A's status (%s)" % reason)
    check_eq(ppid, own[0]["payment_intent_id"], "A's intent (its own call's answer)")
    check_eq([e[1] for e in events], ["ignored"], "the foreign decline's outcome")
    check("only names" in events[0][2], "the foreign decline's reason: %r" % events[0][2])
    # psp-sim's webhook of A's own success races A's answer: applied,
    # ignored or (it came first) unproven, never flagged: that pages.
    own_events = e2e.wait_until("the api to record A's own success", lambda: [
        e for e in other.webhook_events(s, own[0]["payment_intent_id"])
        if e[0] == "payment_intent.succeeded"], 30)
    check(own_events[0][1] in ("applied", "ignored", "unproven"),
          "A's own success recorded as %r (%s)" % (own_events[0][1], own_events[0][2]))
    check(not s.worker_log(w, "lease lost before persisting; result dropped"),
          "the worker dropped A's own answer")
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
