-- Webhooks whose intent carries no attempt id in its metadata are matched
-- by the intent's id: look it up by index, not by scanning every attempt.
CREATE INDEX payment_attempts_provider_payment_id
    ON payment_attempts (provider_payment_id) WHERE provider_payment_id IS NOT NULL;
