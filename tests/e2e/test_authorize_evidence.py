#!/usr/bin/env python3
"""An authorization's evidence (issue 37): the reconciler's look and the
webhooks of the authorize operation, against real Kafka, PostgreSQL and
psp-sim, judged from psp-sim's ledger (what the provider did) and our
tables:

- lost: psp-sim authorizes and drops the answer: UNKNOWN; the
  authorization's look settles it AUTHORIZED on its create again under its
  own key (psp-sim: one intent, requires_capture, no capture, nothing
  succeeded), never FAILED, never SUCCEEDED;
- foreign: while the authorization's own call is held at psp-sim, another
  client authorizes under its own key an intent naming our attempt in its
  metadata: the look settles on our own intent, never on that one;
- captured: our recorded intent captured behind our back (another client's
  capture): the look settles it REQUIRES_REVIEW, never SUCCEEDED (before,
  the charge's look claimed it and called the money taken a charge's
  success, which the database refuses for an authorization);
- webhook: amount_capturable_updated of our recorded intent settles an
  UNKNOWN authorization AUTHORIZED, once (a duplicate delivery changes
  nothing); of an intent only naming an UNKNOWN one (no id recorded), it
  makes it due for the look at once, whose create again under our key
  settles it;
- expiry_webhook: psp-sim's expiry of a hold (cancellation_reason
  automatic, its webhook delivered): VOIDED `expired`, one event
  authorization.failed;
- expiry_look: the same expiry, no webhook: the look at holds older than
  RECONCILER_AUTHORIZATION_EXPIRY_MS finds it, VOIDED `expired`;
- charge: an UNKNOWN automatic charge is still the charge's look's,
  SUCCEEDED with charge.* events only."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_api as api  # noqa: E402
import charged_e2e as e2e  # noqa: E402
import charged_other_client as other  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

LOST = {"WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "300", "RECONCILER_POLL_MS": "100",
        "RECONCILER_SCHEDULE_MS": "300"}


def new_authorization(**extra):
    cmd = e2e.new_command(**extra)
    cmd["type"] = "authorization.requested"
    return cmd


def publish(s, cmd):
    """The command keyed by its attempt, as the contract says."""
    s.produce_raw([{"key": cmd["payment_attempt_id"], "value": json.dumps(cmd)}])


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(provider_payment_id, ''), coalesce(reason, ''),"
                   " lease_owner IS NULL FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"])
    check_eq(len(rows), 1, "one attempt %s" % cmd["payment_attempt_id"])
    return dict(zip(("status", "ppid", "reason", "unleased"), rows[0]))


def events(s, cmd):
    """(type, reason) of the attempt's result events, in order."""
    return [tuple(r) for r in s.query(
        "SELECT event_type, coalesce(payload->>'reason', '') FROM outbox"
        " WHERE payment_attempt_id = '%s' ORDER BY created_at, event_type"
        % cmd["payment_attempt_id"])]


def own_rows(s, cmd):
    """psp-sim's intents created under the command's own key."""
    return [c for c in s.psp_get("/ledger")["charges"]
            if c.get("idempotency_key") == cmd["idempotency_key"]]


def recorded(s, cmd):
    return s.query("SELECT 1 FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"]) == [["1"]]


def wait_until_attempt(s, cmd, what, ok, timeout=30):
    """The attempt, once recorded, unleased and ok(attempt)."""
    return e2e.wait_until("%s %s" % (cmd["payment_attempt_id"], what), lambda: (
        lambda a: a if a and a["unleased"] == "t" and ok(a) else None)(
            recorded(s, cmd) and attempt(s, cmd)), timeout)


def wait_status(s, cmd, want, timeout=30):
    return wait_until_attempt(s, cmd, want, lambda a: a["status"] == want, timeout)


def wait_unknown(s, cmd):
    """The worker gave up on the lost answer: UNKNOWN, never FAILED."""
    got = wait_status(s, cmd, "UNKNOWN")
    check(got["reason"].startswith("outcome_unknown"), "its reason: %r" % got["reason"])
    return got


def lose_answer(s, cmd):
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": cmd["idempotency_key"],
                                     "probability": 1}]})
    publish(s, cmd)
    wait_unknown(s, cmd)
    s.psp_put("/faults", {}, method="DELETE")


def check_held_once(s, cmd, ppid):
    """psp-sim holds the money of one intent under the key, ours: nothing
    captured, nothing succeeded."""
    rows = own_rows(s, cmd)
    check_eq(len(rows), 1, "one intent under the key")
    check_eq((rows[0].get("kind"), rows[0].get("outcome")), ("authorization", "requires_capture"),
             "psp-sim holds it")
    check_eq(rows[0]["payment_intent_id"], ppid, "the intent recorded is ours")
    ledger = s.psp_get("/ledger")
    check_eq(ledger.get("captures", []), [], "nothing captured")
    check_eq(ledger["counters"].get("succeeded", 0), 0, "nothing succeeded")


