#include "db.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <libpq-events.h>

#include "clock.h"
#include "log.h"

void db_error_line(const char *msg, char *line, size_t line_size)
{
    char tmp[1024];
    size_t n;

    snprintf(tmp, sizeof(tmp), "%s", msg ? msg : "unknown database error");
    for (char *p = tmp; *p; p++)
        if (*p == '\n' || *p == '\r' || *p == '\t')
            *p = ' ';
    n = strlen(tmp);
    while (n > 0 && tmp[n - 1] == ' ')
        tmp[--n] = '\0';
    log_redact(tmp, line, line_size);
}

/* Server notices ("relation already exists, skipping") are not errors. */
static void notice_to_log(void *arg, const char *message)
{
    char line[512];
    (void)arg;
    db_error_line(message, line, sizeof(line));
    log_debug("database notice", "notice", line, NULL);
}

/* The settings every transaction of a session runs with (db_set_timeouts),
 * kept with the PGconn as libpq instance data, freed with it. */
struct db_settings {
    char statement_timeout[32]; /* "" : the server's own */
    char lock_timeout[32];
};

static int db_event(PGEventId id, void *info, void *pass)
{
    (void)pass;
    if (id == PGEVT_CONNDESTROY) {
        PGconn *conn = ((PGEventConnDestroy *)info)->conn;
        free(PQinstanceData(conn, db_event));
    }
    return 1;
}

/* Sent before the first statement of each transaction, in the same round
 * trip and the same transaction (db.h): set_config(..., true) lasts until
 * that transaction ends, so nothing is left on the server session when a
 * pooler hands it to another client. A setting we do not own keeps the
 * server's value (the role's, the database's), set to itself. */
static const char *const SQL_SETTINGS =
    "SELECT set_config('TimeZone', 'UTC', true),"
    " set_config('idle_in_transaction_session_timeout', $1, true),"
    " set_config('statement_timeout',"
    "            coalesce($2, current_setting('statement_timeout')), true),"
    " set_config('lock_timeout', coalesce($3, current_setting('lock_timeout')), true)";

PGconn *db_connect(const char *url, struct charged_error *err)
{
    /* Defaults come before dbname, so that a value in the URL overrides them.
     * Without them, connecting to an unreachable host, or a query on a
     * connection whose peer vanished, could block a daemon's only loop for
     * minutes (no lease renewals, no provider progress). */
    static const char *const keys[] = {"connect_timeout",
                                       "keepalives_idle",
                                       "keepalives_interval",
                                       "keepalives_count",
                                       "tcp_user_timeout",
                                       "dbname",
                                       NULL};
    const char *values[] = {"3", "10", "3", "3", "10000", url, NULL};
    PGconn *conn = PQconnectdbParams(keys, values, 1);
    struct db_settings *s;
    char line[512];

    if (!conn) {
        charged_error_set(err, "database: out of memory");
        return NULL;
    }
    if (PQstatus(conn) != CONNECTION_OK) {
        db_error_line(PQerrorMessage(conn), line, sizeof(line));
        charged_error_set(err, "database unreachable: %s", line);
        PQfinish(conn);
        return NULL;
    }
    PQsetNoticeProcessor(conn, notice_to_log, NULL);
    /* No setting is made on the session itself: behind a pooler in
     * transaction mode (PgBouncer) the server session is another client's
     * after each transaction, and what we set there would apply to its
     * statements, while ours would run on sessions without it. Each of
     * our transactions carries its own (SQL_SETTINGS). */
    if (!(s = calloc(1, sizeof(*s))) ||
        !PQregisterEventProc(conn, db_event, "charged", NULL) ||
        !PQsetInstanceData(conn, db_event, s)) {
        free(s);
        charged_error_set(err, "database: out of memory");
        PQfinish(conn);
        return NULL;
    }
    return conn;
}

void db_set_timeouts(PGconn *conn, const char *statement_timeout,
                     const char *lock_timeout)
{
    struct db_settings *s = PQinstanceData(conn, db_event);
    if (!s)
        return;
    snprintf(s->statement_timeout, sizeof(s->statement_timeout), "%s",
             statement_timeout ? statement_timeout : "");
    snprintf(s->lock_timeout, sizeof(s->lock_timeout), "%s",
             lock_timeout ? lock_timeout : "");
}

static _Thread_local const char *lock_timeout_override;

void db_lock_timeout_override(const char *lock_timeout)
{
    lock_timeout_override = lock_timeout;
}

/* Sends sql, preceded (or, for a BEGIN, followed) by SQL_SETTINGS when it
 * starts a transaction, in one pipeline closed by a Sync: the settings and
 * the statement are one transaction (the extended protocol's implicit one
 * until the Sync, or the one BEGIN opens) and one round trip. *stmt_q: the
 * statement's place in the pipeline (0 or 1); -1 when it went alone. 1 on
 * success, 0 when libpq refused to send (the session is unusable then). */
