#include "migrate.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "db.h"

/* pg_advisory_xact_lock key: any constant shared by every charged build. */
#define MIGRATE_LOCK_KEY "7239117461206135100"

struct migrate_entry {
    int version;
    char *name;
    char *sql;
    size_t len;
    char sha256[65];
};

struct migrate_set {
    struct migrate_entry *v;
    size_t n;
};

static int parse_version(const char *name)
{
    int v = 0, digits = 0;
    while (isdigit((unsigned char)name[digits]) && digits < 9)
        v = v * 10 + (name[digits++] - '0');
    if (digits == 0 || name[digits] != '_')
        return -1;
    return v;
}

static void sha256_hex(const char *data, size_t len, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
    for (unsigned i = 0; i < mdlen; i++)
        sprintf(out + 2 * i, "%02x", md[i]);
    out[2 * mdlen] = '\0';
}

static int cmp_entry(const void *a, const void *b)
{
    const struct migrate_entry *x = a, *y = b;
    return (x->version > y->version) - (x->version < y->version);
}

static int add_entry(migrate_set_t *set, const char *name, const char *sql, size_t len,
                     struct charged_error *err)
{
    int version = parse_version(name);
    struct migrate_entry *n;

    if (version < 0) {
        charged_error_set(err, "migration '%s' is not named NNNN_name.sql", name);
        return -1;
    }
    for (size_t i = 0; i < set->n; i++) {
        if (set->v[i].version == version) {
            charged_error_set(err, "migrations '%s' and '%s' share version %d",
                              set->v[i].name, name, version);
            return -1;
        }
    }
    n = realloc(set->v, (set->n + 1) * sizeof(*n));
    if (!n)
        goto oom;
    set->v = n;
    n = &set->v[set->n];
    n->version = version;
    n->name = strdup(name);
    n->sql = malloc(len + 1);
    if (!n->name || !n->sql) {
        free(n->name);
        free(n->sql);
        goto oom;
    }
    memcpy(n->sql, sql, len);
    n->sql[len] = '\0';
    n->len = len;
    sha256_hex(sql, len, n->sha256);
    set->n++;
    return 0;
oom:
    charged_error_set(err, "out of memory");
    return -1;
}

static int load_dir(migrate_set_t *set, const char *dir, struct charged_error *err)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int rc = -1;

    if (!d) {
        charged_error_set(err, "cannot open '%s': %s", dir, strerror(errno));
        return -1;
    }
    while ((de = readdir(d))) {
        size_t nl = strlen(de->d_name);
        char path[4096];
        FILE *f;
        char *buf;
        long size;

        if (nl < 5 || strcmp(de->d_name + nl - 4, ".sql") != 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        f = fopen(path, "rb");
        if (!f) {
            charged_error_set(err, "cannot open '%s': %s", path, strerror(errno));
            goto out;
        }
        if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
            fseek(f, 0, SEEK_SET) != 0) {
            fclose(f);
            charged_error_set(err, "cannot read '%s'", path);
            goto out;
        }
        buf = malloc((size_t)size + 1);
        if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
            free(buf);
            fclose(f);
            charged_error_set(err, "cannot read '%s'", path);
            goto out;
        }
        fclose(f);
        int r = add_entry(set, de->d_name, buf, (size_t)size, err);
        free(buf);
        if (r != 0)
            goto out;
    }
    rc = 0;
out:
    closedir(d);
    return rc;
}

migrate_set_t *migrate_set_new(const char *dir, struct charged_error *err)
{
    migrate_set_t *set = calloc(1, sizeof(*set));
    if (!set) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    if (dir) {
        if (load_dir(set, dir, err) != 0)
            goto fail;
    } else {
        for (size_t i = 0; i < migrate_embedded_count; i++) {
            const struct migrate_file *f = &migrate_embedded[i];
            if (add_entry(set, f->name, f->sql, f->len, err) != 0)
                goto fail;
        }
    }
    if (set->n == 0) {
        charged_error_set(err, "no migrations found%s%s", dir ? " in " : "",
                          dir ? dir : "");
        goto fail;
    }
    qsort(set->v, set->n, sizeof(set->v[0]), cmp_entry);
    return set;
fail:
    migrate_set_free(set);
    return NULL;
}

void migrate_set_free(migrate_set_t *set)
{
    if (!set)
        return;
    for (size_t i = 0; i < set->n; i++) {
        free(set->v[i].name);
        free(set->v[i].sql);
    }
    free(set->v);
    free(set);
}

