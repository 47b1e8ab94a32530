/* chargectl audit: the auditor's verdicts, one window's findings, and an
 * audit on demand. */
#include <ctype.h>
#include <getopt.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "audit_run.h"
#include "audit_store.h"
#include "charged_assert.h"
#include "chargectl.h"
#include "decimal.h"
#include "config.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "db.h"
#include "op.h"
#include "provider_client.h"

#define TS(col) "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"

/* clang-format off */
#define WINDOW_COLUMNS                                                                  \
    " id, " TS("window_start") " AS window_start, " TS("window_end") " AS window_end,"  \
    " scheduled, auditor, intents_seen, refunds_seen, ledger_rows_seen, pending,"      \
    " findings, (SELECT coalesce(sum(value::bigint), 0) FROM jsonb_each_text(findings))" \
    "   AS findings_total,"                                                            \
    " (SELECT coalesce(string_agg(key || '=' || value, ' ' ORDER BY key), '-')"        \
    "    FROM jsonb_each_text(findings) WHERE value <> '0') AS found,"                 \
    " " TS("finished_at") " AS finished_at"

static const char *SQL_LIST =
    "SELECT coalesce(json_agg(w ORDER BY w.id DESC), '[]')::text FROM (SELECT"
    WINDOW_COLUMNS " FROM audit_windows"
    " WHERE NOT $2::boolean OR EXISTS (SELECT 1 FROM jsonb_each_text(findings)"
    "   WHERE value <> '0')"
    " ORDER BY id DESC LIMIT $1::int) w";

/* By the verdict's id, or the scheduled window that starts then. */
static const char *SQL_SHOW =
    "SELECT row_to_json(w)::text FROM (SELECT" WINDOW_COLUMNS " FROM audit_windows"
    " WHERE id = $1::bigint OR (scheduled AND window_start = $2::timestamptz)"
    " ORDER BY id LIMIT 1) w";

/* The findings of this window: those whose object was made (or booked) in
 * it, and those an audit of a part of it recorded. */
static const char *SQL_FINDINGS =
    "SELECT coalesce(json_agg(f ORDER BY f.id), '[]')::text FROM (SELECT id, kind,"
    " object_id, payment_attempt_id, order_id, refund_id, other_object_id,"
    " provider_amount, provider_currency, ledger_amount, ledger_currency, detail,"
    " " TS("found_at") " AS found_at FROM audit_findings"
    " WHERE window_start >= $1::timestamptz AND window_end <= $2::timestamptz"
    " ORDER BY id LIMIT $3::int) f";
/* clang-format on */

/* The finding kinds: the auditor's own, then the table's operations'
 * (their audit rules' kinds). */
