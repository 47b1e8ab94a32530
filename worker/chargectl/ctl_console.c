/* chargectl console token add|list|revoke: the operator console's access
 * tokens (console_store). A token's secret is printed once, by add, and
 * kept nowhere: the database has its SHA-256 only. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "chargectl.h"
#include "config.h"
#include "console_store.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "utf8_text.h"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl console token add NAME --role viewer|operator [--actor NAME]"
        " [--json]\n"
        "       chargectl console token list [--json]\n"
        "       chargectl console token revoke NAME [--actor NAME] [--json]\n\n"
        "The access tokens of the operator console (charged console).\n"
        "  token add NAME   makes a token named NAME (1..%d ASCII letters, digits,\n"
        "                   '.', '_', '-', '@'; unique among live tokens: it is the\n"
        "                   actor of all done with it) and prints its secret,\n"
        "                   cct_ and 43 characters: it is shown only then; the\n"
        "                   database keeps its SHA-256 alone\n"
        "  token list       every token, newest first, revoked ones too (the\n"
        "                   secret is never shown again)\n"
        "  token revoke NAME  revokes the live token NAME and ends its sessions at\n"
        "                   once; NAME may then be given to a new token\n"
        "  --role R         viewer (reads) or operator (also acts); for add\n"
        "  --actor NAME     who, in the console's action log [the OS user]\n"
        "  --json           JSON instead of text\n"
        "  --help           this text\n\n"
        "Needs DATABASE_URL. Every add and revoke is recorded in console_actions.\n\n"
        "Exit status: 0 done; 1 the name is taken (add), no live token has it\n"
        "(revoke), or the database is unreachable; 2 bad usage.\n",
        CONSOLE_TOKEN_MAX_NAME);
}

__attribute__((format(printf, 3, 4))) static int say(int rc, const char *sub,
                                                     const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chargectl console%s%s: ", sub ? " token " : "", sub ? sub : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return rc;
}

struct token_args {
    const char *sub; /* "add", "list", "revoke" */
    const char *name;
    const char *actor;
    int role; /* -1: not given */
    int as_json;
};

static int token_add(console_store_t *st, const struct token_args *a)
{
    char secret[CONSOLE_SECRET_SIZE];
    struct charged_error err;
    enum charged_rc rc = console_store_token_add(
        st, a->name, (enum console_role)a->role, a->actor, secret, &err);
    if (rc != CHARGED_OK)
        return say(CTL_FAILED, a->sub, "%s", err.message);
    const char *role = console_role_name((enum console_role)a->role);
    if (a->as_json) {
        json_t *o = json_pack("{s:s, s:s, s:s, s:s}", "name", a->name, "role", role,
                              "created_by", a->actor, "secret", secret);
        if (o)
            ctl_print_json(stdout, o);
    } else {
        printf(
            "name    %s\nrole    %s\nsecret  %s\n\n"
            "The secret is shown only now: it is stored nowhere (the database has\n"
            "its SHA-256). Hand it over safely; if it is lost, revoke the token and\n"
            "make another.\n",
            a->name, role, secret);
    }
    fflush(stdout);
    /* Our copy goes now; stdio's buffer is the process's to free. */
    explicit_bzero(secret, sizeof(secret));
    return CTL_OK;
}