/* One file, in one transaction that holds the migrations' lock
 * (pg_advisory_xact_lock: it ends with the transaction, so the run is safe
 * through a pooler in transaction mode, where a session lock would stay on
 * a server session other clients then use): the file is applied and
 * recorded unless it was already, by us or by a run beside ours.
 * *applied is set when it was applied now. CHARGED_GIVE_UP when the
 * database refuses the file or it changed since it was applied (repeating
 * cannot help), else as db_run. */
static enum charged_rc migrate_one(PGconn *conn, const struct migrate_entry *e,
                                   int *applied, struct charged_error *err)
{
    char version[16], line[512];
    const char *params[3] = {version, e->name, e->sha256};
    const char *lock[1] = {MIGRATE_LOCK_KEY};
    PGresult *res = NULL;
    enum charged_rc rc;

    *applied = 0;
    snprintf(version, sizeof(version), "%d", e->version);
    if ((rc = db_run(conn, "BEGIN", 0, NULL, err)) != CHARGED_OK)
        return rc;
    if ((rc = db_run(conn, "SELECT pg_advisory_xact_lock($1::bigint)", 1, lock, err)) !=
        CHARGED_OK)
        goto rollback;
    if (!(res = db_exec(conn,
                        "SELECT name, checksum FROM schema_migrations"
                        " WHERE version = $1::int",
                        1, params, err))) {
        rc = CHARGED_RETRY;
        goto rollback;
    }
    if (PQntuples(res) > 0) {
        if (strcmp(PQgetvalue(res, 0, 1), e->sha256) != 0) {
            charged_error_set(
                err,
                "migration '%s' was changed after it was applied as '%s' "
                "(checksum %.12s, applied %.12s); add a new migration instead",
                e->name, PQgetvalue(res, 0, 0), e->sha256, PQgetvalue(res, 0, 1));
            rc = CHARGED_GIVE_UP;
            goto rollback;
        }
        PQclear(res);
        return db_run(conn, "COMMIT", 0, NULL, err);
    }
    PQclear(res);
    res = NULL;
    /* A migration file is trusted, static DDL: it is the one text we run
     * unparameterized, and it may hold several statements. */
    res = PQexec(conn, e->sql);
    if (!res || PQresultStatus(res) != PGRES_COMMAND_OK) {
        db_error_line(res ? PQresultErrorMessage(res) : PQerrorMessage(conn), line,
                      sizeof(line));
        charged_error_set(err, "migration '%s' failed: %s", e->name, line);
        rc = CHARGED_GIVE_UP;
        goto rollback;
    }
    PQclear(res);
    res = NULL;
    if ((rc = db_run(conn,
                     "INSERT INTO schema_migrations (version, name, checksum) "
                     "VALUES ($1::int, $2, $3)",
                     3, params, err)) != CHARGED_OK)
        goto rollback;
    if ((rc = db_run(conn, "COMMIT", 0, NULL, err)) == CHARGED_OK)
        *applied = 1;
    return rc;
rollback:
    PQclear(res);
    PQclear(PQexec(conn, "ROLLBACK"));
    return rc;
}

enum charged_rc migrate_run(PGconn *conn, const migrate_set_t *set, FILE *report,
                            int *applied, struct charged_error *err)
{
    const char *lock[1] = {MIGRATE_LOCK_KEY};
    enum charged_rc rc = CHARGED_OK;
    int now;

    *applied = 0;
    /* The table first, in a transaction of its own under the lock: a first
     * file that fails leaves it, empty, as before. */
    if ((rc = db_run(conn, "BEGIN", 0, NULL, err)) != CHARGED_OK)
        return rc;
    if ((rc = db_run(conn, "SELECT pg_advisory_xact_lock($1::bigint)", 1, lock, err)) !=
            CHARGED_OK ||
        (rc = db_run(conn,
                     "CREATE TABLE IF NOT EXISTS schema_migrations ("
                     " version int PRIMARY KEY,"
                     " name text NOT NULL,"
                     " checksum text NOT NULL,"
                     " applied_at timestamptz NOT NULL DEFAULT now())",
                     0, NULL, err)) != CHARGED_OK ||
        (rc = db_run(conn, "COMMIT", 0, NULL, err)) != CHARGED_OK) {
        PQclear(PQexec(conn, "ROLLBACK"));
        return rc;
    }
    /* A transaction per file, as before the lock moved into them: a file
     * that fails leaves the ones before it applied. */
    for (size_t i = 0; i < set->n; i++) {
        if ((rc = migrate_one(conn, &set->v[i], &now, err)) != CHARGED_OK)
            break;
        if (!now)
            continue;
        (*applied)++;
        if (report)
            fprintf(report, "applied %s\n", set->v[i].name);
    }
    return rc;
}
