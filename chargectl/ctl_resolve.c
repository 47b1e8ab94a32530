/* chargectl attempt resolve: a person decides whether an attempt that
 * automation left in REQUIRES_REVIEW was charged (SUCCEEDED) or not (FAILED),
 * once the provider was asked whether it agrees. Nothing is written unless
 * the provider agrees or the operator overrides it with --force; what the
 * provider said goes into the transition's evidence. */
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "attempt_status.h"
#include "attempt_store.h"
#include "charge_command.h"
#include "chargectl.h"
#include "clock.h"
#include "config.h"
#include "ctl_output.h"
#include "db.h"
#include "provider_client.h"
#include "utf8_text.h"

#define CMD        "attempt resolve"
#define MAX_ACTOR  128
#define MAX_REASON 1000

/* The last column: how long ago the attempt last reached the provider, on
 * the database's clock (what the provider's search may not list yet). */
static const char *SQL_READ =
    "SELECT a.status, a.amount, a.currency, coalesce(a.provider_payment_id, ''),"
    "  (extract(epoch FROM now() - coalesce((SELECT max(c.started_at) FROM"
    "    provider_calls c WHERE c.payment_attempt_id = a.id), a.first_sent_at,"
    "    a.created_at)) * 1000)::bigint"
    " FROM payment_attempts a WHERE a.id = $1::uuid";

/* An intent is booked for one attempt at most. */
static const char *SQL_BOOKED_ELSEWHERE =
    "SELECT payment_attempt_id::text FROM ledger_entries"
    " WHERE kind = 'charge' AND provider_payment_id = $1"
    "   AND payment_attempt_id <> $2::uuid LIMIT 1";

struct review_attempt {
    char status[20];
    long long amount;
    char currency[4];
    char provider_payment_id[96]; /* "" when none is recorded */
    long long last_call_age_ms;   /* since its last provider call */
};

/* One look-up at the provider, as asked and as answered. */
struct lookup {
    const char *operation; /* "retrieve" or "search" */
    char query[96];        /* the intent id, or the attempt id searched for */
    int64_t started_ms;
    struct provider_result res;
};

/* What the provider's answers say of the operator's decision. Ordered: a
 * contradiction outranks a missing answer, which outranks a search that
 * may not list a recent charge yet. */
enum verdict { V_AGREES = 0, V_SEARCH_MAY_LAG, V_NO_ANSWER, V_CONTRADICTS };

static const char *verdict_names[] = {"agrees", "search_may_lag", "no_answer",
                                      "contradicts"};

/* The provider's search lags behind its charges (docs/provider.md): what it
 * does not list is evidence only once the attempt's last call is older than
 * lag_ms. The time left to wait, or 0. */
static long long search_wait_ms(const struct review_attempt *a, long long lag_ms)
{
    return a->last_call_age_ms < lag_ms ? lag_ms - a->last_call_age_ms : 0;
}

struct judgement {
    enum verdict verdict;
    char says[512]; /* one line: what the provider says, when it objects */
};

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
        "                   the provider lists for this attempt. Books the charge\n"
        "                   (ledger entry) and publishes charge.succeeded\n"
        "  --failed         no money moved: the provider must have no succeeded or\n"
        "                   processing intent for this attempt (searched by its id,\n"
        "                   and its recorded intent looked up). Publishes\n"
        "                   charge.failed\n"
        "  --reason TEXT    why; required with --failed [resolved by operator]\n"
        "  --actor NAME     who decides [the OS user]\n"
        "  --force          resolve although the provider contradicts the decision,\n"
        "                   does not answer or may not be up to date; the evidence\n"
        "                   records it\n"
        "  --json           JSON instead of text\n"
        "  --help           this text\n\n"
        "The transition is recorded with cause operator, the actor, the reason and\n"
        "the provider's answers as evidence; the look-ups as provider calls.\n"
        "The provider's search lags behind its charges: until the attempt's last\n"
        "provider call is RECONCILER_SEARCH_LAG_MS old [60000], what it does not\n"
        "list is no evidence, and resolve asks to be run again later.\n"
        "Needs PROVIDER_API_KEY (and PROVIDER_BASE_URL, PROVIDER_TIMEOUT_MS,\n"
        "PROVIDER_API_VERSION) besides DATABASE_URL.\n\n"
        "Exit status: 0 resolved; 1 refused (not in review, the provider contradicts,\n"
        "does not answer or may not be up to date), no such attempt, database\n"
        "unreachable; 2 bad usage.\n");
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

