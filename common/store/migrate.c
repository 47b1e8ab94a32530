#include "migrate.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "db.h"

/* pg_advisory_lock key: any constant shared by every charged build. */
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
                     char *errbuf, size_t errbuf_size)
{
    int version = parse_version(name);
    struct migrate_entry *n;

    if (version < 0) {
        snprintf(errbuf, errbuf_size, "migration '%s' is not named NNNN_name.sql",
                 name);
        return -1;
    }
    for (size_t i = 0; i < set->n; i++) {
        if (set->v[i].version == version) {
            snprintf(errbuf, errbuf_size, "migrations '%s' and '%s' share version %d",
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
    snprintf(errbuf, errbuf_size, "out of memory");
    return -1;
}

static int load_dir(migrate_set_t *set, const char *dir, char *errbuf,
                    size_t errbuf_size)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int rc = -1;

    if (!d) {
        snprintf(errbuf, errbuf_size, "cannot open '%s': %s", dir, strerror(errno));
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
            snprintf(errbuf, errbuf_size, "cannot open '%s': %s", path,
                     strerror(errno));
            goto out;
        }
        if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0 ||
            fseek(f, 0, SEEK_SET) != 0) {
            fclose(f);
            snprintf(errbuf, errbuf_size, "cannot read '%s'", path);
            goto out;
        }
        buf = malloc((size_t)size + 1);
        if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size) {
            free(buf);
            fclose(f);
            snprintf(errbuf, errbuf_size, "cannot read '%s'", path);
            goto out;
        }
        fclose(f);
        int r = add_entry(set, de->d_name, buf, (size_t)size, errbuf, errbuf_size);
        free(buf);
        if (r != 0)
            goto out;
    }
    rc = 0;
out:
    closedir(d);
    return rc;
}

migrate_set_t *migrate_set_new(const char *dir, char *errbuf, size_t errbuf_size)
{
    migrate_set_t *set = calloc(1, sizeof(*set));
    if (!set) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return NULL;
    }
    if (dir) {
        if (load_dir(set, dir, errbuf, errbuf_size) != 0)
            goto fail;
    } else {
        for (size_t i = 0; i < migrate_embedded_count; i++) {
            const struct migrate_file *f = &migrate_embedded[i];
            if (add_entry(set, f->name, f->sql, f->len, errbuf, errbuf_size) != 0)
                goto fail;
        }
    }
    if (set->n == 0) {
        snprintf(errbuf, errbuf_size, "no migrations found%s%s", dir ? " in " : "",
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

/* db_run and db_exec with their failure as one line in errbuf. */
static int run(PGconn *conn, const char *sql, int nparams, const char *const *params,
               char *errbuf, size_t errbuf_size)
{
    struct charged_error err;
    if (db_run(conn, sql, nparams, params, &err) == 0)
        return 0;
    snprintf(errbuf, errbuf_size, "%s", err.message);
    return -1;
}

static PGresult *query(PGconn *conn, const char *sql, char *errbuf, size_t errbuf_size)
{
    struct charged_error err;
    PGresult *res = db_exec(conn, sql, 0, NULL, &err);
    if (!res)
        snprintf(errbuf, errbuf_size, "%s", err.message);
    return res;
}

/* Applies one file and records it, in one transaction. */
static int apply_one(PGconn *conn, const struct migrate_entry *e, char *errbuf,
                     size_t errbuf_size)
{
    char version[16], line[512];
    const char *params[3] = {version, e->name, e->sha256};
    PGresult *res;

    snprintf(version, sizeof(version), "%d", e->version);
    if (run(conn, "BEGIN", 0, NULL, errbuf, errbuf_size) != 0)
        return -1;
    /* A migration file is trusted, static DDL: it is the one text we run
     * unparameterized, and it may hold several statements. */
    res = PQexec(conn, e->sql);
    if (!res || PQresultStatus(res) != PGRES_COMMAND_OK) {
        db_error_line(res ? PQresultErrorMessage(res) : PQerrorMessage(conn), line,
                      sizeof(line));
        snprintf(errbuf, errbuf_size, "migration '%s' failed: %s", e->name, line);
        PQclear(res);
        goto rollback;
    }
    PQclear(res);
    if (run(conn,
            "INSERT INTO schema_migrations (version, name, checksum) "
            "VALUES ($1::int, $2, $3)",
            3, params, errbuf, errbuf_size) != 0)
        goto rollback;
    return run(conn, "COMMIT", 0, NULL, errbuf, errbuf_size);
rollback:
    PQclear(PQexec(conn, "ROLLBACK"));
    return -1;
}

int migrate_run(PGconn *conn, const migrate_set_t *set, FILE *report, int *applied,
                char *errbuf, size_t errbuf_size)
{
    const char *lock[1] = {MIGRATE_LOCK_KEY};
    PGresult *res = NULL;
    int rc = -1, locked = 0;

    *applied = 0;
    /* Session lock: held across the per-file transactions below. */
    if (run(conn, "SELECT pg_advisory_lock($1::bigint)", 1, lock, errbuf,
            errbuf_size) != 0)
        goto out;
    locked = 1;
    if (run(conn,
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version int PRIMARY KEY,"
            " name text NOT NULL,"
            " checksum text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())",
            0, NULL, errbuf, errbuf_size) != 0)
        goto out;
    res = query(conn, "SELECT version, name, checksum FROM schema_migrations", errbuf,
                errbuf_size);
    if (!res)
        goto out;
    for (size_t i = 0; i < set->n; i++) {
        const struct migrate_entry *e = &set->v[i];
        int found = 0;
        for (int r = 0; r < PQntuples(res); r++) {
            if (atoi(PQgetvalue(res, r, 0)) != e->version)
                continue;
            found = 1;
            if (strcmp(PQgetvalue(res, r, 2), e->sha256) != 0) {
                snprintf(errbuf, errbuf_size,
                         "migration '%s' was changed after it was applied as '%s' "
                         "(checksum %.12s, applied %.12s); add a new migration instead",
                         e->name, PQgetvalue(res, r, 1), e->sha256,
                         PQgetvalue(res, r, 2));
                goto out;
            }
        }
        if (found)
            continue;
        if (apply_one(conn, e, errbuf, errbuf_size) != 0)
            goto out;
        (*applied)++;
        if (report)
            fprintf(report, "applied %s\n", e->name);
    }
    rc = 0;
out:
    PQclear(res);
    if (locked) {
        struct charged_error ignore;
        db_run(conn, "SELECT pg_advisory_unlock($1::bigint)", 1, lock, &ignore);
    }
    return rc;
}
