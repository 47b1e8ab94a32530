/* console_limits: the console's page of the fleet's provider budget (issue
 * 38, "Set at run time"): its settings and each live member's share, as
 * `chargectl provider limits show --json` prints them, and a change of the
 * settings as `... set` makes it (common/budget/budget_lease), recorded
 * with the signed-in console user as its actor: in provider_budget_changes
 * (before and after) and in the console's action log. The console checks
 * the session, the CSRF token and the operator role before a change
 * (console.c), as for its other writes.
 *
 * Each call opens the budget's connection and closes it: the page is read
 * and changed rarely, and the console is no member of the budget (it never
 * refreshes a lease). Each returns an HTTP status and sets *body (the
 * caller owns it; {"error": "..."} for a 4xx or 5xx). */
#ifndef CHARGED_CONSOLE_LIMITS_H
#define CHARGED_CONSOLE_LIMITS_H

#include <stddef.h>

#include <jansson.h>

#include "budget_lease.h"
#include "charged_error.h"
#include "console_store.h"

/* The budget of account (the fleet's PROVIDER_BUDGET_ACCOUNT): {"account",
 * "global_rps", "classes": {"create": N, ...}, "audit_floor_rps",
 * "version", "updated_by", "updated_at", "members": [{"member_id", "role",
 * "pid", "host", "held_mrps", "demand_mrps", "expires_in_ms"}]}. */
unsigned console_limits_show(const char *database_url, const char *account,
                             json_t **body);

/* A change: {"global": N, "classes": {"create": N, ...}, "audit_floor": N},
 * each member optional but one at least, each N a whole number of
 * requests/s in 0..BUDGET_RPS_MAX (0: no limit); an unknown member or
 * class is refused (400). 200 with the new settings; 422 when the result is
 * refused (a floor above the global limit, or an actor over
 * BUDGET_NAME_MAX bytes: a token's name may be longer); 503 when the
 * database is unreachable. Recorded as action "provider_limits" with
 * actor. */
unsigned console_limits_set(const char *database_url, const char *account,
                            console_store_t *cs, const char *actor, const char *request,
                            size_t len, json_t **body);

/* The request body of console_limits_set as a change (pure). */
enum charged_rc console_limits_parse(const char *request, size_t len,
                                     struct budget_change *out,
                                     struct charged_error *err);

#endif
