#!/usr/bin/env python3
"""The message contract as files (docs/schemas) agrees with what charged
does.

1. The small validator (json_schema_check.py) rejects what it should: a
   self-test, keyword by keyword.
2. The samples of docs/messages.md, one at least of each kind of command
   (charge, authorization, capture, void, refund) and of event (charge.*,
   authorization.*, capture.*, void.*, refund.*), validate against the
   schema of their type; asyncapi.yaml names the three topics, only schema
   files that exist, and each kind as a message of its own in its channel's
   oneOf, the channel's description naming it.
3. A corpus of commands, one or more bad ones per rule of
   charge_command_parse (common/core/charge_command.c) that the schema can
   express, goes through a real worker: every command the schema refuses
   ends as a schema_violation dead letter naming the same field, every one
   it accepts is recorded (an authorization.requested among them: the same
   schema, the same rules). Rules the schema cannot express are left out of
   the bad corpus: the Kafka key (key_mismatch), the raw-byte checks
   (empty_value, oversized, card_data_refused, invalid_utf8), JSON syntax
   and duplicate fields (malformed_json), and this deployment's limits
   (amount_over_limit, currency_not_allowed). Lengths are characters (code
   points) on both sides: 255 characters of multi-byte UTF-8 are a good
   token, 256 a bad one. The known gaps, commands the schema accepts and
   the worker refuses (ISO 4217 membership, 1.0 as an integer, card
   digits, a field twice, an escaped NUL), are checked as such, so the
   schema's descriptions stay true.
4. The relay's real output validates: a worker, a reconciler and a relay
   on a few hundred commands with provider faults; every message on the
   results topic against result-event.schema.json, every dead letter's
   dlq.* headers against dead-letter-headers.schema.json.
5. Refunds, on one worker and a relay: a corpus of refund commands, good
   ones and one or more bad ones per rule of refund_command_parse
   (common/core/refund_command.c) that refund-command.schema.json
   expresses, as in 3 (the bad ones refused by the schema and dead-lettered
   schema_violation naming the field; the good ones recorded); the
   envelope and raw-byte gaps refused by the worker only; resends that
   conflict (idempotency_key_conflict, the first refund untouched). What
   the schema cannot judge, not_refundable and exceeds_charge, the
   database decides at claim time: such refunds are recorded and REJECTED
   with an event. Every refund.* event the relay publishes (succeeded,
   failed, rejected with and without the charge's order) validates against
   refund-result-event.schema.json.
6. Authorizations, captures and voids, on one worker and a relay: an
   authorization.requested is a charge command's fields under another type
   (charge-command.schema.json says both); a few authorizations held,
   declined and refused (order_has_live_attempt), one captured and one
   voided; then a corpus of capture.requested and void.requested commands,
   good ones and one or more bad ones per rule of capture_command_parse
   and void_command_parse that capture-command.schema.json and
   void-command.schema.json express, as in 3 (the bad ones refused by the
   schema and dead-lettered schema_violation naming the field, the good
   ones recorded, whatever the database then decides: REJECTED
   attempt_unknown, already_captured, capture_after_void,
   void_after_capture, authorization_voided), and a few gaps the worker
   alone refuses; last, an authorization the provider's expiry cancels
   (authorization.failed, reason expired). Every authorization.*, capture.*
   and void.* event the relay publishes (succeeded, failed, rejected with
   and without the authorization's order) validates against its schema."""
import json
import os
import random
import re
import uuid

import charged_e2e as e2e
import json_schema_check as jsc
from charged_e2e import check, check_eq

HERE = os.path.dirname(os.path.abspath(__file__))
DOCS = os.path.join(HERE, "..", "..", "docs")

COMMAND = jsc.load("charge-command.schema.json")
EVENT = jsc.load("result-event.schema.json")
DLQ_HEADERS = jsc.load("dead-letter-headers.schema.json")
REFUND_COMMAND = jsc.load("refund-command.schema.json")
REFUND_EVENT = jsc.load("refund-result-event.schema.json")
CAPTURE_COMMAND = jsc.load("capture-command.schema.json")
CAPTURE_EVENT = jsc.load("capture-result-event.schema.json")
VOID_COMMAND = jsc.load("void-command.schema.json")
VOID_EVENT = jsc.load("void-result-event.schema.json")
# A value on the results topic: its schema by the prefix of its type (the
# one thing a consumer branches on first); charge.* and authorization.*
# share result-event.schema.json.
EVENT_SCHEMAS = {"refund.": REFUND_EVENT, "capture.": CAPTURE_EVENT, "void.": VOID_EVENT,
                 "authorization.": EVENT, "charge.": EVENT}


def event_schema(ev):
    """The schema of a value on the results topic, by the prefix of its type;
    result-event.schema.json (which refuses it) for a type of no known kind."""
    t = ev.get("type") if isinstance(ev, dict) else None
    prefix = t.split(".")[0] + "." if isinstance(t, str) else None
    return EVENT_SCHEMAS.get(prefix, EVENT)


# ---- 1. the validator itself ----

def self_test():
    cases = [  # (schema, valid instances, invalid instances)
        ({"type": "integer"}, [1, -3, 1.0, 10 ** 12], [1.5, "1", True, None, [1], {}]),
        ({"type": "string"}, ["", "x"], [1, None, True, ["x"]]),
        ({"type": "object"}, [{}], [[], "x", None]),
        ({"type": ["string", "null"]}, ["x", None], [0, False, {}]),
        ({"required": ["a"]}, [{"a": None}, "not an object"], [{}, {"b": 1}]),
        ({"properties": {"a": {"type": "string"}}}, [{}, {"a": "x"}, {"b": 1}], [{"a": 1}]),
        ({"properties": {"a": {}}, "additionalProperties": False}, [{"a": 1}], [{"b": 1}]),
        ({"additionalProperties": {"type": "string"}}, [{"k": "v"}], [{"k": 1}, {"k": None}]),
        ({"propertyNames": {"minLength": 1, "maxLength": 2}}, [{"ab": 1}], [{"": 1}, {"abc": 1}]),
        ({"enum": ["a", 1]}, ["a", 1, 1.0], ["b", True, "1", None]),
        ({"const": 1}, [1, 1.0], [True, "1", 2, None]),
        ({"const": "x"}, ["x"], ["X", "x ", None]),
        ({"pattern": "^[A-Z]{3}$"}, ["EUR", 5], ["eur", "EURO", "EUR\n", "\nEUR", "EU"]),
        ({"pattern": "^[a-z.:-]{1,3}$"}, ["a.-", "::"], ["", "a/b", "abcd", "é"]),
        ({"minLength": 2, "maxLength": 3}, ["ab", "éé", "abc", 7], ["a", "abcd", ""]),
        ({"minimum": 1, "maximum": 10}, [1, 10, 5.5, "0"], [0, 11, -1, 10.01]),
        ({"maxProperties": 1}, [{}, {"a": 1}], [{"a": 1, "b": 2}]),
        ({"allOf": [{"minimum": 1}, {"maximum": 2}]}, [1, 2], [0, 3]),
        ({"if": {"properties": {"t": {"const": "s"}}}, "then": {"required": ["p"]}},
         # {} satisfies the "if" (properties requires nothing), as the spec says
         [{"t": "s", "p": 1}, {"t": "f"}], [{"t": "s"}, {}]),
        (False, [], [1, None]),
    ]
    n = 0
    for schema, goods, bads in cases:
        for v in goods:
            check(jsc.check(schema, v), lambda: "self-test: %r refused %r: %s"
                  % (schema, v, jsc.errors(schema, v)))
            n += 1
        for v in bads:
            check(not jsc.check(schema, v), "self-test: %r accepted %r" % (schema, v))
            n += 1
    for unsupported in ({"oneOf": []}, {"patternProperties": {}}, {"else": {}}, {"$ref": "#"}):
        try:
            jsc.errors(unsupported, 1)
            raise e2e.Failure("self-test: %r did not raise SchemaError" % unsupported)
        except jsc.SchemaError:
            n += 1
    # The schemas use nothing else: each validates something without SchemaError.
    for schema in (COMMAND, EVENT, DLQ_HEADERS, REFUND_COMMAND, REFUND_EVENT,
                   CAPTURE_COMMAND, CAPTURE_EVENT, VOID_COMMAND, VOID_EVENT):
        jsc.errors(schema, {})
    e2e.log("validator self-test: %d cases" % n)


