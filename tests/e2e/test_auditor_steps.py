#!/usr/bin/env python3
"""The auditor's findings of authorizations, captures and voids (issue 37,
docs/auditor.md "An authorization and its steps"), against real PostgreSQL
and psp-sim, judged from psp-sim's own books.

Our side is planted in the database as the operations write it (migration
0016-0018's rules: the hold, the step, the attempt, the ledger row), and psp-sim
is driven over its API as an operation would drive it: an intent with
capture_method=manual under the attempt's key, POST .../capture,
POST .../cancel, and PUT /authorization-expiry on its admin port.

- quiet: an authorization captured in part and one voided, both booked:
  no finding, nothing pending;
- over_authorized: psp-sim captured 800 where our capture asked 500 (and
  that capture is still in flight: capture_unbooked waits), and captured
  all of an intent whose amount then became less than it took:
  captured_over_authorized, each once however often audited;
- capture_unbooked: captured at psp-sim while our capture is UNKNOWN:
  nothing yet (the grace of an unsettled step); once our capture FAILED
  without booking it, the next run finds capture_unbooked;
- void_unbooked: the scheduled auditor sees an authorization held (pending,
  looked at again), psp-sim then cancels it with no void of ours: found on
  a later look, not only by a new list; a cancel with our void in flight
  waits;
- expired: two authorizations lapse at psp-sim (cancellation_reason
  automatic): authorization_expired_unvoided for each, whether or not our
  attempt recorded VOIDED (expired); a captured one is not.

Scenarios can be run alone: test_auditor_steps.py quiet"""
import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402

AUDITOR = {"AUDITOR_WINDOW_MS": 2000, "AUDITOR_LAG_MS": 1500, "AUDITOR_POLL_MS": 200}
STEP_KINDS = ("captured_over_authorized", "capture_unbooked", "void_unbooked",
              "authorization_expired_unvoided")


# ---- the provider, as an operation calls it ----