/* Free text for the database: 1..max bytes of UTF-8, one line. */
static int good_text(const char *s, size_t max)
{
    size_t n = strlen(s);
    if (n == 0 || n > max || !utf8_text_valid(s, n))
        return 0;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    return 1;
}

/* A provider id as the provider client takes it: letters, digits, '_'. */
static int good_intent_id(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof(((struct provider_result *)0)->provider_payment_id))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

/* The OS user, else $USER; NULL when neither names anyone. */
/* Reads the attempt: 0, 1 when there is none, -1 with err. */
static int read_attempt(PGconn *conn, const char *id, struct review_attempt *a,
                        struct store_error *err)
{
    const char *p[1] = {id};
    PGresult *r = db_exec(conn, SQL_READ, 1, p, err);
    if (!r)
        return -1;
    if (PQntuples(r) != 1) {
        PQclear(r);
        return 1;
    }
    snprintf(a->status, sizeof(a->status), "%s", PQgetvalue(r, 0, 0));
    a->amount = strtoll(PQgetvalue(r, 0, 1), NULL, 10);
    snprintf(a->currency, sizeof(a->currency), "%s", PQgetvalue(r, 0, 2));
    snprintf(a->provider_payment_id, sizeof(a->provider_payment_id), "%s",
             PQgetvalue(r, 0, 3));
    a->last_call_age_ms = strtoll(PQgetvalue(r, 0, 4), NULL, 10);
    PQclear(r);
    return 0;
}

/* The attempt an intent is already booked for, in `other` ("" for none).
 * 0 / -1 with err. */
static int booked_elsewhere(PGconn *conn, const char *intent, const char *id,
                            char *other, size_t other_size, struct store_error *err)
{
    const char *p[2] = {intent, id};
    PGresult *r = db_exec(conn, SQL_BOOKED_ELSEWHERE, 2, p, err);
    if (!r)
        return -1;
    snprintf(other, other_size, "%s", PQntuples(r) == 1 ? PQgetvalue(r, 0, 0) : "");
    PQclear(r);
    return 0;
}

static void ask(provider_client_t *pc, struct lookup *l, const char *operation,
                const char *query)
{
    l->operation = operation;
    snprintf(l->query, sizeof(l->query), "%s", query);
    l->started_ms = clock_wall_ms();
    if (!strcmp(operation, "search"))
        provider_client_search(pc, query, &l->res);
    else
        provider_client_retrieve(pc, query, &l->res);
}

/* Did the provider answer about the intent at all? A 5xx, a lost answer or
 * a refused request (say, a wrong key) is no evidence either way. */
static int answered(const struct provider_result *r)
{
    return r->outcome != PROVIDER_UNKNOWN && r->outcome != PROVIDER_NOT_EXECUTED &&
           r->outcome != PROVIDER_INVALID;
}

static const char *why_unanswered(const struct provider_result *r)
{
    return r->error[0] ? r->error : provider_outcome_name(r->outcome);
}

/* Records an objection; the first one of the highest rank is kept. */
static void object(struct judgement *j, enum verdict v, const char *fmt, ...)
{
    va_list ap;
    if (v <= j->verdict)
        return;
    j->verdict = v;
    va_start(ap, fmt);
    vsnprintf(j->says, sizeof(j->says), fmt, ap);
    va_end(ap);
}

/* --succeeded PI: the provider must hold PI, succeeded, of the attempt's
 * amount, and list it under this attempt (its metadata payment_attempt_id).
 * The look-up result carries no currency and no metadata, so the search by
 * the attempt id stands in for the metadata check. */