# ---- 2. the documented samples, and asyncapi.yaml ----

def doc_samples():
    with open(os.path.join(DOCS, "messages.md"), encoding="utf-8") as f:
        text = f.read()
    blocks = [json.loads(b) for b in re.findall(r"```json\n(.*?)```", text, re.S)]
    command_schemas = {"charge.requested": COMMAND, "authorization.requested": COMMAND,
                       "capture.requested": CAPTURE_COMMAND, "void.requested": VOID_COMMAND,
                       "refund.requested": REFUND_COMMAND}
    commands = [b for b in blocks if b.get("type") in command_schemas]
    events = [b for b in blocks if "event_id" in b]
    kinds = sorted(set(c["type"] for c in commands) |
                   set(ev["type"].split(".")[0] + ".*" for ev in events))
    check_eq(kinds, sorted(list(command_schemas) + [p + "*" for p in EVENT_SCHEMAS]),
             "messages.md: the kinds of command and of event with a sample")
    for c in commands:
        check_eq(jsc.errors(command_schemas[c["type"]], c), [], "schema errors of the sample %s"
                 % c["type"])
    for ev in events:
        check_eq(jsc.errors(event_schema(ev), ev), [], "schema errors of the sample event %s"
                 % ev.get("type"))
    with open(os.path.join(DOCS, "schemas", "asyncapi.yaml"), encoding="utf-8") as f:
        api = f.read()
    check(re.search(r"^asyncapi: '?2\.6\.0'?$", api, re.M), "asyncapi.yaml is not AsyncAPI 2.6")
    for topic in ("payments.charge.commands", "payments.charge.results",
                  "payments.charge.commands.dlq"):
        check(re.search(r"^  %s:$" % re.escape(topic), api, re.M),
              "asyncapi.yaml has no channel %s" % topic)
    refs = re.findall(r"\$ref: '?\./([\w.-]+\.json)", api)
    check(set(refs) == {"charge-command.schema.json", "result-event.schema.json",
                        "dead-letter-headers.schema.json", "refund-command.schema.json",
                        "refund-result-event.schema.json", "capture-command.schema.json",
                        "capture-result-event.schema.json", "void-command.schema.json",
                        "void-result-event.schema.json"},
          "asyncapi.yaml refers to %s" % sorted(set(refs)))
    # Each kind a message of its own, in its channel's oneOf.
    for channel, kind, word in (("commands", "Command", "%s.requested"),
                                ("results", "Result", "%s.*")):
        body = re.search(r"^  payments\.charge\.%s:\n(.*?)^  \S" % channel, api, re.M | re.S)
        check(body, "asyncapi.yaml: no channel payments.charge.%s" % channel)
        for n in ("Charge", "Authorization", "Capture", "Void", "Refund"):
            check(re.search(r"^    %s%s:$" % (n, kind), api, re.M),
                  "asyncapi.yaml: no message %s%s" % (n, kind))
            # Commands are published and consumed (two oneOf), results consumed.
            check_eq(body.group(1).count("$ref: '#/components/messages/%s%s'" % (n, kind)),
                     2 if kind == "Command" else 1,
                     "asyncapi.yaml: %s%s in payments.charge.%s's oneOf" % (n, kind, channel))
            check(word % n.lower() in " ".join(body.group(1).split()),
                  "asyncapi.yaml: payments.charge.%s's description does not name %s"
                  % (channel, word % n.lower()))
    e2e.log("doc samples: %d command(s), %d event(s) valid; asyncapi refs %s"
            % (len(commands), len(events), sorted(set(refs))))


# ---- 3. the command corpus ----

def base(upper=False):
    a, o = str(uuid.uuid4()), str(uuid.uuid4())
    if upper:
        a, o = a.upper(), o.upper()
    return {"type": "charge.requested", "version": 1, "payment_attempt_id": a,
            "order_id": o, "idempotency_key": "attempt:" + a.lower(),
            "amount": random.randint(100, 9999), "currency": "EUR",
            "payment_method": "pm_card_visa"}


def with_(**kw):
    c = base()
    for k, v in kw.items():
        if v is DROP:
            del c[k]
        else:
            c[k] = v
    return c


DROP = object()


def good_corpus():
    goods = [base(), base(upper=True)]
    goods.append(with_(customer_id="cus_123", metadata={"cart": "c-881"}))
    goods.append(with_(customer_id=None, metadata=None))
    # An authorization is a charge command's fields under another type: the
    # same schema, recorded alike (AUTHORIZED rather than charged).
    goods.append(with_(type="authorization.requested"))
    goods.append(with_(metadata={}))
    goods.append(with_(extra_field={"nested": [1, 2, None]}, note="senders may add fields"))
    goods.append(with_(amount=1))
    goods.append(with_(amount=100000000000))
    goods.append(with_(currency="JPY"))
    goods.append(with_(idempotency_key="Ab9._:-" + "k" * 121))  # 128, every allowed class
    goods.append(with_(idempotency_key="x"))
    goods.append(with_(payment_method="p"))
    goods.append(with_(payment_method="pm_" + "x" * 252))  # 255
    goods.append(with_(customer_id="cus_" + "c" * 251))
    goods.append(with_(metadata=dict(("k%02d" % i + "m" * 37, "v" * 500) for i in range(20))))
    goods.append(with_(metadata={"e": ""}))
    # Lengths count characters, as JSON Schema does, not bytes of UTF-8: the
    # attack of issue 17 was a 100-character, 282-byte token.
    goods.append(with_(payment_method="pm_" + "\u00e9\u20ac\U0001f4b3" * 32 + "x"))  # 100
    goods.append(with_(payment_method="\u00e9" * 255))  # 510 bytes
    goods.append(with_(payment_method="\U0001f4b3" * 255))  # 1020 bytes
    goods.append(with_(customer_id="\u20ac" * 255))
    goods.append(with_(metadata={"\u00e9" * 40: "\u20ac" * 500}))
    return goods


