#include "db.h"

#include <stdio.h>
#include <string.h>

#include "log.h"

static _Thread_local char last_sqlstate[6];

void db_error_line(const char *msg, char *errbuf, size_t errbuf_size)
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
    log_redact(tmp, errbuf, errbuf_size);
}

/* Server notices ("relation already exists, skipping") are not errors. */
static void notice_to_log(void *arg, const char *message)
{
    char line[512];
    (void)arg;
    db_error_line(message, line, sizeof(line));
    log_debug("database notice", "notice", line, NULL);
}

PGconn *db_connect(const char *url, char *errbuf, size_t errbuf_size)
{
    PGconn *conn = PQconnectdb(url);
    char line[512];

    if (!conn) {
        snprintf(errbuf, errbuf_size, "database: out of memory");
        return NULL;
    }
    if (PQstatus(conn) != CONNECTION_OK) {
        db_error_line(PQerrorMessage(conn), line, sizeof(line));
        snprintf(errbuf, errbuf_size, "database unreachable: %s", line);
        PQfinish(conn);
        return NULL;
    }
    PQsetNoticeProcessor(conn, notice_to_log, NULL);
    /* Timestamps in UTC so that what we print and compare is unambiguous. */
    PGresult *r = PQexec(conn, "SET TIME ZONE 'UTC'");
    PQclear(r);
    return conn;
}

PGresult *db_exec(PGconn *conn, const char *sql, int nparams, const char *const *params,
                  char *errbuf, size_t errbuf_size)
{
    PGresult *res = PQexecParams(conn, sql, nparams, NULL, params, NULL, NULL, 0);
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;

    last_sqlstate[0] = '\0';
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        return res;
    if (res) {
        const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
        if (state)
            snprintf(last_sqlstate, sizeof(last_sqlstate), "%s", state);
        db_error_line(PQresultErrorMessage(res), errbuf, errbuf_size);
        PQclear(res);
    } else {
        db_error_line(PQerrorMessage(conn), errbuf, errbuf_size);
    }
    return NULL;
}

int db_run(PGconn *conn, const char *sql, int nparams, const char *const *params,
           char *errbuf, size_t errbuf_size)
{
    PGresult *res = db_exec(conn, sql, nparams, params, errbuf, errbuf_size);
    if (!res)
        return -1;
    PQclear(res);
    return 0;
}

const char *db_last_sqlstate(void)
{
    return last_sqlstate;
}
