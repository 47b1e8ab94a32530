/* daemon: what every long-running role of charged shares.
 *
 * A role describes itself (struct daemon_role_desc) and hands the rest to
 * daemon_role_main: --help and the arguments, the environment, logging, the
 * process's name, signals, the admin listener, the loop, the drain and the
 * exit status. Its step does what is due and says when it is next due; the
 * loop sleeps until then or until a signal or daemon_wake() comes first, and
 * after every step it publishes the role's readiness.
 *
 * Signals are loop events: the handler only counts SIGTERM/SIGINT in a
 * volatile sig_atomic_t and wakes the loop, which asks daemon_stopping().
 * The shutdown is bounded whatever the loop is blocked in: a watchdog thread
 * ends the process with status 1 SHUTDOWN_TIMEOUT_MS after the first signal,
 * and at once on the second. Uncommitted work comes back to whoever takes
 * over: nothing is committed early, so nothing is lost.
 *
 * The admin listener serves /healthz, /readyz and /metrics on ADMIN_ADDR
 * (common/http/admin_http.h) from before the role is built until after it
 * finished. Live (/healthz 200): the loop turned within HEALTH_STALL_MS (a
 * loop asleep until its step is due counts as turning), or the process is
 * draining after a signal (the watchdog bounds that, and a liveness kill
 * would cut the drain short). Ready (/readyz 200): the role last said so,
 * the loop is live, and no signal came: a draining process is live but not
 * ready.
 */
#ifndef CHARGED_DAEMON_H
#define CHARGED_DAEMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "budget_member.h"
#include "config.h"
#include "provider_client.h"

/* A step's answer when it has more to do at once: any time not after now
 * means due now. */
#define DAEMON_NOW 0

/* A role, as daemon_role_main runs it. Every function but start() runs on
 * the loop's thread. */
struct daemon_role_desc {
    const char *name;     /* "relay": logs say charged-relay */
    unsigned config_role; /* enum config_role: the settings it reads */
    void (*usage)(FILE *out);
    /* Builds the role from cfg, taking ownership of cfg (also on failure),
     * and sets *state (finish() frees it). Returns CHARGED_OK, or with err
     * CHARGED_GIVE_UP (a bad configuration: exit 2) or CHARGED_RETRY (a
     * runtime failure: exit 1). NULL: the daemon builds it from the two
     * below. */
    enum charged_rc (*start)(config_t *cfg, const char *id, void **state,
                             struct charged_error *err);
    /* The build most roles share (start NULL): state_size bytes, zeroed;
     * setup keeps cfg in the state first thing (finish() frees it) and
     * builds the rest, returning as start() does; a state setup left
     * half-built is freed by finish(state, 0). Then "<name> started" is
     * logged with the id. */
    size_t state_size;
    enum charged_rc (*setup)(void *state, config_t *cfg, const char *id,
                             struct charged_error *err);
    /* One turn: does what is due at `now` (clock_now_ms) and returns when
     * it is next due (a clock_now_ms, or DAEMON_NOW). A step that waits
     * long by design calls daemon_heartbeat() as it goes. */
    int64_t (*step)(void *state, int64_t now);
    /* Why the role is not ready (a short phrase such as "database
     * unreachable"), or NULL when it is; asked after every step. */
    const char *(*not_ready)(void *state);
    /* Finishes what is in flight, taking nothing new, until nothing is left
     * or `deadline` (clock_now_ms) passes; gives up the rest. Returns how
     * much was left unfinished. */
    size_t (*drain)(void *state, int64_t deadline);
    /* Commits, leaves the group, releases clients, frees the state;
     * flush_ms bounds waiting for outstanding acknowledgements. */
    void (*finish)(void *state, int flush_ms);
};

/* The main of a role: returns the process's exit status (0 when everything
 * taken was finished, 1 otherwise or on a runtime failure, 2 on bad usage or
 * configuration). The admin listener starts before desc->start(), so that a
 * bad or taken ADMIN_ADDR stops the program before any client is built:
 * exit 2 when the address is not host:port or does not resolve, 1 when it
 * cannot be bound. After a stop signal the drain has SHUTDOWN_TIMEOUT_MS
 * less a quarter (at most 2 s) kept for finish(). */
int daemon_role_main(int argc, char **argv, const struct daemon_role_desc *desc);

/* Makes the loop step now, due or not: something the step answers came
 * (an event on a client's queue, say). Safe from any thread and from a
 * signal handler. */
void daemon_wake(void);

/* A role's database as its loop sees it. After a failed step the role
 * backs off, doubling from 250 ms to 5 s while the failures last (each is
 * logged and counted); the back-off ends with the next success. */
struct daemon_db {
    int64_t backoff_ms; /* 0 after a success */
    int64_t retry_at;   /* clock_now_ms: no step before */
    int reached;        /* the last step reached it */
    int64_t last_ok_ms; /* clock_now_ms of the last success */
};
/* May the next database step run now (its back-off is over)? */
int daemon_db_due(const struct daemon_db *db);
/* A step succeeded: the back-off ends. */
void daemon_db_ok(struct daemon_db *db);
/* A step reached the database, but the unit of work it belongs to is not
 * done: the database counts as reached, the back-off stays until
 * daemon_db_ok(). */
void daemon_db_reached(struct daemon_db *db);
/* A step failed: logs the step and why, counts it, backs off. Returns when
 * to try again (clock_now_ms). */
int64_t daemon_db_failed(struct daemon_db *db, const char *stage, const char *err);
/* Why the role cannot be ready for its database's sake ("database
 * unreachable" after a failure, "database not reached yet" before the
 * first step), or NULL once a step reached it. */
const char *daemon_db_not_ready(const struct daemon_db *db);

/* The loop is alive: the loop calls it before every step; a role calls it
 * inside a step that waits long by design (one provider call, a batch's
 * acknowledgements), so that /healthz measures a stuck loop, not a slow
 * answer. Safe from any thread. */
void daemon_heartbeat(void);

/* A role's member of the fleet's provider budget, its provider client's
 * gate (docs/architecture.md, "The provider budget"). */
struct daemon_budget {
    budget_member_t *member;
    struct budget_caller caller;
};
/* Joins the budget for role (budget_member_join: a first refresh now, then
 * a thread) and gates every request of pc on it for prio: each waits at
 * most max_wait_ms for its share (then answers NOT_EXECUTED, nothing
 * sent), keeping the loop alive (daemon_heartbeat) while it waits, and
 * not at all once a stop signal came. CHARGED_OK, or as
 * budget_member_join. */
enum charged_rc daemon_budget_join(struct daemon_budget *b, const config_t *cfg,
                                   const char *role, enum budget_priority prio,
                                   long long max_wait_ms, provider_client_t *pc,
                                   struct charged_error *err);
/* A clean exit: leaves the budget (its share free at once) and frees. */
void daemon_budget_leave(struct daemon_budget *b);

/* Installs the handlers (SIGTERM, SIGINT counted and waking the loop;
 * SIGPIPE ignored). Returns CHARGED_OK, or CHARGED_RETRY with err when the
 * loop's wake-up pipe cannot be made. */
enum charged_rc daemon_init(struct charged_error *err);

/* How many stop signals have arrived: 0 runs on, 1 drains, 2 exits now. */
int daemon_stopping(void);

/* The role cannot go on (out of memory, say): stop as on SIGTERM, bounded
 * the same way, and exit 1 whatever the drain achieves. Logs why. */
void daemon_fail(const char *why);

#endif
