#!/usr/bin/env python3
"""A capture racing a void of one authorization (issue 37), and the attacks
around an authorization's hold, through the worker against real Kafka,
PostgreSQL and psp-sim, judged from psp-sim's ledger (`captures[]`,
`cancels[]` of kind void, `charges[]`) and our tables.

- capture_first: the capture's call held in flight at psp-sim (its latency,
  one call: the worker's provider timeout outlasts it) while the void is
  claimed: the void is REJECTED `authorization_held` before any call, and
  by the database's clock during the capture's call (the two met);
  psp-sim shows one capture and no void; the capture SUCCEEDED, the
  attempt SUCCEEDED with captured_amount, one event each;
- void_first: the reverse: the void's call in flight, the capture REJECTED
  `capture_after_void`; psp-sim one void, no capture; the attempt VOIDED;
- two_workers: both orders again, the capture and the void produced to two
  partitions (kafka_test_tool's "partition") so that two worker processes
  claim them;
- capture_unknown: a void of an AUTHORIZED attempt whose capture's answer
  was lost (UNKNOWN, the hold kept): REJECTED `authorization_held`, no
  cancel; the reconciler settles the capture SUCCEEDED: psp-sim shows one
  capture and never released the money;
- authorization_unknown: a capture of an authorization whose own answer
  was lost (UNKNOWN, the reconciler not yet run): REJECTED `not_authorized`
  before any call (docs/messages.md); once the reconciler settles the
  authorization AUTHORIZED, psp-sim still shows no capture, the money held;
- over_authorized: a capture of more than the authorization: REJECTED
  `amount_over_authorized`, no capture at psp-sim, the authorization free;
- captured_elsewhere: our intent captured by another client of the
  account, then our capture: refused by psp-sim; the capture
  REQUIRES_REVIEW keeping the hold (money moved that no capture of ours
  took), as the reconciler decides on that answer, never FAILED with the
  hold given back; a void then REJECTED, no cancel at psp-sim;
- foreign_webhook: while our capture is UNKNOWN (its call never executed),
  another client's manual intent naming our attempt in its metadata is
  captured, and another's automatic charge naming it succeeds: their
  payment_intent.succeeded settle nothing of ours (the capture stays
  UNKNOWN, nothing booked); the reconciler then captures ours once under
  its key.

After each race, the loser's kind asked again once the winner settled is
refused by the settled state: a void after the capture `void_after_capture`,
a capture after the void `capture_after_void`; psp-sim unchanged."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_api as api  # noqa: E402
import charged_e2e as e2e  # noqa: E402
from authorization_steps import (  # noqa: E402
    at_psp, attempt, authorized, booked, events, new_capture, new_void, produce, step, wait_step)
import charged_other_client as other  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

LOST = {"WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200"}
# How long psp-sim holds each call in the race: far longer than the other
# step's way from the topic to its REJECTED, which the test checks.
HOLD_MS = 4000
# The worker waits out the held call (one call, not a timeout and a resend).
RACE = {"PROVIDER_TIMEOUT_MS": "8000", "WORKER_UNKNOWN_RETRIES": "0"}


def held_in_flight(s, first):
    """first claimed and its call held at psp-sim: PROCESSING, holding."""
    e2e.wait_until("%s claimed, its call in flight" % first["type"],
                   lambda: step(s, first)["status"] == "PROCESSING"
                   and step(s, first)["holds"] == "t", 30, 0.05)


def ids(cmd):
    """(transitions table, id column, id) of a capture or a void."""
    if "capture_id" in cmd:
        return "capture_transitions", "capture_id", cmd["capture_id"]
    return "void_transitions", "void_id", cmd["void_id"]


def race(s, first, second, code, partitions=(None, None)):
    """first's call held in flight while second is claimed: second REJECTED
    with code during first's one call (by the database's clock: its
    refusal between the call's start and end); returns first's row.
    partitions: where each is produced (two workers: one each)."""
    s.psp_put("/faults", {"latency_ms": HOLD_MS, "rules": []})
    produce(s, [first], partitions[0])
    held_in_flight(s, first)
    produce(s, [second], partitions[1])
    lost = wait_step(s, second)
    check_eq((lost["status"], lost["code"], lost["holds"]), ("REJECTED", code, "f"),
             "the second refused before any call")
    s.psp_put("/faults", {}, method="DELETE")
    won = wait_step(s, first)
    table, col, sid = ids(second)
    _, fcol, fid = ids(first)
    calls = s.query("SELECT operation, (SELECT created_at FROM %s WHERE %s = '%s' AND"
                    " new_status = 'REJECTED') BETWEEN started_at AND started_at +"
                    " latency_ms * interval '1 ms' FROM provider_calls WHERE %s = '%s'"
                    % (table, col, sid, fcol, fid))
    check_eq(calls, [["capture" if fcol == "capture_id" else "void", "t"]],
             "the two met: one call of the first, the second refused during it")
    return won


def again(s, auth, cmd, code, want):
    """cmd, once the race's winner settled: REJECTED code, psp-sim's
    (captures, voids) of the intent still want."""
    produce(s, [cmd])
    got = wait_step(s, cmd)
    check_eq((got["status"], got["code"]), ("REJECTED", code), "asked again once settled")
    check_eq(tuple(len(x) for x in at_psp(s, auth)), want, "psp-sim unchanged")


def capture_first(new):
    s = new("cvrace_capture_first", partitions=1, worker_env=RACE)
    s.start_worker()
    for amount in (1100,):
        a = authorized(s, amount)
        c, v = new_capture(a), new_void(a)
        won = race(s, c, v, "authorization_held")
        check_eq(won["status"], "SUCCEEDED", "the capture")
        caps, voids = at_psp(s, a)
        check_eq((len(caps), len(voids)), (1, 0), "psp-sim: one capture, no void")
        check_eq(caps[0]["amount"], amount, "psp-sim captured all")
        got = attempt(s, a)
        check_eq((got["status"], got["captured"], got["held_by"]),
                 ("SUCCEEDED", str(amount), ""), "the attempt captured, its hold spent")
        check_eq(booked(s, a), [["charge", str(amount)]], "booked once")
        check_eq((events(s, c), events(s, v)), (["capture.succeeded"], ["void.rejected"]),
                 "one event each")
        check_eq(s.query("SELECT count(*) FROM provider_calls WHERE void_id = '%s'"
                         % v["void_id"]), [["0"]], "the void never called")
        again(s, a, new_void(a), "void_after_capture", (1, 0))


def void_first(new):
    s = new("cvrace_void_first", partitions=1, worker_env=RACE)
    s.start_worker()
    for amount in (1300,):
        a = authorized(s, amount)
        c, v = new_capture(a), new_void(a)
        won = race(s, v, c, "capture_after_void")
        check_eq(won["status"], "SUCCEEDED", "the void")
        caps, voids = at_psp(s, a)
        check_eq((len(caps), len(voids)), (0, 1), "psp-sim: one void, no capture")
        check_eq((voids[0].get("kind"), voids[0].get("amount_released")), ("void", amount),
                 "psp-sim released the authorization")
        got = attempt(s, a)
        check_eq((got["status"], got["captured"], got["held_by"]), ("VOIDED", "0", ""),
                 "the attempt voided")
        check_eq(booked(s, a), [], "nothing booked")
        check_eq((events(s, c), events(s, v)), (["capture.rejected"], ["void.succeeded"]),
                 "one event each")
        check_eq(s.query("SELECT count(*) FROM provider_calls WHERE capture_id = '%s'"
                         % c["capture_id"]), [["0"]], "the capture never called")
        again(s, a, new_capture(a), "capture_after_void", (0, 1))


def actors(s, cmd):
    """The workers that wrote cmd's transitions."""
    table, col, key = (("capture_transitions", "capture_id", "capture_id") if "capture_id"
                       in cmd else ("void_transitions", "void_id", "void_id"))
    return set(r[0] for r in s.query("SELECT actor FROM %s WHERE %s = '%s' AND cause ="
                                     " 'worker' AND actor IS NOT NULL" % (table, col, cmd[key])))