def bad_corpus():
    """(name, JSON value, what dlq.error must name, dlq.reason): each breaks
    exactly one rule of charge_command_parse that the schema expresses."""
    meta21 = dict(("k%d" % i, "v") for i in range(21))
    rules = [
        ("not an object: array", [], "JSON object"),
        # jansson (without JSON_DECODE_ANY) reads only an object or an array at
        # the top: a scalar is refused one step earlier, as malformed_json.
        ("not an object: string", "charge.requested", "not JSON", "malformed_json"),
        ("not an object: number", 42, "not JSON", "malformed_json"),
        ("not an object: null", None, "not JSON", "malformed_json"),
        ("type missing", with_(type=DROP), "'type'"),
        ("type other", with_(type="charge.refunded"), "'type'"),
        ("type not a string", with_(type=1), "'type'"),
        ("type of an event", with_(type="authorization.succeeded"), "'type'"),
        ("version missing", with_(version=DROP), "'version'"),
        ("version 2", with_(version=2), "'version'"),
        ("version string", with_(version="1"), "'version'"),
        ("version true", with_(version=True), "'version'"),
        ("attempt id missing", with_(payment_attempt_id=DROP), "'payment_attempt_id'"),
        ("attempt id null", with_(payment_attempt_id=None), "'payment_attempt_id'"),
        ("attempt id not hex", with_(payment_attempt_id="zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"),
         "'payment_attempt_id'"),
        ("attempt id short", with_(payment_attempt_id=str(uuid.uuid4())[:35]),
         "'payment_attempt_id'"),
        ("attempt id without hyphens", with_(payment_attempt_id=uuid.uuid4().hex),
         "'payment_attempt_id'"),
        ("attempt id hyphens moved", with_(payment_attempt_id="aaaaaaaaa-aaa-aaaa-aaaa-aaaaaaaaaaaa"),
         "'payment_attempt_id'"),
        ("attempt id number", with_(payment_attempt_id=12345), "'payment_attempt_id'"),
        ("order id missing", with_(order_id=DROP), "'order_id'"),
        ("order id not a uuid", with_(order_id="order-17"), "'order_id'"),
        ("order id braces", with_(order_id="{%s}" % str(uuid.uuid4())[:34]), "'order_id'"),
        ("key missing", with_(idempotency_key=DROP), "'idempotency_key'"),
        ("key empty", with_(idempotency_key=""), "'idempotency_key'"),
        ("key 129", with_(idempotency_key="k" * 129), "'idempotency_key'"),
        ("key space", with_(idempotency_key="attempt 1"), "'idempotency_key'"),
        ("key slash", with_(idempotency_key="attempt/1"), "'idempotency_key'"),
        ("key non-ascii", with_(idempotency_key="attempt-é"), "'idempotency_key'"),
        ("key number", with_(idempotency_key=7), "'idempotency_key'"),
        ("amount missing", with_(amount=DROP), "'amount'"),
        ("amount string", with_(amount="1000"), "'amount'"),
        ("amount null", with_(amount=None), "'amount'"),
        ("amount fraction", with_(amount=10.5), "'amount'"),
        ("amount 0", with_(amount=0), "'amount'"),
        ("amount negative", with_(amount=-5), "'amount'"),
        ("amount over 1e11", with_(amount=100000000001), "'amount'"),
        ("currency missing", with_(currency=DROP), "'currency'"),
        ("currency lower", with_(currency="eur"), "'currency'"),
        ("currency 2", with_(currency="EU"), "'currency'"),
        ("currency 4", with_(currency="EURO"), "'currency'"),
        ("currency digit", with_(currency="E1R"), "'currency'"),
        ("currency number", with_(currency=978), "'currency'"),
        ("method missing", with_(payment_method=DROP), "'payment_method'"),
        ("method null", with_(payment_method=None), "'payment_method'"),
        ("method empty", with_(payment_method=""), "'payment_method'"),
        ("method 256", with_(payment_method="pm_" + "x" * 253), "'payment_method'"),
        ("method number", with_(payment_method=5), "'payment_method'"),
        ("customer empty", with_(customer_id=""), "'customer_id'"),
        ("customer 256", with_(customer_id="cus_" + "c" * 252), "'customer_id'"),
        ("customer number", with_(customer_id=7), "'customer_id'"),
        ("metadata array", with_(metadata=[]), "'metadata'"),
        ("metadata string", with_(metadata="cart=1"), "'metadata'"),
        ("metadata 21 pairs", with_(metadata=meta21), "'metadata'"),
        ("metadata number value", with_(metadata={"n": 1}), "'metadata'"),
        ("metadata null value", with_(metadata={"n": None}), "'metadata'"),
        ("metadata object value", with_(metadata={"n": {"a": "b"}}), "'metadata'"),
        ("metadata empty key", with_(metadata={"": "v"}), "'metadata'"),
        ("metadata key 41", with_(metadata={"k" * 41: "v"}), "'metadata'"),
        ("metadata value 501", with_(metadata={"k": "v" * 501}), "'metadata'"),
        ("method 256 chars of 2 bytes", with_(payment_method="\u00e9" * 256), "'payment_method'"),
        ("method 256 chars of 4 bytes", with_(payment_method="\U0001f4b3" * 256),
         "'payment_method'"),
        ("customer 256 chars of 3 bytes", with_(customer_id="\u20ac" * 256), "'customer_id'"),
        ("metadata key 41 chars", with_(metadata={"\u00e9" * 41: "v"}), "'metadata'"),
        ("metadata value 501 chars", with_(metadata={"k": "\u20ac" * 501}), "'metadata'"),
    ]
    return [(r[0], json.dumps(r[1], ensure_ascii=False), r[2],
             r[3] if len(r) > 3 else "schema_violation")
            for r in rules]


def gap_corpus():
    """(name, raw JSON text, dead-letter reason): the schema accepts these,
    the worker refuses them, as the schema's descriptions say."""
    def text(c):
        return json.dumps(c)
    c = base()
    dup = text(c)[:-1] + ', "amount": %d}' % c["amount"]
    return [
        ("currency not in ISO 4217", text(with_(currency="XYZ")), "schema_violation"),
        ("currency XXX", text(with_(currency="XXX")), "schema_violation"),
        ("version 1.0", text(with_(version=1.0)), "schema_violation"),
        ("amount 1000.0", text(with_(amount=1000.0)), "schema_violation"),
        ("amount 1e3", text(with_(amount=1)).replace('"amount": 1,', '"amount": 1e3,'),
         "schema_violation"),
        ("card digits as the method", text(with_(payment_method="4242424242424242")),
         "card_data_refused"),
        ("a field twice", dup, "malformed_json"),
        # jansson refuses the escape (PostgreSQL's jsonb could not store it).
        ("a \\u0000 in a metadata value", text(with_(metadata={"k": "a\u0000b"})),
         "malformed_json"),
    ]


def key_of(value_text):
    """The record's key: the value's payment_attempt_id when it is a string
    (so that only the rule under test can fail), else a fresh UUID."""
    try:
        v = json.loads(value_text)
        a = v.get("payment_attempt_id") if isinstance(v, dict) else None
    except ValueError:
        a = None
    return a if isinstance(a, str) and a else str(uuid.uuid4())


