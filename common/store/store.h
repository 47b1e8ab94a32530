/* store: what every store (attempt_store, outbox_store, webhook_store)
 * shares: the statement deadline.
 *
 * Every fallible store call answers in the one error contract
 * (charged_error.h): it returns an enum charged_rc and fills a struct
 * charged_error the caller passes, whose code is the SQLSTATE of the
 * statement that failed. A call that fails has changed nothing the caller
 * must undo. */
#ifndef CHARGED_STORE_H
#define CHARGED_STORE_H

#include <stdint.h>

#include "charged_error.h"

/* How long one statement of a store may take. The server ends a statement
 * of ours after store_timeout_ms() (its statement_timeout, set on every
 * session); the client gives it up STORE_DEADLINE_GRACE_MS later if the
 * server has not answered even that (a frozen host, a partition that keeps
 * TCP open): the call returns CHARGED_RETRY with "database did not answer
 * within N ms", its session is closed (the call's later statements fail at
 * once) and the next call opens a new one. So a database that hangs costs
 * a caller one deadline per call, never its loop. A statement given up may
 * still run once the server comes back: like one whose connection broke,
 * it is one the caller repeats, and every store call is safe to repeat.
 *
 * Process-wide: set it before the first store call (daemon_main does, from
 * DATABASE_TIMEOUT_MS); a session already open keeps the statement_timeout
 * it was opened with. */
#define STORE_TIMEOUT_DEFAULT_MS 10000
#define STORE_DEADLINE_GRACE_MS  1000
void store_set_timeout_ms(long long ms);
long long store_timeout_ms(void);

/* A record claimed by a worker (its id and the epoch of the claim) that
 * waits before its provider call, and why ("provider_budget",
 * "provider_throttled": the record's waiting_reason, migration 0021) since
 * when (epoch ms); reason NULL: the wait ended (its call starts). kind is
 * the engine's (which operation's record), for the router alone. A
 * store's <x>_store_wait writes a batch of them in one UPDATE, fenced on
 * each claim (lease_sql.h's SQL_LEASE_WAITING). */
struct store_wait {
    const char *id;
    int kind;
    int64_t lease_epoch;
    const char *reason;
    int64_t since_ms;
};

#endif
