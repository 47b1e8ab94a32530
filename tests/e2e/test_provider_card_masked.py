#!/usr/bin/env python3
"""Card numbers in provider text never reach charged's outputs (issue 34,
breaks 7 and 8). Provider text is anyone's to write: metadata by any client
of the account, a decline code by the provider. Each reaches charged
through the provider client, masked there; the outputs are judged:

- card_in_metadata (break 7): intents psp-sim holds whose metadata carry
  card numbers (as the attempt, as the order) are audited: the auditor's
  `audit finding` log line, audit_findings, audit_intents, `chargectl audit
  show` and `audit run --json` show the last four digits only.
- card_as_decline_code (break 8): a processing charge is declined at the
  provider with a card number as its decline code; the reconciler settles
  the attempt FAILED: the attempt's reason, its transition, the
  charge.failed event, the reconciler's log and `chargectl attempt show`
  show the last four digits only.

Scenarios can be run alone: test_provider_card_masked.py card_in_metadata"""
import json

import charged_e2e as e2e
from charged_e2e import check, check_eq
import test_auditor_adversary as adv
import test_reconciler_branches as rb

PAN = "4242424242424242"
PAN_GROUPED = "4000 0566 5566 5556"


def digits_of(text):
    """The card numbers text shows whole (grouped or not)."""
    flat = text.replace(" ", "")
    return [p for p in (PAN, PAN_GROUPED.replace(" ", "")) if p in flat]


def no_card(what, text):
    check(not digits_of(text), "%s shows a card number: %s" % (
        what, text[max(0, text.find(PAN[:6]) - 200):][:600]))


def card_in_metadata(new):
    s = new("mask_metadata")
    at = int(adv.db_now(s)) - 20
    by_attempt = adv.inject(s, created=at, amount=321,
                            metadata={"payment_attempt_id": PAN, "order_id": PAN_GROUPED})[0]
    by_order = adv.inject(s, created=at, amount=654, metadata={"order_id": PAN})[0]
    au = s.start_auditor(AUDITOR_FROM=at, **adv.AUDITOR)
    adv.wait_watermark(s, at + 1)
    kinds = {f["object"]: f["kind"] for f in adv.findings(s)}
    check_eq((kinds.get(by_attempt), kinds.get(by_order)),
             ("charged_unbooked", "unknown_intent"), "findings of the two intents")
    rc, run_out, err = s.audit("run", "--since", "%ds" % (int(adv.db_now(s)) - at + 2),
                               "--json")
    check_eq(rc, 1, "chargectl audit run over the two intents (%s)" % err)
    wid = s.query("SELECT id FROM audit_windows WHERE scheduled AND"
                  " window_start <= to_timestamp(%d) AND window_end > to_timestamp(%d)"
                  % (at, at))[0][0]
    rc, show_out, err = s.audit("show", wid, "--json")
    check_eq(rc, 0, "chargectl audit show %s (%s)" % (wid, err))
    check_eq(len(json.loads(show_out)["finding_rows"]), 2, "findings audit show lists")
    log = open("%s/%s.log" % (s.dir, au)).read()
    lines = [l for l in log.splitlines() if "audit finding" in l]
    check_eq(len(lines), 2, "the auditor's `audit finding` lines")
    outputs = {
        "the auditor's `audit finding` lines": "\n".join(lines),
        "audit_findings": json.dumps(s.query("SELECT row_to_json(f)::text"
                                             " FROM audit_findings f")),
        "audit_intents": json.dumps(s.query("SELECT row_to_json(i)::text"
                                            " FROM audit_intents i")),
        "chargectl audit show --json": show_out,
        "chargectl audit run --json": run_out,
    }
    for what, text in outputs.items():
        no_card(what, text)
    check("************4242" in outputs["audit_findings"],
          "audit_findings keeps the last four digits of the masked attempt: %s"
          % outputs["audit_findings"][:600])
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


def card_as_decline_code(new):
    cmd = e2e.new_command(payment_method="pm_card_processing")
    aid = cmd["payment_attempt_id"]
    s = new("mask_decline")
    a = rb.worker_leaves(s, cmd, want="PROCESSING")
    s.psp_put("/intents/%s/settle" % a["ppid"],
              {"status": "requires_payment_method", "decline_code": PAN}, method="POST")
    r = s.start_reconciler(**rb.RECONCILER)
    rb.wait_status(s, aid, ["FAILED"], e2e.scaled(30), stays=["PROCESSING"])
    charge = [c for c in s.ledger() if c["payment_intent_id"] == a["ppid"]]
    check_eq([c["outcome"] for c in charge], ["declined"], "psp-sim's outcome of the charge")
    p = s.run([e2e.CHARGECTL, "attempt", "show", aid, "--json"])
    shown = p.stdout.decode()
    outputs = {
        "the attempt's reason": rb.attempt(s, aid)["reason"],
        "its transitions": json.dumps(rb.transitions(s, aid)),
        "its charge.failed event": json.dumps(s.query(
            "SELECT payload::text FROM outbox WHERE payment_attempt_id = '%s'"
            " AND event_type = 'charge.failed'" % aid)),
        "the reconciler's log": open("%s/%s.log" % (s.dir, r)).read(),
        "chargectl attempt show --json": shown,
    }
    check(outputs["its charge.failed event"] != "[]", "no charge.failed event for %s" % aid)
    for what, text in outputs.items():
        no_card(what, text)
    check("4242" in outputs["the attempt's reason"],
          "the reason keeps the decline code's last four digits: %r"
          % outputs["the attempt's reason"])


SCENARIOS = [card_in_metadata, card_as_decline_code]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
