#!/usr/bin/env python3
"""The review queue resolves captures, voids and authorizations (issue 37):
`chargectl capture|void|authorization resolve` on what was left in
REQUIRES_REVIEW, against real PostgreSQL and psp-sim, judged from psp-sim's
own books (its /ledger) beside ours.

Our side is planted as the operations write it (test_auditor_steps: an
authorization held at psp-sim, our step holding it, REQUIRES_REVIEW);
psp-sim is driven directly over HTTP (capture, cancel) as the money's
truth. Each refusal is checked to write nothing, each resolution to move
the step and its authorization in one transaction with the events, the
ledger row of a capture, the hold given back or spent, the actor.

- capture: SUCCEEDED refused while psp-sim holds the money uncaptured;
  FAILED refused once psp-sim captured it; SUCCEEDED then books it (the
  authorization SUCCEEDED, captured_amount, the ledger's charge row,
  capture.succeeded); a second resolution is refused (not in review);
  a leased capture is refused; an unknown id is refused.
- capture_failed: FAILED while psp-sim still holds it (two operators at
  once: one is written, the other refused): the capture FAILED,
  capture.failed, the authorization AUTHORIZED again with no hold, nothing
  booked, nothing captured at psp-sim.
- capture_of_a_reviewed_authorization: psp-sim captured for our capture
  while its authorization went to review: the capture's SUCCEEDED is
  refused until the authorization's review books it; then it resolves,
  booked once.
- void: SUCCEEDED refused while psp-sim holds it; canceled at psp-sim,
  FAILED refused; SUCCEEDED then: the authorization VOIDED, the void
  SUCCEEDED with the amount released, void.succeeded, no ledger row.
- void_failed: refused while a call under its key may still execute;
  then FAILED while held: the hold given back, void.failed.
- void_after_capture: captured at psp-sim behind our back: SUCCEEDED
  refused; FAILED moves the void FAILED void_after_capture and its
  authorization to REQUIRES_REVIEW (authorization.requires_review); the
  authorization's own review then books what psp-sim captured.
- authorization_captured: an authorization in review that psp-sim
  captured (700 of 1000) by no capture of ours: AUTHORIZED and FAILED
  refused, the charge's review refuses it; SUCCEEDED books 700.
- authorization_held: still held at psp-sim: SUCCEEDED and VOIDED refused;
  AUTHORIZED holds it again (authorization.succeeded); a charge is no
  authorization.
- authorization_voided: canceled at psp-sim: VOIDED (authorization.failed).

Scenarios can be run alone: test_step_review.py capture"""
import concurrent.futures
import json
import os
import sys
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402
import test_auditor_steps as steps  # noqa: E402

ACTOR = "olga"


def resolve(s, kind, step, status, reason="looked at the dashboard", *extra):
    """chargectl <kind> resolve: (exit status, stdout, stderr)."""
    p = s.run([e2e.CHARGECTL, kind, "resolve", step, "--status", status, "--reason", reason,
               "--actor", ACTOR, "--json"] + list(extra), check=False)
    return p.returncode, p.stdout.decode(), p.stderr.decode()


def refused(s, kind, step, status, want, *extra):
    rc, out, err = resolve(s, kind, step, status, "looked", *extra)
    check_eq(rc, 1, "%s resolve %s refused: %s%s" % (kind, status, out, err))
    check(want in err, "the refusal says %r: %s" % (want, err))
    return err


def row(s, sql):
    rows = s.query(sql)
    check_eq(len(rows), 1, "one row of %s" % sql)
    return tuple(rows[0])


def attempt(s, auth):
    return row(s, "SELECT status, coalesce(held_by, ''), coalesce(held_by_id::text, ''),"
               " coalesce(captured_amount::text, ''), coalesce(reason, '')"
               " FROM payment_attempts WHERE id = '%s'" % auth["attempt"])


def step_row(s, kind, step):
    extra = "captured_amount" if kind == "capture" else "released_amount"
    return row(s, "SELECT status, holds, coalesce(%s::text, ''), coalesce(reason, '')"
               " FROM %s_attempts WHERE id = '%s'" % (extra, kind, step))


def events(s, kind, step):
    rows = s.query("SELECT event_type, payload FROM outbox WHERE payload->>'%s_id' = '%s'"
                   " ORDER BY created_at" % (kind, step))
    return [(r[0], json.loads(r[1])) for r in rows]


def operator_transitions(s, kind, step):
    return s.query("SELECT old_status, new_status, actor, evidence->>'provider',"
                   " evidence->'lookup'->>'intent_status' FROM %s_transitions"
                   " WHERE %s_id = '%s' AND cause = 'operator'" % (kind, kind, step))