def psp_post(s, path, form, key):
    """POSTs form to psp-sim's provider API under key: (status, answer)."""
    req = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (s.psp_port, path),
        data=urllib.parse.urlencode(form).encode(), method="POST",
        headers={"Authorization": "Bearer " + e2e.API_KEY, "Idempotency-Key": key,
                 "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def authorize(s, amount=1000):
    """An authorization held at psp-sim under our attempt's key, and our
    attempt AUTHORIZED on it (as the authorize operation records it)."""
    a, order = str(uuid.uuid4()), str(uuid.uuid4())
    key = "auth-" + a
    st, pi = psp_post(s, "/v1/payment_intents", {
        "amount": amount, "currency": "eur", "payment_method": "pm_card_visa",
        "confirm": "true", "capture_method": "manual",
        "metadata[payment_attempt_id]": a, "metadata[order_id]": order}, key)
    check_eq((st, pi.get("status"), pi.get("amount_capturable")),
             (200, "requires_capture", amount), "psp-sim's authorization")
    s.psql(s.db, "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
           " request_fingerprint, amount, currency, payment_method, status,"
           " provider_payment_id, capture_method, first_sent_at) VALUES ('%s', '%s', '%s',"
           " 'fp', %d, 'EUR', 'pm_card_visa', 'AUTHORIZED', '%s', 'manual', now())"
           % (a, order, key, amount, pi["id"]))
    return {"attempt": a, "order": order, "pi": pi["id"], "amount": amount}


def capture_at_psp(s, auth, amount=None):
    form = {"amount_to_capture": amount} if amount else {}
    st, pi = psp_post(s, "/v1/payment_intents/%s/capture" % auth["pi"], form,
                      "cap-" + uuid.uuid4().hex)
    check_eq((st, pi.get("status")), (200, "succeeded"), "psp-sim's capture")
    return pi


def cancel_at_psp(s, auth, reason=None):
    form = {"cancellation_reason": reason} if reason else {}
    st, pi = psp_post(s, "/v1/payment_intents/%s/cancel" % auth["pi"], form,
                      "void-" + uuid.uuid4().hex)
    check_eq((st, pi.get("status")), (200, "canceled"), "psp-sim's cancel")
    return pi


# ---- our books, as the capture and void operations write them ----

def moved(kind, step, old, new, reason=None):
    """A step's transition, as its operation records it."""
    return ("INSERT INTO %s_transitions (%s_id, old_status, new_status, cause, actor,"
            " reason) VALUES ('%s', %s, '%s', 'worker', 'w-test', %s);"
            % (kind, kind, step, "'%s'" % old if old else "NULL", new,
               "'%s'" % reason if reason else "NULL"))


def attempt_moved(auth, old, new, reason=None):
    return ("INSERT INTO attempt_transitions (payment_attempt_id, old_status, new_status,"
            " cause, actor, reason) VALUES ('%s', '%s', '%s', 'worker', 'w-test', %s);"
            % (auth["attempt"], old, new, "'%s'" % reason if reason else "NULL"))


def claim_sql(table, kind, auth, step, extra_cols, extra_vals):
    """A step recorded PENDING, and its claim of the hold (migrations 0016-0018)."""
    return ("INSERT INTO %s (id, payment_attempt_id, order_id, idempotency_key,"
            " request_fingerprint, status%s) VALUES ('%s', '%s', '%s', '%s-%s', 'fp',"
            " 'PENDING'%s);"
            "UPDATE payment_attempts SET held_by = '%s', held_by_id = '%s'"
            " WHERE id = '%s' AND status = 'AUTHORIZED' AND held_by IS NULL;"
            "UPDATE %s SET status = 'PROCESSING', holds = true, payment_intent = '%s',"
            " first_sent_at = now(), attempt_count = 1 WHERE id = '%s';"
            % (table, extra_cols, step, auth["attempt"], auth["order"], kind, step,
               extra_vals, kind, step, auth["attempt"], table, auth["pi"], step)
            + moved(kind, step, None, "PENDING") + moved(kind, step, "PENDING", "PROCESSING"))


def plant_capture(s, auth, amount, status="SUCCEEDED"):
    """Our capture of auth asking amount (None: all), left in status:
    SUCCEEDED books it (the attempt SUCCEEDED with captured_amount, its
    ledger row) in one transaction."""
    c = str(uuid.uuid4())
    # The claim commits before the provider is called; the answer later.
    s.psql(s.db, "BEGIN;" + claim_sql("capture_attempts", "capture", auth, c,
                                      ", amount, currency",
                                      ", %s, 'EUR'" % ("NULL" if amount is None else amount))
           + "COMMIT;")
    sql = "BEGIN;"
    taken = amount if amount is not None else auth["amount"]
    if status == "SUCCEEDED":
        sql += attempt_moved(auth, "AUTHORIZED", "SUCCEEDED")
        sql += ("UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = %d"
                " WHERE id = '%s';"
                "INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount,"
                " currency, provider_payment_id) VALUES ('%s', '%s', 'charge', %d, 'EUR',"
                " '%s');"
                % (taken, auth["attempt"], auth["attempt"], auth["order"], taken, auth["pi"]))
        sql += ("UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = %d"
                " WHERE id = '%s';" % (taken, c))
    elif status != "PROCESSING":
        sql += "UPDATE capture_attempts SET status = '%s' WHERE id = '%s';" % (status, c)
    if status != "PROCESSING":
        sql += moved("capture", c, "PROCESSING", status)
    s.psql(s.db, sql + "COMMIT;")
    return c


def plant_void(s, auth, status="SUCCEEDED"):
    """Our void of auth, left in status; SUCCEEDED with the attempt VOIDED."""
    v = str(uuid.uuid4())
    s.psql(s.db, "BEGIN;" + claim_sql("void_attempts", "void", auth, v, ", void_reason",
                                      ", 'requested_by_customer'") + "COMMIT;")
    sql = "BEGIN;"
    if status == "SUCCEEDED":
        sql += attempt_moved(auth, "AUTHORIZED", "VOIDED", "voided")
        sql += ("UPDATE payment_attempts SET status = 'VOIDED', reason = 'voided'"
                " WHERE id = '%s';" % auth["attempt"])
    if status != "PROCESSING":
        sql += "UPDATE void_attempts SET status = '%s' WHERE id = '%s';" % (status, v)
        sql += moved("void", v, "PROCESSING", status)
    s.psql(s.db, sql + "COMMIT;")
    return v


def reject_void(s, auth, reason):
    """A void that lost the hold: REJECTED before any call, as the void
    operation records its loser."""
    v = str(uuid.uuid4())
    s.psql(s.db, "BEGIN;INSERT INTO void_attempts (id, payment_attempt_id, order_id,"
           " idempotency_key, request_fingerprint, status, void_reason, reason) VALUES"
           " ('%s', '%s', '%s', 'void-%s', 'fp', 'REJECTED', 'abandoned', '%s');%sCOMMIT;"
           % (v, auth["attempt"], auth["order"], v, reason,
              moved("void", v, None, "REJECTED", reason)))
    return v


# ---- the audit ----

def audit_run(s, t0):
    """chargectl audit run over the scenario: (exit status, verdict)."""
    since = int(time.time()) - t0 + 2
    rc, out, err = s.audit("run", "--since", "%ds" % since, "--json")
    check(rc in (0, 1) and out.strip(), "chargectl audit run: %d %s" % (rc, err[-2000:]))
    return rc, json.loads(out)


def findings(s):
    """{(kind, object): finding} of every finding recorded."""
    rows = s.query("SELECT kind, object_id, coalesce(payment_attempt_id, ''),"
                   " coalesce(order_id, ''), coalesce(provider_amount, -1),"
                   " coalesce(ledger_amount, -1), detail FROM audit_findings ORDER BY id")
    return {(r[0], r[1]): dict(zip(("attempt", "order", "provider_amount", "ledger_amount",
                                    "detail"), r[2:])) for r in rows}


def pending(s):
    return sorted(r[0] for r in s.query("SELECT object_id FROM audit_pending"))


def no_card_text(got):
    """Findings carry ids, amounts and our phrases: no provider free text."""
    for key, f in got.items():
        check("automatic" not in f["detail"] and "requested_by" not in f["detail"],
              "a finding's detail copies provider text: %s %s" % (key, f))


def quiet(new):
    s = new("audit_steps_quiet", partitions=1)
    t0 = int(time.time()) - 1
    captured, voided = authorize(s, 1000), authorize(s, 800)
    plant_capture(s, captured, 600)
    capture_at_psp(s, captured, 600)
    plant_void(s, voided)
    cancel_at_psp(s, voided, "requested_by_customer")
    ledger = s.psp_get("/ledger")
    check_eq([(c["payment_intent_id"], c["amount"]) for c in ledger["captures"]],
             [(captured["pi"], 600)], "psp-sim's captures")
    check_eq([(c["payment_intent_id"], c["kind"]) for c in ledger["cancels"]],
             [(voided["pi"], "void")], "psp-sim's voids")
    rc, v = audit_run(s, t0)
    check_eq((rc, v["findings_total"], v["intents_seen"], v["ledger_rows_seen"]),
             (0, 0, 2, 1), "the audit of a capture and a void both booked")
    check_eq(findings(s), {}, "findings")
    check_eq(pending(s), [], "nothing left to look at again")


def over_authorized(new):
    s = new("audit_steps_over", partitions=1)
    t0 = int(time.time()) - 1
    asked = authorize(s, 1000)
    plant_capture(s, asked, 500, status="UNKNOWN")
    capture_at_psp(s, asked, 800)  # the provider took more than we asked
    shrunk = authorize(s, 1000)
    plant_capture(s, shrunk, None)
    capture_at_psp(s, shrunk)
    s.psp_put("/intents/%s/amend" % shrunk["pi"], {"amount": 900}, method="POST")
    for run in (1, 2):  # judged again each run, recorded once
        rc, v = audit_run(s, t0)
        check_eq(rc, 1, "run %d exits 1 on findings" % run)
        got = findings(s)
        check_eq(sorted(got), sorted([("captured_over_authorized", asked["pi"]),
                                      ("captured_over_authorized", shrunk["pi"])]),
                 "findings after run %d" % run)
        check_eq(sum(v["new_findings"].values()), 2 if run == 1 else 0,
                 "findings new to run %d" % run)
        check_eq(v["findings"]["captured_over_authorized"], 2,
                 "the verdict of run %d counts both" % run)
    f = got[("captured_over_authorized", asked["pi"])]
    check_eq((f["attempt"], f["order"], f["provider_amount"], f["ledger_amount"]),
             (asked["attempt"], asked["order"], "800", "500"),
             "what the provider took against what our capture asked")
    f = got[("captured_over_authorized", shrunk["pi"])]
    check_eq((f["attempt"], f["provider_amount"]), (shrunk["attempt"], "1000"),
             "taken beyond what the intent held")
    # The capture in flight is not yet unbooked: looked at again.
    check_eq(pending(s), [asked["pi"]], "the capture in flight waits")
    no_card_text(got)


def capture_unbooked(new):
    s = new("audit_steps_capture", partitions=1)
    t0 = int(time.time()) - 1
    auth = authorize(s, 1000)
    c = plant_capture(s, auth, 700, status="UNKNOWN")
    capture_at_psp(s, auth, 700)
    rc, v = audit_run(s, t0)
    check_eq((rc, findings(s)), (0, {}), "a capture whose answer is lost: no finding yet")
    check_eq(pending(s), [auth["pi"]], "looked at again")
    # Settled wrong: FAILED, the hold given back, nothing booked.
    s.psql(s.db, "UPDATE capture_attempts SET status = 'FAILED', reason = 'declined'"
           " WHERE id = '%s'" % c)
    rc, v = audit_run(s, t0)
    got = findings(s)
    check_eq((rc, sorted(got)), (1, [("capture_unbooked", auth["pi"])]),
             "the capture the provider made and our books do not show")
    f = got[("capture_unbooked", auth["pi"])]
    check_eq((f["attempt"], f["order"], f["provider_amount"], f["ledger_amount"]),
             (auth["attempt"], auth["order"], "700", "-1"), "the finding's ids and amounts")
    check_eq(pending(s), [], "judged")
    no_card_text(got)


def void_unbooked(new):
    s = new("audit_steps_void", partitions=1)
    t0 = int(time.time()) - 1
    lone, in_flight = authorize(s, 1000), authorize(s, 500)
    t1 = int(time.time()) + 1
    au = s.start_auditor(AUDITOR_FROM=t0, **AUDITOR)
    e2e.wait_until("the windows audited", lambda: s.audit_totals()["watermark"] > t1,
                   e2e.scaled(30))
    check_eq(pending(s), sorted([lone["pi"], in_flight["pi"]]),
             "authorizations held: looked at again")
    check_eq(findings(s), {}, "nothing wrong yet")
    plant_void(s, in_flight, status="UNKNOWN")
    cancel_at_psp(s, in_flight, "requested_by_customer")
    cancel_at_psp(s, lone)  # canceled without a word to us
    e2e.wait_until("void_unbooked found on a later look",
                   lambda: ("void_unbooked", lone["pi"]) in findings(s), e2e.scaled(20))
    got = findings(s)
    check_eq(sorted(got), [("void_unbooked", lone["pi"])], "findings")
    f = got[("void_unbooked", lone["pi"])]
    check_eq((f["attempt"], f["order"], f["provider_amount"]),
             (lone["attempt"], lone["order"], "1000"), "the finding's ids and amount")
    check_eq(pending(s), [in_flight["pi"]], "the cancel with our void in flight waits")
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")
    no_card_text(got)


def expired(new):
    s = new("audit_steps_expired", partitions=1)
    t0 = int(time.time()) - 1
    forgotten, recorded, captured = authorize(s, 1000), authorize(s, 400), authorize(s, 300)
    plant_capture(s, captured, None)
    capture_at_psp(s, captured)
    s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 1})
    # What the authorize operation records of an expiry it heard of.
    s.psql(s.db, "UPDATE payment_attempts SET status = 'VOIDED', reason = 'expired'"
           " WHERE id = '%s'" % recorded["attempt"])
    rc, v = audit_run(s, t0)
    got = findings(s)
    check_eq((rc, sorted(got)),
             (1, sorted([("authorization_expired_unvoided", forgotten["pi"]),
                         ("authorization_expired_unvoided", recorded["pi"])])),
             "a finding per lapsed authorization, VOIDED (expired) or not")
    expiries = sorted(e["payment_intent_id"] for e in s.psp_get("/ledger")["expiries"])
    check_eq(expiries, sorted([forgotten["pi"], recorded["pi"]]), "psp-sim's expiries")
    for auth in (forgotten, recorded):
        f = got[("authorization_expired_unvoided", auth["pi"])]
        check_eq((f["attempt"], f["provider_amount"]), (auth["attempt"], str(auth["amount"])),
                 "the lapsed hold's attempt and amount")
    rc, v = audit_run(s, t0)
    check_eq((len(findings(s)), sum(v["new_findings"].values())), (2, 0),
             "audited again: one finding per intent")
    no_card_text(got)


SCENARIOS = [quiet, over_authorized, capture_unbooked, void_unbooked, expired]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
