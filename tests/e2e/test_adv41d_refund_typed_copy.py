#!/usr/bin/env python3
"""Adversary 41d: round 3's fix keys processed_events by (event_id,
subject_id), the subject being "the refund_id, else the
payment_attempt_id", so that a copy of a real event's id naming another row
no longer silences it. But a copy may name the SAME subject under the other
type: a forged *refund* event whose refund_id is the real charge event's
payment_attempt_id (any payment_attempt_id). Its (event_id, subject_id) is
exactly the real charge event's; note_event() looks for a refund with that
id, finds none and makes nothing due; the real charge event read after it
inserts nothing ("a duplicate") and wakes nothing. (The same holds for a
refund event: a copy with its refund_id and another payment_attempt_id
takes its key, and note_event()'s "refund_id AND payment_attempt_id" finds
no row.)

Round 3's other fix, "rows without a final answer are polled after
POLL_AFTER_S anyway", does not save the rows that matter: after charged's
SUCCEEDED or FAILED (FINAL) the row is asked again only when an event asks.
And those are exactly the rows charged reverses (docs/states.md: SUCCEEDED
-> REQUIRES_REVIEW on contradicting provider evidence -> FAILED by a
person; FAILED -> REQUIRES_REVIEW -> SUCCEEDED). README: "each change is a
new event, which makes the confirmer ask again".

The copy is read first when the service lags on the real event's
partition and the forger writes the copy to another one (shown on the real
stack by test_adv41c_stolen_event_id_kafka.py: a forger's junk ahead of the
real event on its partition). Here, on a real PostgreSQL (messages as the
consumer hands them over, charged's api a table, as
test_order_service_events.py), with both events of each reversal copied:

1. o1 paid by a1 (charged SUCCEEDED, applied). Charged reverses it:
   charge.requires_review, then a person's charge.failed. Each read after a
   refund-typed copy of its id. charged says FAILED: o1 must be unpaid and
   payment_reversed raised. Before ba8e20e o1 stayed paid (an order
   paid without money), no alarm, a1 never asked again, even with its
   command hours old.
2. o2's a1 declined (FAILED applied, a second attempt a2 made), a2
   SUCCEEDED pays o2. Charged then finds a1 charged after all:
   charge.requires_review, then charge.succeeded. charged has two
   SUCCEEDED attempts for o2: paid_twice must be raised. On the current
   code nothing is raised: the customer is charged twice, silently.
3. The control: o3, the same reversal as 1 without the forger's copies:
   unpaid and payment_reversed (the service does see reversals it is told
   of).

Runs with deploy/.tools' python (psycopg)."""
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


def refund_typed_copy(real):
    """The forger's copy: the real charge event's id, typed as a refund
    event whose refund_id is the real event's payment_attempt_id; the
    attempt and order it names are anything."""
    return {"event_id": real["event_id"], "type": "refund.succeeded",
            "refund_id": real["payment_attempt_id"],
            "payment_attempt_id": str(uuid.uuid4()), "order_id": str(uuid.uuid4()),
            "amount": 1}


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "adv41d_typed_%d" % os.getpid()
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
    print("adv41d refund-typed copies: all held")
    return 0


def scenario(conn):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    charged = Charged()
    c = confirmer(charged)
    feed = Feed(conn)

    def confirm(rounds=3):
        """The confirmer's rounds, each once every row's interval has
        passed and every command is older than POLL_AFTER_S."""
        for _ in range(rounds):
            conn.execute("UPDATE outbox SET sent_at = now() - interval '1 hour'")
            conn.execute("UPDATE order_attempts SET next_poll_at = NULL")
            conn.execute("UPDATE order_refunds SET next_poll_at = NULL")
            c.confirm_due()

    def reverse(attempt, order, middle, last, forged):
        """charged: the attempt to REQUIRES_REVIEW, then to `last`; each
        change's event on the topic, each after the forger's copy when
        `forged`."""
        for status, etype in ((middle, "charge.requires_review"),
                              (last, "charge.%s" % last.lower())):
            charged.attempt(q, attempt, status)
            real = event(etype, attempt, order)
            if forged:
                feed.send(refund_typed_copy(real))
            feed.send(real)
            confirm()

    def alarms(order):
        return [k for k, in q("SELECT kind FROM order_alarms WHERE order_id = %s "
                              "ORDER BY alarm_id", order)]

    svc.refund_for = lambda seq, amount: None  # no refunds: the charges alone
    svc.place_orders(3)
    (o1, a1), (o2, b1), (o3, c1) = q(
        "SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN order_attempts a "
        "USING (order_id) ORDER BY o.seq")

    # 1. o1 paid by a1; charged reverses a1 to FAILED; both events copied.
    charged.attempt(q, a1, "SUCCEEDED")
    feed.send(event("charge.succeeded", a1, o1))
    confirm()
    check_eq(q("SELECT paid FROM orders WHERE order_id = %s", o1), [(True,)],
             "o1 paid by a1 first")
    asked = len(charged.asked)
    reverse(a1, o1, "REQUIRES_REVIEW", "FAILED", forged=True)
    print("questions about a1 after its reversal's two events: %d" % sum(
        p == "/v1/payment-attempts/%s" % a1 for p in charged.asked[asked:]))
    check_eq(q("SELECT paid FROM orders WHERE order_id = %s", o1), [(False,)],
             "o1, whose only attempt charged says FAILED (reversed by a person), "
             "after refund-typed copies of its events' ids were read first: paid")
    check_eq(alarms(o1), ["payment_reversed"], "o1's alarms")

    # 2. o2: b1 declined, b2 pays; charged then finds b1 charged too.
    charged.attempt(q, b1, "FAILED")
    feed.send(event("charge.failed", b1, o2))
    confirm()
    (b2,), = q("SELECT payment_attempt_id FROM order_attempts WHERE order_id = %s AND "
               "attempt_no = 2", o2)
    charged.attempt(q, b2, "SUCCEEDED")
    feed.send(event("charge.succeeded", b2, o2))
    confirm()
    check_eq(q("SELECT paid, paid_attempt_id FROM orders WHERE order_id = %s", o2),
             [(True, b2)], "o2 paid by its second attempt")
    reverse(b1, o2, "REQUIRES_REVIEW", "SUCCEEDED", forged=True)
    check_eq(alarms(o2), ["paid_twice"],
             "o2's alarms, with charged saying SUCCEEDED for both its attempts "
             "(refund-typed copies of b1's events' ids read first)")

    # 3. The control: the same reversal as 1, no forger.
    charged.attempt(q, c1, "SUCCEEDED")
    feed.send(event("charge.succeeded", c1, o3))
    confirm()
    reverse(c1, o3, "REQUIRES_REVIEW", "FAILED", forged=False)
    check_eq(q("SELECT paid FROM orders WHERE order_id = %s", o3), [(False,)],
             "o3 (control, no forger): unpaid after charged's reversal")
    check_eq(alarms(o3), ["payment_reversed"], "o3's alarms (control)")


if __name__ == "__main__":
    sys.exit(main())
