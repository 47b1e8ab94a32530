#!/usr/bin/env python3
"""Authorizations (issue 37's first operation) through the worker, against
real Kafka, PostgreSQL and psp-sim, judged from psp-sim's ledger and our
tables:

- held: an authorization.requested, delivered twice, is one attempt
  AUTHORIZED (capture_method manual, the intent's id recorded) and one
  intent at psp-sim in requires_capture (an authorization, not a
  succeeded charge), with one event authorization.succeeded and nothing in
  our ledger (no money moved). Delivered again later it is still the same
  attempt: no second call, no second event;
- declined: a decline is FAILED, authorization.failed;
- lost: psp-sim authorizes and drops the answer (drop_after, the worker
  asking no more): UNKNOWN, authorization.unknown, never FAILED, while
  psp-sim holds the money; the reconciler's look then settles it on the
  provider's evidence, AUTHORIZED, with authorization.* events only;
- live: a second authorization of an order whose money is held is
  REJECTED before any call (authorization.rejected); a charge.requested
  under the authorization's attempt and key is a dead letter
  (idempotency_key_conflict), never a charge."""
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402


def new_authorization(**extra):
    """An authorization.requested: a charge command's fields."""
    cmd = e2e.new_command(**extra)
    cmd["type"] = "authorization.requested"
    return cmd


def produce(s, cmds):
    """Each command keyed by its attempt, as the contract says (one
    producer: one key keeps its order)."""
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def attempt(s, cmd):
    rows = s.query("SELECT status, capture_method, coalesce(provider_payment_id, ''),"
                   " coalesce(reason, ''), captured_amount IS NULL"
                   " FROM payment_attempts WHERE id = '%s'" % cmd["payment_attempt_id"])
    check_eq(len(rows), 1, "one attempt %s" % cmd["payment_attempt_id"])
    return dict(zip(("status", "method", "ppid", "reason", "uncaptured"), rows[0]))


def events(s, cmd):
    return sorted(r[0] for r in s.query(
        "SELECT event_type FROM outbox WHERE payment_attempt_id = '%s'"
        % cmd["payment_attempt_id"]))


def provider_rows(s, cmd):
    """psp-sim's executed payments under the command's key."""
    return [c for c in s.psp_get("/ledger")["charges"]
            if c.get("idempotency_key") == cmd["idempotency_key"]]


def dead_letter_reasons(s):
    out = {}
    for d in s.dead_letters():
        h = dict((x[0], x[1]) for x in d["headers"])
        out.setdefault(h["dlq.reason"], set()).add(h.get("dlq.id"))
    return dict((k, len(v)) for k, v in out.items())


