#!/usr/bin/env python3
"""Adversary 41c: one answer of charged's api that is cut short holds up
every other row of the order service's confirmer, for good.

examples/order_service/README.md: "one question that fails, or one answer
whose effect the database refuses, holds up no other: Confirmer.confirm():
a failed question moves that row's next one on like an answered one".
ChargedApi.get() and Confirmer.confirm() only catch OSError and ValueError.
An HTTP answer whose body is shorter than its Content-Length (a connection
cut mid-answer, a proxy's garbage) raises http.client.IncompleteRead, an
http.client.HTTPException, which is neither: it leaves confirm() before the
row's next_poll_at moves, confirm_due() aborts the round, Confirmer.run()
logs "unexpected error" and waits, and the next round starts with the same
row (ORDER BY next_poll_at NULLS FIRST: it is still the oldest). Every row
behind it is never asked: orders charged's api says SUCCEEDED stay unpaid.

The test: three orders, each made due by its charge.succeeded event (the
first one's first, so it is the oldest). charged's api (a local HTTP
server answering from a table) answers the first attempt with a body cut
short and the two others SUCCEEDED. The service's own Confirmer thread
(ChargedApi, the real HTTP client) runs for 10 s: the two others must be
paid. Before acc8c1b neither was, and neither was ever asked.

Runs on a real PostgreSQL with deploy/.tools' python (psycopg), like
test_order_service_events.py."""
import http.server
import json
import os
import sys
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("CHARGED_SOURCE_DIR") or os.path.join(HERE, "..", "..")
PYTHON = os.environ.get("ORDER_SERVICE_PYTHON",
                        os.path.join(SOURCE, "deploy", ".tools", "bin", "python"))
try:
    import psycopg
except ImportError:
    if not os.access(PYTHON, os.X_OK):
        print("%s missing: run deploy/install-deps.sh" % PYTHON, file=sys.stderr)
        sys.exit(1)
    os.execv(PYTHON, [PYTHON] + sys.argv)

sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SOURCE, "examples", "order_service"))
import order_service as svc  # noqa: E402
import order_service_e2e as oe  # noqa: E402
from test_order_service_events import Feed, event  # noqa: E402

FAILURES = []
ANSWERS = {}   # path -> JSON document, or "CUT" for an answer cut short
ASKED = []


def check_eq(got, want, what):
    if got != want:
        FAILURES.append("%s: got %r, want %r" % (what, got, want))
        print("FAIL", FAILURES[-1], file=sys.stderr)


class Api(http.server.BaseHTTPRequestHandler):
    """charged's api, answering from ANSWERS."""

    def do_GET(self):
        ASKED.append(self.path)
        doc = ANSWERS.get(self.path)
        if doc is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif doc == "CUT":
            body = b'{"status": "SUCC'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body) + 200))
            self.end_headers()
            self.wfile.write(body)
            self.wfile.flush()
            self.close_connection = True
        else:
            body = json.dumps(doc).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "adv41c_hol_%d" % os.getpid()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute('CREATE DATABASE "%s"' % name)
    url = base.rsplit("/", 1)[0] + "/" + name
    os.environ["ORDERS_DATABASE_URL"] = url
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(svc.SCHEMA)
            scenario(conn, "http://127.0.0.1:%d" % server.server_address[1])
    finally:
        server.shutdown()
        oe.drop_database(psycopg, base, name)
    if FAILURES:
        print("%d failed" % len(FAILURES), file=sys.stderr)
        return 1
    print("adv41c confirmer head of line: all held")
    return 0


def scenario(conn, api_url):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    svc.refund_for = lambda seq, amount: None
    svc.place_orders(3)
    rows = q("SELECT o.order_id, a.payment_attempt_id, o.amount, o.currency FROM orders o "
             "JOIN order_attempts a USING (order_id) ORDER BY o.seq")
    for order, attempt, amount, currency in rows:
        ANSWERS["/v1/payment-attempts/%s" % attempt] = {
            "payment_attempt_id": str(attempt), "order_id": str(order), "status": "SUCCEEDED",
            "amount": amount, "currency": currency}
    first = rows[0][1]
    ANSWERS["/v1/payment-attempts/%s" % first] = "CUT"
    # The commands were sent (the publisher's mark), and each attempt's
    # charge.succeeded event arrived, the first one's first.
    q("UPDATE outbox SET sent_at = now() RETURNING 1")
    feed = Feed(conn)
    for order, attempt, _, _ in rows:
        feed.send(event("charge.succeeded", attempt, order))
    # The cut-short row first in the confirmer's order, the others behind it.
    q("UPDATE order_attempts SET next_poll_at = now() - interval '1 minute' "
      "WHERE payment_attempt_id = %s RETURNING 1", first)

    others = [(str(o), str(a)) for o, a, _, _ in rows[1:]]

    def paid():
        return [(str(o), str(a)) for o, a in
                q("SELECT order_id, paid_attempt_id FROM orders WHERE paid ORDER BY seq")]
    stop = threading.Event()
    confirmer = svc.Confirmer(stop, svc.ChargedApi(api_url))
    confirmer.start()
    deadline = time.time() + 30
    while time.time() < deadline and [p for p in paid() if p in others] != others:
        time.sleep(0.2)
    stop.set()
    confirmer.join(30)
    paid = paid()
    print("asked: %s" % json.dumps({p.rsplit("/", 1)[1][:8]: ASKED.count(p) for p in
                                    sorted(set(ASKED))}))
    check_eq([p for p in paid if p in others], others,
             "orders charged's api says SUCCEEDED, paid within 30 s of the confirmer, "
             "behind one answer cut short")
    check_eq(sorted(set(ASKED) - {"/v1/payment-attempts/%s" % first}),
             sorted("/v1/payment-attempts/%s" % a for _, a in others),
             "rows asked about besides the one whose answer was cut short")


if __name__ == "__main__":
    sys.exit(main())
