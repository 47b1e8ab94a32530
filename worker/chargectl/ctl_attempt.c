/* chargectl attempt: what happened to a payment attempt, without SQL. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_history.h"
#include "charged_assert.h"
#include "attempt_status.h"
#include "charge_command.h"
#include "chargectl.h"
#include "decimal.h"
#include "config.h"
#include "clock.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "db.h"
#include "log.h"
#include "op.h"

/* What `show` prints, its steps those of the table's operations. */
static void usage_show(FILE *out)
{
    struct attempt_history_table t;
    char steps[512] = "", text[1024];
    size_t n = 0;
    payment_ops_history(&t);
    for (size_t i = 0; i < t.n; i++) {
        /* One story: every operation's steps are of one kind of attempt. */
        CHARGED_ASSERT(t.steps[i]->whose &&
                       !strcmp(t.steps[i]->whose, t.steps[0]->whose));
        n += (size_t)snprintf(steps + n, sizeof(steps) - n, "%s%s",
                              i == 0         ? ""
                              : i + 1 == t.n ? " and "
                                             : ", ",
                              t.steps[i]->key);
        CHARGED_ASSERT(n < sizeof(steps));
    }
    int len =
        snprintf(text, sizeof(text),
                 "the attempt, every status transition with its cause and "
                 "evidence, every provider call with its outcome, its ledger "
                 "entries, its result events, its refunds (and refunded_amount, "
                 "refund_reserved)%s%s%s%s",
                 t.n ? "; " : "", t.n ? t.steps[0]->whose : "", t.n ? " " : "", steps);
    CHARGED_ASSERT(len > 0 && (size_t)len < sizeof(text));
    if (t.n)
        snprintf(text + len, sizeof(text) - (size_t)len,
                 ", and their transitions in one time order with the attempt's");
    fputs("  show           ", out);
    ctl_wrap(out, "                 ", text, 58);
}

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl attempt show PAYMENT_ATTEMPT_ID [--json]\n"
        "       chargectl attempt list [--order UUID] [--status S] [--older-than D]\n"
        "                              [--limit N] [--json]\n"
        "       chargectl attempt resolve PAYMENT_ATTEMPT_ID (--succeeded PI | "
        "--failed)\n"
        "                              [--reason TEXT] [--actor NAME] [--force] "
        "[--json]\n\n");
    usage_show(out);
    fprintf(out,
            "  list           attempts, most recently updated first; --status\n"
            "                 REQUIRES_REVIEW is the review queue\n"
            "  resolve        settle an attempt in review, after asking the provider\n"
            "                 (see chargectl attempt resolve --help)\n"
            "  --order UUID   only this order's attempts\n"
            "  --status S     one of:");
    for (int i = 0; i < ATTEMPT_STATUS__COUNT; i++)
        fprintf(out, " %s", attempt_status_name(i));
    fprintf(out,
            "\n"
            "  --older-than D not updated for D (30s, 15m, 2h, 7d): stuck ones\n"
            "  --limit N      at most N rows [50]\n"
            "  --json         JSON instead of tables\n"
            "  --help         this text\n\n"
            "Exit status: 0 done, 1 database unreachable or no such attempt (resolve:\n"
            "also refused), 2 bad usage.\n");
}

/* "<noun> <id>" or "attempt": which step a row is. */
static void label(json_t *row, const char *step, const char *id)
{
    char buf[96];
    if (!strcmp(step, "attempt"))
        snprintf(buf, sizeof(buf), "attempt");
    else
        snprintf(buf, sizeof(buf), "%s %s", step, id ? id : "?");
    json_object_set_new(row, "step_label", json_string(buf));
}

/* The operations' steps of the attempt as one table's rows, each
 * labelled, in the currency of the attempt (a step may have none of its
 * own). */
static json_t *step_rows(json_t *story, const struct attempt_history_table *t,
                         const char *currency)
{
    json_t *rows = json_array(), *c;
    size_t i;
    CHARGED_ASSERT(story != NULL && t != NULL);
    for (size_t k = 0; rows && k < t->n; k++)
        json_array_foreach(json_object_get(story, t->steps[k]->key), i, c)
        {
            json_t *r = json_deep_copy(c);
            if (!r)
                continue;
            json_object_del(r, "transitions");
            label(r, t->steps[k]->noun,
                  json_string_value(json_object_get(c, t->steps[k]->id_key)));
            if (!json_object_get(r, "currency") ||
                json_is_null(json_object_get(r, "currency")))
                json_object_set_new(r, "currency",
                                    json_string(currency ? currency : ""));
            json_array_append_new(rows, r);
        }
    return rows;
}

