-- 0022 (issue 38, adversary 38 finding 6): a row of provider_budget_members
-- holds only what a member could have written. Every refresh already bounds
-- what it trusts of another member's row (common/budget/budget_lease.c:
-- a held value counts as 0..the limit, a demand as 0..10^9 mrps, a lease as
-- at most BUDGET_LEASE_MAX_MS, 2 s, from now; docs/architecture.md "What a
-- dead member costs"); these checks refuse the rest at the door:
--   no NULL element (a refresh could not read the row and would fail);
--   held values -1 ("no limit") or 0..10^9 mrps (the largest limit);
--   demands 0..10^9 mrps (BUDGET_DEMAND_MAX_MRPS).
-- The lease is not checked here (a CHECK cannot read the clock, and one
-- against refreshed_at is as easily written round): every refresh lowers
-- another member's expires_at to at most 2 s from now.
-- Members' rows live a second: those that would fail the checks are not a
-- member's, and are dropped before the checks are added.
DELETE FROM provider_budget_members
 WHERE array_position(held_mrps, NULL) IS NOT NULL
    OR array_position(demand_mrps, NULL) IS NOT NULL
    OR NOT (-1 <= ALL (held_mrps) AND 1000000000 >= ALL (held_mrps))
    OR NOT (0 <= ALL (demand_mrps) AND 1000000000 >= ALL (demand_mrps));
ALTER TABLE provider_budget_members
    ADD CONSTRAINT provider_budget_members_held CHECK (
        array_position(held_mrps, NULL) IS NULL
        AND -1 <= ALL (held_mrps) AND 1000000000 >= ALL (held_mrps)),
    ADD CONSTRAINT provider_budget_members_demand CHECK (
        array_position(demand_mrps, NULL) IS NULL
        AND 0 <= ALL (demand_mrps) AND 1000000000 >= ALL (demand_mrps));
