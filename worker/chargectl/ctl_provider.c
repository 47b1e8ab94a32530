/* chargectl provider limits show|set: the fleet's provider budget
 * (common/budget/budget_lease): its settings, each live member's share,
 * and a change of the settings recorded with its actor. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "budget_lease.h"
#include "chargectl.h"
#include "config.h"
#include "ctl_output.h"
#include "utf8_text.h"

#define CMD "provider limits"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl provider limits show [--account NAME] [--json]\n"
        "       chargectl provider limits set [--global N] [--class CLASS=N ...]\n"
        "                                     [--audit-floor N] [--account NAME]\n"
        "                                     [--actor NAME] [--json]\n\n"
        "The provider's rate budget, shared by every process of the fleet that\n"
        "calls it (docs/architecture.md, \"The provider budget\").\n"
        "  show             the settings and each live member's share\n"
        "  set              changes the settings; the fleet follows within about\n"
        "                   a second; recorded in provider_budget_changes\n"
        "  --global N       requests/s for the whole account (0: no limit)\n"
        "  --class CLASS=N  requests/s for one endpoint class (0: no limit);\n"
        "                   CLASS: create, capture, refund, retrieve, search, list\n"
        "  --audit-floor N  requests/s the auditor's walks get first, so they\n"
        "                   never starve (at most the global limit)\n"
        "  --account NAME   the provider account [PROVIDER_BUDGET_ACCOUNT, the\n"
        "                   fleet's, or default when unset]\n"
        "  --actor NAME     who, in the record [the OS user]\n"
        "  --json           JSON instead of text\n"
        "  --help           this text\n\n"
        "Limits are whole requests/s in 0..%lld; the settings not given keep\n"
        "their value. Needs DATABASE_URL.\n\n"
        "Exit status: 0 done; 1 the database is unreachable or has no such\n"
        "account; 2 bad usage or a value refused.\n",
        BUDGET_RPS_MAX);
}

struct limits_args {
    const char *sub; /* "show", "set" */
    const char *account, *actor;
    struct budget_change change;
    int as_json;
};

/* N as a limit: 0..BUDGET_RPS_MAX, digits only. */
static int parse_rps(const char *s, long long *out)
{
    long long v = 0;
    if (!s || !*s || strlen(s) > 7)
        return -1;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        v = v * 10 + (*s - '0');
    }
    if (v > BUDGET_RPS_MAX)
        return -1;
    *out = v;
    return 0;
}

static int parse_class(struct limits_args *a, const char *arg)
{
    char name[16];
    const char *eq = strchr(arg, '=');
    int c;
    long long v;
    if (!eq || (size_t)(eq - arg) >= sizeof(name))
        return ctl_say(CTL_USAGE, CMD, a->sub, "--class wants CLASS=N, not '%s'", arg);
    memcpy(name, arg, (size_t)(eq - arg));
    name[eq - arg] = '\0';
    if ((c = budget_class_parse(name)) < 0)
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "no endpoint class '%s' (create, capture, refund, retrieve,"
                       " search, list)",
                       name);
    if (parse_rps(eq + 1, &v) != 0)
        return ctl_say(
            CTL_USAGE, CMD, a->sub,
            "--class %s: '%s' is not a whole number of requests/s in 0..%lld", name,
            eq + 1, BUDGET_RPS_MAX);
    a->change.cls[c] = 1;
    a->change.to.class_rps[c] = v;
    return 0;
}

static int parse_limit(struct limits_args *a, const char *opt, const char *arg,
                       int *given, long long *to)
{
    if (parse_rps(arg, to) != 0)
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "%s: '%s' is not a whole number of requests/s in 0..%lld", opt,
                       arg, BUDGET_RPS_MAX);
    *given = 1;
    return 0;
}

/* Whether the change sets anything. */
static int change_any(const struct budget_change *c)
{
    int any = c->global || c->audit_floor;
    for (int k = 0; k < BUDGET_CLASS_COUNT; k++)
        any |= c->cls[k];
    return any;
}

