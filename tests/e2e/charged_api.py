"""`charged api` in end-to-end scenarios: starting it, signing and sending
webhooks the way the provider does, asking for status, and putting attempts
in any state straight into a scenario's database.

Python standard library only. The signature is computed here independently
of the C code under test (hmac + hashlib), so a bug there cannot hide.
"""

import hashlib
import hmac
import http.client
import json
import os
import subprocess
import time
import uuid

import charged_e2e as e2e

SECRET = "whsec_e2e_current_secret_1"
OLD_SECRET = "whsec_e2e_previous_secret_0"


def sign(body, secret=SECRET, t=None):
    """The Stripe-Signature header for body (bytes) at unix time t."""
    t = int(time.time()) if t is None else int(t)
    mac = hmac.new(secret.encode(), b"%d." % t + body, hashlib.sha256).hexdigest()
    return "t=%d,v1=%s" % (t, mac)


def start_api(s, secrets=(SECRET,), port=None, **extra_env):
    """`charged api` for scenario s on free loopback ports (or API port
    `port`); returns (name, port) once it answers. Its log is <name>.log in
    the scenario dir."""
    s.worker_seq += 1
    name = "api%d" % s.worker_seq
    port = port or e2e.free_port()
    # ADMIN_ADDR: the scenario's (port 0; s.admin_port(name) finds it).
    env = s.env({"API_ADDR": "127.0.0.1:%d" % port,
                 "WEBHOOK_SIGNING_SECRET": ",".join(secrets),
                 "WORKER_ID": "%s-%s" % (name, uuid.uuid4().hex[:6])})
    env.update({k: str(v) for k, v in extra_env.items()})
    out = open(os.path.join(s.dir, name + ".log"), "ab")
    p = subprocess.Popen([e2e.CHARGED, "api"], stdout=out, stderr=out, env=env)
    s.apis[name] = p

    def up():
        if p.poll() is not None:
            raise e2e.Failure("charged api exited %d at start; see %s" % (p.returncode, out.name))
        try:
            return get(port, "/v1/payment-attempts/%s" % uuid.uuid4())[0] == 404
        except OSError:
            return False
    e2e.wait_until("charged api listening", up, 20)
    e2e.log("started api", name, "pid", p.pid, "port", port)
    return name, port


def psp_webhook_args(port, secret=SECRET):
    """psp-sim flags that deliver its signed events to an api on port."""
    return ["--webhook-url", "http://127.0.0.1:%d/v1/webhooks/provider" % port,
            "--webhook-secret", secret, "--webhook-retry-ms", "100"]


def stop_api(s, name, timeout=30):
    p = s.apis.pop(name)
    p.terminate()
    return p.wait(timeout=e2e.scaled(timeout))


def request(port, method, path, body=None, headers=None, timeout=30):
    """(status, parsed JSON or None, raw bytes)."""
    st, doc, _, raw = request_with_headers(port, method, path, body, headers, timeout)
    return st, doc, raw


def request_with_headers(port, method, path, body=None, headers=None, timeout=30,
                         source=None):
    """(status, parsed JSON or None, the answer's headers, raw bytes);
    source: the loopback address to send from (another client host)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=e2e.scaled(timeout),
                                   source_address=(source, 0) if source else None)
    try:
        c.request(method, path, body=body, headers=headers or {})
        r = c.getresponse()
        raw = r.read()
        try:
            doc = json.loads(raw) if raw else None
        except ValueError:
            doc = None
        return r.status, doc, r.headers, raw
    finally:
        c.close()


def get(port, path):
    st, doc, _ = request(port, "GET", path)
    return st, doc


def post_webhook(port, body, header="sign", secret=SECRET, t=None, extra_headers=None):
    """POSTs body (bytes, or an object made JSON) to the webhook endpoint,
    signed with secret at t unless header is given (None: no signature).
    Returns (status, JSON answer)."""
    if not isinstance(body, (bytes, bytearray)):
        body = json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    if header == "sign":
        header = sign(body, secret, t)
    if header is not None:
        headers["Stripe-Signature"] = header
    headers.update(extra_headers or {})
    st, doc, _ = request(port, "POST", "/v1/webhooks/provider", body, headers)
    return st, doc


def event(kind, attempt, intent=None, created=None, event_id=None, amount=None,
          currency=None, decline_code=None):
    """A Stripe-shaped event about attempt (a dict from insert_attempt):
    kind is succeeded, payment_failed or processing."""
    status = {"succeeded": "succeeded", "payment_failed": "requires_payment_method",
              "processing": "processing", "canceled": "canceled"}[kind]
    pi = {"id": intent or attempt.get("ppid") or "pi_" + uuid.uuid4().hex[:24],
          "object": "payment_intent", "status": status,
          "amount": attempt["amount"] if amount is None else amount,
          "currency": (currency or attempt["currency"]).lower(),
          "metadata": {"payment_attempt_id": attempt["id"], "order_id": attempt["order_id"]}}
    if kind == "payment_failed":
        pi["last_payment_error"] = {"code": "card_declined",
                                    "decline_code": decline_code or "insufficient_funds"}
    return {"id": event_id or "evt_" + uuid.uuid4().hex, "object": "event",
            "type": "payment_intent." + kind,
            "created": int(time.time()) if created is None else created,
            "livemode": False, "data": {"object": pi}}


def insert_attempt(s, status, amount=1999, currency="EUR", ppid=None, reason=None,
                   order_id=None, lease_owner=None, manual=False):
    """An attempt in the given status, written straight into the scenario's
    database (the states the worker would reach, without driving it there);
    manual: an authorization's (capture_method manual)."""
    a = {"id": str(uuid.uuid4()), "order_id": order_id or str(uuid.uuid4()),
         "amount": amount, "currency": currency, "status": status, "ppid": ppid,
         "reason": reason}
    if status == "SUCCEEDED" and not ppid:
        a["ppid"] = "pi_" + uuid.uuid4().hex[:24]
    lease = ("'%s', now() + interval '60 seconds'" % lease_owner) if lease_owner else "NULL, NULL"

    def lit(v):
        return "NULL" if v is None else "'%s'" % str(v).replace("'", "''")
    s.psql(s.db, "INSERT INTO payment_attempts (id, order_id, idempotency_key, "
           "request_fingerprint, amount, currency, payment_method, status, reason, "
           "provider_payment_id, lease_owner, lease_expires_at, first_sent_at, capture_method) "
           "VALUES ('%s', '%s', 'key-%s', 'fp', %d, '%s', 'pm_card_visa', '%s', %s, %s, %s, %s, "
           "'%s')"
           % (a["id"], a["order_id"], a["id"], amount, currency, status, lit(reason),
              lit(a["ppid"]), lease, "NULL" if status in ("PENDING", "REJECTED") else "now()",
              "manual" if manual else "automatic"))
    return a