static int token_list(console_store_t *st, const struct token_args *a)
{
    json_t *rows = NULL;
    struct charged_error err;
    if (console_store_token_list(st, &rows, &err) != CHARGED_OK)
        return say(CTL_FAILED, a->sub, "%s", err.message);
    if (a->as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    const char *h[] = {"NAME",         "ROLE",       "CREATED_BY", "CREATED_AT",
                       "LAST_USED_AT", "REVOKED_AT", NULL};
    const char *k[] = {"name",         "role",       "created_by", "created_at",
                       "last_used_at", "revoked_at", NULL};
    ctl_print_rows(rows, h, k);
    json_decref(rows);
    return CTL_OK;
}

static int token_revoke(console_store_t *st, const struct token_args *a)
{
    struct charged_error err;
    enum charged_rc rc = console_store_token_revoke(st, a->name, a->actor, &err);
    if (rc != CHARGED_OK)
        return say(CTL_FAILED, a->sub, "%s", err.message);
    if (a->as_json) {
        json_t *o = json_pack("{s:s, s:b, s:s}", "name", a->name, "revoked", 1,
                              "revoked_by", a->actor);
        if (o)
            ctl_print_json(stdout, o);
    } else {
        printf("token %s revoked; its sessions are ended\n", a->name);
    }
    return CTL_OK;
}

/* Parses argv (argv[0] the subcommand) into *a: 0, or the exit status of a
 * usage error already said, or -1 after --help. */
static int parse(int argc, char **argv, struct token_args *a)
{
    static const struct option opts[] = {
        {"role", required_argument, NULL, 'r'},
        {"actor", required_argument, NULL, 'a'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, list = !strcmp(a->sub, "list"), add = !strcmp(a->sub, "add");
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'r':
            if ((a->role = console_role_parse(optarg)) < 0)
                return say(CTL_USAGE, a->sub,
                           "--role '%s' is neither viewer nor operator", optarg);
            break;
        case 'a':
            a->actor = optarg;
            break;
        case 'j':
            a->as_json = 1;
            break;
        case 'h':
            usage(stdout);
            return -1;
        default: {
            const char *bad = argv[optind - 1];
            if (optopt && strchr("ra", optopt) && !strchr(bad, '='))
                return say(CTL_USAGE, a->sub, "%s needs a value", bad);
            char cmd[32];
            snprintf(cmd, sizeof(cmd), "console token %s", a->sub);
            return ctl_bad_option(cmd, bad);
        }
        }
    }
    int nargs = argc - optind;
    if (list) {
        if (nargs > 0)
            return ctl_unexpected_argument("console token list", argv[optind]);
        if (a->actor || a->role >= 0)
            return say(CTL_USAGE, a->sub, "list takes no --actor or --role");
        return 0;
    }
    if (nargs == 0)
        return say(CTL_USAGE, a->sub, "give the token's NAME (see --help)");
    if (nargs > 1) {
        char cmd[32];
        snprintf(cmd, sizeof(cmd), "console token %s", a->sub);
        return ctl_unexpected_argument(cmd, argv[optind + 1]);
    }
    a->name = argv[optind];
    if (!console_store_name_ok(a->name))
        return say(CTL_USAGE, a->sub,
                   "NAME must be 1..%d ASCII letters, digits, '.', '_', '-' or '@'",
                   CONSOLE_TOKEN_MAX_NAME);
    if (add && a->role < 0)
        return say(CTL_USAGE, a->sub, "needs --role viewer or --role operator");
    if (!add && a->role >= 0)
        return say(CTL_USAGE, a->sub, "--role is for add");
    if (!a->actor && !(a->actor = ctl_os_user()))
        return say(CTL_USAGE, a->sub, "cannot tell who you are: give --actor NAME");
    if (!utf8_text_line(a->actor, CONSOLE_TOKEN_MAX_NAME))
        return say(CTL_USAGE, a->sub,
                   "--actor must be 1..%d bytes of UTF-8 on one line",
                   CONSOLE_TOKEN_MAX_NAME);
    return 0;
}

int ctl_console(int argc, char **argv)
{
    struct token_args a = {.role = -1};
    struct charged_error err;
    int rc;

    if (argc < 2)
        return say(CTL_USAGE, NULL, "missing subcommand (token; see --help)");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    if (strcmp(argv[1], "token") != 0)
        return say(CTL_USAGE, NULL, "unknown subcommand '%s' (token)", argv[1]);
    if (argc < 3)
        return say(CTL_USAGE, NULL, "missing token subcommand (add, list, revoke)");
    if (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    a.sub = argv[2];
    if (strcmp(a.sub, "add") != 0 && strcmp(a.sub, "list") != 0 &&
        strcmp(a.sub, "revoke") != 0)
        return say(CTL_USAGE, NULL, "unknown token subcommand '%s' (add, list, revoke)",
                   a.sub);
    if ((rc = parse(argc - 2, argv + 2, &a)) != 0)
        return rc < 0 ? CTL_OK : rc;

    config_t *cfg = ctl_config("console");
    if (!cfg)
        return CTL_USAGE;
    console_store_t *st = console_store_new(config_str(cfg, CONFIG_DATABASE_URL), &err);
    if (!st) {
        rc = say(CTL_USAGE, a.sub, "%s", err.message);
        goto out;
    }
    if (!strcmp(a.sub, "add"))
        rc = token_add(st, &a);
    else if (!strcmp(a.sub, "list"))
        rc = token_list(st, &a);
    else
        rc = token_revoke(st, &a);
out:
    console_store_free(st);
    config_free(cfg);
    return rc;
}