static void judge_succeeded(provider_client_t *pc, const char *id,
                            const struct review_attempt *a, const char *intent,
                            long long lag_ms, struct lookup *ls, size_t *n,
                            struct judgement *j)
{
    struct lookup *get = &ls[(*n)++], *find = &ls[(*n)++];
    const struct provider_result *r = &get->res, *s = &find->res;

    ask(pc, get, "retrieve", intent);
    ask(pc, find, "search", id);
    int paid = 0;
    if (!answered(r))
        object(j, V_NO_ANSWER, "the provider did not answer the look-up of %s: %s",
               intent, why_unanswered(r));
    else if (r->outcome == PROVIDER_NOT_FOUND)
        object(j, V_CONTRADICTS, "the provider has no payment intent %s", intent);
    else if (strcmp(r->intent_status, "succeeded") != 0)
        object(j, V_CONTRADICTS, "the provider says %s is %s, not succeeded", intent,
               r->intent_status[0] ? r->intent_status : "of no known status");
    else if (r->amount != 0 && r->amount != a->amount)
        object(j, V_CONTRADICTS,
               "the provider says %s is of amount %lld, the attempt's is %lld", intent,
               r->amount, a->amount);
    else if (r->currency[0] && strcasecmp(r->currency, a->currency) != 0)
        object(j, V_CONTRADICTS, "the provider says %s is in %s, the attempt's is %s",
               intent, r->currency, a->currency);
    else if (r->intent_attempt_id[0] && strcmp(r->intent_attempt_id, id) != 0)
        object(j, V_CONTRADICTS, "the provider says %s belongs to another attempt (%s)",
               intent, r->intent_attempt_id);
    else
        paid = 1;

    if (!answered(s))
        object(j, V_NO_ANSWER,
               "the provider did not answer the search for this attempt: %s",
               why_unanswered(s));
    else if (!strcmp(s->provider_payment_id, intent))
        return; /* listed under this attempt: its metadata names it */
    else if (s->outcome == PROVIDER_SUCCEEDED)
        object(j, V_CONTRADICTS,
               "the provider's succeeded intent for this attempt is %s, not %s",
               s->provider_payment_id, intent);
    else if (paid && search_wait_ms(a, lag_ms) > 0)
        object(j, V_SEARCH_MAY_LAG,
               "the provider's search does not list %s under this attempt, but may "
               "not be up to date yet: try again in %llds",
               intent, (search_wait_ms(a, lag_ms) + 999) / 1000);
    else if (paid)
        /* Search ranks a succeeded intent first: had PI this attempt's id in
         * its metadata, it would have been the answer. */
        object(j, V_CONTRADICTS,
               "the provider does not list %s under this attempt: its metadata "
               "payment_attempt_id names another attempt or none",
               intent);
}

/* --failed: no intent for the attempt may be succeeded or processing, found
 * by the search on the attempt id or as the intent recorded on it. */
static void judge_failed(provider_client_t *pc, const char *id,
                         const struct review_attempt *a, long long lag_ms,
                         struct lookup *ls, size_t *n, struct judgement *j)
{
    struct lookup *find = &ls[(*n)++];
    const struct provider_result *s = &find->res;