def lost(new):
    s = new("alook_lost", partitions=1, worker_env=LOST)
    s.start_worker()
    a = new_authorization(amount=1234)
    lose_answer(s, a)
    check_eq(len(own_rows(s, a)), 1, "psp-sim executed it once")
    s.start_reconciler()
    got = wait_status(s, a, "AUTHORIZED")
    check_held_once(s, a, got["ppid"])
    check_eq(got["reason"], "", "a hold has no reason")
    check_eq([t for t, _ in events(s, a)], ["authorization.unknown", "authorization.succeeded"],
             "the authorization's events")
    calls = s.query("SELECT operation FROM provider_calls WHERE payment_attempt_id = '%s'"
                    " AND actor LIKE 'r%%' ORDER BY id" % a["payment_attempt_id"])
    check_eq(calls, [["charge"], ["retrieve"]],
             "the look's calls: the create again under our key (its answer, perhaps a"
             " replay, proves the intent ours), then the intent by that id (its state now)")
    check_eq(s.query("SELECT count(*) FROM ledger_entries"), [["0"]], "nothing booked")


def foreign(new):
    hold_ms = 3000
    s = new("alook_foreign", partitions=1, worker_env={
        "PROVIDER_TIMEOUT_MS": "1000", "WORKER_LEASE_MS": "30000",
        "WORKER_UNKNOWN_RETRIES": "0", "RECONCILER_FIRST_LOOK_MS": "200"})
    s.start_worker()
    s.start_reconciler(RECONCILER_POLL_MS="100", RECONCILER_SCHEDULE_MS="500")
    a = new_authorization(amount=4300)
    s.psp_put("/faults", {"latency_ms": hold_ms, "rules": []})
    publish(s, a)
    e2e.wait_until("our call held at psp-sim",
                   lambda: s.psp_get("/ledger")["counters"]["charges_in_flight"] >= 1, 30)
    s.psp_put("/faults", {}, method="DELETE")
    # Another client's hold, for the same amount, naming our attempt.
    st, doc = other.post(s, "/v1/payment_intents", {
        "amount": a["amount"], "currency": a["currency"].lower(),
        "payment_method": "pm_card_visa", "confirm": "true", "capture_method": "manual",
        "metadata[payment_attempt_id]": a["payment_attempt_id"],
        "metadata[order_id]": a["order_id"]})
    check_eq((st, doc.get("status")), (200, "requires_capture"), "the foreign hold: %s" % doc)
    got = wait_until_attempt(s, a, "settled", lambda g: g["status"] not in (
        "PENDING", "PROCESSING", "UNKNOWN"))
    check_eq(got["status"], "AUTHORIZED", "settled (%s)" % got["reason"])
    check(got["ppid"] != doc["id"], "never on the foreign intent %s" % doc["id"])
    check_held_once(s, a, got["ppid"])


def captured(new):
    s = new("alook_captured", partitions=1, worker_env=LOST)
    s.start_worker()
    a = new_authorization(amount=2100)
    lose_answer(s, a)
    pi = own_rows(s, a)[0]["payment_intent_id"]
    # Our intent recorded (as a look-up would), then captured behind our back.
    s.query("UPDATE payment_attempts SET provider_payment_id = '%s' WHERE id = '%s'"
            % (pi, a["payment_attempt_id"]))
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % pi, {})
    check_eq((st, doc.get("status")), (200, "succeeded"), "the capture behind our back")
    s.start_reconciler()
    got = wait_until_attempt(s, a, "settled", lambda g: g["status"] != "UNKNOWN")
    check_eq(got["status"], "REQUIRES_REVIEW", "money taken where it was held: a person")
    check(got["reason"].startswith("requires_review: captured"), "its reason: %r" % got["reason"])
    check_eq([t for t, _ in events(s, a)],
             ["authorization.unknown", "authorization.requires_review"], "its events")
    check_eq(s.query("SELECT count(*) FROM ledger_entries"), [["0"]], "nothing booked")
    check_eq(len(s.psp_get("/ledger").get("captures", [])), 1, "psp-sim's one capture")


