#!/usr/bin/env python3
"""Regression (issue 17, defect 8a): the status API and the result events
quoted the provider's message verbatim, e.g. "No such customer:
'cus_...'", though docs/api.md promises that no answer holds the customer.
The provider client now masks what a message echoes (ids shaped like the
provider's, quoted values) where the message enters, and reasons carry the
provider's code and param instead (docs/provider.md).

A command names a customer psp-sim does not know (an id that is no
cus_<letters or digits>): psp-sim answers 400 invalid_request_error
resource_missing, param customer, "No such customer: '<id>'".

1. worker: the worker's charge is refused -> FAILED, reason
   "invalid_request: resource_missing (customer): No such customer: '***'".
2. reconciler: the worker's first POST is answered 500 before executing
   (UNKNOWN), the reconciler's POST with the same key is refused -> FAILED
   with the same reason.

In both, the reason in payment_attempts, the charge.failed payload in the
outbox, `charged api`'s GET /v1/payment-attempts/<id> and the provider_calls
rows and the log of every role hold the code and not the customer's id,
nor any part of it.

Scenarios can be run alone: test_reconciler_messages.py reconciler"""
import json
import os
import sys
import time
import uuid

import charged_api
import charged_e2e as e2e
from charged_e2e import check, check_eq

WORKER = {"WORKER_UNKNOWN_RETRIES": 0, "RECONCILER_FIRST_LOOK_MS": 0,
          "PROVIDER_TIMEOUT_MS": 1000, "WORKER_LEASE_MS": 5000}
RECONCILER = {"RECONCILER_SCHEDULE_MS": 200, "RECONCILER_POLL_MS": 100,
              "PROVIDER_TIMEOUT_MS": 1000}
WANT = "invalid_request: resource_missing (customer): No such customer: '***'"


def unknown_customer_command():
    secret = uuid.uuid4().hex[:12]
    # A dash: no cus_<letters or digits>, so psp-sim knows no such customer.
    return e2e.new_command(customer_id="cus_%s-%s" % (secret, uuid.uuid4().hex[:8])), secret


def check_no_customer(s, cmd, secret, want_calls):
    """The reason everywhere charged shows it: the code, not the customer."""
    aid, customer = cmd["payment_attempt_id"], cmd["customer_id"]
    rows = s.query("SELECT status, coalesce(reason, '') FROM payment_attempts "
                   "WHERE id = '%s'" % aid)
    check_eq(rows, [["FAILED", WANT]], "status and reason of %s" % aid)
    payloads = [json.loads(r[0]) for r in s.query(
        "SELECT payload FROM outbox WHERE payment_attempt_id = '%s' "
        "AND event_type = 'charge.failed'" % aid)]
    check_eq(len(payloads), 1, "charge.failed events of %s" % aid)
    check_eq(payloads[0].get("reason"), WANT, "the charge.failed event's reason")
    _, port = charged_api.start_api(s)
    status, doc, raw = charged_api.request(port, "GET", "/v1/payment-attempts/%s" % aid)
    check_eq(status, 200, "status of GET /v1/payment-attempts/%s" % aid)
    check_eq((doc["status"], doc["reason"]), ("FAILED", WANT), "the status API's answer")
    errors = [r[0] for r in s.query(
        "SELECT coalesce(error, '') FROM provider_calls WHERE payment_attempt_id = '%s' "
        "AND http_status = 400" % aid)]
    check_eq(len(errors), want_calls, "provider calls answered 400")
    everything = [json.dumps(payloads), raw.decode(), json.dumps(errors), rows[0][1],
                  json.dumps(s.query("SELECT reason, evidence FROM attempt_transitions "
                                     "WHERE payment_attempt_id = '%s'" % aid))]
    for name in sorted(os.listdir(s.dir)):  # every role's log, psp-sim's apart
        if name.endswith(".log") and name != "psp-sim.log":
            with open(os.path.join(s.dir, name), encoding="utf-8", errors="replace") as f:
                everything.append(f.read())
    for text in everything:
        check(customer not in text and secret not in text,
              "the customer's id %s is in %r" % (customer, text[:400]))
    e2e.log("FAILED %r; the status API answered %s" % (WANT, raw.decode()[:200]))


def worker(new):
    cmd, secret = unknown_customer_command()
    s = new("msg_worker")
    s.start_worker(**WORKER)
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq([c["outcome"] for c in s.ledger()], [], "psp-sim charges")
    check_no_customer(s, cmd, secret, 1)


def reconciler(new):
    cmd, secret = unknown_customer_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("msg_reconciler", psp_args=["--fault", "error_before=1@%s#1" % key])
    s.start_worker(**WORKER)
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check_eq(s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid),
             [["UNKNOWN"]], "status the worker left")
    s.start_reconciler(**RECONCILER)

    def failed():
        st = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % aid)[0][0]
        check(st in ("UNKNOWN", "FAILED"), "the attempt went %s" % st)
        return st == "FAILED"
    e2e.wait_until("the reconciler to settle %s" % aid, failed, 30, 0.1)
    check_eq(s.query("SELECT actor FROM attempt_transitions WHERE payment_attempt_id = '%s' "
                     "AND new_status = 'FAILED'" % aid)[0][0].split("-")[0], "r2",
             "who FAILED it")
    check_no_customer(s, cmd, secret, 1)


SCENARIOS = [worker, reconciler]


def scenario(new):
    wanted = sys.argv[1:]
    names = [f.__name__ for f in SCENARIOS]
    check(all(w in names for w in wanted), "no such scenario in %s (have %s)" % (wanted, names))
    made = []

    def tracked(*a, **k):
        s = new(*a, **k)
        made.append(s)
        return s
    for fn in [f for f in SCENARIOS if not wanted or f.__name__ in wanted]:
        t0 = time.monotonic()
        e2e.log("----", fn.__name__)
        fn(tracked)
        e2e.log("----", fn.__name__, "passed in %.1fs" % (time.monotonic() - t0))
        while made:
            made.pop().close()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
