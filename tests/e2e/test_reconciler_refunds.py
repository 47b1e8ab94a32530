#!/usr/bin/env python3
"""The reconciler settles refunds on the provider's evidence, judged from
psp-sim's ledger.

Refunds are left UNKNOWN by the worker (WORKER_UNKNOWN_RETRIES=0): some
by a 500 after psp-sim executed them (error_after), some by an answer lost
after executing (drop_after), some by a 500 before executing
(error_before); others are PROCESSING because psp-sim says pending
(pm_card_refundPending, pm_card_refundPendingFail). Then a reconciler
runs. At the end: nothing UNKNOWN or PROCESSING; every refund psp-sim
executed and succeeded is SUCCEEDED, each key executed once (the ones that
never executed were sent again with their key, once); the pending ones end
as psp-sim settled them (succeeded, or failed with their reservation
given back); none FAILED that psp-sim refunded; the books agree."""
import charged_e2e as e2e
from charged_e2e import check, check_eq

WORKER_ENV = {"WORKER_UNKNOWN_RETRIES": "0"}
RECONCILER_ENV = {"RECONCILER_SCHEDULE_MS": "200", "RECONCILER_POLL_MS": "100",
                  "RECONCILER_FIRST_LOOK_MS": "200"}


def scenario(new):
    s = new("reconciler_refunds", partitions=3, worker_env=WORKER_ENV,
            psp_args=["--refund-settle-ms", "1500"])
    s.start_worker()
    plain = [e2e.new_command(amount=1000) for _ in range(9)]
    pending = [e2e.new_command(amount=1000, payment_method="pm_card_refundPending")
               for _ in range(2)]
    pending_fail = [e2e.new_command(amount=1000, payment_method="pm_card_refundPendingFail")
                    for _ in range(2)]
    charges = plain + pending + pending_fail
    s.publish(charges)
    s.wait_settled(len(charges), 60)
    refunds = {c["payment_attempt_id"]: e2e.new_refund(c, 700) for c in charges}
    kinds = ["error_after"] * 3 + ["drop_after"] * 3 + ["error_before"] * 3
    rules = [{"kind": k, "key": refunds[c["payment_attempt_id"]]["idempotency_key"],
              "probability": 1, "times": 1} for k, c in zip(kinds, plain)]
    s.psp_put("/faults", {"rules": rules})
    s.publish(list(refunds.values()))
    e2e.wait_until("the worker done with every refund", lambda: s.query(
        "SELECT count(*), count(*) FILTER (WHERE status = 'PENDING' OR lease_owner IS NOT NULL)"
        " FROM refund_attempts") == [[str(len(refunds)), "0"]], 60, 0.3)
    rows = dict(s.query("SELECT status, count(*) FROM refund_attempts GROUP BY 1"))
    e2e.log("refunds after the worker:", rows)
    # A dropped answer on a pooled connection is re-sent by the HTTP client
    # itself with the same key (a replay): those may end SUCCEEDED at once.
    check(int(rows.get("UNKNOWN", 0)) >= 6, "refunds the worker left UNKNOWN: %s" % rows)
    check_eq(int(rows.get("PROCESSING", 0)), 4, "refunds pending at the provider")

    s.start_reconciler(**RECONCILER_ENV)
    e2e.wait_until("every refund settled by the reconciler", lambda: s.query(
        "SELECT count(*) FROM refund_attempts WHERE status IN ('UNKNOWN', 'PROCESSING',"
        " 'PENDING')") == [["0"]], 60, 0.3)
    status = dict((r[0], r[1]) for r in s.query(
        "SELECT payment_attempt_id, status FROM refund_attempts"))
    for c in plain + pending:
        check_eq(status[c["payment_attempt_id"]], "SUCCEEDED",
                 "refund of %s (%s)" % (c["payment_attempt_id"], c["payment_method"]))
    for c in pending_fail:
        check_eq(status[c["payment_attempt_id"]], "FAILED", "refund that failed at psp-sim")
    executions = s.psp_get("/ledger")["refund_executions"]
    for r in refunds.values():
        check_eq(int(executions.get(r["idempotency_key"], 0)), 1,
                 "executions of refund key %s" % r["idempotency_key"])
    check_eq(s.query("SELECT count(*) FROM refund_transitions WHERE cause = 'reconciler'"
                     " AND new_status IN ('SUCCEEDED', 'FAILED')"),
             [[str(int(rows.get("UNKNOWN", 0)) + int(rows.get("PROCESSING", 0)))]],
             "the reconciler's settling transitions")
    fails = s.query("SELECT p.refund_reserved FROM payment_attempts p WHERE p.id IN ('%s')"
                    % "','".join(c["payment_attempt_id"] for c in pending_fail))
    check_eq(fails, [["0"], ["0"]], "reservations of the failed refunds, given back")
    calls = dict((r[0], int(r[1])) for r in s.query(
        "SELECT operation, count(*) FROM provider_calls WHERE refund_id IS NOT NULL"
        " AND actor LIKE 'r%' GROUP BY 1"))
    # Each UNKNOWN refund was listed; the three that never executed were sent
    # again; each pending one was retrieved by its id.
    check(calls.get("list_refunds", 0) >= int(rows.get("UNKNOWN", 0)) and
          calls.get("refund", 0) >= 3 and calls.get("retrieve_refund", 0) >= 4,
          "the reconciler's recorded refund calls: %s" % calls)
    s.check_refund_invariants()
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
