-- 0016: authorize now, capture at shipment, void on cancel (issue 37), as
-- the database's own rules, whatever a statement of ours does.
--
-- An authorization is a payment attempt with capture_method 'manual': the
-- provider holds the money (AUTHORIZED) until one capture takes part or all
-- of it (SUCCEEDED, captured_amount) or a void releases it (VOIDED). A
-- capture and a void are steps with the charge's discipline (their own id,
-- stable key, lease, UNKNOWN, reconciler), each in a table of its own. The
-- authorization is held by at most one step at a time (held_by, taken in
-- the statement that claims the step, only from AUTHORIZED and unheld, and
-- never passed from one step to another): of a capture and a void racing,
-- or two captures, one wins before either calls the provider; the loser is
-- REJECTED with its reason. A step that FAILS gives the hold back (a later
-- capture or void may try); one that succeeds does so only once the
-- authorization has moved on to what it did (captured that amount, or
-- VOIDED), and of a capture and a void at most one ever succeeds.

ALTER TABLE payment_attempts
    ADD COLUMN capture_method text NOT NULL DEFAULT 'automatic'
        CHECK (capture_method IN ('automatic', 'manual')),
    -- What the one capture took, in minor units; the rest was released.
    ADD COLUMN captured_amount bigint CHECK (captured_amount >= 1),
    -- The step that holds the authorization, and its id.
    ADD COLUMN held_by text CHECK (held_by IN ('capture', 'void')),
    ADD COLUMN held_by_id uuid,
    ADD CONSTRAINT payment_attempts_hold_named
        CHECK ((held_by IS NULL) = (held_by_id IS NULL)),
    -- Taken only from AUTHORIZED (payment_attempts_hold), kept while the
    -- step's outcome is in doubt (REQUIRES_REVIEW, UNKNOWN), so that no other
    -- step can claim the authorization meanwhile. (ORs, not IN: the status
    -- CHECK is the one = ANY list of the table, test_schema_migrate's.)
    ADD CONSTRAINT payment_attempts_hold_of_authorization
        CHECK (held_by IS NULL OR (capture_method = 'manual' AND
                                   (status = 'AUTHORIZED' OR status = 'REQUIRES_REVIEW'
                                    OR status = 'UNKNOWN'))),
    ADD CONSTRAINT payment_attempts_captured_within_authorized
        CHECK (captured_amount IS NULL OR
               (capture_method = 'manual' AND captured_amount <= amount)),
    -- Money captured is not released: no void after a capture.
    ADD CONSTRAINT payment_attempts_captured_never_voided
        CHECK (status <> 'VOIDED' OR captured_amount IS NULL),
    ADD CONSTRAINT payment_attempts_manual_states
        CHECK (status NOT IN ('AUTHORIZED', 'VOIDED') OR capture_method = 'manual'),
    ADD CONSTRAINT payment_attempts_authorized_named
        CHECK (status <> 'AUTHORIZED' OR provider_payment_id IS NOT NULL),
    ADD CONSTRAINT payment_attempts_captured_when_succeeded
        CHECK (capture_method = 'automatic' OR status <> 'SUCCEEDED'
               OR captured_amount IS NOT NULL);

ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_status_check;
ALTER TABLE payment_attempts ADD CONSTRAINT payment_attempts_status_check
    CHECK (status IN ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED', 'FAILED',
                      'REJECTED', 'REQUIRES_REVIEW', 'AUTHORIZED', 'VOIDED'));

-- Refunds are bound by what was taken: the amount of a charge, what the
-- capture took of an authorization (nothing before it).
ALTER TABLE payment_attempts DROP CONSTRAINT payment_attempts_refunds_within_charge;
ALTER TABLE payment_attempts ADD CONSTRAINT payment_attempts_refunds_within_charge
    CHECK (refunded_amount >= 0 AND refunded_amount <= refund_reserved
           AND refund_reserved <= CASE capture_method WHEN 'manual'
                                      THEN coalesce(captured_amount, 0)
                                      ELSE amount END);

-- An AUTHORIZED attempt is the order's live one: a second attempt while
-- money is held could take it twice.
DROP INDEX payment_attempts_one_live_per_order;
CREATE UNIQUE INDEX payment_attempts_one_live_per_order
    ON payment_attempts (order_id)
    WHERE status IN ('PENDING', 'PROCESSING', 'UNKNOWN', 'SUCCEEDED',
                     'REQUIRES_REVIEW', 'AUTHORIZED');

