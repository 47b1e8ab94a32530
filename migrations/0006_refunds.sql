-- 0006: refunds, with a charge's discipline and one guard more: never
-- refund more than was charged, whatever races.
--
-- A refund attempt is a deliberate try to give back part or all of one
-- SUCCEEDED payment attempt's charge, with one stable idempotency key that
-- every retry reuses. The charge's row carries what its refunds hold:
-- refund_reserved, taken atomically when a refund is claimed (only while it
-- stays within the charge) and given back when a refund FAILS; and
-- refunded_amount, what the provider confirmed. CHECKs make the database
-- itself refuse a total past the charge, whatever a statement of ours does.
ALTER TABLE payment_attempts
    ADD COLUMN refund_reserved bigint NOT NULL DEFAULT 0,
    ADD COLUMN refunded_amount bigint NOT NULL DEFAULT 0,
    ADD CONSTRAINT payment_attempts_refunds_within_charge
        CHECK (refunded_amount >= 0 AND refunded_amount <= refund_reserved
               AND refund_reserved <= amount);

CREATE TABLE refund_attempts (
    id                   uuid PRIMARY KEY,          -- refund_id
    -- The charge refunded. No foreign key: a refund of an attempt we never
    -- recorded is itself recorded, REJECTED not_refundable.
    payment_attempt_id   uuid NOT NULL,
    order_id             uuid,                      -- the charge's, when known
    -- Unique among refunds; a key a charge already uses is refused when the
    -- refund is recorded (and the provider refuses a reused key too).
    idempotency_key      text NOT NULL UNIQUE
                         CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    -- SHA-256 over refund id, attempt, amount and reason: a reused key or
    -- refund id whose fingerprint differs is a conflict, never refunded.
    request_fingerprint  text NOT NULL,
    amount               bigint NOT NULL CHECK (amount BETWEEN 1 AND 100000000000),
    currency             text,                      -- the charge's, when known
    refund_reason        text NOT NULL CHECK (refund_reason IN
                         ('requested_by_customer', 'duplicate', 'fraudulent')),
    metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
    status               text NOT NULL CHECK (status IN
                         ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED',
                          'FAILED', 'REJECTED', 'REQUIRES_REVIEW')),
    reason               text,                      -- why, when not SUCCEEDED
    payment_intent       text,                      -- the charge's provider id
    provider_refund_id   text,
    -- Whether amount is counted in the charge's refund_reserved: set by the
    -- claim that reserved it, cleared when a FAILED or REJECTED refund gives
    -- it back (refund_attempts_money).
    reserved             boolean NOT NULL DEFAULT false,
    lease_owner          text,
    lease_expires_at     timestamptz,
    lease_epoch          bigint NOT NULL DEFAULT 0,
    attempt_count        integer NOT NULL DEFAULT 0,
    first_sent_at        timestamptz,
    last_error           text,
    next_check_at        timestamptz,
    reconcile_checks     integer NOT NULL DEFAULT 0,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    -- The order refunds were recorded in (a batch's rows in message order):
    -- of two refunds of one charge waiting together, the earlier is
    -- claimed, and reserves, first.
    recorded_seq         bigint GENERATED ALWAYS AS IDENTITY,
    CHECK (status <> 'SUCCEEDED' OR provider_refund_id IS NOT NULL),
    CHECK (status NOT IN ('PROCESSING', 'UNKNOWN', 'SUCCEEDED') OR reserved),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);
CREATE INDEX refund_attempts_charge ON refund_attempts (payment_attempt_id, created_at);
CREATE INDEX refund_attempts_to_check ON refund_attempts (next_check_at)
    WHERE status IN ('UNKNOWN', 'PROCESSING');
CREATE UNIQUE INDEX refund_attempts_provider_refund
    ON refund_attempts (provider_refund_id) WHERE provider_refund_id IS NOT NULL;

CREATE TABLE refund_transitions (
    id                  bigserial PRIMARY KEY,
    refund_id           uuid NOT NULL REFERENCES refund_attempts (id),
    old_status          text,
    new_status          text NOT NULL,
    cause               text NOT NULL CHECK (cause IN
                        ('worker', 'reconciler', 'webhook', 'operator')),
    actor               text,
    reason              text,
    evidence            jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX refund_transitions_refund ON refund_transitions (refund_id, id);

-- A refund's provider calls are the charge's calls too (support reads one
-- history), marked with the refund they were for.
ALTER TABLE provider_calls ADD COLUMN refund_id uuid;
CREATE INDEX provider_calls_refund ON provider_calls (refund_id, id)
    WHERE refund_id IS NOT NULL;

-- Refund events go to the outbox keyed by the charge's attempt, in that
-- attempt's order; a REJECTED refund of an attempt never recorded has an
-- event too, so the outbox no longer requires the attempt's row.
ALTER TABLE outbox DROP CONSTRAINT outbox_payment_attempt_id_fkey;
ALTER TABLE outbox ADD COLUMN refund_id uuid;

-- The ledger: one charge row per attempt, one refund row per SUCCEEDED
-- refund attempt.
ALTER TABLE ledger_entries ADD COLUMN refund_id uuid,
                           ADD COLUMN provider_refund_id text;
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_payment_attempt_id_kind_key;
CREATE UNIQUE INDEX ledger_entries_one_charge_per_attempt
    ON ledger_entries (payment_attempt_id) WHERE kind = 'charge';
CREATE UNIQUE INDEX ledger_entries_one_row_per_refund
    ON ledger_entries (refund_id) WHERE kind = 'refund';
ALTER TABLE ledger_entries ADD CONSTRAINT ledger_entries_refund_named
    CHECK (kind <> 'refund' OR (refund_id IS NOT NULL AND provider_refund_id IS NOT NULL));

-- The money of a refund's status change, in one place for every writer
-- (worker, reconciler, webhook, operator): entering SUCCEEDED books the
-- refund once and counts it as refunded; entering FAILED or REJECTED gives
-- a reservation back. A SUCCEEDED refund never leaves SUCCEEDED by a
-- writer of ours (the provider's later failure of it is a review), so what
-- is refunded only grows.
CREATE FUNCTION refund_attempts_money() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'SUCCEEDED' AND NEW.status <> 'SUCCEEDED' THEN
        RAISE EXCEPTION 'refund % is SUCCEEDED and stays so', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = 'SUCCEEDED' AND OLD.status <> 'SUCCEEDED' THEN
        UPDATE payment_attempts SET refunded_amount = refunded_amount + NEW.amount
         WHERE id = NEW.payment_attempt_id;
        INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, amount, currency,
                                    provider_payment_id, refund_id, provider_refund_id)
        VALUES (NEW.payment_attempt_id, NEW.order_id, 'refund', NEW.amount, NEW.currency,
                NEW.payment_intent, NEW.id, NEW.provider_refund_id)
        ON CONFLICT (refund_id) WHERE kind = 'refund' DO NOTHING;
    ELSIF NEW.status IN ('FAILED', 'REJECTED') AND OLD.reserved THEN
        UPDATE payment_attempts SET refund_reserved = refund_reserved - NEW.amount
         WHERE id = NEW.payment_attempt_id;
        NEW.reserved := false;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER refund_attempts_money BEFORE UPDATE OF status ON refund_attempts
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION refund_attempts_money();
