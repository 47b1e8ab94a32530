"""charged api status queries against real PostgreSQL:
GET /v1/payment-attempts/<id> and GET /v1/orders/<order_id>/payment-attempts
answer every state with the contract's fields and what the database holds,
400 for a malformed id, 404 for an unknown one, 405 for another method,
and never a payment method, metadata or secret; refunded_amount is the
charge's; an authorization's capture_method is "manual" and its
captured_amount what its capture took (a charge's "automatic", null);
GET /v1/refunds/<id> answers a refund's status likewise, and
GET /v1/captures/<id> a capture's and GET /v1/voids/<id> a void's (an
operation's status query, found in the table of operations). Each of the
three says "queued" (issue 38): null, or while the claim that said so
holds, why and since when its call waits."""

import json
import uuid

import charged_api as api
import charged_e2e as e2e
from charged_e2e import check, check_eq

FIELDS = {"payment_attempt_id", "order_id", "status", "amount", "currency",
          "provider_payment_id", "reason", "updated_at", "refunded_amount", "capture_method",
          "captured_amount", "queued"}
CAPTURE_FIELDS = {"capture_id", "payment_attempt_id", "order_id", "status", "amount",
                  "captured_amount", "currency", "reason", "provider_payment_id", "updated_at",
                  "queued"}
VOID_FIELDS = {"void_id", "payment_attempt_id", "order_id", "status", "void_reason",
               "released_amount", "reason", "provider_payment_id", "updated_at", "queued"}
REFUND_FIELDS = {"refund_id", "payment_attempt_id", "order_id", "status", "amount", "currency",
                 "refund_reason", "reason", "provider_refund_id", "updated_at", "queued"}
STATES = ["PENDING", "PROCESSING", "UNKNOWN", "SUCCEEDED", "FAILED", "REJECTED",
          "REQUIRES_REVIEW", "AUTHORIZED", "VOIDED", "CAPTURED"]
# An authorization's states (capture_method manual); CAPTURED is one SUCCEEDED by its capture.
MANUAL = {"AUTHORIZED": None, "VOIDED": None, "CAPTURED": 60}


def expect_attempt(s, doc, a):
    check_eq(set(doc), FIELDS, "fields of attempt %s" % a["id"])
    row = s.query("SELECT status, amount, currency, coalesce(provider_payment_id, '<null>'), "
                  "coalesce(reason, '<null>'), to_char(updated_at AT TIME ZONE 'UTC', "
                  "'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'), refunded_amount, capture_method, "
                  "coalesce(captured_amount::text, '<null>') FROM payment_attempts "
                  "WHERE id = '%s'" % a["id"])[0]
    got = [doc["status"], str(doc["amount"]), doc["currency"],
           doc["provider_payment_id"] if doc["provider_payment_id"] is not None else "<null>",
           doc["reason"] if doc["reason"] is not None else "<null>", doc["updated_at"],
           str(doc["refunded_amount"]), doc["capture_method"],
           str(doc["captured_amount"]) if doc["captured_amount"] is not None else "<null>"]
    check_eq(got, row, "attempt %s (%s) as answered vs the database" % (a["id"], a["status"]))
    check_eq((doc["payment_attempt_id"], doc["order_id"]), (a["id"], a["order_id"]), "ids")
    check(isinstance(doc["amount"], int), "amount is a JSON integer")
    check_eq((doc["capture_method"], doc["captured_amount"]),
             ("manual", MANUAL[a["status"]]) if a["status"] in MANUAL else ("automatic", None),
             "capture_method and captured_amount of a %s attempt" % a["status"])
    # Issue 38: none of these waits before a call of a worker's.
    check_eq(doc["queued"], None, "queued of a %s attempt no worker holds" % a["status"])


def refund_queued(s, port, paid):
    """A claimed refund whose worker said it waits for the budget answers
    queued with that reason and since; once the claim's lease has lapsed (a
    worker that died waiting) it answers null again."""
    r = api.insert_refund(s, paid, "PROCESSING", 5)
    s.psql(s.db, "UPDATE refund_attempts SET lease_owner = 'w-queued', "
           "lease_expires_at = now() + interval '1 hour' WHERE id = '%s'" % r["id"])
    s.psql(s.db, "UPDATE refund_attempts SET waiting_reason = 'provider_budget', "
           "waiting_since = '2026-01-02T03:04:05.678Z' WHERE id = '%s'" % r["id"])
    code, doc = api.get(port, "/v1/refunds/%s" % r["id"])
    check_eq((code, doc["status"], doc["queued"]),
             (200, "PROCESSING", {"reason": "provider_budget",
                                  "since": "2026-01-02T03:04:05.678Z"}),
             "a refund its worker holds back for the budget")
    s.psql(s.db, "UPDATE refund_attempts SET lease_expires_at = now() - interval '1 second' "
           "WHERE id = '%s'" % r["id"])
    code, doc = api.get(port, "/v1/refunds/%s" % r["id"])
    check_eq((code, doc["queued"]), (200, None), "a refund whose waiting claim lapsed")


