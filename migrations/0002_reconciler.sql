-- The reconciler settles attempts whose outcome is unknown by asking the
-- provider, on a back-off schedule per attempt: how many times it has
-- looked decides when it looks next and when a human must decide.
ALTER TABLE payment_attempts
    ADD COLUMN reconcile_checks integer NOT NULL DEFAULT 0;

-- The reconciler's queue, by when to look next. Replaces the first
-- version's index, which held REQUIRES_REVIEW too: those wait for a human,
-- not for the reconciler.
DROP INDEX payment_attempts_to_check;
CREATE INDEX payment_attempts_to_check ON payment_attempts (next_check_at)
    WHERE status IN ('UNKNOWN', 'PROCESSING');