def ledger_rows(s, auth):
    return s.query("SELECT kind, amount, provider_payment_id FROM ledger_entries"
                   " WHERE payment_attempt_id = '%s'" % auth["attempt"])


def psp_moves(s, auth, what):
    """psp-sim's executed captures or cancels of the authorization's intent."""
    return [c for c in s.psp_get("/ledger").get(what, [])
            if c.get("payment_intent_id") == auth["pi"]]


def operator_calls(s, auth, col="NULL"):
    """The look-ups an operator's decisions wrote: (operation, step id, actor)."""
    return s.query("SELECT operation, coalesce(%s::text, ''), actor, provider_payment_id"
                   " FROM provider_calls WHERE payment_attempt_id = '%s' AND actor = '%s'"
                   % (col, auth["attempt"], ACTOR))


def nothing_written(s, kind, step, auth, before):
    check_eq((step_row(s, kind, step), attempt(s, auth), operator_transitions(s, kind, step)),
             before, "a refusal writes nothing")
    check_eq(operator_calls(s, auth), [], "a refusal writes no call")


def capture(new):
    s = new("step_review_capture", partitions=1)
    auth = steps.authorize(s, 1000)
    c = steps.plant_capture(s, auth, 600, status="REQUIRES_REVIEW")
    before = (step_row(s, "capture", c), attempt(s, auth), [])
    check_eq(before[1][:3], ("AUTHORIZED", "capture", c), "the capture holds its authorization")

    refused(s, "capture", c, "SUCCEEDED", "requires_capture, not captured")
    nothing_written(s, "capture", c, auth, before)
    check_eq(psp_moves(s, auth, "captures"), [], "nothing captured at psp-sim")

    steps.capture_at_psp(s, auth, 600)
    refused(s, "capture", c, "FAILED", "money was captured")
    nothing_written(s, "capture", c, auth, before)

    # Leased by a process that may be calling now: run again later.
    s.psql(s.db, "UPDATE capture_attempts SET lease_owner = 'w-x', lease_expires_at ="
           " now() + interval '1 hour' WHERE id = '%s'" % c)
    refused(s, "capture", c, "SUCCEEDED", "is leased")
    s.psql(s.db, "UPDATE capture_attempts SET lease_owner = NULL, lease_expires_at = NULL"
           " WHERE id = '%s'" % c)

    rc, out, err = resolve(s, "capture", c.upper(), "SUCCEEDED", "captured per psp-sim")
    check_eq(rc, 0, "capture resolve SUCCEEDED: %s" % err)
    doc = json.loads(out)
    check_eq((doc["status"], doc["actor"], doc["evidence"]["provider"],
              doc["evidence"]["lookup"]["amount_received"]),
             ("SUCCEEDED", ACTOR, "agrees", 600), "what resolve says")
    check_eq(step_row(s, "capture", c), ("SUCCEEDED", "t", "600", ""), "the capture")
    check_eq(attempt(s, auth), ("SUCCEEDED", "", "", "600", ""), "the authorization")
    check_eq(ledger_rows(s, auth), [["charge", "600", auth["pi"]]], "one ledger row")
    check_eq(operator_transitions(s, "capture", c),
             [["REQUIRES_REVIEW", "SUCCEEDED", ACTOR, "agrees", "succeeded"]],
             "the capture's transition, with the actor and the evidence")
    check_eq(s.query("SELECT old_status, new_status, actor FROM attempt_transitions"
                     " WHERE payment_attempt_id = '%s' AND cause = 'operator'" % auth["attempt"]),
             [["AUTHORIZED", "SUCCEEDED", ACTOR]], "the authorization's transition")
    evs = events(s, "capture", c)
    check_eq([(t, p["amount"], p["provider_payment_id"]) for t, p in evs],
             [("capture.succeeded", 600, auth["pi"])], "capture.succeeded")
    got = psp_moves(s, auth, "captures")
    check_eq(len(got), 1, "psp-sim captured once: %s" % got)
    check_eq(operator_calls(s, auth, "capture_id"), [["retrieve", c, ACTOR, auth["pi"]]],
             "the look-up written with the decision, as the capture's call")

    refused(s, "capture", c, "SUCCEEDED", "not REQUIRES_REVIEW")
    refused(s, "capture", str(uuid.uuid4()), "FAILED", "no capture")
    check_eq(ledger_rows(s, auth), [["charge", "600", auth["pi"]]], "still one ledger row")


