#!/usr/bin/env python3
"""Regression (issue 17, defect 7): "never executed" must not rest on
search alone. Search is eventually consistent: with psp-sim's search
lagging longer than the reconciler's RECONCILER_SEARCH_LAG_MS, an attempt
psp-sim did charge (its answer lost) was FAILED never_executed, and the
order's next attempt charged it a second time. Before FAILED the reconciler
now walks the provider's list (GET /v1/payment_intents?created[gte]=..,
consistent, newest first, has_more) over the window of every call the key
could have made, matched on metadata[payment_attempt_id]
(docs/reconciler.md, "The order of evidence").

Keys are kept 3 s (psp-sim --key-retention-ms, WORKER_KEY_RETENTION_MS),
the reconciler's search lag is 1 s, psp-sim's search lags 10 minutes, and
the reconciler starts once the key's window is closed, so it never charges
again: only search and the list can settle it.

Since issue 34 an intent the list (or the search) holds only names the
attempt (metadata is anyone's to write): past the key's window it is never
settled on. The attempt goes to REQUIRES_REVIEW (unproven) with the intent
in its reason, nothing booked: a person decides. What stays: never FAILED
while the provider holds an intent naming it.

1. lost_charge_in_list: drop_after on the attempt's key -> REQUIRES_REVIEW
   on the intent the list holds (unproven), no charge call, psp-sim charged
   the key once and the order once (before issue 17: FAILED
   never_executed).
2. none_in_list: every POST answered 500 before executing -> FAILED
   never_executed, after a list walk that found nothing; nothing charged.
3. list_fails: a proxy answers 503 to the list -> the charged attempt stays
   UNKNOWN (never FAILED) past the window; psp-sim's list then sends it to
   review.
4. list_pages: 250 declined intents of other attempts created after the
   attempt's own -> its intent is on the list's third page: REQUIRES_REVIEW
   on it, the walk took 3 pages.
5. endless_list: a proxy answers every list page with has_more and one
   foreign intent -> the walk stops at its bound (100 pages) and the
   attempt stays UNKNOWN, never FAILED; psp-sim's list then sends it to
   review.

Scenarios can be run alone: test_reconciler_list.py list_fails"""
import json
import sys
import time
import uuid

import charged_e2e as e2e
from charged_e2e import check, check_eq
from test_reconciler_evidence import PROXIES, ProviderProxy, psp_charge

RETENTION, LAG = 3000, 1000
WORKER = {"WORKER_UNKNOWN_RETRIES": 0, "RECONCILER_FIRST_LOOK_MS": 0,
          "PROVIDER_TIMEOUT_MS": 1000, "WORKER_LEASE_MS": 5000,
          "WORKER_KEY_RETENTION_MS": RETENTION}
RECONCILER = {"RECONCILER_SCHEDULE_MS": 200, "RECONCILER_POLL_MS": 100,
              "PROVIDER_TIMEOUT_MS": 1000, "WORKER_KEY_RETENTION_MS": RETENTION,
              "RECONCILER_SEARCH_LAG_MS": LAG}
PSP = ["--key-retention-ms", str(RETENTION), "--search-lag-ms", "600000"]


def attempt(s, aid):
    rows = s.query("SELECT status, coalesce(reason, ''), coalesce(provider_payment_id, ''), "
                   "reconcile_checks, coalesce(last_error, '') "
                   "FROM payment_attempts WHERE id = '%s'" % aid)
    check(len(rows) == 1, "want one row for attempt %s: %s" % (aid, rows))
    r = rows[0]
    return {"status": r[0], "reason": r[1], "ppid": r[2], "checks": int(r[3]),
            "last_error": r[4]}


def calls(s, aid, actor):
    """[(operation, outcome, http_status or '', error)] of one actor, in order."""
    return [tuple(r) for r in s.query(
        "SELECT operation, outcome, coalesce(http_status::text, ''), coalesce(error, '') "
        "FROM provider_calls WHERE payment_attempt_id = '%s' AND actor = '%s' ORDER BY id"
        % (aid, actor))]


def reconciler_evidence(s, aid):
    """The evidence of the reconciler's transitions, parsed."""
    return [json.loads(r[0]) for r in s.query(
        "SELECT evidence FROM attempt_transitions WHERE payment_attempt_id = '%s' "
        "AND cause = 'reconciler' ORDER BY id" % aid)]


def describe(s, aid):
    return "attempt %s; transitions %s" % (attempt(s, aid), s.query(
        "SELECT old_status, new_status, cause, reason FROM attempt_transitions "
        "WHERE payment_attempt_id = '%s' ORDER BY id" % aid))


def charges_of(s, field, value):
    return [c for c in s.ledger() if c[field] == value]


