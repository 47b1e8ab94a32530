-- 0020 (issue 38): the fleet's provider budget (common/budget/budget_lease.c,
-- docs/architecture.md "The provider budget"). One settings row per provider
-- account; each process that calls the provider leases a share of it as a
-- row of provider_budget_members, renewed every ~250 ms in one short
-- transaction that locks the settings row.
--
-- Limits are whole requests per second; 0 is no limit. The default row has
-- no limit at all: a fleet behaves as it did before the budget until an
-- operator sets one (chargectl provider limits set).
CREATE TABLE provider_budget (
    account             text PRIMARY KEY CHECK (octet_length(account) BETWEEN 1 AND 64),
    global_rps          bigint NOT NULL DEFAULT 0 CHECK (global_rps BETWEEN 0 AND 1000000),
    create_rps          bigint NOT NULL DEFAULT 0 CHECK (create_rps BETWEEN 0 AND 1000000),
    capture_rps         bigint NOT NULL DEFAULT 0 CHECK (capture_rps BETWEEN 0 AND 1000000),
    refund_rps          bigint NOT NULL DEFAULT 0 CHECK (refund_rps BETWEEN 0 AND 1000000),
    retrieve_rps        bigint NOT NULL DEFAULT 0 CHECK (retrieve_rps BETWEEN 0 AND 1000000),
    search_rps          bigint NOT NULL DEFAULT 0 CHECK (search_rps BETWEEN 0 AND 1000000),
    list_rps            bigint NOT NULL DEFAULT 0 CHECK (list_rps BETWEEN 0 AND 1000000),
    -- What the auditor's walks get first when they have demand and a global
    -- limit is set, so that they never starve.
    audit_floor_rps     bigint NOT NULL DEFAULT 1 CHECK (audit_floor_rps BETWEEN 0 AND 1000000),
    version             bigint NOT NULL DEFAULT 1,  -- bumped by every change
    updated_by          text NOT NULL DEFAULT 'migration 0020',
    updated_at          timestamptz NOT NULL DEFAULT now(),
    CHECK (global_rps = 0 OR audit_floor_rps <= global_rps)
);
INSERT INTO provider_budget (account) VALUES ('default');

-- The live members and their shares. Shares and demands are in thousandths
-- of a request per second (mrps), as arrays in a fixed order:
--   demand_mrps: 30 = 5 priorities (capture, refund, charge, lookup, audit)
--                x 6 classes (create, capture, refund, retrieve, search, list),
--                priority-major;
--   held_mrps:   8 = global, the 6 classes, then the audit floor; -1 is no
--                limit (the settings had none for it).
-- A row whose expires_at has passed is a dead member: ignored by every
-- refresh, and deleted by the next.
CREATE TABLE provider_budget_members (
    account             text NOT NULL REFERENCES provider_budget (account),
    member_id           uuid NOT NULL,
    role                text NOT NULL,
    pid                 integer NOT NULL,
    host                text NOT NULL,
    demand_mrps         bigint[] NOT NULL CHECK (cardinality(demand_mrps) = 30),
    held_mrps           bigint[] NOT NULL CHECK (cardinality(held_mrps) = 8),
    settings_version    bigint NOT NULL,            -- the settings it was held under
    joined_at           timestamptz NOT NULL DEFAULT now(),
    refreshed_at        timestamptz NOT NULL DEFAULT now(),
    expires_at          timestamptz NOT NULL,       -- the lease
    PRIMARY KEY (account, member_id)
);

-- Every change of the settings, with who made it, appended only.
CREATE TABLE provider_budget_changes (
    id                  bigserial PRIMARY KEY,
    account             text NOT NULL,
    actor               text NOT NULL,
    before              jsonb NOT NULL,
    after               jsonb NOT NULL,
    at                  timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX provider_budget_changes_account ON provider_budget_changes (account, id);