def capture_failed(new):
    s = new("step_review_capture_failed", partitions=1)
    auth = steps.authorize(s, 1000)
    c = steps.plant_capture(s, auth, None, status="REQUIRES_REVIEW")
    # Two operators at once: one decision is written, the other refused.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: resolve(s, "capture", c, "FAILED",
                                               "never captured, psp-sim holds it"), range(2)))
    check_eq(sorted(r[0] for r in runs), [0, 1], "two resolutions at once: %s" % runs)
    check_eq(step_row(s, "capture", c),
             ("FAILED", "f", "", "never captured, psp-sim holds it"), "the capture")
    check_eq(attempt(s, auth), ("AUTHORIZED", "", "", "", ""), "the hold given back")
    check_eq([t for t, _ in events(s, "capture", c)], ["capture.failed"], "capture.failed")
    check_eq(ledger_rows(s, auth), [], "nothing booked")
    check_eq(psp_moves(s, auth, "captures"), [], "nothing captured at psp-sim")
    check_eq(operator_transitions(s, "capture", c),
             [["REQUIRES_REVIEW", "FAILED", ACTOR, "agrees", "requires_capture"]],
             "the capture's transition")


def capture_of_a_reviewed_authorization(new):
    """psp-sim captured for our capture while its authorization went to
    review: the capture cannot be booked until the authorization's own
    review books what was taken; then it resolves, booked once."""
    s = new("step_review_capture_reviewed_authorization", partitions=1)
    auth = steps.authorize(s, 1000)
    c = steps.plant_capture(s, auth, 600, status="REQUIRES_REVIEW")
    in_review(s, auth)
    check_eq(attempt(s, auth)[:3], ("REQUIRES_REVIEW", "capture", c), "held through review")
    steps.capture_at_psp(s, auth, 600)
    refused(s, "capture", c, "SUCCEEDED", "its authorization REQUIRES_REVIEW")
    check_eq(ledger_rows(s, auth), [], "nothing booked by the refusal")
    rc, _, err = resolve(s, "authorization", auth["attempt"], "SUCCEEDED", "captured 6.00")
    check_eq(rc, 0, "authorization resolve SUCCEEDED: %s" % err)
    rc, _, err = resolve(s, "capture", c, "SUCCEEDED", "the capture that took it")
    check_eq(rc, 0, "capture resolve SUCCEEDED: %s" % err)
    check_eq(step_row(s, "capture", c), ("SUCCEEDED", "t", "600", ""), "the capture")
    check_eq(attempt(s, auth), ("SUCCEEDED", "", "", "600", ""), "the authorization")
    check_eq(ledger_rows(s, auth), [["charge", "600", auth["pi"]]], "booked once")
    check_eq([t for t, _ in events(s, "capture", c)], ["capture.succeeded"], "its event")
    check_eq(len(psp_moves(s, auth, "captures")), 1, "psp-sim captured once")


def void(new):
    s = new("step_review_void", partitions=1)
    auth = steps.authorize(s, 1000)
    v = steps.plant_void(s, auth, status="REQUIRES_REVIEW")
    before = (step_row(s, "void", v), attempt(s, auth), [])
    check_eq(before[1][:3], ("AUTHORIZED", "void", v), "the void holds its authorization")
    refused(s, "void", v, "SUCCEEDED", "requires_capture")
    nothing_written(s, "void", v, auth, before)

    steps.cancel_at_psp(s, auth, "requested_by_customer")
    refused(s, "void", v, "FAILED", "released by a request")
    nothing_written(s, "void", v, auth, before)

    rc, out, err = resolve(s, "void", v, "SUCCEEDED", "canceled per psp-sim")
    check_eq(rc, 0, "void resolve SUCCEEDED: %s" % err)
    check_eq(step_row(s, "void", v), ("SUCCEEDED", "t", "1000", ""), "the void")
    check_eq(attempt(s, auth)[:3], ("VOIDED", "", ""), "the authorization VOIDED")
    evs = events(s, "void", v)
    check_eq([(t, p["amount"]) for t, p in evs], [("void.succeeded", 1000)], "void.succeeded")
    check_eq(ledger_rows(s, auth), [], "a void books nothing")
    check_eq(len(psp_moves(s, auth, "cancels")), 1, "psp-sim canceled once")
    check_eq(operator_transitions(s, "void", v),
             [["REQUIRES_REVIEW", "SUCCEEDED", ACTOR, "agrees", "canceled"]],
             "the void's transition")
    check_eq(s.query("SELECT old_status, new_status, actor FROM attempt_transitions"
                     " WHERE payment_attempt_id = '%s' AND cause = 'operator'" % auth["attempt"]),
             [["AUTHORIZED", "VOIDED", ACTOR]], "the authorization's transition")


