#!/usr/bin/env python3
"""Adversary 37a: another client's capture of OUR intent settles our capture.

While our capture of an authorization is UNKNOWN (its call failed before
psp-sim ran it: error_before, nothing executed), another client of the
provider account captures our intent under its own key. psp-sim's
payment_intent.succeeded of our intent reaches the api, whose capture half
(capture_webhook.c) books it as our capture's success: our intent is
recorded as the authorization's, and capture_store_book takes any amount
for a capture that asked for "all" (c.amount IS NULL).

docs/messages.md ("Capture command"): "A capture the provider took that
cannot be booked as this capture's (another amount than asked, captured
under another key) is REQUIRES_REVIEW", and the reconciler's look on the
same facts (our capture again under its key: psp-sim refuses it, the
intent captured already) does say REQUIRES_REVIEW ("captured, not under
this key"): the webhook settles it otherwise.

- one_cent: our capture asks for all of 2500; the other client captures 1
  cent (psp-sim releases the other 2499). Our capture becomes SUCCEEDED with
  1, capture.succeeded, booked 1: a capture we never executed, of another
  amount than asked, settled as ours; the order service is told its
  shipment's capture succeeded while 99.96% of the hold was released;
- same_amount: our capture asks for 600 of 2500; the other client captures
  600 under its own key. ACCEPTED as our capture (the fix's decision,
  docs/messages.md): the intent is ours by its recorded id, and money moved
  once, for what we asked: SUCCEEDED, booked once, psp-sim's one capture
  (the other's key), and our capture never sent again.

- look_one_cent: no webhook; the same 1-cent capture behind our back, and
  the reconciler's capture again under our key answered 500 (error_before,
  nothing executed): the look falls back to retrieving the intent
  (capture_look.c from_lookup -> from_intent), whose check "another amount
  than asked" is skipped for a capture of all (a->amount 0), and books 1
  cent as our capture's SUCCEEDED.

Judged from psp-sim's ledger (captures[]: the one capture, its key) and our
tables."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_api as api  # noqa: E402
import charged_e2e as e2e  # noqa: E402
from authorization_steps import (  # noqa: E402
    at_psp, attempt, authorized, booked, events, new_capture, produce, wait_step)
import charged_other_client as other  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

# The look far away: the webhook alone decides.
ENV = {"WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
       "RECONCILER_FIRST_LOOK_MS": "600000"}


def foreign_capture_of_ours(new, name, asked, taken, accepted=False):
    port = e2e.free_port()
    s = new(name, partitions=1, psp_args=api.psp_webhook_args(port), worker_env=ENV)
    api.start_api(s, port=port)
    s.start_worker()
    a = authorized(s, 2500)
    ppid = attempt(s, a)["ppid"]
    c = new_capture(a, asked)
    # Never executed (a 5xx before psp-sim runs it): UNKNOWN, held.
    s.psp_put("/faults", {"rules": [{"kind": "error_before", "key": c["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [c])
    check_eq(wait_step(s, c)["status"], "UNKNOWN", "our capture in doubt")
    s.psp_put("/faults", {}, method="DELETE")
    check_eq(at_psp(s, a), ([], []), "psp-sim executed nothing of ours")
    # Another client captures our own intent, under its own key.
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % ppid,
                         {"amount_to_capture": taken})
    check_eq((st, doc.get("status"), doc.get("amount_received")), (200, "succeeded", taken),
             "the capture behind our back")
    e2e.wait_until("payment_intent.succeeded of our intent delivered", lambda: s.query(
        "SELECT count(*) FROM processed_webhook_events WHERE event_type ="
        " 'payment_intent.succeeded'") == [["1"]] and s.psp_get("/webhooks")["pending"] == 0,
        30)
    caps = at_psp(s, a)[0]
    check_eq([(r.get("idempotency_key") == c["idempotency_key"], r["amount"]) for r in caps],
             [(False, taken)], "psp-sim's one capture: the other client's, not under our key")
    if accepted:
        got = wait_step(s, c, "SUCCEEDED")
        check_eq(booked(s, a), [["charge", str(taken)]], "booked once, what we asked")
        check_eq(events(s, c), ["capture.succeeded", "capture.unknown"], "its events")
        check_eq(attempt(s, a)["captured"], str(taken), "the authorization captured it")
        check_eq(len(at_psp(s, a)[0]), 1, "psp-sim still one capture")
        return
    got = wait_step(s, c, "REQUIRES_REVIEW", "SUCCEEDED")
    check(got["status"] != "SUCCEEDED",
          "our capture (never executed, asked %s) settled SUCCEEDED by another client's"
          " capture of %d: %s; booked %s; events %s; webhook %s"
          % ("all" if asked is None else asked, taken, got, booked(s, a), events(s, c),
             s.query("SELECT outcome, coalesce(reason, '') FROM processed_webhook_events"
                     " WHERE event_type = 'payment_intent.succeeded'")))
    check_eq((got["status"], got["holds"]), ("REQUIRES_REVIEW", "t"),
             "captured, not under this key: a person, the hold kept")
    check_eq(booked(s, a), [], "nothing booked as ours")


def one_cent(new):
    foreign_capture_of_ours(new, "adv37a_one_cent", None, 1)


def same_amount(new):
    foreign_capture_of_ours(new, "adv37a_same_amount", 600, 600, accepted=True)


def look_one_cent(new):
    s = new("adv37a_look_one_cent", partitions=1, worker_env=dict(
        ENV, RECONCILER_FIRST_LOOK_MS="300", RECONCILER_POLL_MS="100",
        RECONCILER_SCHEDULE_MS="300"))
    s.start_worker()
    a = authorized(s, 2500)
    ppid = attempt(s, a)["ppid"]
    c = new_capture(a)
    # Every call under our capture's key: a 500 before psp-sim runs it.
    s.psp_put("/faults", {"rules": [{"kind": "error_before", "key": c["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [c])
    check_eq(wait_step(s, c)["status"], "UNKNOWN", "our capture in doubt")
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % ppid, {"amount_to_capture": 1})
    check_eq((st, doc.get("status")), (200, "succeeded"), "the capture behind our back")
    s.start_reconciler()
    got = wait_step(s, c, "SUCCEEDED", "FAILED", "REQUIRES_REVIEW")
    caps = at_psp(s, a)[0]
    check_eq([(r.get("idempotency_key") == c["idempotency_key"], r["amount"]) for r in caps],
             [(False, 1)], "psp-sim's one capture: the other client's 1 cent")
    check(got["status"] != "SUCCEEDED",
          "our capture of all (never executed) settled SUCCEEDED by the look on another"
          " client's 1-cent capture: %s; booked %s" % (got, booked(s, a)))
    check_eq(booked(s, a), [], "nothing booked as ours")
    check_eq((got["status"], got["holds"]), ("REQUIRES_REVIEW", "t"), "a person, the hold kept")
    # The auditor pages on it: money captured at the provider that no
    # capture of ours booked.
    rc, out, err = s.audit("run", "--since", "600s", "--json")
    check(rc != 0, "the audit finds it: rc %d %s" % (rc, err[-300:]))
    check_eq(s.query("SELECT DISTINCT kind FROM audit_findings WHERE object_id = '%s'" % ppid),
             [["capture_unbooked"]], "capture_unbooked of our intent")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([one_cent, same_amount, look_one_cent])))
