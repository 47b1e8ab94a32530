#!/usr/bin/env python3
"""A small order service in front of charged: it asks for charges, refunds
some of its paid orders, and applies the outcomes of both exactly once.
Python standard library, plus the `psql`, `kcat` and `chargectl` programs.

    order_service.py init                      # create its tables
    order_service.py place-orders --count 10   # orders + one attempt each, published
    order_service.py publish                   # (re)publish attempts and refunds not yet sent
    order_service.py consume [--until-idle S]  # apply result events, forever
    order_service.py report                    # orders, payments and refunds, as JSON

Environment: ORDERS_DATABASE_URL (its own database), KAFKA_BOOTSTRAP_SERVERS,
CHARGE_COMMANDS_TOPIC, CHARGE_RESULTS_TOPIC, CHARGECTL (path of chargectl,
default `chargectl`). See README.md beside this file for why it works the
way it does.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import time
import uuid

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id       uuid PRIMARY KEY,
    seq            bigint GENERATED ALWAYS AS IDENTITY, -- placing order: picks the refunds
    amount         bigint NOT NULL,
    currency       text NOT NULL,
    paid           boolean NOT NULL DEFAULT false,
    paid_event_id  uuid,                -- the charge.succeeded event that paid it
    paid_attempt_id uuid,
    refunded_amount bigint NOT NULL DEFAULT 0  -- the sum of its refund.succeeded events
);
-- One row per payment attempt, with its own idempotency key, written before
-- the command is published: a re-publish sends the very same command.
CREATE TABLE IF NOT EXISTS order_attempts (
    payment_attempt_id uuid PRIMARY KEY,
    order_id        uuid NOT NULL REFERENCES orders,
    idempotency_key text NOT NULL UNIQUE,
    payment_method  text NOT NULL,
    published       boolean NOT NULL DEFAULT false,
    last_event_type text
);
-- One row per refund, with its own id and idempotency key, written in the
-- transaction that marks the order paid, before the command is published:
-- like an attempt, a re-publish sends the very same refund.
CREATE TABLE IF NOT EXISTS order_refunds (
    refund_id          uuid PRIMARY KEY,
    order_id           uuid NOT NULL REFERENCES orders,
    payment_attempt_id uuid NOT NULL,
    idempotency_key    text NOT NULL UNIQUE,
    amount             bigint NOT NULL CHECK (amount > 0),
    reason             text NOT NULL,
    published          boolean NOT NULL DEFAULT false,
    last_event_type    text,            -- refund.succeeded, refund.rejected, ...
    succeeded_event_id uuid             -- the refund.succeeded event that counted it
);
-- Every result event applied, once: the dedupe of at-least-once delivery.
CREATE TABLE IF NOT EXISTS processed_events (
    event_id           uuid PRIMARY KEY,
    type               text NOT NULL,
    payment_attempt_id uuid NOT NULL,
    order_id           uuid NOT NULL,
    refund_id          uuid,            -- refund events only
    topic              text NOT NULL,
    kafka_partition    int NOT NULL,
    kafka_offset       bigint NOT NULL,
    processed_at       timestamptz NOT NULL DEFAULT now()
);
-- Where to read next, per partition: moved in the same transaction as the
-- effect of the message before it.
CREATE TABLE IF NOT EXISTS consumer_positions (
    topic           text NOT NULL,
    kafka_partition int NOT NULL,
    next_offset     bigint NOT NULL,
    PRIMARY KEY (topic, kafka_partition)
);
"""

UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
CHARGE_TYPES = {"charge.succeeded", "charge.failed", "charge.unknown", "charge.rejected",
                "charge.requires_review"}
REFUND_TYPES = {"refund.succeeded", "refund.failed", "refund.unknown", "refund.rejected",
                "refund.requires_review"}
# Which paid orders are refunded, by their placing order (orders.seq): every
# REFUND_EVERY-th, and of those every other one in full, the rest half.
REFUND_EVERY = 5


def log(msg, **fields):
    fields.update(ts=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), msg=msg)
    print(json.dumps(fields), file=sys.stderr, flush=True)


def env(name, default=None):
    v = os.environ.get(name, default)
    if v is None:
        sys.exit("order_service: %s is not set" % name)
    return v


