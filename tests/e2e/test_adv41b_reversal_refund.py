#!/usr/bin/env python3
"""Adversary 41b: one paid order, two refunds decided, after charged reversed
its payment and then reversed the reversal.

docs/states.md allows SUCCEEDED -> REQUIRES_REVIEW (provider evidence that
contradicts it) -> FAILED (a person) -> REQUIRES_REVIEW (evidence again) ->
SUCCEEDED (a person), one result event each. The README maps "one key per
refund, fixed once" to add_refund() called from the charge.succeeded that
pays the order: "that event is applied once, so the refund is decided once".
But charge.failed of the paying attempt sets orders.paid back to false
(payment_reversed) and keeps the refund it already decided; the later
charge.succeeded of the same attempt (a new event) finds the order unpaid,
pays it again and calls refund_for()/add_refund() again: a second refund,
new id and new key, of the same charge. For a half-refund order (seq 5)
the customer gets back the whole amount (charged only caps the total at
the charge); for a full-refund order (seq 10) a second full refund is asked.

Applied through apply_batch() on a real PostgreSQL, as
test_order_service_events.py does. Fails on the current code: 2 refunds."""
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
    name = "adv41b_rev_%d" % os.getpid()
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
    print("adv41b reversal refund: all held")
    return 0


def scenario(conn):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    svc.place_orders(10)
    rows = q("SELECT o.seq, o.order_id, a.payment_attempt_id, o.amount FROM orders o "
             "JOIN order_attempts a USING (order_id) ORDER BY o.seq")
    conn.commit()
    feed = Feed(conn)
    for seq, order, attempt, amount in rows:
        if svc.refund_for(seq, amount) is None:
            continue
        # Paid, reviewed, reversed to FAILED, reviewed, SUCCEEDED after all.
        for etype in ("charge.succeeded", "charge.requires_review", "charge.failed",
                      "charge.requires_review", "charge.succeeded"):
            feed.send(event(etype, attempt, order))
        check_eq(q("SELECT paid, paid_attempt_id FROM orders WHERE order_id = %s", order),
                 [(True, attempt)], "order %d paid by its attempt at the end" % seq)
        check_eq(q("SELECT count(*), coalesce(sum(amount), 0) FROM order_refunds "
                   "WHERE order_id = %s", order),
                 [(1, svc.refund_for(seq, amount)[0])],
                 "refunds decided for order %d (one charge of %d)" % (seq, amount))
        check_eq(q("SELECT count(*) FROM outbox WHERE payload LIKE '%%refund.requested%%' "
                   "AND message_key = %s", str(attempt)), [(1,)],
                 "refund commands queued for order %d's charge" % seq)


if __name__ == "__main__":
    sys.exit(main())
