#!/usr/bin/env python3
"""Writes the seed corpora of tests/fuzz/corpus/<target>/: the inputs the
e2e and unit tests use (tests/e2e/charged_e2e.py new_command/new_refund,
tests/e2e/charged_api.py event/refund_event, the provider answers psp-sim
gives, tests/unit/test_traceparent.c, tests/unit/test_fleet_status.c), in
each target's input format (tests/fuzz/fuzz_<target>.c says it). Deterministic: ids are fixed, so a
re-run rewrites the same files. Usage: make_corpus.py [corpus dir]."""
import hashlib
import hmac
import json
import os
import sys

ATTEMPT = "5d1c2c1e-1a9b-4b1e-8e55-000000000001"
ORDER = "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001"
REFUND = "8f14e45f-ceea-4e7a-9b3b-000000000002"
NOW = 1700000000


def dumps(o):
    return json.dumps(o, separators=(",", ":")).encode()


def charge(**extra):
    cmd = {"type": "charge.requested", "version": 1, "payment_attempt_id": ATTEMPT,
           "order_id": ORDER, "idempotency_key": "attempt:" + ATTEMPT, "amount": 1999,
           "currency": "EUR", "payment_method": "pm_card_visa"}
    cmd.update(extra)
    return cmd


def refund(**extra):
    cmd = {"type": "refund.requested", "version": 1, "refund_id": REFUND,
           "payment_attempt_id": ATTEMPT, "idempotency_key": "refund:" + REFUND,
           "amount": 500, "reason": "requested_by_customer"}
    cmd.update(extra)
    return cmd


def commands():
    key = ATTEMPT.encode() + b"\n"
    yield key + dumps(charge())
    yield key + dumps(charge(currency="USD", amount=1))
    yield key + dumps(charge(customer_id="cus_123", metadata={"cart": "42", "k": "v"}))
    yield key + dumps(charge(payment_method="pm_card_chargeDeclined"))
    yield key + dumps(charge(amount=100000000000))
    yield key + dumps(charge(currency="JPY", amount=0))
    yield key + dumps(charge(payment_method="4111 1111 1111 1111"))
    yield key + dumps(charge(metadata={"a": 1}))
    yield key + dumps(charge(version=2))
    yield key + dumps(charge(payment_method="caf\u00e9 \u2603"))
    yield key + b'{"type":"charge.requested","a":"\xc3\x28"}'
    yield key + b'{"type":'
    yield key + b"[1,2]"
    yield b"\n" + dumps(charge())
    yield b"not-a-uuid\n" + dumps(charge())
    yield key + dumps(refund())
    yield key + dumps(refund(reason="fraudulent", metadata={"why": "x"}))
    yield key + dumps(refund(reason="duplicate", amount=1))
    yield key + dumps(refund(reason="other"))
    yield key + dumps(refund(amount=-5))
    yield key + dumps(refund(refund_id=REFUND.upper()))


def event(kind, amount=1999, currency="eur", attempt=ATTEMPT, **extra):
    status = {"succeeded": "succeeded", "payment_failed": "requires_payment_method",
              "processing": "processing", "canceled": "canceled",
              "amount_capturable_updated": "requires_capture"}[kind]
    pi = {"id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "object": "payment_intent",
          "status": status, "amount": amount, "currency": currency,
          "metadata": {"payment_attempt_id": attempt, "order_id": ORDER}}
    if kind == "payment_failed":
        pi["last_payment_error"] = {"code": "card_declined",
                                    "decline_code": "insufficient_funds"}
    ev = {"id": "evt_1NG8Du2eZvKYlo2CUI79vXWy", "object": "event",
          "type": "payment_intent." + kind, "created": NOW, "livemode": False,
          "data": {"object": pi}}
    ev.update(extra)
    return ev


def refund_obj(status="succeeded", amount=500):
    return {"id": "re_3MtwBwLkdIwHu7ix0Hr3lqcB", "object": "refund", "status": status,
            "amount": amount, "currency": "eur",
            "payment_intent": "pi_3MtwBwLkdIwHu7ix28a3tqPa",
            "metadata": {"refund_id": REFUND, "payment_attempt_id": ATTEMPT}}


