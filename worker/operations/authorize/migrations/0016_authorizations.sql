-- 0016 (the authorize operation, issue 37): an authorization is a payment
-- attempt with capture_method 'manual': the provider holds the money
-- (AUTHORIZED) until one capture takes part or all of it (SUCCEEDED,
-- captured_amount) or a void releases it (VOIDED). A capture and a void
-- are steps with the charge's discipline (their own id, stable key, lease,
-- UNKNOWN, reconciler), each in a table of its own, made by its own
-- operation's migration (capture/, void/). The authorization is held by at
-- most one step at a time (held_by, taken in the statement that claims the
-- step, only from AUTHORIZED and unheld, and never passed from one step to
-- another): of a capture and a void racing, or two captures, one wins
-- before either calls the provider; the loser is REJECTED with its reason.
-- A step that FAILS gives the hold back (a later capture or void may try);
-- one that succeeds does so only once the authorization has moved on to
-- what it did (captured that amount, or VOIDED), and of a capture and a
-- void at most one ever succeeds. This migration holds the authorization's
-- side and the rule every step's table runs (authorization_steps_hold).

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

-- The hold, from a step's side, in one place for every step's table and
-- every writer, whatever a statement of ours does; a step's migration
-- creates its trigger: authorization_steps_hold(kind, what the
-- authorization is once the step succeeded, the other steps' table). A step
-- is recorded PENDING (or REJECTED at once) and unheld: the hold and the
-- states after it (PROCESSING, UNKNOWN, SUCCEEDED) come only through the
-- claim's UPDATE, where this trigger sees them. A step names its
-- authorization for good. It holds only while its authorization names it.
-- One that FAILS or is REJECTED gives the hold back. One that succeeds does
-- so only while its authorization is what it did, and never beside a
-- SUCCEEDED step of the other table. A step that succeeded stays SUCCEEDED
-- whatever the provider says of it later: the authorization goes to
-- review, the step does not move. (A step's own money rules, e.g. a
-- capture's amount, are its table's own trigger.)
CREATE FUNCTION authorization_steps_hold() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    att payment_attempts%ROWTYPE;
    other_succeeded boolean := false;
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
    IF NEW.status IN ('FAILED', 'REJECTED') AND OLD.holds THEN
        UPDATE payment_attempts SET held_by = NULL, held_by_id = NULL
         WHERE id = NEW.payment_attempt_id AND held_by_id = NEW.id;
        NEW.holds := false;
    ELSIF NEW.status = 'SUCCEEDED' AND OLD.status <> 'SUCCEEDED' THEN
        -- Locked until we commit: the authorization stays what the step
        -- found it, and of two steps succeeding at once the second waits
        -- and then sees the first.
        SELECT * INTO att FROM payment_attempts WHERE id = NEW.payment_attempt_id FOR SHARE;
        IF att.status IS DISTINCT FROM TG_ARGV[1] THEN
            RAISE EXCEPTION '% % SUCCEEDED while its authorization is %, not %',
                TG_ARGV[0], NEW.id, att.status, TG_ARGV[1] USING ERRCODE = 'check_violation';
        END IF;
        -- The other steps' table is another operation's: named, and asked
        -- only once it exists (its migration may come later).
        IF to_regclass(TG_ARGV[2]) IS NOT NULL THEN
            EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I WHERE payment_attempt_id = $1'
                           ' AND status = ''SUCCEEDED'')', TG_ARGV[2])
               INTO other_succeeded USING NEW.payment_attempt_id;
        END IF;
        IF other_succeeded THEN
            RAISE EXCEPTION '% % SUCCEEDED after a step of % of its authorization succeeded',
                TG_ARGV[0], NEW.id, TG_ARGV[2] USING ERRCODE = 'check_violation';
        END IF;
    END IF;
    RETURN NEW;
END $$;
