/* attempt_history: what happened to a payment attempt, as JSON the database
 * builds: for `chargectl attempt show|list` and the console alike, so that
 * the queries are written once.
 *
 * Every call takes a connection of the caller's (db_connect) and returns
 * CHARGED_OK with a new JSON value (the caller owns it), CHARGED_NOT_FOUND, or
 * CHARGED_RETRY with err (CHARGED_BAD_ITEM with err when the database refuses a
 * value given: a filter's). Times are RFC 3339 UTC strings with
 * milliseconds. */
#ifndef CHARGED_ATTEMPT_HISTORY_H
#define CHARGED_ATTEMPT_HISTORY_H

#include <jansson.h>
#include <libpq-fe.h>

#include "store.h"

/* An RFC 3339 UTC time of a column, as every part says it. */
#define ATTEMPT_HISTORY_TS(col)                                                        \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* A record's wait before its call (migration 0021; docs/states.md,
 * "Waiting"), as waiting_reason and waiting_since, read while the claim
 * that said it holds its lease (a worker killed while it waited says
 * nothing more). Ends with a comma. */
/* clang-format off */
#define ATTEMPT_HISTORY_WAITING \
    "CASE WHEN lease_expires_at > now() THEN waiting_reason END AS waiting_reason," \
    " CASE WHEN lease_expires_at > now() THEN " ATTEMPT_HISTORY_TS("waiting_since") \
    " END AS waiting_since,"
/* clang-format on */

/* A step's transitions, oldest first (x: the step's row; table: its
 * transitions, col: their step's id): a member "transitions" of its row. */
#define ATTEMPT_HISTORY_STEP_TRANSITIONS(table, col)                                   \
    " (SELECT coalesce(json_agg(t ORDER BY t.id), '[]') FROM (SELECT id,"              \
    " " ATTEMPT_HISTORY_TS("created_at") " AS at, old_status, new_status, cause,"      \
                                         " actor, reason, evidence FROM " table        \
                                         " WHERE " col " = x.id) t) AS transitions"

/* A part of the timeline: the transitions t of table (its step's
 * literal, its id's column), joined to what names the attempt $1. */
#define ATTEMPT_HISTORY_TIMELINE_PART(step, id, table, join)                           \
    " SELECT " step " AS step, " id " AS step_id, t.id,"                               \
    " " ATTEMPT_HISTORY_TS("t.created_at") " AS at,"                                   \
                                           " t.old_status, t.new_status, t.cause, "    \
                                           "t.actor, t.reason, t.evidence,"            \
                                           " t.created_at AS c FROM " table " t " join

/* An operation's steps of an attempt in its story (struct payment_op's
 * history: worker/operations/op.h), each a record of its own that names
 * the attempt. */
struct attempt_history_steps {
    const char *key;  /* the story's member: its steps */
    const char *noun; /* the timeline's "step" of one */
    /* Whose steps they are, for `chargectl attempt --help` ("an
     * authorization's"): the same for every operation's. */
    const char *whose;
    const char *id_key;      /* its rows' id member */
    const char *call_column; /* provider_calls' column naming one (the call log) */
    /* Its rows, oldest first, each with its transitions
     * (ATTEMPT_HISTORY_STEP_TRANSITIONS): $1 the attempt; one row of a
     * JSON array whose members carry "c", the order, taken out after. */
    const char *sql;
    /* Its part of the timeline (ATTEMPT_HISTORY_TIMELINE_PART). */
    const char *timeline;
    /* `chargectl attempt show`'s table of steps: its own columns'
     * headings and members, between AMOUNT and REASON (NULL-ended). */
    const char *const *heads;
    const char *const *members;
    /* The console's table of an authorization's steps
     * (worker/roles/console_kinds.c): the member of a row shown as what it
     * asked (NULL: none, "-"), and the word for a null one (the whole);
     * the member shown as what it took (NULL: none, "-") and the
     * table's heading of that column (the first operation's with one);
     * the members of its reason, joined with " · " (NULL-ended). */
    const char *asked_member;
    const char *asked_whole;
    const char *taken_member;
    const char *taken_head;
    const char *const *reason_members;
};

/* The steps of every operation of the table that has some, in its order. */
#define ATTEMPT_HISTORY_STEPS_MAX 8
struct attempt_history_table {
    const struct attempt_history_steps *steps[ATTEMPT_HISTORY_STEPS_MAX];
    size_t n;
};

/* The attempt (its row, with provider_calls counted) and every part of its
 * story: {"attempt", "transitions", "provider_calls", "ledger_entries",
 * "result_events", "refunds", then each of steps' key, then "timeline"}:
 * an operation's steps of it each with its own transitions, and the
 * timeline the attempt's transitions and its steps' in time order (each
 * with "step": "attempt" or the step's noun, and "step_id"); the call log
 * with each step's call_column; each list oldest first, all read in one
 * snapshot (a transaction of its own unless conn is inside one already).
 * CHARGED_NOT_FOUND also for an id that is not a UUID. */
enum charged_rc attempt_history_read(PGconn *conn, const char *attempt_id,
                                     const struct attempt_history_table *steps,
                                     json_t **out, struct charged_error *err);

struct attempt_history_filter {
    const char *order_id;      /* NULL: any */
    const char *status;        /* NULL: any */
    const char *older_than_ms; /* decimal; NULL: any age */
    const char *limit;         /* decimal, required */
};

/* Attempts, most recently updated first: an array of {payment_attempt_id,
 * order_id, status, amount, currency, provider_payment_id, reason,
 * updated_at}. */
enum charged_rc attempt_history_list(PGconn *conn,
                                     const struct attempt_history_filter *f,
                                     json_t **out, struct charged_error *err);

/* The attempts an id names: an attempt id, an order id (a UUID is looked
 * for as both) or a provider's intent id (pi_...: letters, digits, '_'):
 * an array as attempt_history_list's, at most 100. CHARGED_OK with an empty
 * array when none, and for an id of neither kind (nothing is asked). */
enum charged_rc attempt_history_find(PGconn *conn, const char *id, json_t **out,
                                     struct charged_error *err);

#endif
