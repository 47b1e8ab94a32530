#!/usr/bin/env python3
"""Voids (issue 37) through the worker and the reconciler, against real
Kafka, PostgreSQL and psp-sim, judged from psp-sim's ledger (cancels[] of
kind void, charges[]) as much as from our tables:

- voided: authorize, then void: psp-sim shows one void of the intent with
  the void's reason and captured nothing; the attempt is VOIDED (the void's
  reason), the void SUCCEEDED with released_amount, one void.succeeded,
  nothing booked. The void delivered again is the same void: no second
  cancel at psp-sim, no second event;
- lost: psp-sim cancels and keeps the answer past the worker's timeout
  (stall_after): UNKNOWN (never FAILED), the hold kept; the reconciler's
  look (the cancel again under the void's key) settles it SUCCEEDED, the
  attempt VOIDED; psp-sim shows exactly one void. (A dropped answer,
  drop_after, is sent again by the HTTP client itself on its pooled
  connection, under the same key: psp-sim's replay answers the worker, and
  the void is SUCCEEDED at once, one void at psp-sim: checked too.)
- race: two voids of one authorization at once (two void_ids, two keys):
  exactly one wins the hold and cancels; the other is REJECTED
  (authorization_held, or authorization_voided once the first is done)
  before any call; psp-sim shows one void;
- past_window: two voids left UNKNOWN, looked at past their keys'
  retention (the reconciler may no longer send under them): the intent by
  our recorded id decides. One whose cancel never executed (error_before:
  a 5xx before executing) finds its intent requires_capture: FAILED
  never_executed, the hold given back, nothing sent again, and a new void
  of that authorization then succeeds; one whose cancel executed
  (stall_after) finds it canceled: SUCCEEDED, the attempt VOIDED; psp-sim
  shows one void each, and none for the first until the new void;
- after_capture: (a) the attempt already SUCCEEDED with a captured amount
  (planted: the capture operation is another folder's): the void REJECTED
  void_after_capture, no cancel at psp-sim; (b) psp-sim captured behind our
  back: the void FAILED void_after_capture, its hold given back, the
  attempt REQUIRES_REVIEW; psp-sim never released the captured money;
- charge: a void of a charge (an automatic attempt) is REJECTED
  not_authorized, no cancel at psp-sim;
- bad_input: a void with an unknown reason is a dead letter
  (schema_violation); a void reusing an authorization's key is one too
  (idempotency_key_conflict); neither reaches psp-sim; the sample void of
  docs/messages.md is valid by docs/schemas/void-command.schema.json."""
import json
import os
import re
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
import charged_other_client as other  # noqa: E402
import json_schema_check as jsc  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

COMMAND = jsc.load("void-command.schema.json")
EVENT = jsc.load("void-result-event.schema.json")


def produce(s, cmds):
    for c in cmds:
        if c.get("type") == "void.requested" and c.get("reason") in (
                "requested_by_customer", "duplicate", "fraudulent", "abandoned"):
            check(not jsc.errors(COMMAND, c), "a valid void by the schema: %s" % c)
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def authorized(s, amount, **extra):
    """An authorization.requested, produced and settled AUTHORIZED."""
    cmd = e2e.new_command(amount=amount, **extra)
    cmd["type"] = "authorization.requested"
    produce(s, [cmd])
    e2e.wait_until("the authorization held", lambda: attempt(s, cmd)["status"]
                   not in ("", "PENDING", "PROCESSING"), 60)
    check_eq(attempt(s, cmd)["status"], "AUTHORIZED", "the authorization")
    return cmd


def new_void(auth, reason="requested_by_customer", **extra):
    cmd = {"type": "void.requested", "version": 1, "void_id": str(uuid.uuid4()),
           "payment_attempt_id": auth["payment_attempt_id"],
           "idempotency_key": "void-" + uuid.uuid4().hex, "reason": reason}
    cmd.update(extra)
    return cmd


def attempt(s, cmd):
    rows = s.query("SELECT status, coalesce(reason, ''), coalesce(provider_payment_id, ''),"
                   " coalesce(held_by, '') FROM payment_attempts WHERE id = '%s'"
                   % cmd["payment_attempt_id"])
    if not rows:
        return {"status": "", "reason": "", "ppid": "", "held_by": ""}
    return dict(zip(("status", "reason", "ppid", "held_by"), rows[0]))


def void(s, v):
    rows = s.query("SELECT status, coalesce(reason, ''), holds,"
                   " coalesce(released_amount, 0), lease_owner IS NULL"
                   " FROM void_attempts WHERE id = '%s'" % v["void_id"])
    if not rows:
        return {"status": "", "reason": "", "holds": "", "released": 0, "free": "t"}
    return dict(zip(("status", "reason", "holds", "released", "free"), rows[0]))


