#!/usr/bin/env python3
"""tools/chaos's verdict rows of authorizations, captures and voids (and
the charge rows and result-event row they share), on small synthetic
ledgers and table snapshots: no stack, no run. On a clean world every row
is 0; each case plants one violation (the rule turned off: what the
provider's books or charged's tables would hold if it were broken) and the
rows must count exactly it. docs/testing-chaos.md describes the rows."""
import copy
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "examples", "order_service"))


def load_chaos():
    loader = importlib.machinery.SourceFileLoader("chaos_tool",
                                                  os.path.join(ROOT, "tools", "chaos"))
    spec = importlib.util.spec_from_loader("chaos_tool", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


chaos = load_chaos()
FOREIGN = "other-client:00000000-0000-4000-8000-00000000000f"
OTHER = {FOREIGN: {"object": "charge", "key": FOREIGN}}


def attempt(aid, amount, status, ppid, method="manual", captured=None, refunded=0):
    return {"order": "o-" + aid, "key": "chaos:" + aid, "amount": amount, "status": status,
            "ppid": ppid, "method": method, "captured": captured, "refunded": refunded}


def charge_row(aid, pi, outcome, amount, kind="authorization", authorized=None):
    r = {"kind": kind, "idempotency_key": "chaos:" + aid, "payment_intent_id": pi,
         "payment_attempt_id": aid, "order_id": "o-" + aid, "outcome": outcome,
         "amount": amount}
    if kind == "authorization":
        r["amount_authorized"] = authorized
    return r


def capture_row(cid, aid, pi, amount, asked, key=None):
    return {"kind": "capture", "idempotency_key": key or "chaos-capture:" + cid,
            "payment_intent_id": pi, "payment_attempt_id": aid, "order_id": "o-" + aid,
            "amount": amount, "amount_to_capture": asked, "currency": "eur"}


def event(aid, type_, refund="", capture="", void=""):
    return {"attempt": aid, "refund": refund, "type": type_, "capture": capture, "void": void}


def clean():
    """A charge; an authorization captured in part (a second capture
    REJECTED) then refunded in part; one captured whole; one voided (a
    capture after it REJECTED); one held (a refund of it REJECTED); one
    declined; one expired at the provider, VOIDED."""
    ledger = {
        "charges": [charge_row("a1", "pi_a1", "succeeded", 1000, kind="charge"),
                    charge_row("a2", "pi_a2", "succeeded", 600, authorized=1000),
                    charge_row("a3", "pi_a3", "canceled", 1000, authorized=1000),
                    charge_row("a4", "pi_a4", "requires_capture", 1000, authorized=1000),
                    charge_row("a5", "pi_a5", "declined", 1000, authorized=1000),
                    charge_row("a6", "pi_a6", "succeeded", 800, authorized=800),
                    charge_row("a7", "pi_a7", "canceled", 900, authorized=900)],
        "captures": [capture_row("c2", "a2", "pi_a2", 600, 600),
                     capture_row("c6", "a6", "pi_a6", 800, None)],
        "cancels": [{"kind": "void", "idempotency_key": "chaos-void:v3",
                     "payment_intent_id": "pi_a3", "payment_attempt_id": "a3",
                     "amount_released": 1000}],
        "expiries": [{"kind": "expiry", "idempotency_key": None, "payment_intent_id": "pi_a7",
                      "payment_attempt_id": "a7", "amount_released": 900}],
        "refunds": [{"idempotency_key": "chaos-refund:r2", "payment_intent_id": "pi_a2",
                     "provider_refund_id": "re_2", "amount": 500, "status": "succeeded"}],
    }
    t = {
        "attempts": {"a1": attempt("a1", 1000, "SUCCEEDED", "pi_a1", method="automatic"),
                     "a2": attempt("a2", 1000, "SUCCEEDED", "pi_a2", captured=600,
                                   refunded=500),
                     "a3": attempt("a3", 1000, "VOIDED", "pi_a3"),
                     "a4": attempt("a4", 1000, "AUTHORIZED", "pi_a4"),
                     "a5": attempt("a5", 1000, "FAILED", "pi_a5"),
                     "a6": attempt("a6", 800, "SUCCEEDED", "pi_a6", captured=800),
                     "a7": attempt("a7", 900, "VOIDED", "pi_a7")},
        "refunds": {"r2": {"attempt": "a2", "amount": 500, "status": "SUCCEEDED",
                           "prid": "re_2", "reason": "", "key": "chaos-refund:r2"},
                    "r4": {"attempt": "a4", "amount": 100, "status": "REJECTED", "prid": "",
                           "reason": "not_refundable", "key": "chaos-refund:r4"}},
        "captures": {
            "c2": {"attempt": "a2", "key": "chaos-capture:c2", "amount": 600, "captured": 600,
                   "status": "SUCCEEDED", "intent": "pi_a2", "reason": ""},
            "c2b": {"attempt": "a2", "key": "chaos-capture:c2b", "amount": None,
                    "captured": None, "status": "REJECTED", "intent": "",
                    "reason": "already_captured"},
            "c3": {"attempt": "a3", "key": "chaos-capture:c3", "amount": None,
                   "captured": None, "status": "REJECTED", "intent": "",
                   "reason": "capture_after_void"},
            "c6": {"attempt": "a6", "key": "chaos-capture:c6", "amount": None, "captured": 800,
                   "status": "SUCCEEDED", "intent": "pi_a6", "reason": ""}},
        "voids": {"v3": {"attempt": "a3", "key": "chaos-void:v3", "status": "SUCCEEDED",
                         "intent": "pi_a3", "reason": ""}},
        "outbox": [event("a1", "charge.succeeded"),
                   event("a2", "authorization.succeeded"),
                   event("a2", "capture.succeeded", capture="c2"),
                   event("a2", "capture.rejected", capture="c2b"),
                   event("a2", "refund.succeeded", refund="r2"),
                   event("a3", "authorization.succeeded"),
                   event("a3", "void.succeeded", void="v3"),
                   event("a3", "capture.rejected", capture="c3"),
                   event("a4", "authorization.succeeded"),
                   event("a4", "refund.rejected", refund="r4"),
                   event("a5", "authorization.failed"),
                   event("a6", "authorization.succeeded"),
                   event("a6", "capture.succeeded", capture="c6"),
                   event("a7", "authorization.succeeded"),
                   event("a7", "void.succeeded")],
    }
    return ledger, t


def counts(ledger, t):
    rows = (chaos.charge_rows(ledger, t, OTHER) + chaos.step_rows(ledger, t, OTHER)
            + [chaos.silent_row(t)])
    return {r["row"].split(" (")[0]: r["count"] for r in rows}


def drop_event(t, **match):
    before = len(t["outbox"])
    t["outbox"] = [e for e in t["outbox"] if any(e[k] != v for k, v in match.items())]
    if len(t["outbox"]) != before - 1:
        raise RuntimeError("no single event %s" % match)


def plant_steps_unsettled_capture(ledger, t):
    t["captures"]["c2b"]["status"] = "UNKNOWN"


def plant_steps_unsettled_void(ledger, t):
    t["voids"]["v4"] = {"attempt": "a4", "key": "chaos-void:v4", "status": "PROCESSING",
                        "intent": "pi_a4", "reason": ""}


def plant_second_capture_at_provider(ledger, t):
    ledger["captures"].append(capture_row("x", "a2", "pi_a2", 100, 100, key=FOREIGN))


def plant_second_capture_succeeded(ledger, t):
    t["captures"]["c2b"].update(status="SUCCEEDED", captured=600, intent="pi_a2")
    t["outbox"].append(event("a2", "capture.succeeded", capture="c2b"))


def plant_captured_past_hold(ledger, t):
    ledger["charges"][1]["amount_authorized"] = 500


def plant_captured_past_asked_provider(ledger, t):
    ledger["captures"][0]["amount_to_capture"] = 500


def plant_captured_past_asked_ours(ledger, t):
    t["captures"]["c2"]["amount"] = 500


def plant_captured_past_amount_books(ledger, t):
    t["attempts"]["a6"]["amount"] = 700


def plant_captured_after_void(ledger, t):
    ledger["captures"].append(capture_row("x", "a3", "pi_a3", 100, 100, key=FOREIGN))


def plant_captured_after_expiry(ledger, t):
    ledger["captures"].append(capture_row("x", "a7", "pi_a7", 100, 100, key=FOREIGN))


def plant_capture_and_void_both_succeeded(ledger, t):
    t["voids"]["v6"] = {"attempt": "a6", "key": "chaos-void:v6", "status": "SUCCEEDED",
                        "intent": "pi_a6", "reason": ""}
    t["outbox"].append(event("a6", "void.succeeded", void="v6"))
    ledger["cancels"].append({"kind": "void", "idempotency_key": "chaos-void:v6",
                              "payment_intent_id": "pi_a6", "payment_attempt_id": "a6"})


def plant_refund_of_held(ledger, t):
    ledger["refunds"].append({"idempotency_key": FOREIGN, "payment_intent_id": "pi_a4",
                              "provider_refund_id": "re_x", "amount": 100,
                              "status": "succeeded"})


def plant_refund_past_captured(ledger, t):
    ledger["refunds"].append({"idempotency_key": FOREIGN, "payment_intent_id": "pi_a2",
                              "provider_refund_id": "re_x", "amount": 101,
                              "status": "pending"})


def plant_refund_past_captured_books(ledger, t):
    t["attempts"]["a2"]["refunded"] = 601


def plant_capture_without_provider(ledger, t):
    del ledger["captures"][1]


def plant_capture_other_amount(ledger, t):
    t["captures"]["c6"]["captured"] = 700


def plant_captured_capture_failed(ledger, t):
    t["captures"]["c6"]["status"] = "FAILED"
    t["outbox"].append(event("a6", "capture.failed", capture="c6"))


def plant_captured_attempt_held(ledger, t):
    t["attempts"]["a6"]["status"] = "AUTHORIZED"


def plant_voided_attempt_held(ledger, t):
    t["attempts"]["a3"]["status"] = "AUTHORIZED"


def plant_expired_attempt_held(ledger, t):
    t["attempts"]["a7"]["status"] = "AUTHORIZED"


def plant_voided_without_release(ledger, t):
    t["attempts"]["a4"]["status"] = "VOIDED"
    t["outbox"].append(event("a4", "void.succeeded"))


def plant_void_without_provider(ledger, t):
    del ledger["cancels"][0]


def plant_partial_capture_booked_whole(ledger, t):
    ledger["charges"][1]["amount"] = 1000


def plant_capture_event_missing(ledger, t):
    drop_event(t, capture="c2", type="capture.succeeded")


def plant_authorization_event_missing(ledger, t):
    drop_event(t, attempt="a4", type="authorization.succeeded")


def plant_declined_event_missing(ledger, t):
    drop_event(t, attempt="a5", type="authorization.failed")


def plant_void_event_missing(ledger, t):
    drop_event(t, void="v3", type="void.succeeded")


def plant_rejected_capture_event_missing(ledger, t):
    drop_event(t, capture="c3", type="capture.rejected")


def plant_charge_event_missing(ledger, t):
    drop_event(t, attempt="a1", type="charge.succeeded")


# (plant, the rows it must move and by how much; every other row stays 0)
CASES = [
    (plant_steps_unsettled_capture, {"steps unsettled": 1}),
    (plant_steps_unsettled_void, {"steps unsettled": 1}),
    (plant_second_capture_at_provider, {"captures per authorization > 1": 1}),
    # Our second SUCCEEDED capture has no capture of its own at the provider.
    (plant_second_capture_succeeded, {"captures per authorization > 1": 1,
                                      "capture SUCCEEDED without its capture": 1}),
    (plant_captured_past_hold, {"captured over authorized": 1}),
    (plant_captured_past_asked_provider, {"captured over authorized": 1}),
    (plant_captured_past_asked_ours, {"captured over authorized": 1}),
    (plant_captured_past_amount_books, {"captured over authorized": 1}),
    (plant_captured_after_void, {"captured after void": 1}),
    (plant_captured_after_expiry, {"captured after void": 1}),
    # The provider's void of a captured intent is our void's too: the
    # attempt is SUCCEEDED, not VOIDED (voided but held).
    (plant_capture_and_void_both_succeeded, {"captured after void": 1, "voided but held": 1}),
    (plant_refund_of_held, {"refunds over captured": 1}),
    (plant_refund_past_captured, {"refunds over captured": 1}),
    (plant_refund_past_captured_books, {"refunds over captured": 1}),
    (plant_capture_without_provider, {"capture SUCCEEDED without its capture": 1}),
    (plant_capture_other_amount, {"capture SUCCEEDED without its capture": 1}),
    (plant_captured_capture_failed, {"captured but not SUCCEEDED": 1}),
    # The attempt held though the provider captured: the charge row says so too.
    (plant_captured_attempt_held, {"captured but not SUCCEEDED": 1,
                                   "charged but not SUCCEEDED": 1}),
    (plant_voided_attempt_held, {"voided but held": 1}),
    (plant_expired_attempt_held, {"voided but held": 1}),
    (plant_voided_without_release, {"VOIDED without its void": 1}),
    # Both the attempt and its void have nothing at the provider.
    (plant_void_without_provider, {"VOIDED without its void": 2}),
    (plant_partial_capture_booked_whole, {"SUCCEEDED without its charge": 1}),
    # The capture and its authorization (SUCCEEDED: capture.succeeded) both lack it.
    (plant_capture_event_missing, {"settled without its result event": 2}),
    (plant_authorization_event_missing, {"settled without its result event": 1}),
    (plant_declined_event_missing, {"settled without its result event": 1}),
    (plant_void_event_missing, {"settled without its result event": 2}),
    (plant_rejected_capture_event_missing, {"settled without its result event": 1}),
    (plant_charge_event_missing, {"settled without its result event": 1}),
]
STEP_ROWS = ("steps unsettled", "captures per authorization > 1", "captured over authorized",
             "captured after void", "refunds over captured",
             "capture SUCCEEDED without its capture", "captured but not SUCCEEDED",
             "voided but held", "VOIDED without its void", "settled without its result event")


def main():
    passed, failed = 0, 0

    def result(ok, what):
        nonlocal passed, failed
        if ok:
            passed += 1
        else:
            failed += 1
            print("FAIL %s" % what)

    base = counts(*clean())
    result(set(STEP_ROWS) <= set(base), "rows missing from the verdict: %s"
           % sorted(set(STEP_ROWS) - set(base)))
    result(not any(base.values()), "clean world: %s" % {k: v for k, v in base.items() if v})
    planted = set()
    for plant, want in CASES:
        ledger, t = clean()
        plant(ledger, t)
        got = {k: v for k, v in counts(ledger, t).items() if v}
        result(got == want, "%s: rows %s, want %s" % (plant.__name__, got, want))
        planted |= set(want)
    result(set(STEP_ROWS) <= planted, "rows no case turns off: %s"
           % sorted(set(STEP_ROWS) - planted))
    # The rows read only what they are given: the clean world is unchanged.
    ledger, t = clean()
    snapshot = copy.deepcopy((ledger, t))
    counts(ledger, t)
    result((ledger, t) == snapshot, "the rows changed their input")
    # An authorization's workload draws nothing with --authorizations 0.
    a, b = chaos.Workload(5), chaos.Workload(5, 0.0)
    result(a.wave(40, {}, False) == b.wave(40, {}, False, set()),
           "--authorizations 0 changed the workload")
    w = chaos.Workload(5, 0.5)
    recs = w.wave(60, {}, False)
    auth = {m["cmd"]["payment_attempt_id"] for _, m in recs if m["kind"] == "authorization"}
    kinds = {m["kind"] for _, m in w.wave(200, {}, False, auth)}
    result({"capture_full", "capture_partial", "void"} <= kinds,
           "steps of authorized ones: kinds %s" % sorted(kinds))
    # --profile production: the stack's own faults instead of the single
    # broker's kill and PostgreSQL's stop, the rest (the roles' SIGKILLs
    # too) as on the default stack.
    import random
    base = chaos.schedule(random.Random(9), 100.0, 25, True)
    prod = chaos.schedule(random.Random(9), 100.0, 25, True, production=True)
    stack = lambda ev: sorted(e[1] for e in ev if e[1] != "kill")
    result(stack(base) == ["broker", "pg_terminate", "pg_terminate", "postgres", "psp"],
           "default schedule's stack faults: %s" % stack(base))
    result(stack(prod) == ["kafka_coordinator", "kafka_leader", "kafka_leader", "pg_failover",
                           "pg_terminate", "pg_terminate", "pgbouncer", "psp"],
           "production schedule's stack faults: %s" % stack(prod))
    result(sorted(e[2][0] for e in prod if e[1] == "kafka_leader") == ["commands", "results"],
           "production schedule's leaders: %s" % [e[2] for e in prod if e[1] == "kafka_leader"])
    result([e for e in base if e[1] == "kill"] == [e for e in prod if e[1] == "kill"],
           "the profile changed the SIGKILLs of the roles")
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
