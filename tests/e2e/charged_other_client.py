"""Another client of the same provider account: a second integration, a
dashboard user or a script that calls psp-sim's API with its own
idempotency keys and writes whatever metadata it likes (metadata is
anyone's to write). Python standard library only."""

import json
import urllib.error
import urllib.parse
import urllib.request
import uuid

import charged_e2e as e2e


def post(s, path, form):
    """POSTs form (a dict) to psp-sim's provider API of scenario s under a
    key of this client's own; returns (status, JSON answer)."""
    req = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (s.psp_port, path),
        data=urllib.parse.urlencode(form).encode(), method="POST",
        headers={"Authorization": "Bearer " + e2e.API_KEY,
                 "Idempotency-Key": "other-client-" + uuid.uuid4().hex,
                 "Content-Type": "application/x-www-form-urlencoded"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def charge_naming(s, cmd, payment_method):
    """A charge of this client's own whose metadata names the attempt and
    order of charge command cmd, for the same amount and currency: the
    intent (the error's payment_intent for a decline)."""
    st, doc = post(s, "/v1/payment_intents", {
        "amount": cmd["amount"], "currency": cmd["currency"].lower(),
        "payment_method": payment_method, "confirm": "true",
        "metadata[payment_attempt_id]": cmd["payment_attempt_id"],
        "metadata[order_id]": cmd["order_id"]})
    intent = doc.get("error", {}).get("payment_intent") if st != 200 else doc
    e2e.check(intent and intent.get("id"), "the other client's charge: %d %s" % (st, doc))
    return intent


def refund_naming(s, intent, refund_cmd, amount):
    """A refund of this client's own on intent whose metadata names refund
    command refund_cmd and its attempt: the refund."""
    st, doc = post(s, "/v1/refunds", {
        "payment_intent": intent, "amount": amount,
        "metadata[refund_id]": refund_cmd["refund_id"],
        "metadata[payment_attempt_id]": refund_cmd["payment_attempt_id"]})
    e2e.check(st == 200, "the other client's refund: %d %s" % (st, doc))
    return doc


def webhook_events(s, object_id):
    """(event_type, outcome, reason) of every event the api recorded about
    provider object object_id, in the order received."""
    # The reason column came with the rule (a schema without it: "").
    has_reason = s.query("SELECT count(*) FROM information_schema.columns WHERE"
                         " table_name = 'processed_webhook_events'"
                         " AND column_name = 'reason'") == [["1"]]
    return s.query(
        "SELECT event_type, outcome, %s FROM processed_webhook_events"
        " WHERE payload->'data'->'object'->>'id' = '%s' ORDER BY received_at"
        % ("coalesce(reason, '')" if has_reason else "''", object_id))
