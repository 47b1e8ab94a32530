#!/usr/bin/env python3
"""chargectl attempt show and the console's attempt endpoint show an
authorization's steps (issue 37): each capture and void with its id,
status, amount and captured_amount, reason, and their transitions in one
time order with the attempt's own. The rows are planted as the capture and
void operations write them (migrations 0016-0018), on an authorization psp-sim
holds. The JSON is additive: every member show had before is still there,
the attempt's own transitions still its own."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_console as con  # noqa: E402
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check, check_eq  # noqa: E402
import test_auditor_steps as steps  # noqa: E402

OLD_MEMBERS = ("payment_attempt_id", "order_id", "status", "amount", "currency",
               "provider_payment_id", "transitions", "provider_call_log", "ledger_entries",
               "result_events", "refunds")


def show(s, attempt, *extra):
    p = s.run([e2e.CHARGECTL, "attempt", "show", attempt] + list(extra), check=False)
    check_eq(p.returncode, 0, "chargectl attempt show %s: %s" % (attempt, p.stderr.decode()))
    return p.stdout.decode()


def check_steps(where, doc, auth, capture, loser):
    """What an authorization's show must say of its steps, wherever."""
    caps, voids, timeline = doc["captures"], doc["voids"], doc["timeline"]
    check_eq([(c["capture_id"], c["status"], c["amount"], c["captured_amount"], c["currency"])
              for c in caps], [(capture, "SUCCEEDED", 600, 600, "EUR")],
             "%s: the capture" % where)
    check_eq([(t["old_status"], t["new_status"]) for t in caps[0]["transitions"]],
             [(None, "PENDING"), ("PENDING", "PROCESSING"), ("PROCESSING", "SUCCEEDED")],
             "%s: the capture's transitions" % where)
    check_eq([(v["void_id"], v["status"], v["reason"], v["void_reason"]) for v in voids],
             [(loser, "REJECTED", "authorization_held", "abandoned")],
             "%s: the void that lost" % where)
    check_eq([(v["old_status"], v["new_status"]) for v in voids[0]["transitions"]],
             [(None, "REJECTED")], "%s: the void's transitions" % where)
    got = [(e["step"], e["step_id"], e["new_status"]) for e in timeline]
    want = [("attempt", auth["attempt"], "PROCESSING"), ("attempt", auth["attempt"], "AUTHORIZED"),
            ("void", loser, "REJECTED"), ("capture", capture, "PENDING"),
            ("capture", capture, "PROCESSING"), ("attempt", auth["attempt"], "SUCCEEDED"),
            ("capture", capture, "SUCCEEDED")]
    check_eq(got, want, "%s: the timeline, in time order" % where)
    ats = [e["at"] for e in timeline]
    check_eq(ats, sorted(ats), "%s: timeline times" % where)


def scenario(new):
    s = new("chargectl_steps", partitions=1)
    auth = steps.authorize(s, 1000)
    s.psql(s.db, "BEGIN;%s%sCOMMIT;" % (
        steps.attempt_moved(auth, "PENDING", "PROCESSING"),
        steps.attempt_moved(auth, "PROCESSING", "AUTHORIZED")))
    plain = e2e.new_command()  # a charge: its show does not change
    s.psql(s.db, "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
           " request_fingerprint, amount, currency, payment_method, status) VALUES"
           " ('%s', '%s', '%s', 'fp', 100, 'EUR', 'pm_card_visa', 'PENDING')"
           % (plain["payment_attempt_id"], plain["order_id"], plain["idempotency_key"]))
    # Each in a transaction of its own: the instants are apart.
    loser = steps.reject_void(s, auth, "authorization_held")
    capture = steps.plant_capture(s, auth, 600)
    steps.capture_at_psp(s, auth, 600)

    doc = json.loads(show(s, auth["attempt"], "--json"))
    for k in OLD_MEMBERS:
        check(k in doc, "show --json still has %s" % k)
    check_eq((doc["status"], doc["capture_method"], doc["captured_amount"]),
             ("SUCCEEDED", "manual", 600), "the authorization captured")
    check_eq([t["new_status"] for t in doc["transitions"]],
             ["PROCESSING", "AUTHORIZED", "SUCCEEDED"], "the attempt's own transitions")
    check_steps("chargectl --json", doc, auth, capture, loser)

    text = show(s, auth["attempt"])
    for want in ("captures and voids:", "capture " + capture, "void " + loser, "6.00 EUR",
                 "authorization_held", "REJECTED", "captured_amount      6.00 EUR"):
        check(want in text, "show's text has %r:\n%s" % (want, text))
    lines = [l for l in text.splitlines() if l.startswith("20")]
    check(any(("capture " + capture) in l and "PROCESSING" in l for l in lines),
          "a capture's transition is a timeline row:\n%s" % text)

    plain_doc = json.loads(show(s, plain["payment_attempt_id"], "--json"))
    check_eq((plain_doc["captures"], plain_doc["voids"], plain_doc["capture_method"]),
             ([], [], "automatic"), "a charge has no steps")
    check("captures and voids:" not in show(s, plain["payment_attempt_id"]),
          "a charge's text shows no steps")

    # The console's attempt endpoint: the same story.
    _, port = con.start_console(s)
    viewer = con.Client(port, con.token(s, "vera", "viewer"))
    st, cdoc = viewer.get("attempts/" + auth["attempt"])
    check_eq(st, 200, "the console's attempt")
    check_steps("console", cdoc, auth, capture, loser)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
