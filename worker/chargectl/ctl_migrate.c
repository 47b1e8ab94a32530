/* chargectl migrate: apply pending migrations, safe from many pods at once. */
#include <getopt.h>
#include <stdio.h>

#include "chargectl.h"
#include "config.h"
#include "db.h"
#include "log.h"
#include "migrate.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl migrate [--dir DIR]\n\n"
        "Applies the pending migrations to DATABASE_URL, each in its own\n"
        "transaction, under an advisory lock (many pods may run it at once).\n"
        "Refuses to run when an applied migration was changed since.\n\n"
        "  --dir DIR   read NNNN_name.sql files from DIR instead of those built in\n"
        "  --help      this text\n");
}

int ctl_migrate(int argc, char **argv)
{
    static const struct option opts[] = {
        {"dir", required_argument, NULL, 'd'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct charged_error err, db_err;
    const char *dir = NULL;
    config_t *cfg = NULL;
    migrate_set_t *set = NULL;
    PGconn *conn = NULL;
    int c, applied = 0, rc = CTL_FAILED;

    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc, argv, "d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'd':
            dir = optarg;
            break;
        case 'h':
            usage(stdout);
            return CTL_OK;
        default:
            return ctl_bad_option("migrate", argv[optind - 1]);
        }
    }
    if (optind != argc)
        return ctl_unexpected_argument("migrate", argv[optind]);
    cfg = ctl_config("migrate");
    if (!cfg)
        return CTL_USAGE;
    set = migrate_set_new(dir, &err);
    if (!set) {
        fprintf(stderr, "chargectl migrate: %s\n", err.message);
        rc = dir ? CTL_USAGE : CTL_FAILED;
        goto out;
    }
    conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &db_err);
    if (!conn) {
        fprintf(stderr, "chargectl migrate: %s\n", db_err.message);
        goto out;
    }
    if (migrate_run(conn, set, stdout, &applied, &err) != CHARGED_OK) {
        fprintf(stderr, "chargectl migrate: %s\n", err.message);
        goto out;
    }
    if (applied == 0)
        printf("up to date\n");
    rc = CTL_OK;
out:
    PQfinish(conn);
    migrate_set_free(set);
    config_free(cfg);
    return rc;
}