/* The steps' keys as words: "a", "a and b", "a, b and c", each followed
 * by suffix. */
static void print_keys(const struct attempt_history_table *t, const char *suffix)
{
    for (size_t k = 0; k < t->n; k++)
        printf("%s%s%s",
               k == 0         ? ""
               : k + 1 < t->n ? ", "
                              : " and ",
               t->steps[k]->key, suffix);
}

/* The columns of the steps' table: STEP, STATUS, AMOUNT, each operation's
 * own, REASON, UPDATED_AT (heads and members, NULL-ended, in h and m). */
#define STEP_COLUMNS_MAX 32
static void step_columns(const struct attempt_history_table *t, const char **h,
                         const char **m)
{
    static const char *const first_h[] = {"STEP", "STATUS", "AMOUNT"},
                             *first_m[] = {"step_label", "status", "amount@currency"};
    size_t n = 0;
    for (; n < 3; n++) {
        h[n] = first_h[n];
        m[n] = first_m[n];
    }
    for (size_t k = 0; k < t->n; k++)
        for (size_t c = 0; t->steps[k]->heads[c]; c++, n++) {
            CHARGED_ASSERT(n + 3 < STEP_COLUMNS_MAX && t->steps[k]->members[c]);
            h[n] = t->steps[k]->heads[c];
            m[n] = t->steps[k]->members[c];
        }
    h[n] = "REASON", m[n++] = "reason";
    h[n] = "UPDATED_AT", m[n++] = "updated_at";
    h[n] = m[n] = NULL;
}

/* The text form of show's steps: the attempt's and its steps' transitions
 * in one time order, then the steps themselves. */
static void print_steps(json_t *story, json_t *a, const struct attempt_history_table *t)
{
    json_t *timeline = json_object_get(story, "timeline"), *e;
    const char *sh[STEP_COLUMNS_MAX], *sk[STEP_COLUMNS_MAX];
    size_t i;
    json_array_foreach(timeline, i, e)
        label(e, json_string_value(json_object_get(e, "step")),
              json_string_value(json_object_get(e, "step_id")));
    printf("\ntransitions (the attempt's and its ");
    print_keys(t, "'");
    printf("):\n");
    const char *th[] = {"AT",    "STEP",   "FROM",     "TO", "CAUSE",
                        "ACTOR", "REASON", "EVIDENCE", NULL};
    const char *tk[] = {"at",    "step_label", "old_status", "new_status", "cause",
                        "actor", "reason",     "evidence",   NULL};
    ctl_print_rows(timeline, th, tk);
    json_t *rows =
        step_rows(story, t, json_string_value(json_object_get(a, "currency")));
    printf("\n");
    print_keys(t, "");
    printf(":\n");
    step_columns(t, sh, sk);
    ctl_print_rows(rows, sh, sk);
    json_decref(rows);
}

