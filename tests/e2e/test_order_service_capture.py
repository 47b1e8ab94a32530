#!/usr/bin/env python3
"""examples/order_service for a shop that ships later (issue 37): it
authorizes at checkout, captures at shipment (less when an item is
missing) and voids on cancel. Its inbox and confirmer against result events
anyone could write, on a real PostgreSQL, with charged's api a table of
answers, as test_order_service_events.py (whose harness it uses).

- place-orders --authorize sends authorization.requested; an order is
  authorized only when charged's api says its attempt is AUTHORIZED with
  capture_method manual: not on an event (charged says PROCESSING), not
  on an answer that is not our row's (no capture_method: a charge).
- ship: a capture.requested (key order-svc-capture:<capture_id>, keyed by
  the attempt, amount less than the order's when an item is missing) for
  authorized orders only. A forged capture.succeeded pays nothing while
  charged says PROCESSING; SUCCEEDED pays the order once with what it took
  (paid_amount) and its refund is bound by that; an answer taking more
  than we asked is answer_mismatch and pays nothing; reversed by a review
  it is unpaid, restored paid again, never refunded twice.
- cancel: a void.requested (requested_by_customer) for authorized orders
  not shipped; a forged void.succeeded (charged: 404) releases nothing;
  SUCCEEDED releases the order's amount and pays nothing.
- Shipped or canceled, never both: ship and cancel racing over the same
  orders send one command per order, and the database refuses a void of
  a shipped order (and turning it canceled).
- An authorization VOIDED `expired` while neither shipped nor canceled
  raises authorization_expired; a capture FAILED authorization_expired
  too; capture REJECTED capture_rejected and void REJECTED
  void_after_capture void_rejected, with charged's reason; an authorization
  captured though we never shipped, captured_not_shipped. Each once.
- A replay of every event applies nothing again; report's totals
  (authorized, captured, released, voided, refunded) are charged's
  answers.

Runs with deploy/.tools' python (psycopg); started by another python it
runs itself again with that one."""
import json
import os
import random
import sys
import threading
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
from test_order_service_events import (FAILURES, Charged, Feed, check_eq,  # noqa: E402
                                       confirmer, event)


class Answers(Charged):
    """charged's answers about captures and voids too, made from our rows;
    an attempt's says capture_method manual unless told otherwise."""

    def attempt(self, q, attempt, status, **over):
        Charged.attempt(self, q, attempt, status, **dict({"capture_method": "manual"}, **over))

    def capture(self, q, capture, status, **over):
        attempt, order, amount, currency = q(
            "SELECT c.payment_attempt_id, c.order_id, c.amount, o.currency FROM order_captures c "
            "JOIN orders o USING (order_id) WHERE capture_id = %s", capture)[0]
        doc = {"capture_id": str(capture), "payment_attempt_id": str(attempt),
               "order_id": str(order), "status": status, "amount": amount, "currency": currency,
               "captured_amount": amount if status == "SUCCEEDED" else None}
        doc.update(over)
        self.answers["/v1/captures/%s" % capture] = doc

    def void(self, q, void, status, **over):
        attempt, order, amount = q(
            "SELECT v.payment_attempt_id, v.order_id, o.amount FROM order_voids v JOIN orders o "
            "USING (order_id) WHERE void_id = %s", void)[0]
        doc = {"void_id": str(void), "payment_attempt_id": str(attempt), "order_id": str(order),
               "status": status, "void_reason": "requested_by_customer",
               "released_amount": amount if status == "SUCCEEDED" else None}
        doc.update(over)
        self.answers["/v1/voids/%s" % void] = doc


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "order_capture_%d" % os.getpid()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute('CREATE DATABASE "%s"' % name)
    url = base.rsplit("/", 1)[0] + "/" + name
    os.environ["ORDERS_DATABASE_URL"] = url
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(svc.SCHEMA)
            Scenario(conn).run()
    finally:
        oe.drop_database(psycopg, base, name)
    if FAILURES:
        print("%d failed" % len(FAILURES), file=sys.stderr)
        return 1
    print("order service captures and voids: all held")
    return 0