/* What the options say once they are parsed: 0, or a usage error said. */
static int parse_check(struct limits_args *a, int argc, char **argv)
{
    int set = !strcmp(a->sub, "set");
    if (optind < argc)
        return ctl_unexpected_argument(CMD " show|set", argv[optind]);
    if (!set && (change_any(&a->change) || a->actor))
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "show takes no --global, --class, --audit-floor or --actor");
    if (set && !change_any(&a->change))
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "give --global, --class or --audit-floor (see --help)");
    if (set && !a->actor && !(a->actor = ctl_os_user()))
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "cannot tell who you are: give --actor NAME");
    if (a->actor && !utf8_text_line(a->actor, BUDGET_NAME_MAX))
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "--actor must be 1..%d bytes of UTF-8 on one line",
                       BUDGET_NAME_MAX);
    if (a->account && !utf8_text_line(a->account, BUDGET_NAME_MAX))
        return ctl_say(CTL_USAGE, CMD, a->sub,
                       "--account must be 1..%d bytes of UTF-8 on one line",
                       BUDGET_NAME_MAX);
    return 0;
}

/* Parses argv (argv[0] the subcommand) into *a: 0, or the exit status of a
 * usage error already said, or -1 after --help. */
static int parse(int argc, char **argv, struct limits_args *a)
{
    static const struct option opts[] = {
        {"global", required_argument, NULL, 'g'},
        {"class", required_argument, NULL, 'c'},
        {"audit-floor", required_argument, NULL, 'f'},
        {"account", required_argument, NULL, 'A'},
        {"actor", required_argument, NULL, 'a'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc = 0;
    optind = 1;
    opterr = 0;
    while (rc == 0 && (c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'g':
            rc = parse_limit(a, "--global", optarg, &a->change.global,
                             &a->change.to.global_rps);
            break;
        case 'c':
            rc = parse_class(a, optarg);
            break;
        case 'f':
            rc = parse_limit(a, "--audit-floor", optarg, &a->change.audit_floor,
                             &a->change.to.audit_floor_rps);
            break;
        case 'A':
            a->account = optarg;
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
            if (optopt && strchr("gcfAa", optopt) && !strchr(bad, '='))
                return ctl_say(CTL_USAGE, CMD, a->sub, "%s needs a value", bad);
            return ctl_bad_option(CMD, bad);
        }
        }
    }
    return rc ? rc : parse_check(a, argc, argv);
}

/* A limit for people: "100/s", or "no limit". */
static const char *limit_text(json_t *v, char *buf, size_t size)
{
    long long n = json_integer_value(v);
    if (n == 0)
        return "no limit";
    snprintf(buf, size, "%lld/s", n);
    return buf;
}

static void print_settings(json_t *s)
{
    char buf[32];
    json_t *classes = json_object_get(s, "classes");
    printf("account       %s\n", json_string_value(json_object_get(s, "account")));
    printf("global        %s\n", limit_text(json_object_get(s, "global_rps"), buf, 32));
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        const char *name = budget_class_name((enum budget_class)c);
        printf("%-13s %s\n", name, limit_text(json_object_get(classes, name), buf, 32));
    }
    printf("audit floor   %lld/s\n",
           json_integer_value(json_object_get(s, "audit_floor_rps")));
    printf("version       %lld\n", json_integer_value(json_object_get(s, "version")));
    printf("updated_by    %s\n", json_string_value(json_object_get(s, "updated_by")));
    printf("updated_at    %s\n", json_string_value(json_object_get(s, "updated_at")));
}

