#include "store_conn.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"

struct store_conn {
    char *url;
    char *lock_timeout;
    PGconn *conn;
};

store_conn_t *store_conn_new(const char *database_url, const char *lock_timeout,
                             struct charged_error *err)
{
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(database_url, &perr);
    if (!opts) {
        /* libpq's line may quote a piece of the password: not shown. */
        charged_error_set(err, "bad database url: libpq cannot parse it (not shown: it "
                               "may hold a password)");
        PQfreemem(perr);
        return NULL;
    }
    PQconninfoFree(opts);
    store_conn_t *c = calloc(1, sizeof(*c));
    if (!c || !(c->url = strdup(database_url)) ||
        !(c->lock_timeout = strdup(lock_timeout))) {
        store_conn_free(c);
        charged_error_set(err, "out of memory");
        return NULL;
    }
    return c;
}

void store_conn_free(store_conn_t *c)
{
    if (!c)
        return;
    PQfinish(c->conn);
    free(c->url);
    free(c->lock_timeout);
    free(c);
}

enum charged_rc store_conn_open(store_conn_t *c, int *fresh, struct charged_error *err)
{
    char statement_timeout[32];
    if (fresh)
        *fresh = 0;
    if (c->conn && PQstatus(c->conn) == CONNECTION_OK)
        return CHARGED_OK;
    PQfinish(c->conn);
    if (!(c->conn = db_connect(c->url, err)))
        return CHARGED_RETRY;
    /* No statement of a daemon waits long: the server ends one after
     * store_timeout_ms(), and the few that may wait for a lock at all give
     * up after the store's lock_timeout. Per transaction (db.h), never on
     * the session: behind a transaction pooler a session setting would
     * leak to other clients and miss our next statement. */
    snprintf(statement_timeout, sizeof(statement_timeout), "%lldms",
             store_timeout_ms());
    db_set_timeouts(c->conn, statement_timeout, c->lock_timeout);
    if (fresh)
        *fresh = 1;
    return CHARGED_OK;
}

enum charged_rc store_conn_exec(store_conn_t *c, const char *sql, int nparams,
                                const char *const *params, PGresult **res,
                                struct charged_error *err)
{
    int abandoned;
    if (res)
        *res = NULL;
    if (!c->conn) {
        charged_error_set(err, "no database session: an earlier statement of this call "
                               "was given up");
        return CHARGED_RETRY;
    }
    PGresult *r = db_exec_within(c->conn, store_timeout_ms() + STORE_DEADLINE_GRACE_MS,
                                 sql, nparams, params, &abandoned, err);
    if (!r) {
        if (abandoned) {
            /* No PQcancel: libpq's waits until the server closes the cancel
             * connection, which a frozen one never does. A statement the
             * server was running ends by its own statement_timeout, shorter
             * than the deadline, as soon as it runs again; the closed socket
             * ends the session. The session is non-blocking still, so
             * PQfinish's goodbye does not wait for the server either. */
            PQfinish(c->conn);
            c->conn = NULL;
        }
        return store_conn_failed(err);
    }
    if (res)
        *res = r;
    else
        PQclear(r);
    return CHARGED_OK;
}

int store_conn_pid(const store_conn_t *c)
{
    return c->conn ? PQbackendPID(c->conn) : 0;
}

int store_conn_broken(const store_conn_t *c)
{
    return c->conn && PQstatus(c->conn) != CONNECTION_OK;
}

enum charged_rc store_conn_failed(const struct charged_error *err)
{
    const char *s = err->code;
    if (!strcmp(s, "55P03")) /* lock_not_available */
        return CHARGED_WAIT;
    if (!strncmp(s, "22", 2) || /* data exception: bad encoding, too long */
        !strncmp(s, "23", 2))   /* integrity constraint violation */
        return CHARGED_BAD_ITEM;
    return CHARGED_RETRY;
}