def psql(sql, single_transaction=False):
    """Runs SQL in the service's database; stops at the first error. Output:
    rows, fields separated by '|'."""
    argv = ["psql", "-X", "-q", "-tA", "-v", "ON_ERROR_STOP=1", env("ORDERS_DATABASE_URL")]
    if single_transaction:
        argv.append("--single-transaction")
    p = subprocess.run(argv, input=sql.encode(), capture_output=True)
    if p.returncode != 0:
        raise RuntimeError("psql exited %d: %s" % (p.returncode, p.stderr.decode()[-1000:]))
    return [l.split("|") for l in p.stdout.decode().splitlines() if l]


def lit(s):
    """A SQL string literal. Values are checked before they get here; this
    only keeps quoting right."""
    return "'" + str(s).replace("'", "''") + "'"


# ---- asking for charges ----

def place_orders(count, currency="EUR"):
    methods = ["pm_card_visa"] * 8 + ["pm_card_chargeDeclined"]
    rows = []
    for _ in range(count):
        order, attempt = str(uuid.uuid4()), str(uuid.uuid4())
        rows.append("INSERT INTO orders (order_id, amount, currency) VALUES (%s, %d, %s);"
                    % (lit(order), random.randint(100, 100000), lit(currency)))
        # One idempotency key per payment attempt, fixed before anything is sent.
        rows.append("INSERT INTO order_attempts (payment_attempt_id, order_id, "
                    "idempotency_key, payment_method) VALUES (%s, %s, %s, %s);"
                    % (lit(attempt), lit(order), lit("order-svc:" + attempt),
                       lit(random.choice(methods))))
    psql("\n".join(rows), single_transaction=True)
    publish()


def chargectl_publish(commands):
    lines = "".join(json.dumps(c) + "\n" for c in commands)
    p = subprocess.run([env("CHARGECTL", "chargectl"), "publish", "--file", "-"],
                       input=lines.encode(), capture_output=True)
    if p.returncode != 0:
        raise RuntimeError("chargectl publish exited %d: %s" % (p.returncode, p.stderr.decode()))


def publish(again=False):
    """Publishes every attempt and every refund not yet marked published (all
    with again): the same ids and keys each time, so a re-publish never
    charges or refunds twice."""
    return publish_attempts(again) + publish_refunds(again)


def publish_attempts(again=False):
    rows = psql("SELECT a.payment_attempt_id, a.order_id, a.idempotency_key, o.amount, "
                "o.currency, a.payment_method FROM order_attempts a JOIN orders o "
                "USING (order_id)" + ("" if again else " WHERE NOT a.published"))
    if not rows:
        return 0
    chargectl_publish({
        "type": "charge.requested", "version": 1, "payment_attempt_id": a,
        "order_id": o, "idempotency_key": k, "amount": int(amt), "currency": cur,
        "payment_method": pm} for a, o, k, amt, cur, pm in rows)
    # Marked only after the broker took them; a crash in between publishes again.
    psql("UPDATE order_attempts SET published = true WHERE payment_attempt_id IN (%s)"
         % ",".join(lit(r[0]) for r in rows))
    log("published", commands=len(rows))
    return len(rows)


# ---- asking for refunds ----

def publish_refunds(again=False):
    """Publishes the refunds the consumer recorded when it marked their
    orders paid (see apply_sql), keyed by the attempt they refund (chargectl
    keys a refund so), so that each follows its charge in one partition."""
    rows = psql("SELECT refund_id, payment_attempt_id, idempotency_key, amount, reason "
                "FROM order_refunds" + ("" if again else " WHERE NOT published"))
    if not rows:
        return 0
    chargectl_publish({
        "type": "refund.requested", "version": 1, "refund_id": r,
        "payment_attempt_id": a, "idempotency_key": k, "amount": int(amt),
        "reason": why} for r, a, k, amt, why in rows)
    psql("UPDATE order_refunds SET published = true WHERE refund_id IN (%s)"
         % ",".join(lit(r[0]) for r in rows))
    log("published refunds", commands=len(rows))
    return len(rows)


# ---- applying outcomes ----

