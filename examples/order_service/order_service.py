#!/usr/bin/env python3
"""An order service in front of charged, as a payments team writes one:
confluent-kafka and psycopg 3, a transactional outbox for the commands it
sends, an inbox for the result events it applies, and no crash when the
broker or the database blinks.

    order_service.py init                      # create its tables
    order_service.py place-orders --count 10   # orders + attempts + commands, one transaction
    order_service.py place-orders --authorize  # orders that ship later: authorized now
    order_service.py ship --count 5 [--missing-item-ratio 0.2]  # capture authorized orders
    order_service.py cancel --count 2          # void authorized orders not shipped
    order_service.py run                       # the service: publisher, inbox, confirmer
    order_service.py resend                    # mark every command unsent (sent again, same bytes)
    order_service.py report                    # orders, payments and refunds, as JSON

Environment: ORDERS_DATABASE_URL (its own database), KAFKA_BOOTSTRAP_SERVERS,
CHARGE_COMMANDS_TOPIC, CHARGE_RESULTS_TOPIC (charged's defaults), ORDERS_GROUP_ID (its consumer
group, default order-service), ORDERS_INSTANCE_ID (static group membership,
unique per instance, e.g. the pod's name; none by default), CHARGED_API_URL (charged's api:
what it says pays an order, never an event alone; required by `run`); against brokers that
take TLS and SASL only, KAFKA_SECURITY_PROTOCOL, KAFKA_SASL_MECHANISMS, KAFKA_SASL_USERNAME,
KAFKA_SASL_PASSWORD_FILE (or KAFKA_SASL_PASSWORD) and KAFKA_SSL_CA_LOCATION, as charged's roles
take them. README.md beside this file maps each guarantee to the code.
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
    created_at      timestamptz NOT NULL DEFAULT now(),
    -- A shop that ships later (place-orders --authorize): 'manual', its
    -- attempts authorize; the capture at shipment pays it, a void cancels it.
    capture_method  text NOT NULL DEFAULT 'automatic'
                    CHECK (capture_method IN ('automatic', 'manual')),
    authorized_attempt_id uuid,          -- the attempt charged's api said AUTHORIZED
    -- Shipped (a capture) or canceled (a void), decided once, never both:
    -- order_captures and order_voids each point at this column's value.
    fulfilment      text CHECK (fulfilment IN ('shipped', 'canceled')),
    paid_amount     bigint,              -- what its capture took (NULL: a charge's amount)
    CHECK (fulfilment IS NULL OR (capture_method = 'manual' AND authorized_attempt_id IS NOT NULL)),
    CHECK (paid_amount IS NULL OR (paid_amount BETWEEN 1 AND amount AND capture_method = 'manual')),
    UNIQUE (order_id, fulfilment)
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
-- One capture per shipped order and one void per canceled order, each
-- decided once (order_id UNIQUE), id and key fixed in the transaction that
-- ships or cancels the order, with its command. The foreign key on
-- (order_id, fulfilment) makes "shipped or canceled, never both" the
-- database's: a capture exists only for an order marked shipped, a void
-- only for one marked canceled, and the mark cannot change under either.
-- The columns after them are as order_refunds' (charged's answer about it).
CREATE TABLE IF NOT EXISTS order_captures (
    capture_id         uuid PRIMARY KEY,
    order_id           uuid NOT NULL UNIQUE,
    fulfilment         text NOT NULL DEFAULT 'shipped' CHECK (fulfilment = 'shipped'),
    payment_attempt_id uuid NOT NULL REFERENCES order_attempts,  -- the authorization
    idempotency_key    text NOT NULL UNIQUE,
    amount             bigint NOT NULL CHECK (amount > 0),  -- asked: less when an item is missing
    captured_amount    bigint CHECK (captured_amount BETWEEN 1 AND amount),  -- charged's answer
    last_event_type    text,
    counted            boolean NOT NULL DEFAULT false,  -- the order paid with it
    confirm_due        boolean NOT NULL DEFAULT false,
    wakes              bigint NOT NULL DEFAULT 0,
    confirmed_status   text,            -- what GET /v1/captures/<id> said
    confirmed_at       timestamptz,
    answer_updated_at  timestamptz,
    next_poll_at       timestamptz,
    poll_every_ms      int NOT NULL DEFAULT 500,
    FOREIGN KEY (order_id, fulfilment) REFERENCES orders (order_id, fulfilment)
);
CREATE TABLE IF NOT EXISTS order_voids (
    void_id            uuid PRIMARY KEY,
    order_id           uuid NOT NULL UNIQUE,
    fulfilment         text NOT NULL DEFAULT 'canceled' CHECK (fulfilment = 'canceled'),
    payment_attempt_id uuid NOT NULL REFERENCES order_attempts,
    idempotency_key    text NOT NULL UNIQUE,
    reason             text NOT NULL,   -- requested_by_customer
    released_amount    bigint CHECK (released_amount > 0),  -- charged's answer, once SUCCEEDED
    last_event_type    text,
    counted            boolean NOT NULL DEFAULT false,  -- charged said SUCCEEDED: released
    confirm_due        boolean NOT NULL DEFAULT false,
    wakes              bigint NOT NULL DEFAULT 0,
    confirmed_status   text,            -- what GET /v1/voids/<id> said
    confirmed_at       timestamptz,
    answer_updated_at  timestamptz,
    next_poll_at       timestamptz,
    poll_every_ms      int NOT NULL DEFAULT 500,
    FOREIGN KEY (order_id, fulfilment) REFERENCES orders (order_id, fulfilment)
);
-- The transactional outbox: every command, byte for byte, written in the
-- transaction that decided it; sent_at set once the broker acknowledged it.
CREATE TABLE IF NOT EXISTS outbox (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    command_id  uuid NOT NULL UNIQUE,    -- payment_attempt_id, refund_id, capture_id or void_id
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
    subject_kind       text NOT NULL,   -- charge (charge.* and authorization.*: an
                                        -- attempt), refund, capture or void
    subject_id         uuid NOT NULL,   -- the refund_id, capture_id, void_id, else the
                                        -- payment_attempt_id
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
                                          -- answer_mismatch, effect_refused,
                                          -- authorization_expired, authorization_voided,
                                          -- authorized_twice, captured_not_shipped,
                                          -- capture_rejected, capture_failed,
                                          -- void_rejected, void_failed
    order_id           uuid NOT NULL REFERENCES orders,
    payment_attempt_id uuid NOT NULL,
    refund_id          uuid,              -- a refund's alarm
    capture_id         uuid,              -- a capture's
    void_id            uuid,              -- a void's
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
# authorization.*, capture.* and void.* events (issue 37), by their kind's
# prefix: each only asks about our attempt, capture or void, whatever
# state it names, so a state added later is still a reason to ask.
STEP_FAMILIES = {"authorization": "charge", "capture": "capture", "void": "void"}
# An event's question answered: the row is no longer due. AUTHORIZED holds
# the money until our capture or void; VOIDED released it.
TERMINAL = {"SUCCEEDED", "FAILED", "REJECTED", "REQUIRES_REVIEW", "AUTHORIZED", "VOIDED"}
# Asked no more until an event asks (a review may move). An AUTHORIZED
# attempt is asked on its own interval: an expiry whose event is lost is seen.
FINAL = ("SUCCEEDED", "FAILED", "REJECTED")
ATTEMPT_FINAL = FINAL + ("VOIDED",)
VOID_REASON = "requested_by_customer"
MAX_ATTEMPTS = 2  # a declined order is tried once more, with another card
SECOND_CARD = "pm_card_visa"
OUTBOX_CHANNEL = "order_outbox"  # NOTIFY on commit: the publisher wakes at once
CONFIRM_CHANNEL = "order_confirm"  # NOTIFY on commit: the confirmer wakes at once
POLL_AFTER_S = 30  # a command without any outcome this long: ask charged's api
POLL_MAX_MS = 30000  # the confirmer's longest interval between two questions
BATCH = 200
STOP_GRACE_S = 20  # after SIGTERM: what has not finished by then is left, safe to repeat

# Each step's table and id column: what an event of its kind marks due.
STEP_TABLES = {"refund": ("order_refunds", "refund_id"),
               "capture": ("order_captures", "capture_id"),
               "void": ("order_voids", "void_id")}

log = logging.getLogger("order_service")


def env(name, default=None):
    v = os.environ.get(name, default)
    if v is None:
        print("order_service: %s is not set" % name, file=sys.stderr)
        sys.exit(2)
    return v


# charged's names for Kafka's security settings (deploy/stack.sh env
# --profile production orders prints them), as librdkafka's properties.
KAFKA_SECURITY = (("KAFKA_SECURITY_PROTOCOL", "security.protocol"),
                  ("KAFKA_SASL_MECHANISMS", "sasl.mechanisms"),
                  ("KAFKA_SASL_USERNAME", "sasl.username"),
                  ("KAFKA_SASL_PASSWORD", "sasl.password"),
                  ("KAFKA_SSL_CA_LOCATION", "ssl.ca.location"))


def kafka_security():
    """TLS and SASL for the producer and the consumer, from the names
    charged's roles take: brokers that take SASL_SSL only (the production
    profile) need them. KAFKA_SASL_PASSWORD_FILE keeps the password in its
    file, out of the environment and `ps`. None set: plaintext."""
    conf = {prop: os.environ[name] for name, prop in KAFKA_SECURITY if os.environ.get(name)}
    path = os.environ.get("KAFKA_SASL_PASSWORD_FILE")
    if path:
        if "sasl.password" in conf:
            print("order_service: set KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE, "
                  "not both", file=sys.stderr)
            sys.exit(2)
        try:
            with open(path) as f:
                conf["sasl.password"] = f.read().rstrip("\r\n")
        except OSError as e:
            print("order_service: KAFKA_SASL_PASSWORD_FILE: cannot read '%s': %s"
                  % (path, e.strerror), file=sys.stderr)
            sys.exit(2)
    return conf


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


def connect(url=None, **kw):
    """A connection to our database (ORDERS_DATABASE_URL unless url).
    prepare_threshold=None: psycopg prepares a statement run five times on a
    connection under a name, which a transaction pooler in front of the
    database (PgBouncer before 1.21, the production profile's) binds later
    on another server session: "prepared statement "_pg3_0" does not exist"."""
    return psycopg.connect(url or env("ORDERS_DATABASE_URL"), prepare_threshold=None, **kw)


class Database:
    """One connection, opened again after any failure. Callers run each
    transaction whole or retry it whole (psycopg rolls back on an error
    inside `with conn.transaction()`)."""

    def __init__(self, url, role, autocommit=False):
        self.url, self.role, self.autocommit, self.conn = url, role, autocommit, None

    def connect(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.close()
            self.conn = connect(self.url, connect_timeout=5, autocommit=self.autocommit,
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


def add_attempt(cur, order_id, attempt_no, amount, currency, payment_method, manual=False):
    """A payment attempt with its own id and key, and its charge command
    (an authorization's, with the same fields, for an order that ships
    later), in the caller's transaction: written before anything is sent."""
    attempt = str(uuid.uuid4())
    key = "order-svc:" + attempt
    cur.execute("INSERT INTO order_attempts (payment_attempt_id, order_id, attempt_no, "
                "idempotency_key, payment_method) VALUES (%s, %s, %s, %s, %s)",
                (attempt, order_id, attempt_no, key, payment_method))
    outbox_add(cur, attempt, attempt, {
        "type": "authorization.requested" if manual else "charge.requested", "version": 1,
        "payment_attempt_id": attempt,
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


def place_orders(count, currency="EUR", authorize=False):
    """Orders, their first attempts and charge commands: one transaction.
    authorize: a shop that ships later; its orders are authorized now,
    captured by ship() and voided by cancel()."""
    methods = ["pm_card_visa"] * 8 + ["pm_card_chargeDeclined"]
    with connect(connect_timeout=10) as conn:
        with conn.transaction(), conn.cursor() as cur:
            for _ in range(count):
                order, amount = str(uuid.uuid4()), random.randint(100, 100000)
                cur.execute("INSERT INTO orders (order_id, amount, currency, capture_method) "
                            "VALUES (%s, %s, %s, %s)",
                            (order, amount, currency, "manual" if authorize else "automatic"))
                add_attempt(cur, order, 1, amount, currency, random.choice(methods), authorize)
    say(logging.INFO, "orders placed", count=count, authorize=authorize)


def add_capture(cur, order_id, attempt, amount):
    """A capture of the order's authorization with its own id and key, and
    its command, keyed by the attempt (after the authorization, in its
    partition), in the caller's transaction."""
    capture = str(uuid.uuid4())
    key = "order-svc-capture:" + capture
    cur.execute("INSERT INTO order_captures (capture_id, order_id, payment_attempt_id, "
                "idempotency_key, amount) VALUES (%s, %s, %s, %s, %s)",
                (capture, order_id, attempt, key, amount))
    outbox_add(cur, capture, str(attempt), {
        "type": "capture.requested", "version": 1, "capture_id": capture,
        "payment_attempt_id": str(attempt), "idempotency_key": key, "amount": amount})
    return capture


def add_void(cur, order_id, attempt, reason=VOID_REASON):
    """A void of the order's authorization, as add_capture()."""
    void = str(uuid.uuid4())
    key = "order-svc-void:" + void
    cur.execute("INSERT INTO order_voids (void_id, order_id, payment_attempt_id, "
                "idempotency_key, reason) VALUES (%s, %s, %s, %s, %s)",
                (void, order_id, attempt, key, reason))
    outbox_add(cur, void, str(attempt), {
        "type": "void.requested", "version": 1, "void_id": void,
        "payment_attempt_id": str(attempt), "idempotency_key": key, "reason": reason})
    return void


def capture_amount(amount, missing_ratio, rnd):
    """What shipping takes of an authorized amount: all of it, or, for a
    share missing_ratio of the orders, less (an item is missing)."""
    if amount < 2 or rnd.random() >= missing_ratio:
        return amount
    return amount - rnd.randint(1, amount // 2)


def fulfil(how, count, missing_ratio=0.0, rnd=random):
    """Ships (a capture) or cancels (a void) up to count authorized orders
    neither shipped nor canceled, oldest first: each decided once, in one
    transaction that marks the order and writes its step and command. The
    mark is taken only while unset (and the database refuses a step whose
    order is not marked for it), so an order is shipped or canceled, never
    both, and sends one command. Returns the orders decided."""
    done = []
    with connect(connect_timeout=10) as conn:
        for _ in range(count):
            with conn.transaction(), conn.cursor() as cur:
                cur.execute("SELECT o.order_id, o.amount, o.authorized_attempt_id FROM orders o "
                            "JOIN order_attempts a ON a.payment_attempt_id = "
                            "o.authorized_attempt_id WHERE o.fulfilment IS NULL AND "
                            "a.applied_status = 'AUTHORIZED' ORDER BY o.seq LIMIT 1 "
                            "FOR UPDATE OF o SKIP LOCKED")
                row = cur.fetchone()
                if row is None:
                    break
                order, amount, attempt = row
                cur.execute("UPDATE orders SET fulfilment = %s WHERE order_id = %s AND "
                            "fulfilment IS NULL RETURNING 1", (how, order))
                if cur.fetchone() is None:
                    continue  # decided meanwhile
                if how == "shipped":
                    add_capture(cur, order, attempt, capture_amount(amount, missing_ratio, rnd))
                else:
                    add_void(cur, order, attempt)
                done.append(order)
    say(logging.INFO, "orders " + how, count=len(done))
    return done


def ship(count, missing_ratio=0.0, rnd=random):
    return fulfil("shipped", count, missing_ratio, rnd)


def cancel(count):
    return fulfil("canceled", count)


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
            **kafka_security(),
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


def event_kind(etype):
    """Which of our rows an event's type names: charge (an attempt: charge.*
    and authorization.*), refund, capture or void; None: not a result event."""
    if etype in CHARGE_TYPES:
        return "charge"
    if etype in REFUND_TYPES:
        return "refund"
    family, dot, state = etype.partition(".")
    return STEP_FAMILIES.get(family) if dot and state else None


def read_event(payload):
    try:
        ev = json.loads(payload)
    except (TypeError, ValueError):
        return None
    if not isinstance(ev, dict) or not isinstance(ev.get("type"), str):
        return None
    ids, optional = ["event_id", "payment_attempt_id"], ["order_id"]
    kind = event_kind(ev["type"])
    if kind in ("refund", "capture", "void"):
        ids.append(kind + "_id")  # order_id may be absent: a step never recorded
    elif kind == "charge":
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
    True when the event is about one of our rows (a refund, capture or void
    by its id *and* the attempt it names)."""
    kind = event_kind(ev["type"])
    if kind == "charge":
        cur.execute("UPDATE order_attempts SET last_event_type = %s, last_event_id = %s, "
                    "confirm_due = true, wakes = wakes + 1, next_poll_at = now(), "
                    "poll_every_ms = 500 WHERE payment_attempt_id = %s RETURNING order_id",
                    (ev["type"], ev["event_id"], ev["payment_attempt_id"]))
    else:
        table, key = STEP_TABLES[kind]
        cur.execute("UPDATE " + table + " SET last_event_type = %s, confirm_due = true, "
                    "wakes = wakes + 1, next_poll_at = now(), poll_every_ms = 500 "
                    "WHERE " + key + " = %s AND payment_attempt_id = %s RETURNING order_id",
                    (ev["type"], ev[key], ev["payment_attempt_id"]))
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
            kind = event_kind(ev["type"])
            cur.execute("INSERT INTO processed_events (event_id, subject_kind, subject_id, "
                        "type, payment_attempt_id, order_id, refund_id, topic, kafka_partition, "
                        "kafka_offset) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s) "
                        "ON CONFLICT (event_id, subject_kind, subject_id) DO NOTHING "
                        "RETURNING event_id",
                        (ev["event_id"], kind,
                         ev["payment_attempt_id"] if kind == "charge" else ev[kind + "_id"],
                         ev["type"], ev["payment_attempt_id"], ev["order_id"],
                         ev["refund_id"] if kind == "refund" else None, m.topic(),
                         m.partition(), m.offset()))
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
            **kafka_security(),
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

def raise_alarm(cur, kind, order_id, attempt, refund=None, detail=None, capture=None,
                void=None):
    cur.execute("INSERT INTO order_alarms (kind, order_id, payment_attempt_id, refund_id, "
                "capture_id, void_id, detail) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (kind, order_id, attempt, refund, capture, void, detail))
    say(logging.ERROR, "order needs a person", kind=kind, order_id=str(order_id),
        payment_attempt_id=str(attempt), refund_id=refund and str(refund),
        capture_id=capture and str(capture), void_id=void and str(void), detail=detail)


def mismatch(answer, want):
    """The first field of charged's answer that is not what our own row
    says, or None. Our ids are ours, so an answer about them that differs
    (a command under our attempt id that we never sent) is never acted on."""
    for k, v in want.items():
        if str(answer.get(k)).lower() != str(v).lower():
            return k
    return None


def out_of_bound(answer, field, bound, required):
    """field, when charged's answer gives it (or must: required) as anything
    but a whole amount 1..bound: what was taken or released is never more
    than our own row holds."""
    v = answer.get(field)
    if v is None and not required:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= bound:
        return field
    return None


def reason_code(answer):
    """The code of charged's reason ("authorization_expired", "expired",
    "void_after_capture"), without the words after a colon."""
    return str(answer.get("reason") or "").split(":", 1)[0].strip()


def attempt_succeeded(cur, attempt, order_id, captured=None):
    """Pays the order: the first SUCCEEDED attempt of it (or, for an order
    that ships later, its capture: captured, what it took, is paid_amount).
    One of a second attempt that charged too (the first was FAILED, then a
    person's review found it charged) raises paid_twice: refund one. The
    refund is decided once per order, of what was paid (a capture's amount
    bounds it): a payment reversed and restored by charged's reviews pays
    the order again, never refunds it again."""
    cur.execute("UPDATE orders SET paid = true, paid_attempt_id = %s, paid_amount = %s "
                "WHERE order_id = %s AND NOT paid RETURNING seq, coalesce(paid_amount, amount)",
                (attempt, captured, order_id))
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
    cur.execute("UPDATE orders SET paid = false, paid_attempt_id = NULL, paid_amount = NULL "
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
    cur.execute("SELECT o.amount, o.currency, o.capture_method FROM orders o WHERE "
                "o.order_id = %s AND NOT o.paid AND NOT EXISTS (SELECT 1 FROM order_attempts a "
                "WHERE a.order_id = o.order_id AND a.attempt_no > %s) FOR UPDATE",
                (order_id, attempt_no))
    order = cur.fetchone()
    if order:
        add_attempt(cur, order_id, attempt_no + 1, order[0], order[1], SECOND_CARD,
                    order[2] == "manual")


def attempt_authorized(cur, attempt, order_id):
    """charged holds the order's money for a capture (ship) or a void
    (cancel): the order is authorized by this attempt, once. Another
    attempt of it AUTHORIZED too is a second hold on the customer's card:
    authorized_twice, for a person."""
    cur.execute("UPDATE orders SET authorized_attempt_id = %s WHERE order_id = %s AND "
                "authorized_attempt_id IS NULL RETURNING 1", (attempt, order_id))
    if cur.fetchone() is None:
        cur.execute("SELECT 1 FROM orders WHERE order_id = %s AND authorized_attempt_id <> %s",
                    (order_id, attempt))
        if cur.fetchone():
            raise_alarm(cur, "authorized_twice", order_id, attempt)


def attempt_captured(cur, attempt, order_id, answer):
    """An authorization captured (the attempt SUCCEEDED). What pays the
    order is our capture's answer (confirm_capture()); once it has, this
    pays it again only when a reversal unpaid it meanwhile (never a second
    refund: order_refunds holds the first). Captured with no capture of
    ours counted and the order not shipped: attempt_settled_alone()."""
    cur.execute("SELECT captured_amount FROM order_captures WHERE order_id = %s AND "
                "payment_attempt_id = %s AND counted", (order_id, attempt))
    ours = cur.fetchone()
    if ours:
        attempt_succeeded(cur, attempt, order_id, ours[0])
    else:
        attempt_settled_alone(cur, attempt, order_id, "SUCCEEDED", answer)


def attempt_settled_alone(cur, attempt, order_id, status, answer):
    """An authorization captured (SUCCEEDED) or released (VOIDED) while the
    order is neither shipped nor canceled: not by a step of ours. Captured
    is money taken for goods not shipped (captured_not_shipped; our capture
    pays the order, never the attempt's answer); released by the provider
    on its own is an authorization the shop let lapse
    (authorization_expired), by anyone else authorization_voided."""
    cur.execute("SELECT fulfilment FROM orders WHERE order_id = %s", (order_id,))
    fulfilment = cur.fetchone()[0]
    if status == "SUCCEEDED" and fulfilment != "shipped":
        raise_alarm(cur, "captured_not_shipped", order_id, attempt,
                    detail=str(answer.get("captured_amount"))[:40])
    elif status == "VOIDED" and fulfilment is None:
        raise_alarm(cur, "authorization_expired" if reason_code(answer) == "expired"
                    else "authorization_voided", order_id, attempt,
                    detail=str(answer.get("reason"))[:200])


def answer_time(answer):
    """The answer's updated_at, when it has one (charged's clock)."""
    t = answer.get("updated_at") if answer else None
    return t if isinstance(t, str) else None


def confirm_attempt(cur, attempt, wakes, answer):
    """Applies what charged's api answered about our attempt (None: it has
    no record yet), in the caller's transaction. Each settled status is
    applied once: SUCCEEDED pays (a charge: an authorization is paid by our
    capture's answer), AUTHORIZED marks the order authorized, FAILED
    unpays or tries again, an authorization captured or VOIDED not by our
    step is told; the others change no order. The answer must be about
    our row (order, amount, currency, capture_method, a captured amount
    within ours), or nothing moves (answer_mismatch). An answer older
    (charged's updated_at) than one applied already is stale: another
    instance asked later. The row stays due until the answer is settled
    and no event asked again meanwhile (wakes)."""
    cur.execute("SELECT a.order_id, a.attempt_no, a.applied_status, a.poll_every_ms, o.amount, "
                "o.currency, coalesce(%s::timestamptz < a.answer_updated_at, false), "
                "a.succeeded_once, o.capture_method FROM order_attempts a JOIN orders o "
                "USING (order_id) WHERE a.payment_attempt_id = %s FOR UPDATE OF a",
                (answer_time(answer), attempt))
    (order_id, attempt_no, applied, every, amount, currency, stale,
     succeeded_once, method) = cur.fetchone()
    if stale:
        answer = None
    status = answer and answer.get("status")
    # An answer without capture_method is an older charged's: a charge.
    wrong = answer and (mismatch(dict(answer, capture_method=answer.get("capture_method")
                                      or "automatic"),
                                 {"payment_attempt_id": attempt, "order_id": order_id,
                                  "amount": amount, "currency": currency,
                                  "capture_method": method})
                        or out_of_bound(answer, "captured_amount", amount, False))
    if wrong:
        if applied != "MISMATCH":
            raise_alarm(cur, "answer_mismatch", order_id, attempt, detail=wrong)
        status, applied_now = None, "MISMATCH"
    elif status in TERMINAL and status != applied:
        if status == "SUCCEEDED" and method == "manual":
            attempt_captured(cur, attempt, order_id, answer)
            succeeded_once = True
        elif status == "SUCCEEDED":
            attempt_succeeded(cur, attempt, order_id)
            succeeded_once = True
        elif status == "AUTHORIZED":
            attempt_authorized(cur, attempt, order_id)
        elif status == "VOIDED":
            attempt_settled_alone(cur, attempt, order_id, status, answer)
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
    return record_answer(cur, "refund", refund, status, counted, answer, wakes, every)


def record_answer(cur, kind, row_id, status, counted, answer, wakes, every):
    """Stores charged's answer about our refund, capture or void, applied:
    the row stays due until the answer is settled and no event asked again
    meanwhile (wakes), and is asked next on its doubling interval."""
    table, key = STEP_TABLES[kind]
    settled = status in TERMINAL or status == "MISMATCH"
    cur.execute("UPDATE " + table + " SET confirmed_status = coalesce(%s, confirmed_status), "
                "confirmed_at = now(), counted = %s, "
                "answer_updated_at = greatest(answer_updated_at, %s::timestamptz), "
                "confirm_due = confirm_due AND NOT (%s AND wakes = %s), "
                "next_poll_at = now() + make_interval(secs => %s), poll_every_ms = least(%s, %s) "
                "WHERE " + key + " = %s RETURNING payment_attempt_id",
                (status, counted, answer_time(answer), settled, wakes, every / 1000.0,
                 every * 2, POLL_MAX_MS, row_id))
    if settled and kind != "refund":
        # A capture or void settled moves its authorization too: asked next.
        cur.execute("UPDATE order_attempts SET next_poll_at = now() WHERE "
                    "payment_attempt_id = %s", cur.fetchone())
    return status


def confirm_capture(cur, capture, wakes, answer):
    """Applies charged's answer about our capture, as confirm_refund: its
    capture_id, attempt, order, asked amount and currency must be our row's
    and what it took within what we asked, or nothing moves
    (answer_mismatch). SUCCEEDED pays the order once with what it took
    (paid_amount; the rest of the authorization is released) and decides
    its refund, bound by that. FAILED authorization_expired: the shop let
    the hold lapse (authorization_expired), the order is not paid; other
    FAILED capture_failed, REJECTED capture_rejected, each with charged's
    reason, once."""
    cur.execute("SELECT c.order_id, c.payment_attempt_id, c.amount, c.counted, c.poll_every_ms, "
                "c.confirmed_status, coalesce(%s::timestamptz < c.answer_updated_at, false), "
                "o.currency FROM order_captures c JOIN orders o USING (order_id) "
                "WHERE c.capture_id = %s FOR UPDATE OF c", (answer_time(answer), capture))
    order_id, attempt, amount, counted, every, before, stale, currency = cur.fetchone()
    if stale:
        answer = None
    status = answer and answer.get("status")
    wrong = answer and (mismatch(answer, {"capture_id": capture, "payment_attempt_id": attempt,
                                          "order_id": order_id, "amount": amount,
                                          "currency": currency})
                        or out_of_bound(answer, "captured_amount", amount, status == "SUCCEEDED"))
    if wrong:
        if before != "MISMATCH":
            raise_alarm(cur, "answer_mismatch", order_id, attempt, detail=wrong, capture=capture)
        status = "MISMATCH"
    elif status == "SUCCEEDED" and not counted:
        cur.execute("UPDATE order_captures SET captured_amount = %s WHERE capture_id = %s",
                    (answer["captured_amount"], capture))
        attempt_succeeded(cur, attempt, order_id, answer["captured_amount"])
        counted = True
    elif status in ("FAILED", "REJECTED") and before != status:
        expired = status == "FAILED" and reason_code(answer) == "authorization_expired"
        raise_alarm(cur, "authorization_expired" if expired else
                    "capture_" + status.lower(), order_id, attempt,
                    detail=str(answer.get("reason"))[:200], capture=capture)
    return record_answer(cur, "capture", capture, status, counted, answer, wakes, every)


def confirm_void(cur, void, wakes, answer):
    """Applies charged's answer about our void, as confirm_capture: its
    void_id, attempt, order and reason must be our row's and what it
    released within the order's amount. SUCCEEDED: the order is canceled
    and its authorization released (released_amount, the order's amount
    when charged does not say), nothing paid. FAILED void_failed, REJECTED
    (void_after_capture: someone captured it first) void_rejected, once."""
    cur.execute("SELECT v.order_id, v.payment_attempt_id, v.reason, v.counted, v.poll_every_ms, "
                "v.confirmed_status, coalesce(%s::timestamptz < v.answer_updated_at, false), "
                "o.amount FROM order_voids v JOIN orders o USING (order_id) "
                "WHERE v.void_id = %s FOR UPDATE OF v", (answer_time(answer), void))
    order_id, attempt, reason, counted, every, before, stale, amount = cur.fetchone()
    if stale:
        answer = None
    status = answer and answer.get("status")
    wrong = answer and (mismatch(answer, {"void_id": void, "payment_attempt_id": attempt,
                                          "order_id": order_id, "void_reason": reason})
                        or out_of_bound(answer, "released_amount", amount, False))
    if wrong:
        if before != "MISMATCH":
            raise_alarm(cur, "answer_mismatch", order_id, attempt, detail=wrong, void=void)
        status = "MISMATCH"
    elif status == "SUCCEEDED" and not counted:
        cur.execute("UPDATE order_voids SET released_amount = %s WHERE void_id = %s",
                    (answer.get("released_amount") or amount, void))
        counted = True
    elif status in ("FAILED", "REJECTED") and before != status:
        raise_alarm(cur, "void_" + status.lower(), order_id, attempt,
                    detail=str(answer.get("reason"))[:200], void=void)
    return record_answer(cur, "void", void, status, counted, answer, wakes, every)


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
            "(coalesce(a.confirmed_status, '') <> ALL(%s) AND a.applied_status IS "
            "DISTINCT FROM 'MISMATCH' AND o.sent_at < now() - make_interval(secs => %s))) "
            "ORDER BY a.next_poll_at NULLS FIRST LIMIT 50",
            (list(ATTEMPT_FINAL), POLL_AFTER_S)).fetchall()
        for attempt, wakes in attempts:
            if self.stop.is_set():
                return 0  # what is left is asked by whoever runs next
            self.confirm(conn, confirm_attempt, "/v1/payment-attempts/%s", attempt, wakes)
        n = len(attempts)
        for kind, apply, path in (("refund", confirm_refund, "/v1/refunds/%s"),
                                  ("capture", confirm_capture, "/v1/captures/%s"),
                                  ("void", confirm_void, "/v1/voids/%s")):
            table, key = STEP_TABLES[kind]
            rows = conn.execute(
                "SELECT r." + key + ", r.wakes FROM " + table + " r "
                "JOIN outbox o ON o.command_id = r." + key + " "
                "WHERE coalesce(r.next_poll_at, '-infinity') <= now() AND (r.confirm_due OR "
                "(coalesce(r.confirmed_status, '') <> ALL(%s) AND "
                "o.sent_at < now() - make_interval(secs => %s))) "
                "ORDER BY r.next_poll_at NULLS FIRST LIMIT 50",
                (list(FINAL + ("MISMATCH",)), POLL_AFTER_S)).fetchall()
            for row_id, wakes in rows:
                if self.stop.is_set():
                    return 0
                self.confirm(conn, apply, path, row_id, wakes)
            n += len(rows)
        return n

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

    # Which row a question's path is about: its kind (None: an attempt).
    KINDS = {"/v1/payment-attempts/": None, "/v1/refunds/": "refund",
             "/v1/captures/": "capture", "/v1/voids/": "void"}

    def refused(self, conn, row_id, path, why):
        """An effect refused: the row is asked again later, on its own
        interval, and effect_refused is raised once for it."""
        kind = self.KINDS[path.split("%s")[0]]
        table, key = STEP_TABLES.get(kind, ("order_attempts", "payment_attempt_id"))
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("UPDATE " + table + " SET next_poll_at = now() + make_interval("
                        "secs => poll_every_ms / 1000.0), poll_every_ms = least(poll_every_ms "
                        "* 2, %s) WHERE " + key + " = %s RETURNING order_id, payment_attempt_id",
                        (POLL_MAX_MS, row_id))
            order_id, attempt = cur.fetchone()
            cur.execute("SELECT 1 FROM order_alarms WHERE kind = 'effect_refused' AND "
                        "coalesce(refund_id, capture_id, void_id, payment_attempt_id) = %s",
                        (row_id,))
            if cur.fetchone() is None:
                ids = {kind: row_id} if kind else {}
                raise_alarm(cur, "effect_refused", order_id, attempt, detail=why[:300], **ids)


# ---- the service ----

def check_schema():
    """Exits 2, saying why, when the database was made by an older version
    of this example: its tables have no migrations, and a column missing
    would fail every batch for ever."""
    want = {("processed_events", "subject_kind"), ("order_attempts", "succeeded_once"),
            ("order_attempts", "answer_updated_at"), ("order_refunds", "counted"),
            ("orders", "fulfilment"), ("orders", "paid_amount"), ("order_captures", "counted"),
            ("order_voids", "counted"), ("order_alarms", "capture_id")}
    try:
        with connect(connect_timeout=10) as conn:
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
    with connect(connect_timeout=10) as conn:
        n = conn.execute("UPDATE outbox SET sent_at = NULL WHERE sent_at IS NOT NULL").rowcount
        conn.execute("SELECT pg_notify(%s, '')", (OUTBOX_CHANNEL,))
    say(logging.INFO, "commands marked unsent", count=n)


def report():
    """What the service knows, from its own tables: orders paid, attempts,
    refunds, captures and voids by charged's last answer about them
    ("unconfirmed" while none), rows an event asked about that wait on
    charged's answer, and the totals of the orders that ship later
    (hold_totals())."""
    with connect(connect_timeout=10) as conn:
        orders, paid, refunded = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE paid), coalesce(sum(refunded_amount), 0) "
            "FROM orders").fetchone()
        # By charged's answers, never by the events (anyone can write those).
        attempts = dict(conn.execute("SELECT coalesce(confirmed_status, 'unconfirmed'), "
                                     "count(*) FROM order_attempts GROUP BY 1").fetchall())
        refunds = dict(conn.execute("SELECT coalesce(confirmed_status, 'unconfirmed'), count(*) "
                                    "FROM order_refunds GROUP BY 1").fetchall())
        captures = dict(conn.execute("SELECT coalesce(confirmed_status, 'unconfirmed'), "
                                     "count(*) FROM order_captures GROUP BY 1").fetchall())
        voids = dict(conn.execute("SELECT coalesce(confirmed_status, 'unconfirmed'), count(*) "
                                  "FROM order_voids GROUP BY 1").fetchall())
        unsent = conn.execute("SELECT count(*) FROM outbox WHERE sent_at IS NULL").fetchone()[0]
        asking = conn.execute("SELECT (SELECT count(*) FROM order_attempts WHERE confirm_due) + "
                              "(SELECT count(*) FROM order_refunds WHERE confirm_due) + "
                              "(SELECT count(*) FROM order_captures WHERE confirm_due) + "
                              "(SELECT count(*) FROM order_voids WHERE confirm_due)").fetchone()[0]
        holds = hold_totals(conn)
    return {"orders": orders, "paid": paid, "attempts": attempts, "refunds": refunds,
            "refunded_amount": int(refunded), "commands_unsent": unsent,
            "asking_charged": asking, "captures": captures, "voids": voids,
            "authorizations": holds}


def hold_totals(conn):
    """The orders that ship later, in minor units, as charged's answers
    made them: authorized (charged said AUTHORIZED), captured (our captures
    it said SUCCEEDED, what they took), released (what those captures left
    of their authorizations, plus what was voided), voided (what our voids
    released, plus the whole of each authorization charged said VOIDED
    without a void of ours counted: a hold that lapsed at the provider, or
    one another's void released), refunded (refunds counted of those
    orders). The provider's books count a lapsed hold as released too."""
    authorized, captured, left, voided, lapsed, refunded = conn.execute(
        "SELECT coalesce(sum(o.amount) FILTER (WHERE o.authorized_attempt_id IS NOT NULL), 0), "
        "coalesce(sum(c.captured_amount) FILTER (WHERE c.counted), 0), "
        "coalesce(sum(o.amount - c.captured_amount) FILTER (WHERE c.counted), 0), "
        "coalesce(sum(v.released_amount) FILTER (WHERE v.counted), 0), "
        "coalesce(sum(o.amount) FILTER (WHERE a.applied_status = 'VOIDED' AND "
        "v.counted IS NOT TRUE), 0), "
        "coalesce(sum(o.refunded_amount), 0) FROM orders o "
        "LEFT JOIN order_attempts a ON a.payment_attempt_id = o.authorized_attempt_id "
        "LEFT JOIN order_captures c ON c.order_id = o.order_id "
        "LEFT JOIN order_voids v ON v.order_id = o.order_id "
        "WHERE o.capture_method = 'manual'").fetchone()
    voided = int(voided) + int(lapsed)
    return {"authorized": int(authorized), "captured": int(captured),
            "released": int(left) + voided, "voided": voided, "refunded": int(refunded)}


def main():
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("init")
    po = sub.add_parser("place-orders")
    po.add_argument("--count", type=int, default=10)
    po.add_argument("--authorize", action="store_true",
                    help="a shop that ships later: authorization.requested, captured by ship")
    sh = sub.add_parser("ship")
    sh.add_argument("--count", type=int, default=10)
    sh.add_argument("--missing-item-ratio", type=float, default=0.0,
                    help="the share of shipments that capture less (an item is missing)")
    ca = sub.add_parser("cancel")
    ca.add_argument("--count", type=int, default=10)
    sub.add_parser("run")
    sub.add_parser("resend")
    sub.add_parser("report")
    a = ap.parse_args()
    try:
        if a.cmd == "init":
            with connect(connect_timeout=10) as conn:
                conn.execute(SCHEMA)
        elif a.cmd == "place-orders":
            place_orders(a.count, authorize=a.authorize)
        elif a.cmd == "ship":
            ship(a.count, a.missing_item_ratio)
        elif a.cmd == "cancel":
            cancel(a.count)
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