static int send_statement(PGconn *conn, const char *sql, int nparams,
                          const char *const *params, int *stmt_q)
{
    struct db_settings *s = PQinstanceData(conn, db_event);
    *stmt_q = -1;
    if (!s || PQtransactionStatus(conn) != PQTRANS_IDLE)
        return PQsendQueryParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
    const char *v[3] = {DB_IDLE_IN_TX,
                        s->statement_timeout[0] ? s->statement_timeout : NULL,
                        lock_timeout_override ? lock_timeout_override
                        : s->lock_timeout[0]  ? s->lock_timeout
                                              : NULL};
    /* Settings made before a BEGIN would be another transaction's. */
    int begins = !strncasecmp(sql, "BEGIN", 5) || !strncasecmp(sql, "START", 5);
    *stmt_q = begins ? 0 : 1;
    if (!PQenterPipelineMode(conn))
        return 0;
    if (begins && !PQsendQueryParams(conn, sql, nparams, NULL, params, NULL, NULL, 0))
        return 0;
    if (!PQsendQueryParams(conn, SQL_SETTINGS, 3, NULL, v, NULL, NULL, 0))
        return 0;
    if (!begins && !PQsendQueryParams(conn, sql, nparams, NULL, params, NULL, NULL, 0))
        return 0;
    return PQpipelineSync(conn);
}

static int succeeded(const PGresult *res)
{
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    return st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
}

/* res when it succeeded; otherwise NULL, res cleared, and err filled from
 * it (or from the connection, when there is no result). */
static PGresult *checked(PGconn *conn, PGresult *res, struct charged_error *err)
{
    if (succeeded(res))
        return res;
    err->code[0] = '\0';
    if (res) {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (state)
            snprintf(err->code, sizeof(err->code), "%s", state);
        db_error_line(PQresultErrorMessage(res), err->message, sizeof(err->message));
        PQclear(res);
    } else {
        db_error_line(PQerrorMessage(conn), err->message, sizeof(err->message));
    }
    return NULL;
}

PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  struct charged_error *err)
{
    int abandoned;
    /* No deadline of its own (a day): a caller of db_exec waits as
     * PQexecParams would, and gets the same transaction settings. */
    return db_exec_within(conn, 86400000LL, sql, nparams, params, &abandoned, err);
}

/* Until conn's socket can be read (or, `writing`, written as well) or
 * `deadline` (clock_now_ms) passes: 1 ready, 0 past the deadline, -1 and
 * errno on a failure of poll() itself. */
