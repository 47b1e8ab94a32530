-- 0007: the auditor's tables. The auditor reads the provider's own list of
-- what it charged and refunded, window by window of creation time, and
-- matches it against the ledger. None of these tables is written by the
-- hot path of a charge.

-- The provider's books as last listed or retrieved: one row per object.
-- It lets a window's ledger rows be matched in SQL, and a second charge be
-- found against one listed in another window. Refreshed whenever the
-- object is seen again.
CREATE TABLE audit_intents (
    id                  text PRIMARY KEY,           -- pi_...
    status              text NOT NULL,
    amount              bigint NOT NULL,
    currency            text NOT NULL,
    created             bigint NOT NULL,            -- provider's clock, unix s
    payment_attempt_id  text,                       -- metadata, as given
    order_id            text,
    seen_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_intents_attempt ON audit_intents (payment_attempt_id)
    WHERE status = 'succeeded';
CREATE INDEX audit_intents_order ON audit_intents (order_id)
    WHERE status = 'succeeded';

CREATE TABLE audit_refunds (
    id                  text PRIMARY KEY,           -- re_...
    payment_intent      text NOT NULL,
    status              text NOT NULL,
    amount              bigint NOT NULL,
    currency            text NOT NULL,
    created             bigint NOT NULL,
    refund_id           text,                       -- metadata, as given
    seen_at             timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_refunds_intent ON audit_refunds (payment_intent)
    WHERE status = 'succeeded';

-- What did not match, once per kind and provider object (an intent, a
-- refund, or for booked_not_charged the object the ledger names): a window
-- audited again, or by two auditors, records nothing twice.
CREATE TABLE audit_findings (
    id                  bigserial PRIMARY KEY,
    kind                text NOT NULL CHECK (kind IN
                        ('charged_twice', 'charged_unbooked', 'booked_not_charged',
                         'amount_mismatch', 'currency_mismatch', 'unknown_intent',
                         'refund_unbooked', 'refunded_over_charge')),
    object_id           text NOT NULL,
    payment_attempt_id  text,
    order_id            text,
    refund_id           text,
    other_object_id     text,       -- charged_twice: the charge already booked
    provider_amount     bigint,
    provider_currency   text,
    ledger_amount       bigint,
    ledger_currency     text,
    detail              text NOT NULL,
    -- The window of the audit that found it first.
    window_start        timestamptz NOT NULL,
    window_end          timestamptz NOT NULL,
    found_at            timestamptz NOT NULL DEFAULT now(),
    UNIQUE (kind, object_id)
);

-- Objects that cannot be judged yet: a succeeded intent whose attempt the
-- reconciler has still to settle, an intent or refund still processing.
-- Each cycle looks at them again on the provider's word.
CREATE TABLE audit_pending (
    object_id           text PRIMARY KEY,
    object_kind         text NOT NULL CHECK (object_kind IN ('intent', 'refund')),
    first_seen_at       timestamptz NOT NULL DEFAULT now(),
    checked_at          timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX audit_pending_checked ON audit_pending (checked_at);

-- One verdict per audited window. Scheduled windows follow the watermark
-- and tile time without gap or overlap: UNIQUE on their start, so two
-- auditors that both finished one record it once. On-demand audits
-- (chargectl audit run) are recorded beside them.
CREATE TABLE audit_windows (
    id                  bigserial PRIMARY KEY,
    window_start        timestamptz NOT NULL,
    window_end          timestamptz NOT NULL,
    scheduled           boolean NOT NULL,
    auditor             text NOT NULL,
    intents_seen        bigint NOT NULL,
    refunds_seen        bigint NOT NULL,
    ledger_rows_seen    bigint NOT NULL,
    pending             bigint NOT NULL,
    findings            jsonb NOT NULL,             -- {"kind": count} observed
    started_at          timestamptz NOT NULL,
    finished_at         timestamptz NOT NULL DEFAULT now(),
    CHECK (window_start < window_end)
);
CREATE UNIQUE INDEX audit_windows_scheduled_start ON audit_windows (window_start)
    WHERE scheduled;
CREATE INDEX audit_windows_finished ON audit_windows (finished_at);

-- A window's ledger rows are those booked in it. BRIN: tiny, and nearly
-- free for the charge's insert, on a table appended in time order.
CREATE INDEX ledger_entries_created_brin ON ledger_entries USING brin (created_at);
