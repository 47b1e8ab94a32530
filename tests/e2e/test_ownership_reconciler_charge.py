#!/usr/bin/env python3
"""The reconciler never settles an attempt on an intent that only names it
(issue 34, break 2).

Attempt A's call is held 4 s at psp-sim before it executes; the worker
gives up after 1 s and leaves A UNKNOWN, due for the reconciler 200 ms
later (RECONCILER_FIRST_LOOK_MS below the provider's hold). Meanwhile
another client of the same account charges under its own key with a
declined card, its metadata naming A and A's order. With no intent
recorded for A and A's key inside the provider's window, the only proof is
the charge again under A's own key: while A's first call still executes it
answers 409 (look again), then it replays A's own success.

On e1a768a the reconciler searched by metadata, found the foreign declined
intent and settled A FAILED while A's own call was executing; A's key then
charged. Judged from psp-sim's ledger (A's key charged, succeeded) and the
database (A's status and intent, the reconciler's calls)."""
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq

HOLD_MS = 4000
ENV = {"PROVIDER_TIMEOUT_MS": "1000", "WORKER_LEASE_MS": "30000",
       "WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "200"}


def scenario(new):
    s = new("own_reconciler_charge", partitions=1, worker_env=ENV)
    w = s.start_worker()
    r = s.start_reconciler(RECONCILER_POLL_MS="100", RECONCILER_SCHEDULE_MS="500")
    e2e.wait_until("worker ready", lambda: s.admin_get(w, "/readyz")[0] == 200, 60)
    e2e.wait_until("reconciler ready", lambda: s.admin_get(r, "/readyz")[0] == 200, 60)

    cmd = e2e.new_command(amount=4300)
    aid = cmd["payment_attempt_id"]
    s.psp_put("/faults", {"latency_ms": HOLD_MS, "rules": []})
    s.publish([cmd])
    e2e.wait_until("A's call to be held at psp-sim",
                   lambda: s.psp_get("/ledger")["counters"]["charges_in_flight"] >= 1, 30)
    s.psp_put("/faults", {}, method="DELETE")
    # Before the worker gives up on A (1 s): the reconciler's first look
    # finds it.
    foreign = other.charge_naming(s, cmd, "pm_card_chargeDeclined")
    e2e.log("the other client's declined intent naming A:", foreign["id"])

    own = e2e.wait_until("A's own charge to execute at psp-sim", lambda: [
        c for c in s.ledger() if c["idempotency_key"] == cmd["idempotency_key"]], 30)
    check_eq(own[0]["outcome"], "succeeded", "A's own charge at psp-sim")

    def settled():
        rows = s.query("SELECT status, coalesce(provider_payment_id, ''),"
                       " coalesce(reason, '') FROM payment_attempts WHERE id = '%s'" % aid)
        return rows[0] if rows[0][0] not in ("PENDING", "PROCESSING", "UNKNOWN") else None
    status, ppid, reason = e2e.wait_until("A to settle", settled, 30)
    check(status != "FAILED",
          "A settled FAILED (%s) on intent %s that only names it, while its own charge "
          "%s succeeded under its key" % (reason, foreign["id"], own[0]["payment_intent_id"]))
    check_eq(status, "SUCCEEDED", "A's status (%s)" % reason)
    check_eq(ppid, own[0]["payment_intent_id"], "A's intent (the answer under its key)")
    check_eq(len(own), 1, "charges under A's key")
    calls = s.query("SELECT operation, coalesce(http_status::text, '') FROM provider_calls"
                    " WHERE payment_attempt_id = '%s' AND actor = '%s' ORDER BY id"
                    % (aid, s.worker_ids[r]))
    check(calls and all(op == "charge" for op, _ in calls),
          "the reconciler's calls for A are its charge again under A's key: %s" % calls)
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE provider_payment_id = '%s'"
                     % foreign["id"]), [["0"]], "ledger rows of the foreign intent")
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
