#!/usr/bin/env python3
"""Adversary 37b: stale and contradicting provider events about our own
intents, after their step settled (psp-sim /webhooks/emit: the intent's
current state with the status of the event's type). A captured authorization
gets amount_capturable_updated (requires_capture) and canceled
(requested_by_customer, then automatic); a voided one gets succeeded and
amount_capturable_updated. Nothing may move: the captured one stays
SUCCEEDED captured 600 and booked once, the voided one VOIDED, nothing
booked, no new step or attempt event. (payment_failed is left out: dated
after the success it is `review` by design, docs/api.md.)"""
import json
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import charged_api as api  # noqa: E402
import charged_e2e as e2e  # noqa: E402
from charged_e2e import check_eq  # noqa: E402


def produce(s, cmds):
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)} for c in cmds])


def attempt(s, a):
    rows = s.query("SELECT status, coalesce(captured_amount, 0), coalesce(provider_payment_id, ''),"
                   " coalesce(reason, '') FROM payment_attempts WHERE id = '%s'"
                   % a["payment_attempt_id"])
    return rows[0] if rows else [None, 0, "", ""]


def snapshot(s, a):
    aid = a["payment_attempt_id"]
    return (attempt(s, a),
            s.query("SELECT kind, amount FROM ledger_entries WHERE payment_attempt_id = '%s'"
                    " ORDER BY 1, 2" % aid),
            s.query("SELECT event_type FROM outbox WHERE payment_attempt_id = '%s' ORDER BY 1"
                    % aid),
            s.query("SELECT status FROM capture_attempts WHERE payment_attempt_id = '%s'"
                    " UNION ALL SELECT status FROM void_attempts WHERE payment_attempt_id = '%s'"
                    % (aid, aid)))


def scenario(new):
    port = e2e.free_port()
    s = new("adv37b_stale_wh", partitions=1, psp_args=api.psp_webhook_args(port))
    api.start_api(s, port=port)
    s.start_worker()
    a, b = e2e.new_command(amount=2000), e2e.new_command(amount=1500)
    a["type"] = b["type"] = "authorization.requested"
    produce(s, [a, b])
    e2e.wait_until("held", lambda: attempt(s, a)[0] == "AUTHORIZED" and
                   attempt(s, b)[0] == "AUTHORIZED", 60)
    cid, vid = str(uuid.uuid4()), str(uuid.uuid4())
    produce(s, [{"type": "capture.requested", "version": 1, "capture_id": cid,
                 "payment_attempt_id": a["payment_attempt_id"],
                 "idempotency_key": "capture:" + cid, "amount": 600},
                {"type": "void.requested", "version": 1, "void_id": vid,
                 "payment_attempt_id": b["payment_attempt_id"],
                 "idempotency_key": "void:" + vid, "reason": "abandoned"}])
    e2e.wait_until("settled", lambda: attempt(s, a)[0] == "SUCCEEDED" and
                   attempt(s, b)[0] == "VOIDED", 60)
    e2e.wait_until("psp-sim's own events delivered",
                   lambda: s.psp_get("/webhooks")["pending"] == 0, 30)
    time.sleep(1)
    before_a, before_b = snapshot(s, a), snapshot(s, b)
    pa, pb = attempt(s, a)[2], attempt(s, b)[2]
    for pi, types in ((pa, ["payment_intent.amount_capturable_updated",
                            "payment_intent.canceled", "payment_intent.processing"]),
                      (pb, ["payment_intent.succeeded",
                            "payment_intent.amount_capturable_updated",
                            "payment_intent.processing"])):
        for t in types:
            s.psp_put("/webhooks/emit", {"intent": pi, "type": t,
                                         "id": "evt_adv37b_" + uuid.uuid4().hex[:16]},
                      method="POST")
    e2e.wait_until("the stale events delivered",
                   lambda: s.psp_get("/webhooks")["pending"] == 0, 60)
    time.sleep(2)
    e2e.log("outcomes", s.query("SELECT event_type, outcome, left(coalesce(reason, ''), 80)"
                                " FROM processed_webhook_events WHERE event_id LIKE"
                                " 'evt_adv37b_%' ORDER BY 1"))
    check_eq(snapshot(s, a), before_a, "the captured authorization after stale events")
    check_eq(snapshot(s, b), before_b, "the voided authorization after stale events")


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
