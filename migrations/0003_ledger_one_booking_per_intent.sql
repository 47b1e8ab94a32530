-- One provider charge is booked for one attempt at most: an intent found by
-- the reconciler or named by an operator can never be booked a second time
-- for another attempt, whatever races.
CREATE UNIQUE INDEX ledger_entries_one_booking_per_intent
    ON ledger_entries (provider_payment_id) WHERE kind = 'charge';