def counts(s, attempt_id):
    """What an attempt has accumulated: transitions, outbox events, ledger rows."""
    row = s.query(
        "SELECT (SELECT count(*) FROM attempt_transitions WHERE payment_attempt_id = '%s'),"
        " (SELECT count(*) FROM outbox WHERE payment_attempt_id = '%s'),"
        " (SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'),"
        " (SELECT status FROM payment_attempts WHERE id = '%s')"
        % (attempt_id, attempt_id, attempt_id, attempt_id))[0]
    return {"transitions": int(row[0]), "outbox": int(row[1]), "ledger": int(row[2]),
            "status": row[3]}


def webhook_rows(s):
    """processed_webhook_events as {event_id: outcome}."""
    return dict((r[0], r[1]) for r in s.query(
        "SELECT event_id, outcome FROM processed_webhook_events"))


def insert_refund(s, attempt, status, amount, reserved=True, ppid=None, reason=None):
    """A refund of attempt (a SUCCEEDED one from insert_attempt) in the
    given status, as a worker leaves it: reserved on the charge's row."""
    r = {"id": str(uuid.uuid4()), "attempt": attempt, "amount": amount, "status": status}
    if reserved:
        s.psql(s.db, "UPDATE payment_attempts SET refund_reserved = refund_reserved + %d "
               "WHERE id = '%s'" % (amount, attempt["id"]))
    s.psql(s.db, "INSERT INTO refund_attempts (id, payment_attempt_id, order_id, "
           "idempotency_key, request_fingerprint, amount, currency, refund_reason, status, "
           "reason, payment_intent, provider_refund_id, reserved) VALUES ('%s', '%s', '%s', "
           "'refund-%s', 'fp', %d, '%s', 'requested_by_customer', '%s', %s, '%s', %s, %s)"
           % (r["id"], attempt["id"], attempt["order_id"], r["id"], amount,
              attempt["currency"], status,
              "NULL" if reason is None else "'%s'" % reason.replace("'", "''"),
              attempt["ppid"], "NULL" if ppid is None else "'%s'" % ppid,
              "true" if reserved else "false"))
    return r


def refund_object(refund, re_id, status, failure_reason=None, with_metadata=True):
    """A Stripe refund object for refund (from insert_refund)."""
    o = {"id": re_id, "object": "refund", "status": status, "amount": refund["amount"],
         "currency": refund["attempt"]["currency"].lower(),
         "payment_intent": refund["attempt"]["ppid"], "metadata": {}}
    if with_metadata:
        o["metadata"] = {"refund_id": refund["id"],
                         "payment_attempt_id": refund["attempt"]["id"]}
    if failure_reason:
        o["failure_reason"] = failure_reason
    return o


def refund_event(kind, obj, event_id=None):
    """refund.created|updated|failed about a refund object, or charge.refunded
    when obj is a list of refund objects."""
    if kind == "charge.refunded":
        obj = {"id": "ch_" + uuid.uuid4().hex[:24], "object": "charge",
               "payment_intent": obj[0]["payment_intent"], "refunded": True,
               "refunds": {"object": "list", "data": obj}}
    return {"id": event_id or "evt_" + uuid.uuid4().hex, "object": "event", "type": kind,
            "created": int(time.time()), "livemode": False, "data": {"object": obj}}


def refund_counts(s, refund_id):
    """A refund's status, provider refund id, transitions and result events."""
    row = s.query(
        "SELECT status, coalesce(provider_refund_id, '-'),"
        " (SELECT count(*) FROM refund_transitions WHERE refund_id = '%s'),"
        " (SELECT count(*) FROM outbox WHERE refund_id = '%s')"
        " FROM refund_attempts WHERE id = '%s'" % (refund_id, refund_id, refund_id))[0]
    return (row[0], row[1], int(row[2]), int(row[3]))


def refund_money(s, attempt_id):
    """(refund_reserved, refunded_amount, refund ledger rows) of an attempt."""
    row = s.query("SELECT refund_reserved, refunded_amount, (SELECT count(*) FROM "
                  "ledger_entries WHERE payment_attempt_id = p.id AND kind = 'refund') "
                  "FROM payment_attempts p WHERE id = '%s'" % attempt_id)[0]
    return tuple(int(x) for x in row)