def two_workers(new):
    """The capture on one partition, the void on the other: two worker
    processes claim them, each order once."""
    s = new("cvrace_two_workers", partitions=2, worker_env=RACE)
    names = [s.start_worker(), s.start_worker()]
    s.wait_group_settled(names)
    ids = set(s.worker_ids[n] for n in names)
    for capture_first_ in (True, False):
        a = authorized(s, 1700 if capture_first_ else 1800)
        c, v = new_capture(a), new_void(a)
        if capture_first_:
            race(s, c, v, "authorization_held", (0, 1))
        else:
            race(s, v, c, "capture_after_void", (1, 0))
        got = (actors(s, c), actors(s, v))
        check(got[0] | got[1] <= ids and len(got[0] | got[1]) == 2 and not got[0] & got[1],
              "two workers, one each: %s" % (got,))
        caps, voids = at_psp(s, a)
        check_eq((len(caps), len(voids)), (1, 0) if capture_first_ else (0, 1),
                 "psp-sim: exactly one of a capture and a void")
        check_eq(attempt(s, a)["status"], "SUCCEEDED" if capture_first_ else "VOIDED",
                 "the attempt")
        check_eq((events(s, c), events(s, v)),
                 (["capture.succeeded"], ["void.rejected"]) if capture_first_
                 else (["capture.rejected"], ["void.succeeded"]), "one event each")


