-- 0018 (the void operation, issue 37): a void releases what an
-- authorization holds (migration 0016: the hold). No foreign key to the
-- attempt, as a capture's.
CREATE TABLE void_attempts (
    id                   uuid PRIMARY KEY,          -- void_id
    payment_attempt_id   uuid NOT NULL,
    order_id             uuid,
    idempotency_key      text NOT NULL UNIQUE
                         CHECK (idempotency_key ~ '^[A-Za-z0-9._:-]{1,128}$'),
    request_fingerprint  text NOT NULL,
    void_reason          text NOT NULL CHECK (void_reason IN
                         ('requested_by_customer', 'duplicate', 'fraudulent', 'abandoned')),
    released_amount      bigint CHECK (released_amount >= 1),
    metadata             jsonb NOT NULL DEFAULT '{}'::jsonb,
    status               text NOT NULL CHECK (status IN
                         ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED',
                          'FAILED', 'REJECTED', 'REQUIRES_REVIEW')),
    reason               text,
    payment_intent       text,
    holds                boolean NOT NULL DEFAULT false,
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
    CHECK (status NOT IN ('PROCESSING', 'UNKNOWN', 'SUCCEEDED') OR holds),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);
CREATE INDEX void_attempts_attempt ON void_attempts (payment_attempt_id, created_at);
CREATE INDEX void_attempts_to_check ON void_attempts (next_check_at)
    WHERE status IN ('UNKNOWN', 'PROCESSING');
CREATE UNIQUE INDEX void_attempts_one_per_authorization
    ON void_attempts (payment_attempt_id) WHERE status = 'SUCCEEDED';

CREATE TABLE void_transitions (
    id                  bigserial PRIMARY KEY,
    void_id             uuid NOT NULL REFERENCES void_attempts (id),
    old_status          text,
    new_status          text NOT NULL,
    cause               text NOT NULL CHECK (cause IN
                        ('worker', 'reconciler', 'webhook', 'operator')),
    actor               text,
    reason              text,
    evidence            jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX void_transitions_void ON void_transitions (void_id, id);

-- A void's calls are its authorization's calls too (one history).
ALTER TABLE provider_calls ADD COLUMN void_id uuid;

-- The hold (0016), and of a capture and a void at most one succeeds.
CREATE TRIGGER void_attempts_hold BEFORE INSERT OR UPDATE ON void_attempts
    FOR EACH ROW EXECUTE FUNCTION authorization_steps_hold('void', 'VOIDED',
                                                           'capture_attempts');

-- One namespace of keys: voids take theirs too.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_kind_check
    CHECK (kind IN ('charge', 'refund', 'capture', 'void'));
CREATE TRIGGER void_attempts_key AFTER INSERT ON void_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_take('void');
CREATE TRIGGER void_attempts_key_gone AFTER DELETE ON void_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_give_back('void');
