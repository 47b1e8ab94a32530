-- 0011: one namespace of idempotency keys, said by the database.
--
-- The provider keeps one namespace of keys for every call: charges and
-- refunds (captures and voids when they come). Each insert of ours checked
-- the other table first, but against its own snapshot, so a charge and a
-- refund committing the same key in the same instant both passed. Every
-- key now has one row here, written by a trigger in the statement that
-- inserts the charge or the refund, in its transaction: of two racers the
-- second waits on this primary key for the first, and is refused
-- (unique_violation) when the first commits. Its store then records again
-- and finds the key taken: the conflict it always was
-- (idempotency_key_conflict). A resend of the same charge or refund
-- inserts no row of its own (ON CONFLICT DO NOTHING), so no key either.
CREATE TABLE idempotency_keys (
    idempotency_key     text PRIMARY KEY,
    kind                text NOT NULL CHECK (kind IN ('charge', 'refund')),
    owner_id            uuid NOT NULL,              -- the charge's or refund's id
    created_at          timestamptz NOT NULL DEFAULT now()
);

-- Existing rows. A key a charge and a refund already share (only that race
-- could write it) stays with the one recorded first (created_at; the
-- charge on a tie): the provider answered the second call with the first's
-- result. The other keeps its row and history, without a key row; the query
-- in docs/schema.md lists such pairs for a person.
INSERT INTO idempotency_keys (idempotency_key, kind, owner_id, created_at)
SELECT DISTINCT ON (idempotency_key) idempotency_key, kind, id, created_at
  FROM (SELECT idempotency_key, 'charge' AS kind, id, created_at, 0 AS tie
          FROM payment_attempts
        UNION ALL
        SELECT idempotency_key, 'refund', id, created_at, 1 FROM refund_attempts) k
 ORDER BY idempotency_key, created_at, tie;

CREATE FUNCTION idempotency_key_take() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO idempotency_keys (idempotency_key, kind, owner_id)
    VALUES (NEW.idempotency_key, TG_ARGV[0], NEW.id);
    RETURN NULL;
END $$;

-- A deleted row (a test's tampering; nothing of ours deletes) gives its
-- key back, and only its own.
CREATE FUNCTION idempotency_key_give_back() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM idempotency_keys
     WHERE idempotency_key = OLD.idempotency_key AND kind = TG_ARGV[0]
       AND owner_id = OLD.id;
    RETURN NULL;
END $$;

CREATE TRIGGER payment_attempts_key AFTER INSERT ON payment_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_take('charge');
CREATE TRIGGER refund_attempts_key AFTER INSERT ON refund_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_take('refund');
CREATE TRIGGER payment_attempts_key_gone AFTER DELETE ON payment_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_give_back('charge');
CREATE TRIGGER refund_attempts_key_gone AFTER DELETE ON refund_attempts
    FOR EACH ROW EXECUTE FUNCTION idempotency_key_give_back('refund');

