/* chargectl attempt resolve: a person decides whether an attempt that
 * automation left in REQUIRES_REVIEW was charged (SUCCEEDED) or not (FAILED).
 * The decision itself is attempt_review's (worker/operations/charge), which the console
 * shares; this is its command line: the arguments, the settings, the
 * sessions, and what is printed. */
#include <ctype.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "attempt_review.h"
#include "attempt_status.h"
#include "attempt_store.h"
#include "chargectl.h"
#include "config.h"
#include "ctl_output.h"
#include "db.h"
#include "provider_client.h"

#define CMD "attempt resolve"

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl attempt resolve PAYMENT_ATTEMPT_ID --succeeded "
        "PAYMENT_INTENT_ID\n"
        "                                 [--reason TEXT] [--actor NAME] [--force] "
        "[--json]\n"
        "       chargectl attempt resolve PAYMENT_ATTEMPT_ID --failed --reason TEXT\n"
        "                                 [--actor NAME] [--force] [--json]\n\n"
        "Settles an attempt in REQUIRES_REVIEW (the queue: chargectl attempt list\n"
        "--status REQUIRES_REVIEW). The provider is asked first:\n"
        "  --succeeded PI   the provider charged it, as intent PI: PI must exist, be\n"
        "                   succeeded, have the attempt's amount and be the intent\n"
        "                   the provider lists for this attempt, and be proven\n"
        "                   this attempt's: recorded from its own call, or the\n"
        "                   answer to that call under its key. One that only\n"
        "                   names the attempt (metadata is anyone's to write) is\n"
        "                   not proven; one recorded for another attempt, or\n"
        "                   naming another attempt or order, is another's. Books\n"
        "                   the charge (ledger entry) and publishes charge.succeeded\n"
        "  --failed         no money moved: the provider must have no succeeded or\n"
        "                   processing intent for this attempt (searched by its id,\n"
        "                   found on the provider's list of the intents created\n"
        "                   while its key could be used, every page, and its\n"
        "                   recorded intent looked up). Publishes charge.failed\n"
        "  --reason TEXT    why; required with --failed [resolved by operator]\n"
        "  --actor NAME     who decides [the OS user]\n"
        "  --force          resolve although the provider contradicts the decision,\n"
        "                   does not answer or may not be up to date, or the\n"
        "                   intent is not proven this attempt's; the evidence\n"
        "                   records it. Never books an intent booked for another\n"
        "                   attempt\n"
        "  --json           JSON instead of text\n"
        "  --help           this text\n\n"
        "The transition is recorded with cause operator, the actor, the reason and\n"
        "the provider's answers as evidence; the look-ups as provider calls.\n"
        "The provider's search lags behind its charges: until the attempt's last\n"
        "provider call is RECONCILER_SEARCH_LAG_MS old [60000], what it does not\n"
        "list is no evidence, and resolve asks to be run again later; the list\n"
        "(consistent) covers WORKER_KEY_RETENTION_MS [86400000] from the\n"
        "attempt's first call.\n"
        "Needs PROVIDER_API_KEY (and PROVIDER_BASE_URL, PROVIDER_TIMEOUT_MS,\n"
        "PROVIDER_API_VERSION) besides DATABASE_URL.\n\n"
        "Exit status: 0 resolved; 1 refused (not in review, the provider contradicts,\n"
        "does not answer or may not be up to date, the intent is another's or not\n"
        "proven this attempt's), no such attempt, database unreachable; 2 bad\n"
        "usage.\n");
}

static int usage_error(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chargectl " CMD ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CTL_USAGE;
}

static int failure(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chargectl " CMD ": ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return CTL_FAILED;
}

/* attempt_review_check's why, in the options' terms: it begins with the
 * field it faults. */
static int check_error(const char *why)
{
    static const struct {
        const char *field, *option;
    } names[] = {
        {"attempt id ", ""},
        {"intent id ", "--succeeded "},
        {"reason ", "--reason "},
        {"actor ", "--actor "},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        size_t n = strlen(names[i].field);
        if (!strncmp(why, names[i].field, n))
            return usage_error("%s%s", names[i].option, why + n);
    }
    return usage_error("%s", why);
}

struct resolve_args {
    char id[37];        /* in lower case, as it is stored and printed */
    const char *intent; /* --succeeded, else NULL */
    int failed;
    const char *reason;
    const char *actor;
    int force, as_json;
};

