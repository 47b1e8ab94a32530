#!/usr/bin/env python3
"""Bad input: each rule of the command schema broken once goes to the DLQ
with its reason and the contract's headers, key and value kept (card digits
masked), and the good commands behind them are charged."""
import json

import charged_e2e as e2e
from charged_e2e import check, check_eq

CARD = "4242424242424242"


def cmd_json(c):
    return json.dumps(c)


def case(reason, key, value=None, value_hex=None, headers=()):
    rec = {"key": key, "headers": [list(h) for h in headers]}
    if value_hex is not None:
        rec["value_hex"] = value_hex
    else:
        rec["value"] = value
    return reason, rec


def bad_records():
    def good(**kw):
        c = e2e.new_command()
        c.update(kw)
        return c

    def with_key(c):
        return c["payment_attempt_id"]

    cases = []
    c = good()
    cases.append(case("malformed_json", with_key(c), '{"type": "charge.requested", '))
    c = good(amount="1000")
    cases.append(case("schema_violation", with_key(c), cmd_json(c)))  # wrong type
    c = good()
    del c["currency"]
    cases.append(case("schema_violation", with_key(c), cmd_json(c)))  # missing field
    c = good()
    cases.append(case("key_mismatch", "not-the-attempt-id", cmd_json(c)))
    c = good(currency="eur")
    cases.append(case("schema_violation", with_key(c), cmd_json(c)))
    c = good(currency="XYZ")
    cases.append(case("schema_violation", with_key(c), cmd_json(c)))
    for amount in (0, -5, 100000000001):
        c = good(amount=amount)
        cases.append(case("schema_violation", with_key(c), cmd_json(c)))
    c = good(idempotency_key="k" * 129)
    cases.append(case("schema_violation", with_key(c), cmd_json(c)))
    c = good(payment_method=CARD)
    cases.append(case("card_data_refused", with_key(c), cmd_json(c),
                      headers=[("trace", "card " + CARD)]))
    c = good(metadata={"note": "4242 4242 4242 4242"})
    cases.append(case("card_data_refused", with_key(c), cmd_json(c)))
    c = good()
    raw = cmd_json(c).replace('"pm_card_visa"', '"pm_\xff"').encode("latin-1")
    cases.append(case("invalid_utf8", with_key(c), value_hex=raw.hex()))
    c = good(metadata={"blob": "x" * 400})
    cases.append(case("oversized", with_key(c), "x" * (1024 * 1024)))
    c = good()
    cases.append(case("empty_value", with_key(c), ""))
    c = good()
    cases.append(case("key_mismatch", None, cmd_json(c)))  # null key
    c = good(version=2)
    cases.append(case("schema_violation", with_key(c), cmd_json(c)))
    return cases


def scenario(new):
    s = new("bad_input")
    s.start_worker()
    cases = bad_records()
    goods = [e2e.new_command() for _ in range(20)]
    s.produce_raw([rec for _, rec in cases])
    s.publish(goods)
    s.wait_settled(len(goods), timeout=180)
    letters = e2e.wait_until("every dead letter", lambda: (
        lambda d: d if len(d) >= len(cases) else None)(s.dead_letters()), 60)
    check(len(letters) == len(cases), "%d dead letters for %d bad records" % (
        len(letters), len(cases)))
    required = ["dlq.reason", "dlq.error", "dlq.original.topic", "dlq.original.partition",
                "dlq.original.offset", "dlq.original.timestamp", "dlq.consumer.group",
                "dlq.worker", "dlq.failed_at"]
    seen = {}
    for d in letters:
        h = dict((x[0], x[1]) for x in d["headers"])
        for name in required:
            check(name in h, "dead letter without header %s: %s" % (name, h))
        check_eq(h["dlq.original.topic"], s.topics["commands"], "dlq.original.topic of %s" % h)
        check_eq(h["dlq.consumer.group"], s.group, "dlq.consumer.group of %s" % h)
        seen.setdefault(h["dlq.reason"], []).append(d)
        text = json.dumps(d)
        check(CARD not in text and "4242 4242 4242 4242" not in text,
              "card digits in " + text[:300])
    for reason, rec in cases:
        matches = [d for d in seen.get(reason, []) if d["key"] == rec["key"]]
        check(matches, "no %s dead letter for key %s" % (reason, rec["key"]))
    # Byte for byte (but for masking): the oversized and the invalid UTF-8 ones.
    big = [d for d in seen["oversized"]][0]
    check_eq(len(big["value"]), 1024 * 1024, "length of the oversized dead letter's value")
    bad = [d for d in seen["invalid_utf8"]][0]
    want = [rec for r, rec in cases if r == "invalid_utf8"][0]["value_hex"]
    check_eq(bad["value"], {"hex": want}, "value of the invalid_utf8 dead letter")
    card = [d for d in seen["card_data_refused"] if d["headers"][0][0] == "trace"][0]
    check_eq(card["headers"][0][1], "card ************4242",
             "the card letter's trace header (masked)")
    check("************4242" in card["value"],
          "the card letter's value is not masked to ************4242: %s" % card["value"])
    for g in goods:
        rows = s.query("SELECT status FROM payment_attempts WHERE id = '%s'" % g["payment_attempt_id"])
        check_eq(rows, [["SUCCEEDED"]], "status of good command %s" % g["payment_attempt_id"])
    check_eq(int(s.query("SELECT count(*) FROM payment_attempts")[0][0]), len(goods),
             "attempts recorded (only the good commands)")
    s.check_invariants()


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