static int attempt_show(PGconn *conn, const char *id, int as_json)
{
    struct charged_error err;
    json_t *story;
    struct attempt_history_table t;
    size_t steps = 0;
    payment_ops_history(&t);
    enum charged_rc rc = attempt_history_read(conn, id, &t, &story, &err);
    if (rc != CHARGED_OK) {
        if (rc == CHARGED_NOT_FOUND)
            fprintf(stderr, "chargectl attempt show: no attempt %s\n", id);
        else
            fprintf(stderr, "chargectl attempt show: %s\n", err.message);
        return CTL_FAILED;
    }
    json_t *a = json_object_get(story, "attempt");
    json_t *tr = json_object_get(story, "transitions");
    json_t *calls = json_object_get(story, "provider_calls");
    json_t *ledger = json_object_get(story, "ledger_entries");
    json_t *events = json_object_get(story, "result_events");
    json_t *refunds = json_object_get(story, "refunds");
    if (as_json) {
        /* The attempt's row with its story inside, as it always was: the
         * call log beside the row's provider_calls count. */
        json_object_set(a, "transitions", tr);
        json_object_set(a, "provider_call_log", calls);
        json_object_set(a, "ledger_entries", ledger);
        json_object_set(a, "result_events", events);
        json_object_set(a, "refunds", refunds);
        /* The operations' steps (issue 37): added, nothing above moved. */
        for (size_t k = 0; k < t.n; k++)
            json_object_set(a, t.steps[k]->key,
                            json_object_get(story, t.steps[k]->key));
        json_object_set(a, "timeline", json_object_get(story, "timeline"));
        ctl_print_json(stdout, json_incref(a));
        json_decref(story);
        return CTL_OK;
    }
    ctl_print_object(a);
    for (size_t k = 0; k < t.n; k++)
        steps += json_array_size(json_object_get(story, t.steps[k]->key));
    if (steps > 0) {
        print_steps(story, a, &t);
    } else {
        printf("\ntransitions:\n");
        const char *th[] = {"AT",    "FROM",   "TO",       "CAUSE",
                            "ACTOR", "REASON", "EVIDENCE", NULL};
        const char *tk[] = {"at",    "old_status", "new_status", "cause",
                            "actor", "reason",     "evidence",   NULL};
        ctl_print_rows(tr, th, tk);
    }
    printf("\nprovider calls:\n");
    const char *ch[] = {"STARTED_AT", "OPERATION",  "OUTCOME", "HTTP", "REPLAYED",
                        "LATENCY_MS", "PAYMENT_ID", "ERROR",   NULL};
    const char *ck[] = {"started_at",          "operation", "outcome",
                        "http_status",         "replayed",  "latency_ms",
                        "provider_payment_id", "error",     NULL};
    ctl_print_rows(calls, ch, ck);
    printf("\nledger entries:\n");
    const char *lh[] = {"CREATED_AT", "KIND", "AMOUNT", "PAYMENT_ID", NULL};
    const char *lk[] = {"created_at", "kind", "amount@currency", "provider_payment_id",
                        NULL};
    ctl_print_rows(ledger, lh, lk);
    printf("\nresult events:\n");
    const char *eh[] = {"CREATED_AT", "TYPE", "EVENT_ID", "PUBLISHED_AT", NULL};
    const char *ek[] = {"created_at", "event_type", "event_id", "published_at", NULL};
    ctl_print_rows(events, eh, ek);
    printf("\nrefunds:\n");
    /* WAITING: held back before its call (docs/states.md, "Waiting"). */
    const char *rh[] = {"REFUND",        "STATUS",           "AMOUNT",
                        "REFUND_REASON", "REFUND_ID_AT_PSP", "UPDATED_AT",
                        "REASON",        "WAITING",          NULL};
    const char *rk[] = {"refund_id",
                        "status",
                        "amount@currency",
                        "refund_reason",
                        "provider_refund_id",
                        "updated_at",
                        "reason",
                        "waiting_reason",
                        NULL};
    ctl_print_rows(refunds, rh, rk);
    json_decref(story);
    return CTL_OK;
}

