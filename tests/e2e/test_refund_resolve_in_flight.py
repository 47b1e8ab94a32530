#!/usr/bin/env python3
"""chargectl refund resolve --status FAILED must not give a reservation back
while the refund's call may still execute at the provider.

A charge SUCCEEDS; psp-sim then holds every keyed POST for 10 s before it
executes it (latency), longer than the worker's PROVIDER_TIMEOUT_MS of 1 s,
so the worker's refund times out: UNKNOWN (the worker may not retry:
WORKER_UNKNOWN_RETRIES 0). While psp-sim still holds that POST, the list of
the charge's refunds is (consistently) empty: the refund is not executed
yet. An operator resolving the refund FAILED on that list would give its
reservation back and publish refund.failed for a refund psp-sim executes a
few seconds later. The resolve must be refused (nothing written); once
psp-sim has executed the refund, the refund is still UNKNOWN and reserved,
and psp-sim's executed refunds stay within what the database holds."""
import json
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq

LATENCY_MS = 10000


def scenario(new):
    s = new("refund_resolve_in_flight")
    s.start_worker(WORKER_UNKNOWN_RETRIES=0, PROVIDER_TIMEOUT_MS=1000,
                   RECONCILER_FIRST_LOOK_MS=0)
    charge = e2e.new_command(amount=2000)
    s.publish([charge])
    s.wait_settled(1, timeout=60)
    check_eq(s.attempts()[0]["status"], "SUCCEEDED", "the charge to refund")

    s.psp_put("/faults", {"latency_ms": LATENCY_MS, "rules": []})
    rid = str(uuid.uuid4())
    cmd = {"type": "refund.requested", "version": 1, "refund_id": rid,
           "payment_attempt_id": charge["payment_attempt_id"],
           "idempotency_key": "refund:" + rid, "amount": 2000,
           "reason": "requested_by_customer"}
    s.produce_raw([{"key": cmd["payment_attempt_id"], "value": json.dumps(cmd)}])

    def left_unknown():
        rows = s.query("SELECT status, reserved, lease_owner IS NULL FROM refund_attempts "
                       "WHERE id = '%s'" % rid)
        return rows and rows[0][0] == "UNKNOWN" and rows[0][2] in (True, "t")
    e2e.wait_until("the worker to leave the refund UNKNOWN", left_unknown, 30, 0.1)
    executed = [r for r in s.psp_get("/ledger")["refunds"]
                if r["idempotency_key"] == cmd["idempotency_key"]]
    check_eq(executed, [], "psp-sim's refunds under the key while it holds the POST")

    p = s.run([e2e.CHARGECTL, "refund", "resolve", rid, "--status", "FAILED", "--reason",
               "no refund at the provider", "--actor", "erin"], check=False)
    e2e.log("resolve: exit %d, %s" % (p.returncode, p.stderr.decode().strip()))

    def executed_now():
        return [r for r in s.psp_get("/ledger")["refunds"]
                if r["idempotency_key"] == cmd["idempotency_key"]]
    done = e2e.wait_until("psp-sim to execute the held refund", executed_now,
                          LATENCY_MS / 1000 + 20, 0.2)
    check_eq([r["status"] for r in done], ["succeeded"], "psp-sim's refund under the key")

    rows = s.query("SELECT r.status, r.reserved, p.refund_reserved, p.refunded_amount "
                   "FROM refund_attempts r JOIN payment_attempts p "
                   "ON p.id = r.payment_attempt_id WHERE r.id = '%s'" % rid)
    status, reserved, charge_reserved = rows[0][0], rows[0][1], int(rows[0][2])
    check(status != "FAILED",
          "refund %s resolved FAILED (reservation given back: refund_reserved %d) while "
          "its call was still in flight; psp-sim then executed it: %s"
          % (rid, charge_reserved, done))
    check_eq(p.returncode, 1, "exit status of a resolve while the call may still execute")
    check_eq((status, reserved in (True, "t"), charge_reserved), ("UNKNOWN", True, 2000),
             "the refund and its reservation after the refused resolve")
    s.psp_put("/faults", {}, method="DELETE")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