def void_failed(new):
    s = new("step_review_void_failed", partitions=1)
    auth = steps.authorize(s, 1000)
    v = steps.plant_void(s, auth, status="REQUIRES_REVIEW")
    # Its cancel sent a minute ago, answer lost: the provider may still
    # execute it (WORKER_KEY_RETENTION_MS, 24 h here), so nobody decides yet.
    s.psql(s.db, "INSERT INTO provider_calls (payment_attempt_id, void_id, operation,"
           " started_at, latency_ms, outcome, actor) VALUES ('%s', '%s', 'void',"
           " now() - interval '1 minute', 2000, 'unknown', 'w-test')" % (auth["attempt"], v))
    refused(s, "void", v, "FAILED", "may still execute it")
    check_eq(operator_calls(s, auth), [], "nothing written")
    s.psql(s.db, "UPDATE provider_calls SET started_at = now() - interval '2 days',"
           " recorded_at = now() - interval '2 days' WHERE void_id = '%s'" % v)
    rc, _, err = resolve(s, "void", v, "FAILED", "still held at psp-sim")
    check_eq(rc, 0, "void resolve FAILED: %s" % err)
    check_eq(step_row(s, "void", v), ("FAILED", "f", "", "still held at psp-sim"), "the void")
    check_eq(attempt(s, auth), ("AUTHORIZED", "", "", "", ""), "the hold given back")
    check_eq([t for t, _ in events(s, "void", v)], ["void.failed"], "void.failed")
    check_eq(psp_moves(s, auth, "cancels"), [], "nothing canceled at psp-sim")


def void_after_capture(new):
    s = new("step_review_void_after_capture", partitions=1)
    auth = steps.authorize(s, 1000)
    v = steps.plant_void(s, auth, status="REQUIRES_REVIEW")
    steps.capture_at_psp(s, auth)
    refused(s, "void", v, "SUCCEEDED", "succeeded")
    rc, _, err = resolve(s, "void", v, "FAILED", "captured behind our back")
    check_eq(rc, 0, "void resolve FAILED: %s" % err)
    check_eq(step_row(s, "void", v),
             ("FAILED", "f", "", "void_after_capture: captured behind our back"), "the void")
    check_eq(attempt(s, auth),
             ("REQUIRES_REVIEW", "", "", "", "void_after_capture: captured behind our back"),
             "the authorization goes to review")
    check_eq([t for t, _ in events(s, "void", v)], ["void.failed"], "void.failed")
    check_eq(s.query("SELECT event_type FROM outbox WHERE payment_attempt_id = '%s'"
                     " AND event_type LIKE 'authorization.%%'" % auth["attempt"]),
             [["authorization.requires_review"]], "authorization.requires_review")
    check_eq(len(psp_moves(s, auth, "captures")), 1, "psp-sim captured it")

    # The authorization's own review then books what psp-sim captured.
    refused(s, "authorization", auth["attempt"], "VOIDED", "not VOIDED")
    rc, _, err = resolve(s, "authorization", auth["attempt"], "SUCCEEDED", "captured at psp")
    check_eq(rc, 0, "authorization resolve SUCCEEDED: %s" % err)
    check_eq(attempt(s, auth), ("SUCCEEDED", "", "", "1000", ""), "the authorization booked")
    check_eq(ledger_rows(s, auth), [["charge", "1000", auth["pi"]]], "its ledger row")


def in_review(s, auth, why="requires_review: captured: by no capture of ours"):
    """The authorization moved to review, as the look or a webhook moves it."""
    s.psql(s.db, "BEGIN;UPDATE payment_attempts SET status = 'REQUIRES_REVIEW', reason = '%s'"
           " WHERE id = '%s';%sCOMMIT;"
           % (why, auth["attempt"], steps.attempt_moved(auth, "AUTHORIZED", "REQUIRES_REVIEW", why)))


def auth_events(s, auth):
    return [r[0] for r in s.query("SELECT event_type FROM outbox WHERE payment_attempt_id ="
                                  " '%s' ORDER BY created_at" % auth["attempt"])]


