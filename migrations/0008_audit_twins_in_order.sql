-- 0008: a succeeded intent's twins (another succeeded intent of the same
-- attempt or order) are looked up oldest first. With the attempt or order
-- alone in the index, each look-up read and sorted every intent of that
-- attempt or order: a retry loop of one order made the audit of its window
-- quadratic. In the look-up's order, it is one probe.
DROP INDEX audit_intents_attempt;
DROP INDEX audit_intents_order;
CREATE INDEX audit_intents_attempt ON audit_intents (payment_attempt_id, created, id)
    WHERE status = 'succeeded';
CREATE INDEX audit_intents_order ON audit_intents (order_id, created, id)
    WHERE status = 'succeeded';
