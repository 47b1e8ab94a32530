#!/usr/bin/env python3
"""One provider answer must not jam the worker.

The worker talks to a provider of this test's own, which answers:
  - payment method "pm_x" + 120 x "e-acute": 400 invalid_request_error
    resource_missing whose message quotes the payment method (as Stripe
    does), longer than the worker keeps, so a naive cut lands inside a
    two-byte character;
  - "pm_emptyid": 200 with a succeeded intent whose id is "";
  - "pm_hugeerr": 500 with a 100 KB message of multibyte UTF-8 and control
    characters;
  - "pm_redirect": 302, an answer the protocol does not have;
  - "pm_wrongamount": 200 succeeded, but for another amount than asked;
  - "pm_bad402": 402 whose body is not JSON;
  - anything else: 200 succeeded with a unique id.
The six commands sit on one partition, the poisoned ones first. Every one
settles: the ordinary ones SUCCEEDED with the provider's ids, the invalid one
FAILED with a valid UTF-8 reason, the empty id neither SUCCEEDED nor FAILED,
the 500 UNKNOWN, the 302 UNKNOWN after a bounded number of sends (not
retried for as long as the key is kept), the wrong amount and the bad 402
REQUIRES_REVIEW with a reason; no lease is left held, every call is in provider_calls and
every offset is committed."""
import json
import threading
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import charged_e2e as e2e
from charged_e2e import check, check_eq

POISON_PM = "pm_x" + "\u00e9" * 120
EMPTY_ID_PM = "pm_emptyid"
HUGE_ERR_PM = "pm_hugeerr"
REDIRECT_PM = "pm_redirect"
WRONG_AMOUNT_PM = "pm_wrongamount"
BAD_402_PM = "pm_bad402"


def huge_message():
    # Starts with one ASCII byte and three-byte characters, so that a cut at
    # 255 bytes falls inside a character; then a mix of 2-, 3- and 4-byte
    # characters, C0 controls (escaped in JSON) and DEL (raw). No NUL: the
    # answer stays JSON that jansson parses, so its message is really used.
    head = "E" + "\u20ac" * 100
    chunk = ("Zahlungsanbieter \u00fcberlastet \u2014 \u652f\u4ed8\u5931\u8d25 \u2603 "
             "\U0001F4B3 \x01\x02\x07\x08\x0b\x0c\x1b\x7f\t\r\n ")
    msg = head
    while len(msg.encode()) < 100 * 1024:
        msg += chunk
    return msg


class Provider:
    """A PaymentIntents endpoint with the answers above; records every request."""

    def __init__(self):
        self.requests = []
        self.lock = threading.Lock()
        self.intents = {}  # idempotency key -> intent id (ordinary ones)
        self.huge = huge_message()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n).decode("utf-8", errors="replace")
                form = {k: v[0] for k, v in urllib.parse.parse_qs(body).items()}
                key = self.headers.get("Idempotency-Key")
                if self.path != "/v1/payment_intents":
                    return self.answer(404, {"error": {"type": "invalid_request_error",
                                                       "message": "Unrecognized request URL."}})
                pm = form.get("payment_method", "")
                with provider.lock:
                    provider.requests.append({
                        "attempt": form.get("metadata[payment_attempt_id]"),
                        "key": key, "payment_method": pm, "amount": form.get("amount")})
                amount = int(form.get("amount") or 0)
                if pm.startswith("pm_x"):
                    return self.answer(400, {"error": {
                        "type": "invalid_request_error", "code": "resource_missing",
                        "param": "payment_method",
                        "message": "No such PaymentMethod: '%s'" % pm}})
                if pm == EMPTY_ID_PM:
                    return self.answer(200, {"id": "", "object": "payment_intent",
                                             "status": "succeeded", "amount": amount,
                                             "currency": form.get("currency")})
                if pm == REDIRECT_PM:
                    self.send_response(302)
                    self.send_header("Location", "http://127.0.0.1:1/elsewhere")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if pm == WRONG_AMOUNT_PM:
                    return self.answer(200, {"id": "pi_" + uuid.uuid4().hex,
                                             "object": "payment_intent",
                                             "status": "succeeded", "amount": amount + 1,
                                             "currency": form.get("currency")})
                if pm == BAD_402_PM:
                    data = b"<html>payment required</html>"
                    self.send_response(402)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                if pm == HUGE_ERR_PM:
                    return self.answer(500, {"error": {"type": "api_error",
                                                       "message": provider.huge}})
                with provider.lock:
                    replayed = key in provider.intents
                    pid = provider.intents.setdefault(key, "pi_" + uuid.uuid4().hex)
                return self.answer(200, {"id": pid, "object": "payment_intent",
                                         "status": "succeeded", "amount": amount,
                                         "currency": form.get("currency")},
                                   replayed=replayed)

            def answer(self, status, doc, replayed=False):
                data = json.dumps(doc, ensure_ascii=False).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if replayed:
                    self.send_header("Idempotent-Replayed", "true")
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = "http://127.0.0.1:%d" % self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()

    def calls_of(self, attempt):
        with self.lock:
            return [r for r in self.requests if r["attempt"] == attempt]