def capture_unknown(new):
    s = new("cvrace_capture_unknown", partitions=1, worker_env=LOST)
    s.start_worker()
    a = authorized(s, 2100)
    c = new_capture(a)
    s.psp_put("/faults", {"rules": [{"kind": "stall_after", "key": c["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [c])
    got = wait_step(s, c)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq((got["status"], got["holds"]), ("UNKNOWN", "t"), "a lost answer, the hold kept")
    check_eq((attempt(s, a)["status"], attempt(s, a)["held_by"]), ("AUTHORIZED", "capture"),
             "held by the capture in doubt")
    v = new_void(a)
    produce(s, [v])
    lost = wait_step(s, v)
    check_eq((lost["status"], lost["code"]), ("REJECTED", "authorization_held"),
             "a void while the capture is in doubt")
    check_eq(at_psp(s, a)[1], [], "no cancel at psp-sim")
    s.start_reconciler()
    got = wait_step(s, c, "SUCCEEDED", "FAILED", "REQUIRES_REVIEW")
    check_eq(got["status"], "SUCCEEDED", "settled on psp-sim's evidence")
    caps, voids = at_psp(s, a)
    check_eq((len(caps), len(voids)), (1, 0), "psp-sim: one capture, the money never released")
    check_eq((attempt(s, a)["status"], attempt(s, a)["captured"]), ("SUCCEEDED", "2100"),
             "captured")
    check_eq(booked(s, a), [["charge", "2100"]], "booked once")
    check_eq(events(s, v), ["void.rejected"], "the void's one event")


def authorization_unknown(new):
    s = new("cvrace_auth_unknown", partitions=1, worker_env=LOST)
    s.start_worker()
    a = e2e.new_command(amount=2200)
    a["type"] = "authorization.requested"
    s.psp_put("/faults", {"rules": [{"kind": "stall_after", "key": a["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [a])
    e2e.wait_until("the authorization in doubt", lambda: attempt(s, a)["status"] == "UNKNOWN",
                   60)
    s.psp_put("/faults", {}, method="DELETE")
    c = new_capture(a)
    produce(s, [c])
    got = wait_step(s, c)
    check_eq((got["status"], got["code"]), ("REJECTED", "not_authorized"),
             "a capture of an authorization in doubt")
    check_eq(events(s, c), ["capture.rejected"], "its event")
    s.start_reconciler()
    e2e.wait_until("the authorization settled", lambda: attempt(s, a)["status"] != "UNKNOWN",
                   60)
    got = attempt(s, a)
    check_eq((got["status"], got["held_by"]), ("AUTHORIZED", ""), "held at psp-sim, free")
    caps, voids = at_psp(s, a)
    check_eq((caps, voids), ([], []), "psp-sim captured nothing")
    row = [r for r in s.psp_get("/ledger")["charges"] if r.get("idempotency_key")
           == a["idempotency_key"]]
    check_eq([(r.get("outcome"), r.get("amount_capturable")) for r in row],
             [("requires_capture", 2200)], "psp-sim holds the money, once")
    check_eq(booked(s, a), [], "nothing booked")


def over_authorized(new):
    s = new("cvrace_over", partitions=1)
    s.start_worker()
    a = authorized(s, 1500)
    c = new_capture(a, 1501)
    produce(s, [c])
    got = wait_step(s, c)
    check_eq((got["status"], got["code"], got["holds"]),
             ("REJECTED", "amount_over_authorized", "f"), "a capture of more than held")
    check_eq(at_psp(s, a), ([], []), "psp-sim captured nothing")
    check_eq((attempt(s, a)["status"], attempt(s, a)["held_by"]), ("AUTHORIZED", ""),
             "the authorization free")
    check_eq(s.query("SELECT count(*) FROM provider_calls WHERE capture_id = '%s'"
                     % c["capture_id"]), [["0"]], "never called")
    ok = new_capture(a, 1500)
    produce(s, [ok])
    check_eq(wait_step(s, ok)["status"], "SUCCEEDED", "a capture within it then")
    check_eq([r["amount"] for r in at_psp(s, a)[0]], [1500], "psp-sim's one capture")


def captured_elsewhere(new):
    """Our intent captured behind our back (another client of the account),
    then our capture: psp-sim refuses it (the intent is succeeded; our own
    call would have been replayed under its key). Money moved that no
    capture of ours took: the capture REQUIRES_REVIEW, keeping the hold, as
    the reconciler's look decides on the same answer; never FAILED with
    the hold given back and the authorization left AUTHORIZED and free, as
    if nothing had moved (a capture.failed the order service would read as
    "not charged"). A void of it is then refused before any call."""
    s = new("cvrace_captured_elsewhere", partitions=1)
    s.start_worker()
    a = authorized(s, 2700)
    ppid = attempt(s, a)["ppid"]
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % ppid, {})
    check_eq((st, doc.get("status")), (200, "succeeded"), "captured behind our back")
    c = new_capture(a)
    produce(s, [c])
    got = wait_step(s, c)
    check_eq((got["status"], got["code"], got["holds"]), ("REQUIRES_REVIEW", "requires_review",
                                                         "t"), "a person looks, the hold kept")
    check(s.query("SELECT reason FROM capture_attempts WHERE id = '%s'" % c["capture_id"])
          [0][0].startswith("requires_review: captured, not under this key: "),
          "the reconciler's reason for the same answer")
    caps = at_psp(s, a)[0]
    check_eq([r.get("idempotency_key") == c["idempotency_key"] for r in caps], [False],
             "psp-sim's one capture is the other's")
    got = attempt(s, a)
    check_eq((got["status"], got["held_by_id"]), ("AUTHORIZED", c["capture_id"]),
             "held by the capture under review")
    check_eq(events(s, c), ["capture.requires_review"], "the capture's one event")
    check_eq(booked(s, a), [], "nothing booked as ours")
    v = new_void(a)
    produce(s, [v])
    got = wait_step(s, v)
    check_eq((got["status"], got["code"]), ("REJECTED", "authorization_held"), "a void of it")
    check_eq(at_psp(s, a)[1], [], "psp-sim released nothing")


def foreign_webhook(new):
    port = e2e.free_port()
    s = new("cvrace_foreign_wh", partitions=1, psp_args=api.psp_webhook_args(port),
            worker_env=dict(LOST, RECONCILER_FIRST_LOOK_MS="600000"))
    api.start_api(s, port=port)
    s.start_worker()
    a = authorized(s, 2600)
    c = new_capture(a)
    # Never executed (a 5xx before psp-sim runs it): UNKNOWN, held.
    s.psp_put("/faults", {"rules": [{"kind": "error_before", "key": c["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [c])
    check_eq(wait_step(s, c)["status"], "UNKNOWN", "our capture in doubt")
    s.psp_put("/faults", {}, method="DELETE")
    # Another client's authorization naming our attempt, captured.
    st, doc = other.post(s, "/v1/payment_intents", {
        "amount": 2600, "currency": a["currency"].lower(), "payment_method": "pm_card_visa",
        "confirm": "true", "capture_method": "manual",
        "metadata[payment_attempt_id]": a["payment_attempt_id"],
        "metadata[order_id]": a["order_id"]})
    check_eq((st, doc.get("status")), (200, "requires_capture"), "the foreign hold")
    st, cap = other.post(s, "/v1/payment_intents/%s/capture" % doc["id"], {})
    check_eq((st, cap.get("status")), (200, "succeeded"), "the foreign capture")
    # And an automatic charge of its own naming our attempt too.
    other.charge_naming(s, a, "pm_card_visa")
    e2e.wait_until("both payment_intent.succeeded delivered", lambda: s.query(
        "SELECT count(*) FROM processed_webhook_events WHERE event_type ="
        " 'payment_intent.succeeded'") == [["2"]] and s.psp_get("/webhooks")["pending"] == 0,
        30)
    check_eq(s.query("SELECT count(*) FROM processed_webhook_events WHERE event_type ="
                     " 'payment_intent.succeeded' AND outcome = 'applied'"), [["0"]],
             "neither applied")
    got = step(s, c)
    check_eq((got["status"], got["holds"]), ("UNKNOWN", "t"), "our capture still in doubt")
    check_eq((attempt(s, a)["status"], attempt(s, a)["captured"]), ("AUTHORIZED", "0"),
             "our authorization not captured by another's intent")
    check_eq(booked(s, a), [], "nothing booked")
    check_eq(events(s, c), ["capture.unknown"], "no capture.succeeded")
    check_eq(at_psp(s, a), ([], []), "psp-sim: nothing of our intent captured yet")
    # The reconciler's look: our capture under its own key, once.
    s.start_reconciler(RECONCILER_FIRST_LOOK_MS="0")
    s.query("UPDATE capture_attempts SET next_check_at = now() WHERE id = '%s'"
            % c["capture_id"])
    check_eq(wait_step(s, c, "SUCCEEDED", "FAILED", "REQUIRES_REVIEW")["status"], "SUCCEEDED",
             "settled by our own key")
    check_eq([r["amount"] for r in at_psp(s, a)[0]], [2600], "psp-sim: one capture of ours")
    check_eq(booked(s, a), [["charge", "2600"]], "booked once, ours")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(
        [capture_first, void_first, two_workers, capture_unknown, authorization_unknown, over_authorized,
         captured_elsewhere, foreign_webhook])))
