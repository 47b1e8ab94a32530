/* migrate: applies the versioned SQL files of migrations/ to a database.
 *
 * Files are named NNNN_what.sql and applied in version order, each in its
 * own transaction together with its row in schema_migrations (version, name,
 * SHA-256). Each of those transactions takes a transaction advisory lock
 * (pg_advisory_xact_lock) before it looks whether its file was applied,
 * which serialises concurrent runs, so many pods may migrate at start-up:
 * the first applies, the rest find nothing to do. Nothing outlives a
 * transaction, so a run is safe through PgBouncer in transaction mode too
 * (docs/operations.md, "Production settings").
 * A file whose checksum differs from the applied one is refused. */
#ifndef CHARGED_MIGRATE_H
#define CHARGED_MIGRATE_H

#include <stdio.h>
#include <stddef.h>
#include <libpq-fe.h>

#include "charged_error.h"

struct migrate_file {
    const char *name; /* e.g. "0001_initial.sql" */
    const char *sql;
    size_t len;
};

/* The files built into this binary (from migrations/ at build time). */
extern const struct migrate_file migrate_embedded[];
extern const size_t migrate_embedded_count;

typedef struct migrate_set migrate_set_t;

/* The embedded files, or those in `dir` when dir is not NULL. */
migrate_set_t *migrate_set_new(const char *dir, struct charged_error *err);
void migrate_set_free(migrate_set_t *set);

/* Applies what is pending. Writes one line per applied file to `report`
 * (may be NULL) and the count to *applied. CHARGED_OK; CHARGED_GIVE_UP
 * with err when a file is refused or was changed after it was applied
 * (repeating cannot help); else the database's failure (db_run's codes). */
enum charged_rc migrate_run(PGconn *conn, const migrate_set_t *set, FILE *report,
                            int *applied, struct charged_error *err);

#endif
