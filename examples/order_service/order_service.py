#!/usr/bin/env python3
"""An order service in front of charged, as a payments team writes one:
confluent-kafka and psycopg 3, a transactional outbox for the commands it
sends, an inbox for the result events it applies, and no crash when the
broker or the database blinks.

    order_service.py init                      # create its tables
    order_service.py place-orders --count 10   # orders + attempts + commands, one transaction
    order_service.py run                       # the service: publisher, inbox, confirmer
    order_service.py resend                    # mark every command unsent (sent again, same bytes)
    order_service.py report                    # orders, payments and refunds, as JSON

Environment: ORDERS_DATABASE_URL (its own database), KAFKA_BOOTSTRAP_SERVERS,
CHARGE_COMMANDS_TOPIC, CHARGE_RESULTS_TOPIC (charged's defaults), ORDERS_GROUP_ID (its consumer
group, default order-service), ORDERS_INSTANCE_ID (static group membership,
unique per instance, e.g. the pod's name; none by default), CHARGED_API_URL (charged's api:
what it says pays an order, never an event alone; required by `run`). README.md beside this file
maps each guarantee to the code.
"""
import argparse
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

import psycopg
from confluent_kafka import (OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)

from refund_policy import refund_for

SCHEMA = """
CREATE TABLE IF NOT EXISTS orders (
    order_id        uuid PRIMARY KEY,
    seq             bigint GENERATED ALWAYS AS IDENTITY, -- placing order: picks the refunds
    amount          bigint NOT NULL CHECK (amount > 0),
    currency        text NOT NULL,
    paid            boolean NOT NULL DEFAULT false,  -- charged's api said SUCCEEDED
    paid_attempt_id uuid,                -- the attempt it said it of
    refunded_amount bigint NOT NULL DEFAULT 0,  -- the sum of its refunds counted
    created_at      timestamptz NOT NULL DEFAULT now()
);
-- One row per payment attempt, its id and key fixed before anything is
-- sent. A second try after a decline is a new row: new id, new key.
CREATE TABLE IF NOT EXISTS order_attempts (
    payment_attempt_id uuid PRIMARY KEY,
    order_id        uuid NOT NULL REFERENCES orders,
    attempt_no      int NOT NULL,
    idempotency_key text NOT NULL UNIQUE,
    payment_method  text NOT NULL,
    last_event_type text,                -- the last result event about it
    last_event_id   uuid,
    -- An event only asks: due until charged's api answers a settled status.
    confirm_due     boolean NOT NULL DEFAULT false,
    wakes           bigint NOT NULL DEFAULT 0,  -- events that asked, so far
    confirmed_status text,               -- what GET /v1/payment-attempts/<id> said
    confirmed_at    timestamptz,
    applied_status  text,                -- the settled status whose effect is applied
    succeeded_once  boolean NOT NULL DEFAULT false,  -- charged said SUCCEEDED at some time
    answer_updated_at timestamptz,       -- the newest answer's updated_at: an older one is stale
    next_poll_at    timestamptz,         -- when the confirmer asks again
    poll_every_ms   int NOT NULL DEFAULT 500,
    created_at      timestamptz NOT NULL DEFAULT now(),
    UNIQUE (order_id, attempt_no)
);
-- One row per refund, its id and key fixed once, in the transaction that
-- applies the payment of its order.
CREATE TABLE IF NOT EXISTS order_refunds (
    refund_id          uuid PRIMARY KEY,
    order_id           uuid NOT NULL REFERENCES orders,
    payment_attempt_id uuid NOT NULL REFERENCES order_attempts,
    idempotency_key    text NOT NULL UNIQUE,
    amount             bigint NOT NULL CHECK (amount > 0),
    reason             text NOT NULL,
    last_event_type    text,            -- refund.succeeded, refund.rejected, ...
    counted            boolean NOT NULL DEFAULT false,  -- in orders.refunded_amount
    confirm_due        boolean NOT NULL DEFAULT false,  -- as for attempts
    wakes              bigint NOT NULL DEFAULT 0,
    confirmed_status   text,            -- what GET /v1/refunds/<id> said
    confirmed_at       timestamptz,
    answer_updated_at  timestamptz,     -- as for attempts
    next_poll_at       timestamptz,
    poll_every_ms      int NOT NULL DEFAULT 500
);
-- The transactional outbox: every command, byte for byte, written in the
-- transaction that decided it; sent_at set once the broker acknowledged it.
CREATE TABLE IF NOT EXISTS outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    command_id  uuid NOT NULL UNIQUE,    -- payment_attempt_id or refund_id
    topic       text NOT NULL,
    message_key text NOT NULL,
    payload     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz
);
CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox (id) WHERE sent_at IS NULL;
-- The inbox: every result event taken, once per row it names (its kind
-- and id). Not once per event_id alone: ids are on the topic for anyone to
-- copy, and a copy naming another row (or a refund whose id is an
-- attempt's), read first, would silence the real event.
CREATE TABLE IF NOT EXISTS processed_events (
    event_id           uuid NOT NULL,
    subject_kind       text NOT NULL,   -- charge or refund: which of our tables it names
    subject_id         uuid NOT NULL,   -- the refund_id, else the payment_attempt_id
    type               text NOT NULL,
    payment_attempt_id uuid NOT NULL,
    order_id           uuid,            -- as the event says (a refund's may have none)
    refund_id          uuid,            -- refund events only
    topic              text NOT NULL,
    kafka_partition    int NOT NULL,
    kafka_offset       bigint NOT NULL,
    processed_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (event_id, subject_kind, subject_id)
);
-- A message on the results topic that is not a result event it can read:
-- kept, in the transaction that moves its position past it, for a person.
CREATE TABLE IF NOT EXISTS inbox_rejects (
    topic           text NOT NULL,
    kafka_partition int NOT NULL,
    kafka_offset    bigint NOT NULL,
    payload_head    text NOT NULL,      -- its first 200 characters
    rejected_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic, kafka_partition, kafka_offset)
);
-- What a person must look at: an order paid by two attempts (refund one),
-- a payment or refund that charged reversed after a person's review, an
-- answer of charged's about our id that is not what we asked for.
CREATE TABLE IF NOT EXISTS order_alarms (
    alarm_id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind               text NOT NULL,     -- paid_twice, payment_reversed, refund_reversed,
                                          -- refund_not_made, charge_rejected,
                                          -- answer_mismatch, effect_refused
    order_id           uuid NOT NULL REFERENCES orders,
    payment_attempt_id uuid NOT NULL,
    refund_id          uuid,              -- a refund's alarm
    detail             text,
    raised_at          timestamptz NOT NULL DEFAULT now()
);
-- Where to read next, per partition, moved in the transaction that applies
-- the messages before it. The consumer seeks here on every assignment.
CREATE TABLE IF NOT EXISTS consumer_positions (
    topic           text NOT NULL,
    kafka_partition int NOT NULL,
    next_offset     bigint NOT NULL,
    PRIMARY KEY (topic, kafka_partition)
);
"""

