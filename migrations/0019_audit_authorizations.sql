-- 0019 (issue 37): the auditor's side (docs/auditor.md). An authorization's
-- money is what the provider received at its capture, not the intent's amount (what it held),
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