/* 0, or an exit status with the reason said. */
static int parse_args(int argc, char **argv, struct resolve_args *ra)
{
    static const struct option opts[] = {
        {"succeeded", required_argument, NULL, 's'},
        {"failed", no_argument, NULL, 'f'},
        {"reason", required_argument, NULL, 'r'},
        {"actor", required_argument, NULL, 'a'},
        {"force", no_argument, NULL, 'F'},
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;

    memset(ra, 0, sizeof(*ra));
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's':
            if (ra->intent)
                return usage_error("--succeeded given twice");
            ra->intent = optarg;
            break;
        case 'f':
            ra->failed = 1;
            break;
        case 'r':
            ra->reason = optarg;
            break;
        case 'a':
            ra->actor = optarg;
            break;
        case 'F':
            ra->force = 1;
            break;
        case 'j':
            ra->as_json = 1;
            break;
        case 'h':
            usage(stdout);
            return -1;
        default: {
            const char *bad = argv[optind - 1];
            if ((optopt == 's' || optopt == 'r' || optopt == 'a') &&
                !strncmp(bad, "--", 2) && !strchr(bad, '='))
                return usage_error("%s needs a value", bad);
            return ctl_bad_option(CMD, bad);
        }
        }
    }
    if (argc - optind != 1)
        return argc - optind == 0
                   ? usage_error("give one PAYMENT_ATTEMPT_ID (see --help)")
                   : ctl_unexpected_argument(CMD, argv[optind + 1]);
    const char *id = argv[optind];
    if (!!ra->intent == ra->failed)
        return usage_error("give one of --succeeded PAYMENT_INTENT_ID or --failed");
    if (ra->failed && !ra->reason)
        return usage_error(
            "--failed needs --reason TEXT: say how you know no money moved");
    if (!ra->reason)
        ra->reason = ATTEMPT_REVIEW_DEFAULT_REASON;
    if (!ra->actor && !(ra->actor = ctl_os_user()))
        return usage_error("cannot tell who you are: give --actor NAME");
    char why[256];
    struct attempt_review_request rq = {.attempt_id = id,
                                        .intent_id = ra->intent,
                                        .reason = ra->reason,
                                        .actor = ra->actor};
    if (attempt_review_check(&rq, why, sizeof(why)) != 0)
        return check_error(why);
    /* A UUID: 36 characters, in either case. */
    snprintf(ra->id, sizeof(ra->id), "%s", id);
    for (char *p = ra->id; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    return 0;
}

static json_t *str_or_null(const char *s)
{
    return s && *s ? json_string(s) : json_null();
}

static void print_result(const struct resolve_args *ra,
                         const struct attempt_review_result *res)
{
    if (ra->as_json) {
        json_t *o = json_object();
        if (!o)
            return;
        json_object_set_new(o, "payment_attempt_id", json_string(ra->id));
        json_object_set_new(o, "old_status", json_string(ATTEMPT_S_REQUIRES_REVIEW));
        json_object_set_new(o, "status", json_string(res->status));
        json_object_set_new(o, "provider_payment_id",
                            str_or_null(res->provider_payment_id));
        json_object_set_new(o, "cause", json_string("operator"));
        json_object_set_new(o, "actor", json_string(ra->actor));
        json_object_set_new(o, "reason", json_string(ra->reason));
        json_object_set_new(o, "evidence", json_incref(res->evidence));
        ctl_print_json(stdout, o);
        return;
    }
    printf("%-20s %s\n", "payment_attempt_id", ra->id);
    printf("%-20s %s -> %s\n", "status", ATTEMPT_S_REQUIRES_REVIEW, res->status);
    printf("%-20s %s\n", "provider_payment_id",
           res->provider_payment_id[0] ? res->provider_payment_id : "-");
    printf("%-20s %s\n", "actor", ra->actor);
    printf("%-20s %s\n", "reason", ra->reason);
    if (!res->forced)
        printf("%-20s agrees\n", "provider");
    else
        printf("%-20s %s: %s (resolved with --force)\n", "provider", res->verdict,
               res->provider_says);
}

int ctl_attempt_resolve(int argc, char **argv)
{
    struct resolve_args ra;
    struct attempt_review_result res = {0};
    struct charged_error db_err, err;
    int rc;
    PGconn *conn = NULL;
    provider_client_t *pc = NULL;
    attempt_store_t *st = NULL;

    if ((rc = parse_args(argc, argv, &ra)) != 0)
        return rc < 0 ? CTL_OK : rc;
    config_t *cfg = ctl_config(CMD);
    if (!cfg)
        return CTL_USAGE;
    const char *key = config_str(cfg, CONFIG_PROVIDER_API_KEY);
    if (!key || !*key) {
        config_free(cfg);
        return usage_error("PROVIDER_API_KEY is not set: resolve asks the provider "
                           "before it writes anything");
    }
    /* Settings first: a bad one is bad usage, whatever the database says. */
    pc = ctl_provider_open(cfg, BUDGET_PRIO_LOOKUP, &err);
    if (!pc) {
        rc = usage_error("%s", err.message);
        goto out;
    }
    conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &db_err);
    st = conn ? attempt_store_new(config_str(cfg, CONFIG_DATABASE_URL), ra.actor,
                                  &db_err)
              : NULL;
    if (!st) {
        rc = failure("%s", db_err.message);
        goto out;
    }
    struct attempt_review_request rq = {.attempt_id = ra.id,
                                        .intent_id = ra.intent,
                                        .reason = ra.reason,
                                        .actor = ra.actor,
                                        .force = ra.force};
    attempt_review_resolve(conn, st, pc,
                           config_int(cfg, CONFIG_RECONCILER_SEARCH_LAG_MS),
                           config_int(cfg, CONFIG_WORKER_KEY_RETENTION_MS), &rq, &res);
    if (res.outcome == ATTEMPT_REVIEW_RESOLVED) {
        print_result(&ra, &res);
        rc = CTL_OK;
    } else if (res.outcome == ATTEMPT_REVIEW_REFUSED && res.verdict &&
               !strcmp(res.verdict, "unproven")) {
        rc = failure("%s", res.message); /* it says what force means */
    } else if (res.outcome == ATTEMPT_REVIEW_REFUSED) {
        rc = failure("%s (--force resolves anyway)", res.message);
    } else {
        rc = failure("%s", res.message);
    }
out:
    attempt_review_result_clear(&res);
    attempt_store_free(st);
    ctl_provider_close(pc);
    if (conn)
        PQfinish(conn);
    config_free(cfg);
    return rc;
}