-- The two steps. No foreign key to the attempt: a step naming an attempt
-- never recorded is itself recorded, REJECTED (as a refund is).
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

-- A step's calls are its authorization's calls too (one history).
ALTER TABLE provider_calls ADD COLUMN capture_id uuid, ADD COLUMN void_id uuid;

-- The hold, in one place for every writer, whatever a statement of ours
-- does. A step is recorded PENDING (or REJECTED at once) and unheld: the
-- hold and the states after it (PROCESSING, UNKNOWN, SUCCEEDED) come only
-- through the claim's UPDATE, where this trigger sees them. A step names
-- its authorization for good. It holds only while its authorization names
-- it, and a capture holds only for an amount within the authorization's.
-- One that FAILS or is REJECTED gives the hold back. One that succeeds does
-- so only while its authorization is what it did: a capture's SUCCEEDED
-- with the same captured_amount, a void's VOIDED; and never beside a
-- SUCCEEDED step of the other kind. A step that succeeded stays SUCCEEDED
-- whatever the provider says of it later: the authorization goes to
-- review, the step does not move.
CREATE FUNCTION authorization_steps_hold() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    att payment_attempts%ROWTYPE;
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status NOT IN ('PENDING', 'REJECTED') OR NEW.holds THEN
            RAISE EXCEPTION '% % recorded % (holds %): only PENDING or REJECTED, unheld',
                TG_ARGV[0], NEW.id, NEW.status, NEW.holds USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END IF;
    IF NEW.payment_attempt_id <> OLD.payment_attempt_id THEN
        RAISE EXCEPTION '% % names authorization % for good', TG_ARGV[0], OLD.id,
            OLD.payment_attempt_id USING ERRCODE = 'check_violation';
    END IF;
    IF OLD.status = 'SUCCEEDED' AND NEW.status <> 'SUCCEEDED' THEN
        RAISE EXCEPTION '% % is SUCCEEDED and stays so', TG_ARGV[0], OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.holds AND NOT OLD.holds AND NOT EXISTS (
            SELECT 1 FROM payment_attempts
             WHERE id = NEW.payment_attempt_id AND held_by = TG_ARGV[0]
               AND held_by_id = NEW.id) THEN
        RAISE EXCEPTION '% % holds an authorization that does not name it',
            TG_ARGV[0], NEW.id USING ERRCODE = 'check_violation';
    END IF;
    IF TG_ARGV[0] = 'capture' THEN
        -- Nested: NEW.amount is a capture's column only.
        IF NEW.holds AND NEW.amount IS NOT NULL
           AND (NOT OLD.holds OR NEW.amount IS DISTINCT FROM OLD.amount)
           AND NEW.amount > (SELECT amount FROM payment_attempts
                              WHERE id = NEW.payment_attempt_id) THEN
            RAISE EXCEPTION 'capture % of % is more than its authorization',
                NEW.id, NEW.amount USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    IF NEW.status IN ('FAILED', 'REJECTED') AND OLD.holds THEN
        UPDATE payment_attempts SET held_by = NULL, held_by_id = NULL
         WHERE id = NEW.payment_attempt_id AND held_by_id = NEW.id;
        NEW.holds := false;
    ELSIF NEW.status = 'SUCCEEDED' AND OLD.status <> 'SUCCEEDED' THEN
        -- Locked until we commit: the authorization stays what the step
        -- found it, and of a capture and a void succeeding at once the
        -- second waits and then sees the first.
        SELECT * INTO att FROM payment_attempts WHERE id = NEW.payment_attempt_id FOR SHARE;
        IF TG_ARGV[0] = 'capture' THEN
            IF att.status IS DISTINCT FROM 'SUCCEEDED'
               OR att.captured_amount IS DISTINCT FROM NEW.captured_amount THEN
                RAISE EXCEPTION 'capture % SUCCEEDED (%) while its authorization is % (captured %)',
                    NEW.id, NEW.captured_amount, att.status, att.captured_amount
                    USING ERRCODE = 'check_violation';
            END IF;
            IF EXISTS (SELECT 1 FROM void_attempts
                        WHERE payment_attempt_id = NEW.payment_attempt_id
                          AND status = 'SUCCEEDED') THEN
                RAISE EXCEPTION 'capture % SUCCEEDED after a void of its authorization succeeded',
                    NEW.id USING ERRCODE = 'check_violation';
            END IF;
        ELSE
            IF att.status IS DISTINCT FROM 'VOIDED' THEN
                RAISE EXCEPTION 'void % SUCCEEDED while its authorization is %',
                    NEW.id, att.status USING ERRCODE = 'check_violation';
            END IF;
            IF EXISTS (SELECT 1 FROM capture_attempts
                        WHERE payment_attempt_id = NEW.payment_attempt_id
                          AND status = 'SUCCEEDED') THEN
                RAISE EXCEPTION 'void % SUCCEEDED after a capture of its authorization succeeded',
                    NEW.id USING ERRCODE = 'check_violation';
            END IF;
        END IF;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER capture_attempts_hold BEFORE INSERT OR UPDATE ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION authorization_steps_hold('capture');
