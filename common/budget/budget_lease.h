/* budget_lease: a process's lease of its share of the fleet's provider
 * budget, in PostgreSQL (tables of migrations/0020_provider_budget.sql),
 * and the budget's settings as chargectl reads and sets them.
 *
 * A refresh is one short transaction, never across a provider call: it
 * locks the account's settings row (FOR UPDATE; a session lock_timeout of
 * BUDGET_LOCK_TIMEOUT: the only waiter is another member's refresh; the
 * transaction itself ended by the server after BUDGET_IDLE_IN_TX idle),
 * reads the live members (at most BUDGET_MEMBERS_MAX - 1 others, the most
 * recently written first; each one's share bounded to what a member can
 * hold: budget_share_bound; a row it cannot read, or one beyond those,
 * counted as holding the whole limit), runs the allocation over their
 * demands and this member's new one in the members' id order rotated by
 * the database's clock, as every member does (budget_alloc_member_target,
 * budget_alloc_rotation), takes what budget_alloc_take allows (the
 * two-phase rule: lower at once, raise only into room the others gave
 * back), writes this member's demand, share and lease (expires_at = now() +
 * lease_ms), bounds every other lease to BUDGET_LEASE_MAX_MS from now and
 * deletes the members whose lease ended. Refreshes are serialized by the
 * lock, so the live members' shares never sum above a limit.
 *
 * Every call answers in the one error contract (charged_error.h), its
 * code the SQLSTATE: CHARGED_WAIT when another refresh held the lock past
 * BUDGET_LOCK_TIMEOUT (keep the share held until its lease ends, try at
 * the next tick), CHARGED_BAD_ITEM for a value refused, CHARGED_RETRY for
 * an outage. A call that fails wrote nothing. One thread uses a lease. */
#ifndef CHARGED_BUDGET_LEASE_H
#define CHARGED_BUDGET_LEASE_H

#include <jansson.h>

#include "budget_alloc.h"
#include "charged_error.h"

#define BUDGET_ACCOUNT_DEFAULT "default"
/* A member's lease, and how often it is meant to be refreshed. */
#define BUDGET_LEASE_MS   1000
#define BUDGET_REFRESH_MS 250
/* The longest lease a member may take: a member's row whose expires_at is
 * further than this from now is bounded to it by the next refresh. */
#define BUDGET_LEASE_MAX_MS 2000
/* No member's stall may hold the settings row lock hostage: every
 * transaction that locks it (a refresh, a change) is ended by the server
 * once its session sits idle in it for BUDGET_IDLE_IN_TX (a member paused
 * or cut off mid-refresh), and a statement of it after
 * BUDGET_STATEMENT_TIMEOUT; a waiter's lock_timeout outlasts the first, so
 * the others' refreshes wait the stall out and succeed, well inside their
 * lease (docs/architecture.md, "What a dead member costs"). */
#define BUDGET_IDLE_IN_TX        "300ms"
#define BUDGET_STATEMENT_TIMEOUT "750ms"
#define BUDGET_LOCK_TIMEOUT      "600ms"
/* The longest account, role or actor name. */
#define BUDGET_NAME_MAX 64

typedef struct budget_lease budget_lease_t;

/* A member of account's budget for role (e.g. "worker"), known by a new
 * random member id, with its pid and host; lease_ms in
 * 1..BUDGET_LEASE_MAX_MS (BUDGET_LEASE_MS).
 * Does not connect. NULL and err on a bad URL, a name out of
 * 1..BUDGET_NAME_MAX bytes, or out of memory. chargectl opens one too, to
 * read and set the settings; it never refreshes. */
budget_lease_t *budget_lease_new(const char *database_url, const char *account,
                                 const char *role, long long lease_ms,
                                 struct charged_error *err);
void budget_lease_free(budget_lease_t *l);
/* The member id (a UUID's text). */
const char *budget_lease_member(const budget_lease_t *l);

/* What a refresh decided. */
struct budget_refresh {
    struct budget_settings settings;
    long long version;          /* the settings' version */
    struct budget_share target; /* this member's target */
    struct budget_share held;   /* what it holds now (<= target) */
    long long lease_ms;         /* held until the caller's clock read just
                                   before the call, plus this */
    int members;                /* live members read, this one included */
    /* Rows no member wrote, as this refresh found and tolerated them (0 in
     * a fleet of members only): other members' rows it could not read (a
     * held or demand array that is not 8 or 30 numbers: counted as holding
     * each whole limit and asking nothing), live rows beyond the
     * BUDGET_MEMBERS_MAX - 1 it reads (the rest counted as holding each
     * whole limit: this member takes nothing until they end), and leases
     * it bounded to BUDGET_LEASE_MAX_MS from now. Each ends within
     * BUDGET_LEASE_MAX_MS, as the bounded lease of its row does. */
    int rows_unreadable, rows_unread, leases_bounded;
    long long others_end_in_ms; /* the earliest other live member's lease
                                   end, ms after the refresh's start; -1:
                                   none. A member that died holds its share
                                   until then: refreshing just after it
                                   takes the share a lease after the death,
                                   not a refresh later. */
};

/* One refresh with this member's demand (checked: a bad one is
 * CHARGED_BAD_ITEM). On CHARGED_OK *out says what it holds; the caller
 * hands it to its gate (budget_gate_set_share) with the lease counted from
 * its clock read before the call. An account without a settings row gets
 * the default one (no limit). */
enum charged_rc budget_lease_refresh(budget_lease_t *l,
                                     const struct budget_demand *demand,
                                     struct budget_refresh *out,
                                     struct charged_error *err);

/* A clean exit: this member's row is deleted, its share free for the next
 * refresh of another. */
enum charged_rc budget_lease_leave(budget_lease_t *l, struct charged_error *err);

/* The settings row as JSON ({"account", "global_rps", "classes":
 * {"create": N, ...}, "audit_floor_rps", "version", "updated_by",
 * "updated_at"}) and the live members ({"member_id", "role", "pid",
 * "host", "held_mrps": [8], "demand_mrps": [30], "expires_in_ms"}), in
 * *settings and *members (the caller owns both). CHARGED_NOT_FOUND when
 * the account has no settings row. */
enum charged_rc budget_lease_show(budget_lease_t *l, json_t **settings,
                                  json_t **members, struct charged_error *err);

/* A change of the settings: each field set in `given` (1) takes its value,
 * the rest keep theirs. */
struct budget_change {
    struct budget_settings to;
    int global, cls[BUDGET_CLASS_COUNT], audit_floor;
};

/* Applies the change in one transaction (the row locked, version + 1,
 * updated_by = actor; a row of provider_budget_changes with actor, before
 * and after) and returns the new row as *after (as budget_lease_show's).
 * CHARGED_BAD_ITEM with why when the result is refused
 * (budget_settings_check) or the actor is not 1..BUDGET_NAME_MAX bytes;
 * CHARGED_NOT_FOUND when the account has no row (nothing written). */
enum charged_rc budget_lease_set(budget_lease_t *l, const struct budget_change *change,
                                 const char *actor, json_t **after,
                                 struct charged_error *err);

#endif