def corpus_scenario(new):
    goods, bads, gaps = good_corpus(), bad_corpus(), gap_corpus()
    # The schema's verdicts first.
    for c in goods:
        check_eq(jsc.errors(COMMAND, c), [], "schema errors of good command %s" % json.dumps(c)[:200])
    for name, value, want, reason in bads:
        errs = jsc.errors(COMMAND, json.loads(value))
        check(errs, "the schema accepts the bad command %r: %s" % (name, value[:200]))
    for name, value, reason in gaps:
        check_eq(jsc.errors(COMMAND, json.loads(value)), [],
                 "schema errors of %r (a documented gap: the schema accepts it)" % name)

    # Then the worker's, on the same bytes.
    s = new("contract_corpus")
    records, expect = [], {}
    for c in goods:
        # Raw UTF-8, not \u escapes: the bytes the worker counts are the
        # bytes a sender writes.
        records.append({"key": c["payment_attempt_id"], "value": json.dumps(c, ensure_ascii=False),
                        "headers": []})
    for name, value, want, reason in bads:
        k = key_of(value)
        records.append({"key": k, "value": value, "headers": []})
        expect[k] = (name, reason, want)
    for name, value, reason in gaps:
        k = key_of(value)
        records.append({"key": k, "value": value, "headers": []})
        expect[k] = (name, reason, None)
    check_eq(len(expect), len(bads) + len(gaps), "distinct keys of the refused records")
    random.shuffle(records)
    s.start_worker()
    s.produce_raw(records)

    def handled():
        n = int(s.query("SELECT count(*) FROM payment_attempts")[0][0])
        ids = set(dict((x[0], x[1]) for x in d["headers"])["dlq.id"] for d in s.dead_letters())
        return n + len(ids) >= len(records)
    # Every record either way first, so that a good command refused shows
    # as such below, not as a time-out.
    e2e.wait_until("every command recorded or dead-lettered", handled, 180)
    s.wait_settled(int(s.query("SELECT count(*) FROM payment_attempts")[0][0]),
                   timeout=180)  # also: every offset committed
    letters = {}
    for d in s.dead_letters():
        h = dict((x[0], x[1]) for x in d["headers"])
        letters.setdefault(h["dlq.id"], (d, h))
    by_key = {}
    for d, h in letters.values():
        check(d["key"] not in by_key, "two dead letters for key %s" % d["key"])
        by_key[d["key"]] = h
    for k, (name, reason, field) in expect.items():
        h = by_key.get(k)
        check(h is not None, "no dead letter for %r (key %s)" % (name, k))
        check_eq(h["dlq.reason"], reason, "dlq.reason of %r (dlq.error %r)" % (name, h["dlq.error"]))
        if field:
            check(field in h["dlq.error"], "dlq.error of %r does not name %s: %r"
                  % (name, field, h["dlq.error"]))
        check_eq(jsc.errors(DLQ_HEADERS, dlq_headers(h)), [], "dlq.* headers of %r" % name)
    good_by_key = dict((c["payment_attempt_id"], c) for c in goods)
    check_eq(sorted((json.dumps(good_by_key[k], ensure_ascii=False)[-120:], by_key[k]["dlq.error"])
                    for k in set(by_key) - set(expect)), [], "dead letters for good commands")
    recorded = set(r[0] for r in s.query("SELECT id FROM payment_attempts"))
    check_eq(recorded, set(c["payment_attempt_id"].lower() for c in goods),
             "attempts recorded (exactly the good commands)")
    # Non-ASCII text is stored whole and goes to the provider, which alone
    # may refuse it: psp-sim knows no such token (400 resource_missing), so
    # the attempt is FAILED without a charge, not a dead letter.
    wide = [c for c in goods if not (c["payment_method"] + (c.get("customer_id") or "")).isascii()]
    check(len(wide) >= 4, "non-ASCII commands in the good corpus: %d" % len(wide))
    for c in wide:
        row = s.query("SELECT encode(convert_to(payment_method, 'UTF8'), 'hex'), "
                      "encode(convert_to(coalesce(customer_id, ''), 'UTF8'), 'hex'), status, "
                      "reason FROM payment_attempts WHERE id = '%s'" % c["payment_attempt_id"].lower())
        check_eq(row[0][:2], [c["payment_method"].encode().hex(),
                              (c.get("customer_id") or "").encode().hex()],
                 "stored text of a non-ASCII command")
        check_eq((row[0][2], row[0][3].split(":")[0]), ("FAILED", "invalid_request"),
                 "outcome of a non-ASCII command")
    e2e.log("corpus: %d good recorded, %d bad refused by schema and worker, %d gaps "
            "refused by the worker only" % (len(goods), len(bads), len(gaps)))


def dlq_headers(h):
    return dict((k, v) for k, v in h.items() if k.startswith("dlq."))


# ---- 4. what the relay really publishes ----

N = 300


def relay_scenario(new):
    s = new("contract_relay", psp_args=[
        "--latency-ms", "2", "--latency-jitter-ms", "8", "--fault", "drop_after=0.08",
        "--fault", "error_after=0.05", "--fault", "error_before=0.05",
        "--seed", str(random.randrange(1 << 30))])
    s.start_worker(WORKER_UNKNOWN_RETRIES=0, RECONCILER_FIRST_LOOK_MS=0)
    s.start_reconciler(RECONCILER_SCHEDULE_MS=200, RECONCILER_POLL_MS=100)
    relay_log = open(os.path.join(s.dir, "relay.log"), "ab")
    import subprocess
    relay = subprocess.Popen([e2e.CHARGED, "relay"], stdout=relay_log, stderr=relay_log,
                             env=s.env({"WORKER_ID": "relay-contract", "RELAY_POLL_MS": "100"}))
    try:
        methods = ["pm_card_visa"] * 16 + ["pm_card_chargeDeclined",
                                           "pm_card_chargeDeclinedInsufficientFunds"] * 2
        cmds = [e2e.new_command(payment_method=random.choice(methods)) for _ in range(N)]
        # Second attempts for some orders: charge.rejected while the first lives or paid.
        seconds = [e2e.new_command(order_id=c["order_id"]) for c in cmds[:20]]
        s.publish(cmds)
        s.publish(seconds)
        conflict = dict(cmds[0], amount=cmds[0]["amount"] + 1)
        bad = [("schema_violation", dict(e2e.new_command(), currency="eur")),
               ("key_mismatch", None), ("malformed_json", None), ("empty_value", None),
               ("idempotency_key_conflict", conflict)]
        recs = []
        for reason, c in bad:
            c = c or e2e.new_command()
            value = json.dumps(c)
            key = c["payment_attempt_id"]
            if reason == "key_mismatch":
                key = str(uuid.uuid4())
            elif reason == "malformed_json":
                value = value[:-1]
            elif reason == "empty_value":
                value = ""
            recs.append({"key": key, "value": value, "headers": [["trace", "t-1"]]})
        s.produce_raw(recs)
        total = N + len(seconds)
        s.wait_settled(total, timeout=300)
        e2e.wait_until("nothing UNKNOWN or PROCESSING", lambda: s.query(
            "SELECT count(*) FROM payment_attempts WHERE status IN ('UNKNOWN','PROCESSING')")
            == [["0"]], 120)
        e2e.wait_until("every outbox row published", lambda: s.query(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]], 120)
        s.check_invariants()
    finally:
        relay.kill()
        relay.wait()

    outbox = set(r[0] for r in s.query("SELECT event_id FROM outbox"))
    msgs = [json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines() if l.strip()]
    types, seen = {}, set()
    for m in msgs:
        where = "results %s:%s" % (m["partition"], m["offset"])
        check(isinstance(m["value"], str), "%s: value is not UTF-8 text" % where)
        ev = json.loads(m["value"])
        errs = jsc.errors(event_schema(ev), ev)
        check(not errs, lambda: "%s: %s breaks its event schema: %s"
              % (where, m["value"], errs))
        check_eq(m["key"], ev["payment_attempt_id"], "%s: key" % where)
        check_eq(dict((h[0], h[1]) for h in m["headers"]).get("event_id"), ev["event_id"],
                 "%s: header event_id" % where)
        types[ev["type"]] = types.get(ev["type"], 0) + 1
        seen.add(ev["event_id"])
    check_eq(seen, outbox, "event_ids on the topic against the outbox")
    for t in ("charge.succeeded", "charge.failed", "charge.unknown", "charge.rejected"):
        check(types.get(t), "no %s event on the topic: the check covered less than it "
              "claims (%s)" % (t, types))

    letters = s.dead_letters()
    reasons = {}
    for d in letters:
        h = dict((x[0], x[1]) for x in d["headers"])
        errs = jsc.errors(DLQ_HEADERS, dlq_headers(h))
        check(not errs, "dead letter %s: %s" % (h.get("dlq.id"), errs))
        check_eq(h.get("trace"), "t-1", "the original header of %s" % h.get("dlq.id"))
        reasons[h["dlq.reason"]] = reasons.get(h["dlq.reason"], 0) + 1
    check_eq(sorted(reasons), sorted(r for r, _ in bad), "dead-letter reasons")
    e2e.log("relay output: %d messages (%d distinct events) valid: %s; %d dead letters "
            "valid: %s" % (len(msgs), len(seen), types, len(letters), reasons))