def refund_event(kind, obj):
    if kind == "charge.refunded":
        obj = {"id": "ch_3MtwBwLkdIwHu7ix1", "object": "charge",
               "payment_intent": obj[0]["payment_intent"], "refunded": True,
               "refunds": {"object": "list", "data": obj}}
    return {"id": "evt_1NG8Du2eZvKYlo2CUI79vXWz", "object": "event", "type": kind,
            "created": NOW, "livemode": False, "data": {"object": obj}}


def events():
    yield dumps(event("succeeded"))
    yield dumps(event("payment_failed"))
    yield dumps(event("processing"))
    yield dumps(event("succeeded", attempt=ATTEMPT.upper()))
    yield dumps(event("succeeded", amount="5"))
    yield dumps(event("payment_failed", attempt="not-a-uuid"))
    yield dumps(dict(event("succeeded"), type="payment_intent.processing"))
    hold = {"capture_method": "manual", "amount_capturable": 1999, "amount_received": 0}
    held = event("amount_capturable_updated")
    held["data"]["object"].update(hold)
    yield dumps(held)
    lapsed = event("canceled")
    lapsed["data"]["object"].update(hold, amount_capturable=0,
                                    cancellation_reason="automatic")
    yield dumps(lapsed)
    yield dumps(refund_event("refund.created", refund_obj("pending")))
    yield dumps(refund_event("refund.updated", refund_obj("succeeded")))
    yield dumps(refund_event("refund.failed", dict(refund_obj("failed"),
                                                   failure_reason="expired_or_canceled_card")))
    yield dumps(refund_event("charge.refunded", [refund_obj(), refund_obj("failed", 100)]))
    yield b'{"id":"evt_\\u0000","type":"payment_intent.succeeded"}'
    yield b'{"id":"evt_1","type":"x","created":1,"data":{"object":{}}}'
    yield b'{"id":"evt_1","amount":1e-20000}'


def intent(status="succeeded", amount=1999, **extra):
    pi = {"id": "pi_3MtwBwLkdIwHu7ix28a3tqPa", "object": "payment_intent",
          "status": status, "amount": amount, "currency": "eur",
          "metadata": {"payment_attempt_id": ATTEMPT, "order_id": ORDER}}
    pi.update(extra)
    return pi


def err(etype, code=None, message="", **extra):
    e = {"type": etype, "message": message}
    if code:
        e["code"] = code
    e.update(extra)
    return {"error": e}


# The call byte of fuzz_provider_answer.c: 0 charge, 1 void, 2 refund,
# 3..8 retrieve/search/list of intents then refunds, 9/10 a list page,
# 11 capture of 600, 12 authorization (manual charge), 13 capture of all.
# The status byte indexes its table: 0 200, 2 400, 3 402, 4 404, 5 409,
# 6 429, 7 500, 11 403.
def answer(call, status_index, body, replayed=b""):
    return bytes([call, status_index, 0]) + replayed + b"\n" + body