    ask(pc, find, "search", id);
    if (!answered(s))
        object(j, V_NO_ANSWER,
               "the provider did not answer the search for this attempt: %s",
               why_unanswered(s));
    else if (s->outcome == PROVIDER_SUCCEEDED || s->outcome == PROVIDER_PROCESSING)
        object(j, V_CONTRADICTS, "the provider has a %s intent %s for this attempt",
               s->intent_status, s->provider_payment_id);
    else if (search_wait_ms(a, lag_ms) > 0)
        object(j, V_SEARCH_MAY_LAG,
               "the provider's search lists no paid intent for this attempt, but may "
               "not be up to date yet: try again in %llds",
               (search_wait_ms(a, lag_ms) + 999) / 1000);
    if (!a->provider_payment_id[0])
        return;
    struct lookup *get = &ls[(*n)++];
    const struct provider_result *r = &get->res;
    ask(pc, get, "retrieve", a->provider_payment_id);
    if (!answered(r))
        object(j, V_NO_ANSWER, "the provider did not answer the look-up of %s: %s",
               a->provider_payment_id, why_unanswered(r));
    else if (r->outcome == PROVIDER_SUCCEEDED || r->outcome == PROVIDER_PROCESSING)
        object(j, V_CONTRADICTS, "the provider says %s, recorded on the attempt, is %s",
               a->provider_payment_id, r->intent_status);
}

static json_t *str_or_null(const char *s)
{
    return s && *s ? json_string(s) : json_null();
}

static json_t *lookup_json(const struct lookup *l)
{
    const struct provider_result *r = &l->res;
    json_t *o = json_object();
    if (!o)
        return NULL;
    int search = !strcmp(l->operation, "search");
    json_object_set_new(o, "operation", json_string(l->operation));
    json_object_set_new(o, search ? "payment_attempt_id" : "payment_intent_id",
                        json_string(l->query));
    json_object_set_new(o, "outcome", json_string(provider_outcome_name(r->outcome)));
    json_object_set_new(o, "http_status",
                        r->http_status ? json_integer(r->http_status) : json_null());
    if (search)
        json_object_set_new(o, "matches", json_integer(r->matches));
    json_object_set_new(o, "provider_payment_id", str_or_null(r->provider_payment_id));
    json_object_set_new(o, "intent_status", str_or_null(r->intent_status));
    json_object_set_new(o, "amount", r->amount ? json_integer(r->amount) : json_null());
    json_object_set_new(o, "error", str_or_null(r->error));
    return o;
}

/* The transition's evidence: the decision, whether the provider agreed,
 * whether --force overrode it, and every look-up's answer. */
static json_t *evidence_json(const char *decision, const struct review_attempt *a,
                             const struct judgement *j, int forced, long long lag_ms,
                             const struct lookup *ls, size_t n)
{
    json_t *o = json_object(), *arr = json_array();
    if (!o || !arr) {
        json_decref(o);
        json_decref(arr);
        return NULL;
    }
    json_object_set_new(o, "decision", json_string(decision));
    json_object_set_new(o, "provider", json_string(verdict_names[j->verdict]));
    json_object_set_new(o, "provider_says", str_or_null(j->says));
    json_object_set_new(o, "forced", json_boolean(forced));
    json_object_set_new(o, "recorded_provider_payment_id",
                        str_or_null(a->provider_payment_id));
    json_object_set_new(o, "last_provider_call_age_ms",
                        json_integer(a->last_call_age_ms));
    json_object_set_new(o, "search_lag_ms", json_integer(lag_ms));
    for (size_t i = 0; i < n; i++) {
        json_t *l = lookup_json(&ls[i]);
        if (!l || json_array_append_new(arr, l) != 0) {
            json_decref(o);
            json_decref(arr);
            return NULL;
        }
    }
    json_object_set_new(o, "lookups", arr);
    return o;
}

struct resolve_args {
    const char *id;
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
    ra->id = argv[optind];
    if (!charge_command_is_uuid(ra->id))
        return usage_error("'%s' is not a UUID", ra->id);
    if (!!ra->intent == ra->failed)
        return usage_error("give one of --succeeded PAYMENT_INTENT_ID or --failed");
    if (ra->intent && !good_intent_id(ra->intent))
        return usage_error("--succeeded '%s' is not a payment intent id (pi_...)",
                           ra->intent);
    if (ra->failed && !ra->reason)
        return usage_error(
            "--failed needs --reason TEXT: say how you know no money moved");
    if (!ra->reason)
        ra->reason = "resolved by operator";
    if (!good_text(ra->reason, MAX_REASON))
        return usage_error("--reason must be 1..%d bytes of UTF-8 on one line",
                           MAX_REASON);
    if (!ra->actor && !(ra->actor = ctl_os_user()))
        return usage_error("cannot tell who you are: give --actor NAME");
    if (!good_text(ra->actor, MAX_ACTOR))
        return usage_error("--actor must be 1..%d bytes of UTF-8 on one line",
                           MAX_ACTOR);
    return 0;
}