CREATE TRIGGER void_attempts_hold BEFORE INSERT OR UPDATE ON void_attempts
    FOR EACH ROW EXECUTE FUNCTION authorization_steps_hold('void');

-- The authorization's side of the hold: taken (NULL to a step) only from
-- AUTHORIZED, given back (a step to NULL), never passed from one step to
-- another. It is spent when the authorization is settled (SUCCEEDED,
-- VOIDED, FAILED); through REQUIRES_REVIEW or UNKNOWN the step that holds it
-- keeps it, its outcome being in doubt.
CREATE FUNCTION payment_attempts_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.held_by_id IS NULL AND NEW.held_by_id IS NOT NULL THEN
        IF OLD.status <> 'AUTHORIZED' OR NEW.status <> 'AUTHORIZED' THEN
            RAISE EXCEPTION 'attempt % is %: a hold is taken only from AUTHORIZED',
                OLD.id, OLD.status USING ERRCODE = 'check_violation';
        END IF;
    ELSIF OLD.held_by_id IS NOT NULL AND NEW.held_by_id IS NOT NULL
          AND (NEW.held_by_id <> OLD.held_by_id OR NEW.held_by IS DISTINCT FROM OLD.held_by) THEN
        RAISE EXCEPTION 'attempt % is held by % %, not passed to % %', OLD.id,
            OLD.held_by, OLD.held_by_id, NEW.held_by, NEW.held_by_id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status IS DISTINCT FROM OLD.status
       AND NEW.status IN ('SUCCEEDED', 'VOIDED', 'FAILED') THEN
        NEW.held_by := NULL;
        NEW.held_by_id := NULL;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER payment_attempts_hold BEFORE UPDATE ON payment_attempts
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       OR OLD.held_by IS DISTINCT FROM NEW.held_by
                       OR OLD.held_by_id IS DISTINCT FROM NEW.held_by_id)
    EXECUTE FUNCTION payment_attempts_hold();

-- One namespace of keys: captures and voids take theirs too.
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_kind_check;
ALTER TABLE idempotency_keys ADD CONSTRAINT idempotency_keys_kind_check
    CHECK (kind IN ('charge', 'refund', 'capture', 'void'));
CREATE TRIGGER capture_attempts_key AFTER INSERT ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_take('capture');
CREATE TRIGGER void_attempts_key AFTER INSERT ON void_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_take('void');
CREATE TRIGGER capture_attempts_key_gone AFTER DELETE ON capture_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_give_back('capture');
CREATE TRIGGER void_attempts_key_gone AFTER DELETE ON void_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_give_back('void');

-- The auditor's side (docs/auditor.md): an authorization's money is what the
-- provider received at its capture, not the intent's amount (what it held),
-- so the copy keeps Stripe's manual-capture fields beside the amount; and
-- the four findings of authorizations, captures and voids.
ALTER TABLE audit_intents
    ADD COLUMN capture_method text,                 -- the provider's; NULL: not said
    ADD COLUMN amount_capturable bigint,
    ADD COLUMN amount_received bigint,
    ADD COLUMN cancellation_reason text;
ALTER TABLE audit_findings DROP CONSTRAINT audit_findings_kind_check;
ALTER TABLE audit_findings ADD CONSTRAINT audit_findings_kind_check CHECK (kind IN
    ('charged_twice', 'charged_unbooked', 'booked_not_charged',
     'amount_mismatch', 'currency_mismatch', 'unknown_intent',
     'refund_unbooked', 'refunded_over_charge', 'booked_foreign',
     'foreign_intent', 'captured_over_authorized', 'capture_unbooked',
     'void_unbooked', 'authorization_expired_unvoided'));