CHARGE_TYPES = {"charge.succeeded", "charge.failed", "charge.unknown", "charge.rejected",
                "charge.requires_review"}
REFUND_TYPES = {"refund.succeeded", "refund.failed", "refund.unknown", "refund.rejected",
                "refund.requires_review"}
TERMINAL = {"SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW"}  # an event's question answered
FINAL = ("SUCCEEDED", "FAILED", "REJECTED")  # asked no more until an event asks (a review may move)
MAX_ATTEMPTS = 2  # a declined order is tried once more, with another card
SECOND_CARD = "pm_card_visa"
OUTBOX_CHANNEL = "order_outbox"  # NOTIFY on commit: the publisher wakes at once
CONFIRM_CHANNEL = "order_confirm"  # NOTIFY on commit: the confirmer wakes at once
POLL_AFTER_S = 30  # a command without any outcome this long: ask charged's api
POLL_MAX_MS = 30000  # the confirmer's longest interval between two questions
BATCH = 200
STOP_GRACE_S = 20  # after SIGTERM: what has not finished by then is left, safe to repeat

log = logging.getLogger("order_service")


def env(name, default=None):
    v = os.environ.get(name, default)
    if v is None:
        print("order_service: %s is not set" % name, file=sys.stderr)
        sys.exit(2)
    return v


class JsonLines(logging.Formatter):
    def format(self, record):
        doc = {"ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created)),
               "level": record.levelname.lower(), "thread": record.threadName,
               "msg": record.getMessage()}
        doc.update(getattr(record, "fields", {}))
        if record.exc_info:
            doc["error"] = self.formatException(record.exc_info).splitlines()[-1]
        return json.dumps(doc)


class Quieter(logging.Filter):
    """librdkafka says the same thing many times a second while a broker is
    away: one line per kind of message every 10 s is enough."""

    def __init__(self):
        logging.Filter.__init__(self)
        self.last = {}

    def filter(self, record):
        kind = record.getMessage()[:48]
        now = time.monotonic()
        if now - self.last.get(kind, -1e9) < 10:
            return False
        self.last[kind] = now
        return True


def kafka_logger(name):
    """The logger librdkafka's lines go to (served by poll, consume, flush)."""
    lg = logging.getLogger("order_service.kafka." + name)
    lg.addFilter(Quieter())
    return lg


def say(level, msg, **fields):
    log.log(level, msg, extra={"fields": fields})


# ---- waiting: back-off, never a busy loop, never a deadline ----

class Backoff:
    """Exponential back-off with full jitter, reset by a success. wait()
    returns early when the service is asked to stop."""

    def __init__(self, stop, base=0.1, cap=5.0):
        self.stop, self.base, self.cap, self.n = stop, base, cap, 0

    def wait(self):
        delay = random.uniform(0, min(self.cap, self.base * (2 ** self.n)))
        self.n = min(self.n + 1, 16)
        self.stop.wait(delay)

    def reset(self):
        self.n = 0


class Database:
    """One connection, opened again after any failure. Callers run each
    transaction whole or retry it whole (psycopg rolls back on an error
    inside `with conn.transaction()`)."""

    def __init__(self, url, role, autocommit=False):
        self.url, self.role, self.autocommit, self.conn = url, role, autocommit, None

    def connect(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.close()
            self.conn = psycopg.connect(self.url, connect_timeout=5, autocommit=self.autocommit,
                                        application_name="order-service-" + self.role)
        return self.conn

    def close(self):
        if self.conn is not None:
            try:
                self.conn.close()
            except psycopg.Error:
                pass
        self.conn = None


# ---- the outbox: commands written in the transaction that decides them ----

def outbox_add(cur, command_id, key, command):
    """Queues one command; the caller's transaction commits it with the rows
    that decided it, or neither. The payload is stored as the bytes to send,
    so that every send of it is the same message."""
    cur.execute("INSERT INTO outbox (command_id, topic, message_key, payload) "
                "VALUES (%s, %s, %s, %s)",
                (command_id, env("CHARGE_COMMANDS_TOPIC", "payments.charge.commands"), key,
                 json.dumps(command, separators=(",", ":"), sort_keys=True)))
    cur.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))


def add_attempt(cur, order_id, attempt_no, amount, currency, payment_method):
    """A payment attempt with its own id and key, and its charge command,
    in the caller's transaction: written before anything is sent."""
    attempt = str(uuid.uuid4())
    key = "order-svc:" + attempt
    cur.execute("INSERT INTO order_attempts (payment_attempt_id, order_id, attempt_no, "
                "idempotency_key, payment_method) VALUES (%s, %s, %s, %s, %s)",
                (attempt, order_id, attempt_no, key, payment_method))
    outbox_add(cur, attempt, attempt, {
        "type": "charge.requested", "version": 1, "payment_attempt_id": attempt,
        "order_id": str(order_id), "idempotency_key": key, "amount": amount,
        "currency": currency, "payment_method": payment_method})
    return attempt


