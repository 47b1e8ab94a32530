/* store_conn: the one PostgreSQL session of a store, internal to the store
 * library (the stores' own helper; no role includes it).
 *
 * Opened lazily, with the settings every transaction of a store has
 * (db_connect's, a statement_timeout of store_timeout_ms() and the store's
 * lock_timeout, so that no statement holds a daemon's loop for long; set
 * per transaction, never on the session: db.h), and opened again on
 * the next call after it broke: a daemon started while the database is down
 * keeps running, and comes back with it. Every statement runs through
 * store_conn_exec, under the deadline of store.h: a server that stops
 * answering costs one deadline, and the session. */
#ifndef CHARGED_STORE_CONN_H
#define CHARGED_STORE_CONN_H

#include <libpq-fe.h>

#include "store.h"

typedef struct store_conn store_conn_t;

/* Copies database_url and lock_timeout (a PostgreSQL duration: "100ms").
 * Does not connect: NULL and err only when database_url cannot be parsed
 * (the message never quotes it: it may hold a password) or on out of
 * memory. */
store_conn_t *store_conn_new(const char *database_url, const char *lock_timeout,
                             struct charged_error *err);
void store_conn_free(store_conn_t *c);

/* Opens the session when there is none or it broke; a call of a store
 * begins here. *fresh (when not NULL) says whether it is a new one: session
 * state, such as an advisory lock, did not survive. CHARGED_OK, or
 * CHARGED_RETRY and err when the database cannot be reached. */
enum charged_rc store_conn_open(store_conn_t *c, int *fresh, struct charged_error *err);

/* Runs one statement on the session store_conn_open opened, giving it up
 * store_timeout_ms() + STORE_DEADLINE_GRACE_MS after it began. CHARGED_OK and,
 * when res is not NULL, the result in *res (the caller PQclear()s it);
 * otherwise what store_conn_failed() makes of err, and *res NULL. After a
 * statement given up the session is closed: every later statement of the
 * call fails at once (CHARGED_RETRY; a transaction cannot go on in a new
 * session) until the next store_conn_open. */
enum charged_rc store_conn_exec(store_conn_t *c, const char *sql, int nparams,
                                const char *const *params, PGresult **res,
                                struct charged_error *err);

/* The server process libpq was told it talks to when the session opened
 * (PQbackendPID), 0 without a session. A pooler or proxy between us and
 * PostgreSQL answers with a number of its own, which pg_backend_pid() in
 * a statement then contradicts: how a store that needs a session of its
 * own (a session advisory lock) tells that it has none. */
int store_conn_pid(const store_conn_t *c);

/* Whether the session broke under the last statement (the server closed
 * it while idle: a restart, a pooler): that statement may be repeated once
 * on a new one. Not after a statement given up at its deadline: a server
 * that does not answer would only cost a second one. */
int store_conn_broken(const store_conn_t *c);

/* What a caller does about a statement that failed with err: CHARGED_WAIT
 * when a lock another session held outlasted lock_timeout, CHARGED_BAD_ITEM when
 * a value was refused (a data exception, an integrity constraint), and
 * CHARGED_RETRY for anything else: an outage, and a bug of ours too, which
 * is retried whole, loudly, rather than isolated item by item. */
enum charged_rc store_conn_failed(const struct charged_error *err);

/* A leader's lock (the relay's, the auditor's): a session advisory lock,
 * taken only when pg_backend_pid() is the server libpq connected to ($1,
 * store_conn_pid); NULL otherwise. Behind a pooler in transaction mode a
 * session lock stays on a server session that other clients use next: a
 * standby landing there would lead beside the leader, and a dead leader's
 * lock would never be released. */
#define SQL_LEAD(key)                                                                  \
    "SELECT CASE WHEN pg_backend_pid() = $1::int THEN pg_try_advisory_lock(" key ") "  \
    "END"
/* The error of a lead refused so (SQL_LEAD answered NULL). */
#define LEAD_POOLED(role)                                                              \
    "the " role " leads by a session advisory lock and needs a session of its own: "   \
    "its DATABASE_URL reaches PostgreSQL through a pooler or proxy; connect it "       \
    "direct to the primary (docs/operations.md, Production settings)"

#endif
