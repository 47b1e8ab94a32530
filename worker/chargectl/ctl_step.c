/* chargectl capture|void: an authorization's steps (issue 37) to look at,
 * and an operator's decision on one in REQUIRES_REVIEW, taken through the
 * kind's review (operations/capture/capture_review.h,
 * operations/void/void_review.h; both through step_review.h), so that the
 * console and the CLI settle a review alike. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "authorization_review.h"
#include "capture_review.h"
#include "charged_assert.h"
#include "chargectl.h"
#include "config.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "db.h"
#include "decimal.h"
#include "provider_client.h"
#include "void_review.h"

#define TS(col)                                                                        \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* clang-format off */
#define SQL_STEP_LIST(table, id_key, amount) \
    "SELECT coalesce(json_agg(r), '[]')::text FROM (SELECT s.id AS " id_key "," \
    " s.payment_attempt_id, s.status, " amount " AS amount, p.currency," \
    " p.status AS authorization_status, s.reason," \
    " " TS("s.updated_at") " AS updated_at FROM " table " s" \
    " LEFT JOIN payment_attempts p ON p.id = s.payment_attempt_id" \
    " WHERE ($1::text IS NULL OR s.status = $1)" \
    " ORDER BY s.updated_at DESC, s.id LIMIT $2::int) r"
/* An authorization is listed as the attempt it is, with the step that
 * holds it. */
static const char SQL_AUTHORIZATION_LIST[] =
    "SELECT coalesce(json_agg(r), '[]')::text FROM (SELECT s.id AS payment_attempt_id,"
    " s.status, s.amount, s.currency, s.captured_amount,"
    " s.held_by || ' ' || s.held_by_id AS held_by, s.reason,"
    " " TS("s.updated_at") " AS updated_at FROM payment_attempts s"
    " WHERE s.capture_method = 'manual' AND ($1::text IS NULL OR s.status = $1)"
    " ORDER BY s.updated_at DESC, s.id LIMIT $2::int) r";
/* clang-format on */

struct step_cli_kind {
    const char *cmd; /* "capture", "void" */
    const char *id_key;
    const char *list_sql;
    const struct step_review_kind *review;
};

static const struct step_cli_kind step_kinds[] = {
    {"capture", "capture_id",
     SQL_STEP_LIST("capture_attempts", "capture_id",
                   "coalesce(s.captured_amount, s.amount, p.amount)"),
     &capture_review_kind},
    {"void", "void_id",
     SQL_STEP_LIST("void_attempts", "void_id", "coalesce(s.released_amount, p.amount)"),
     &void_review_kind},
    {"authorization", "payment_attempt_id", SQL_AUTHORIZATION_LIST,
     &authorization_review_kind},
};

struct step_cli {
    const struct step_cli_kind *k;
    const char *sub, *id, *status, *reason, *actor;
    char limit[32];
    int as_json, force;
};

static void usage(FILE *out, const struct step_cli_kind *k)
{
    char names[80];
    step_review_decisions(k->review, names, sizeof(names));
    fprintf(out,
            "usage: chargectl %s list [--status S] [--limit N] [--json]\n"
            "       chargectl %s resolve <%s> --status S --reason R\n"
            "           [--actor A] [--force] [--json]\n\n"
            "list: the %ss most recently updated first (--status REQUIRES_REVIEW:\n"
            "the review queue).\n"
            "resolve: a person's decision on one in REQUIRES_REVIEW: --status\n%s.\n"
            "The provider is asked first (PROVIDER_API_KEY) for the authorization's\n"
            "intent by the id charged recorded; a decision it contradicts or does not\n"
            "answer is refused (exit 1, nothing written) unless --force. --actor\n"
            "defaults to the OS user. Exit 0 resolved, 1 refused or failed, 2 bad\n"
            "usage.\n",
            k->cmd, k->cmd, k->id_key, k->cmd, names);
}

