-- 0013: why a webhook event did what it did. An event about an intent or a
-- refund that only names one of ours (metadata is anyone's to write) is
-- recorded without moving anything; the reason says so, for the person
-- who reads the record.
ALTER TABLE processed_webhook_events ADD COLUMN reason text;
