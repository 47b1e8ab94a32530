/* store_stmt: one parameterized statement of a store, built column by
 * column (a batch's column is one array parameter), run on the store's
 * session, and its rows read back. Private to the store library. */
#ifndef CHARGED_STORE_STMT_H
#define CHARGED_STORE_STMT_H

#include <stddef.h>
#include <stdint.h>

#include <libpq-fe.h>

#include "attempt_status.h"
#include "provider_outcome.h"
#include "db.h"
#include "store.h"
#include "store_conn.h"
#include "str_index.h"

/* The most a statement takes: a settlement of an attempt (attempt_store.c),
 * 23. */
#define STMT_PARAMS_MAX 24

/* The parameters of one statement, $1 first, in the order they are added:
 * texts the caller keeps alive, and numbers and arrays (a batch's column
 * each, one parameter: unnest($1::uuid[])) held here until stmt_release().
 * A value that cannot be added is remembered, so that a statement is built
 * without a check per value and refused whole by stmt_run(). */
struct stmt {
    const char *p[STMT_PARAMS_MAX];
    db_array_t *arrays[STMT_PARAMS_MAX]; /* arrays[i]: p[i] is its text */
    char nums[STMT_PARAMS_MAX][24];
    int n;
    int failed; /* out of memory, or more parameters than STMT_PARAMS_MAX */
};

/* A text parameter, or SQL NULL for NULL. */
void stmt_text(struct stmt *s, const char *value);
void stmt_int(struct stmt *s, long long value);
/* value, or SQL NULL when it is negative ("none"). */
void stmt_int_or_null(struct stmt *s, long long value);
/* `count` array parameters, empty: the index of the first, which
 * stmt_add() fills item by item. */
int stmt_arrays(struct stmt *s, int count);
/* Appends one element to array parameter `param`; NULL appends SQL NULL. */
void stmt_add(struct stmt *s, int param, const char *value);
void stmt_add_int(struct stmt *s, int param, long long value);
/* Runs sql with s's parameters on db's session: CHARGED_OK and, when res is
 * not NULL, the rows in *res (the caller PQclear()s them); or the failure,
 * classified (store_conn_exec), and err. */
enum charged_rc stmt_run(store_conn_t *db, struct stmt *s, const char *sql,
                         PGresult **res, struct charged_error *err);
/* stmt_run for a statement that inserts charges or refunds: a key another
 * session took in the same instant is refused (unique_violation on
 * idempotency_keys, migration 0011) once that session commits; run again,
 * the statement sees the winner, and the key reads as the conflict it is. */
enum charged_rc stmt_run_keyed(store_conn_t *db, struct stmt *s, const char *sql,
                               PGresult **res, struct charged_error *err);
void stmt_release(struct stmt *s);

/* Column c of a row: copied as text into out (cut to its size), as a
 * number, as a boolean. */
void stmt_col_copy(const PGresult *r, int row, int c, char *out, size_t size);
long long stmt_col_int(const PGresult *r, int row, int c);
int stmt_col_true(const PGresult *r, int row, int c);

/* The last row whose column c is value, or -1. */
int stmt_row_of(const PGresult *r, int c, const char *value);
/* The rows of r by column c's value, built once for looking up a batch's
 * items one by one (a scan per item is quadratic in the batch); NULL when
 * out of memory, and stmt_row_in scans then. Free with str_index_free,
 * before r is cleared. */
str_index_t *stmt_index_rows(const PGresult *r, int c);
/* stmt_row_of through ix (stmt_index_rows(r, c)), or by a scan without. */
int stmt_row_in(const str_index_t *ix, const PGresult *r, int c, const char *value);

/* In the caller's transaction: locks the rows sql names ($1 the ids, a
 * uuid[]; it answers the ids it locked, FOR NO KEY UPDATE SKIP LOCKED).
 * locked[i] says whether ids[i]'s row is ours until the transaction ends:
 * the statements after it in the transaction find it locked by us, never
 * skipped, and a row another session holds stays out of all of them. */
enum charged_rc stmt_lock_ids(store_conn_t *db, const char *sql, const char *const *ids,
                              size_t n, int *locked, struct charged_error *err);

/* Runs a lease statement (lease_sql.h) of ours on ids[i] at epochs[i]: its
 * parameters are the ids, the epochs, *lease_ms (when not NULL) and the
 * actor. Connects first if needed. */
enum charged_rc stmt_lease(store_conn_t *db, const char *actor, const char *sql,
                           const char *const *ids, const int64_t *epochs, size_t n,
                           const long long *lease_ms, PGresult **res,
                           struct charged_error *err);

/* Runs SQL_LEASE_WAITING(table) of ours on the n waits (store.h). Connects
 * first if needed. */
enum charged_rc stmt_waiting(store_conn_t *db, const char *actor, const char *sql,
                             const struct store_wait *w, size_t n,
                             struct charged_error *err);

/* A leased store's <prefix>_wait (a struct <prefix> of `store_conn_t *db;
 * char *actor;`, typedef'd <prefix>_t): stmt_waiting on table, written
 * once for every such store. Its file includes lease_sql.h. */
#define STMT_STORE_WAIT(prefix, table)                                                 \
    enum charged_rc prefix##_wait(prefix##_t *st, const struct store_wait *w,          \
                                  size_t n, struct charged_error *err)                 \
    {                                                                                  \
        CHARGED_ASSERT(st);                                                            \
        return stmt_waiting(st->db, st->actor, SQL_LEASE_WAITING(table), w, n, err);   \
    }