/* A share for people: requests/s to the thousandth, "-" for no limit. */
static void share_text(json_t *v, char *buf, size_t size)
{
    long long m = json_integer_value(v);
    if (m < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%lld.%03lld", m / 1000, m % 1000);
}

static void print_members(json_t *members)
{
    const char *h[] = {"MEMBER", "ROLE",    "PID",           "HOST",     "GLOBAL",
                       "CREATE", "CAPTURE", "REFUND",        "RETRIEVE", "SEARCH",
                       "LIST",   "FLOOR",   "EXPIRES_IN_MS", NULL};
    ctl_table_t *t = ctl_table_new(h);
    size_t i;
    json_t *m;
    if (!t)
        return;
    json_array_foreach(members, i, m)
    {
        char cells[9][32], pid[16], exp[24];
        const char *row[14];
        json_t *held = json_object_get(m, "held_mrps");
        snprintf(pid, sizeof(pid), "%lld",
                 json_integer_value(json_object_get(m, "pid")));
        snprintf(exp, sizeof(exp), "%lld",
                 json_integer_value(json_object_get(m, "expires_in_ms")));
        row[0] = json_string_value(json_object_get(m, "member_id"));
        row[1] = json_string_value(json_object_get(m, "role"));
        row[2] = pid;
        row[3] = json_string_value(json_object_get(m, "host"));
        for (int k = 0; k < 8; k++) {
            share_text(json_array_get(held, (size_t)k), cells[k], sizeof(cells[k]));
            row[4 + k] = cells[k];
        }
        row[12] = exp;
        row[13] = NULL;
        ctl_table_add(t, row);
    }
    printf("\nmembers: %zu (shares in requests/s; - is no limit)\n",
           json_array_size(members));
    if (json_array_size(members) > 0)
        ctl_table_print(t, stdout);
    ctl_table_free(t);
}

static int limits_show(budget_lease_t *l, const struct limits_args *a)
{
    json_t *settings = NULL, *members = NULL;
    struct charged_error err;
    if (budget_lease_show(l, &settings, &members, &err) != CHARGED_OK)
        return ctl_say(CTL_FAILED, CMD, a->sub, "%s", err.message);
    if (a->as_json) {
        json_object_set_new(settings, "members", members);
        ctl_print_json(stdout, settings);
        return CTL_OK;
    }
    print_settings(settings);
    print_members(members);
    json_decref(settings);
    json_decref(members);
    return CTL_OK;
}

static int limits_set(budget_lease_t *l, const struct limits_args *a)
{
    json_t *after = NULL;
    struct charged_error err;
    enum charged_rc rc = budget_lease_set(l, &a->change, a->actor, &after, &err);
    if (rc == CHARGED_BAD_ITEM)
        return ctl_say(CTL_USAGE, CMD, a->sub, "refused: %s", err.message);
    if (rc != CHARGED_OK)
        return ctl_say(CTL_FAILED, CMD, a->sub, "%s", err.message);
    if (a->as_json) {
        ctl_print_json(stdout, after);
        return CTL_OK;
    }
    print_settings(after);
    printf("\nThe fleet follows within about a second.\n");
    json_decref(after);
    return CTL_OK;
}

int ctl_provider(int argc, char **argv)
{
    struct limits_args a = {0};
    struct charged_error err;
    int rc;

    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        usage(stdout);
        return CTL_OK;
    }
    if (argc < 2 || strcmp(argv[1], "limits") != 0)
        return ctl_say(CTL_USAGE, "provider", NULL,
                       argc < 2 ? "missing subcommand (limits; see --help)"
                                : "unknown subcommand (limits; see --help)");
    if (argc < 3)
        return ctl_say(CTL_USAGE, CMD, NULL, "missing subcommand (show, set)");
    if (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    a.sub = argv[2];
    if (strcmp(a.sub, "show") != 0 && strcmp(a.sub, "set") != 0)
        return ctl_say(CTL_USAGE, CMD, NULL, "unknown subcommand '%s' (show, set)",
                       a.sub);
    if ((rc = parse(argc - 2, argv + 2, &a)) != 0)
        return rc < 0 ? CTL_OK : rc;

    config_t *cfg = ctl_config("provider");
    if (!cfg)
        return CTL_USAGE;
    /* The fleet's account unless told: "default" here showed and set a
     * budget nobody followed on a fleet configured otherwise (adversary 38f). */
    if (!a.account)
        a.account = config_str(cfg, CONFIG_PROVIDER_BUDGET_ACCOUNT);
    budget_lease_t *l = budget_lease_new(config_str(cfg, CONFIG_DATABASE_URL),
                                         a.account, "chargectl", BUDGET_LEASE_MS, &err);
    if (!l) {
        rc = ctl_say(CTL_USAGE, CMD, a.sub, "%s", err.message);
        goto out;
    }
    rc = !strcmp(a.sub, "show") ? limits_show(l, &a) : limits_set(l, &a);
out:
    budget_lease_free(l);
    config_free(cfg);
    return rc;
}