def case_letters(s):
    """The dead letters so far, one per dlq.id: its headers."""
    out = {}
    for d in s.dead_letters():
        h = dict((x[0], x[1]) for x in d["headers"])
        out.setdefault(h["dlq.id"], h)
    return out


def check_case_letters(s, expect, what):
    """Every record that carries a contract-case header and is in expect
    (name -> (dlq.reason, what dlq.error names or None)) is exactly one dead
    letter of that reason, valid dlq.* headers; no other case is one."""
    by_case = {}
    for h in case_letters(s).values():
        case = h.get("contract-case", "(none)")
        check(case not in by_case, "two dead letters for %r" % case)
        by_case[case] = h
        check_eq(jsc.errors(DLQ_HEADERS, dlq_headers(h)), [], "dlq.* headers of %r" % case)
    check_eq(sorted(set(by_case) - set(expect)), [], "dead letters of %s meant to be accepted"
             % what)
    for name, (reason, field) in expect.items():
        h = by_case.get(name)
        check(h is not None, "no dead letter for %r" % name)
        check_eq(h["dlq.reason"], reason, "dlq.reason of %r (dlq.error %r)" % (name, h["dlq.error"]))
        if field:
            check(field in h["dlq.error"], "dlq.error of %r does not name %s: %r"
                  % (name, field, h["dlq.error"]))