def scenario(make):
    s = make("api_status", partitions=1)
    name, port = api.start_api(s)
    attempts = {}
    for st in STATES:
        reason = None if st in ("PENDING", "PROCESSING", "SUCCEEDED") else "%s: why \u00e9\u20ac" % st.lower()
        ppid = "pi_status_%s" % st.lower() if st in ("UNKNOWN", "FAILED", "REQUIRES_REVIEW",
                                                     "AUTHORIZED", "VOIDED", "CAPTURED") else None
        if st in MANUAL:
            a = api.insert_attempt(s, "AUTHORIZED", amount=100 + len(attempts), ppid=ppid,
                                   manual=True)
            if st != "AUTHORIZED":
                s.psql(s.db, "UPDATE payment_attempts SET status = '%s', captured_amount = %s "
                       "WHERE id = '%s'" % ("VOIDED" if st == "VOIDED" else "SUCCEEDED",
                                            MANUAL[st] or "NULL", a["id"]))
                a["status"] = st
            attempts[st] = a
            continue
        attempts[st] = api.insert_attempt(s, st, amount=100 + len(attempts), ppid=ppid, reason=reason)
    for st, a in attempts.items():
        code, doc = api.get(port, "/v1/payment-attempts/%s" % a["id"])
        check_eq(code, 200, "status code for a %s attempt" % st)
        expect_attempt(s, doc, a)
        # Upper case is the same id.
        code, doc2 = api.get(port, "/v1/payment-attempts/%s" % a["id"].upper())
        check_eq((code, doc2), (200, doc), "the upper-case id of a %s attempt" % st)

    # One order, three attempts: two failed, then one succeeded; oldest first.
    order = str(uuid.uuid4())
    first = api.insert_attempt(s, "FAILED", order_id=order, reason="declined: a")
    second = api.insert_attempt(s, "REJECTED", order_id=order, reason="order_has_live_attempt: b")
    third = api.insert_attempt(s, "SUCCEEDED", order_id=order)
    code, doc = api.get(port, "/v1/orders/%s/payment-attempts" % order)
    check_eq(code, 200, "status code of an order's list")
    check_eq(doc["order_id"], order, "order id of the list")
    check_eq([x["payment_attempt_id"] for x in doc["payment_attempts"]],
             [first["id"], second["id"], third["id"]], "the order's attempts, oldest first")
    for x, a in zip(doc["payment_attempts"], (first, second, third)):
        expect_attempt(s, x, a)

    # Refunds: the refund's own answer, and the charge's refunded_amount.
    paid = attempts["SUCCEEDED"]
    done = api.insert_refund(s, paid, "PROCESSING", 40)
    s.psql(s.db, "UPDATE refund_attempts SET status = 'SUCCEEDED', provider_refund_id = "
           "'re_status_0001' WHERE id = '%s'" % done["id"])
    lost = api.insert_refund(s, paid, "FAILED", 10, reserved=False, reason="refund failed: x")
    code, doc = api.get(port, "/v1/payment-attempts/%s" % paid["id"])
    check_eq((code, doc["refunded_amount"]), (200, 40), "refunded_amount of the refunded attempt")
    expect_attempt(s, doc, paid)
    for r, want in ((done, ("SUCCEEDED", 40, None, "re_status_0001")),
                    (lost, ("FAILED", 10, "refund failed: x", None))):
        code, doc = api.get(port, "/v1/refunds/%s" % r["id"].upper())
        check_eq(code, 200, "status code of a %s refund" % r["status"])
        check_eq(set(doc), REFUND_FIELDS, "fields of a refund")
        check_eq((doc["refund_id"], doc["payment_attempt_id"], doc["order_id"], doc["currency"],
                  doc["refund_reason"]),
                 (r["id"], paid["id"], paid["order_id"], "EUR", "requested_by_customer"),
                 "ids of a refund")
        check_eq((doc["status"], doc["amount"], doc["reason"], doc["provider_refund_id"]), want,
                 "a refund as answered")
        row = s.query("SELECT to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:"
                      "SS.MS\"Z\"') FROM refund_attempts WHERE id = '%s'" % r["id"])[0][0]
        check_eq(doc["updated_at"], row, "a refund's updated_at")
        check_eq(doc["queued"], None, "queued of a %s refund" % r["status"])
    refund_queued(s, port, paid)
    check_eq(api.get(port, "/v1/refunds/%s" % uuid.uuid4())[0], 404, "unknown refund")
    check_eq(api.get(port, "/v1/refunds/not-a-uuid")[0], 400, "malformed refund id")
    check_eq(api.request(port, "POST", "/v1/refunds/%s" % done["id"], b"{}")[0], 405,
             "POST to a refund")

    # Captures: one that took 60 of its authorization, one refused.
    held = api.insert_attempt(s, "AUTHORIZED", amount=100, ppid="pi_status_held", manual=True)
    took, refused = str(uuid.uuid4()), str(uuid.uuid4())
    s.psql(s.db, "INSERT INTO capture_attempts (id, payment_attempt_id, order_id, idempotency_key,"
           " request_fingerprint, amount, currency, status, reason, payment_intent) VALUES "
           "('%s', '%s', '%s', 'capture:%s', 'fp', 60, 'EUR', 'PENDING', NULL, 'pi_status_held'),"
           "('%s', '%s', '%s', 'capture:%s', 'fp', NULL, 'EUR', 'REJECTED', "
           "'authorization_held: another step holds it', NULL)"
           % (took, held["id"], held["order_id"], took, refused, held["id"], held["order_id"],
              refused))
    for sql in ("UPDATE payment_attempts SET held_by = 'capture', held_by_id = '%s' WHERE id = '%s'"
                % (took, held["id"]),
                "UPDATE capture_attempts SET holds, status = true, 'PROCESSING' WHERE id = '%s'"
                % took,
                "UPDATE payment_attempts SET status = 'SUCCEEDED', captured_amount = 60 "
                "WHERE id = '%s'" % held["id"],
                "UPDATE capture_attempts SET status = 'SUCCEEDED', captured_amount = 60 "
                "WHERE id = '%s'" % took):
        s.psql(s.db, sql.replace("SET holds, status = true, 'PROCESSING'",
                                 "SET holds = true, status = 'PROCESSING'"))
    for cid, want in ((took, ("SUCCEEDED", 60, 60, None, "pi_status_held")),
                      (refused, ("REJECTED", None, None,
                                 "authorization_held: another step holds it", None))):
        code, doc = api.get(port, "/v1/captures/%s" % cid.upper())
        check_eq((code, set(doc)), (200, CAPTURE_FIELDS), "a capture's fields")
        check_eq((doc["capture_id"], doc["payment_attempt_id"], doc["order_id"], doc["currency"]),
                 (cid, held["id"], held["order_id"], "EUR"), "ids of a capture")
        check_eq((doc["status"], doc["amount"], doc["captured_amount"], doc["reason"],
                  doc["provider_payment_id"]), want, "a capture as answered")
        check_eq(doc["queued"], None, "queued of a %s capture" % doc["status"])
    check_eq(api.get(port, "/v1/captures/%s" % uuid.uuid4())[0], 404, "unknown capture")
    check_eq(api.get(port, "/v1/captures/not-a-uuid")[0], 400, "malformed capture id")

    # Voids: one that released its authorization, one refused.
    gone = api.insert_attempt(s, "AUTHORIZED", amount=90, ppid="pi_status_gone", manual=True)
    freed, late = str(uuid.uuid4()), str(uuid.uuid4())
    s.psql(s.db, "INSERT INTO void_attempts (id, payment_attempt_id, order_id, idempotency_key,"
           " request_fingerprint, void_reason, status, reason, payment_intent) VALUES "
           "('%s', '%s', '%s', 'void:%s', 'fp', 'abandoned', 'PENDING', NULL, 'pi_status_gone'),"
           "('%s', '%s', '%s', 'void:%s', 'fp', 'duplicate', 'REJECTED', "
           "'authorization_held: another step holds it', NULL)"
           % (freed, gone["id"], gone["order_id"], freed, late, gone["id"], gone["order_id"], late))
    for sql in ("UPDATE payment_attempts SET held_by = 'void', held_by_id = '%s' WHERE id = '%s'"
                % (freed, gone["id"]),
                "UPDATE void_attempts SET holds = true, status = 'PROCESSING' WHERE id = '%s'"
                % freed,
                "UPDATE payment_attempts SET status = 'VOIDED' WHERE id = '%s'" % gone["id"],
                "UPDATE void_attempts SET status = 'SUCCEEDED', released_amount = 90 "
                "WHERE id = '%s'" % freed):
        s.psql(s.db, sql)
    for vid, want in ((freed, ("SUCCEEDED", "abandoned", 90, None, "pi_status_gone")),
                      (late, ("REJECTED", "duplicate", None,
                              "authorization_held: another step holds it", None))):
        code, doc = api.get(port, "/v1/voids/%s" % vid.upper())
        check_eq((code, set(doc)), (200, VOID_FIELDS), "a void's fields")
        check_eq((doc["void_id"], doc["payment_attempt_id"], doc["order_id"]),
                 (vid, gone["id"], gone["order_id"]), "ids of a void")
        check_eq((doc["status"], doc["void_reason"], doc["released_amount"], doc["reason"],
                  doc["provider_payment_id"]), want, "a void as answered")
        check_eq(doc["queued"], None, "queued of a %s void" % doc["status"])
    check_eq(api.get(port, "/v1/voids/%s" % uuid.uuid4())[0], 404, "unknown void")
    check_eq(api.get(port, "/v1/voids/not-a-uuid")[0], 400, "malformed void id")

    # Nothing else leaks: no payment method, metadata, key or secret.
    s.psql(s.db, "UPDATE payment_attempts SET payment_method = 'pm_secret_card_4242', "
           "metadata = '{\"card\":\"4242424242424242\"}', customer_id = 'cus_hidden'")
    for path in ["/v1/payment-attempts/%s" % attempts["SUCCEEDED"]["id"],
                 "/v1/orders/%s/payment-attempts" % order]:
        raw = api.request(port, "GET", path)[2].decode()
        for secret in ("pm_secret_card_4242", "4242424242424242", "cus_hidden", "key-",
                       api.SECRET, "fp"):
            check(secret not in raw.replace("\"fp\"", ""), "%r in the answer of %s" % (secret, path))

    # 400 for a malformed id, 404 for an unknown one.
    for bad in ["not-a-uuid", "1234", attempts["PENDING"]["id"] + "0",
                attempts["PENDING"]["id"][:-1], "%00", "x" * 5000,
                attempts["PENDING"]["id"] + "/extra", "' OR 1=1 --"]:
        code, doc = api.get(port, "/v1/payment-attempts/" + bad.replace(" ", "%20"))
        check_eq(code, 400, "status for attempt id %r" % bad[:60])
        check(doc and "error" in doc, "error body for attempt id %r" % bad[:60])
        code, doc = api.get(port, "/v1/orders/%s/payment-attempts" % bad.replace(" ", "%20"))
        # A NUL ends the path: what is left names no endpoint.
        check_eq(code, 404 if bad == "%00" else 400, "status for order id %r" % bad[:60])
    check_eq(api.get(port, "/v1/payment-attempts/%s" % uuid.uuid4())[0], 404, "unknown attempt")
    check_eq(api.get(port, "/v1/orders/%s/payment-attempts" % uuid.uuid4())[0], 404, "unknown order")
    check_eq(api.get(port, "/v1/orders/%s" % order)[0], 404, "order path without the list")
    check_eq(api.get(port, "/v1/elsewhere")[0], 404, "unknown path")
    st, _, _ = api.request(port, "DELETE", "/v1/payment-attempts/%s" % first["id"])
    check_eq(st, 405, "DELETE of an attempt")
    st, _, _ = api.request(port, "GET", "/v1/webhooks/provider")
    check_eq(st, 405, "GET of the webhook endpoint")

    # The database gone: 503, not a crash, and answers again once it is back.
    s.psql(s.admin_db, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
           "WHERE datname = '%s' AND pid <> pg_backend_pid()" % s.tag.lower())
    code, doc = api.get(port, "/v1/payment-attempts/%s" % first["id"])
    check(code in (200, 503), "status right after the database dropped us: %d" % code)
    e2e.wait_until("the api answering again",
                   lambda: api.get(port, "/v1/payment-attempts/%s" % first["id"])[0] == 200, 30)
    check_eq(api.stop_api(s, name), 0, "api exit status on SIGTERM")
    log = open("%s/%s.log" % (s.dir, name)).read()
    for line in log.splitlines():
        json.loads(line)


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
