/* db: PostgreSQL connection and small helpers over libpq.
 *
 * Every statement is sent with PQexecParams; values never enter SQL text. */
#ifndef CHARGED_DB_H
#define CHARGED_DB_H

#include <stddef.h>
#include <libpq-fe.h>

/* How long a session of ours may sit idle inside a transaction before the
 * server ends it (and releases its locks). Nothing of ours thinks between
 * two statements of a transaction. */
#define DB_IDLE_IN_TX "5s"

/* Opens a connection (idle_in_transaction_session_timeout DB_IDLE_IN_TX).
 * Returns NULL and one line (without the password) in errbuf on failure.
 * Close with PQfinish. */
PGconn *db_connect(const char *url, char *errbuf, size_t errbuf_size);

/* Keeps *conn usable for a daemon: opens it when NULL or broken (a new
 * session, with a 10 s statement_timeout and a 5 s lock_timeout so that
 * no statement holds a loop for long). Returns 0 when the session is the same as
 * before, 1 when it is new (session state such as advisory locks is gone), -1 with
 * errbuf when the database cannot be reached (*conn is then NULL). */
int db_ensure(PGconn **conn, const char *url, char *errbuf, size_t errbuf_size);

/* Runs a parameterized statement (text parameters). Returns the result when
 * its status is COMMAND_OK or TUPLES_OK; otherwise clears it, writes one line
 * to errbuf and returns NULL. The caller PQclear()s the result. */
PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  char *errbuf, size_t errbuf_size);

/* db_exec for statements whose result is not needed. 0 / -1. */
int db_run(PGconn *conn, const char *sql, int nparams, const char *const *params,
           char *errbuf, size_t errbuf_size);

/* SQLSTATE of the last failed db_exec on this thread ("" if none). */
const char *db_last_sqlstate(void);

/* What a caller should do about a failed statement, by SQLSTATE. */
enum db_error_class {
    DB_ERR_TRANSIENT = 1, /* connection lost, deadlock, serialization, shutdown,
                             timeout: the same statement may succeed later */
    DB_ERR_DATA,          /* a value was refused (encoding, length, constraint):
                             repeating it fails again; isolate the bad row */
    DB_ERR_OTHER,         /* anything else: a bug or a schema mismatch */
};
enum db_error_class db_error_class_of(const char *sqlstate);
/* The class of the last failed db_exec on this thread. */
enum db_error_class db_last_error_class(void);

/* Writes libpq's message as one line: newlines folded, secrets redacted. */
void db_error_line(const char *msg, char *errbuf, size_t errbuf_size);

/* db_array: builds the text form of a PostgreSQL array ("{...}") so that a
 * whole batch travels as one parameter (unnest($1::uuid[]) and friends). */
typedef struct db_array db_array_t;

db_array_t *db_array_new(void);
void db_array_free(db_array_t *a);
/* Appends one element; NULL appends SQL NULL. 0 / -1 on out of memory. */
int db_array_add(db_array_t *a, const char *value);
int db_array_add_int(db_array_t *a, long long value);
/* The literal, valid until the next add or free. */
const char *db_array_text(db_array_t *a);
void db_array_clear(db_array_t *a);
#endif
