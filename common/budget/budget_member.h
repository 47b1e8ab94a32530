/* budget_member: one process's membership of the fleet's provider budget
 * at run time: its lease (budget_lease) refreshed every BUDGET_REFRESH_MS,
 * its gate (budget_gate) spending the share the refresh gave, and the
 * demand it reports, measured from its own asks. docs/architecture.md,
 * "The provider budget", says how the roles use it.
 *
 * Refreshes run on a thread of the member's own (budget_member_start) or,
 * for a one-shot caller, inside budget_member_wait. Either way the
 * PostgreSQL call runs with no lock held: the demand is read under the
 * member's mutex, the refresh runs without it, and its answer is handed to
 * the gate under it again. Every other function may be called from any
 * thread; the gate is guarded by the mutex.
 *
 * Demand: the requests asked for per (priority, class) over the last
 * second (each request counted once, at its first ask), plus the requests
 * waiting now. The share the refresh gave goes to the gate, its lease
 * counted from the clock read before the refresh. A refresh that failed
 * keeps the share until that lease ends; then the gate lets nothing
 * through until a refresh succeeds again.
 *
 * A member that is off (PROVIDER_BUDGET=off) refreshes nothing and lets
 * every ask through at once. With the default settings (no limit) an ask
 * is a mutex and a few additions: the gate's buckets hold no limit. */
#ifndef CHARGED_BUDGET_MEMBER_H
#define CHARGED_BUDGET_MEMBER_H

#include "budget_ask.h"
#include "budget_gate.h"
#include "budget_lease.h"
#include "config.h"

typedef struct budget_member budget_member_t;

/* An ask of class c for priority p, not asked yet. */
void budget_member_ask_init(struct budget_ask *a, enum budget_class c,
                            enum budget_priority p);

/* A member of account's budget for role (budget_lease_new's names), or,
 * with enabled 0, one that is off. Does not connect. NULL and err on a bad
 * name or URL or out of memory. */
budget_member_t *budget_member_new(const char *database_url, const char *account,
                                   const char *role, int enabled,
                                   struct charged_error *err);
/* A member from a process's settings (PROVIDER_BUDGET,
 * PROVIDER_BUDGET_ACCOUNT, DATABASE_URL) for role. A role that runs
 * (thread 1) refreshes once now, so that its first request finds a share
 * (a failure is logged: its thread tries again), then every
 * BUDGET_REFRESH_MS on its thread; a one-shot caller (thread 0) refreshes
 * while it waits (budget_member_wait). CHARGED_OK and *out, or
 * CHARGED_GIVE_UP (a bad setting) or CHARGED_RETRY and err. */
enum charged_rc budget_member_join(const config_t *cfg, const char *role, int thread,
                                   budget_member_t **out, struct charged_error *err);
/* Stops the thread if one runs and frees; leaves nothing in the database
 * (budget_member_leave does). NULL is a no-op. */
void budget_member_free(budget_member_t *m);
int budget_member_enabled(const budget_member_t *m);
/* How many refreshes read settings that raised a limit over the settings
 * the refresh before read (budget_settings_raised): the global's, or that
 * of a class this member has asked for. It grows when an operator raises
 * such a limit (`chargectl provider limits set`), not when a set changes
 * nothing, lowers, or raises another class. 0 before any refresh, or off. */
long long budget_member_settings_raises(budget_member_t *m);

/* One refresh now, with the demand as measured (a role's first, before
 * its first ask): CHARGED_OK, or the lease's error (the share kept until
 * its lease ends). A member that is off: CHARGED_OK. */
enum charged_rc budget_member_refresh(budget_member_t *m, struct charged_error *err);
/* Refreshes every BUDGET_REFRESH_MS on a thread of its own until
 * budget_member_leave or _free. CHARGED_RETRY and err when it cannot
 * start. A member that is off starts none. */
enum charged_rc budget_member_start(budget_member_t *m, struct charged_error *err);

/* May the request go now (now_ms: clock_now_ms)? 0: yes (its tokens are
 * taken, the wait it had is observed in
 * charged_provider_budget_wait_seconds); else how long to wait, in ms,
 * before asking again with the same ask. */
long long budget_member_ask(budget_member_t *m, struct budget_ask *a, long long now_ms);
/* n more requests of class c for priority p reached the provider than were
 * asked for (the HTTP client re-sent them, provider_result.resent): the
 * gate takes their tokens after the fact (budget_gate_charge), so the next
 * asks wait them out, and the demand counts them. A member that is off: a
 * no-op. */
void budget_member_charge(budget_member_t *m, enum budget_class c,
                          enum budget_priority p, int n);
/* The request is given up while it waits: it no longer counts as a
 * waiter. No-op for an ask that does not wait. */
void budget_member_forget(budget_member_t *m, struct budget_ask *a);
/* Asks and sleeps until the request may go (0), or -1 when max_wait_ms
 * passed or stop() (NULL: never) says to stop: the request is forgotten.
 * Without a thread of refreshes, refreshes when due while it waits (a
 * one-shot caller). */
int budget_member_wait(budget_member_t *m, enum budget_class c, enum budget_priority p,
                       long long max_wait_ms, int (*stop)(void));

/* A caller of the provider through a client's gate (provider_client_set_gate):
 * its member, what its requests are for, and how long one may wait. */
struct budget_caller {
    budget_member_t *member;
    enum budget_priority prio;
    long long max_wait_ms; /* a one-shot's bound; a role's: as long as it runs */
    int (*stop)(void);     /* NULL: never */
};
/* A provider_gate_fn over a struct budget_caller: budget_member_wait, and
 * why a request was not sent when it did not get its share in time. */
int budget_member_gate(void *caller, enum budget_class cls, char *why, size_t why_size);
/* A provider_charge_fn over a struct budget_caller: budget_member_charge
 * at the caller's priority. */
void budget_member_gate_charge(void *caller, enum budget_class cls, int n);

/* A clean exit: stops the thread, deletes this member's row (its share
 * free for the others' next refresh). Failures are logged, not returned:
 * the lease ends on its own. */
void budget_member_leave(budget_member_t *m);

#endif
