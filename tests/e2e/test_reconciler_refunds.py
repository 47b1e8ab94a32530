#!/usr/bin/env python3
"""The reconciler settles refunds the worker left UNKNOWN or PROCESSING, on
psp-sim's evidence (docs/reconciler.md, "Refunds").

Charges SUCCEED first; then one refund.requested per charge, keyed by its
payment_attempt_id, each refund key with its own psp-sim fault:
error_after / stall_after (executed, answer lost: UNKNOWN), error_before
(nothing executed: UNKNOWN), and, without a fault, charges paid with
pm_card_refundPending / pm_card_refundPendingFail (PROCESSING, settled by
psp-sim later). The worker may not retry an unknown outcome
(WORKER_UNKNOWN_RETRIES 0), so the reconciler must settle them.

A refund with no provider id recorded is settled only on the answer to its
own key (issue 34): a refund in the intent's list that names it proves
nothing, since metadata is anyone's to write.

1. key_kept: the provider keeps the keys (its default retention) -> every
   refund without a recorded id refunded again under its key: the executed
   ones SUCCEEDED on psp-sim's replay, the never-executed one executed and
   SUCCEEDED; the pending ones (their id recorded) SUCCEEDED / FAILED when
   psp-sim settles them.
2. key_forgotten: a retention of 3 s, passed before the reconciler looks ->
   no refund is sent again; the executed ones, which only the list's
   metadata names, REQUIRES_REVIEW (unproven, their reservation kept), the
   never-executed one FAILED never_executed on the list's consistent
   "none".

Each ends with: no refund UNKNOWN or PROCESSING, none FAILED that psp-sim
executed (and did not fail), each refund key executed at most once, a
SUCCEEDED refund's provider_refund_id psp-sim's, every charge's
refunded_amount the sum of its SUCCEEDED refunds (and nothing still
reserved beyond it), the reconciler's calls recorded under the refund, and
the charges' invariants.

Scenarios can be run alone: test_reconciler_refunds.py key_forgotten"""
import json
import sys
import time
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

WORKER = {"WORKER_UNKNOWN_RETRIES": 0, "RECONCILER_FIRST_LOOK_MS": 0,
          "PROVIDER_TIMEOUT_MS": 1000, "WORKER_LEASE_MS": 5000}
RECONCILER = {"RECONCILER_SCHEDULE_MS": 200, "RECONCILER_POLL_MS": 100,
              "PROVIDER_TIMEOUT_MS": 1000}
OPEN = ("UNKNOWN", "PROCESSING")
REFUND_OPS = {"retrieve_refund", "list_refunds", "refund"}


def refund_command(charge, amount):
    rid = str(uuid.uuid4())
    return {"type": "refund.requested", "version": 1, "refund_id": rid,
            "payment_attempt_id": charge["payment_attempt_id"],
            "idempotency_key": "refund:" + rid, "amount": amount,
            "reason": "requested_by_customer"}


def refunds(s):
    rows = s.query("SELECT id, payment_attempt_id, idempotency_key, amount, status, "
                   "coalesce(reason, ''), coalesce(provider_refund_id, ''), "
                   "coalesce(lease_owner, '') FROM refund_attempts")
    return {r[0]: dict(zip(("id", "attempt", "key", "amount", "status", "reason",
                            "prid", "lease_owner"), r)) for r in rows}


def executions(ledger):
    """Refund key -> how many refunds psp-sim executed under it."""
    n = {}
    for row in ledger["refunds"]:
        n[row["idempotency_key"]] = n.get(row["idempotency_key"], 0) + 1
    for key, v in ledger.get("refund_executions", {}).items():
        got = v if isinstance(v, int) else len(v)
        n[key] = max(n.get(key, 0), got)
    return n