CHARGE_EFFECT = """
WITH new AS (
  INSERT INTO processed_events (event_id, type, payment_attempt_id, order_id, topic,
                                kafka_partition, kafka_offset)
  VALUES ({eid}, {type}, {attempt}, {order}, {topic}, {p}, {o})
  ON CONFLICT (event_id) DO NOTHING
  RETURNING event_id, type, payment_attempt_id, order_id
), attempt AS (
  UPDATE order_attempts a SET last_event_type = new.type FROM new
   WHERE a.payment_attempt_id = new.payment_attempt_id
), paid AS (
  UPDATE orders SET paid = true, paid_event_id = new.event_id,
                    paid_attempt_id = new.payment_attempt_id
    FROM new
   WHERE new.type = 'charge.succeeded' AND orders.order_id = new.order_id AND NOT orders.paid
  RETURNING orders.order_id, orders.seq, orders.amount, orders.paid_attempt_id
)
INSERT INTO order_refunds (refund_id, order_id, payment_attempt_id, idempotency_key,
                           amount, reason)
SELECT r.id, paid.order_id, paid.paid_attempt_id, 'order-svc-refund:' || r.id,
       CASE WHEN paid.seq % {full} = 0 THEN paid.amount ELSE paid.amount / 2 END,
       CASE WHEN paid.seq % {full} = 0 THEN 'requested_by_customer' ELSE 'duplicate' END
  FROM paid, LATERAL (SELECT gen_random_uuid() AS id) r
 WHERE paid.seq % {every} = 0;
"""

REFUND_EFFECT = """
WITH new AS (
  INSERT INTO processed_events (event_id, type, payment_attempt_id, order_id, refund_id,
                                topic, kafka_partition, kafka_offset)
  VALUES ({eid}, {type}, {attempt}, {order}, {refund}, {topic}, {p}, {o})
  ON CONFLICT (event_id) DO NOTHING
  RETURNING event_id, type, refund_id
), refund AS (
  UPDATE order_refunds r SET last_event_type = new.type,
         succeeded_event_id = CASE WHEN new.type = 'refund.succeeded' THEN new.event_id END
    FROM new
   WHERE r.refund_id = new.refund_id AND r.succeeded_event_id IS NULL
  RETURNING r.order_id, new.type
)
UPDATE orders SET refunded_amount = orders.refunded_amount + {amount}
  FROM refund
 WHERE refund.type = 'refund.succeeded' AND orders.order_id = refund.order_id;
"""


def apply_sql(topic, partition, offset, ev):
    """One transaction: the event is recorded once (a duplicate inserts
    nothing and so changes nothing), its effect follows only from that
    insert, and the position moves past the message.

    charge.succeeded marks the order paid and, for every REFUND_EVERY-th
    order, records the refund it will ask for (a new refund id and key,
    fixed here once: the event that pays an order is applied once).
    refund.succeeded adds its amount to the order's refunded total, once
    per refund (a refund that SUCCEEDED takes no later outcome)."""
    if ev is None:  # not an event we can read: skip it, but move on for good
        effect = ""
    elif ev["type"] in CHARGE_TYPES:
        effect = CHARGE_EFFECT.format(
            eid=lit(ev["event_id"]), type=lit(ev["type"]), attempt=lit(ev["payment_attempt_id"]),
            order=lit(ev["order_id"]), topic=lit(topic), p=partition, o=offset,
            every=REFUND_EVERY, full=2 * REFUND_EVERY)
    else:
        effect = REFUND_EFFECT.format(
            eid=lit(ev["event_id"]), type=lit(ev["type"]), attempt=lit(ev["payment_attempt_id"]),
            order=lit(ev["order_id"]), refund=lit(ev["refund_id"]), topic=lit(topic),
            p=partition, o=offset, amount=ev["amount"])
    return """BEGIN;{effect}
INSERT INTO consumer_positions (topic, kafka_partition, next_offset)
VALUES ({topic}, {p}, {next})
ON CONFLICT (topic, kafka_partition) DO UPDATE SET next_offset = EXCLUDED.next_offset;
COMMIT;
""".format(effect=effect, topic=lit(topic), p=partition, next=offset + 1)