def scenario(new):
    s = new("poison_answer", partitions=1)
    provider = Provider()
    try:
        run(s, provider)
    finally:
        provider.close()


def run(s, provider):
    poisoned = e2e.new_command(payment_method=POISON_PM)
    empty_id = e2e.new_command(payment_method=EMPTY_ID_PM)
    huge_err = e2e.new_command(payment_method=HUGE_ERR_PM)
    redirect = e2e.new_command(payment_method=REDIRECT_PM)
    wrong_amount = e2e.new_command(payment_method=WRONG_AMOUNT_PM)
    bad_402 = e2e.new_command(payment_method=BAD_402_PM)
    ordinary = [e2e.new_command() for _ in range(3)]
    cmds = [poisoned, empty_id, huge_err, redirect, wrong_amount, bad_402] + ordinary
    s.publish(cmds)  # one partition: in this order, fetched together
    s.start_worker(PROVIDER_BASE_URL=provider.url)
    ids = "', '".join(c["payment_attempt_id"] for c in cmds)

    def status():
        rows = s.query("SELECT id, status, lease_owner IS NOT NULL FROM payment_attempts "
                       "WHERE id IN ('%s')" % ids)
        return dict((r[0], (r[1], r[2] == "t")) for r in rows)

    try:
        s.wait_settled(len(cmds), timeout=30)
    except e2e.Failure as e:
        names = {poisoned["payment_attempt_id"]: "poisoned",
                 empty_id["payment_attempt_id"]: "empty id",
                 huge_err["payment_attempt_id"]: "huge error"}
        raise e2e.Failure("%s: the worker is jammed; attempts %s, lag %s, provider requests %d"
                          % (e, dict((names.get(k, "ordinary " + k[:8]), v)
                                     for k, v in status().items()),
                             s.lag()["lag"], len(provider.requests))) from None

    st = status()
    for c in ordinary:
        aid = c["payment_attempt_id"]
        rows = s.query("SELECT status, coalesce(provider_payment_id, '') FROM payment_attempts "
                       "WHERE id = '%s'" % aid)
        want = provider.intents.get(c["idempotency_key"])
        check(rows == [["SUCCEEDED", want]],
              "ordinary attempt %s: %s, the provider's intent is %s" % (aid, rows, want))

    # The poisoned one: FAILED, its reason valid UTF-8 (byte for byte).
    aid = poisoned["payment_attempt_id"]
    rows = s.query("SELECT status, encode(convert_to(coalesce(reason, ''), 'UTF8'), 'hex') "
                   "FROM payment_attempts WHERE id = '%s'" % aid)
    check(rows and rows[0][0] == "FAILED", "the invalid request's attempt is %s" % rows)
    raw = bytes.fromhex(rows[0][1])
    try:
        reason = raw.decode("utf-8", errors="strict")
    except UnicodeDecodeError as e:
        raise e2e.Failure("the FAILED attempt's reason is not valid UTF-8 (%s): %r"
                          % (e, raw)) from None
    check(reason.encode("utf-8") == raw, "the reason does not round-trip as UTF-8: %r" % reason)
    check(reason.startswith("invalid_request"),
          "reason %r does not start with invalid_request" % reason)
    e2e.log("poisoned attempt FAILED, reason %d bytes: %r..." % (len(raw), reason[:80]))

    # The empty id: a 2xx without an intent id is not a success we can record.
    aid = empty_id["payment_attempt_id"]
    check(st[aid][0] in ("UNKNOWN", "REQUIRES_REVIEW"),
          "the attempt answered 'succeeded' with an empty intent id is %s; it must be UNKNOWN "
          "or REQUIRES_REVIEW (never SUCCEEDED without an id, never FAILED)" % st[aid][0])

    aid = huge_err["payment_attempt_id"]
    check(st[aid][0] == "UNKNOWN", "the attempt answered 500 is %s, not UNKNOWN" % st[aid][0])

    # An answer outside the protocol is unknown, sent a bounded number of
    # times (the first, then WORKER_UNKNOWN_RETRIES), never for a day.
    aid = redirect["payment_attempt_id"]
    check(st[aid][0] == "UNKNOWN", "the attempt answered 302 is %s, not UNKNOWN" % st[aid][0])
    sends = len(provider.calls_of(aid))
    retries = int(s.env()["WORKER_UNKNOWN_RETRIES"])
    check(1 <= sends <= retries + 1, "the 302 was sent %d times, at most %d expected"
          % (sends, retries + 1))

    # A success for another amount, and a 402 we cannot read, are for a human.
    for c, what in ((wrong_amount, "succeeded for another amount"),
                    (bad_402, "402 with a body that is not JSON")):
        aid = c["payment_attempt_id"]
        rows = s.query("SELECT status, coalesce(reason, '') FROM payment_attempts "
                       "WHERE id = '%s'" % aid)
        check(rows and rows[0][0] == "REQUIRES_REVIEW" and
              len(rows[0][1]) > len("requires_review: "),
              "the attempt answered %s is %s; REQUIRES_REVIEW with a reason expected"
              % (what, rows))
    check(not s.query("SELECT 1 FROM ledger_entries WHERE payment_attempt_id = '%s'"
                      % wrong_amount["payment_attempt_id"]),
          "a success for another amount was booked in the ledger")

    held = [k for k, v in st.items() if v[1] or v[0] in ("PENDING", "PROCESSING")]
    check(not held, "attempts left in flight or holding a lease: %s" % held)

    # Every call reached the database's call log, and the provider saw each attempt.
    rows = s.query("SELECT a.id, count(p.*) FROM payment_attempts a LEFT JOIN provider_calls p "
                   "ON p.payment_attempt_id = a.id WHERE a.id IN ('%s') GROUP BY a.id" % ids)
    logged = dict((r[0], int(r[1])) for r in rows)
    for c in cmds:
        aid = c["payment_attempt_id"]
        check(logged.get(aid, 0) >= 1, "attempt %s (%s) has no provider_calls row" % (
            aid, c["payment_method"][:12]))
        check(provider.calls_of(aid), "the provider never saw attempt %s" % aid)
    lag = s.lag()
    check_eq(lag["lag"], 0, "lag of the group (%s)" % lag)
    e2e.log("settled:", sorted(v[0] for v in st.values()), "provider requests",
            len(provider.requests), "provider_calls rows", sum(logged.values()))


if __name__ == "__main__":
    raise SystemExit(e2e.main(scenario))