def run(new, name, retention_ms):
    # (A dropped answer is sent again by the HTTP client itself, and the
    # replay answers the worker: stall_after is the lost answer it keeps.)
    plans = [("error_after", "pm_card_visa"), ("stall_after", "pm_card_visa"),
             ("error_before", "pm_card_visa"), (None, "pm_card_refundPending"),
             (None, "pm_card_refundPendingFail")]
    charges = [e2e.new_command(payment_method=pm, amount=2000) for _, pm in plans]
    cmds = [refund_command(c, 700 + i) for i, c in enumerate(charges)]
    faults = []
    for (fault, _), r in zip(plans, cmds):
        if fault:
            faults += ["--fault", "%s=1@%s#1" % (fault, r["idempotency_key"])]
    retention = ["--key-retention-ms", str(retention_ms)] if retention_ms else []
    # Pending refunds stay pending until the reconciler has seen them so.
    s = new(name, psp_args=faults + retention + ["--refund-settle-ms", "0"])
    env = dict(WORKER)
    if retention_ms:
        env["WORKER_KEY_RETENTION_MS"] = retention_ms
    s.start_worker(**env)
    s.publish(charges)
    s.wait_settled(len(charges), timeout=60)
    statuses = {a["id"]: a["status"] for a in s.attempts()}
    check(all(statuses[c["payment_attempt_id"]] == "SUCCEEDED" for c in charges),
          "the charges to refund did not all succeed: %s" % statuses)

    s.produce_raw([{"key": r["payment_attempt_id"], "value": json.dumps(r)} for r in cmds])

    def worker_done():
        rs = refunds(s)
        if len(rs) < len(cmds):
            return None
        if any(r["status"] == "PENDING" or r["lease_owner"] for r in rs.values()):
            return None
        return rs if s.lag()["lag"] == 0 else None
    left = e2e.wait_until("the worker to leave every refund", worker_done, 60, 0.2)
    want = {cmds[0]["refund_id"]: "UNKNOWN", cmds[1]["refund_id"]: "UNKNOWN",
            cmds[2]["refund_id"]: "UNKNOWN", cmds[3]["refund_id"]: "PROCESSING",
            cmds[4]["refund_id"]: "PROCESSING"}
    check_eq({k: left[k]["status"] for k in want}, want, "what the worker left")
    e2e.log("worker left:", {k[:8]: v["status"] for k, v in left.items()})

    ledger = s.psp_get("/ledger")
    before = executions(ledger)
    check_eq(sorted(k for k in before), sorted([cmds[0]["idempotency_key"],
                                                cmds[1]["idempotency_key"],
                                                cmds[3]["idempotency_key"],
                                                cmds[4]["idempotency_key"]]),
             "refund keys psp-sim executed before the reconciler")

    renv = dict(RECONCILER)
    if retention_ms:
        renv["WORKER_KEY_RETENTION_MS"] = retention_ms

        def key_age_ms():
            return float(s.query("SELECT min(extract(epoch FROM now() - first_sent_at) "
                                 "* 1000) FROM refund_attempts")[0][0])
        # Past the retention: the reconciler may not send any refund again.
        e2e.wait_until("the refund keys' retention to pass",
                       lambda: key_age_ms() >= retention_ms + 300, 15, 0.1)
    r = s.start_reconciler(**renv)

    # The pending refunds must be seen PROCESSING by the reconciler (a
    # look that finds them pending) before psp-sim settles them.
    pend = [cmds[3]["refund_id"], cmds[4]["refund_id"]]

    def looked_at_pending():
        rows = s.query("SELECT count(*) FROM refund_attempts WHERE id IN ('%s') "
                       "AND reconcile_checks >= 1 AND status = 'PROCESSING'"
                       % "','".join(pend))
        return int(rows[0][0]) == len(pend)
    e2e.wait_until("the reconciler to look at the pending refunds", looked_at_pending,
                   30, 0.1)
    for row in s.psp_get("/ledger")["refunds"]:
        if row["idempotency_key"] == cmds[3]["idempotency_key"]:
            s.psp_put("/refunds/%s/settle" % row["provider_refund_id"],
                      {"status": "succeeded"}, method="POST")
        if row["idempotency_key"] == cmds[4]["idempotency_key"]:
            s.psp_put("/refunds/%s/settle" % row["provider_refund_id"],
                      {"status": "failed", "failure_reason": "expired_or_canceled_card"},
                      method="POST")

    def all_settled():
        rs = refunds(s)
        return rs if not [x for x in rs.values() if x["status"] in OPEN] else None
    final = e2e.wait_until("no refund UNKNOWN or PROCESSING", all_settled, 30, 0.2)
    # Its own series: every refund it moved, by the status it moved it to.
    m = s.admin_metrics(r)
    moved = sum(v for k, v in m.items()
                if k.startswith("charged_reconciler_refund_settlements_total{"))
    check(moved >= len(cmds), "charged_reconciler_refund_settlements_total: %s" % {
        k: v for k, v in m.items() if "refund" in k})
    check_eq(m.get("charged_ready"), 1.0, "charged_ready of the reconciler")
    check_eq(s.stop_reconciler(r), 0, "exit status of the reconciler after SIGTERM")

    ledger = s.psp_get("/ledger")
    execs = executions(ledger)
    by_key = {row["idempotency_key"]: row for row in ledger["refunds"]}
    twice = {k: n for k, n in execs.items() if n > 1}
    check(not twice, "refund keys executed more than once: %s" % twice)
    for x in final.values():
        row = by_key.get(x["key"])
        if x["status"] == "FAILED":
            check(row is None or row["status"] == "failed",
                  "refund %s is FAILED (%s) but psp-sim executed it: %s"
                  % (x["id"], x["reason"], row))
        if x["status"] == "SUCCEEDED":
            check(row is not None and row["status"] == "succeeded",
                  "refund %s is SUCCEEDED without a succeeded refund at psp-sim: %s"
                  % (x["id"], row))
            check_eq(x["prid"], row["provider_refund_id"], "provider_refund_id of %s" % x["id"])
    got = {c["refund_id"]: final[c["refund_id"]]["status"] for c in cmds}
    executed = "REQUIRES_REVIEW" if retention_ms else "SUCCEEDED"
    want = {cmds[0]["refund_id"]: executed, cmds[1]["refund_id"]: executed,
            cmds[2]["refund_id"]: "FAILED" if retention_ms else "SUCCEEDED",
            cmds[3]["refund_id"]: "SUCCEEDED", cmds[4]["refund_id"]: "FAILED"}
    check_eq(got, want, "the refunds' statuses")
    if retention_ms:
        check("never_executed" in final[cmds[2]["refund_id"]]["reason"],
              "reason of the never-executed refund: %r" % final[cmds[2]["refund_id"]]["reason"])

    # Money: refunded_amount is the sum of SUCCEEDED refunds, a FAILED one
    # gave its reservation back, one under review keeps it.
    rows = s.query("SELECT p.id, p.refunded_amount, p.refund_reserved, "
                   "coalesce((SELECT sum(amount) FROM refund_attempts r WHERE "
                   "r.payment_attempt_id = p.id AND r.status = 'SUCCEEDED'), 0), "
                   "coalesce((SELECT sum(amount) FROM refund_attempts r WHERE "
                   "r.payment_attempt_id = p.id AND r.status = 'REQUIRES_REVIEW'), 0) "
                   "FROM payment_attempts p")
    for aid, refunded, reserved, succeeded, review in rows:
        check_eq((int(refunded), int(reserved)), (int(succeeded), int(succeeded) + int(review)),
                 "charge %s: refunded_amount and refund_reserved against its "
                 "SUCCEEDED refunds (and those under review)" % aid)

    # The reconciler's calls, under the refund: sent again only while kept.
    rid = s.worker_ids[r]
    calls = s.query("SELECT coalesce(refund_id::text, ''), operation FROM provider_calls "
                    "WHERE actor = '%s'" % rid)
    check(calls and all(c[0] and c[1] in REFUND_OPS for c in calls),
          "the reconciler's provider calls (all a refund's): %s" % calls)
    sent = [c for c in calls if c[1] == "refund"]
    if retention_ms:
        check_eq(sent, [], "refunds sent again past the key's retention")
    else:
        check_eq(sorted(c[0] for c in sent), sorted(c["refund_id"] for c in cmds[:3]),
                 "refunds sent again (each one without a recorded id)")
    trans = s.query("SELECT count(*) FROM refund_transitions WHERE cause = 'reconciler' "
                    "AND actor = '%s'" % rid)
    check(int(trans[0][0]) >= len(cmds), "reconciler transitions: %s" % trans)
    s.check_invariants()
    e2e.log("%s: %s; calls %s" % (name, got, sorted(set(c[1] for c in calls))))


def key_kept(new):
    run(new, "rr_kept", None)


def key_forgotten(new):
    run(new, "rr_forgotten", 3000)


SCENARIOS = [key_kept, key_forgotten]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