static void usage_kinds(FILE *out)
{
    struct audit_step_table t;
    char text[2048];
    size_t n = (size_t)snprintf(
        text, sizeof(text),
        "Finding kinds: charged_twice, charged_unbooked, booked_not_charged, "
        "amount_mismatch, currency_mismatch, unknown_intent, refund_unbooked, "
        "refunded_over_charge, booked_foreign, foreign_intent");
    payment_ops_audit_steps(&t);
    for (size_t s = 0; s < t.n; s++) {
        /* One list: every operation's rules judge one kind of intent. */
        CHARGED_ASSERT(t.sets[s]->of && !strcmp(t.sets[s]->of, t.sets[0]->of));
        for (size_t k = 0; k < t.sets[s]->nkinds; k++)
            n += (size_t)snprintf(text + n, sizeof(text) - n, "%s%s%s%s",
                                  s == 0 && k == 0 ? "; of " : ", ",
                                  s == 0 && k == 0 ? t.sets[0]->of : "",
                                  s == 0 && k == 0 ? ": " : "",
                                  audit_kind_name(t.sets[s]->kinds[k]));
        CHARGED_ASSERT(n < sizeof(text));
    }
    snprintf(text + n, sizeof(text) - n,
             " (docs/auditor.md says what to do with each).");
    ctl_wrap(out, "", text, 75);
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl audit list [--findings] [--limit N] [--json]\n"
        "       chargectl audit show WINDOW [--limit N] [--json]\n"
        "       chargectl audit run --since DURATION [--until DURATION] [--json]\n\n"
        "  list           verdicts of audited windows, newest first: what the\n"
        "                 provider listed (intents, refunds), the ledger rows booked\n"
        "                 in the window, objects not judged yet (pending), and the\n"
        "                 findings by kind\n"
        "  show WINDOW    one verdict and the findings recorded in its window, with\n"
        "                 the ids to act on; WINDOW is the verdict's id (from list)\n"
        "                 or a scheduled window's start, 2026-12-01T10:00:00Z\n"
        "  run            audits [now - since, now - until) on the database's clock\n"
        "                 now (rounded up to its second: what was made a moment ago\n"
        "                 is in), against the provider (PROVIDER_API_KEY), and "
        "records\n"
        "                 the verdict; re-reads what the provider changed after its\n"
        "                 scheduled window was audited. Exit 1 on any finding\n"
        "  --since D      how far back: 90s, 30m, 24h, 7d\n"
        "  --until D      where to stop, back from now [0s]\n"
        "  --findings     only verdicts with findings\n"
        "  --limit N      at most N rows [50]\n"
        "  --json         JSON instead of tables\n"
        "  --help         this text\n\n");
    usage_kinds(out);
    fprintf(out, "\n"
                 "Exit status: 0 done (run: no finding); 1 database or provider\n"
                 "unreachable, no such window, or (run) a finding; 2 bad usage.\n");
}

/* Says "chargectl audit [sub]: ..." in one line; returns rc. */
#define say(rc, sub, ...) ctl_say((rc), "audit", (sub), __VA_ARGS__)

/* "90s", "30m", "24h", "7d" -> seconds; -1 when it is not one (at most
 * ten years). */
static long long parse_duration(const char *s)
{
    int64_t n;
    const char *rest;
    if (decimal_parse(s, 315360000, &n, &rest) != 0 || rest == s || strlen(rest) != 1)
        return -1;
    long long unit = *rest == 's'   ? 1
                     : *rest == 'm' ? 60
                     : *rest == 'h' ? 3600
                     : *rest == 'd' ? 86400
                                    : 0;
    if (unit == 0 || n > 315360000 / unit)
        return -1;
    return n * unit;
}

/* YYYY-MM-DDTHH:MM:SSZ, the shape list prints. */
static int good_timestamp(const char *s)
{
    static const char shape[] = "dddd-dd-ddTdd:dd:ddZ";
    if (strlen(s) != sizeof(shape) - 1)
        return 0;
    for (size_t i = 0; shape[i]; i++)
        if (shape[i] == 'd' ? !isdigit((unsigned char)s[i]) : s[i] != shape[i])
            return 0;
    return 1;
}

static void print_verdict(json_t *w)
{
    const char *keys[] = {"id",      "window_start", "window_end",   "scheduled",
                          "auditor", "intents_seen", "refunds_seen", "ledger_rows_seen",
                          "pending", "found",        "finished_at",  NULL};
    for (size_t i = 0; keys[i]; i++) {
        char buf[512];
        const char *s = ctl_cell(w, keys[i], buf, sizeof(buf));
        printf("%-17s %s\n", keys[i], s ? s : "-");
    }
}

static void print_findings(json_t *rows)
{
    const char *h[] = {"KIND",  "OBJECT",          "ATTEMPT",       "ORDER",
                       "OTHER", "PROVIDER_AMOUNT", "LEDGER_AMOUNT", NULL};
    const char *k[] = {"kind",
                       "object_id",
                       "payment_attempt_id",
                       "order_id",
                       "other_object_id",
                       "provider_amount@provider_currency",
                       "ledger_amount@ledger_currency",
                       NULL};
    ctl_print_rows(rows, h, k);
}