static int wait_socket(PGconn *conn, int writing, int64_t deadline)
{
    struct pollfd p = {.fd = PQsocket(conn),
                       .events = POLLIN | (writing ? POLLOUT : 0)};
    for (;;) {
        int64_t left = deadline - clock_now_ms();
        if (left <= 0)
            return 0;
        int n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

PGresult *db_exec_within(PGconn *conn, long long timeout_ms, const char *sql,
                         int nparams, const char *const *params, int *abandoned,
                         struct charged_error *err)
{
    int64_t deadline = clock_now_ms() + timeout_ms;
    PGresult *res = NULL, *next;
    int ready = 1, flushed, stmt_q = -1, q = 0;

    *abandoned = 0;
    /* Non-blocking from the first byte: a server that stopped reading lets
     * the socket's buffer fill, and a blocking send would wait on it. */
    if (PQsocket(conn) < 0 || PQsetnonblocking(conn, 1) != 0)
        return checked(conn, NULL, err);
    if (!send_statement(conn, sql, nparams, params, &stmt_q)) {
        /* A pipeline half sent cannot be taken back: the session goes. */
        *abandoned = PQpipelineStatus(conn) != PQ_PIPELINE_OFF;
        return checked(conn, NULL, err);
    }
    while ((flushed = PQflush(conn)) == 1) {
        /* libpq's rule: read what the server sends while waiting to write. */
        if ((ready = wait_socket(conn, 1, deadline)) <= 0)
            goto abandon;
        if (!PQconsumeInput(conn))
            return checked(conn, NULL, err);
    }
    if (flushed < 0)
        return checked(conn, NULL, err);
    for (;;) {
        while (PQisBusy(conn)) {
            if ((ready = wait_socket(conn, 0, deadline)) <= 0)
                goto abandon;
            if (!PQconsumeInput(conn)) {
                PQclear(res);
                return checked(conn, NULL, err);
            }
        }
        next = PQgetResult(conn);
        if (stmt_q >= 0) {
            /* A pipeline: NULL ends one query's results, the Sync's ends
             * them all. */
            if (!next) {
                q++;
                continue;
            }
            if (PQresultStatus(next) == PGRES_PIPELINE_SYNC) {
                PQclear(next);
                break;
            }
        } else if (!next) {
            break;
        }
        /* One statement has one result; were there more, the first that
         * failed is kept, as PQexecParams keeps it. Of a pipeline, the
         * statement's, unless the settings before it failed. */
        if (res && !succeeded(res)) {
            PQclear(next);
        } else if (!succeeded(next) || stmt_q < 0 || q == stmt_q) {
            PQclear(res);
            res = next;
        } else {
            PQclear(next);
        }
    }
    if (stmt_q >= 0)
        PQexitPipelineMode(conn);
    PQsetnonblocking(conn, 0);
    /* A BEGIN whose settings failed opened a transaction the caller does
     * not know of: ended here, so that its next call starts clean. */
    if (stmt_q == 0 && !succeeded(res) && PQtransactionStatus(conn) != PQTRANS_IDLE)
        PQclear(PQexec(conn, "ROLLBACK"));
    return checked(conn, res, err);
abandon:
    if (ready < 0)
        charged_error_set(err, "database: waiting for an answer failed: %s",
                          strerror(errno));
    else
        charged_error_set(err,
                          "database did not answer within %lld ms: statement given up",
                          timeout_ms);
    PQclear(res);
    *abandoned = 1;
    return NULL;
}

enum charged_rc db_run(PGconn *conn, const char *sql, int nparams,
                       const char *const *params, struct charged_error *err)
{
    PGresult *res = db_exec(conn, sql, nparams, params, err);
    if (!res)
        return CHARGED_RETRY;
    PQclear(res);
    return CHARGED_OK;
}

enum charged_rc db_query_json(PGconn *conn, const char *sql, int nparams,
                              const char *const *params, json_t **out,
                              struct charged_error *err)
{
    enum charged_rc rc = CHARGED_NOT_FOUND;
    PGresult *res = db_exec(conn, sql, nparams, params, err);

    *out = NULL;
    if (!res)
        return CHARGED_RETRY;
    if (PQntuples(res) == 1 && !PQgetisnull(res, 0, 0)) {
        *out = json_loads(PQgetvalue(res, 0, 0), 0, NULL);
        rc = *out ? CHARGED_OK : CHARGED_RETRY;
        if (!*out)
            charged_error_set(err, "the database answered something that is not JSON");
    }
    PQclear(res);
    return rc;
}

struct db_array {
    char *buf;
    size_t len, cap;
    size_t count;
};

db_array_t *db_array_new(void)
{
    return calloc(1, sizeof(db_array_t));
}

void db_array_free(db_array_t *a)
{
    if (!a)
        return;
    free(a->buf);
    free(a);
}

static int reserve(db_array_t *a, size_t more)
{
    if (a->len + more + 2 <= a->cap)
        return 0;
    size_t ncap = a->cap ? a->cap : 256;
    while (ncap < a->len + more + 2)
        ncap *= 2;
    char *n = realloc(a->buf, ncap);
    if (!n)
        return -1;
    a->buf = n;
    a->cap = ncap;
    return 0;
}

enum charged_rc db_array_add(db_array_t *a, const char *value)
{
    size_t n = value ? strlen(value) : 0;
    /* Worst case every byte is escaped, plus quotes and a comma. */
    if (reserve(a, 2 * n + 8) != 0)
        return CHARGED_RETRY;
    if (a->len == 0)
        a->buf[a->len++] = '{';
    if (a->count++ > 0)
        a->buf[a->len++] = ',';
    if (!value) {
        memcpy(a->buf + a->len, "NULL", 4);
        a->len += 4;
        return CHARGED_OK;
    }
    a->buf[a->len++] = '"';
    for (size_t i = 0; i < n; i++) {
        if (value[i] == '"' || value[i] == '\\')
            a->buf[a->len++] = '\\';
        a->buf[a->len++] = value[i];
    }
    a->buf[a->len++] = '"';
    return CHARGED_OK;
}

enum charged_rc db_array_add_int(db_array_t *a, long long value)
{
    char num[32];
    snprintf(num, sizeof(num), "%lld", value);
    return db_array_add(a, num);
}

const char *db_array_text(db_array_t *a)
{
    if (reserve(a, 2) != 0)
        return NULL;
    if (a->len == 0) {
        memcpy(a->buf, "{}", 3);
        return a->buf;
    }
    a->buf[a->len] = '}';
    a->buf[a->len + 1] = '\0';
    return a->buf;
}

void db_array_clear(db_array_t *a)
{
    a->len = 0;
    a->count = 0;
}