static int step_list(PGconn *conn, const struct step_cli *cli)
{
    struct charged_error err;
    const char *p[2] = {cli->status, cli->limit};
    int missing;
    json_t *rows = ctl_query_json(conn, cli->k->list_sql, 2, p, &missing, &err);
    if (!rows)
        return ctl_say(CTL_FAILED, cli->k->cmd, "list", "%s", err.message);
    if (cli->as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    const char *h[] = {"ID",     "ATTEMPT",    "STATUS", "AMOUNT", "AUTHORIZATION",
                       "REASON", "UPDATED_AT", NULL};
    const char *keys[] = {cli->k->id_key,
                          "payment_attempt_id",
                          "status",
                          "amount@currency",
                          "authorization_status",
                          "reason",
                          "updated_at",
                          NULL};
    ctl_print_rows(rows, h, keys);
    json_decref(rows);
    return CTL_OK;
}

static void print_resolved(const struct step_cli *cli,
                           const struct step_review_result *res)
{
    if (cli->as_json) {
        json_t *j =
            json_pack("{s:s, s:s, s:s, s:s, s:s, s:O*}", cli->k->id_key, cli->id,
                      "status", res->status, "cause", "operator", "actor", cli->actor,
                      "reason", cli->reason, "evidence", res->evidence);
        if (j)
            ctl_print_json(stdout, j);
        return;
    }
    printf("%-20s %s\n", cli->k->id_key, cli->id);
    printf("%-20s REQUIRES_REVIEW -> %s\n", "status", res->status);
    printf("%-20s %s%s\n", "provider", res->verdict ? res->verdict : "-",
           res->forced ? " (forced)" : "");
    printf("%-20s %s\n", "actor", cli->actor);
    printf("%-20s %s\n", "reason", cli->reason);
}

/* Asks the provider through a client of cfg, then decides. */
static int step_resolve(const config_t *cfg, const struct step_cli *cli)
{
    struct charged_error perr;
    const char *key = config_str(cfg, CONFIG_PROVIDER_API_KEY);
    if (!key || !*key)
        return ctl_say(CTL_USAGE, cli->k->cmd, "resolve",
                       "PROVIDER_API_KEY is not set: resolve asks the provider first");
    provider_client_t *pc = ctl_provider_open(cfg, BUDGET_PRIO_LOOKUP, &perr);
    if (!pc)
        return ctl_say(CTL_USAGE, cli->k->cmd, "resolve", "%s", perr.message);
    struct step_review_request rq = {
        .id = cli->id,
        .decision = (enum attempt_status)attempt_status_parse(cli->status),
        .reason = cli->reason,
        .actor = cli->actor,
        .force = cli->force,
        .key_kept_ms = config_int(cfg, CONFIG_WORKER_KEY_RETENTION_MS),
    };
    struct step_review_result res;
    step_review_resolve(cli->k->review, config_str(cfg, CONFIG_DATABASE_URL), pc, &rq,
                        &res);
    int rc = CTL_OK;
    if (res.outcome == STEP_REVIEW_RESOLVED)
        print_resolved(cli, &res);
    else
        rc = ctl_say(CTL_FAILED, cli->k->cmd, "resolve", "%s", res.message);
    step_review_result_clear(&res);
    ctl_provider_close(pc);
    return rc;
}

/* One option into cli: -1 to go on, else the exit status. */
static int take_option(int c, const char *arg, struct step_cli *cli)
{
    int64_t n;
    switch (c) {
    case 's':
        if (attempt_status_parse(arg) < 0)
            return ctl_say(CTL_USAGE, cli->k->cmd, cli->sub,
                           "--status '%s' is not a status", arg);
        cli->status = arg;
        return -1;
    case 'l':
        if (decimal_parse(arg, 100000, &n, NULL) != 0 || n < 1)
            return ctl_say(CTL_USAGE, cli->k->cmd, cli->sub,
                           "--limit '%s' must be 1..100000", arg);
        snprintf(cli->limit, sizeof(cli->limit), "%lld", (long long)n);
        return -1;
    case 'r':
        cli->reason = arg;
        return -1;
    case 'a':
        cli->actor = arg;
        return -1;
    case 'j':
        cli->as_json = 1;
        return -1;
    case 'F':
        cli->force = 1;
        return -1;
    default:
        usage(stdout, cli->k);
        return CTL_OK;
    }
}

static int parse_options(int argc, char **argv, struct step_cli *cli)
{
    static const struct option opts[] = {
        {"status", required_argument, NULL, 's'},
        {"limit", required_argument, NULL, 'l'},
        {"reason", required_argument, NULL, 'r'},
        {"actor", required_argument, NULL, 'a'},
        {"json", no_argument, NULL, 'j'},
        {"force", no_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == '?')
            return ctl_bad_option(cli->k->cmd, argv[optind - 1]);
        if ((rc = take_option(c, optarg, cli)) >= 0)
            return rc;
    }
    return -1;
}

/* The arguments fit the subcommand: -1, or CTL_USAGE (said). */
static int check_args(struct step_cli *cli, int nargs, char **args)
{
    int resolve = !strcmp(cli->sub, "resolve");
    if (nargs > (resolve ? 1 : 0))
        return ctl_unexpected_argument(cli->k->cmd, args[resolve ? 1 : 0]);
    if (!resolve)
        return cli->reason || cli->actor || cli->force
                   ? ctl_say(CTL_USAGE, cli->k->cmd, "list",
                             "--reason, --actor and --force are resolve's")
                   : -1;
    if (nargs < 1)
        return ctl_say(CTL_USAGE, cli->k->cmd, "resolve", "missing %s", cli->k->id_key);
    cli->id = args[0];
    int st = cli->status ? attempt_status_parse(cli->status) : -1;
    char names[80];
    if (st < 0 || !(cli->k->review->decisions & (1u << st)))
        return ctl_say(CTL_USAGE, cli->k->cmd, "resolve", "--status %s is required",
                       step_review_decisions(cli->k->review, names, sizeof(names)));
    if (!cli->reason)
        return ctl_say(CTL_USAGE, cli->k->cmd, "resolve", "--reason is required");
    if (!cli->actor && !(cli->actor = ctl_os_user()))
        return ctl_say(CTL_USAGE, cli->k->cmd, "resolve",
                       "--actor is required: the OS user is not known");
    return -1;
}

static int step_run(int argc, char **argv, const struct step_cli_kind *k)
{
    struct step_cli cli = {.k = k, .limit = "50"};
    struct charged_error err;
    int rc;
    if (argc < 2)
        return ctl_say(CTL_USAGE, k->cmd, NULL, "missing subcommand (list, resolve)");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout, k);
        return CTL_OK;
    }
    cli.sub = argv[1];
    if (strcmp(cli.sub, "list") != 0 && strcmp(cli.sub, "resolve") != 0)
        return ctl_say(CTL_USAGE, k->cmd, NULL,
                       "unknown subcommand '%s' (list, resolve)", cli.sub);
    if ((rc = parse_options(argc - 1, argv + 1, &cli)) >= 0)
        return rc;
    if ((rc = check_args(&cli, argc - 1 - optind, argv + 1 + optind)) >= 0)
        return rc;
    config_t *cfg = ctl_config(k->cmd);
    if (!cfg)
        return CTL_USAGE;
    if (!strcmp(cli.sub, "resolve")) {
        rc = step_resolve(cfg, &cli);
    } else {
        PGconn *conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &err);
        rc = conn ? step_list(conn, &cli)
                  : ctl_say(CTL_FAILED, k->cmd, NULL, "%s", err.message);
        PQfinish(conn);
    }
    config_free(cfg);
    return rc;
}

int ctl_capture(int argc, char **argv)
{
    return step_run(argc, argv, &step_kinds[0]);
}

int ctl_void(int argc, char **argv)
{
    return step_run(argc, argv, &step_kinds[1]);
}

int ctl_authorization(int argc, char **argv)
{
    return step_run(argc, argv, &step_kinds[2]);
}
