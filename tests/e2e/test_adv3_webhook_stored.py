#!/usr/bin/env python3
"""Adversary 3: the stored copy of a provider webhook against the seam's
claims (docs/api.md; common/provider/stripe/stripe_event.c): card numbers
are masked in processed_webhook_events.payload, whoever wrote them, and the
provider's ids are kept as written under id keys outside metadata.

- card_in_metadata_key (break 1): another client of the account charges an
  intent of its own and refunds it with metadata KEYS that carry a card
  number (metadata is anyone's to write; psp-sim, as Stripe, takes any key
  of 1..40 characters). psp-sim delivers refund.created signed to the api,
  which stores the event: the copy holds the card number whole. The same
  text as a metadata value is masked; a key is not masked at all, and the
  final mask of the dump cannot see a number next to a letter or grouped
  by '.'.
(Its break 2, an id "pi_4242424242424242" masked in the stored copy, is not
fixed yet; its scenario stays on the attack's branch until it is.)

Judged from the database (the rows the api stored) of the real api, fed by
psp-sim's own signed deliveries. Scenarios can be run alone."""
import json
import re
import uuid

import charged_api as api
import charged_e2e as e2e
import charged_other_client as other
from charged_e2e import check, check_eq

PAN = "4242424242424242"
KEYS = ["x" + PAN, "4242.4242.4242.4242"]


def card_shown(text):
    """The card number as text shows it, in any grouping of '.', ' ', '-'
    or an escaped TAB/NBSP."""
    flat = re.sub(r"\\u[0-9a-fA-F]{4}|\\t|[ .\-]", "", text)
    return PAN in flat


def stack(new, name):
    port = e2e.free_port()
    s = new(name, partitions=1, psp_args=api.psp_webhook_args(port))
    api.start_api(s, port=port)
    return s


def card_in_metadata_key(new):
    s = stack(new, "adv3_key")
    st, pi = other.post(s, "/v1/payment_intents", {
        "amount": 700, "currency": "eur", "payment_method": "pm_card_visa",
        "confirm": "true"})
    check_eq((st, pi.get("status")), (200, "succeeded"), "the other client's charge %s" % pi)
    form = {"payment_intent": pi["id"], "amount": 300}
    for k in KEYS:
        form["metadata[%s]" % k] = "v"
    st, re_ = other.post(s, "/v1/refunds", form)
    check_eq(st, 200, "the other client's refund %s" % re_)
    e2e.log("refund", re_["id"], "metadata", re_.get("metadata"))
    rows = e2e.wait_until("the api to store the refund's events", lambda: s.query(
        "SELECT event_id, event_type, outcome, payload::text FROM processed_webhook_events"
        " WHERE payload->'data'->'object'->>'id' = '%s'" % re_["id"]), 30)
    for event_id, kind, outcome, payload in rows:
        e2e.log("stored", event_id, kind, outcome, payload)
        check(not card_shown(payload),
              "the stored copy of %s (%s, %s) holds card number %s in a metadata key: %s"
              % (event_id, kind, outcome, PAN, payload))


SCENARIOS = [card_in_metadata_key]

if __name__ == "__main__":
    raise SystemExit(e2e.main(e2e.run_scenarios(SCENARIOS)))