class Scenario:
    def __init__(self, conn):
        self.conn = conn
        self.charged = Answers()
        self.c = confirmer(self.charged)
        self.feed = Feed(conn)
        self.sent = []  # every event fed, for the replay

    def q(self, sql, *a):
        return self.conn.execute(sql, a).fetchall()

    def confirm(self):
        """The confirmer's round once every row's interval has passed."""
        for table in ("order_attempts", "order_refunds", "order_captures", "order_voids"):
            self.conn.execute("UPDATE %s SET next_poll_at = NULL" % table)
        self.c.confirm_due()

    def send(self, *events):
        self.sent.extend(events)
        self.feed.send(*events)

    def alarms(self, order):
        return [k for k, in self.q("SELECT kind FROM order_alarms WHERE order_id = %s "
                                   "ORDER BY alarm_id", order)]

    def authorize(self, *pairs, **over):
        """charged says each attempt AUTHORIZED (manual), and its event comes."""
        for o, a in pairs:
            self.charged.attempt(self.q, a, "AUTHORIZED", **over)
            self.send(event("authorization.succeeded", a, o))
        self.confirm()

    def step_of(self, table, key, order):
        return self.q("SELECT %s FROM %s WHERE order_id = %%s" % (key, table), order)[0][0]

    def command(self, command_id):
        key, payload = self.q("SELECT message_key, payload FROM outbox WHERE command_id = %s",
                              command_id)[0]
        return key, json.loads(payload)

    def run(self):
        svc.refund_for = lambda seq, amount: (amount, "requested_by_customer") if seq == 1 \
            else None
        svc.place_orders(8, authorize=True)
        self.orders = self.q("SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN "
                             "order_attempts a USING (order_id) ORDER BY o.seq")
        types = {json.loads(p)["type"] for p, in self.q("SELECT payload FROM outbox")}
        check_eq(types, {"authorization.requested"}, "commands of place-orders --authorize")
        self.authorization_needs_charged()
        self.ship_and_capture()
        self.cancel_and_void()
        self.steps_refused()
        self.never_both()
        self.replay_and_report()

    def authorization_needs_charged(self):
        """o1 authorized by charged's answer; o7's answer is a charge's (no
        capture_method), o8's event is forged (charged: PROCESSING)."""
        (o1, a1), (o7, a7), (o8, a8) = self.orders[0], self.orders[6], self.orders[7]
        self.charged.attempt(self.q, a7, "AUTHORIZED", capture_method=None)
        self.charged.attempt(self.q, a8, "PROCESSING")
        self.send(event("authorization.succeeded", a7, o7),
                  event("authorization.succeeded", a8, o8))
        self.authorize((o1, a1))
        check_eq([o for o, in self.q("SELECT order_id FROM orders WHERE authorized_attempt_id "
                                     "IS NOT NULL")], [o1], "orders authorized")
        check_eq(self.alarms(o7), ["answer_mismatch"], "alarms of an AUTHORIZED of a charge")
        # charged captured o8's authorization though we never shipped it.
        self.charged.attempt(self.q, a8, "SUCCEEDED", captured_amount=100)
        self.send(event("capture.succeeded", a8, o8, capture_id=str(uuid.uuid4())),
                  event("authorization.succeeded", a8, o8))
        self.confirm()
        self.confirm()
        check_eq((self.alarms(o8), self.q("SELECT paid FROM orders WHERE order_id = %s", o8)),
                 (["captured_not_shipped"], [(False,)]), "o8 captured, never shipped")

    def ship_and_capture(self):
        """o1 shipped with an item missing: its capture pays what it took."""
        (o1, a1) = self.orders[0]
        check_eq(svc.ship(5, missing_ratio=1.0, rnd=random.Random(7)), [o1], "orders shipped")
        c1 = self.step_of("order_captures", "capture_id", o1)
        amount, asked = self.q("SELECT o.amount, c.amount FROM orders o JOIN order_captures c "
                               "USING (order_id) WHERE order_id = %s", o1)[0]
        key, cmd = self.command(c1)
        check_eq((key, cmd["type"], cmd["payment_attempt_id"], cmd["idempotency_key"],
                  cmd["amount"], asked < amount),
                 (str(a1), "capture.requested", str(a1), "order-svc-capture:%s" % c1, asked, True),
                 "o1's capture command")
        paid = lambda: self.q("SELECT paid, paid_amount FROM orders WHERE order_id = %s", o1)[0]  # noqa: E731,E501
        self.charged.capture(self.q, c1, "PROCESSING")
        self.send(event("capture.succeeded", a1, o1, capture_id=str(c1), amount=amount),
                  event("capture.succeeded", a1, o1, capture_id=str(uuid.uuid4())))
        self.confirm()
        check_eq(paid(), (False, None), "o1 after a forged capture.succeeded")
        self.charged.capture(self.q, c1, "SUCCEEDED", captured_amount=asked + 1)
        self.send(event("capture.succeeded", a1, o1, capture_id=str(c1)))
        self.confirm()
        check_eq((paid(), self.alarms(o1)), ((False, None), ["answer_mismatch"]),
                 "o1 after an answer that took more than asked")
        self.charged.capture(self.q, c1, "SUCCEEDED")
        self.send(event("capture.succeeded", a1, o1, capture_id=str(c1)))
        self.confirm()
        self.confirm()
        check_eq(paid(), (True, asked), "o1 after its capture SUCCEEDED")
        check_eq(self.q("SELECT amount FROM order_refunds WHERE order_id = %s", o1), [(asked,)],
                 "o1's refund, bound by what was captured")
        (r1,) = self.q("SELECT refund_id FROM order_refunds WHERE order_id = %s", o1)[0]
        self.charged.refund(r1, a1, asked, "SUCCEEDED")
        self.send(event("refund.succeeded", a1, o1, refund_id=str(r1)))
        self.confirm()
        # The authorization captured, reversed by a review, restored: paid
        # again with what the capture took, no second refund.
        for status, want in (("SUCCEEDED", (True, asked)), ("FAILED", (False, None)),
                             ("SUCCEEDED", (True, asked))):
            self.charged.attempt(self.q, a1, status, captured_amount=asked)
            self.send(event("charge.succeeded", a1, o1))
            self.confirm()
            check_eq(paid(), want, "o1 after its attempt said %s" % status)
        check_eq((self.alarms(o1), self.q("SELECT count(*) FROM order_refunds WHERE "
                                          "order_id = %s", o1)),
                 (["answer_mismatch", "payment_reversed"], [(1,)]),
                 "o1 after its capture was reversed and restored")

    def cancel_and_void(self):
        """o2 canceled: its void releases the order's amount, pays nothing."""
        (o1, a1), (o2, a2) = self.orders[0], self.orders[1]
        self.authorize((o2, a2))
        check_eq(svc.cancel(5), [o2], "orders canceled (o1 is shipped)")
        check_eq((svc.ship(5), svc.cancel(5)), ([], []), "shipped or canceled again")
        v2 = self.step_of("order_voids", "void_id", o2)
        key, cmd = self.command(v2)
        check_eq((key, cmd["type"], cmd["reason"], cmd["idempotency_key"]),
                 (str(a2), "void.requested", "requested_by_customer", "order-svc-void:%s" % v2),
                 "o2's void command")
        released = lambda: self.q("SELECT counted, released_amount FROM order_voids WHERE "  # noqa: E731,E501
                                  "void_id = %s", v2)[0]
        self.send(event("void.succeeded", a2, o2, void_id=str(v2)))
        self.confirm()
        check_eq(released(), (False, None), "o2's void after a forged void.succeeded (404)")
        self.charged.void(self.q, v2, "SUCCEEDED")
        self.send(event("void.succeeded", a2, o2, void_id=str(v2)))
        self.confirm()
        amount = self.q("SELECT amount FROM orders WHERE order_id = %s", o2)[0][0]
        check_eq((released(), self.q("SELECT paid FROM orders WHERE order_id = %s", o2)),
                 ((True, amount), [(False,)]), "o2 after its void SUCCEEDED")

    def steps_refused(self):
        """o4 shipped after its hold lapsed, o5's capture refused, o6's void
        refused (captured first), o3's hold expired untouched."""
        (o3, a3), (o4, a4), (o5, a5), (o6, a6) = self.orders[2:6]
        self.authorize((o4, a4), (o5, a5))
        check_eq(svc.ship(5), [o4, o5], "o4 and o5 shipped")
        self.authorize((o6, a6))
        check_eq(svc.cancel(5), [o6], "o6 canceled")
        self.authorize((o3, a3))
        c4, c5 = (self.step_of("order_captures", "capture_id", o) for o in (o4, o5))
        v6 = self.step_of("order_voids", "void_id", o6)
        self.charged.capture(self.q, c4, "FAILED", reason="authorization_expired")
        self.charged.capture(self.q, c5, "REJECTED", reason="capture_after_void: voided")
        self.charged.void(self.q, v6, "REJECTED", reason="void_after_capture")
        self.charged.attempt(self.q, a3, "VOIDED", reason="expired")
        for _ in range(2):
            self.send(event("capture.failed", a4, o4, capture_id=str(c4)),
                      event("capture.rejected", a5, o5, capture_id=str(c5)),
                      event("void.rejected", a6, o6, void_id=str(v6)),
                      event("authorization.voided", a3, o3))
            self.confirm()
        check_eq([self.alarms(o) for o in (o3, o4, o5, o6)],
                 [["authorization_expired"], ["authorization_expired"], ["capture_rejected"],
                  ["void_rejected"]], "alarms of o3, o4, o5, o6")
        check_eq(self.q("SELECT detail FROM order_alarms WHERE order_id = %s", o5),
                 [("capture_after_void: voided",)], "capture_rejected says charged's reason")
        check_eq(self.q("SELECT count(*) FROM orders WHERE paid AND order_id IN (%s, %s)", o4,
                        o5), [(0,)], "o4 and o5 paid")
        check_eq((svc.ship(5), svc.cancel(5)), ([], []), "after o3's hold expired")

    def never_both(self):
        """Six orders: ship and cancel racing over them send one command
        each; the database refuses a void of a shipped order."""
        svc.place_orders(6, authorize=True)
        new = self.q("SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN "
                     "order_attempts a USING (order_id) ORDER BY o.seq DESC LIMIT 6")
        self.authorize(*new)
        done = {}
        threads = [threading.Thread(target=lambda h=h: done.__setitem__(h, svc.fulfil(h, 6)))
                   for h in ("shipped", "canceled")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = [o for o, _ in new]
        steps = self.q("SELECT order_id FROM order_captures WHERE order_id = ANY(%s) UNION ALL "
                       "SELECT order_id FROM order_voids WHERE order_id = ANY(%s)", ids, ids)
        check_eq((sorted(o for o, in steps), sorted(done["shipped"] + done["canceled"])),
                 (sorted(ids), sorted(ids)), "one step per order, ship racing cancel")
        shipped = self.q("SELECT order_id, payment_attempt_id FROM order_captures LIMIT 1")[0]
        for sql, args in (("UPDATE orders SET fulfilment = 'canceled' WHERE order_id = %s",
                           shipped[:1]),
                          ("INSERT INTO order_voids (void_id, order_id, payment_attempt_id, "
                           "idempotency_key, reason) VALUES (gen_random_uuid(), %s, %s, "
                           "'k', 'r')", shipped)):
            try:
                with self.conn.transaction():
                    self.conn.execute(sql, args)
                refused = False
            except psycopg.errors.IntegrityError:
                refused = True
            check_eq(refused, True, "the database refuses: " + sql[:40])

    def replay_and_report(self):
        """Every event again: nothing applied twice. report's totals."""
        before = self.q("SELECT kind, order_id FROM order_alarms ORDER BY alarm_id")
        paid = self.q("SELECT order_id, paid_amount, refunded_amount FROM orders ORDER BY seq")
        processed = self.q("SELECT count(*) FROM processed_events")
        due = lambda: self.q("SELECT (SELECT count(*) FROM order_attempts WHERE confirm_due) + "  # noqa: E731,E501
                             "(SELECT count(*) FROM order_captures WHERE confirm_due) + (SELECT "
                             "count(*) FROM order_voids WHERE confirm_due)")
        due_before = due()
        self.feed.send(*self.sent)
        check_eq((self.q("SELECT count(*) FROM processed_events"), due()),
                 (processed, due_before), "events recorded and rows made due by a replay")
        self.confirm()
        check_eq((self.q("SELECT kind, order_id FROM order_alarms ORDER BY alarm_id"),
                  self.q("SELECT order_id, paid_amount, refunded_amount FROM orders ORDER BY "
                         "seq")), (before, paid), "alarms and payments after a replay")
        (o1, _), (o2, _), (o3, _) = self.orders[:3]
        amounts = dict(self.q("SELECT order_id, amount FROM orders"))
        authorized = sum(amounts[o] for o, in self.q(
            "SELECT order_id FROM orders WHERE authorized_attempt_id IS NOT NULL"))
        captured = self.q("SELECT captured_amount FROM order_captures WHERE order_id = %s",
                          o1)[0][0]
        totals = svc.report()["authorizations"]
        check_eq(totals, {"authorized": authorized, "captured": captured,
                          "released": amounts[o1] - captured + amounts[o2] + amounts[o3],
                          "voided": amounts[o2] + amounts[o3], "refunded": captured},
                 "report's totals (o3's hold lapsed: voided and released)")


if __name__ == "__main__":
    sys.exit(main())