def settled(s, v):
    got = void(s, v)
    return got["status"] not in ("", "PENDING") and not (
        got["status"] == "PROCESSING" and got["free"] == "f")


def void_events(s, v):
    """The void's events, each valid by docs/schemas/void-result-event."""
    rows = s.query("SELECT event_type, payload FROM outbox WHERE payload->>'void_id' = '%s'"
                   % v["void_id"])
    for r in rows:
        errs = jsc.errors(EVENT, json.loads(r[1]))
        check(not errs, "the event by its schema: %s %s" % (errs, r[1]))
    return sorted(r[0] for r in rows)


def cancels(s, auth):
    """psp-sim's executed cancels of the authorization's intent."""
    ppid = attempt(s, auth)["ppid"]
    return [c for c in s.psp_get("/ledger")["cancels"] if c.get("payment_intent_id") == ppid]


def charge_row(s, auth):
    rows = [c for c in s.psp_get("/ledger")["charges"]
            if c.get("idempotency_key") == auth["idempotency_key"]]
    check_eq(len(rows), 1, "one intent at psp-sim for the authorization")
    return rows[0]


def voided(new):
    s = new("void_voided", partitions=1)
    w = s.start_worker()
    a = authorized(s, 2500)
    v = new_void(a, reason="abandoned")
    produce(s, [v, v])
    e2e.wait_until("the void settled", lambda: settled(s, v), 60)
    got = void(s, v)
    check_eq((got["status"], got["holds"], got["released"]), ("SUCCEEDED", "t", "2500"),
             "the void")
    check_eq((attempt(s, a)["status"], attempt(s, a)["reason"]), ("VOIDED", "abandoned"),
             "the authorization released for the void's reason")
    rows = cancels(s, a)
    check_eq(len(rows), 1, "one cancel at psp-sim")
    check_eq((rows[0].get("kind"), rows[0].get("cancellation_reason"),
              rows[0].get("amount_released"), rows[0].get("idempotency_key")),
             ("void", "abandoned", 2500, v["idempotency_key"]), "psp-sim's void")
    row = charge_row(s, a)
    check_eq(row.get("outcome"), "canceled", "psp-sim's intent canceled")
    check(not row.get("amount_received"), "nothing captured: %s" % row)
    check_eq(s.psp_get("/ledger").get("captures", []), [], "no capture at psp-sim")
    check_eq(void_events(s, v), ["void.succeeded"], "one void.succeeded")
    payload = json.loads(s.query("SELECT payload FROM outbox WHERE payload->>'void_id' = '%s'"
                                 % v["void_id"])[0][0])
    for k in ("event_id", "void_id", "payment_attempt_id", "order_id", "amount", "currency",
              "provider_payment_id", "occurred_at"):
        check(k in payload, "the event carries %s: %s" % (k, payload))
    check("reason" not in payload, "a success has no reason: %s" % payload)
    check_eq(s.query("SELECT count(*) FROM ledger_entries"), [["0"]], "nothing booked")
    m = s.admin_metrics(w)
    check_eq(m.get('charged_voids_processed_total{status="SUCCEEDED"}'), 1.0,
             "the worker counts the void as a void")
    # Delivered again once settled: the same void, nothing sent.
    produce(s, [v])
    e2e.wait_until("the redelivery consumed", lambda: s.lag()["lag"] == 0, 60)
    check_eq(len(cancels(s, a)), 1, "still one cancel at psp-sim")
    check_eq(void_events(s, v), ["void.succeeded"], "no second event")
    # Another void of the released authorization: refused before any call.
    again = new_void(a)
    produce(s, [again])
    e2e.wait_until("the second void settled", lambda: settled(s, again), 60)
    check_eq(void(s, again)["status"], "REJECTED", "a void of a voided authorization")
    check(void(s, again)["reason"].startswith("authorization_voided"),
          "its reason: %r" % void(s, again)["reason"])
    check_eq(len(cancels(s, a)), 1, "still one cancel at psp-sim")