def wait_status(s, aid, statuses, timeout, stays):
    def cond():
        a = attempt(s, aid)
        if a["status"] not in tuple(statuses) + tuple(stays):
            raise e2e.Failure("attempt went %s, want %s: %s" % (
                a["status"], statuses, describe(s, aid)))
        return a if a["status"] in statuses else None
    return e2e.wait_until("attempt %s in %s" % (aid, statuses), cond, timeout, 0.1)


def key_age_ms(s, aid):
    return float(s.query("SELECT extract(epoch FROM now() - first_sent_at) * 1000 "
                         "FROM payment_attempts WHERE id = '%s'" % aid)[0][0])


def worker_leaves_unknown(s, cmd):
    """One worker takes cmd and leaves it UNKNOWN; then waits until the
    key's retention has passed, so that no reconciler may charge again."""
    aid = cmd["payment_attempt_id"]
    s.start_worker(**WORKER)
    s.publish([cmd])
    s.wait_settled(1, timeout=60)
    check(not s.exited_workers(), "the worker exited")
    check_eq(attempt(s, aid)["status"], "UNKNOWN", "status the worker left")
    e2e.wait_until("the key's retention to pass", lambda: key_age_ms(s, aid) >= RETENTION,
                   15, 0.1)


def check_succeeded_from_list(s, cmd, r, pages=None):
    """REQUIRES_REVIEW (unproven) on the one charge psp-sim made, found by
    the list, nothing booked; no charge sent by the reconciler; one charge
    for the order."""
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    a = attempt(s, aid)
    charges = charges_of(s, "idempotency_key", key)
    check_eq(len(charges), 1, "psp-sim charges of key %s" % key)
    check_eq(charges[0]["outcome"], "succeeded", "psp-sim's outcome")
    check_eq(a["status"], "REQUIRES_REVIEW", "status")
    check("unproven" in a["reason"] and charges[0]["payment_intent_id"] in a["reason"],
          "reason %r" % a["reason"])
    check_eq(a["ppid"], "", "provider_payment_id (an unproven intent is never recorded)")
    check_eq(len([c for c in charges_of(s, "order_id", cmd["order_id"])
                  if c["outcome"] == "succeeded"]), 1, "psp-sim charges of the order")
    check_eq(s.query("SELECT kind, provider_payment_id FROM ledger_entries "
                     "WHERE payment_attempt_id = '%s'" % aid), [], "ledger_entries")
    rc = calls(s, aid, s.worker_ids[r])
    check("charge" not in [c[0] for c in rc], "the reconciler charged again: %s" % rc)
    check_eq(rc[-1][:2], ("list", "succeeded"), "the reconciler's last call")
    ev = reconciler_evidence(s, aid)
    check_eq(len(ev), 1, "reconciler transitions")
    listed = [c for c in ev[0]["calls"] if c["operation"] == "list"]
    check_eq(len(listed), 1, "list walks in the settling look's evidence")
    if pages is not None:
        check_eq(listed[0].get("pages"), pages, "pages the list walk took")
    return rc


def lost_charge_in_list(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("list_lost", psp_args=PSP + ["--fault", "drop_after=1@%s#1" % key])
    worker_leaves_unknown(s, cmd)
    r = s.start_reconciler(**RECONCILER)
    wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=["UNKNOWN"])
    rc = check_succeeded_from_list(s, cmd, r)
    check(all(c[0] in ("search", "list") for c in rc) and rc[0][:2] == ("search", "not_found"),
          "want searches that found nothing, then the list: %s" % rc)
    e2e.log("lost charge found by the list after %d calls: %s" % (len(rc), rc[-1][:3]))
    s.check_invariants()