def add_refund(cur, order_id, attempt, amount, reason):
    """A refund with its own id and key, and its command (keyed by the
    attempt it refunds, so that it follows its charge in one partition)."""
    refund = str(uuid.uuid4())
    key = "order-svc-refund:" + refund
    cur.execute("INSERT INTO order_refunds (refund_id, order_id, payment_attempt_id, "
                "idempotency_key, amount, reason) VALUES (%s, %s, %s, %s, %s, %s)",
                (refund, order_id, attempt, key, amount, reason))
    outbox_add(cur, refund, str(attempt), {
        "type": "refund.requested", "version": 1, "refund_id": refund,
        "payment_attempt_id": str(attempt), "idempotency_key": key, "amount": amount,
        "reason": reason})


def place_orders(count, currency="EUR"):
    """Orders, their first attempts and charge commands: one transaction."""
    methods = ["pm_card_visa"] * 8 + ["pm_card_chargeDeclined"]
    with psycopg.connect(env("ORDERS_DATABASE_URL"), connect_timeout=10) as conn:
        with conn.transaction(), conn.cursor() as cur:
            for _ in range(count):
                order, amount = str(uuid.uuid4()), random.randint(100, 100000)
                cur.execute("INSERT INTO orders (order_id, amount, currency) VALUES (%s, %s, %s)",
                            (order, amount, currency))
                add_attempt(cur, order, 1, amount, currency, random.choice(methods))
    say(logging.INFO, "orders placed", count=count)


