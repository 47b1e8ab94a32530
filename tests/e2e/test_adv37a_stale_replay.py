#!/usr/bin/env python3
"""Adversary 37a: an UNKNOWN authorization settled on a stale replay.

The authorization's look (reconcile_policy.c, classify -> replay) proves an
UNKNOWN authorization whose intent id was never recorded by sending its
create again under its own key. The provider (psp-sim, as Stripe) answers
with the answer it STORED under the key when the create first executed:
`requires_capture`, whatever happened to the intent since. The look takes
that replay as the intent's state (from_authorization: AUTHORIZED) and
never retrieves the intent it names. states.md ("An authorization's
evidence") says what the intent itself says wins:

- captured_behind_replay: our create executed, its answer lost (UNKNOWN,
  no id recorded); another client of the account captured our intent
  (money taken). The attempt must become REQUIRES_REVIEW
  (`requires_review: captured: ...`), never AUTHORIZED: AUTHORIZED says the
  money is only held and books nothing, while psp-sim's ledger shows it
  captured (money captured that our books do not show, and an
  `authorization.succeeded` telling the order service it may still void or
  capture it);
- expired_behind_replay: the same lost create, then the provider's expiry
  (cancellation_reason automatic) before the look: the attempt must be
  FAILED (`canceled: automatic`), never AUTHORIZED with an
  `authorization.succeeded` for a hold that no longer exists.

- worker_retry_behind_replay: the same stale replay in the worker's own
  path, no crash: the create's answer lost once, the worker sends it again
  under its key after its back-off (WORKER_UNKNOWN_RETRIES); another client
  captured our intent meanwhile; the worker's replay says requires_capture.
  The worker must not settle AUTHORIZED on it: the replay proves the intent
  ours (its id recorded), not held now, so the attempt is UNKNOWN for the
  reconciler, whose look retrieves the intent by that id: REQUIRES_REVIEW.

test_authorize_evidence.captured covers the captured case only after
writing the intent id into the attempt by hand ("as a look-up would"); no
look-up does, so the path the look really takes is this one.

Judged from psp-sim's ledger and our tables."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
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
    s.produce_raw([{"key": cmd["payment_attempt_id"], "value": json.dumps(cmd)}])


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(provider_payment_id, ''), coalesce(reason, ''),"
                   " lease_owner IS NULL FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"])
    return dict(zip(("status", "ppid", "reason", "unleased"), rows[0])) if rows else None


def wait_attempt(s, cmd, what, ok, timeout=30):
    return e2e.wait_until("%s %s" % (cmd["payment_attempt_id"], what), lambda: (
        lambda a: a if a and a["unleased"] == "t" and ok(a) else None)(attempt(s, cmd)),
        timeout)


def events(s, cmd):
    return [tuple(r) for r in s.query(
        "SELECT event_type, coalesce(payload->>'reason', '') FROM outbox"
        " WHERE payment_attempt_id = '%s' ORDER BY created_at, event_type"
        % cmd["payment_attempt_id"])]


def own_rows(s, cmd):
    return [c for c in s.psp_get("/ledger")["charges"]
            if c.get("idempotency_key") == cmd["idempotency_key"]]


def lose_answer(s, cmd):
    """psp-sim executes the create and drops its answer: UNKNOWN, no id."""
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": cmd["idempotency_key"],
                                     "probability": 1}]})
    publish(s, cmd)
    got = wait_attempt(s, cmd, "UNKNOWN", lambda a: a["status"] == "UNKNOWN")
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(got["ppid"], "", "no intent id recorded from the lost answer")
    rows = own_rows(s, cmd)
    check_eq(len(rows), 1, "psp-sim executed the create once")
    return rows[0]["payment_intent_id"]


def settled(s, cmd, timeout=30):
    """The attempt once its look moved it out of UNKNOWN (or the deadline)."""
    try:
        return wait_attempt(s, cmd, "looked at", lambda a: a["status"] != "UNKNOWN", timeout)
    except Exception:
        return attempt(s, cmd)


def captured_behind_replay(new):
    s = new("adv37a_captured", partitions=1, worker_env=LOST)
    s.start_worker()
    a = new_authorization(amount=2100)
    pi = lose_answer(s, a)
    # Another client of the account captures our intent (it can find it by
    # listing intents or searching their metadata; the test reads the ledger).
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % pi, {})
    check_eq((st, doc.get("status"), doc.get("amount_received")), (200, "succeeded", 2100),
             "the capture behind our back")
    s.start_reconciler()
    got = settled(s, a)
    ledger = s.psp_get("/ledger")
    check_eq(len([c for c in ledger.get("captures", []) if c["payment_intent_id"] == pi]), 1,
             "psp-sim captured our intent: money taken")
    check_eq(s.query("SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'"
                     % a["payment_attempt_id"]), [["0"]], "nothing of ours booked it")
    check(got["status"] != "AUTHORIZED",
          "a captured intent settled as a hold on the stale replay of its create: %s"
          " (events %s)" % (got, events(s, a)))
    check_eq(got["status"], "REQUIRES_REVIEW", "money taken where it was held: a person")
    check(got["reason"].startswith("requires_review: captured"), "its reason: %r" % got["reason"])
    check_eq([t for t, _ in events(s, a)],
             ["authorization.unknown", "authorization.requires_review"], "its events")


def expired_behind_replay(new):
    s = new("adv37a_expired", partitions=1, worker_env=LOST)
    s.start_worker()
    a = new_authorization(amount=2200)
    pi = lose_answer(s, a)
    s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 200})
    e2e.wait_until("psp-sim expired our hold", lambda: [
        e for e in s.psp_get("/ledger").get("expiries", []) if e["payment_intent_id"] == pi], 30)
    s.start_reconciler()
    got = settled(s, a)
    check(got["status"] != "AUTHORIZED",
          "an expired intent settled as a hold on the stale replay of its create: %s"
          " (events %s)" % (got, events(s, a)))
    check_eq((got["status"], got["reason"]), ("FAILED", "canceled: automatic"),
             "canceled before we knew of the hold")
    check_eq([t for t, _ in events(s, a)], ["authorization.unknown", "authorization.failed"],
             "its events")


def worker_retry_behind_replay(new):
    s = new("adv37a_worker_retry", partitions=1, worker_env={
        "WORKER_UNKNOWN_RETRIES": "1", "WORKER_RETRY_BASE_MS": "4000",
        "WORKER_RETRY_MAX_MS": "4000", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "300", "RECONCILER_POLL_MS": "100"})
    s.start_worker()
    a = new_authorization(amount=2300)
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": a["idempotency_key"],
                                     "probability": 1, "times": 1}]})
    publish(s, a)
    e2e.wait_until("the create executed at psp-sim", lambda: own_rows(s, a), 30, 0.05)
    pi = own_rows(s, a)[0]["payment_intent_id"]
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % pi, {})
    check_eq((st, doc.get("status")), (200, "succeeded"), "the capture behind our back")
    check_eq(attempt(s, a)["status"], "PROCESSING", "captured while our worker backs off")
    got = wait_attempt(s, a, "settled by the worker", lambda g: g["status"] not in (
        "PENDING", "PROCESSING"), 30)
    check_eq(len([c for c in s.psp_get("/ledger").get("captures", [])
                  if c["payment_intent_id"] == pi]), 1, "psp-sim captured our intent")
    check(got["status"] != "AUTHORIZED",
          "a captured intent settled as a hold on the worker's stale replay: %s (events %s)"
          % (got, events(s, a)))
    check_eq((got["status"], got["ppid"]), ("UNKNOWN", pi),
             "the replay proves the intent ours, not its state now")
    s.start_reconciler()
    got = settled(s, a)
    check_eq(got["status"], "REQUIRES_REVIEW", "money taken where it was held: a person")
    check(got["reason"].startswith("requires_review: captured"), "its reason: %r" % got["reason"])
    check_eq([t for t, _ in events(s, a)],
             ["authorization.unknown", "authorization.requires_review"], "its events")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(
        [captured_behind_replay, expired_behind_replay, worker_retry_behind_replay])))
