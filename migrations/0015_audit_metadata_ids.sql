-- 0015: the auditor compares metadata ids as ids. Metadata is anyone's
-- text: an integration that prints UUIDs in upper case names the same
-- order as charged's lower case. Every other look-up read it as a UUID;
-- the twin look-ups compared the copy's text, so another client's charge
-- of an order, its id in upper case, was never found as that order's
-- second charge (no charged_twice, no page). audit_meta_id is the key they
-- compare: a UUID (8-4-4-4-12 hex digits, either case) in its canonical
-- lower case, anything else as given (never an error: one odd value must
-- not fail a statement over a page). The twin indexes are on it, in the
-- look-ups' order (0008).
CREATE FUNCTION audit_meta_id(t text) RETURNS text
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$SELECT CASE WHEN t ~ '^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$'
                     THEN lower(t) ELSE t END$$;
DROP INDEX audit_intents_attempt;
DROP INDEX audit_intents_order;
CREATE INDEX audit_intents_attempt
    ON audit_intents (audit_meta_id(payment_attempt_id), created, id)
    WHERE status = 'succeeded';
CREATE INDEX audit_intents_order ON audit_intents (audit_meta_id(order_id), created, id)
    WHERE status = 'succeeded';