def none_in_list(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("list_none", psp_args=PSP + ["--fault", "error_before=1@%s" % key])
    worker_leaves_unknown(s, cmd)
    r = s.start_reconciler(**RECONCILER)
    a = wait_status(s, aid, ["FAILED"], 30, stays=["UNKNOWN"])
    check(a["reason"].startswith("never_executed"), "reason %r" % a["reason"])
    rc = calls(s, aid, s.worker_ids[r])
    check_eq(rc[-1][:3], ("list", "not_found", "200"), "the call FAILED rests on")
    check("charge" not in [c[0] for c in rc], "the reconciler charged: %s" % rc)
    check_eq(charges_of(s, "idempotency_key", key), [], "psp-sim charges of the key")
    e2e.log("never executed:", repr(a["reason"]))
    s.check_invariants()


def unknown_past_window(s, aid, r, looks=3):
    """The attempt stays UNKNOWN through `looks` looks past the key's
    retention and the search lag; returns the reconciler's calls."""
    def looked():
        a = attempt(s, aid)
        check(a["status"] == "UNKNOWN", lambda: "the attempt went %s: %s" % (
            a["status"], describe(s, aid)))
        listed = [c for c in calls(s, aid, s.worker_ids[r]) if c[0] == "list"]
        return len(listed) >= looks
    e2e.wait_until("%d list walks past the window" % looks, looked, 60, 0.1)
    check_eq(s.stop_reconciler(r), 0, "exit status of the reconciler after SIGTERM")
    check_eq(attempt(s, aid)["status"], "UNKNOWN", "status after the failed lists")
    return calls(s, aid, s.worker_ids[r])


def list_fails(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("list_fails", psp_args=PSP + ["--fault", "drop_after=1@%s#1" % key])
    worker_leaves_unknown(s, cmd)
    unavailable = json.dumps({"error": {"type": "api_error",
                                        "message": "list unavailable (test proxy)"}}).encode()

    def rewrite(method, path, status, body):
        if method == "GET" and path.startswith("/v1/payment_intents?"):
            return 503, unavailable
        return None
    px = ProviderProxy(s.psp_port, rewrite=rewrite)
    r = s.start_reconciler(PROVIDER_BASE_URL=px.url, **RECONCILER)
    rc = unknown_past_window(s, aid, r)
    listed = [c for c in rc if c[0] == "list"]
    check(all(c[1:3] == ("unknown", "503") for c in listed),
          "want only lists answered 503: %s" % listed)
    e2e.log("list failing: %d walks, the attempt stayed UNKNOWN" % len(listed))
    r = s.start_reconciler(**RECONCILER)
    wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=["UNKNOWN"])
    check_succeeded_from_list(s, cmd, r)
    s.check_invariants()


def list_pages(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("list_pages", psp_args=PSP + ["--fault", "drop_after=1@%s#1" % key])
    worker_leaves_unknown(s, cmd)
    for _ in range(250):  # newer than the attempt's own: it is on page 3
        other = e2e.new_command(amount=cmd["amount"])
        check_eq(psp_charge(s, other, payment_method="pm_card_chargeDeclined")["status"],
                 "requires_payment_method", "a foreign intent's status")
    r = s.start_reconciler(**RECONCILER)
    wait_status(s, aid, ["REQUIRES_REVIEW"], 60, stays=["UNKNOWN"])
    check_succeeded_from_list(s, cmd, r, pages=3)
    s.check_invariants()


def endless_list(new):
    cmd = e2e.new_command()
    aid, key = cmd["payment_attempt_id"], cmd["idempotency_key"]
    s = new("list_endless", psp_args=PSP + ["--fault", "drop_after=1@%s#1" % key])
    worker_leaves_unknown(s, cmd)
    served = [0]

    def rewrite(method, path, status, body):
        if method != "GET" or not path.startswith("/v1/payment_intents?"):
            return None
        served[0] += 1
        pi = {"id": "pi_endless%06d" % served[0], "object": "payment_intent",
              "amount": cmd["amount"], "currency": "eur", "status": "succeeded",
              "created": int(time.time()), "metadata": {"payment_attempt_id": str(uuid.uuid4())}}
        return 200, json.dumps({"object": "list", "url": "/v1/payment_intents",
                                "has_more": True, "data": [pi]}).encode()
    px = ProviderProxy(s.psp_port, rewrite=rewrite)
    r = s.start_reconciler(PROVIDER_BASE_URL=px.url, **RECONCILER)
    rc = unknown_past_window(s, aid, r, looks=2)
    listed = [c for c in rc if c[0] == "list"]
    check(all(c[1] == "unknown" and "pages" in c[3] for c in listed),
          "want list walks cut at their bound: %s" % listed)
    check(served[0] >= 200, "the proxy served %d pages for %d walks" % (served[0], len(listed)))
    e2e.log("endless list: %d walks, %d pages, the attempt stayed UNKNOWN: %r"
            % (len(listed), served[0], listed[0][3]))
    r = s.start_reconciler(**RECONCILER)
    wait_status(s, aid, ["REQUIRES_REVIEW"], 30, stays=["UNKNOWN"])
    check_succeeded_from_list(s, cmd, r)
    s.check_invariants()


SCENARIOS = [lost_charge_in_list, none_in_list, list_fails, list_pages, endless_list]


def scenario(new):
    wanted = sys.argv[1:]
    names = [f.__name__ for f in SCENARIOS]
    check(all(w in names for w in wanted), "no such scenario in %s (have %s)" % (wanted, names))
    made = []

    def tracked(*a, **k):
        s = new(*a, **k)
        made.append(s)
        return s
    try:
        for fn in [f for f in SCENARIOS if not wanted or f.__name__ in wanted]:
            t0 = time.monotonic()
            e2e.log("----", fn.__name__)
            fn(tracked)
            e2e.log("----", fn.__name__, "passed in %.1fs" % (time.monotonic() - t0))
            while made:
                made.pop().close()
            while PROXIES:
                PROXIES.pop().close()
    finally:
        while PROXIES:
            PROXIES.pop().close()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