def answers():
    yield answer(0, 0, dumps(intent()))
    yield answer(0, 0, dumps(intent()), b"true")
    yield answer(0, 0, dumps(intent("processing")))
    yield answer(0, 0, dumps(intent("requires_action")))
    yield answer(0, 0, dumps(intent(amount=1)))
    yield answer(0, 3, dumps(err("card_error", "card_declined",
                                 "Your card was declined.", decline_code="insufficient_funds",
                                 payment_intent=intent("requires_payment_method"))))
    yield answer(0, 2, dumps(err("invalid_request_error", "parameter_missing",
                                 "Missing required param: 'customer' cus_123.", param="customer")))
    yield answer(0, 2, dumps(err("idempotency_error", None, "Keys for idempotent requests")))
    yield answer(0, 5, dumps(err("invalid_request_error", "lock_timeout")))
    yield answer(0, 6, dumps(err("rate_limit_error")))
    yield answer(0, 7, b"")
    yield answer(0, 7, b"<html>bad gateway</html>")
    yield answer(1, 0, dumps(intent("canceled")))
    yield answer(1, 4, dumps(err("invalid_request_error", "resource_missing", "No such payment_intent: 'pi_1'")))
    manual = dict(intent("requires_capture"), id="pi_1", capture_method="manual",
                  amount_capturable=1999, amount_received=0)
    yield answer(12, 0, dumps(manual))
    yield answer(0, 0, dumps(manual))
    yield answer(11, 0, dumps(dict(manual, status="succeeded", amount_capturable=0,
                                   amount_received=600)))
    yield answer(13, 2, dumps(err("invalid_request_error", "payment_intent_unexpected_state",
                                  payment_intent=dict(manual, status="canceled",
                                                      amount_capturable=0,
                                                      cancellation_reason="automatic"))))
    yield answer(11, 2, dumps(err("invalid_request_error", "amount_too_large",
                                  param="amount_to_capture", payment_intent=manual)))
    yield answer(2, 0, dumps(refund_obj()))
    yield answer(2, 0, dumps(dict(refund_obj("failed"), failure_reason="lost_or_stolen_card")))
    yield answer(3, 0, dumps(intent()))
    yield answer(3, 4, dumps(err("invalid_request_error", "resource_missing")))
    yield answer(4, 0, dumps({"object": "search_result", "data": [intent("canceled"), intent()],
                              "has_more": False}))
    yield answer(5, 0, dumps({"object": "list", "data": [intent()], "has_more": True}))
    yield answer(6, 0, dumps(refund_obj("pending")))
    yield answer(8, 0, dumps({"object": "list", "data": [refund_obj(), refund_obj("failed")],
                              "has_more": False}))
    yield answer(9, 0, dumps({"object": "list", "data": [intent(), intent("processing")],
                              "has_more": False}))
    yield answer(10, 0, dumps({"object": "list", "data": [dict(refund_obj(), created=NOW)],
                               "has_more": True}))
    yield answer(9, 4, dumps(err("invalid_request_error", "resource_missing")))


def configs():
    base = [b"KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:19092",
            b"DATABASE_URL=postgresql://charged:secret@127.0.0.1:55433/charged",
            b"PROVIDER_BASE_URL=http://127.0.0.1:12111", b"PROVIDER_API_KEY=sk_test_123"]
    yield b"\x01" + b"\n".join(base)
    yield b"\x00" + b"\n".join(base + [b"WORKER_MAX_IN_FLIGHT=64", b"LOG_LEVEL=debug",
                                       b"API_ADDR=0.0.0.0:8080", b"CHARGE_COMMANDS_TOPIC=charge.commands"])
    yield b"\x00WORKER_LEASE_MS=abc\nLOG_LEVEL=loud"
    yield b"\x00WORKER_MAX_AMOUNT=-1\nADMIN_ADDR=nohost"
    yield b"\x00KAFKA_SECURITY_PROTOCOL=SASL_SSL\nKAFKA_SASL_MECHANISM=PLAIN\nKAFKA_SASL_PASSWORD=hunter22"
    yield b"\x00KAFKA_NO_SUCH_PROPERTY=1"
    yield b"\x00PROVIDER_API_KEY_FILE=sk_test_from_file\nPROVIDER_API_KEY=sk_test_direct"
    yield b"\x00WEBHOOK_SIGNING_SECRET_FILE=whsec_abc\n"
    yield b"\x00KAFKA_CLIENT_ID_FILE=charged-worker-1"
    yield b"\x00CHARGE_DLQ_TOPIC=..\nWORKER_ALLOWED_CURRENCIES=EUR,USD"
    yield b"\x3fPOD_NAME=worker-0\nWORKER_ID=w1\nREBALANCE_DRAIN_MS=5000"


def signatures():
    body = dumps(event("succeeded"))
    secret = b"whsec_test_secret"
    sig = hmac.new(secret, b"%d." % NOW + body, hashlib.sha256).hexdigest().encode()
    # mode, offset byte, secret, header, body
    yield b"\x00\x00" + secret + b"\nt=%d,v1=" % NOW + sig + b"\n" + body
    yield b"\x00\x00" + secret + b"\nt=%d,v1=" % NOW + sig.upper() + b",v0=abc\n" + body
    yield b"\x00\x00" + secret + b"\nt=%d,v1=%s,v1=" % (NOW, b"0" * 64) + sig + b"\n" + body
    yield b"\x00\x00" + secret + b"\nt=%d,v1=" % (NOW - 301) + sig + b"\n" + body
    yield b"\x00\x00" + secret + b"\nt=1,t=2,v1=" + sig + b"\n" + body
    yield b"\x00\x00" + secret + b"\nv1=" + sig + b"\n" + body
    yield b"\x00\x00" + secret + b"\n\n" + body
    yield b"\x01\x10" + secret + b"\n\n" + body
    yield b"\x01\x7f" + secret + b"\n\n" + body
    yield b"\x03\x00" + secret + b"\n\n" + body
    yield b"\x07\x00whsec_the_old_one\n\n{}"


