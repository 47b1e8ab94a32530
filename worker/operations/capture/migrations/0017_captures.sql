-- 0017 (the capture operation, issue 37): a capture takes part or all of
-- what an authorization holds, once (migration 0016: the hold). No foreign
-- key to the attempt: a step naming an attempt never recorded is itself
-- recorded, REJECTED (as a refund is).
CREATE TABLE capture_attempts (
    id                   uuid PRIMARY KEY,          -- capture_id
    payment_attempt_id   uuid NOT NULL,
    order_id             uuid,                      -- the attempt's, when known
    idempotency_key      text NOT NULL UNIQUE
                         CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    request_fingerprint  text NOT NULL,
    amount               bigint CHECK (amount BETWEEN 1 AND 100000000000), -- NULL: all
    captured_amount      bigint CHECK (captured_amount >= 1),
    currency             text,                      -- the attempt's, when known
    metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
    status               text NOT NULL CHECK (status IN
                         ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED',
                          'FAILED', 'REJECTED', 'REQUIRES_REVIEW')),
    reason               text,                      -- why, when not SUCCEEDED
    payment_intent       text,                      -- the authorization's provider id
    holds                boolean NOT NULL DEFAULT false, -- this step holds its authorization
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
    recorded_seq         bigint GENERATED ALWAYS AS IDENTITY,
    CHECK (status <> 'SUCCEEDED' OR captured_amount IS NOT NULL),
    CHECK (captured_amount IS NULL OR amount IS NULL OR captured_amount = amount),
    CHECK (status NOT IN ('PROCESSING', 'UNKNOWN', 'SUCCEEDED') OR holds),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);
CREATE INDEX capture_attempts_attempt ON capture_attempts (payment_attempt_id, created_at);
CREATE INDEX capture_attempts_to_check ON capture_attempts (next_check_at)
    WHERE status IN ('UNKNOWN', 'PROCESSING');
-- One capture per authorization.
CREATE UNIQUE INDEX capture_attempts_one_per_authorization
    ON capture_attempts (payment_attempt_id) WHERE status = 'SUCCEEDED';

CREATE TABLE capture_transitions (
    id                  bigserial PRIMARY KEY,
    capture_id          uuid NOT NULL REFERENCES capture_attempts (id),
    old_status          text,
    new_status          text NOT NULL,
    cause               text NOT NULL CHECK (cause IN
                        ('worker', 'reconciler', 'webhook', 'operator')),
    actor               text,
    reason              text,
    evidence            jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX capture_transitions_capture ON capture_transitions (capture_id, id);

-- A capture's calls are its authorization's calls too (one history).
ALTER TABLE provider_calls ADD COLUMN capture_id uuid;

-- The hold (0016), and of a capture and a void at most one succeeds.
CREATE TRIGGER capture_attempts_hold BEFORE INSERT OR UPDATE ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION authorization_steps_hold('capture', 'SUCCEEDED',
                                                           'void_attempts');

-- A capture's money, after the hold (triggers fire by name): it holds only
-- for an amount within the authorization's, and succeeds only with the
-- authorization SUCCEEDED for the amount it took.
CREATE FUNCTION capture_attempts_money() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    att payment_attempts%ROWTYPE;
BEGIN
    IF NEW.holds AND NEW.amount IS NOT NULL
       AND (NOT OLD.holds OR NEW.amount IS DISTINCT FROM OLD.amount)
       AND NEW.amount > (SELECT amount FROM payment_attempts
                          WHERE id = NEW.payment_attempt_id) THEN
        RAISE EXCEPTION 'capture % of % is more than its authorization',
            NEW.id, NEW.amount USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = 'SUCCEEDED' AND OLD.status <> 'SUCCEEDED' THEN
        SELECT * INTO att FROM payment_attempts WHERE id = NEW.payment_attempt_id FOR SHARE;
        IF att.captured_amount IS DISTINCT FROM NEW.captured_amount THEN
            RAISE EXCEPTION 'capture % SUCCEEDED (%) while its authorization captured %',
                NEW.id, NEW.captured_amount, att.captured_amount
                USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER capture_attempts_money BEFORE UPDATE ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION capture_attempts_money();

-- One namespace of keys: captures take theirs too.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_kind_check
    CHECK (kind IN ('charge', 'refund', 'capture'));
CREATE TRIGGER capture_attempts_key AFTER INSERT ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_take('capture');
CREATE TRIGGER capture_attempts_key_gone AFTER DELETE ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_give_back('capture');
