-- 0014: when the database recorded each provider call, on its own clock.
-- started_at is the calling host's clock (a worker's, the reconciler's, an
-- operator's), which may be off from the database's: a review's guards
-- (how long ago the last call under a key was; what the provider's search
-- may not list yet) compare with now() and take this instead. Recorded
-- after the call returned, never before, so an age from it is never longer
-- than the call's. Rows written before this migration have none (NULL):
-- their started_at stands in. Both statements change the catalog only.
ALTER TABLE provider_calls ADD COLUMN recorded_at timestamptz;
ALTER TABLE provider_calls ALTER COLUMN recorded_at SET DEFAULT now();