static int attempt_list(PGconn *conn, const struct attempt_history_filter *f,
                        int as_json)
{
    struct charged_error err;
    json_t *rows;
    if (attempt_history_list(conn, f, &rows, &err) != CHARGED_OK) {
        fprintf(stderr, "chargectl attempt list: %s\n", err.message);
        return CTL_FAILED;
    }
    if (as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    const char *h[] = {"ATTEMPT",    "ORDER",  "STATUS", "AMOUNT",
                       "UPDATED_AT", "REASON", NULL};
    const char *k[] = {"payment_attempt_id", "order_id", "status", "amount@currency",
                       "updated_at",         "reason",   NULL};
    ctl_print_rows(rows, h, k);
    json_decref(rows);
    return CTL_OK;
}

/* What `attempt show|list` was asked: the filter's texts live here. */
struct attempt_args {
    const char *order, *status;
    char older[32], limit[32];
    int have_older, have_limit, as_json;
};

/* One option of show|list into a; -1 to go on, else the exit status
 * (--help, or a bad value already said). */
static int take_option(int c, const char *arg, struct attempt_args *a)
{
    int64_t v;
    switch (c) {
    case 'o':
        if (!charge_command_is_uuid(arg)) {
            fprintf(stderr, "chargectl attempt: --order '%s' is not a UUID\n", arg);
            return CTL_USAGE;
        }
        a->order = arg;
        return -1;
    case 's':
        if (attempt_status_parse(arg) < 0) {
            fprintf(stderr, "chargectl attempt: --status '%s' is not a status\n", arg);
            return CTL_USAGE;
        }
        a->status = arg;
        return -1;
    case 'a':
        if (clock_parse_duration_ms(arg, &v) != 0) {
            fprintf(stderr,
                    "chargectl attempt: --older-than '%s' is not a duration (30s, 15m, "
                    "2h, 7d)\n",
                    arg);
            return CTL_USAGE;
        }
        snprintf(a->older, sizeof(a->older), "%lld", (long long)v);
        a->have_older = 1;
        return -1;
    case 'l':
        if (decimal_parse(arg, 100000, &v, NULL) != 0 || v < 1) {
            fprintf(stderr, "chargectl attempt: --limit '%s' must be 1..100000\n", arg);
            return CTL_USAGE;
        }
        snprintf(a->limit, sizeof(a->limit), "%lld", (long long)v);
        a->have_limit = 1;
        return -1;
    case 'j':
        a->as_json = 1;
        return -1;
    default: /* 'h' */
        usage(stdout);
        return CTL_OK;
    }
}

/* The options of show|list (argv[0] is the subcommand); -1 to go on, else
 * the exit status. */
static int parse_options(int argc, char **argv, struct attempt_args *a)
{
    static const struct option opts[] = {
        {"order", required_argument, NULL, 'o'},
        {"status", required_argument, NULL, 's'},
        {"older-than", required_argument, NULL, 'a'},
        {"limit", required_argument, NULL, 'l'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c, rc;
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        /* argv[0] is the subcommand: the option just read is argv[optind - 1]. */
        if (c == '?')
            return ctl_bad_option("attempt", argv[optind - 1]);
        if ((rc = take_option(c, optarg, a)) >= 0)
            return rc;
    }
    return -1;
}

/* The positional arguments fit the subcommand: -1, or CTL_USAGE (said). */
static int check_args(const char *sub, int nargs, const char *id,
                      const struct attempt_args *a)
{
    if (strcmp(sub, "show") != 0) {
        if (nargs == 0)
            return -1;
        fprintf(stderr, "chargectl attempt list: takes no positional argument\n");
        return CTL_USAGE;
    }
    if (nargs != 1 || a->order || a->status || a->have_older || a->have_limit) {
        fprintf(stderr,
                "chargectl attempt show: give one PAYMENT_ATTEMPT_ID (and "
                "optionally --json)%s\n",
                a->order        ? "; --order is for list"
                : a->status     ? "; --status is for list"
                : a->have_older ? "; --older-than is for list"
                : a->have_limit ? "; --limit is for list"
                                : "");
        return CTL_USAGE;
    }
    if (!charge_command_is_uuid(id)) {
        fprintf(stderr, "chargectl attempt show: '%s' is not a UUID\n", id);
        return CTL_USAGE;
    }
    return -1;
}

/* Connects and runs show or list. */
static int attempt_run(const char *sub, const char *id, const struct attempt_args *a)
{
    struct charged_error err;
    int rc;
    config_t *cfg = ctl_config("attempt");
    if (!cfg)
        return CTL_USAGE;
    PGconn *conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &err);
    if (!conn) {
        fprintf(stderr, "chargectl attempt: %s\n", err.message);
        config_free(cfg);
        return CTL_FAILED;
    }
    if (!strcmp(sub, "show"))
        rc = attempt_show(conn, id, a->as_json);
    else
        rc = attempt_list(conn,
                          &(struct attempt_history_filter){
                              .order_id = a->order,
                              .status = a->status,
                              .older_than_ms = a->have_older ? a->older : NULL,
                              .limit = a->limit,
                          },
                          a->as_json);
    PQfinish(conn);
    config_free(cfg);
    return rc;
}

int ctl_attempt(int argc, char **argv)
{
    struct attempt_args a = {.limit = "50"};
    int rc;

    if (argc < 2) {
        fprintf(stderr,
                "chargectl attempt: missing subcommand (show, list, resolve; see "
                "--help)\n");
        return CTL_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    const char *sub = argv[1];
    if (!strcmp(sub, "resolve"))
        return ctl_attempt_resolve(argc - 1, argv + 1);
    if (strcmp(sub, "show") && strcmp(sub, "list")) {
        fprintf(stderr,
                "chargectl attempt: unknown subcommand '%s' (show, list, resolve)\n",
                sub);
        return CTL_USAGE;
    }
    if ((rc = parse_options(argc - 1, argv + 1, &a)) >= 0)
        return rc;
    int nargs = argc - 1 - optind;
    const char *id = nargs == 1 ? argv[1 + optind] : NULL;
    if ((rc = check_args(sub, nargs, id, &a)) >= 0)
        return rc;
    return attempt_run(sub, id, &a);
}
