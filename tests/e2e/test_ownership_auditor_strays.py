#!/usr/bin/env python3
"""Every stray charge of an order paid twice pages, not only the oldest
(issue 34, adversary).

Another client of the provider account charges order O twice under its own
keys, its metadata naming O and no attempt, before any attempt of O exists:
the auditor judges both unknown_intent (nothing of ours was unsettled). O's
own attempt then succeeds: psp-sim's ledger shows O paid three times. The
paid side must find the stray charges (auditor.md: "whichever of the two
intents is judged later must find the other"), but SQL_INTENT_FACTS' 'oo'
look-up takes only the oldest (LIMIT 1), and a booked intent is judged once
per window: the second stray stays an unknown_intent ticket, its money
not paged by the scheduled audit (the daily `chargectl audit run` lists the
strays again and does find it: up to a day late).
test_auditor_ownership's order_only_before_its_attempt (one stray) passes
in the scheduled audit alone."""
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq
import test_auditor_adversary as adv
import test_auditor_ownership as ao
import test_reconciler_branches as rb


def order_only_two_strays(new):
    cmd = e2e.new_command()
    aid, order = cmd["payment_attempt_id"], cmd["order_id"]
    s = new("own_auditor_strays")
    t0 = int(adv.db_now(s)) - 1
    strays = []
    for _ in range(2):
        st, doc = other.post(s, "/v1/payment_intents", {
            "amount": cmd["amount"], "currency": cmd["currency"].lower(),
            "payment_method": "pm_card_visa", "confirm": "true",
            "metadata[order_id]": order})
        check_eq((st, doc.get("status")), (200, "succeeded"), "the other client's charge")
        strays.append(doc["id"])
    au = s.start_auditor(AUDITOR_FROM=t0, **adv.AUDITOR)
    e2e.wait_until("the stray charges judged",
                   lambda: all(ao.findings_of(s, x) for x in strays), e2e.scaled(20))
    e2e.log("strays audited before any attempt of their order: %s"
            % {x: ao.findings_of(s, x) for x in strays})
    s.start_worker()
    s.publish([cmd])
    s.wait_settled(1, timeout=e2e.scaled(60))
    a = rb.attempt(s, aid)
    check_eq(a["status"], "SUCCEEDED", "the order's attempt")
    own = a["ppid"]
    check_eq(ao.succeeded_of_order(s, order), sorted([own] + strays),
             "psp-sim's succeeded charges of order %s" % order)
    adv.wait_watermark(s, int(adv.db_now(s)) + 2, timeout=e2e.scaled(30))
    try:
        e2e.wait_until("charged_twice of both stray charges of order %s" % order,
                       lambda: all("charged_twice" in ao.findings_of(s, x) for x in strays),
                       e2e.scaled(10))
    except e2e.Failure:
        check(False, "order %s is paid three times at the provider (%s, then %s), yet the"
              " auditor's findings of the strays are %s" % (
                  order, strays, own, {x: ao.findings_of(s, x) for x in strays}))
    check_eq(s.stop_auditor(au), 0, "the auditor's exit after SIGTERM")


SCENARIOS = [order_only_two_strays]


if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
