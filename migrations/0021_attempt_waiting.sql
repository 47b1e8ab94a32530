-- 0021 (issue 38, "latency is honest"): a command the worker holds but
-- cannot send yet, because the fleet's provider budget makes it wait or the
-- provider throttled it (429), says so on its own record for as long as it
-- waits: waiting_reason ('provider_budget' or 'provider_throttled') and
-- waiting_since, set by the worker that holds the lease (one UPDATE per
-- batch, fenced on the lease) once the wait passed ~1 s, cleared by it when
-- the call starts. The status API and `chargectl attempt show` read them
-- (docs/api.md "Status queries", docs/states.md).
--
-- A column pair on each operation's record rather than a table of its
-- own: the wait is a property of the record as it is claimed now, read with
-- the row the readers already read, and it must end with the claim. The
-- trigger below ends it whatever ends the claim (a settlement by the
-- worker, the reconciler, a webhook or an operator; a new claim after a
-- crash): no statement that settles or claims needs to know of it, and no
-- stale row can outlive its record. It fires only for a row that shows a
-- wait (WHEN), so every other update of these tables pays nothing.
ALTER TABLE payment_attempts
    ADD COLUMN waiting_reason text
        CHECK (waiting_reason IN ('provider_budget', 'provider_throttled')),
    ADD COLUMN waiting_since timestamptz,
    ADD CONSTRAINT payment_attempts_waiting
        CHECK ((waiting_reason IS NULL) = (waiting_since IS NULL));
ALTER TABLE refund_attempts
    ADD COLUMN waiting_reason text
        CHECK (waiting_reason IN ('provider_budget', 'provider_throttled')),
    ADD COLUMN waiting_since timestamptz,
    ADD CONSTRAINT refund_attempts_waiting
        CHECK ((waiting_reason IS NULL) = (waiting_since IS NULL));
ALTER TABLE capture_attempts
    ADD COLUMN waiting_reason text
        CHECK (waiting_reason IN ('provider_budget', 'provider_throttled')),
    ADD COLUMN waiting_since timestamptz,
    ADD CONSTRAINT capture_attempts_waiting
        CHECK ((waiting_reason IS NULL) = (waiting_since IS NULL));
ALTER TABLE void_attempts
    ADD COLUMN waiting_reason text
        CHECK (waiting_reason IN ('provider_budget', 'provider_throttled')),
    ADD COLUMN waiting_since timestamptz,
    ADD CONSTRAINT void_attempts_waiting
        CHECK ((waiting_reason IS NULL) = (waiting_since IS NULL));

-- A wait belongs to the claim that said it: a new status, a new epoch or
-- another owner (a settlement, a hand-back, a new claim) ends it.
CREATE FUNCTION attempt_waiting_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status IS DISTINCT FROM OLD.status
       OR NEW.lease_epoch IS DISTINCT FROM OLD.lease_epoch
       OR NEW.lease_owner IS DISTINCT FROM OLD.lease_owner THEN
        NEW.waiting_reason := NULL;
        NEW.waiting_since := NULL;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER payment_attempts_waiting BEFORE UPDATE ON payment_attempts
    FOR EACH ROW WHEN (OLD.waiting_reason IS NOT NULL)
    EXECUTE FUNCTION attempt_waiting_ends();
CREATE TRIGGER refund_attempts_waiting BEFORE UPDATE ON refund_attempts
    FOR EACH ROW WHEN (OLD.waiting_reason IS NOT NULL)
    EXECUTE FUNCTION attempt_waiting_ends();
CREATE TRIGGER capture_attempts_waiting BEFORE UPDATE ON capture_attempts
    FOR EACH ROW WHEN (OLD.waiting_reason IS NOT NULL)
    EXECUTE FUNCTION attempt_waiting_ends();
CREATE TRIGGER void_attempts_waiting BEFORE UPDATE ON void_attempts
    FOR EACH ROW WHEN (OLD.waiting_reason IS NOT NULL)
    EXECUTE FUNCTION attempt_waiting_ends();