static int audit_list(PGconn *conn, int only_findings, const char *limit, int as_json)
{
    struct charged_error err;
    const char *p[2] = {limit, only_findings ? "true" : "false"};
    int missing;
    json_t *rows = ctl_query_json(conn, SQL_LIST, 2, p, &missing, &err);
    if (!rows)
        return say(CTL_FAILED, "list", "%s", err.message);
    if (as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    const char *h[] = {"ID",      "WINDOW_START", "WINDOW_END", "INTENTS",
                       "REFUNDS", "LEDGER_ROWS",  "PENDING",    "FINDINGS"};
    const char *k[] = {"id",           "window_start",     "window_end", "intents_seen",
                       "refunds_seen", "ledger_rows_seen", "pending",    "found"};
    /* ctl_print_rows takes 8 columns at most: exactly these. */
    const char *hh[9], *kk[9];
    memcpy(hh, h, sizeof(h));
    memcpy(kk, k, sizeof(k));
    hh[8] = kk[8] = NULL;
    ctl_print_rows(rows, hh, kk);
    json_decref(rows);
    return CTL_OK;
}

/* The window's findings, by the verdict's own bounds. */
static json_t *window_findings(PGconn *conn, json_t *w, const char *limit,
                               struct charged_error *err)
{
    int missing;
    const char *p[3] = {json_string_value(json_object_get(w, "window_start")),
                        json_string_value(json_object_get(w, "window_end")), limit};
    return ctl_query_json(conn, SQL_FINDINGS, 3, p, &missing, err);
}

static int audit_show(PGconn *conn, const char *window, const char *limit, int as_json)
{
    struct charged_error err;
    int missing;
    int by_id = window[strspn(window, "0123456789")] == '\0';
    const char *p[2] = {by_id ? window : NULL, by_id ? NULL : window};
    json_t *w = ctl_query_json(conn, SQL_SHOW, 2, p, &missing, &err);
    if (!w)
        return missing ? say(CTL_FAILED, "show", "no audited window %s", window)
                       : say(CTL_FAILED, "show", "%s", err.message);
    json_t *rows = window_findings(conn, w, limit, &err);
    if (!rows) {
        json_decref(w);
        return say(CTL_FAILED, "show", "%s", err.message);
    }
    if (as_json) {
        json_object_set_new(w, "finding_rows", rows);
        ctl_print_json(stdout, w);
        return CTL_OK;
    }
    print_verdict(w);
    printf("\nfindings:\n");
    print_findings(rows);
    json_decref(rows);
    json_decref(w);
    return CTL_OK;
}

static const char *os_user(void)
{
    struct passwd *pw = getpwuid(getuid());
    return pw && pw->pw_name ? pw->pw_name : "unknown";
}

static int audit_run(PGconn *conn, const config_t *cfg, long long since,
                     long long until, const char *limit, int as_json)
{
    char actor[160], sid[32];
    struct charged_error perr, why, serr;
    struct audit_run_result res;
    long long now_ms = 0;
    int recorded = 0, rc = CTL_FAILED;
    provider_client_t *pc = ctl_provider_open(cfg, BUDGET_PRIO_AUDIT, &perr);
    if (!pc)
        return say(CTL_USAGE, "run", "%s", perr.message);
    audit_store_t *st = audit_store_new(config_str(cfg, CONFIG_DATABASE_URL), &serr);
    json_t *w = NULL, *rows = NULL;
    if (!st) {
        say(CTL_FAILED, "run", "%s", serr.message);
        goto out;
    }
    /* The database's clock, as the scheduled windows and the ledger use. */
    if (audit_store_now(st, &now_ms, &serr) != CHARGED_OK) {
        say(CTL_FAILED, "run", "%s", serr.message);
        goto out;
    }
    /* Until now, this second included: the provider's creation times are
     * whole seconds, and what it made a moment ago is in this one. */
    long long now_s = (now_ms + 999) / 1000;
    long long end = now_s - until, start = now_s - since;
    snprintf(actor, sizeof(actor), "chargectl:%s", os_user());
    struct audit_step_table steps;
    payment_ops_audit_steps(&steps);
    /* A throttled request is asked again within the bound of its budget
     * wait: an operator's audit is slowed by a 429, not failed by one. */
    const struct audit_run_hooks hooks = {.throttled_wait_ms = CTL_BUDGET_WAIT_MS};
    if (audit_run_window(pc, st, start, end, 0, actor, &steps, &hooks, &res, &recorded,
                         &why) != CHARGED_OK) {
        say(CTL_FAILED, "run", "window not audited: %s", why.message);
        goto out;
    }
    long long total = 0;
    for (int k = 0; k < AUDIT_KIND__COUNT; k++)
        total += res.verdict.findings[k];
    /* The verdict as recorded, then the findings of its window. */
    struct charged_error err;
    int missing;
    snprintf(sid, sizeof(sid), "%lld", res.verdict_id);
    const char *p[2] = {sid, NULL};
    w = ctl_query_json(conn, SQL_SHOW, 2, p, &missing, &err);
    rows = w ? window_findings(conn, w, limit, &err) : NULL;
    if (!w || !rows) {
        say(CTL_FAILED, "run", "%s", err.message);
        goto out;
    }
    if (as_json) {
        json_t *fresh = json_object();
        for (int k = 0; k < AUDIT_KIND__COUNT; k++)
            json_object_set_new(fresh, audit_kind_name((enum audit_kind)k),
                                json_integer(res.fresh[k]));
        json_object_set_new(w, "new_findings", fresh);
        json_object_set(w, "finding_rows", rows);
        ctl_print_json(stdout, w); /* takes w */
        w = NULL;
    } else {
        print_verdict(w);
        printf("\nfindings:\n");
        print_findings(rows);
    }
    rc = total > 0 ? CTL_FAILED : CTL_OK;
    if (total > 0)
        say(CTL_FAILED, "run", "%lld finding(s) in the window", total);
out:
    json_decref(w);
    json_decref(rows);
    audit_store_free(st);
    ctl_provider_close(pc);
    return rc;
}

/* What `audit list|show|run` was asked. */
struct audit_cli {
    const char *sub, *window;
    long long since, until;
    char limit[32];
    int as_json, only_findings, have_until, list, show, run;
};

/* One option into cli; -1 to go on, else the exit status (--help, or a
 * bad value, said). */
static int take_option(int c, const char *arg, struct audit_cli *cli)
{
    int64_t n;
    switch (c) {
    case 's':
        if ((cli->since = parse_duration(arg)) <= 0)
            return say(CTL_USAGE, cli->sub,
                       "--since '%s' is not a duration (90s, 30m, 24h, 7d)", arg);
        return -1;
    case 'u':
        if ((cli->until = parse_duration(arg)) < 0)
            return say(CTL_USAGE, cli->sub,
                       "--until '%s' is not a duration (90s, 30m, 24h, 7d)", arg);
        cli->have_until = 1;
        return -1;
    case 'l':
        if (decimal_parse(arg, 100000, &n, NULL) != 0 || n < 1)
            return say(CTL_USAGE, cli->sub, "--limit '%s' must be 1..100000", arg);
        snprintf(cli->limit, sizeof(cli->limit), "%lld", (long long)n);
        return -1;
    case 'f':
        cli->only_findings = 1;
        return -1;
    case 'j':
        cli->as_json = 1;
        return -1;
    default: /* 'h' */
        usage(stdout);
        return CTL_OK;
    }
}

/* The options (argv[0] is the subcommand); -1 to go on, else the exit
 * status. */
static int parse_options(int argc, char **argv, struct audit_cli *cli)
{
    static const struct option opts[] = {
        {"since", required_argument, NULL, 's'},
        {"until", required_argument, NULL, 'u'},
        {"limit", required_argument, NULL, 'l'},
        {"findings", no_argument, NULL, 'f'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc;
    optind = 1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == '?') {
            /* argv[0] is the subcommand: the option just read is
             * argv[optind - 1]. */
            const char *bad = argv[optind - 1];
            if (optopt && strchr("sul", optopt) && !strchr(bad, '='))
                return say(CTL_USAGE, cli->sub, "%s needs a value", bad);
            return ctl_bad_option("audit", bad);
        }
        if ((rc = take_option(c, optarg, cli)) >= 0)
            return rc;
    }
    return -1;
}

/* The positional arguments and options fit the subcommand: -1, or
 * CTL_USAGE (said). extra is the argument after the window. */
static int check_args(const struct audit_cli *cli, int nargs, const char *extra)
{
    const char *sub = cli->sub, *window = cli->window;
    if (cli->show) {
        if (nargs != 1)
            return nargs == 0 ? say(CTL_USAGE, sub, "give one WINDOW (see --help)")
                              : ctl_unexpected_argument("audit show", extra);
        int by_id = *window && window[strspn(window, "0123456789")] == '\0' &&
                    strlen(window) <= 18;
        if (!by_id && !good_timestamp(window))
            return say(CTL_USAGE, sub,
                       "'%s' is neither a verdict id nor a window start "
                       "(2026-12-01T10:00:00Z)",
                       window);
    } else if (nargs != 0) {
        return ctl_unexpected_argument(cli->list ? "audit list" : "audit run", window);
    }
    if (!cli->run && (cli->since >= 0 || cli->have_until))
        return say(CTL_USAGE, sub, "--since and --until are for run");
    if (!cli->list && cli->only_findings)
        return say(CTL_USAGE, sub, "--findings is for list");
    if (cli->run) {
        if (cli->since < 0)
            return say(CTL_USAGE, sub, "needs --since DURATION (24h, say)");
        if (cli->until >= cli->since)
            return say(CTL_USAGE, sub, "--until must be less far back than --since");
    }
    return -1;
}

/* Connects and runs the subcommand (run needs the provider's key). */
static int audit_dispatch(const config_t *cfg, const struct audit_cli *cli)
{
    struct charged_error err;
    int rc;
    const char *key = config_str(cfg, CONFIG_PROVIDER_API_KEY);
    if (cli->run && (!key || !*key))
        return say(CTL_USAGE, "run",
                   "PROVIDER_API_KEY is not set: run asks the provider");
    PGconn *conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &err);
    if (!conn)
        return say(CTL_FAILED, NULL, "%s", err.message);
    if (cli->list)
        rc = audit_list(conn, cli->only_findings, cli->limit, cli->as_json);
    else if (cli->show)
        rc = audit_show(conn, cli->window, cli->limit, cli->as_json);
    else
        rc = audit_run(conn, cfg, cli->since, cli->until, cli->limit, cli->as_json);
    PQfinish(conn);
    return rc;
}

int ctl_audit(int argc, char **argv)
{
    struct audit_cli cli = {.since = -1, .until = 0, .limit = "50"};
    int rc;

    if (argc < 2)
        return say(CTL_USAGE, NULL, "missing subcommand (list, show, run; see --help)");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    cli.sub = argv[1];
    cli.list = !strcmp(cli.sub, "list");
    cli.show = !strcmp(cli.sub, "show");
    cli.run = !strcmp(cli.sub, "run");
    if (!cli.list && !cli.show && !cli.run)
        return say(CTL_USAGE, NULL, "unknown subcommand '%s' (list, show, run)",
                   cli.sub);
    if ((rc = parse_options(argc - 1, argv + 1, &cli)) >= 0)
        return rc;
    int nargs = argc - 1 - optind;
    cli.window = nargs >= 1 ? argv[1 + optind] : NULL;
    if ((rc = check_args(&cli, nargs, nargs > 1 ? argv[2 + optind] : NULL)) >= 0)
        return rc;
    config_t *cfg = ctl_config("audit");
    if (!cfg)
        return CTL_USAGE;
    rc = audit_dispatch(cfg, &cli);
    config_free(cfg);
    return rc;
}
