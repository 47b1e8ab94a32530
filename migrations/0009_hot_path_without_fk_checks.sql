-- The worker's hot path without foreign-key checks where the statement that
-- writes the row already proves what the key would check.
--
-- Every attempt_transitions and ledger_entries row of an attempt is written
-- by the statement that inserts or updates (and so locks) that attempt's
-- row, from the rows it returned (common/store/attempt_store.c,
-- webhook_store.c, refund_store.c), and attempts are never deleted. The
-- foreign keys only repeated that proof, in a trigger per row, on every
-- charge: about a third of the persist statement's time. provider_calls
-- keeps its key: its rows are written by a statement of their own.
ALTER TABLE attempt_transitions DROP CONSTRAINT attempt_transitions_payment_attempt_id_fkey;
ALTER TABLE ledger_entries DROP CONSTRAINT ledger_entries_payment_attempt_id_fkey;

-- A refund's ledger row is written by this trigger, from the refund's row:
-- the update of the charge's refunded amount in the same statement proves
-- that the charge exists, or the refund is refused.
CREATE OR REPLACE FUNCTION refund_attempts_money() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.status = 'SUCCEEDED' AND NEW.status <> 'SUCCEEDED' THEN
        RAISE EXCEPTION 'refund % is SUCCEEDED and stays so', OLD.id
            USING ERRCODE = 'check_violation';
    END IF;
    IF NEW.status = 'SUCCEEDED' AND OLD.status <> 'SUCCEEDED' THEN
        UPDATE payment_attempts SET refunded_amount = refunded_amount + NEW.amount
         WHERE id = NEW.payment_attempt_id;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'refund % is of attempt %, which does not exist', NEW.id,
                NEW.payment_attempt_id USING ERRCODE = 'foreign_key_violation';
        END IF;
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