class Publisher(threading.Thread):
    """Sends what the outbox holds unsent, in id order, with an idempotent
    producer, and marks it sent once the broker acknowledged it. A crash
    between the two sends the same row again: same command, same key."""

    def __init__(self, stop):
        threading.Thread.__init__(self, name="publisher", daemon=True)
        self.stop = stop
        self.db = Database(env("ORDERS_DATABASE_URL"), "publisher", autocommit=True)
        self.producer = None
        self.listening_on = None  # the connection that holds our LISTEN

    def new_producer(self):
        return Producer({
            "bootstrap.servers": env("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
            "client.id": "order-service-publisher",
            "acks": "all",                  # acknowledged by every in-sync replica
            "enable.idempotence": True,     # a retried send is not a second message
            "message.timeout.ms": 30000,    # a send fails within 30 s; the row stays unsent
            "linger.ms": 5,
            "logger": kafka_logger("producer"),
        })

    def run(self):
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            try:
                sent = self.publish_once()
                backoff.reset()
                if not sent:
                    self.idle()
            except (psycopg.Error, KafkaException, BufferError) as e:
                say(logging.WARNING, "publisher: waiting out a failure", error=str(e)[:300])
                self.db.close()
                backoff.wait()
            except Exception:  # a bug: logged, waited out, never a crash
                log.exception("publisher: unexpected error")
                self.db.close()
                backoff.wait()
        self.db.close()

    def idle(self):
        """Waits for a NOTIFY from a transaction that wrote the outbox, at
        most 1 s (a NOTIFY lost with a connection is caught up then)."""
        conn = self.db.connect()
        if self.listening_on is not conn:  # a new connection listens to nothing yet
            conn.execute("LISTEN " + OUTBOX_CHANNEL)
            self.listening_on = conn
            return  # rows written before LISTEN: look once more first
        for _ in conn.notifies(timeout=1.0, stop_after=1):
            pass

    def publish_once(self):
        conn = self.db.connect()
        rows = conn.execute("SELECT id, topic, message_key, payload FROM outbox "
                            "WHERE sent_at IS NULL ORDER BY id LIMIT %s", (BATCH,)).fetchall()
        if not rows:
            return 0
        if self.producer is None:
            self.producer = self.new_producer()
        acked, failed = [], []

        def report(err, msg, row_id):
            if err is None:
                acked.append(row_id)
            else:
                failed.append(err)
        for row_id, topic, key, payload in rows:
            self.producer.produce(topic, key=key.encode(), value=payload.encode(),
                                  on_delivery=lambda e, m, i=row_id: report(e, m, i))
        # No transaction is open while we wait for the broker. A stop ends
        # the wait: what is not acknowledged yet stays unsent, and is sent
        # again (same bytes) by whoever publishes next.
        while len(self.producer) > 0 and not self.stop.is_set():
            self.producer.flush(1.0)
        if any(fatal(e) for e in failed):
            self.producer = None  # an idempotent producer's fatal error: start a new one
        if acked:
            conn.execute("UPDATE outbox SET sent_at = now() WHERE id = ANY(%s)", (acked,))
            say(logging.INFO, "commands sent", count=len(acked))
        if failed:
            raise KafkaException(failed[0])
        return len(acked)


# ---- the inbox: apply each event, and the position, in one transaction ----

def parse_event(payload):
    """The fields this service needs, checked; None when the message is not
    a result event it can read (kept in inbox_rejects and skipped). Anyone
    can write to the topic: no message may raise here, or the inbox would
    read it again for ever and apply nothing behind it."""
    try:
        return read_event(payload)
    except Exception:  # RecursionError of a deep nest, a type we did not foresee
        return None


def read_event(payload):
    try:
        ev = json.loads(payload)
    except (TypeError, ValueError):
        return None
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        return None
    ids, optional = ["event_id", "payment_attempt_id"], ["order_id"]
    if ev["type"] in REFUND_TYPES:
        ids.append("refund_id")  # order_id may be absent: a refund never recorded
    elif ev["type"] in CHARGE_TYPES:
        ids, optional = ids + optional, []
    else:
        return None
    try:
        for k in ids:
            ev[k] = str(uuid.UUID(ev[k]))
        for k in optional:
            ev[k] = None if ev.get(k) is None else str(uuid.UUID(ev[k]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return ev


def note_event(cur, ev):
    """An event only says "ask charged about this attempt (or refund) now":
    it makes our own row due for the confirmer and moves nothing else. The
    results topic is shared and anyone can write to it, and the ids an
    event names are no secret (each attempt's id is its command's key on
    the commands topic), so what pays an order, makes a new attempt or
    counts a refund is charged's own answer (Confirmer), never an event.
    True when the event is about one of our rows."""
    if ev["type"] in CHARGE_TYPES:
        cur.execute("UPDATE order_attempts SET last_event_type = %s, last_event_id = %s, "
                    "confirm_due = true, wakes = wakes + 1, next_poll_at = now(), "
                    "poll_every_ms = 500 WHERE payment_attempt_id = %s RETURNING order_id",
                    (ev["type"], ev["event_id"], ev["payment_attempt_id"]))
    else:
        cur.execute("UPDATE order_refunds SET last_event_type = %s, confirm_due = true, "
                    "wakes = wakes + 1, next_poll_at = now(), poll_every_ms = 500 "
                    "WHERE refund_id = %s AND payment_attempt_id = %s RETURNING order_id",
                    (ev["type"], ev["refund_id"], ev["payment_attempt_id"]))
    row = cur.fetchone()
    if row is None:
        return False  # not one of ours (the results topic is shared)
    if ev["order_id"] is not None and str(row[0]) != ev["order_id"]:
        say(logging.WARNING, "event names another order than our row's; ours is asked about",
            event_id=ev["event_id"], order_id=str(row[0]))
    return True


def apply_batch(conn, messages):
    """One transaction for the batch: each event recorded once by event_id
    (a duplicate inserts nothing and so changes nothing), its row made due
    for the confirmer only when it was new, and every partition's position
    past its last message. All of it commits, or none of it (then the
    batch is read again)."""
    ends, ours = {}, False
    with conn.transaction(), conn.cursor() as cur:
        for m in messages:
            ends[(m.topic(), m.partition())] = m.offset() + 1
            ev = parse_event(m.value())
            if ev is None:
                say(logging.WARNING, "skipping a message that is not a result event",
                    partition=m.partition(), offset=m.offset())
                head = (m.value() or b"")[:200].decode("utf-8", "replace").replace("\x00", "")
                cur.execute("INSERT INTO inbox_rejects (topic, kafka_partition, kafka_offset, "
                            "payload_head) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                            (m.topic(), m.partition(), m.offset(), head))
                continue
            refund = ev["type"] in REFUND_TYPES
            cur.execute("INSERT INTO processed_events (event_id, subject_kind, subject_id, "
                        "type, payment_attempt_id, order_id, refund_id, topic, kafka_partition, "
                        "kafka_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (event_id, subject_kind, subject_id) DO NOTHING "
                        "RETURNING event_id",
                        (ev["event_id"], "refund" if refund else "charge",
                         ev["refund_id"] if refund else ev["payment_attempt_id"],
                         ev["type"], ev["payment_attempt_id"], ev["order_id"],
                         ev.get("refund_id"), m.topic(), m.partition(), m.offset()))
            if cur.fetchone() is None:
                continue  # applied before: at-least-once delivery's duplicate
            ours = note_event(cur, ev) or ours
        for (topic, part), nxt in ends.items():
            # GREATEST: a stale batch (a member that lost the partition
            # meanwhile) never moves a position back.
            cur.execute("INSERT INTO consumer_positions (topic, kafka_partition, next_offset) "
                        "VALUES (%s, %s, %s) ON CONFLICT (topic, kafka_partition) DO UPDATE "
                        "SET next_offset = GREATEST(consumer_positions.next_offset, "
                        "EXCLUDED.next_offset)", (topic, part, nxt))
        if ours:
            cur.execute("SELECT pg_notify(%s, '')", (CONFIRM_CHANNEL,))
    return ends


def fatal(err):
    """A consumer error it never recovers from (librdkafka reports the
    fatal error itself as _FATAL, not always with fatal() set)."""
    return err.fatal() or err.code() == KafkaError._FATAL


class Inbox:
    """The result events' consumer. Kafka's group assigns partitions; the
    positions are the database's, read on every assignment."""

    def __init__(self, stop):
        self.stop = stop
        self.db = Database(env("ORDERS_DATABASE_URL"), "inbox")
        self.topic = env("CHARGE_RESULTS_TOPIC", "payments.charge.results")
        conf = {
            "bootstrap.servers": env("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"),
            "group.id": env("ORDERS_GROUP_ID", "order-service"),
            "session.timeout.ms": int(env("ORDERS_SESSION_TIMEOUT_MS", "10000")),
            "auto.offset.reset": "earliest",
            # Kafka's committed offsets only show lag to operators: they are
            # stored after the database committed, and never read back.
            "enable.auto.commit": True,
            "enable.auto.offset.store": False,
            "logger": kafka_logger("consumer"),
        }
        # Static membership: a restarted instance takes its partitions back
        # at once, without a rebalance. Only with an id unique to the
        # instance (a StatefulSet pod's name): two instances with one id
        # fence each other out of the group.
        if os.environ.get("ORDERS_INSTANCE_ID"):
            conf["group.instance.id"] = os.environ["ORDERS_INSTANCE_ID"]
        self.consumer = Consumer(conf)

    def on_assign(self, consumer, partitions):
        """Seek every assigned partition to the position stored in the
        database (the beginning when none), waiting out a database outage."""
        backoff = Backoff(self.stop)
        while True:
            try:
                rows = self.db.connect().execute(
                    "SELECT kafka_partition, next_offset FROM consumer_positions "
                    "WHERE topic = %s", (self.topic,)).fetchall()
                self.db.conn.rollback()
                break
            except psycopg.Error as e:
                say(logging.WARNING, "inbox: positions unreadable, waiting", error=str(e)[:300])
                self.db.close()
                if self.stop.is_set():
                    rows = []  # nothing is applied after a stop: any start will do
                    break
                backoff.wait()
        stored = dict(rows)
        for p in partitions:
            p.offset = stored.get(p.partition, OFFSET_BEGINNING)
        consumer.assign(partitions)
        say(logging.INFO, "partitions assigned",
            positions={p.partition: stored.get(p.partition, 0) for p in partitions})

    def on_revoke(self, consumer, partitions):
        # Nothing to commit: every applied batch moved its positions in its
        # own transaction. A batch is applied between polls, never during one.
        consumer.unassign()
        say(logging.INFO, "partitions revoked", partitions=[p.partition for p in partitions])

    def run(self):
        try:
            self.consume()
        finally:
            self.consumer.close()
            self.db.close()

    def consume(self):
        self.consumer.subscribe([self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke)
        poll_backoff = Backoff(self.stop)
        while not self.stop.is_set():
            try:
                msgs = self.consumer.consume(num_messages=BATCH, timeout=1.0)
            except KafkaException as e:
                if e.args and fatal(e.args[0]):
                    raise  # this consumer is done for: InboxLoop makes a new one
                say(logging.WARNING, "inbox: consume failed, waiting", error=str(e)[:300])
                poll_backoff.wait()
                continue
            batch = []
            for m in msgs:
                if m.error() is None:
                    batch.append(m)
                elif fatal(m.error()):
                    # Fenced (another instance with our ORDERS_INSTANCE_ID),
                    # or the group gone: this consumer never reads again.
                    raise KafkaException(m.error())
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    # Broker away, topic not yet there...: librdkafka
                    # reconnects by itself; we wait a little, not spin.
                    say(logging.WARNING, "inbox: consumer error", error=str(m.error())[:300])
                    poll_backoff.wait()
            # A batch being applied is finished when a stop arrives; one
            # fetched after it is left for the next reader (its positions
            # did not move).
            if batch and not self.stop.is_set():
                poll_backoff.reset()
                self.apply(batch)

    def apply(self, batch):
        """Applies one batch, retrying it whole after a database failure.
        On a stop the batch is dropped unapplied: its positions did not move,
        so whoever reads next reads it again. A value the database refuses
        (a constraint, a bad value) fails the same way every time: then each
        message is applied alone, and the one refused alone is kept in
        inbox_rejects, raised as an alarm line and passed, so that it never
        holds up the events behind it."""
        backoff = Backoff(self.stop)
        while True:
            try:
                ends = apply_batch(self.db.connect(), batch)
                break
            except (psycopg.errors.IntegrityError, psycopg.errors.DataError):
                ends = self.apply_alone(batch)
                if ends is not None:
                    break
                # The database failed meanwhile: all of it again (what
                # committed alone is deduplicated by its event_id).
                if self.stop.is_set():
                    return
                backoff.wait()
            except psycopg.Error as e:
                say(logging.WARNING, "inbox: batch not applied, retrying",
                    error=str(e)[:300], messages=len(batch))
                self.db.close()
                if self.stop.is_set():
                    return
                backoff.wait()
        say(logging.INFO, "applied", messages=len(batch))
        try:
            self.consumer.store_offsets(offsets=[TopicPartition(t, p, o)
                                                 for (t, p), o in ends.items()])
        except KafkaException:
            pass  # a partition revoked meanwhile: Kafka's copy is advisory only

    def apply_alone(self, batch):
        """Each message of a batch the database refused, alone; None when the
        database failed otherwise meanwhile (the caller tries the batch again)."""
        ends = {}
        for m in batch:
            conn = self.db.connect()
            try:
                ends.update(apply_batch(conn, [m]))
            except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as e:
                reject_message(conn, m, str(e))
                ends[(m.topic(), m.partition())] = m.offset() + 1
            except psycopg.Error as e:
                say(logging.WARNING, "inbox: batch not applied, reading it again",
                    error=str(e)[:300])
                self.db.close()
                return None
        return ends


class InboxLoop(threading.Thread):
    """The inbox, made anew whenever its consumer is done for (fenced,
    could not be made), until the service stops."""

    def __init__(self, stop):
        threading.Thread.__init__(self, name="inbox", daemon=True)
        self.stop = stop

    def run(self):
        backoff = Backoff(self.stop)
        while not self.stop.is_set():
            try:
                Inbox(self.stop).run()
            except Exception:  # a consumer done for, or not made: a new one, later
                log.exception("inbox: unexpected error")
                backoff.wait()


def reject_message(conn, m, why):
    """Keeps a message the database refused to apply, and moves its
    partition's position past it, in one transaction."""
    head = (m.value() or b"")[:200].decode("utf-8", "replace").replace("\x00", "")
    with conn.transaction():
        conn.execute("INSERT INTO inbox_rejects (topic, kafka_partition, kafka_offset, "
                     "payload_head) VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
                     (m.topic(), m.partition(), m.offset(), head))
        conn.execute("INSERT INTO consumer_positions (topic, kafka_partition, next_offset) "
                     "VALUES (%s, %s, %s) ON CONFLICT (topic, kafka_partition) DO UPDATE "
                     "SET next_offset = GREATEST(consumer_positions.next_offset, "
                     "EXCLUDED.next_offset)", (m.topic(), m.partition(), m.offset() + 1))
    say(logging.ERROR, "result event refused by the database, kept in inbox_rejects",
        partition=m.partition(), offset=m.offset(), error=why[:300])


# ---- charged's word: what pays an order, makes a new attempt, counts a refund ----

def raise_alarm(cur, kind, order_id, attempt, refund=None, detail=None):
    cur.execute("INSERT INTO order_alarms (kind, order_id, payment_attempt_id, refund_id, "
                "detail) VALUES (%s, %s, %s, %s, %s)", (kind, order_id, attempt, refund, detail))
    say(logging.ERROR, "order needs a person", kind=kind, order_id=str(order_id),
        payment_attempt_id=str(attempt), refund_id=refund and str(refund), detail=detail)


def mismatch(answer, want):
    """The first field of charged's answer that is not what our own row
    says, or None. Our ids are ours, so an answer about them that differs
    (a command under our attempt id that we never sent) is never acted on."""
    for k, v in want.items():
        if str(answer.get(k)).lower() != str(v).lower():
            return k
    return None


def attempt_succeeded(cur, attempt, order_id):
    """Pays the order: the first SUCCEEDED attempt of it. One of a second
    attempt that charged too (the first was FAILED, then a person's review
    found it charged) raises paid_twice: refund one. The refund is decided
    once per order: a payment reversed and restored by charged's reviews
    pays the order again, never refunds it again."""
    cur.execute("UPDATE orders SET paid = true, paid_attempt_id = %s "
                "WHERE order_id = %s AND NOT paid RETURNING seq, amount", (attempt, order_id))
    paid = cur.fetchone()
    if paid is None:
        cur.execute("SELECT 1 FROM orders WHERE order_id = %s AND paid_attempt_id <> %s",
                    (order_id, attempt))
        if cur.fetchone():
            raise_alarm(cur, "paid_twice", order_id, attempt)
        return
    cur.execute("SELECT 1 FROM order_refunds WHERE order_id = %s", (order_id,))
    refund = None if cur.fetchone() else refund_for(paid[0], paid[1])
    if refund:
        add_refund(cur, order_id, attempt, *refund)


def attempt_failed(cur, attempt, order_id, attempt_no, succeeded_once):
    """FAILED is the provider's word, through charged, that no money moved.
    The attempt that paid the order FAILED after all (a person's review
    reversed it): the order is paid by another attempt of it charged says
    SUCCEEDED (one that raised paid_twice), else unpaid; for a person
    either way. An attempt this service saw SUCCEEDED at any time is a
    person's matter however often it turns FAILED: never tried again.
    Otherwise the order's latest attempt FAILED (a decline): a new one (new
    id and key, another card), once."""
    cur.execute("UPDATE orders SET paid = false, paid_attempt_id = NULL "
                "WHERE order_id = %s AND paid_attempt_id = %s RETURNING 1", (order_id, attempt))
    if cur.fetchone():
        raise_alarm(cur, "payment_reversed", order_id, attempt)
        cur.execute("UPDATE orders SET paid = true, paid_attempt_id = (SELECT "
                    "payment_attempt_id FROM order_attempts WHERE order_id = %s AND "
                    "applied_status = 'SUCCEEDED' AND payment_attempt_id <> %s "
                    "ORDER BY attempt_no LIMIT 1) WHERE order_id = %s AND EXISTS (SELECT 1 "
                    "FROM order_attempts WHERE order_id = %s AND applied_status = 'SUCCEEDED' "
                    "AND payment_attempt_id <> %s)",
                    (order_id, attempt, order_id, order_id, attempt))
        return
    if succeeded_once or attempt_no >= MAX_ATTEMPTS:
        return
    cur.execute("SELECT o.amount, o.currency FROM orders o WHERE o.order_id = %s AND "
                "NOT o.paid AND NOT EXISTS (SELECT 1 FROM order_attempts a WHERE "
                "a.order_id = o.order_id AND a.attempt_no > %s) FOR UPDATE",
                (order_id, attempt_no))
    order = cur.fetchone()
    if order:
        add_attempt(cur, order_id, attempt_no + 1, order[0], order[1], SECOND_CARD)


def answer_time(answer):
    """The answer's updated_at, when it has one (charged's clock)."""
    t = answer.get("updated_at") if answer else None
    return t if isinstance(t, str) else None


def confirm_attempt(cur, attempt, wakes, answer):
    """Applies what charged's api answered about our attempt (None: it has
    no record yet), in the caller's transaction. Each settled status is
    applied once: SUCCEEDED pays, FAILED unpays or tries again; the others
    change no order. An answer older (charged's updated_at) than one
    applied already is stale: another instance asked later. The row stays
    due until the answer is settled and no event asked again meanwhile
    (wakes)."""
    cur.execute("SELECT a.order_id, a.attempt_no, a.applied_status, a.poll_every_ms, o.amount, "
                "o.currency, coalesce(%s::timestamptz < a.answer_updated_at, false), "
                "a.succeeded_once FROM order_attempts a JOIN orders o USING (order_id) "
                "WHERE a.payment_attempt_id = %s FOR UPDATE OF a", (answer_time(answer), attempt))
    (order_id, attempt_no, applied, every, amount, currency, stale,
     succeeded_once) = cur.fetchone()
    if stale:
        answer = None
    status = answer and answer.get("status")
    wrong = answer and mismatch(answer, {"payment_attempt_id": attempt, "order_id": order_id,
                                         "amount": amount, "currency": currency})
    if wrong:
        if applied != "MISMATCH":
            raise_alarm(cur, "answer_mismatch", order_id, attempt, detail=wrong)
        status, applied_now = None, "MISMATCH"
    elif status in TERMINAL and status != applied:
        if status == "SUCCEEDED":
            attempt_succeeded(cur, attempt, order_id)
            succeeded_once = True
        elif status == "FAILED":
            attempt_failed(cur, attempt, order_id, attempt_no, succeeded_once)
        elif status == "REJECTED":
            # charged refused the command (docs/states.md): nothing was
            # charged, and nothing will be; the order waits for a person.
            raise_alarm(cur, "charge_rejected", order_id, attempt,
                        detail=str(answer.get("reason"))[:200])
        applied_now = status
    else:
        applied_now = applied
    settled = wrong or status in TERMINAL
    cur.execute("UPDATE order_attempts SET confirmed_status = coalesce(%s, confirmed_status), "
                "confirmed_at = now(), applied_status = %s, succeeded_once = %s, "
                "answer_updated_at = greatest(answer_updated_at, %s::timestamptz), "
                "confirm_due = confirm_due AND NOT (%s AND wakes = %s), "
                "next_poll_at = now() + make_interval(secs => %s), poll_every_ms = least(%s, %s) "
                "WHERE payment_attempt_id = %s",
                (status, applied_now, succeeded_once, answer_time(answer), bool(settled), wakes,
                 every / 1000.0, every * 2, POLL_MAX_MS, attempt))
    return status


def confirm_refund(cur, refund, wakes, answer):
    """As confirm_attempt, for our refund: SUCCEEDED counts its own
    recorded amount in the order's refunded total once; FAILED after it
    was counted (a person's review reversed it) takes it back out
    (refund_reversed); FAILED or REJECTED before that means the customer
    is not refunded: refund_not_made, for a person."""
    cur.execute("SELECT order_id, payment_attempt_id, amount, counted, poll_every_ms, "
                "confirmed_status, coalesce(%s::timestamptz < answer_updated_at, false) "
                "FROM order_refunds WHERE refund_id = %s FOR UPDATE",
                (answer_time(answer), refund))
    order_id, attempt, amount, counted, every, before, stale = cur.fetchone()
    if stale:
        answer = None
    status = answer and answer.get("status")
    wrong = answer and mismatch(answer, {"refund_id": refund, "payment_attempt_id": attempt,
                                         "amount": amount})
    if wrong:
        if before != "MISMATCH":
            raise_alarm(cur, "answer_mismatch", order_id, attempt, refund, wrong)
        status = "MISMATCH"
    elif status == "SUCCEEDED" and not counted:
        cur.execute("UPDATE orders SET refunded_amount = refunded_amount + %s "
                    "WHERE order_id = %s", (amount, order_id))
        counted = True
    elif status == "FAILED" and counted:
        cur.execute("UPDATE orders SET refunded_amount = refunded_amount - %s "
                    "WHERE order_id = %s", (amount, order_id))
        raise_alarm(cur, "refund_reversed", order_id, attempt, refund)
        counted = False
    elif status in ("FAILED", "REJECTED") and before != status:
        raise_alarm(cur, "refund_not_made", order_id, attempt, refund, status)
    settled = status in TERMINAL or status == "MISMATCH"
    cur.execute("UPDATE order_refunds SET confirmed_status = coalesce(%s, confirmed_status), "
                "confirmed_at = now(), counted = %s, "
                "answer_updated_at = greatest(answer_updated_at, %s::timestamptz), "
                "confirm_due = confirm_due AND NOT (%s AND wakes = %s), "
                "next_poll_at = now() + make_interval(secs => %s), poll_every_ms = least(%s, %s) "
                "WHERE refund_id = %s",
                (status, counted, answer_time(answer), settled, wakes, every / 1000.0,
                 every * 2, POLL_MAX_MS, refund))
    return status


class ChargedApi:
    """charged's status queries. get() answers the JSON, or None for 404
    (not recorded: a command still in Kafka, or one charged never got)."""

    def __init__(self, base):
        self.base = base.rstrip("/")

    def get(self, path):
        try:
            with urllib.request.urlopen(self.base + path, timeout=5) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return None
            raise
        if not isinstance(doc, dict) or not isinstance(doc.get("status"), str):
            raise ValueError("charged's api answered no status")
        return doc


class Confirmer(threading.Thread):
    """Asks charged's api about every row that is due, and applies its
    answer. Due: an event named the row (note_event), or an attempt whose
    outcome is not known, after charge.unknown or POLL_AFTER_S without any
    outcome: the seed's "payment result being confirmed, do not pay again".
    Each row is asked with a doubling interval until charged answers a
    settled status; no transaction is open during a question, and one row's
    failure never holds up those behind it."""

    def __init__(self, stop, api):
        threading.Thread.__init__(self, name="confirmer", daemon=True)
        self.stop, self.api = stop, api
        self.db = Database(env("ORDERS_DATABASE_URL"), "confirmer", autocommit=True)
        self.listening_on = None

    def run(self):
        backoff = Backoff(self.stop, base=0.5, cap=10.0)
        while not self.stop.is_set():
            try:
                n = self.confirm_due()
                backoff.reset()
                if not n:
                    self.idle()
            except (psycopg.Error, OSError) as e:
                say(logging.WARNING, "confirmer: waiting out a failure", error=str(e)[:300])
                self.db.close()
                backoff.wait()
            except Exception:  # a bug: logged, waited out, never a crash
                log.exception("confirmer: unexpected error")
                self.db.close()
                backoff.wait()
        self.db.close()

    def idle(self):
        """Waits for a NOTIFY from the inbox, at most 0.5 s (rows due by
        time, or a NOTIFY lost with a connection, are seen then)."""
        conn = self.db.connect()
        if self.listening_on is not conn:
            conn.execute("LISTEN " + CONFIRM_CHANNEL)
            self.listening_on = conn
            return
        for _ in conn.notifies(timeout=0.5, stop_after=1):
            pass

    def confirm_due(self):
        conn = self.db.connect()
        # Due: an event asked; or no final answer yet POLL_AFTER_S after the
        # command was sent (an outcome unknown, an event lost or silenced,
        # a review pending): asked on the row's own doubling interval.
        attempts = conn.execute(
            "SELECT a.payment_attempt_id, a.wakes FROM order_attempts a "
            "JOIN outbox o ON o.command_id = a.payment_attempt_id "
            "WHERE coalesce(a.next_poll_at, '-infinity') <= now() AND (a.confirm_due OR "
            "(coalesce(a.confirmed_status, '') NOT IN (%s, %s, %s) AND a.applied_status IS "
            "DISTINCT FROM 'MISMATCH' AND o.sent_at < now() - make_interval(secs => %s))) "
            "ORDER BY a.next_poll_at NULLS FIRST LIMIT 50", FINAL + (POLL_AFTER_S,)).fetchall()
        for attempt, wakes in attempts:
            if self.stop.is_set():
                return 0  # what is left is asked by whoever runs next
            self.confirm(conn, confirm_attempt, "/v1/payment-attempts/%s", attempt, wakes)
        refunds = conn.execute(
            "SELECT r.refund_id, r.wakes FROM order_refunds r "
            "JOIN outbox o ON o.command_id = r.refund_id "
            "WHERE coalesce(r.next_poll_at, '-infinity') <= now() AND (r.confirm_due OR "
            "(coalesce(r.confirmed_status, '') NOT IN (%s, %s, %s, 'MISMATCH') AND "
            "o.sent_at < now() - make_interval(secs => %s))) "
            "ORDER BY r.next_poll_at NULLS FIRST LIMIT 50", FINAL + (POLL_AFTER_S,)).fetchall()
        for refund, wakes in refunds:
            if self.stop.is_set():
                return 0
            self.confirm(conn, confirm_refund, "/v1/refunds/%s", refund, wakes)
        return len(attempts) + len(refunds)

    def confirm(self, conn, apply, path, row_id, wakes):
        try:
            answer = self.api.get(path % row_id)  # no transaction open during the call
        except Exception as e:  # any failed question (cut short, garbled): this row, later
            say(logging.WARNING, "charged's api did not answer; asked again later",
                id=str(row_id), error=str(e)[:200])
            answer = None
        try:
            with conn.transaction(), conn.cursor() as cur:
                status = apply(cur, row_id, wakes, answer)
        except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as e:
            # The effect of this answer is refused by the database, every
            # time: kept for a person, and asked again later, never holding
            # up the others.
            self.refused(conn, row_id, path, str(e))
            return
        if status:
            say(logging.DEBUG, "charged says", id=str(row_id), status=status)

    # An effect refused: the row is asked again later, on its own interval.
    LATER = {
        "order_attempts": "UPDATE order_attempts SET next_poll_at = now() + make_interval("
        "secs => poll_every_ms / 1000.0), poll_every_ms = least(poll_every_ms * 2, %s) "
        "WHERE payment_attempt_id = %s RETURNING order_id, payment_attempt_id, NULL::uuid",
        "order_refunds": "UPDATE order_refunds SET next_poll_at = now() + make_interval("
        "secs => poll_every_ms / 1000.0), poll_every_ms = least(poll_every_ms * 2, %s) "
        "WHERE refund_id = %s RETURNING order_id, payment_attempt_id, refund_id",
    }

    def refused(self, conn, row_id, path, why):
        table = "order_attempts" if path.startswith("/v1/payment-attempts/") else "order_refunds"
        with conn.transaction(), conn.cursor() as cur:
            cur.execute(self.LATER[table], (POLL_MAX_MS, row_id))
            order_id, attempt, refund = cur.fetchone()
            cur.execute("SELECT 1 FROM order_alarms WHERE kind = 'effect_refused' AND "
                        "coalesce(refund_id, payment_attempt_id) = %s", (row_id,))
            if cur.fetchone() is None:
                raise_alarm(cur, "effect_refused", order_id, attempt, refund, why[:300])


# ---- the service ----

def check_schema():
    """Exits 2, saying why, when the database was made by an older version
    of this example: its tables have no migrations, and a column missing
    would fail every batch for ever."""
    want = {("processed_events", "subject_kind"), ("order_attempts", "succeeded_once"),
            ("order_attempts", "answer_updated_at"), ("order_refunds", "counted")}
    try:
        with psycopg.connect(env("ORDERS_DATABASE_URL"), connect_timeout=10) as conn:
            have = set(conn.execute(
                "SELECT table_name, column_name FROM information_schema.columns WHERE "
                "table_schema = current_schema()").fetchall())
    except psycopg.Error:
        return  # the database is away: the loops wait it out
    if not want <= have:
        print("order_service run: the database's tables are not this version's (missing %s): "
              "run `init` on a new database" % ", ".join(
                  "%s.%s" % c for c in sorted(want - have)), file=sys.stderr)
        sys.exit(2)


def run():
    """Publisher, confirmer and inbox until SIGTERM or SIGINT: then the
    inbox finishes its batch, the publisher its send, and it exits 0."""
    api = ChargedApi(env("CHARGED_API_URL"))  # exits 2 before anything starts
    check_schema()
    stop = threading.Event()

    def on_signal(signum, frame):
        say(logging.INFO, "stopping", signal=signum)
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    say(logging.INFO, "order service starting", results=env("CHARGE_RESULTS_TOPIC", "payments.charge.results"),
        commands=env("CHARGE_COMMANDS_TOPIC", "payments.charge.commands"))
    threads = [Publisher(stop), Confirmer(stop, api),
               InboxLoop(stop)]
    for t in threads:
        t.start()
    while not stop.wait(1.0):
        pass
    # Each loop finishes what it holds; one stuck on a database that does
    # not answer is left after STOP_GRACE_S. Leaving is safe: an unmarked
    # send is sent again (same bytes), an uncommitted batch read again.
    deadline = time.monotonic() + STOP_GRACE_S
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:
        say(logging.WARNING, "order service stopped; left unfinished, safe to repeat",
            threads=stuck)
        logging.shutdown()
        os._exit(0)  # a thread blocked in a socket read would hold up the interpreter's exit
    say(logging.INFO, "order service stopped")
    return 0


def resend():
    """Marks every command unsent: what a crash between send and mark leaves
    behind, for all of them. The running publisher sends them again."""
    with psycopg.connect(env("ORDERS_DATABASE_URL"), connect_timeout=10) as conn:
        n = conn.execute("UPDATE outbox SET sent_at = NULL WHERE sent_at IS NOT NULL").rowcount
        conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
    say(logging.INFO, "commands marked unsent", count=n)


def report():
    """What the service knows, from its own tables: orders paid, attempts
    and refunds by charged's last answer about them ("unconfirmed" while
    none), rows an event asked about that wait on charged's answer."""
    with psycopg.connect(env("ORDERS_DATABASE_URL"), connect_timeout=10) as conn:
        orders, paid, refunded = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE paid), coalesce(sum(refunded_amount), 0) "
            "FROM orders").fetchone()
        # By charged's answers, never by the events (anyone can write those).
        attempts = dict(conn.execute("SELECT coalesce(confirmed_status, 'unconfirmed'), "
                                     "count(*) FROM order_attempts GROUP BY 1").fetchall())
        refunds = dict(conn.execute("SELECT coalesce(confirmed_status, 'unconfirmed'), count(*) "
                                    "FROM order_refunds GROUP BY 1").fetchall())
        unsent = conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]
        asking = conn.execute("SELECT (SELECT count(*) FROM order_attempts WHERE confirm_due) + "
                              "(SELECT count(*) FROM order_refunds WHERE confirm_due)").fetchone()[0]
    return {"orders": orders, "paid": paid, "attempts": attempts, "refunds": refunds,
            "refunded_amount": int(refunded), "commands_unsent": unsent,
            "asking_charged": asking}


def main():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("init")
    po = sub.add_parser("place-orders")
    po.add_argument("--count", type=int, default=10)
    sub.add_parser("run")
    sub.add_parser("resend")
    sub.add_parser("report")
    a = ap.parse_args()
    try:
        if a.cmd == "init":
            with psycopg.connect(env("ORDERS_DATABASE_URL"), connect_timeout=10) as conn:
                conn.execute(SCHEMA)
        elif a.cmd == "place-orders":
            place_orders(a.count)
        elif a.cmd == "resend":
            resend()
        elif a.cmd == "report":
            print(json.dumps(report(), sort_keys=True))
        else:
            return run()
    except psycopg.Error as e:  # the one-shot commands: say why in one line
        print("order_service %s: %s" % (a.cmd, str(e).strip().splitlines()[0]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