def parse_event(payload):
    """The fields this service needs, checked; None when the message is not
    a result event it can read (logged and skipped)."""
    try:
        ev = json.loads(payload)
    except (TypeError, ValueError):
        return None
    if not isinstance(ev, dict):
        return None
    if ev.get("type") in CHARGE_TYPES:
        ids = ("event_id", "payment_attempt_id", "order_id")
    elif ev.get("type") in REFUND_TYPES:
        ids = ("event_id", "payment_attempt_id", "order_id", "refund_id")
        amount = ev.get("amount")
        if not (type(amount) is int and amount > 0):
            return None
    else:
        return None
    if not all(isinstance(ev.get(k), str) and UUID.match(ev[k]) for k in ids):
        return None
    return ev


def partitions(topic):
    p = subprocess.run(["kcat", "-b", env("KAFKA_BOOTSTRAP_SERVERS"), "-L", "-J", "-t", topic],
                       capture_output=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError("kcat -L: " + p.stderr.decode())
    md = json.loads(p.stdout)
    return sorted(part["partition"] for t in md["topics"] if t["topic"] == topic
                  for part in t["partitions"])


def consume_once(topic, parts):
    """Reads each partition from its stored position to its current end and
    applies what it read; returns how many messages it applied."""
    stored = dict((int(p), int(o)) for p, o in psql(
        "SELECT kafka_partition, next_offset FROM consumer_positions WHERE topic = %s"
        % lit(topic)))
    n = 0
    for part in parts:
        start = stored.get(part, 0)
        p = subprocess.run(
            ["kcat", "-C", "-b", env("KAFKA_BOOTSTRAP_SERVERS"), "-t", topic, "-p", str(part),
             "-o", str(start), "-e", "-q", "-J", "-c", "500",
             "-X", "auto.offset.reset=earliest"],
            capture_output=True, timeout=120)
        if p.returncode != 0:
            raise RuntimeError("kcat -C: " + p.stderr.decode()[-1000:])
        script = []
        for line in p.stdout.decode().splitlines():
            m = json.loads(line)
            ev = parse_event(m.get("payload"))
            if ev is None:
                log("skipping a message that is not a result event",
                    partition=part, offset=m["offset"])
            script.append(apply_sql(topic, part, m["offset"], ev))
        if script:
            psql("".join(script))  # one transaction per message, in order
            n += len(script)
    return n


def consume(until_idle=None):
    topic = env("CHARGE_RESULTS_TOPIC")
    parts = partitions(topic)
    log("consuming", topic=topic, partitions=len(parts))
    publish_refunds()  # those a crash left recorded but unsent
    idle_since = time.monotonic()
    while True:
        n = consume_once(topic, parts)
        if n:
            log("applied", messages=n)
            publish_refunds()
            idle_since = time.monotonic()
        elif until_idle is not None and time.monotonic() - idle_since >= until_idle:
            return
        else:
            time.sleep(0.2)


def report():
    """What the service knows, from its own tables: orders paid, refunds by
    the last outcome it applied ("requested" while none), the refunded total."""
    orders, paid, refunded = psql("SELECT count(*), count(*) FILTER (WHERE paid), "
                                  "coalesce(sum(refunded_amount), 0) FROM orders")[0]
    refunds = dict((t, int(n)) for t, n in psql(
        "SELECT coalesce(last_event_type, 'requested'), count(*) FROM order_refunds GROUP BY 1"))
    return {"orders": int(orders), "paid": int(paid), "refunds": refunds,
            "refunded_amount": int(refunded)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("init")
    po = sub.add_parser("place-orders")
    po.add_argument("--count", type=int, default=10)
    pb = sub.add_parser("publish")
    pb.add_argument("--again", action="store_true", help="re-publish every attempt")
    c = sub.add_parser("consume")
    c.add_argument("--until-idle", type=float, help="stop after this many seconds without news")
    sub.add_parser("report")
    a = ap.parse_args()
    if a.cmd == "init":
        psql(SCHEMA, single_transaction=True)
    elif a.cmd == "place-orders":
        place_orders(a.count)
    elif a.cmd == "publish":
        publish(again=a.again)
    elif a.cmd == "report":
        print(json.dumps(report(), sort_keys=True))
    else:
        consume(a.until_idle)


if __name__ == "__main__":
    main()
