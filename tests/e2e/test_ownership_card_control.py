#!/usr/bin/env python3
"""A card number another client writes into metadata, its groups split by
control characters, reaches the audit's outputs whole (issue 34,
adversary; break 7 again).

Metadata is anyone's to write. Another client of the provider account
charges under its own key with metadata[order_id] = the card number
4242424242424242 in four groups separated by TAB (or by a zero-width
space). card_data_copy_masked (the one way provider text enters charged)
masks first and then copies the text with utf8_text_copy, which turns each
control or invisible character into a space: the mask saw no card (TAB is
no grouping), the copy then prints "4242 4242 4242 4242", the grouping
cards are printed in. The auditor's finding (audit_findings.order_id), its
copy (audit_intents.order_id) and its `audit finding` log line show the
whole number. test_provider_card_masked's card_in_metadata (spaces) passes."""
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq
import test_auditor_adversary as adv

PAN = "4242424242424242"
SEPARATORS = {"tab": "\t", "zero_width_space": "\u200b"}


def flat(text):
    return "".join(ch for ch in text if ch.isdigit() or ch == "*")


def card_split_by_control(new):
    s = new("own_card_control")
    at = int(adv.db_now(s)) - 1
    made = {}
    for name, sep in SEPARATORS.items():
        written = sep.join(PAN[i:i + 4] for i in range(0, 16, 4))
        st, doc = other.post(s, "/v1/payment_intents", {
            "amount": 777, "currency": "usd", "payment_method": "pm_card_visa",
            "confirm": "true", "metadata[order_id]": written})
        check_eq(st, 200, "the other client's charge (%s)" % name)
        made[doc["id"]] = name
    au = s.start_auditor(AUDITOR_FROM=at, **adv.AUDITOR)
    adv.wait_watermark(s, int(adv.db_now(s)) + 1, timeout=e2e.scaled(30))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")
    outputs = {}
    for pi, name in made.items():
        outputs["audit_findings.order_id (%s)" % name] = "".join(r[0] for r in s.query(
            "SELECT coalesce(order_id, '') FROM audit_findings WHERE object_id = '%s'" % pi))
        outputs["audit_intents.order_id (%s)" % name] = "".join(r[0] for r in s.query(
            "SELECT coalesce(order_id, '') FROM audit_intents WHERE id = '%s'" % pi))
    check(all(outputs.values()), "the audit recorded the intents: %s" % outputs)
    log = open("%s/%s.log" % (s.dir, au)).read()
    outputs["the auditor's log"] = "\n".join(l for l in log.splitlines()
                                            if "audit finding" in l)
    leaks = {what: text for what, text in outputs.items() if PAN in flat(text)}
    check(not leaks, "card number %s shown whole: %s" % (PAN, leaks))


SCENARIOS = [card_split_by_control]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