static void print_result(const struct resolve_args *ra, const char *status,
                         const char *intent, json_t *evidence,
                         const struct judgement *j, int forced)
{
    if (ra->as_json) {
        json_t *o = json_object();
        if (!o)
            return;
        json_object_set_new(o, "payment_attempt_id", json_string(ra->id));
        json_object_set_new(o, "old_status", json_string(ATTEMPT_S_REQUIRES_REVIEW));
        json_object_set_new(o, "status", json_string(status));
        json_object_set_new(o, "provider_payment_id", str_or_null(intent));
        json_object_set_new(o, "cause", json_string("operator"));
        json_object_set_new(o, "actor", json_string(ra->actor));
        json_object_set_new(o, "reason", json_string(ra->reason));
        json_object_set_new(o, "evidence", json_incref(evidence));
        ctl_print_json(stdout, o);
        return;
    }
    printf("%-20s %s\n", "payment_attempt_id", ra->id);
    printf("%-20s %s -> %s\n", "status", ATTEMPT_S_REQUIRES_REVIEW, status);
    printf("%-20s %s\n", "provider_payment_id", intent && *intent ? intent : "-");
    printf("%-20s %s\n", "actor", ra->actor);
    printf("%-20s %s\n", "reason", ra->reason);
    if (j->verdict == V_AGREES)
        printf("%-20s agrees\n", "provider");
    else
        printf("%-20s %s: %s%s\n", "provider", verdict_names[j->verdict], j->says,
               forced ? " (resolved with --force)" : "");
}