def lost(new):
    s = new("void_lost", partitions=1, worker_env={
        "WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "500", "RECONCILER_POLL_MS": "200"})
    s.start_worker()
    # Dropped: the client's own resend is answered by the replay.
    d = authorized(s, 999)
    vd = new_void(d)
    s.psp_put("/faults", {"rules": [{"kind": "drop_after", "key": vd["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [vd])
    e2e.wait_until("the dropped answer settled", lambda: settled(s, vd), 60)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq((void(s, vd)["status"], attempt(s, d)["status"]), ("SUCCEEDED", "VOIDED"),
             "a dropped answer, replayed")
    check_eq(len(cancels(s, d)), 1, "one void at psp-sim")

    a = authorized(s, 1234)
    v = new_void(a)
    s.psp_put("/faults", {"rules": [{"kind": "stall_after", "key": v["idempotency_key"],
                                     "probability": 1}]})
    produce(s, [v])
    e2e.wait_until("the lost answer settled", lambda: settled(s, v), 60)
    s.psp_put("/faults", {}, method="DELETE")
    got = void(s, v)
    check_eq((got["status"], got["holds"]), ("UNKNOWN", "t"), "a lost answer, the hold kept")
    check(got["reason"].startswith("outcome_unknown"), "its reason: %r" % got["reason"])
    check_eq((attempt(s, a)["status"], attempt(s, a)["held_by"]), ("AUTHORIZED", "void"),
             "the authorization still held by the void")
    check_eq(len(cancels(s, a)), 1, "psp-sim executed the cancel once")
    s.start_reconciler()
    e2e.wait_until("the look settled it", lambda: void(s, v)["status"] != "UNKNOWN", 60)
    check_eq(void(s, v)["status"], "SUCCEEDED", "settled on the cancel's replay")
    check_eq(attempt(s, a)["status"], "VOIDED", "the authorization released")
    check_eq(len(cancels(s, a)), 1, "exactly one void at psp-sim")
    check_eq(void_events(s, v), ["void.succeeded", "void.unknown"], "its events")


def race(new):
    s = new("void_race", partitions=1)
    s.start_worker()
    for amount in (610, 620, 630):
        a = authorized(s, amount)
        vs = [new_void(a), new_void(a, reason="duplicate")]
        produce(s, vs)
        e2e.wait_until("both settled", lambda: all(settled(s, v) for v in vs), 60)
        got = sorted((void(s, v)["status"], void(s, v)["reason"].split(":")[0]) for v in vs)
        check(got[0][0] == "REJECTED" and got[1] == ("SUCCEEDED", ""),
              "one winner, one refused: %s" % got)
        check(got[0][1] in ("authorization_held", "authorization_voided"),
              "the loser's reason: %s" % got)
        check_eq(attempt(s, a)["status"], "VOIDED", "the authorization released once")
        check_eq(len(cancels(s, a)), 1, "one void at psp-sim")


def past_window(new):
    s = new("void_past_window", partitions=1, worker_env={
        "WORKER_UNKNOWN_RETRIES": "0", "PROVIDER_TIMEOUT_MS": "2000",
        "RECONCILER_FIRST_LOOK_MS": "500"})
    s.start_worker()
    a, b = authorized(s, 700), authorized(s, 800)
    va, vb = new_void(a), new_void(b)
    s.psp_put("/faults", {"rules": [
        {"kind": "error_before", "key": va["idempotency_key"], "probability": 1},
        {"kind": "stall_after", "key": vb["idempotency_key"], "probability": 1}]})
    produce(s, [va, vb])
    e2e.wait_until("both in doubt", lambda: settled(s, va) and settled(s, vb), 60)
    s.psp_put("/faults", {}, method="DELETE")
    check_eq((void(s, va)["status"], void(s, vb)["status"]), ("UNKNOWN", "UNKNOWN"),
             "both answers lost, never FAILED")
    check_eq((len(cancels(s, a)), len(cancels(s, b))), (0, 1), "what psp-sim executed")
    retention = 3000
    e2e.wait_until("the keys' retention to pass", lambda: float(s.query(
        "SELECT min(extract(epoch FROM now() - first_sent_at) * 1000) FROM void_attempts")
        [0][0]) >= retention + 300, 30, 0.1)
    s.start_reconciler(WORKER_KEY_RETENTION_MS=retention, PROVIDER_TIMEOUT_MS=2000,
                       RECONCILER_POLL_MS=200)
    e2e.wait_until("both looked at", lambda: void(s, va)["status"] != "UNKNOWN"
                   and void(s, vb)["status"] != "UNKNOWN", 60)
    got = void(s, va)
    check_eq((got["status"], got["holds"]), ("FAILED", "f"), "never executed, hold back")
    check(got["reason"].startswith("never_executed"), "its reason: %r" % got["reason"])
    check_eq((attempt(s, a)["status"], attempt(s, a)["held_by"]), ("AUTHORIZED", ""),
             "the authorization free again")
    check_eq(s.query("SELECT operation, count(*) FROM provider_calls WHERE void_id = '%s'"
                     " GROUP BY operation ORDER BY 1" % va["void_id"]),
             [["retrieve", "1"], ["void", "1"]], "looked up, never sent again")
    check_eq((void(s, vb)["status"], attempt(s, b)["status"]), ("SUCCEEDED", "VOIDED"),
             "executed: settled on our recorded intent")
    check_eq((len(cancels(s, a)), len(cancels(s, b))), (0, 1), "one void at psp-sim")
    vc = new_void(a)
    produce(s, [vc])
    e2e.wait_until("the new void settled", lambda: settled(s, vc), 60)
    check_eq((void(s, vc)["status"], attempt(s, a)["status"]), ("SUCCEEDED", "VOIDED"),
             "a new void of the freed authorization")
    check_eq(len(cancels(s, a)), 1, "one void at psp-sim")


def after_capture(new):
    s = new("void_after_capture", partitions=1)
    s.start_worker()
    # (a) Captured in our books (planted as a capture would leave it).
    a = authorized(s, 3000)
    s.query("UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = 3000"
            " WHERE id = '%s'" % a["payment_attempt_id"])
    va = new_void(a)
    produce(s, [va])
    e2e.wait_until("the void settled", lambda: settled(s, va), 60)
    got = void(s, va)
    check_eq(got["status"], "REJECTED", "a void after our capture")
    check(got["reason"].startswith("void_after_capture"), "its reason: %r" % got["reason"])
    check_eq(void_events(s, va), ["void.rejected"], "one void.rejected")
    check_eq(cancels(s, a), [], "no cancel at psp-sim")

    # (b) Captured at psp-sim behind our back.
    b = authorized(s, 4000)
    ppid = attempt(s, b)["ppid"]
    st, doc = other.post(s, "/v1/payment_intents/%s/capture" % ppid, {})
    check_eq((st, doc.get("status")), (200, "succeeded"), "captured behind our back")
    vb = new_void(b)
    produce(s, [vb])
    e2e.wait_until("the void settled", lambda: settled(s, vb), 60)
    got = void(s, vb)
    check_eq((got["status"], got["holds"]), ("FAILED", "f"), "the void failed, its hold back")
    check(got["reason"].startswith("void_after_capture"), "its reason: %r" % got["reason"])
    att = attempt(s, b)
    check_eq(att["status"], "REQUIRES_REVIEW", "the authorization goes to a person")
    check(att["reason"].startswith("void_after_capture"), "why: %r" % att["reason"])
    check_eq(void_events(s, vb), ["void.failed"], "one void.failed")
    check(["authorization.requires_review"] == [r[0] for r in s.query(
        "SELECT event_type FROM outbox WHERE payment_attempt_id = '%s' AND"
        " event_type LIKE 'authorization.requires%%'" % b["payment_attempt_id"])],
        "the authorization's review published")
    check_eq(cancels(s, b), [], "psp-sim canceled nothing")
    row = charge_row(s, b)
    check_eq((row.get("outcome"), row.get("amount")), ("succeeded", 4000),
             "psp-sim kept the captured money")


def charge(new):
    s = new("void_charge", partitions=1)
    s.start_worker()
    c = e2e.new_command(amount=800)
    produce(s, [c])
    s.wait_settled(1, 60)
    check_eq(attempt(s, c)["status"], "SUCCEEDED", "the charge")
    v = new_void(c)
    produce(s, [v])
    e2e.wait_until("the void settled", lambda: settled(s, v), 60)
    got = void(s, v)
    check_eq(got["status"], "REJECTED", "a void of a charge")
    check(got["reason"].startswith("not_authorized"), "its reason: %r" % got["reason"])
    check_eq(s.psp_get("/ledger")["cancels"], [], "no cancel at psp-sim")


def bad_input(new):
    docs = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")
    with open(os.path.join(docs, "messages.md"), encoding="utf-8") as f:
        blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", f.read(), re.S)]
    samples = [b for b in blocks if b.get("type") == "void.requested"]
    check(samples, "messages.md has a sample void")
    for b in samples:
        check_eq(jsc.errors(COMMAND, b), [], "schema errors of the sample void")
    s = new("void_bad_input", partitions=1)
    s.start_worker()
    a = authorized(s, 500)
    produce(s, [new_void(a, reason="changed_mind"),
                new_void(a, idempotency_key=a["idempotency_key"])])

    def reasons():
        out = {}
        for d in s.dead_letters():
            h = dict((x[0], x[1]) for x in d["headers"])
            out[h["dlq.reason"]] = out.get(h["dlq.reason"], 0) + 1
        return out
    e2e.wait_until("both dead-lettered", lambda: reasons() == {
        "schema_violation": 1, "idempotency_key_conflict": 1}, 60)
    check_eq(cancels(s, a), [], "no cancel at psp-sim")
    check_eq(attempt(s, a)["status"], "AUTHORIZED", "the authorization untouched")


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios([voided, race, lost, past_window, after_capture,
                                                  charge, bad_input])))