def check_published(s, prefixes, want_kinds):
    """A relay publishes the outbox; every value on the results topic is
    valid by the schema of its type, keyed and headed as the contract says;
    those of the kinds `prefixes` are exactly the outbox's, and cover
    want_kinds (a type, " (no order)" when the event has none). Returns the
    number of those events and their kinds."""
    relay = s.start_relay(RELAY_POLL_MS=100)
    try:
        e2e.wait_until("every outbox row published", lambda: s.query(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL") == [["0"]], 60)
    finally:
        s.stop_relay(relay)
    outbox = set(r[0] for r in s.query("SELECT event_id, event_type FROM outbox")
                 if r[1].startswith(prefixes))
    seen, kinds = set(), {}
    for m in (json.loads(l) for l in s.tool("dump", s.topics["results"]).splitlines() if l.strip()):
        ev = json.loads(m["value"])
        where = "results %s:%s" % (m["partition"], m["offset"])
        errs = jsc.errors(event_schema(ev), ev)
        check(not errs, lambda: "%s: %s breaks its event schema: %s" % (where, m["value"], errs))
        check_eq(m["key"], ev["payment_attempt_id"], "%s: key" % where)
        check_eq(dict((h[0], h[1]) for h in m["headers"]).get("event_id"), ev["event_id"],
                 "%s: header event_id" % where)
        if ev["type"].startswith(prefixes):
            seen.add(ev["event_id"])
            kind = ev["type"] + ("" if "order_id" in ev else " (no order)")
            kinds[kind] = kinds.get(kind, 0) + 1
    check_eq(seen, outbox, "%s event_ids on the topic against the outbox" % "|".join(prefixes))
    for kind in want_kinds:
        check(kinds.get(kind), "no %s event on the topic: the check covered less than it "
              "claims (%s)" % (kind, kinds))
    return len(seen), kinds


# ---- 5. refunds ----

def refund_of(attempt_id, amount=10, upper=False, **kw):
    """A refund command of the charge `attempt_id`; kw as with_()."""
    r = str(uuid.uuid4())
    c = {"type": "refund.requested", "version": 1, "refund_id": r.upper() if upper else r,
         "payment_attempt_id": attempt_id.upper() if upper else attempt_id,
         "idempotency_key": "refund:" + r, "amount": amount,
         "reason": "requested_by_customer"}
    kw.setdefault("amount", amount)
    for k, v in kw.items():
        if v is DROP:
            del c[k]
        else:
            c[k] = v
    return c


def refund_bad_corpus():
    """(name, JSON value, what dlq.error must name): each breaks exactly one
    rule of refund_command_parse that the schema expresses. Each refunds a
    charge of its own that was never made, so that, were it accepted, it
    would be recorded (and REJECTED not_refundable), not dead-lettered."""
    def r(**kw):
        return refund_of(str(uuid.uuid4()), **kw)
    meta21 = dict(("k%d" % i, "v") for i in range(21))
    rules = [
        ("type with a capital", r(type="refund.Requested"), "'type'"),
        ("type of another kind", r(type="refund.succeeded"), "'type'"),
        ("version missing", r(version=DROP), "'version'"),
        ("version 2", r(version=2), "'version'"),
        ("version string", r(version="1"), "'version'"),
        ("version true", r(version=True), "'version'"),
        ("refund id missing", r(refund_id=DROP), "'refund_id'"),
        ("refund id null", r(refund_id=None), "'refund_id'"),
        ("refund id not hex", r(refund_id="zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"), "'refund_id'"),
        ("refund id short", r(refund_id=str(uuid.uuid4())[:35]), "'refund_id'"),
        ("refund id without hyphens", r(refund_id=uuid.uuid4().hex), "'refund_id'"),
        ("refund id hyphens moved", r(refund_id="aaaaaaaaa-aaa-aaaa-aaaa-aaaaaaaaaaaa"),
         "'refund_id'"),
        ("refund id number", r(refund_id=7), "'refund_id'"),
        ("attempt id missing", r(payment_attempt_id=DROP), "'payment_attempt_id'"),
        ("attempt id null", r(payment_attempt_id=None), "'payment_attempt_id'"),
        ("attempt id not a uuid", r(payment_attempt_id="charge-17"), "'payment_attempt_id'"),
        ("attempt id number", r(payment_attempt_id=17), "'payment_attempt_id'"),
        ("key missing", r(idempotency_key=DROP), "'idempotency_key'"),
        ("key empty", r(idempotency_key=""), "'idempotency_key'"),
        ("key 129", r(idempotency_key="k" * 129), "'idempotency_key'"),
        ("key space", r(idempotency_key="refund 1"), "'idempotency_key'"),
        ("key non-ascii", r(idempotency_key="refund-\u00e9"), "'idempotency_key'"),
        ("key number", r(idempotency_key=7), "'idempotency_key'"),
        ("amount missing", r(amount=DROP), "'amount'"),
        ("amount string", r(amount="10"), "'amount'"),
        ("amount null", r(amount=None), "'amount'"),
        ("amount fraction", r(amount=10.5), "'amount'"),
        ("amount 0", r(amount=0), "'amount'"),
        ("amount negative", r(amount=-5), "'amount'"),
        ("amount over 1e11", r(amount=100000000001), "'amount'"),
        ("reason missing", r(reason=DROP), "'reason'"),
        ("reason null", r(reason=None), "'reason'"),
        ("reason empty", r(reason=""), "'reason'"),
        ("reason other", r(reason="because"), "'reason'"),
        ("reason capitalised", r(reason="Duplicate"), "'reason'"),
        ("reason number", r(reason=1), "'reason'"),
        ("metadata array", r(metadata=[]), "'metadata'"),
        ("metadata string", r(metadata="ticket=1"), "'metadata'"),
        ("metadata 21 pairs", r(metadata=meta21), "'metadata'"),
        ("metadata number value", r(metadata={"n": 1}), "'metadata'"),
        ("metadata null value", r(metadata={"n": None}), "'metadata'"),
        ("metadata empty key", r(metadata={"": "v"}), "'metadata'"),
        ("metadata key 41 chars", r(metadata={"\u00e9" * 41: "v"}), "'metadata'"),
        ("metadata value 501 chars", r(metadata={"k": "\u20ac" * 501}), "'metadata'"),
    ]
    return [(name, json.dumps(v, ensure_ascii=False), want) for name, v, want in rules]


def refund_scenario(new):
    s = new("contract_refunds", partitions=3)
    s.start_worker()
    paid = e2e.new_command(amount=100000)
    refund_fails = e2e.new_command(amount=1000, payment_method="pm_card_refundFail")
    declined = e2e.new_command(amount=700, payment_method="pm_card_chargeDeclined")
    s.publish([paid, refund_fails, declined])
    s.wait_settled(3, 60)
    a = paid["payment_attempt_id"]

    # Good: valid for the schema and recorded by the worker, whatever the
    # database then decides (the last four are REJECTED or FAILED).
    first = refund_of(a, amount=100)
    goods = [first, refund_of(a, upper=True), refund_of(a, reason="duplicate"),
             refund_of(a, reason="fraudulent", metadata={"ticket": "T-1"}),
             refund_of(a, metadata=None), refund_of(a, metadata={}),
             refund_of(a, note="senders may add fields", extra={"nested": [1, None]}),
             refund_of(a, amount=1), refund_of(a, idempotency_key="Ab9._:-" + "r" * 121),
             refund_of(a, idempotency_key="x"),
             refund_of(a, metadata=dict(("k%02d" % i + "m" * 37, "v" * 500) for i in range(20))),
             refund_of(a, metadata={"\u00e9" * 40: "\u20ac" * 500}),
             refund_of(a, amount=100000000000),  # REJECTED exceeds_charge
             refund_of(declined["payment_attempt_id"]),  # REJECTED not_refundable
             refund_of(str(uuid.uuid4())),  # not_refundable, a charge never recorded
             refund_of(refund_fails["payment_attempt_id"], amount=1000)]  # FAILED
    bads = refund_bad_corpus()
    text = json.dumps
    dup = text(refund_of(a))[:-1] + ', "amount": 10}'
    gaps = [  # (name, value, key, reason): the schema accepts the value
        ("version 1.0", text(refund_of(a, version=1.0)), a, "schema_violation", "'version'"),
        ("amount 10.0", text(refund_of(a, amount=10.0)), a, "schema_violation", "'amount'"),
        ("amount 1e1", text(refund_of(a, amount=1)).replace('"amount": 1,', '"amount": 1e1,'),
         a, "schema_violation", "'amount'"),
        ("card digits in metadata", text(refund_of(a, metadata={"note": "4242424242424242"})),
         a, "card_data_refused", None),
        ("a field twice", dup, a, "malformed_json", None),
        ("a \\u0000 in a metadata value", text(refund_of(a, metadata={"k": "a\u0000b"})), a,
         "malformed_json", None),
        ("key of another charge", text(refund_of(a)), declined["payment_attempt_id"],
         "key_mismatch", None),
        ("key in other letter case", text(refund_of(a)), a.upper(), "key_mismatch", None),
    ]
    # Resends after the first (one key, so one partition, in order).
    conflicts = [
        ("the first again, another amount", text(dict(first, amount=101))),
        ("the first's key, another refund", text(refund_of(a, idempotency_key=first["idempotency_key"]))),
        ("the charge's key", text(refund_of(a, idempotency_key=paid["idempotency_key"]))),
    ]

    for c in goods:
        check_eq(jsc.errors(REFUND_COMMAND, c), [], "schema errors of good refund %s"
                 % json.dumps(c)[:200])
    for name, value, want in bads:
        check(jsc.errors(REFUND_COMMAND, json.loads(value)),
              "the schema accepts the bad refund %r: %s" % (name, value[:200]))
    for name, value, _, _, _ in gaps:
        check_eq(jsc.errors(REFUND_COMMAND, json.loads(value)), [],
                 "schema errors of %r (a documented gap: the schema accepts it)" % name)
    for name, value in conflicts:
        check_eq(jsc.errors(REFUND_COMMAND, json.loads(value)), [], "schema errors of %r" % name)

    # Each record carries its case's name in a header, kept in its dead letter.
    records, expect = [], {}

    def add(name, key, value, reason=None, field=None):
        records.append({"key": key, "value": value, "headers": [["contract-case", name]]})
        if reason:
            expect[name] = (reason, field)
    for i, c in enumerate(goods):
        add("good %d" % i, c["payment_attempt_id"], json.dumps(c, ensure_ascii=False))
    for name, value, want in bads:
        add(name, key_of(value), value, "schema_violation", want)
    for name, value, key, reason, field in gaps:
        add(name, key, value, reason, field)
    random.shuffle(records)
    s.produce_raw(records)
    # The resends once the first is recorded, so that "the first" is not a
    # matter of which the worker's batch takes first.
    e2e.wait_until("the first refund recorded", lambda: s.query(
        "SELECT count(*) FROM refund_attempts WHERE id = '%s'" % first["refund_id"]) == [["1"]],
        60)
    records = []
    add("the first once more, the same", a, text(first))  # a duplicate: no dead letter
    for name, value in conflicts:
        add(name, a, value, "idempotency_key_conflict", None)
    s.produce_raw(records)

    e2e.wait_until("every refund command recorded or dead-lettered", lambda:
                   int(s.query("SELECT count(*) FROM refund_attempts")[0][0]) +
                   len(case_letters(s))
                   >= len(goods) + len(expect), 120)
    s.wait_refunds_settled(len(goods), 60)
    e2e.wait_until("every command consumed", lambda: s.lag()["lag"] == 0, 60)

    check_case_letters(s, expect, "refunds")
    recorded = dict((r[0], r[1:]) for r in s.query(
        "SELECT id, status, amount, coalesce(reason, '') FROM refund_attempts"))
    check_eq(sorted(recorded), sorted(c["refund_id"].lower() for c in goods),
             "refunds recorded (exactly the good commands)")
    check_eq(recorded[first["refund_id"]][:2], ["SUCCEEDED", "100"],
             "the first refund, after its conflicting resends")
    reasons = sorted(r[2].split(":")[0] for r in recorded.values() if r[0] == "REJECTED")
    check_eq(reasons, ["exceeds_charge", "not_refundable", "not_refundable"],
             "what the database refused at claim time")
    s.check_refund_invariants()

    n, kinds = check_published(s, ("refund.",), (
        "refund.succeeded", "refund.failed", "refund.rejected", "refund.rejected (no order)"))
    e2e.log("refunds: %d good recorded, %d bad refused by schema and worker, %d gaps and %d "
            "conflicts refused by the worker only; %d refund events valid: %s"
            % (len(goods), len(bads), len(gaps), len(conflicts), n, kinds))



# ---- 6. authorizations, captures and voids ----

def step_of(kind, attempt_id, upper=False, **kw):
    """A capture.requested or void.requested (kind "capture" or "void") of
    the authorization `attempt_id`; kw as with_()."""
    i = str(uuid.uuid4())
    c = {"type": kind + ".requested", "version": 1, kind + "_id": i.upper() if upper else i,
         "payment_attempt_id": attempt_id.upper() if upper else attempt_id,
         "idempotency_key": kind + ":" + i}
    if kind == "void":
        c["reason"] = "requested_by_customer"
    for k, v in kw.items():
        if v is DROP:
            del c[k]
        else:
            c[k] = v
    return c


def step_good_corpus(kind, captured, voided):
    """(command, the reason code the database gives it): valid for the
    schema, so recorded; of authorizations never recorded (attempt_unknown)
    but for the last two, of the authorization captured and the one voided."""
    def u(**kw):
        return step_of(kind, str(uuid.uuid4()), **kw)
    wide = {"\u00e9" * 40: "\u20ac" * 500}
    goods = [u(), u(upper=True), u(metadata=None), u(metadata={}), u(metadata=wide),
             u(metadata=dict(("k%02d" % i + "m" * 37, "v" * 500) for i in range(20))),
             u(note="senders may add fields", extra={"nested": [1, None]}),
             # One key namespace across operations: each kind its own keys.
             u(idempotency_key="Ab9._:-" + kind[0] * 121), u(idempotency_key=kind[0].upper())]
    if kind == "capture":
        goods += [u(amount=1), u(amount=2500), u(amount=100000000000)]  # u(): all
        tail = [("already_captured", captured), ("capture_after_void", voided)]
    else:
        goods += [u(reason=r) for r in ("duplicate", "fraudulent", "abandoned")]
        tail = [("void_after_capture", captured), ("authorization_voided", voided)]
    return ([(c, "attempt_unknown") for c in goods] +
            [(step_of(kind, a["payment_attempt_id"], amount=1)
              if kind == "capture" else step_of(kind, a["payment_attempt_id"]), code)
             for code, a in tail])


def step_bad_corpus(kind):
    """(name, JSON text, what dlq.error must name): each breaks exactly one
    rule of capture_command_parse or void_command_parse that its schema
    expresses. Each names an authorization never recorded, so that, were it
    accepted, it would be recorded (REJECTED attempt_unknown)."""
    def b(**kw):
        return step_of(kind, str(uuid.uuid4()), **kw)
    i = kind + "_id"
    rules = [
        ("type with a capital", b(type=kind + ".Requested"), "'type'"),
        ("type of an event", b(type=kind + ".succeeded"), "'type'"),
        ("version missing", b(version=DROP), "'version'"),
        ("version 2", b(version=2), "'version'"),
        ("version string", b(version="1"), "'version'"),
        ("id missing", b(**{i: DROP}), "'%s'" % i),
        ("id null", b(**{i: None}), "'%s'" % i),
        ("id not hex", b(**{i: "zzzzzzzz-zzzz-zzzz-zzzz-zzzzzzzzzzzz"}), "'%s'" % i),
        ("id without hyphens", b(**{i: uuid.uuid4().hex}), "'%s'" % i),
        ("id number", b(**{i: 7}), "'%s'" % i),
        ("attempt id missing", b(payment_attempt_id=DROP), "'payment_attempt_id'"),
        ("attempt id not a uuid", b(payment_attempt_id="auth-17"), "'payment_attempt_id'"),
        ("attempt id number", b(payment_attempt_id=17), "'payment_attempt_id'"),
        ("key missing", b(idempotency_key=DROP), "'idempotency_key'"),
        ("key empty", b(idempotency_key=""), "'idempotency_key'"),
        ("key 129", b(idempotency_key="k" * 129), "'idempotency_key'"),
        ("key space", b(idempotency_key="step 1"), "'idempotency_key'"),
        ("key non-ascii", b(idempotency_key="step-\u00e9"), "'idempotency_key'"),
        ("metadata array", b(metadata=[]), "'metadata'"),
        ("metadata 21 pairs", b(metadata=dict(("k%d" % n, "v") for n in range(21))),
         "'metadata'"),
        ("metadata number value", b(metadata={"n": 1}), "'metadata'"),
        ("metadata empty key", b(metadata={"": "v"}), "'metadata'"),
        ("metadata key 41 chars", b(metadata={"\u00e9" * 41: "v"}), "'metadata'"),
        ("metadata value 501 chars", b(metadata={"k": "\u20ac" * 501}), "'metadata'"),
    ]
    if kind == "capture":
        rules += [
            ("amount string", b(amount="10"), "'amount'"),
            ("amount null", b(amount=None), "'amount'"),  # not absent: refused
            ("amount fraction", b(amount=10.5), "'amount'"),
            ("amount 0", b(amount=0), "'amount'"),
            ("amount negative", b(amount=-5), "'amount'"),
            ("amount over 1e11", b(amount=100000000001), "'amount'"),
        ]
    else:
        rules += [
            ("reason missing", b(reason=DROP), "'reason'"),
            ("reason null", b(reason=None), "'reason'"),
            ("reason other", b(reason="because"), "'reason'"),
            ("reason capitalised", b(reason="Duplicate"), "'reason'"),
            ("reason number", b(reason=1), "'reason'"),
        ]
    return [("%s: %s" % (kind, name), json.dumps(v, ensure_ascii=False), want)
            for name, v, want in rules]


def step_gap_corpus(kind):
    """(name, JSON text, dlq.reason, field): the schema accepts these, the
    worker refuses them, as the schemas' descriptions say."""
    c = step_of(kind, str(uuid.uuid4()), amount=10) if kind == "capture" else \
        step_of(kind, str(uuid.uuid4()))
    text = json.dumps(c)
    gaps = [("version 1.0", text.replace('"version": 1,', '"version": 1.0,'),
             "schema_violation", "'version'"),
            ("a field twice", text[:-1] + ', "idempotency_key": "%s"}' % c["idempotency_key"],
             "malformed_json", None),
            ("card digits in metadata",
             json.dumps(dict(c, metadata={"note": "4242424242424242"})),
             "card_data_refused", None)]
    if kind == "capture":
        gaps.append(("amount 10.0", text.replace('"amount": 10', '"amount": 10.0'),
                     "schema_violation", "'amount'"))
    return [("%s: %s" % (kind, n), v, r, f) for n, v, r, f in gaps]


def step_table(s, kind):
    return dict((r[0], r[1:]) for r in s.query(
        "SELECT id, status, coalesce(reason, '') FROM %s_attempts" % kind))


def steps_first(s):
    """Authorizations held, declined and refused; one captured and one
    voided: the authorization.*, capture.* and void.* events of each kind,
    and the two authorizations the corpus's last goods name."""
    def auth(**kw):
        c = e2e.new_command(**kw)
        c["type"] = "authorization.requested"
        return c
    captured, voided = auth(amount=2000), auth(amount=1500)
    declined = auth(amount=700, payment_method="pm_card_chargeDeclined")
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)}
                   for c in (captured, voided, declined)])
    s.wait_settled(3, 60)
    again = auth(order_id=captured["order_id"])  # REJECTED order_has_live_attempt
    take, release = step_of("capture", captured["payment_attempt_id"], amount=1200), \
        step_of("void", voided["payment_attempt_id"])
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)}
                   for c in (again, take, release)])
    e2e.wait_until("the capture and the void settled", lambda: (
        step_table(s, "capture").get(take["capture_id"], [""])[0],
        step_table(s, "void").get(release["void_id"], [""])[0]) == ("SUCCEEDED", "SUCCEEDED"),
        60)
    s.wait_settled(4, 60)
    got = dict((r[0], r[1]) for r in s.query("SELECT id, status FROM payment_attempts"))
    check_eq([got.get(c["payment_attempt_id"]) for c in (captured, voided, declined, again)],
             ["SUCCEEDED", "VOIDED", "FAILED", "REJECTED"], "the authorizations")
    return captured, voided, [(take, "SUCCEEDED"), (release, "SUCCEEDED")]