def authorization_captured(new):
    s = new("step_review_authorization_captured", partitions=1)
    auth = steps.authorize(s, 1000)
    in_review(s, auth)
    steps.capture_at_psp(s, auth, 700)
    before = attempt(s, auth)
    refused(s, "authorization", auth["attempt"], "AUTHORIZED", "not AUTHORIZED")
    refused(s, "authorization", auth["attempt"], "FAILED", "not FAILED")
    check_eq(attempt(s, auth), before, "a refusal writes nothing")
    # The charge's review leaves an authorization alone.
    p = s.run([e2e.CHARGECTL, "attempt", "resolve", auth["attempt"], "--failed", "--reason",
               "x", "--actor", ACTOR], check=False)
    check_eq(p.returncode, 1, "attempt resolve of an authorization")
    check("chargectl authorization resolve" in p.stderr.decode(), p.stderr.decode())
    rc, out, err = resolve(s, "authorization", auth["attempt"], "SUCCEEDED", "captured 7.00")
    check_eq(rc, 0, "authorization resolve SUCCEEDED: %s" % err)
    check_eq(json.loads(out)["evidence"]["lookup"]["amount_received"], 700, "the evidence")
    check_eq(attempt(s, auth), ("SUCCEEDED", "", "", "700", ""), "captured 700 of 1000")
    check_eq(ledger_rows(s, auth), [["charge", "700", auth["pi"]]], "booked what was taken")
    check_eq(auth_events(s, auth), [], "no capture of ours: no event")
    check_eq(operator_calls(s, auth), [["retrieve", "", ACTOR, auth["pi"]]],
             "the look-up written with the decision")
    check_eq(s.query("SELECT old_status, new_status, actor, reason FROM attempt_transitions"
                     " WHERE payment_attempt_id = '%s' AND cause = 'operator'" % auth["attempt"]),
             [["REQUIRES_REVIEW", "SUCCEEDED", ACTOR, "captured 7.00"]], "the transition")
    check_eq([c.get("amount") for c in psp_moves(s, auth, "captures")], [700],
             "psp-sim captured 700 once")


def authorization_held(new):
    s = new("step_review_authorization_held", partitions=1)
    auth = steps.authorize(s, 1000)
    in_review(s, auth)
    refused(s, "authorization", auth["attempt"], "SUCCEEDED", "requires_capture")
    refused(s, "authorization", auth["attempt"], "VOIDED", "not VOIDED")
    rc, _, err = resolve(s, "authorization", auth["attempt"], "AUTHORIZED", "still held")
    check_eq(rc, 0, "authorization resolve AUTHORIZED: %s" % err)
    check_eq(attempt(s, auth), ("AUTHORIZED", "", "", "", ""), "held again")
    check_eq(auth_events(s, auth), ["authorization.succeeded"], "authorization.succeeded")
    check_eq(ledger_rows(s, auth), [], "nothing booked")
    check_eq((psp_moves(s, auth, "captures"), psp_moves(s, auth, "cancels")), ([], []),
             "psp-sim did nothing")
    refused(s, "authorization", auth["attempt"], "VOIDED", "not REQUIRES_REVIEW")
    # A charge is not an authorization.
    plain = str(uuid.uuid4())
    s.psql(s.db, "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
           " request_fingerprint, amount, currency, payment_method, status) VALUES"
           " ('%s', '%s', 'k-%s', 'fp', 100, 'EUR', 'pm_card_visa', 'REQUIRES_REVIEW')"
           % (plain, uuid.uuid4(), plain))
    refused(s, "authorization", plain, "FAILED", "no authorization")


def authorization_voided(new):
    s = new("step_review_authorization_voided", partitions=1)
    auth = steps.authorize(s, 1000)
    in_review(s, auth, "requires_review: canceled: by no void of ours")
    steps.cancel_at_psp(s, auth, "abandoned")
    refused(s, "authorization", auth["attempt"], "AUTHORIZED", "canceled")
    rc, _, err = resolve(s, "authorization", auth["attempt"], "VOIDED", "canceled at psp")
    check_eq(rc, 0, "authorization resolve VOIDED: %s" % err)
    check_eq(attempt(s, auth), ("VOIDED", "", "", "", "voided"), "released")
    check_eq(auth_events(s, auth), ["authorization.failed"], "authorization.failed")
    check_eq(ledger_rows(s, auth), [], "nothing booked")


SCENARIOS = {"capture": capture, "capture_failed": capture_failed,
             "capture_of_a_reviewed_authorization": capture_of_a_reviewed_authorization,
             "void": void,
             "void_failed": void_failed, "void_after_capture": void_after_capture,
             "authorization_captured": authorization_captured,
             "authorization_held": authorization_held,
             "authorization_voided": authorization_voided}

if __name__ == "__main__":
    names = sys.argv[1:] or list(SCENARIOS)

    def run_all(new):
        for n in names:
            SCENARIOS[n](new)
    raise SystemExit(e2e.main(run_all))
