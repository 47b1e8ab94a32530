#!/usr/bin/env python3
"""examples/order_service's inbox against result events anyone could write
to the shared results topic, and against charged's own reversals, applied
through apply_batch() on a real PostgreSQL (no Kafka needed: the messages
are what a consumer hands over).

- An event is about the order our own attempt row names, never the order
  its order_id claims: a charge.succeeded of our attempt naming another
  order pays the attempt's order, not that one.
- A second attempt's charge.succeeded for an order already paid (FAILED,
  then a person's review found it charged) raises paid_twice for a person.
- A charge.failed of the attempt that paid the order (reversed by a
  review) makes the order unpaid and raises payment_reversed; no new
  attempt is made for it.
- A refund counts its own recorded amount, never the event's; a
  refund.failed after its refund.succeeded takes it back out and raises
  refund_reversed.
- Unreadable messages (a type that is not a string, a nest too deep for
  the JSON parser) are kept in inbox_rejects and passed, never raised.
- Events of attempts and refunds that are not ours change nothing.
- An event whose effect the database refuses fails its batch every time:
  the inbox applies each message alone, keeps the refused one in
  inbox_rejects and passes it, and applies the rest.

Runs with deploy/.tools' python (psycopg); started by another python it
runs itself again with that one."""
import json
import os
import sys
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

FAILURES = []


def check_eq(got, want, what):
    if got != want:
        FAILURES.append("%s: got %r, want %r" % (what, got, want))
        print("FAIL", FAILURES[-1], file=sys.stderr)


class Message:
    """What confluent-kafka's consumer hands over, as apply_batch reads it."""

    def __init__(self, value, offset):
        self._value, self._offset = value, offset

    def topic(self):
        return "results"

    def partition(self):
        return 0

    def offset(self):
        return self._offset

    def value(self):
        return self._value


class Feed:
    def __init__(self, conn):
        self.conn, self.offset = conn, 0

    def send(self, *values):
        msgs = []
        for v in values:
            msgs.append(Message(v if isinstance(v, bytes) else json.dumps(v).encode(),
                                self.offset))
            self.offset += 1
        svc.apply_batch(self.conn, msgs)


def event(etype, attempt, order, **more):
    ev = {"event_id": str(uuid.uuid4()), "type": etype, "payment_attempt_id": str(attempt),
          "order_id": str(order)}
    ev.update(more)
    return ev


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "order_events_%d" % os.getpid()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute('CREATE DATABASE "%s"' % name)
    url = base.rsplit("/", 1)[0] + "/" + name
    os.environ["ORDERS_DATABASE_URL"] = url
    try:
        with psycopg.connect(url) as conn:
            conn.execute(svc.SCHEMA)
            conn.commit()
            scenario(conn)
    finally:
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute('DROP DATABASE IF EXISTS "%s" WITH (FORCE)' % name)
    if FAILURES:
        print("%d failed" % len(FAILURES), file=sys.stderr)
        return 1
    print("order service events: all held")
    return 0


