#!/usr/bin/env python3
"""Another client of the account cancels our AUTHORIZED intent (adversary
37a, finding 4): no void of ours holds the authorization, so no step of
ours will ever settle it. The money is no longer held for the order: the
authorization is VOIDED with a reason naming the cancellation
(`canceled_elsewhere: <cancellation_reason>`, as `expired` names the
provider's own), `authorization.failed` published once, and the order may
authorize again; the auditor's void_unbooked does not flag it.

- webhook: the api's payment_intent.canceled of our recorded intent;
- look: no webhooks; the reconciler's look at old holds
  (RECONCILER_AUTHORIZATION_EXPIRY_MS) retrieves it canceled.

Judged from psp-sim's ledger and our tables."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_api as api  # noqa: E402
import charged_e2e as e2e  # noqa: E402
import charged_other_client as other  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

ENV = {"RECONCILER_FIRST_LOOK_MS": "300", "RECONCILER_POLL_MS": "100",
       "RECONCILER_SCHEDULE_MS": "300"}


def authorization(order_id=None):
    cmd = e2e.new_command(amount=2500, **({"order_id": order_id} if order_id else {}))
    cmd["type"] = "authorization.requested"
    return cmd


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(reason, ''), coalesce(provider_payment_id, ''),"
                   " lease_owner IS NULL FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"])
    return dict(zip(("status", "reason", "ppid", "unleased"), rows[0])) if rows else None


def wait_status(s, cmd, *statuses):
    return e2e.wait_until("%s in %s" % (cmd["payment_attempt_id"], statuses), lambda: (
        lambda a: a if a and a["unleased"] == "t" and a["status"] in statuses else None)(
            attempt(s, cmd)), 60)


def authorized(s, order_id=None):
    a = authorization(order_id)
    s.produce_raw([{"key": a["payment_attempt_id"], "value": json.dumps(a)}])
    wait_status(s, a, "AUTHORIZED")
    return a


def canceled_elsewhere(s, a):
    ppid = attempt(s, a)["ppid"]
    st, doc = other.post(s, "/v1/payment_intents/%s/cancel" % ppid,
                         {"cancellation_reason": "requested_by_customer"})
    check_eq((st, doc.get("status")), (200, "canceled"), "canceled behind our back")
    got = wait_status(s, a, "VOIDED")
    check_eq(got["reason"], "canceled_elsewhere: requested_by_customer", "its reason")
    events = s.query("SELECT event_type, coalesce(payload->>'reason', '') FROM outbox WHERE"
                     " payment_attempt_id = '%s' ORDER BY created_at" % a["payment_attempt_id"])
    check_eq(events, [["authorization.succeeded", ""],
                      ["authorization.failed", "canceled_elsewhere: requested_by_customer"]],
             "published once")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["0"]], "nothing booked")
    # The order is not stuck: it may authorize again.
    b = authorized(s, a["order_id"])
    check_eq(attempt(s, b)["status"], "AUTHORIZED", "the order authorized again")
    rc, out, err = s.audit("run", "--since", "600s", "--json")
    check_eq(s.query("SELECT count(*) FROM audit_findings WHERE kind = 'void_unbooked'"),
             [["0"]], "no void_unbooked: %s %s" % (out[-500:], err[-300:]))


def webhook(new):
    port = e2e.free_port()
    s = new("auth_canceled_webhook", partitions=1, psp_args=api.psp_webhook_args(port),
            worker_env=ENV)
    api.start_api(s, port=port)
    s.start_worker()
    a = authorized(s)
    canceled_elsewhere(s, a)
    check_eq(s.query("SELECT outcome FROM processed_webhook_events WHERE event_type ="
                     " 'payment_intent.canceled'"), [["applied"]], "the webhook applied it")


def look(new):
    s = new("auth_canceled_look", partitions=1, worker_env=ENV)
    s.start_worker()
    s.start_reconciler(RECONCILER_AUTHORIZATION_EXPIRY_MS="1000")
    a = authorized(s)
    canceled_elsewhere(s, a)
    check(s.query("SELECT count(*) FROM attempt_transitions WHERE payment_attempt_id = '%s'"
                  " AND new_status = 'VOIDED' AND cause = 'reconciler'"
                  % a["payment_attempt_id"]) == [["1"]], "the look voided it")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([webhook, look])))