int ctl_attempt_resolve(int argc, char **argv)
{
    struct resolve_args ra;
    struct review_attempt a = {0};
    struct lookup ls[2];
    struct judgement j = {V_AGREES, ""};
    char err[512], other[40];
    struct store_error db_err;
    size_t n = 0;
    int rc;
    PGconn *conn = NULL;
    provider_client_t *pc = NULL;
    attempt_store_t *st = NULL;
    json_t *evidence = NULL;
    char *evidence_text = NULL;

    if ((rc = parse_args(argc, argv, &ra)) != 0)
        return rc < 0 ? CTL_OK : rc;
    const char *status = ra.failed ? ATTEMPT_S_FAILED : ATTEMPT_S_SUCCEEDED;
    config_t *cfg = ctl_config(CMD);
    if (!cfg)
        return CTL_USAGE;
    const char *key = config_str(cfg, CONFIG_PROVIDER_API_KEY);
    if (!key || !*key) {
        config_free(cfg);
        return usage_error("PROVIDER_API_KEY is not set: resolve asks the provider "
                           "before it writes anything");
    }
    memset(ls, 0, sizeof(ls));
    conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &db_err);
    if (!conn) {
        rc = failure("%s", db_err.message);
        goto out;
    }
    int found = read_attempt(conn, ra.id, &a, &db_err);
    if (found != 0) {
        rc =
            found < 0 ? failure("%s", db_err.message) : failure("no attempt %s", ra.id);
        goto out;
    }
    if (strcmp(a.status, ATTEMPT_S_REQUIRES_REVIEW) != 0) {
        rc = failure("attempt %s is %s, not REQUIRES_REVIEW: only attempts in review "
                     "are resolved",
                     ra.id, a.status);
        goto out;
    }
    if (ra.intent) {
        if (booked_elsewhere(conn, ra.intent, ra.id, other, sizeof(other), &db_err) !=
            0) {
            rc = failure("%s", db_err.message);
            goto out;
        }
        if (other[0]) {
            rc = failure("%s is already booked for attempt %s: one intent pays one "
                         "attempt",
                         ra.intent, other);
            goto out;
        }
    }
    pc = provider_client_new(config_str(cfg, CONFIG_PROVIDER_BASE_URL), key,
                             config_str(cfg, CONFIG_PROVIDER_API_VERSION),
                             (long)config_int(cfg, CONFIG_PROVIDER_TIMEOUT_MS), err,
                             sizeof(err));
    if (!pc) {
        rc = usage_error("%s", err);
        goto out;
    }
    long long lag_ms = config_int(cfg, CONFIG_RECONCILER_SEARCH_LAG_MS);
    if (ra.intent)
        judge_succeeded(pc, ra.id, &a, ra.intent, lag_ms, ls, &n, &j);
    else
        judge_failed(pc, ra.id, &a, lag_ms, ls, &n, &j);
    if (j.verdict != V_AGREES && !ra.force) {
        rc = failure("refused: %s (--force resolves anyway)", j.says);
        goto out;
    }
    int forced = j.verdict != V_AGREES;
    evidence = evidence_json(status, &a, &j, forced, lag_ms, ls, n);
    evidence_text =
        evidence ? json_dumps(evidence, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    st = attempt_store_new(config_str(cfg, CONFIG_DATABASE_URL), ra.actor, &db_err);
    if (!evidence_text || !st) {
        rc = failure("%s", st ? "out of memory" : db_err.message);
        goto out;
    }
    struct attempt_call calls[2];
    for (size_t i = 0; i < n; i++)
        calls[i] = (struct attempt_call){.attempt_id = ra.id,
                                         .operation = ls[i].operation,
                                         .started_ms = ls[i].started_ms,
                                         .res = &ls[i].res};
    struct attempt_settlement s = {
        .attempt_id = ra.id,
        .lease_epoch = -1, /* an operator holds no lease */
        .expected = ATTEMPT_STATUS_REQUIRES_REVIEW,
        .status = ra.failed ? ATTEMPT_STATUS_FAILED : ATTEMPT_STATUS_SUCCEEDED,
        .cause = "operator",
        .actor = ra.actor,
        .reason = ra.reason,
        .provider_payment_id = ra.intent,
        .evidence_json = evidence_text,
        .next_check_ms = -1,
        .calls = calls,
        .ncalls = n,
    };
    int src = attempt_store_settle(st, &s, 1, &db_err);
    if (src == STORE_DATA && !strcmp(db_err.sqlstate, "23505")) {
        /* The one-booking-per-intent index: another attempt got it first. */
        rc = failure("refused: %s is booked for another attempt (even --force cannot "
                     "book one charge twice); nothing written",
                     ra.intent ? ra.intent : "the intent");
        goto out;
    }
    if (src == STORE_LOCKED)
        s.busy = 1; /* held by another session's transaction: said below */
    else if (src != STORE_OK) {
        rc = failure("%s%s",
                     src == STORE_DATA ? "the database refused the resolution: " : "",
                     db_err.message);
        goto out;
    }
    if (s.busy) {
        /* A session holds the attempt's row right now (a webhook being
         * applied, or one hung in its transaction): nothing waited for it. */
        rc = failure("attempt %s is locked by another session right now; nothing "
                     "written, run resolve again",
                     ra.id);
        goto out;
    }
    if (!s.settled) {
        /* Someone else resolved it (or a process holds it) since we read it. */
        if (read_attempt(conn, ra.id, &a, &db_err) != 0)
            snprintf(a.status, sizeof(a.status), "unknown");
        rc = failure("attempt %s changed while it was being resolved (now %s); nothing "
                     "written",
                     ra.id, a.status);
        goto out;
    }
    print_result(&ra, status, ra.intent ? ra.intent : a.provider_payment_id, evidence,
                 &j, forced);
    rc = CTL_OK;
out:
    free(evidence_text);
    json_decref(evidence);
    attempt_store_free(st);
    provider_client_free(pc);
    if (conn)
        PQfinish(conn);
    config_free(cfg);
    return rc;
}
