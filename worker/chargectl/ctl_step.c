/* chargectl <noun> list|resolve: the records of an operation with a review
 * (op.h's review, step_review.h: each operation's words, list and
 * decisions) to look at, and an operator's decision on one in
 * REQUIRES_REVIEW, taken through the operation's review, so that the
 * console and the CLI settle a review alike. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "chargectl.h"
#include "config.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "db.h"
#include "decimal.h"
#include "provider_client.h"
#include "step_review.h"

struct step_cli {
    const struct step_review_kind *k;
    const char *sub, *id, *status, *reason, *actor;
    char limit[32];
    int as_json, force;
};

static void usage(FILE *out, const struct step_review_kind *k)
{
    char names[80];
    step_review_decisions(k, names, sizeof(names));
    fprintf(out,
            "usage: chargectl %s list [--status S] [--limit N] [--json]\n"
            "       chargectl %s resolve <%s> --status S --reason R\n"
            "           [--actor A] [--force] [--json]\n\n"
            "list: the %ss most recently updated first (--status REQUIRES_REVIEW:\n"
            "the review queue).\n"
            "resolve: a person's decision on one in REQUIRES_REVIEW: --status\n%s.\n"
            "%s",
            k->noun, k->noun, k->id_key, k->noun, names, k->cli_asks);
}

static int step_list(PGconn *conn, const struct step_cli *cli)
{
    struct charged_error err;
    const char *p[2] = {cli->status, cli->limit};
    int missing;
    json_t *rows = ctl_query_json(conn, cli->k->list_sql, 2, p, &missing, &err);
    if (!rows)
        return ctl_say(CTL_FAILED, cli->k->noun, "list", "%s", err.message);
    if (cli->as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    ctl_print_rows(rows, cli->k->heads, cli->k->members);
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
        return ctl_say(CTL_USAGE, cli->k->noun, "resolve",
                       "PROVIDER_API_KEY is not set: resolve asks the provider first");
    provider_client_t *pc = ctl_provider_open(cfg, BUDGET_PRIO_LOOKUP, &perr);
    if (!pc)
        return ctl_say(CTL_USAGE, cli->k->noun, "resolve", "%s", perr.message);
    struct step_review_request rq = {
        .id = cli->id,
        .decision = (enum attempt_status)attempt_status_parse(cli->status),
        .reason = cli->reason,
        .actor = cli->actor,
        .force = cli->force,
        .key_kept_ms = config_int(cfg, CONFIG_WORKER_KEY_RETENTION_MS),
    };
    struct step_review_result res;
    step_review_resolve(cli->k, config_str(cfg, CONFIG_DATABASE_URL), pc, &rq, &res);
    int rc = CTL_OK;
    if (res.outcome == STEP_REVIEW_RESOLVED)
        print_resolved(cli, &res);
    else
        rc = ctl_say(CTL_FAILED, cli->k->noun, "resolve", "%s", res.message);
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
            return ctl_say(CTL_USAGE, cli->k->noun, cli->sub,
                           "--status '%s' is not a status", arg);
        cli->status = arg;
        return -1;
    case 'l':
        if (decimal_parse(arg, 100000, &n, NULL) != 0 || n < 1)
            return ctl_say(CTL_USAGE, cli->k->noun, cli->sub,
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
            return ctl_bad_option(cli->k->noun, argv[optind - 1]);
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
        return ctl_unexpected_argument(cli->k->noun, args[resolve ? 1 : 0]);
    if (!resolve)
        return cli->reason || cli->actor || cli->force
                   ? ctl_say(CTL_USAGE, cli->k->noun, "list",
                             "--reason, --actor and --force are resolve's")
                   : -1;
    if (nargs < 1)
        return ctl_say(CTL_USAGE, cli->k->noun, "resolve", "missing %s",
                       cli->k->id_key);
    cli->id = args[0];
    int st = cli->status ? attempt_status_parse(cli->status) : -1;
    char names[80];
    if (st < 0 || !(cli->k->decisions & (1u << st)))
        return ctl_say(CTL_USAGE, cli->k->noun, "resolve", "--status %s is required",
                       step_review_decisions(cli->k, names, sizeof(names)));
    if (!cli->reason)
        return ctl_say(CTL_USAGE, cli->k->noun, "resolve", "--reason is required");
    if (!cli->actor && !(cli->actor = ctl_os_user()))
        return ctl_say(CTL_USAGE, cli->k->noun, "resolve",
                       "--actor is required: the OS user is not known");
    return -1;
}

int ctl_step(const struct step_review_kind *k, int argc, char **argv)
{
    CHARGED_ASSERT(k && k->noun && k->list_sql);
    struct step_cli cli = {.k = k, .limit = "50"};
    struct charged_error err;
    int rc;
    if (argc < 2)
        return ctl_say(CTL_USAGE, k->noun, NULL, "missing subcommand (list, resolve)");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout, k);
        return CTL_OK;
    }
    cli.sub = argv[1];
    if (strcmp(cli.sub, "list") != 0 && strcmp(cli.sub, "resolve") != 0)
        return ctl_say(CTL_USAGE, k->noun, NULL,
                       "unknown subcommand '%s' (list, resolve)", cli.sub);
    if ((rc = parse_options(argc - 1, argv + 1, &cli)) >= 0)
        return rc;
    if ((rc = check_args(&cli, argc - 1 - optind, argv + 1 + optind)) >= 0)
        return rc;
    config_t *cfg = ctl_config(k->noun);
    if (!cfg)
        return CTL_USAGE;
    if (!strcmp(cli.sub, "resolve")) {
        rc = step_resolve(cfg, &cli);
    } else {
        PGconn *conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &err);
        rc = conn ? step_list(conn, &cli)
                  : ctl_say(CTL_FAILED, k->noun, NULL, "%s", err.message);
        PQfinish(conn);
    }
    config_free(cfg);
    return rc;
}