def steps_expiry(s):
    """An authorization the provider's expiry cancels: the reconciler's look
    makes it VOIDED expired, published as authorization.failed (expired).
    The last of the scenario: every other hold at psp-sim is spent by then."""
    c = e2e.new_command(amount=900)
    c["type"] = "authorization.requested"
    s.produce_raw([{"key": c["payment_attempt_id"], "value": json.dumps(c)}])

    def status():
        return s.query("SELECT status, coalesce(reason, '') FROM payment_attempts WHERE id = '%s'"
                       % c["payment_attempt_id"])
    e2e.wait_until("the last authorization held", lambda: status() == [["AUTHORIZED", ""]], 60)
    s.psp_put("/authorization-expiry", {"authorization_expiry_ms": 200})
    s.start_reconciler(RECONCILER_AUTHORIZATION_EXPIRY_MS="1000", RECONCILER_POLL_MS="100")
    e2e.wait_until("the expired authorization VOIDED", lambda: status() == [["VOIDED", "expired"]],
                   60)
    return c


def steps_scenario(new):
    s = new("contract_steps", partitions=3)
    s.start_worker()
    captured, voided, first = steps_first(s)
    goods = step_good_corpus("capture", captured, voided) + \
        step_good_corpus("void", captured, voided)
    bads = step_bad_corpus("capture") + step_bad_corpus("void")
    gaps = step_gap_corpus("capture") + step_gap_corpus("void")
    schemas = {"capture": CAPTURE_COMMAND, "void": VOID_COMMAND}
    for c, _ in goods:
        check_eq(jsc.errors(schemas[c["type"].split(".")[0]], c), [], "schema errors of good %s"
                 % json.dumps(c)[:200])
    for name, value, _ in bads:
        check(jsc.errors(schemas[name.split(":")[0]], json.loads(value)),
              "the schema accepts the bad command %r: %s" % (name, value[:200]))
    for name, value, _, _ in gaps:
        check_eq(jsc.errors(schemas[name.split(":")[0]], json.loads(value)), [],
                 "schema errors of %r (a documented gap: the schema accepts it)" % name)

    records, expect = [], {}

    def add(name, key, value, reason=None, field=None):
        records.append({"key": key, "value": value, "headers": [["contract-case", name]]})
        if reason:
            expect[name] = (reason, field)
    for n, (c, _) in enumerate(goods):
        add("good %d" % n, c["payment_attempt_id"], json.dumps(c, ensure_ascii=False))
    for name, value, want in bads:
        add(name, key_of(value), value, "schema_violation", want)
    for name, value, reason, field in gaps:
        add(name, key_of(value), value, reason, field)
    random.shuffle(records)
    s.produce_raw(records)

    def unsettled():
        return int(s.query("SELECT (SELECT count(*) FROM capture_attempts WHERE status IN"
                           " ('PENDING', 'PROCESSING')) + (SELECT count(*) FROM void_attempts"
                           " WHERE status IN ('PENDING', 'PROCESSING'))")[0][0])
    e2e.wait_until("every step recorded and settled, or dead-lettered", lambda:
                   len(step_table(s, "capture")) + len(step_table(s, "void")) +
                   len(case_letters(s)) >= len(goods) + len(first) + len(expect) and
                   unsettled() == 0, 90)
    e2e.wait_until("every command consumed", lambda: s.lag()["lag"] == 0, 60)

    check_case_letters(s, expect, "captures and voids")
    for kind in ("capture", "void"):
        got = dict((i, (r[0], r[1].split(":")[0])) for i, r in step_table(s, kind).items())
        want = dict((c[kind + "_id"].lower(), ("REJECTED", code)) for c, code in goods
                    if c["type"] == kind + ".requested")
        want.update((c[kind + "_id"], (status, "")) for c, status in first
                    if c["type"] == kind + ".requested")
        check_eq(got, want, "%s attempts recorded (exactly the good commands) and what the "
                 "database decided" % kind)
    expired = steps_expiry(s)
    n, kinds = check_published(s, ("authorization.", "capture.", "void."), (
        "authorization.succeeded", "authorization.failed", "authorization.rejected",
        "capture.succeeded", "capture.rejected", "capture.rejected (no order)",
        "void.succeeded", "void.rejected", "void.rejected (no order)"))
    check_eq([json.loads(r[0]).get("reason") for r in s.query(
        "SELECT payload FROM outbox WHERE payment_attempt_id = '%s' AND event_type ="
        " 'authorization.failed'" % expired["payment_attempt_id"])], ["expired"],
        "the expiry's one event: authorization.failed, reason expired")
    e2e.log("steps: %d good captures and voids recorded, %d bad refused by schema and worker, "
            "%d gaps refused by the worker only; %d events valid: %s"
            % (len(goods), len(bads), len(gaps), n, kinds))


def scenario(new):
    self_test()
    doc_samples()
    corpus_scenario(new)
    relay_scenario(new)
    refund_scenario(new)
    steps_scenario(new)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
