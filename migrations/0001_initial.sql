-- 0001: the tables that carry charged's idempotency guarantees.
--
-- The database, not application code, settles races: unique constraints
-- decide which of two concurrent writers wins, and every state change is
-- written in the same transaction as its audit row and its result event.

-- One row per payment attempt: a deliberate try to charge an order once,
-- with one stable idempotency key that every retry reuses.
CREATE TABLE payment_attempts (
    id                   uuid PRIMARY KEY,          -- payment_attempt_id
    order_id             uuid NOT NULL,
    -- The key sent to the provider. UNIQUE: a key belongs to exactly one
    -- attempt, so a redelivered or re-sent command finds its row instead of
    -- creating a second one.
    idempotency_key      text NOT NULL UNIQUE
                         CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    -- SHA-256 over the parameters that decide what is charged (attempt id,
    -- order, amount, currency, payment method, customer). A reused key whose
    -- fingerprint differs is refused, never charged.
    request_fingerprint  text NOT NULL,
    amount               bigint NOT NULL CHECK (amount BETWEEN 1 AND 100000000000),
    currency             text NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    payment_method       text NOT NULL,
    customer_id          text,
    metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
    status               text NOT NULL CHECK (status IN
                         ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED',
                          'FAILED', 'REJECTED', 'REQUIRES_REVIEW')),
    reason               text,                      -- why, when not SUCCEEDED
    provider_payment_id  text,
    -- Claim: the worker that may call the provider for this attempt, until
    -- when, and a fencing epoch bumped on every claim. A result is persisted
    -- only under the epoch that claimed it, so a worker that lost its lease
    -- cannot overwrite its successor's result.
    lease_owner          text,
    lease_expires_at     timestamptz,
    lease_epoch          bigint NOT NULL DEFAULT 0,
    attempt_count        integer NOT NULL DEFAULT 0, -- provider calls made
    first_sent_at        timestamptz,               -- first provider call
    last_error           text,
    next_check_at        timestamptz,               -- reconciler's next look
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CHECK (status <> 'SUCCEEDED' OR provider_payment_id IS NOT NULL),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);

-- At most one live attempt per order: two attempts of one order can never
-- both reach the provider, and an order never has two SUCCEEDED attempts.
-- REQUIRES_REVIEW counts as live too: until a human has decided whether the
-- provider charged it, a second attempt could be a second charge.
CREATE UNIQUE INDEX payment_attempts_one_live_per_order
    ON payment_attempts (order_id)
    WHERE status IN ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED',
                     'REQUIRES_REVIEW');

-- Lists of an order's attempts (status queries, support).
CREATE INDEX payment_attempts_order ON payment_attempts (order_id, created_at);

-- The reconciler's queue: unsettled attempts by when to look next.
CREATE INDEX payment_attempts_to_check ON payment_attempts (next_check_at)
    WHERE status IN ('UNKNOWN', 'PROCESSING', 'REQUIRES_REVIEW');

-- Every status change, with who caused it and on what evidence. Written in
-- the transaction that changes the status, so the history is never behind.
CREATE TABLE attempt_transitions (
    id                  bigserial PRIMARY KEY,
    payment_attempt_id  uuid NOT NULL REFERENCES payment_attempts (id),
    old_status          text,                       -- NULL when recorded
    new_status          text NOT NULL,
    cause               text NOT NULL CHECK (cause IN
                        ('worker', 'reconciler', 'webhook', 'operator')),
    actor               text,                       -- worker id, operator name
    reason              text,
    evidence            jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX attempt_transitions_attempt
    ON attempt_transitions (payment_attempt_id, id);

-- Every call to the provider for an attempt: what support needs to see what
-- happened (a lost answer, a replay, a slow provider).
CREATE TABLE provider_calls (
    id                  bigserial PRIMARY KEY,
    payment_attempt_id  uuid NOT NULL REFERENCES payment_attempts (id),
    operation           text NOT NULL,              -- charge, retrieve, search
    started_at          timestamptz NOT NULL,
    latency_ms          integer NOT NULL,
    outcome             text NOT NULL,              -- classified answer
    http_status         integer,                    -- NULL: no answer
    replayed            boolean NOT NULL DEFAULT false,
    provider_payment_id text,
    error               text,
    actor               text
);
CREATE INDEX provider_calls_attempt ON provider_calls (payment_attempt_id, id);

-- Transactional outbox: result events written with the state change that
-- causes them, published to Kafka afterwards by `charged relay`. event_id
-- is the event's stable identity: a re-published event keeps it.
CREATE TABLE outbox (
    event_id            uuid PRIMARY KEY,
    payment_attempt_id  uuid NOT NULL REFERENCES payment_attempts (id),
    event_type          text NOT NULL,
    topic               text NOT NULL,
    event_key           text NOT NULL,
    payload             jsonb NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    published_at        timestamptz
);
-- The relay's queue: what is not yet published, oldest first.
CREATE INDEX outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;
CREATE INDEX outbox_attempt ON outbox (payment_attempt_id);

-- The payment journal. UNIQUE (payment_attempt_id, kind): whatever repeats,
-- an attempt is booked as charged at most once.
CREATE TABLE ledger_entries (
    id                  bigserial PRIMARY KEY,
    payment_attempt_id  uuid NOT NULL REFERENCES payment_attempts (id),
    order_id            uuid NOT NULL,
    kind                text NOT NULL CHECK (kind IN ('charge', 'refund')),
    amount              bigint NOT NULL,
    currency            text NOT NULL,
    provider_payment_id text NOT NULL,
    created_at          timestamptz NOT NULL DEFAULT now(),
    UNIQUE (payment_attempt_id, kind)
);

-- Provider webhooks already applied. PRIMARY KEY (provider, event_id): the
-- insert of a redelivered event conflicts, and since it is made in the
-- transaction that applies the event, a duplicate repeats no side effect.
-- Events for attempts we do not know are kept here for review.
CREATE TABLE processed_webhook_events (
    provider            text NOT NULL,
    event_id            text NOT NULL,
    event_type          text NOT NULL,
    payment_attempt_id  uuid,
    outcome             text NOT NULL,              -- applied, ignored, unmatched
    payload             jsonb NOT NULL,
    received_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (provider, event_id)
);
