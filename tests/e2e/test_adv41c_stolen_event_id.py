#!/usr/bin/env python3
"""Adversary 41c: a forger who reads the results topic silences any result
event of charged's: a copy of its event_id, naming anything else, read
first, and the real event is dropped as a duplicate. A refund charged says
SUCCEEDED is then never counted, and an attempt a person resolved
SUCCEEDED after REQUIRES_REVIEW never pays its order: nothing asks again.

examples/order_service/README.md: "each result event taken once:
apply_batch(): INSERT INTO processed_events ... ON CONFLICT (event_id) DO
NOTHING RETURNING; its effect (note_event()) only when the insert returned
a row", and "an event moves no money and pays nothing ... a forger can make
the service ask charged many times". apply_batch() records the event_id
before it knows the event is one of ours (note_event() decides that after),
so a forged message with a real event's id and another attempt or refund
takes the id, and the real event behind it inserts nothing and wakes
nothing. Event ids are public: every event on the results topic carries its
own. The copy is read first whenever the service lags on the real event's
partition (a restart, a rebalance, a PostgreSQL outage: the events wait in
Kafka) and the forger writes it to another partition. And the confirmer
has no other way to learn: a refund is asked about only when an event made
it due (Confirmer.confirm_due(): refunds WHERE confirm_due), an attempt
only when due or while it has no settled answer (REQUIRES_REVIEW is
settled).

The test, on a real PostgreSQL (messages as the consumer hands them over,
charged's api a table, as test_order_service_events.py):
1. An order paid, its refund sent; charged says the refund SUCCEEDED and
   publishes refund.succeeded. A forged copy of its event_id (naming a
   refund and attempt not ours) is read first, then the real event. After
   the confirmer's rounds the refund must be counted.
2. An order whose attempt charged settled REQUIRES_REVIEW (applied, no
   longer due); a person resolves it SUCCEEDED and charged publishes
   charge.succeeded; a forged copy of its event_id (another attempt) is read
   first. After the confirmer's rounds the order must be paid.
Before acc8c1b neither was, and neither row was ever asked again (the
dedupe was on event_id alone; it is now per row named).

Runs with deploy/.tools' python (psycopg)."""
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
import order_service_e2e as oe  # noqa: E402
from test_order_service_events import Charged, Feed, confirmer, event  # noqa: E402

FAILURES = []


def check_eq(got, want, what):
    if got != want:
        FAILURES.append("%s: got %r, want %r" % (what, got, want))
        print("FAIL", FAILURES[-1], file=sys.stderr)


def stolen(real):
    """The forger's copy: the real event's id, another attempt (and refund)."""
    copy = dict(real)
    copy["payment_attempt_id"] = str(uuid.uuid4())
    copy["order_id"] = str(uuid.uuid4())
    if "refund_id" in copy:
        copy["refund_id"] = str(uuid.uuid4())
    return copy


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "adv41c_stolen_%d" % os.getpid()
    with psycopg.connect(base, autocommit=True) as admin:
        admin.execute('CREATE DATABASE "%s"' % name)
    url = base.rsplit("/", 1)[0] + "/" + name
    os.environ["ORDERS_DATABASE_URL"] = url
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(svc.SCHEMA)
            scenario(conn)
    finally:
        oe.drop_database(psycopg, base, name)
    if FAILURES:
        print("%d failed" % len(FAILURES), file=sys.stderr)
        return 1
    print("adv41c stolen event ids: all held")
    return 0


def scenario(conn):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    charged = Charged()
    c = confirmer(charged)
    feed = Feed(conn)

    def confirm(rounds=3):
        """The confirmer's rounds, each once every row's interval has passed."""
        for _ in range(rounds):
            conn.execute("UPDATE order_attempts SET next_poll_at = NULL")
            conn.execute("UPDATE order_refunds SET next_poll_at = NULL")
            c.confirm_due()

    # The first order refunds in full; no other.
    svc.refund_for = lambda seq, amount: (amount, "requested_by_customer") if seq == 1 else None
    svc.place_orders(2)
    (o1, a1, amount1), (o2, a2, _) = q(
        "SELECT o.order_id, a.payment_attempt_id, o.amount FROM orders o JOIN order_attempts a "
        "USING (order_id) ORDER BY o.seq")
    q("UPDATE outbox SET sent_at = now() RETURNING 1")

    # 1. o1 paid; its refund succeeds at charged; the refund.succeeded's id
    #    is taken first by a copy that names another refund.
    charged.attempt(q, a1, "SUCCEEDED")
    feed.send(event("charge.succeeded", a1, o1))
    confirm()
    (r,), = q("SELECT refund_id FROM order_refunds WHERE order_id = %s", o1)
    q("UPDATE outbox SET sent_at = now() WHERE sent_at IS NULL RETURNING 1")
    charged.refund(r, a1, amount1, "SUCCEEDED")
    real = event("refund.succeeded", a1, o1, refund_id=str(r), amount=amount1)
    asked = len(charged.asked)
    feed.send(stolen(real))
    feed.send(real)
    confirm()
    refund_asked = sum(p == "/v1/refunds/%s" % r for p in charged.asked[asked:])
    print("questions about the refund after its refund.succeeded: %d" % refund_asked)
    check_eq(q("SELECT counted FROM order_refunds WHERE refund_id = %s", r)[0][0], True,
             "the refund charged says SUCCEEDED, counted, after its event id was taken first")
    check_eq(q("SELECT refunded_amount FROM orders WHERE order_id = %s", o1)[0][0], amount1,
             "o1's refunded total")

    # 2. a2 settled REQUIRES_REVIEW (applied, no longer due); a person
    #    resolves it SUCCEEDED; the charge.succeeded's id is taken first.
    charged.attempt(q, a2, "REQUIRES_REVIEW")
    feed.send(event("charge.requires_review", a2, o2))
    confirm()
    check_eq(q("SELECT confirm_due, applied_status FROM order_attempts WHERE "
               "payment_attempt_id = %s", a2), [(False, "REQUIRES_REVIEW")],
             "a2 after charged said REQUIRES_REVIEW")
    charged.attempt(q, a2, "SUCCEEDED")
    real = event("charge.succeeded", a2, o2)
    asked = len(charged.asked)
    feed.send(stolen(real))
    feed.send(real)
    confirm()
    print("questions about a2 after its charge.succeeded: %d" % sum(
        p == "/v1/payment-attempts/%s" % a2 for p in charged.asked[asked:]))
    check_eq(q("SELECT paid, paid_attempt_id FROM orders WHERE order_id = %s", o2),
             [(True, a2)], "o2, whose attempt charged says SUCCEEDED, after its event id "
             "was taken first")


if __name__ == "__main__":
    sys.exit(main())
