-- 0012: two finding kinds of ownership (an object is an attempt's only on
-- evidence, never because its metadata names it): booked_foreign, a booked
-- intent or refund that belongs to another attempt, order, refund or charge
-- than its booking's; foreign_intent, an intent whose metadata names an
-- attempt of ours while it is not that attempt's own.
ALTER TABLE audit_findings DROP CONSTRAINT audit_findings_kind_check;
ALTER TABLE audit_findings ADD CONSTRAINT audit_findings_kind_check CHECK (kind IN
    ('charged_twice', 'charged_unbooked', 'booked_not_charged',
     'amount_mismatch', 'currency_mismatch', 'unknown_intent',
     'refund_unbooked', 'refunded_over_charge', 'booked_foreign',
     'foreign_intent'));
