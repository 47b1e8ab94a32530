/* test_env's databases (test_env.h), apart from the rest of it so that the
 * unit tests of the core link no database library. */
#include "test_env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <check.h>

#include "db.h"
#include "migrate.h"

PGconn *test_env_connect(const char *url)
{
    struct charged_error err;
    PGconn *c = db_connect(url, &err);
    ck_assert_msg(c != NULL, "%s", err.message);
    return c;
}

/* Rebuilds the base connection string with another dbname. */
static void with_dbname(const char *base, const char *dbname, char *out,
                        size_t out_size)
{
    char *errmsg = NULL;
    PQconninfoOption *opts = PQconninfoParse(base, &errmsg);
    size_t o = 0;

    ck_assert_msg(opts != NULL, "bad CHARGED_TEST_DATABASE_URL: %s",
                  errmsg ? errmsg : "?");
    out[0] = '\0';
    for (PQconninfoOption *p = opts; p->keyword; p++) {
        const char *v = !strcmp(p->keyword, "dbname") ? dbname : p->val;
        if (!v || !*v)
            continue;
        o += (size_t)snprintf(out + o, out_size - o, "%s='%s' ", p->keyword, v);
        ck_assert(o < out_size);
    }
    PQconninfoFree(opts);
}

int test_env_fresh_database(char *out, size_t out_size)
{
    static unsigned counter;
    char name[64];
    struct charged_error err;
    const char *params[1];
    PGconn *admin = test_env_connect(test_env_database_url());

    snprintf(name, sizeof(name), "t_%d_%u_%ld", (int)getpid(), counter++,
             (long)(test_env_now_ms() % 100000000));
    /* CREATE DATABASE takes no parameters; the name is ours and quoted. */
    char *ident = PQescapeIdentifier(admin, name, strlen(name));
    char sql[256];
    snprintf(sql, sizeof(sql), "CREATE DATABASE %s", ident);
    PQfreemem(ident);
    (void)params;
    (void)err;
    /* Alone, not through db_run: a statement that starts a transaction
     * goes there with its settings (db.h), and CREATE DATABASE may not run
     * inside one. */
    PGresult *r = PQexec(admin, sql);
    ck_assert_msg(PQresultStatus(r) == PGRES_COMMAND_OK, "%s", PQresultErrorMessage(r));
    PQclear(r);
    PQfinish(admin);
    with_dbname(test_env_database_url(), name, out, out_size);
    return 0;
}

int test_env_migrated_database(char *out, size_t out_size)
{
    struct charged_error err;
    int applied;
    test_env_fresh_database(out, out_size);
    PGconn *c = test_env_connect(out);
    migrate_set_t *set = migrate_set_new(NULL, &err);
    ck_assert_msg(set != NULL, "%s", err.message);
    ck_assert_msg(migrate_run(c, set, NULL, &applied, &err) == 0, "%s", err.message);
    migrate_set_free(set);
    PQfinish(c);
    return 0;
}

void test_env_sql(PGconn *conn, const char *q, int n, const char *const *p)
{
    struct charged_error err;
    ck_assert_msg(db_run(conn, q, n, p, &err) == 0, "%s", err.message);
}

char *test_env_value(PGconn *conn, const char *q)
{
    static char out[512];
    struct charged_error err;
    PGresult *r = db_exec(conn, q, 0, NULL, &err);
    ck_assert_msg(r && PQntuples(r) == 1, "%s", err.message);
    snprintf(out, sizeof(out), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return out;
}
