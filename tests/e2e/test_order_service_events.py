#!/usr/bin/env python3
"""examples/order_service's inbox and confirmer against result events anyone
could write to the shared results topic, and against charged's own
reversals, on a real PostgreSQL (no Kafka: the messages are what a consumer
hands over; charged's api is a table of answers, as the confirmer reads it).

- An event moves no money and pays nothing: it only makes our own row due
  for the confirmer. Forged events (adversary 41b: an attempt's id is its
  command's key, public on the commands topic) of attempts charged has no
  record of, or still processes, pay no order and make no new attempt.
- charged's answer decides, about our own row only: SUCCEEDED pays the
  attempt's own order (not the order an event named); an answer whose
  order, amount or currency is not our row's pays nothing and raises
  answer_mismatch.
- A second attempt that SUCCEEDED for an order already paid raises
  paid_twice. The paying attempt FAILED (a review reversed it): the order
  is unpaid, payment_reversed, no new attempt. SUCCEEDED again (the
  reversal reversed): paid again, and no second refund is decided.
- A refund counts its own recorded amount once on SUCCEEDED; FAILED after
  that takes it back out and raises refund_reversed. Events of refunds not
  ours change nothing; a refund.rejected without order_id is read.
- Unreadable messages are kept in inbox_rejects and passed, never raised.
- An answer whose effect the database refuses (a refund of 0 past
  order_refunds' CHECK) is kept as effect_refused and asked again later;
  the rows behind it are confirmed.
- One event asking again while the confirmer's question is on its way
  keeps the row due (its answer may predate what the event reports); an
  answer older than one applied (charged's updated_at) is stale.
- An attempt SUCCEEDED once is never tried again, however often it turns
  FAILED; a REJECTED one raises charge_rejected once.
- paid_twice, then the paying attempt reversed: the other attempt pays.
- run refuses (exit 2) tables of an older version of the example.
- A refund charged says FAILED before it was counted raises
  refund_not_made once; one whose events never come is asked about once
  its command is POLL_AFTER_S old.

Runs with deploy/.tools' python (psycopg); started by another python it
runs itself again with that one."""
import json
import os
import subprocess
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


class Charged:
    """What charged's api answers, path by path (absent: 404)."""

    def __init__(self):
        self.answers, self.asked = {}, []

    def get(self, path):
        self.asked.append(path)
        return self.answers.get(path)

    def attempt(self, q, attempt, status, **over):
        order, amount, currency = q("SELECT order_id, amount, currency FROM orders JOIN "
                                    "order_attempts USING (order_id) WHERE "
                                    "payment_attempt_id = %s", attempt)[0]
        doc = {"payment_attempt_id": str(attempt), "order_id": str(order), "status": status,
               "amount": amount, "currency": currency}
        doc.update(over)
        self.answers["/v1/payment-attempts/%s" % attempt] = doc

    def refund(self, refund, attempt, amount, status):
        self.answers["/v1/refunds/%s" % refund] = {
            "refund_id": str(refund), "payment_attempt_id": str(attempt), "amount": amount,
            "status": status}


def confirmer(charged):
    c = svc.Confirmer.__new__(svc.Confirmer)
    c.stop, c.api, c.listening_on = svc.threading.Event(), charged, None
    c.db = svc.Database(os.environ["ORDERS_DATABASE_URL"], "test", autocommit=True)
    return c


def main():
    base = os.environ["CHARGED_TEST_DATABASE_URL"]
    name = "order_events_%d" % os.getpid()
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
    print("order service events: all held")
    return 0


