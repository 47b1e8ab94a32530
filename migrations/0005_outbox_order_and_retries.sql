-- 0005: result events leave in the order their attempt changed, and one
-- event that cannot be published holds only its own attempt's later events.
--
-- Order. created_at was now(), the time a transaction BEGAN: a webhook
-- transaction that began, waited for the attempt's row lock while a worker
-- committed UNKNOWN, and then wrote SUCCEEDED, stamped its event before the
-- UNKNOWN one, and the relay published charge.succeeded before
-- charge.unknown. A sequence value is drawn when the row is inserted, and
-- every writer inserts an attempt's event after it has locked that
-- attempt's row: of two events of one attempt, the later change always has
-- the larger seq, whatever any clock says.
ALTER TABLE outbox ADD COLUMN seq bigint;
CREATE SEQUENCE outbox_seq OWNED BY outbox.seq;
-- Rows already there keep the order the relay used for them.
UPDATE outbox o SET seq = n.rn
  FROM (SELECT event_id, row_number() OVER (ORDER BY created_at, event_id) AS rn
          FROM outbox) n
 WHERE o.event_id = n.event_id;
SELECT setval('outbox_seq', coalesce((SELECT max(seq) FROM outbox), 0) + 1, false);
ALTER TABLE outbox ALTER COLUMN seq SET DEFAULT nextval('outbox_seq'),
                   ALTER COLUMN seq SET NOT NULL;
ALTER TABLE outbox ADD CONSTRAINT outbox_seq_unique UNIQUE (seq);
DROP INDEX outbox_unpublished;
CREATE INDEX outbox_unpublished ON outbox (seq) WHERE published_at IS NULL;

-- Retries. An event the broker refused while others of its batch were
-- acknowledged waits until retry_at, and so do the later events of its
-- attempt (never the events of other attempts).
ALTER TABLE outbox ADD COLUMN publish_failures integer NOT NULL DEFAULT 0,
                   ADD COLUMN retry_at timestamptz,
                   ADD COLUMN last_error text;

-- Topic. The relay publishes every event to its own CHARGE_RESULTS_TOPIC: a
-- writer with a mistyped topic once addressed an event to a topic nobody
-- published to, and it stopped every event behind it. The column stays for
-- the rows written before this version; nothing writes or reads it now.
ALTER TABLE outbox ALTER COLUMN topic DROP NOT NULL;