def scenario(conn):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    svc.place_orders(3)
    (o1, a1), (o2, a2), (o3, a3) = q(
        "SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN order_attempts a "
        "USING (order_id) ORDER BY o.seq")
    conn.commit()
    feed = Feed(conn)

    # Our attempt a1's success, naming order o2: pays o1 (a1's own order).
    feed.send(event("charge.succeeded", a1, o2))
    check_eq(q("SELECT order_id, paid, paid_attempt_id FROM orders WHERE paid"),
             [(o1, True, a1)], "orders paid after a1's success naming o2")

    # A second attempt of o1 that charged too: paid_twice, o1 still a1's.
    a1b = uuid.uuid4()
    conn.execute("INSERT INTO order_attempts (payment_attempt_id, order_id, attempt_no, "
                 "idempotency_key, payment_method) VALUES (%s, %s, 2, %s, 'pm_card_visa')",
                 (a1b, o1, "order-svc:%s" % a1b))
    conn.commit()
    feed.send(event("charge.succeeded", a1b, o1))
    check_eq(q("SELECT paid_attempt_id FROM orders WHERE order_id = %s", o1), [(a1,)],
             "o1's paying attempt after a second success")
    check_eq(q("SELECT kind, payment_attempt_id FROM order_alarms"), [("paid_twice", a1b)],
             "alarms after a second attempt's success")

    # a1 reversed to FAILED by a person's review: o1 unpaid, an alarm, no
    # third attempt.
    feed.send(event("charge.failed", a1, o1))
    check_eq(q("SELECT paid, paid_attempt_id FROM orders WHERE order_id = %s", o1),
             [(False, None)], "o1 after its paying attempt failed")
    check_eq(q("SELECT kind FROM order_alarms WHERE payment_attempt_id = %s", a1),
             [("payment_reversed",)], "alarm of the reversed payment")
    check_eq(q("SELECT count(*) FROM order_attempts WHERE order_id = %s", o1), [(2,)],
             "o1's attempts after the reversal")

    # A refund of o2 (paid first): its own amount counts, not the event's;
    # a refund.failed after its success takes it back out.
    feed.send(event("charge.succeeded", a2, o2))
    r = uuid.uuid4()
    conn.execute("INSERT INTO order_refunds (refund_id, order_id, payment_attempt_id, "
                 "idempotency_key, amount, reason) VALUES (%s, %s, %s, %s, 300, 'duplicate')",
                 (r, o2, a2, "order-svc-refund:%s" % r))
    conn.commit()
    before = q("SELECT refunded_amount FROM orders WHERE order_id = %s", o2)[0][0]
    feed.send(event("refund.succeeded", a2, o2, refund_id=str(r), amount=999999))
    feed.send(event("refund.succeeded", a2, o2, refund_id=str(r), amount=300))
    check_eq(q("SELECT refunded_amount FROM orders WHERE order_id = %s", o2),
             [(before + 300,)], "o2's refunded total after its refund's successes")
    feed.send(event("refund.failed", a2, o2, refund_id=str(r), amount=300))
    check_eq(q("SELECT refunded_amount FROM orders WHERE order_id = %s", o2), [(before,)],
             "o2's refunded total after its refund reversed")
    check_eq(q("SELECT kind FROM order_alarms WHERE order_id = %s", o2),
             [("refund_reversed",)], "alarm of the reversed refund")
    # Another refund id, or ours under another attempt: not ours.
    feed.send(event("refund.succeeded", a2, o2, refund_id=str(uuid.uuid4()), amount=50),
              event("refund.succeeded", a3, o3, refund_id=str(r), amount=50))
    check_eq(q("SELECT refunded_amount FROM orders WHERE order_id = %s", o2), [(before,)],
             "o2's refunded total after refunds not ours")

    # Not ours, and unreadable: nothing changes but the rejects and the
    # position, and nothing raises.
    paid = q("SELECT order_id FROM orders WHERE paid ORDER BY order_id")
    feed.send(event("charge.succeeded", uuid.uuid4(), o3), b'{"type":[1]}', b"[" * 50000,
              b"\xff\xfe not json")
    check_eq(q("SELECT order_id FROM orders WHERE paid ORDER BY order_id"), paid,
             "orders paid after events not ours")
    check_eq(q("SELECT count(*) FROM inbox_rejects"), [(3,)], "unreadable messages kept")
    check_eq(q("SELECT next_offset FROM consumer_positions"), [(feed.offset,)],
             "the position past every message")

    # An event whose effect the database refuses (here: a refund policy
    # that asks for 0, past order_refunds' CHECK) fails its batch every
    # time: each message goes alone, the refused one is kept and passed,
    # the others applied (adversary 41b: a 1-cent order's half refund).
    class Consumer:
        def store_offsets(self, offsets):
            pass
    inbox = svc.Inbox.__new__(svc.Inbox)
    inbox.stop, inbox.consumer = svc.threading.Event(), Consumer()
    inbox.db = svc.Database(os.environ["ORDERS_DATABASE_URL"], "test")
    svc.place_orders(2)
    (o4, a4), (o5, a5) = q("SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN "
                           "order_attempts a USING (order_id) ORDER BY o.seq DESC LIMIT 2")
    conn.commit()
    policy = svc.refund_for
    svc.refund_for = lambda seq, amount: (0, "duplicate") if seq % 2 else None
    try:
        batch = [Message(json.dumps(event("charge.succeeded", a, o)).encode(), feed.offset + i)
                 for i, (a, o) in enumerate([(a4, o4), (a5, o5)])]
        feed.offset += len(batch)
        inbox.apply(batch)
    finally:
        svc.refund_for = policy
        inbox.db.close()
    paid_now = set(o for o, in q("SELECT order_id FROM orders WHERE order_id IN (%s, %s) "
                                 "AND paid", o4, o5))
    check_eq(len(paid_now), 1, "orders paid of the two (one refused alone)")
    check_eq(q("SELECT count(*) FROM inbox_rejects"), [(4,)],
             "messages kept: the unreadable ones and the refused one")
    check_eq(q("SELECT next_offset FROM consumer_positions"), [(feed.offset,)],
             "the position past the refused message too")


if __name__ == "__main__":
    sys.exit(main())