def held(new):
    s = new("authorize_held", partitions=3)
    s.start_worker()
    a = new_authorization(amount=2500)
    produce(s, [a, a])
    s.wait_settled(1, 60)
    got = attempt(s, a)
    check_eq((got["status"], got["method"], got["uncaptured"]), ("AUTHORIZED", "manual", "t"),
             "the authorization")
    check(got["ppid"].startswith("pi_"), "the intent's id recorded: %r" % got["ppid"])
    rows = provider_rows(s, a)
    check_eq(len(rows), 1, "one intent at psp-sim under the key")
    row = rows[0]
    check_eq(row.get("kind"), "authorization", "psp-sim's row is an authorization")
    check(row.get("outcome") != "succeeded", "not a succeeded charge: %s" % row)
    counters = s.psp_get("/ledger")["counters"]
    check_eq(counters.get("requires_capture"), 1, "psp-sim holds one authorization")
    check_eq(events(s, a), ["authorization.succeeded"], "one authorization.succeeded")
    check_eq(s.query("SELECT count(*) FROM ledger_entries"), [["0"]],
             "nothing booked: no money moved")
    payload = json.loads(s.query("SELECT payload FROM outbox WHERE payment_attempt_id = '%s'"
                                 % a["payment_attempt_id"])[0][0])
    for k in ("event_id", "payment_attempt_id", "order_id", "amount", "currency",
              "provider_payment_id", "occurred_at"):
        check(k in payload, "the event carries %s: %s" % (k, payload))
    check_eq((payload["type"], payload["amount"], payload["provider_payment_id"]),
             ("authorization.succeeded", 2500, got["ppid"]), "the event's fields")
    check("reason" not in payload, "a success has no reason: %s" % payload)

    # Delivered again once settled: the same attempt, nothing sent.
    produce(s, [a])
    e2e.wait_until("the redelivery consumed", lambda: s.lag()["lag"] == 0, 60)
    check_eq(attempt(s, a)["status"], "AUTHORIZED", "still the same authorization")
    check_eq(len(provider_rows(s, a)), 1, "no second intent")
    check_eq(events(s, a), ["authorization.succeeded"], "no second event")
    check_eq(s.query("SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["1"]], "one provider call")


def declined(new):
    s = new("authorize_declined", partitions=1)
    s.start_worker()
    d = new_authorization(amount=700, payment_method="pm_card_chargeDeclined")
    produce(s, [d])
    s.wait_settled(1, 60)
    got = attempt(s, d)
    check_eq((got["status"], got["method"]), ("FAILED", "manual"), "the declined one")
    check(got["reason"].startswith("declined"), "its reason: %r" % got["reason"])
    check_eq(events(s, d), ["authorization.failed"], "one authorization.failed")
    check_eq(s.query("SELECT count(*) FROM ledger_entries"), [["0"]], "nothing booked")


def lost(new):
    s = new("authorize_lost", partitions=1, worker_env={
        "WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200"})
    s.start_worker()
    u = new_authorization(amount=1234)
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": u["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [u])
    e2e.wait_until("the lost answer settled", lambda: s.query(
        "SELECT status FROM payment_attempts WHERE id = '%s' AND lease_owner IS NULL"
        % u["payment_attempt_id"]) not in ([], [["PROCESSING"]]), 60)
    s.psp_put("/faults", {}, method="DELETE")
    got = attempt(s, u)
    check_eq(got["status"], "UNKNOWN", "a lost answer (never FAILED)")
    check(got["reason"].startswith("outcome_unknown"), "its reason: %r" % got["reason"])
    check_eq(events(s, u), ["authorization.unknown"], "one authorization.unknown")
    rows = provider_rows(s, u)
    check_eq(len(rows), 1, "psp-sim executed it once")
    check_eq(rows[0].get("kind"), "authorization", "and holds the money")

    # The reconciler's look (the authorization's own) settles it on the
    # provider's evidence: AUTHORIZED while the money is held, and what it
    # publishes is the authorization's (test_authorize_evidence: the rest).
    s.start_reconciler()
    e2e.wait_until("the look settled it", lambda: attempt(s, u)["status"] != "UNKNOWN", 60)
    check_eq(attempt(s, u)["status"], "AUTHORIZED", "held money is AUTHORIZED")
    check(all(e.startswith("authorization.") for e in events(s, u)),
          "an authorization's events only: %s" % events(s, u))
    check_eq(len(provider_rows(s, u)), 1, "still one intent")


def live(new):
    s = new("authorize_live", partitions=1)
    s.start_worker()
    a = new_authorization(amount=900)
    produce(s, [a])
    s.wait_settled(1, 60)
    check_eq(attempt(s, a)["status"], "AUTHORIZED", "the first authorization")
    second = new_authorization(amount=900, order_id=a["order_id"])
    as_charge = dict(a, type="charge.requested")
    produce(s, [second, as_charge])
    s.wait_settled(2, 60)
    got = attempt(s, second)
    check_eq(got["status"], "REJECTED", "a second authorization of a held order")
    check(got["reason"].startswith("order_has_live_attempt"), "its reason: %r" % got["reason"])
    check_eq(events(s, second), ["authorization.rejected"], "one authorization.rejected")
    check_eq(attempt(s, a)["status"], "AUTHORIZED", "the first untouched")
    e2e.wait_until("the conflict dead-lettered",
                   lambda: dead_letter_reasons(s).get("idempotency_key_conflict") == 1, 60)
    check_eq(len(provider_rows(s, a)), 1, "the charge of an authorization's key never sent")
    check_eq(len(s.psp_get("/ledger")["charges"]), 1, "psp-sim executed one payment")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([held, declined, lost, live])))