/* The session and the actor a leased store (attempt_store, refund_store)
 * holds: *db made with lock_timeout (only the URL's syntax is checked now;
 * the server may come up later) and *actor_copy a copy of actor. 0, or -1
 * and err (out of memory, or the URL); nothing is held then. */
int stmt_session_new(const char *database_url, const char *lock_timeout,
                     const char *actor, store_conn_t **db, char **actor_copy,
                     struct charged_error *err);
void stmt_session_free(store_conn_t *db, char *actor_copy);
/* The session opened and answering: CHARGED_OK, or CHARGED_RETRY and err. */
enum charged_rc stmt_ping(store_conn_t *db, struct charged_error *err);

/* A store that is a session and its actor (a struct <prefix> of
 * `store_conn_t *db; char *actor;`, typedef'd <prefix>_t): its
 * <prefix>_new (does not connect: NULL and err on out of memory or a bad
 * URL), <prefix>_free and <prefix>_ping, written once for every such
 * store. Its file includes <stdlib.h> and charged_assert.h. */
#define STMT_STORE_SESSION(prefix, lock_timeout)                                       \
    prefix##_t *prefix##_new(const char *database_url, const char *actor,              \
                             struct charged_error *err)                                \
    {                                                                                  \
        CHARGED_ASSERT(database_url &&actor);                                          \
        prefix##_t *st = calloc(1, sizeof(*st));                                       \
        if (!st) {                                                                     \
            charged_error_set(err, "out of memory");                                   \
            return NULL;                                                               \
        }                                                                              \
        if (stmt_session_new(database_url, lock_timeout, actor, &st->db, &st->actor,   \
                             err) != 0) {                                              \
            free(st);                                                                  \
            return NULL;                                                               \
        }                                                                              \
        /* A store always has its session and its actor. */                            \
        CHARGED_ASSERT(st->db && st->actor);                                           \
        return st;                                                                     \
    }                                                                                  \
    void prefix##_free(prefix##_t *st)                                                 \
    {                                                                                  \
        if (!st)                                                                       \
            return;                                                                    \
        stmt_session_free(st->db, st->actor);                                          \
        free(st);                                                                      \
    }                                                                                  \
    enum charged_rc prefix##_ping(prefix##_t *st, struct charged_error *err)           \
    {                                                                                  \
        CHARGED_ASSERT(st);                                                            \
        return stmt_ping(st->db, err);                                                 \
    }

/* One outcome of the worker's batch as a persist statement takes it (the
 * SQL_PERSIST of attempt_store and of refund_store: ten arrays, $11 the
 * actor), and where its result goes. */
struct stmt_outcome {
    const char *id;
    int64_t lease_epoch;
    const char *status, *reason, *provider_id, *event_type, *evidence_json;
    int calls;
    const char *last_error;
    long long next_check_ms; /* < 0: none */
    int *persisted, *busy;   /* out */
};

/* Item i of the caller's batch, as an outcome. */
typedef void (*stmt_outcome_fn)(void *items, size_t i, struct stmt_outcome *o);

/* Persists the n outcomes `get` gives of items by sql, each under the
 * claim it names, and sets each one's persisted and busy. An outcome whose
 * status may not follow PROCESSING is a bug of ours: the batch is refused
 * whole (CHARGED_BAD_ITEM), and the caller isolates it like a refused value.
 * Connects first if needed. */
enum charged_rc stmt_persist(store_conn_t *db, const char *actor, const char *sql,
                             void *items, size_t n, stmt_outcome_fn get,
                             struct charged_error *err);

/* One provider call of a step (a refund's, a capture's), as its store's
 * call statements take it: nine arrays (the step's id, operation,
 * started_ms, latency, outcome, http status, replayed, provider id,
 * error). */
struct stmt_call {
    const char *id;
    const char *operation; /* NULL: the step's own call */
    int64_t started_ms;
    const struct provider_result *res;
    int written_maybe; /* an earlier write may have committed */
};
/* Item i of the caller's batch of calls, as a call. */
typedef void (*stmt_call_fn)(const void *items, size_t i, struct stmt_call *c);
/* Adds the n calls `get` gives of items to the nine arrays from `first`;
 * own_op names a call whose operation is NULL. */
void stmt_add_calls(struct stmt *s, int first, const void *items, size_t n,
                    stmt_call_fn get, const char *own_op);
/* Writes the calls by sql ($1..$9 the arrays, $10 the actor, $11 {t} for
 * the calls written maybe, which sql writes only when absent): one
 * statement for each kind. Connects first if needed. */
enum charged_rc stmt_log_calls(store_conn_t *db, const char *actor, const char *sql,
                               const void *items, size_t n, stmt_call_fn get,
                               const char *own_op, struct charged_error *err);

/* The common part of a reconciler's claim of due rows by sql ($1 the
 * actor, $2 lease_ms, $3 max, $4 stale_ms): the rows in *res (the caller
 * PQclear()s them). Connects first if needed. */
enum charged_rc stmt_claim_due(store_conn_t *db, const char *actor, const char *sql,
                               size_t max, long long lease_ms, long long stale_ms,
                               PGresult **res, struct charged_error *err);
/* Counts the rows in each of the statuses and the age in ms of each one's
 * oldest, by sql ($1 the statuses' names; rows of status, count, age), 0
 * for none. Connects first if needed. */
enum charged_rc stmt_backlog(store_conn_t *db, const char *sql,
                             const enum attempt_status *statuses, size_t n,
                             long long *counts, long long *oldest_ms,
                             struct charged_error *err);

#endif
