#include "store_conn.h"

#include <stdlib.h>
#include <string.h>

#include "db.h"

struct store_conn {
    char *url;
    char *lock_timeout;
    PGconn *conn;
};

store_conn_t *store_conn_new(const char *database_url, const char *lock_timeout,
                             struct store_error *err)
{
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(database_url, &perr);
    if (!opts) {
        /* libpq's line may quote a piece of the password: not shown. */
        store_error_set(err, "bad database url: libpq cannot parse it (not shown: it "
                             "may hold a password)");
        PQfreemem(perr);
        return NULL;
    }
    PQconninfoFree(opts);
    store_conn_t *c = calloc(1, sizeof(*c));
    if (!c || !(c->url = strdup(database_url)) ||
        !(c->lock_timeout = strdup(lock_timeout))) {
        store_conn_free(c);
        store_error_set(err, "out of memory");
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

PGconn *store_conn_get(store_conn_t *c, int *fresh, struct store_error *err)
{
    if (fresh)
        *fresh = 0;
    if (c->conn && PQstatus(c->conn) == CONNECTION_OK)
        return c->conn;
    PQfinish(c->conn);
    if (!(c->conn = db_connect(c->url, err)))
        return NULL;
    /* No statement of a daemon waits long: the few that may wait for a
     * lock at all give up after the store's lock_timeout. */
    const char *p[1] = {c->lock_timeout};
    if (db_run(c->conn,
               "SELECT set_config('statement_timeout', '10s', false),"
               " set_config('lock_timeout', $1, false)",
               1, p, err) != 0) {
        PQfinish(c->conn);
        c->conn = NULL;
        return NULL;
    }
    if (fresh)
        *fresh = 1;
    return c->conn;
}

int store_conn_broken(const store_conn_t *c)
{
    return c->conn && PQstatus(c->conn) != CONNECTION_OK;
}

enum store_rc store_conn_failed(const struct store_error *err)
{
    const char *s = err->sqlstate;
    if (!strcmp(s, "55P03")) /* lock_not_available */
        return STORE_LOCKED;
    if (!strncmp(s, "22", 2) || /* data exception: bad encoding, too long */
        !strncmp(s, "23", 2))   /* integrity constraint violation */
        return STORE_DATA;
    return STORE_RETRY;
}
