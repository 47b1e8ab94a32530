/* db: PostgreSQL connection and small helpers over libpq.
 *
 * Every statement is sent with parameters (PQexecParams, PQsendQueryParams);
 * values never enter SQL text.
 * Failures are reported in a struct charged_error (store.h): the stores'
 * vocabulary, which the stores pass on to their callers as it is. */
#ifndef CHARGED_DB_H
#define CHARGED_DB_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "store.h"

/* How long a session of ours may sit idle inside a transaction before the
 * server ends it (and releases its locks). Nothing of ours thinks between
 * two statements of a transaction. */
#define DB_IDLE_IN_TX "5s"

/* Opens a connection. Returns NULL and one line (without the password) in
 * err on failure. Close with PQfinish.
 *
 * Nothing is set on the session: charged works behind a pooler in
 * transaction mode (PgBouncer), where a server session serves another
 * client after each transaction. Instead every statement that starts a
 * transaction (a BEGIN, or a statement in autocommit) goes in one pipeline
 * with set_config(..., true) of TimeZone UTC, an
 * idle_in_transaction_session_timeout of DB_IDLE_IN_TX and the timeouts of
 * db_set_timeouts: the same round trip, the same transaction, and gone
 * when it ends. A statement inside a transaction is sent alone. So a
 * statement that may not run inside a transaction block (CREATE DATABASE,
 * VACUUM) is not for db_exec: charged runs none. */
PGconn *db_connect(const char *url, struct charged_error *err);

/* The statement_timeout and lock_timeout (PostgreSQL durations: "100ms")
 * of every later transaction of conn; NULL leaves the server's value (the
 * role's or the database's default). */
void db_set_timeouts(PGconn *conn, const char *statement_timeout,
                     const char *lock_timeout);
/* Until cleared (NULL), the transactions this thread starts, on any
 * connection, wait for a row lock at most lock_timeout instead of their
 * session's: the worker's tries of one item alone after its batch met a
 * held row (its holder has held it a whole lock_timeout already, so each
 * item alone would otherwise cost another, and the loop waits for them). */
void db_lock_timeout_override(const char *lock_timeout);

/* Runs a parameterized statement (text parameters). Returns the result when
 * its status is COMMAND_OK or TUPLES_OK; otherwise clears it, writes one line
 * and the SQLSTATE to err and returns NULL (err is not touched on success).
 * The caller PQclear()s the result. */
PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  struct charged_error *err);

/* db_exec that gives up timeout_ms after it began: the statement is sent
 * without blocking and its answer awaited with poll() on the session's
 * socket, so that a server that accepted the statement and went silent
 * (TCP still open) costs at most that long. Past it: NULL, err "database
 * did not answer within N ms" with no SQLSTATE, and *abandoned = 1: the
 * statement is still pending on the session, which is unusable and must
 * be closed (PQfinish, which then does not block either). Otherwise as
 * db_exec, and *abandoned = 0. */
PGresult *db_exec_within(PGconn *conn, long long timeout_ms, const char *sql,
                         int nparams, const char *const *params, int *abandoned,
                         struct charged_error *err);

/* db_exec for statements whose result is not needed. CHARGED_OK, or
 * CHARGED_RETRY with err (its SQLSTATE: store_conn_failed classifies it
 * further where the store decides). */
enum charged_rc db_run(PGconn *conn, const char *sql, int nparams,
                       const char *const *params, struct charged_error *err);

/* Runs a parameterized query of one row and one column that the database
 * builds as JSON (row_to_json, json_agg) and parses it. CHARGED_OK with the
 * value in *out (the caller owns it); CHARGED_NOT_FOUND when there is no row
 * or it is NULL; CHARGED_RETRY with err (its SQLSTATE, for store_conn_failed)
 * when the statement failed or its answer is not JSON. */
enum charged_rc db_query_json(PGconn *conn, const char *sql, int nparams,
                              const char *const *params, json_t **out,
                              struct charged_error *err);

/* Writes libpq's message into line as one line: newlines folded, secrets
 * redacted. A formatter, not a fallible call. */
void db_error_line(const char *msg, char *line, size_t line_size);

/* db_array: builds the text form of a PostgreSQL array ("{...}") so that a
 * whole batch travels as one parameter (unnest($1::uuid[]) and friends). */
typedef struct db_array db_array_t;

db_array_t *db_array_new(void);
void db_array_free(db_array_t *a);
/* Appends one element; NULL appends SQL NULL. CHARGED_OK, or CHARGED_RETRY
 * when memory ran out. */
enum charged_rc db_array_add(db_array_t *a, const char *value);
enum charged_rc db_array_add_int(db_array_t *a, long long value);
/* The literal, valid until the next add or free. */
const char *db_array_text(db_array_t *a);
void db_array_clear(db_array_t *a);
#endif