def webhook(new):
    port = e2e.free_port()
    env = dict(LOST, RECONCILER_FIRST_LOOK_MS="600000")
    s = new("alook_webhook", partitions=1, worker_env=env,
            psp_args=api.psp_webhook_args(port))
    api.start_api(s, port=port)
    s.start_worker()

    # Our recorded intent, UNKNOWN: its hold settles it, once.
    a = new_authorization(amount=3100)
    lose_answer(s, a)
    pi = own_rows(s, a)[0]["payment_intent_id"]
    s.query("UPDATE payment_attempts SET provider_payment_id = '%s' WHERE id = '%s'"
            % (pi, a["payment_attempt_id"]))
    evt = "evt_alook_" + a["payment_attempt_id"].replace("-", "")
    s.psp_put("/webhooks/emit", {"intent": pi, "id": evt,
                                 "type": "payment_intent.amount_capturable_updated"},
              method="POST")
    got = wait_status(s, a, "AUTHORIZED")
    check_eq(got["ppid"], pi, "our intent")
    s.psp_put("/webhooks/emit", {"intent": pi, "id": evt,
                                 "type": "payment_intent.amount_capturable_updated"},
              method="POST")
    e2e.wait_until("the duplicate delivered", lambda: s.query(
        "SELECT count(*) FROM processed_webhook_events WHERE event_id = '%s'" % evt) == [["1"]]
        and s.psp_get("/webhooks")["pending"] == 0, 30)
    check_eq(s.query("SELECT outcome FROM processed_webhook_events WHERE event_id = '%s'"
                     % evt), [["applied"]], "recorded once, applied")
    check_eq([t for t, _ in events(s, a)], ["authorization.unknown", "authorization.succeeded"],
             "one authorization.succeeded")
    check_eq(s.query("SELECT count(*) FROM attempt_transitions WHERE payment_attempt_id = '%s'"
                     " AND cause = 'webhook'" % a["payment_attempt_id"]), [["1"]],
             "one transition by the webhook")
    check_held_once(s, a, pi)

    # No id recorded: the hold only names the attempt; due for the look now
    # (its first look was 10 minutes away), whose create again proves it.
    b = new_authorization(amount=3200)
    lose_answer(s, b)
    pb = own_rows(s, b)[0]["payment_intent_id"]
    s.psp_put("/webhooks/emit", {"intent": pb,
                                 "type": "payment_intent.amount_capturable_updated"},
              method="POST")
    e2e.wait_until("made due now", lambda: s.query(
        "SELECT next_check_at <= now() FROM payment_attempts WHERE id = '%s'"
        % b["payment_attempt_id"]) == [["t"]], 30)
    check_eq(attempt(s, b)["status"], "UNKNOWN", "never settled on what only names it")
    s.start_reconciler()
    got = wait_status(s, b, "AUTHORIZED")
    check_held_once(s, b, got["ppid"])


def expiry_webhook(new):
    port = e2e.free_port()
    s = new("alook_expiry_wh", partitions=1, psp_args=api.psp_webhook_args(port))
    api.start_api(s, port=port)
    s.start_worker()
    a = new_authorization(amount=5100)
    publish(s, a)
    pi = wait_status(s, a, "AUTHORIZED")["ppid"]
    s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 200})
    got = wait_status(s, a, "VOIDED")
    check_expired(s, a, pi, got, "webhook")


def check_expired(s, a, pi, got, cause):
    check_eq(got["reason"], "expired", "VOIDED expired")
    check_eq(s.query("SELECT old_status, cause FROM attempt_transitions"
                     " WHERE payment_attempt_id = '%s' AND new_status = 'VOIDED'"
                     % a["payment_attempt_id"]), [["AUTHORIZED", cause]],
             "one transition to VOIDED, by the %s" % cause)
    check_eq(events(s, a), [("authorization.succeeded", ""), ("authorization.failed", "expired")],
             "one event for the expiry")
    exp = [e for e in s.psp_get("/ledger").get("expiries", []) if e["payment_intent_id"] == pi]
    check_eq(len(exp), 1, "psp-sim expired it")
    check_eq(s.psp_get("/ledger").get("captures", []), [], "nothing captured")
    check_eq(s.query("SELECT held_by IS NULL FROM payment_attempts WHERE id = '%s'"
                     % a["payment_attempt_id"]), [["t"]], "no hold left")


def expiry_look(new):
    s = new("alook_expiry_look", partitions=1)
    s.start_worker()
    a = new_authorization(amount=5200)
    publish(s, a)
    pi = wait_status(s, a, "AUTHORIZED")["ppid"]
    s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 200})
    s.start_reconciler(RECONCILER_AUTHORIZATION_EXPIRY_MS="1000", RECONCILER_POLL_MS="100")
    got = wait_status(s, a, "VOIDED")
    check_expired(s, a, pi, got, "reconciler")
    check_eq(s.query("SELECT operation FROM provider_calls WHERE payment_attempt_id = '%s'"
                     " ORDER BY id" % a["payment_attempt_id"]), [["charge"], ["retrieve"]],
             "the worker's create, the look's retrieve of our intent")


def charge(new):
    s = new("alook_charge", partitions=1, worker_env=LOST)
    s.start_worker()
    c = e2e.new_command(amount=990)
    lose_answer(s, c)
    s.start_reconciler()
    got = wait_status(s, c, "SUCCEEDED")
    rows = own_rows(s, c)
    check_eq((len(rows), rows[0].get("outcome")), (1, "succeeded"), "psp-sim charged once")
    check_eq(got["ppid"], rows[0]["payment_intent_id"], "its intent")
    check_eq([t for t, _ in events(s, c)], ["charge.unknown", "charge.succeeded"],
             "a charge's events")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % c["payment_attempt_id"]), [["1"]], "booked")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(
        [lost, foreign, captured, webhook, expiry_webhook, expiry_look, charge])))