def scenario(conn):
    q = lambda sql, *a: conn.execute(sql, a).fetchall()  # noqa: E731
    charged = Charged()
    c = confirmer(charged)
    feed = Feed(conn)

    def confirm():
        """The confirmer's round once every row's interval has passed."""
        conn.execute("UPDATE order_attempts SET next_poll_at = NULL")
        conn.execute("UPDATE order_refunds SET next_poll_at = NULL")
        c.confirm_due()

    def paid():
        return q("SELECT order_id, paid_attempt_id FROM orders WHERE paid ORDER BY seq")

    def attempts_of(o):
        return q("SELECT count(*) FROM order_attempts WHERE order_id = %s", o)[0][0]

    def due(a):
        return q("SELECT confirm_due FROM order_attempts WHERE payment_attempt_id = %s", a)[0][0]

    def alarms(subject):
        return [k for k, in q("SELECT kind FROM order_alarms WHERE coalesce(refund_id, "
                              "payment_attempt_id) = %s ORDER BY alarm_id", subject)]

    # The first order refunds in full; no other.
    svc.refund_for = lambda seq, amount: (amount, "requested_by_customer") if seq == 1 else None
    svc.place_orders(3)
    (o1, a1), (o2, a2), (o3, a3) = q(
        "SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN order_attempts a "
        "USING (order_id) ORDER BY o.seq")

    # 1. Forged: a1's success (charged has no record of a1), a3's failure
    #    (charged still processes a3). Nothing paid, no new attempt; both
    #    asked about until charged settles them.
    charged.attempt(q, a3, "PROCESSING")
    feed.send(event("charge.succeeded", a1, o2), event("charge.failed", a3, o3))
    check_eq(paid(), [], "orders paid by the events alone")
    confirm()
    check_eq(sorted(charged.asked), sorted("/v1/payment-attempts/%s" % a for a in (a1, a3)),
             "questions to charged after two events")
    check_eq(paid(), [], "orders paid after charged answered 404 and PROCESSING")
    check_eq((attempts_of(o1), attempts_of(o3)), (1, 1), "attempts after a forged failure")
    check_eq((due(a1), due(a3)), (True, True), "a1 and a3 still asked about")

    # 2. charged says a1 SUCCEEDED: a1's own order pays (the event named o2),
    #    and its refund is decided; a1 is no longer asked about.
    charged.attempt(q, a1, "SUCCEEDED")
    confirm()
    check_eq(paid(), [(o1, a1)], "orders paid once charged said a1 SUCCEEDED")
    check_eq(due(a1), False, "a1 due after a settled answer")
    check_eq(q("SELECT count(*) FROM order_refunds WHERE order_id = %s", o1), [(1,)],
             "refunds of o1")

    # 3. An answer about a3 that is not our row's (another amount): pays
    #    nothing, raises answer_mismatch once, asked no more.
    charged.attempt(q, a3, "SUCCEEDED", amount=1)
    confirm()
    confirm()
    check_eq(paid(), [(o1, a1)], "orders paid after a mismatched answer")
    check_eq(alarms(a3), ["answer_mismatch"], "alarms of a3")
    check_eq(due(a3), False, "a3 due after a mismatched answer")

    # 4. A second attempt of o1 that charged too: paid_twice, o1 still a1's.
    with conn.transaction(), conn.cursor() as cur:
        amount, currency = q("SELECT amount, currency FROM orders WHERE order_id = %s", o1)[0]
        a1b = uuid.UUID(svc.add_attempt(cur, o1, 2, amount, currency, "pm_card_visa"))
    charged.attempt(q, a1b, "SUCCEEDED")
    feed.send(event("charge.succeeded", a1b, o1))
    confirm()
    check_eq(paid(), [(o1, a1)], "o1's paying attempt after a second success")
    check_eq(alarms(a1b), ["paid_twice"], "alarms of the second attempt")
    # A person gives the second charge back (FAILED): o1 stays a1's.
    charged.attempt(q, a1b, "FAILED")
    feed.send(event("charge.failed", a1b, o1))
    confirm()
    check_eq((paid(), attempts_of(o1)), ([(o1, a1)], 2), "o1 after its second charge FAILED")

    # 5. a1 reversed (FAILED by a person's review): o1 unpaid, an alarm, no
    #    third attempt. Reversed again (SUCCEEDED): o1 paid again, and no
    #    second refund (adversary 41b).
    charged.attempt(q, a1, "FAILED")
    feed.send(event("charge.failed", a1, o1))
    confirm()
    check_eq(paid(), [], "orders paid after o1's paying attempt failed")
    check_eq(alarms(a1), ["payment_reversed"], "alarms of a1")
    check_eq(attempts_of(o1), 2, "o1's attempts after the reversal")
    charged.attempt(q, a1, "SUCCEEDED")
    feed.send(event("charge.succeeded", a1, o1))
    confirm()
    check_eq(paid(), [(o1, a1)], "o1 after its reversal was reversed")
    check_eq(q("SELECT count(*) FROM order_refunds WHERE order_id = %s", o1), [(1,)],
             "refunds of o1 after it was paid again")

    # 6. A refund of o2 counts its own amount once on SUCCEEDED, whatever
    #    the events say; FAILED after that takes it out (refund_reversed).
    charged.attempt(q, a2, "SUCCEEDED")
    feed.send(event("charge.succeeded", a2, o2))
    confirm()
    with conn.transaction(), conn.cursor() as cur:
        svc.add_refund(cur, o2, a2, 300, "duplicate")
    (r,), = q("SELECT refund_id FROM order_refunds WHERE order_id = %s", o2)
    refunded = lambda: q("SELECT refunded_amount FROM orders WHERE order_id = %s", o2)[0][0]  # noqa: E731
    charged.refund(r, a2, 300, "PROCESSING")
    succeeded = event("refund.succeeded", a2, o2, refund_id=str(r), amount=999999)
    feed.send(succeeded)
    confirm()
    check_eq(refunded(), 0, "o2's refunded total while charged says PROCESSING")
    charged.refund(r, a2, 300, "SUCCEEDED")
    confirm()
    feed.send(succeeded, event("refund.succeeded", a2, o2, refund_id=str(r), amount=300))
    confirm()
    check_eq(refunded(), 300, "o2's refunded total after its refund succeeded (asked twice)")
    charged.refund(r, a2, 300, "FAILED")
    feed.send(event("refund.failed", a2, o2, refund_id=str(r)))
    confirm()
    check_eq(refunded(), 0, "o2's refunded total after its refund reversed")
    check_eq(alarms(r), ["refund_reversed"], "alarms of the reversed refund")
    # Another refund id, or ours under another attempt: not ours. A
    # refund.rejected without order_id (the contract allows it) is read.
    asked = len(charged.asked)
    rejected = event("refund.rejected", a2, o2, refund_id=str(r))
    del rejected["order_id"]
    feed.send(event("refund.succeeded", a2, o2, refund_id=str(uuid.uuid4())),
              event("refund.succeeded", a3, o3, refund_id=str(r)), rejected)
    check_eq(q("SELECT type FROM processed_events WHERE order_id IS NULL"),
             [("refund.rejected",)], "a refund event without order_id")
    confirm()
    check_eq(len(charged.asked) - asked, 1, "questions after two events not ours and one ours")
    check_eq(refunded(), 0, "o2's refunded total after refunds not ours")

    # 7. Unreadable: kept, passed, nothing raised.
    before = paid()
    feed.send(event("charge.succeeded", uuid.uuid4(), o3), b'{"type":[1]}', b"[" * 50000,
              b"\xff\xfe not json")
    confirm()
    check_eq(paid(), before, "orders paid after events not ours")
    check_eq(q("SELECT count(*) FROM inbox_rejects"), [(3,)], "unreadable messages kept")
    check_eq(q("SELECT next_offset FROM consumer_positions"), [(feed.offset,)],
             "the position past every message")

    # 8. An event that asks again while the question is on its way: the
    #    answer, settled though it is, may be older than what the event
    #    reports, so the row stays due.
    svc.place_orders(1)
    (o4, a4), = q("SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN order_attempts "
                  "a USING (order_id) ORDER BY o.seq DESC LIMIT 1")
    charged.attempt(q, a4, "REQUIRES_REVIEW")
    feed.send(event("charge.requires_review", a4, o4))
    get = charged.get

    def racing(path):
        answer = get(path)
        if path.endswith(str(a4)):
            charged.get = get
            feed.send(event("charge.succeeded", a4, o4))  # a person resolved it meanwhile
        return answer
    charged.get = racing
    confirm()
    check_eq(due(a4), True, "a4 due after an event came during its question")
    charged.attempt(q, a4, "SUCCEEDED")
    confirm()
    check_eq((due(a4), (o4, a4) in paid()), (False, True), "a4 after charged's next answer")

    # 9. An answer whose effect the database refuses (a refund of 0, past
    #    order_refunds' CHECK): kept as effect_refused, asked again later;
    #    the row behind it is confirmed.
    svc.refund_for = lambda seq, amount: (0, "duplicate") if seq % 2 else None
    svc.place_orders(2)
    last = q("SELECT o.order_id, o.seq, a.payment_attempt_id FROM orders o JOIN "
             "order_attempts a USING (order_id) ORDER BY o.seq DESC LIMIT 2")
    for o, seq, a in last:
        charged.attempt(q, a, "SUCCEEDED")
        feed.send(event("charge.succeeded", a, o))
    confirm()
    for o, seq, a in last:
        check_eq(((o, a) in paid(), alarms(a), due(a)),
                 (False, ["effect_refused"], True) if seq % 2 else (True, [], False),
                 "order of seq %d after its answer's effect was refused or not" % seq)
    confirm()
    check_eq(sum(alarms(a) == ["effect_refused"] for _, _, a in last), 1,
             "effect_refused raised once though asked again")

    # 10. An answer older (charged's updated_at) than one applied already
    #     is stale, as another instance's late question would be: a2 paid
    #     at 12:00:02 is not unpaid by a FAILED of 12:00:01.
    charged.attempt(q, a2, "SUCCEEDED", updated_at="2026-01-01T12:00:02.000Z")
    feed.send(event("charge.succeeded", a2, o2))
    confirm()
    charged.attempt(q, a2, "FAILED", updated_at="2026-01-01T12:00:01.000Z")
    feed.send(event("charge.failed", a2, o2))
    confirm()
    check_eq((o2, a2) in paid(), True, "o2 after a stale FAILED answer")
    check_eq(alarms(a2), [], "alarms of a2 after a stale answer")
    check_eq(due(a2), True, "a2 due after a stale answer (asked again)")

    # 11. A refund charged says FAILED before it was ever counted: the
    #     customer is not refunded, a person is told once. And a refund
    #     whose events never come (lost, or silenced by a forger) is asked
    #     about once its command is POLL_AFTER_S old.
    svc.refund_for = lambda seq, amount: None
    with conn.transaction(), conn.cursor() as cur:
        svc.add_refund(cur, o2, a2, 100, "duplicate")
        svc.add_refund(cur, o2, a2, 50, "duplicate")
    (r2, r3) = [r for r, in q("SELECT refund_id FROM order_refunds WHERE order_id = %s AND "
                               "amount IN (100, 50) ORDER BY amount DESC", o2)]
    charged.refund(r2, a2, 100, "FAILED")
    feed.send(event("refund.failed", a2, o2, refund_id=str(r2)))
    confirm()
    feed.send(event("refund.failed", a2, o2, refund_id=str(r2)))
    confirm()
    check_eq(alarms(r2), ["refund_not_made"], "alarms of a refund that failed")
    charged.refund(r3, a2, 50, "SUCCEEDED")
    confirm()
    check_eq(charged.asked.count("/v1/refunds/%s" % r3), 0,
             "questions about a refund sent just now, no event")
    conn.execute("UPDATE outbox SET sent_at = now() - interval '1 minute' WHERE "
                 "command_id = %s", (r3,))
    confirm()
    check_eq(q("SELECT counted FROM order_refunds WHERE refund_id = %s", r3), [(True,)],
             "a refund without events, counted once its command was a minute old")

    # 12. An attempt SUCCEEDED once is never tried again, however often it
    #     turns FAILED (adversary 41d: FAILED, REQUIRES_REVIEW, FAILED again
    #     once the order was unpaid). A REJECTED attempt (charged refused
    #     its command) raises charge_rejected.
    svc.place_orders(2)
    (o6, a6), (o7, a7) = q("SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN "
                           "order_attempts a USING (order_id) ORDER BY o.seq DESC LIMIT 2")
    for status in ("SUCCEEDED", "FAILED", "REQUIRES_REVIEW", "FAILED"):
        charged.attempt(q, a6, status)
        feed.send(event("charge." + status.lower(), a6, o6))
        confirm()
    check_eq((attempts_of(o6), (o6, a6) in paid(), alarms(a6)), (1, False, ["payment_reversed"]),
             "o6 after SUCCEEDED, FAILED, review, FAILED")
    charged.attempt(q, a7, "REJECTED", reason="order_has_live_attempt")
    feed.send(event("charge.rejected", a7, o7))
    confirm()
    feed.send(event("charge.rejected", a7, o7))
    confirm()
    check_eq((attempts_of(o7), alarms(a7)), (1, ["charge_rejected"]), "o7 after REJECTED")

    # 13. paid_twice, then the attempt that paid is reversed: the order is
    #     paid by the other attempt charged says SUCCEEDED, not left unpaid.
    svc.place_orders(1)
    (o8, a8), = q("SELECT o.order_id, a.payment_attempt_id FROM orders o JOIN order_attempts "
                  "a USING (order_id) ORDER BY o.seq DESC LIMIT 1")
    with conn.transaction(), conn.cursor() as cur:
        amount, currency = q("SELECT amount, currency FROM orders WHERE order_id = %s", o8)[0]
        a8b = uuid.UUID(svc.add_attempt(cur, o8, 2, amount, currency, "pm_card_visa"))
    for a, status in ((a8, "SUCCEEDED"), (a8b, "SUCCEEDED"), (a8, "FAILED")):
        charged.attempt(q, a, status)
        feed.send(event("charge." + status.lower(), a, o8))
        confirm()
    check_eq(((o8, a8b) in paid(), alarms(a8b), alarms(a8)),
             (True, ["paid_twice"], ["payment_reversed"]),
             "o8 after its payer was reversed, its second attempt SUCCEEDED")

    # 14. run refuses a database made by an older version (no migrations):
    #     exit 2, naming what is missing, instead of failing every batch.
    conn.execute("ALTER TABLE processed_events DROP COLUMN subject_kind")
    r = subprocess.run([sys.executable, os.path.join(SOURCE, "examples", "order_service",
                                                      "order_service.py"), "run"],
                       env=dict(os.environ, CHARGED_API_URL="http://127.0.0.1:9"),
                       capture_output=True, timeout=60)
    check_eq((r.returncode, b"processed_events.subject_kind" in r.stderr), (2, True),
             "run on an older version's tables (%s)" % r.stderr[-200:])


if __name__ == "__main__":
    sys.exit(main())
