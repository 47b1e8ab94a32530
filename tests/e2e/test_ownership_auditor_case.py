#!/usr/bin/env python3
"""The auditor pages an order paid twice whatever case another client wrote
its order id in (issue 34, adversary).

Metadata is anyone's text. Another client of the provider account charges
order O under its own key, its metadata naming O's id in upper case and no
attempt (an integration that prints UUIDs in upper case). No attempt of O
exists yet: the auditor judges that charge unknown_intent. Then O's own
attempt is charged by charged and succeeds: psp-sim's ledger shows O paid
twice. The paid side must find the stray charge (auditor.md: "whichever of
the two intents is judged later must find the other"): charged_twice,
which pages. Everything else in the auditor reads metadata ids as UUIDs
(either case); the look-up of the order-only twin from the paid side
compares the text, so an upper-case order id is never found and the double
charge stays an unknown_intent ticket in the scheduled audit (the daily
`chargectl audit run` lists the stray again and does page it: up to a day
late).

The same with the order id in lower case is test_auditor_ownership's
order_only_before_its_attempt, which passes."""
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq
import test_auditor_adversary as adv
import test_auditor_ownership as ao
import test_reconciler_branches as rb


def order_only_upper_case(new):
    cmd = e2e.new_command()
    aid, order = cmd["payment_attempt_id"], cmd["order_id"]
    s = new("own_auditor_case")
    t0 = int(adv.db_now(s)) - 1
    st, stray = other.post(s, "/v1/payment_intents", {
        "amount": cmd["amount"], "currency": cmd["currency"].lower(),
        "payment_method": "pm_card_visa", "confirm": "true",
        "metadata[order_id]": order.upper()})
    check_eq((st, stray.get("status")), (200, "succeeded"), "the other client's charge")
    stray = stray["id"]
    au = s.start_auditor(AUDITOR_FROM=t0, **adv.AUDITOR)
    e2e.wait_until("the stray charge judged", lambda: ao.findings_of(s, stray),
                   e2e.scaled(20))
    e2e.log("stray %s audited before any attempt of its order: %s"
            % (stray, ao.findings_of(s, stray)))
    s.start_worker()
    s.publish([cmd])
    s.wait_settled(1, timeout=e2e.scaled(60))
    a = rb.attempt(s, aid)
    check_eq(a["status"], "SUCCEEDED", "the order's attempt")
    own = a["ppid"]
    paid = sorted(c["payment_intent_id"] for c in s.ledger()
                  if c["order_id"].lower() == order and c["outcome"] == "succeeded")
    check_eq(paid, sorted([own, stray]), "psp-sim's succeeded charges of order %s" % order)
    # Past the window of O's own charge, and a few polls more.
    adv.wait_watermark(s, int(adv.db_now(s)) + 2, timeout=e2e.scaled(30))
    try:
        e2e.wait_until("charged_twice of order %s's stray charge" % order,
                       lambda: "charged_twice" in ao.findings_of(s, stray), e2e.scaled(10))
    except e2e.Failure:
        check(False, "order %s is paid twice at the provider (%s, then %s), yet the"
              " auditor's findings of the stray charge are %s: no page" % (
                  order, stray, own, ao.findings_of(s, stray)))
    check_eq(ao.findings_of(s, stray)["charged_twice"], ("", own),
             "the stray charge's charged_twice (attempt, other object)")
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


SCENARIOS = [order_only_upper_case]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