def traceparents():
    yield b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    yield b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
    yield b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"
    yield b"00-00000000000000000000000000000000-00f067aa0ba902b7-01"
    yield b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"
    yield b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    yield b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"


def card_data():
    yield b"4111111111111111"
    yield b"4111 1111 1111 1111"
    yield b"4111-1111-1111-1111"
    yield b"3782 822463 10005"
    yield b"pan=5555555555554444;amount=1999"
    yield ATTEMPT.encode()
    yield b"1700000000123 4242424242424242"
    yield b"x4111111111111111"
    yield dumps(charge(payment_method="4111 1111 1111 1111"))
    yield b"6011000990139424 and 2223003122003222"


def breakers():
    head = (b"# HELP charged_provider_breaker_state Provider circuit breaker: 0 closed, "
            b"1 half-open, 2 open.\n# TYPE charged_provider_breaker_state gauge\n")
    yield head + b"charged_provider_breaker_state 0\ncharged_ready 1\n"
    yield head + b"charged_provider_breaker_state 2\n"
    yield b"charged_provider_breaker_state{provider=\"psp\"} 1"
    yield b'charged_provider_breaker_state{a="x} 0",b="\\"}"} 2 1764748800000\r\n'
    yield b"charged_provider_breaker_state 2.0\ncharged_provider_breaker_state 1e-400\n"
    yield b"charged_provider_breaker_state_total 2\ncharged_provider_breaker_states 1\n"
    yield b"charged_ready 1\ncharged_worker_in_flight 3\n"
    yield b"charged_provider_breaker_state 99999999999999999999\n"


def console_inputs():
    """First byte % 7 picks the parser (tests/fuzz/fuzz_console_input.c)."""
    for path in ["/console/", "/console/app.js", "/console/api/login",
                 "/console/api/attempts/" + ATTEMPT, "/console/api/attempts/%s/resolve" % ATTEMPT,
                 "/console/api/dead-letters/2:41", "/console/api/dead-letters/replay",
                 "/console/../etc/passwd", "/console/api/attempts/" + ATTEMPT.upper()]:
        yield b"\x00" + path.encode() + b"\n"
    yield b"\x01\n" + dumps({"token": "cct_" + "A" * 43})
    yield b"\x01\n" + dumps({"token": "cct_x", "extra": 1})
    yield b"\x02" + ATTEMPT.encode() + b"\n" + dumps(
        {"decision": "succeeded", "payment_intent_id": "pi_3Mtw", "reason": "paid"})
    yield b"\x02" + ATTEMPT.encode() + b"\n" + dumps(
        {"decision": "failed", "reason": "no money moved", "force": True, "confirm": ATTEMPT})
    yield b"\x03\n" + dumps({"positions": ["0:1", "2:41"], "dry_run": True})
    yield b"\x03\n" + dumps({"positions": ["0:1", "0:1"], "dry_run": False})
    for param in ["reason=malformed_json", "attempt=" + ATTEMPT, "since=2h",
                  "until=2026-12-01T10:00:00Z", "limit=1000", "limit=0", "bogus=1"]:
        yield b"\x04" + param.encode() + b"\n"
    yield b"\x05a=b; charged_console=" + b"Z" * 43 + b"\n"
    yield b"\x06pi_3Mtw\n"
    yield b"\x06" + ORDER.encode() + b"\n"


TARGETS = {"command": commands, "webhook_event": events, "provider_answer": answers,
           "config": configs, "webhook_signature": signatures,
           "traceparent": traceparents, "card_data": card_data, "breaker": breakers,
           "console_input": console_inputs}


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus")
    for target, seeds in TARGETS.items():
        d = os.path.join(root, target)
        os.makedirs(d, exist_ok=True)
        for s in seeds():
            name = "seed-" + hashlib.sha1(s).hexdigest()[:16]
            with open(os.path.join(d, name), "wb") as f:
                f.write(s)


if __name__ == "__main__":
    main()
