/* chargectl refund: what happened to a refund, the refunds to look at, and
 * an operator's decision on one automation could not settle. */
#include <ctype.h>
#include <getopt.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>

#include "attempt_status.h"
#include "charge_command.h"
#include "chargectl.h"
#include "decimal.h"
#include "config.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "db.h"
#include "provider_client.h"
#include "refund_review.h"
#include "utf8_text.h"

#define MAX_ACTOR  128
#define MAX_REASON 1000

#define TS(col)                                                                        \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* clang-format off */
static const char *SQL_REFUND =
    "SELECT row_to_json(r)::text FROM (SELECT id AS refund_id, payment_attempt_id,"
    " order_id, idempotency_key, status, reason, amount, currency, refund_reason,"
    " payment_intent, provider_refund_id, reserved, attempt_count, last_error,"
    " lease_owner, " TS("lease_expires_at") " AS lease_expires_at, lease_epoch,"
    " " TS("first_sent_at") " AS first_sent_at, " TS("next_check_at") " AS next_check_at,"
    " reconcile_checks, " TS("created_at") " AS created_at,"
    " " TS("updated_at") " AS updated_at"
    " FROM refund_attempts WHERE id = $1::uuid) r";

static const char *SQL_TRANSITIONS =
    "SELECT coalesce(json_agg(t ORDER BY t.id), '[]')::text FROM (SELECT id,"
    " " TS("created_at") " AS at, old_status, new_status, cause, actor, reason,"
    " evidence FROM refund_transitions WHERE refund_id = $1::uuid) t";

static const char *SQL_CALLS =
    "SELECT coalesce(json_agg(c ORDER BY c.id), '[]')::text FROM (SELECT id,"
    " " TS("started_at") " AS started_at, operation, outcome, http_status, replayed,"
    " latency_ms, provider_payment_id, error, actor FROM provider_calls"
    " WHERE refund_id = $1::uuid) c";

static const char *SQL_EVENTS =
    "SELECT coalesce(json_agg(e ORDER BY e.c), '[]')::text FROM (SELECT event_id,"
    " event_type, topic, " TS("created_at") " AS created_at,"
    " " TS("published_at") " AS published_at, payload, created_at AS c"
    " FROM outbox WHERE refund_id = $1::uuid) e";

static const char *SQL_LIST =
    "SELECT coalesce(json_agg(r), '[]')::text FROM (SELECT id AS refund_id,"
    " payment_attempt_id, status, amount, currency, provider_refund_id, reason,"
    " " TS("updated_at") " AS updated_at FROM refund_attempts"
    " WHERE ($1::uuid IS NULL OR payment_attempt_id = $1::uuid)"
    "   AND ($2::text IS NULL OR status = $2)"
    " ORDER BY updated_at DESC, id LIMIT $3::int) r";
/* clang-format on */

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: chargectl refund show REFUND_ID [--json]\n"
        "       chargectl refund list [--attempt UUID] [--status S] [--limit N] "
        "[--json]\n"
        "       chargectl refund resolve REFUND_ID --status SUCCEEDED|FAILED "
        "--reason TEXT\n"
        "                                [--provider-refund-id re_...] [--actor "
        "NAME] [--force] [--json]\n\n"
        "  show           the refund, every status transition with its cause and\n"
        "                 evidence, its provider calls and its result events\n"
        "  list           refunds, most recently updated first; --status\n"
        "                 REQUIRES_REVIEW is the review queue\n"
        "  resolve        an operator's decision on a refund in REQUIRES_REVIEW or\n"
        "                 UNKNOWN, after looking at the provider's dashboard:\n"
        "                 SUCCEEDED (it was refunded, as --provider-refund-id,\n"
        "                 which it needs) or FAILED (no money went back; its\n"
        "                 reservation is given back to the charge). Recorded with\n"
        "                 cause operator, the actor and the reason; publishes the\n"
        "                 refund's result event. The provider is asked first\n"
        "                 (PROVIDER_API_KEY): the refund it holds must agree,\n"
        "                 and be proven this refund's: on its charge's intent,\n"
        "                 not recorded for another refund, its metadata naming\n"
        "                 no other refund or payment attempt, and the id\n"
        "                 recorded from the refund's own call or the answer\n"
        "                 under its key (one that only names it is not). No\n"
        "                 decision while a call under the refund's key may\n"
        "                 still execute (its lease live, its key young)\n"
        "  --attempt UUID only the refunds of this payment attempt\n"
        "  --status S     one of:");
    for (int i = 0; i < ATTEMPT_STATUS__COUNT; i++)
        fprintf(out, " %s", attempt_status_name(i));
    fprintf(out,
            "\n"
            "  --limit N      at most N rows [50]\n"
            "  --reason TEXT  why (resolve): how you know\n"
            "  --actor NAME   who decides [the OS user]\n"
            "  --force        resolve although the provider contradicts the decision\n"
            "                 or does not answer, the provider's refund is not\n"
            "                 proven this refund's or its metadata names another,\n"
            "                 or a call under the refund's key may still execute:\n"
            "                 on your word (recorded as forced). Never books a\n"
            "                 refund on another charge's intent or another's\n"
            "  --json         JSON instead of tables\n"
            "  --help         this text\n\n"
            "Exit status: 0 done; 1 database unreachable, no such refund, or\n"
            "(resolve) refused: not in review, changed meanwhile, locked, past the\n"
            "charge, another provider refund, one not proven this refund's; 2 bad\n"
            "usage.\n");
}

/* Says "chargectl refund [sub]: ..." in one line; returns rc. */
__attribute__((format(printf, 3, 4))) static int say(int rc, const char *sub,
                                                     const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "chargectl refund%s%s: ", sub ? " " : "", sub ? sub : "");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return rc;
}

/* A provider refund id: re_ and letters, digits, '_'. */
static int good_refund_id(const char *s)
{
    size_t n = strlen(s);
    if (n < 4 || n > 255 || strncmp(s, "re_", 3) != 0)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || (s[i] >= '0' && s[i] <= '9') ||
              (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            return 0;
    return 1;
}

static const char *os_user(void)
{
    struct passwd *pw = getpwuid(geteuid());
    if (pw && pw->pw_name && *pw->pw_name)
        return pw->pw_name;
    const char *u = getenv("USER");
    return u && *u ? u : NULL;
}

static int refund_show(PGconn *conn, const char *id, int as_json)
{
    char err[512];
    const char *p[1] = {id};
    int missing, rc = CTL_FAILED;
    json_t *r = ctl_query_json(conn, SQL_REFUND, 1, p, &missing, err, sizeof(err));
    json_t *tr = NULL, *calls = NULL, *events = NULL;
    if (!r) {
        if (missing)
            return say(CTL_FAILED, "show", "no refund %s", id);
        return say(CTL_FAILED, "show", "%s", err);
    }
    tr = ctl_query_json(conn, SQL_TRANSITIONS, 1, p, &missing, err, sizeof(err));
    calls = ctl_query_json(conn, SQL_CALLS, 1, p, &missing, err, sizeof(err));
    events = ctl_query_json(conn, SQL_EVENTS, 1, p, &missing, err, sizeof(err));
    if (!tr || !calls || !events) {
        say(CTL_FAILED, "show", "%s", err);
        goto out;
    }
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) json_object_del(e, "c");
    if (as_json) {
        /* json_object_set_new steals each reference. */
        json_object_set_new(r, "transitions", tr);
        json_object_set_new(r, "provider_call_log", calls);
        json_object_set_new(r, "result_events", events);
        ctl_print_json(stdout, r);
        return CTL_OK;
    }
    ctl_print_object(r);
    printf("\ntransitions:\n");
    const char *th[] = {"AT",    "FROM",   "TO",       "CAUSE",
                        "ACTOR", "REASON", "EVIDENCE", NULL};
    const char *tk[] = {"at",    "old_status", "new_status", "cause",
                        "actor", "reason",     "evidence",   NULL};
    ctl_print_rows(tr, th, tk);
    printf("\nprovider calls:\n");
    const char *ch[] = {"STARTED_AT", "OPERATION",   "OUTCOME", "HTTP", "REPLAYED",
                        "LATENCY_MS", "PROVIDER_ID", "ERROR",   NULL};
    const char *ck[] = {"started_at",          "operation", "outcome",
                        "http_status",         "replayed",  "latency_ms",
                        "provider_payment_id", "error",     NULL};
    ctl_print_rows(calls, ch, ck);
    printf("\nresult events:\n");
    const char *eh[] = {"CREATED_AT", "TYPE", "EVENT_ID", "PUBLISHED_AT", NULL};
    const char *ek[] = {"created_at", "event_type", "event_id", "published_at", NULL};
    ctl_print_rows(events, eh, ek);
    rc = CTL_OK;
out:
    json_decref(r);
    json_decref(tr);
    json_decref(calls);
    json_decref(events);
    return rc;
}

static int refund_list(PGconn *conn, const char *attempt, const char *status,
                       const char *limit, int as_json)
{
    char err[512];
    const char *p[3] = {attempt, status, limit};
    int missing;
    json_t *rows = ctl_query_json(conn, SQL_LIST, 3, p, &missing, err, sizeof(err));
    if (!rows)
        return say(CTL_FAILED, "list", "%s", err);
    if (as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    const char *h[] = {"REFUND",     "ATTEMPT", "STATUS", "AMOUNT",
                       "UPDATED_AT", "REASON",  NULL};
    const char *k[] = {"refund_id",  "payment_attempt_id",
                       "status",     "amount@currency",
                       "updated_at", "reason",
                       NULL};
    ctl_print_rows(rows, h, k);
    json_decref(rows);
    return CTL_OK;
}

struct resolve_args {
    const char *id, *status, *reason, *provider_refund_id, *actor;
    int as_json, force;
    provider_client_t *pc;
    long long key_kept_ms; /* how long a call under a key may still execute */
};

/* What the provider says of the decision: "agrees", or why not in says. A
 * SUCCEEDED decision needs the provider's refund, succeeded, of the
 * refund's amount, made for this refund (its metadata); what the provider
 * shows of it goes into *seen (seen->id "" when it showed nothing), for
 * refund_review to judge whose it is. A FAILED one needs the consistent
 * list of the charge's refunds to hold none for this refund that succeeded
 * or may yet (pending). No answer is no evidence. */
static const char *ask_provider(const struct resolve_args *ra, json_t *refund,
                                struct provider_listed *seen, char *says, size_t size)
{
    struct provider_result res;
    long long amount = json_integer_value(json_object_get(refund, "amount"));
    const char *intent = json_string_value(json_object_get(refund, "payment_intent"));
    memset(seen, 0, sizeof(*seen));
    if (!strcmp(ra->status, ATTEMPT_S_SUCCEEDED)) {
        provider_client_fetch(ra->pc, PROVIDER_LIST_REFUNDS, ra->provider_refund_id,
                              seen, &res);
        if (res.outcome == PROVIDER_NOT_FOUND)
            snprintf(says, size, "the provider has no refund %s",
                     ra->provider_refund_id);
        else if (res.outcome != PROVIDER_SUCCEEDED)
            snprintf(says, size, "the provider did not answer the look-up of %s: %s",
                     ra->provider_refund_id,
                     res.error[0] ? res.error : provider_outcome_name(res.outcome));
        else if (strcmp(seen->status, "succeeded") != 0)
            snprintf(says, size, "the provider says %s is %s, not succeeded",
                     ra->provider_refund_id, seen->status);
        else if (seen->amount != amount)
            snprintf(says, size,
                     "the provider says %s is of %lld, the refund's is %lld",
                     ra->provider_refund_id, seen->amount, amount);
        else if (strcasecmp(seen->refund_id, ra->id) != 0)
            snprintf(says, size,
                     "the provider says %s was made for another refund (%s)",
                     ra->provider_refund_id,
                     seen->refund_id[0] ? seen->refund_id : "none named");
        else
            return "agrees";
        if (res.outcome != PROVIDER_SUCCEEDED)
            memset(seen, 0, sizeof(*seen));
        return "contradicts";
    }
    if (!intent || !*intent)
        return "agrees"; /* never reserved, never sent: nothing to look for */
    char after[PROVIDER_ID_MAX] = "";
    for (int page = 0; page < 100; page++) {
        provider_client_list_refunds(ra->pc, intent, ra->id, after[0] ? after : NULL,
                                     &res);
        if (res.outcome == PROVIDER_UNKNOWN || res.outcome == PROVIDER_NOT_EXECUTED ||
            res.outcome == PROVIDER_INVALID) {
            snprintf(says, size,
                     "the provider did not answer the list of %s's refunds: %s", intent,
                     res.error[0] ? res.error : provider_outcome_name(res.outcome));
            return "contradicts";
        }
        if (res.matches > 0 &&
            (res.outcome == PROVIDER_SUCCEEDED || res.outcome == PROVIDER_PROCESSING)) {
            snprintf(says, size, "the provider's refund %s for this refund is %s",
                     res.provider_payment_id, res.intent_status);
            return "contradicts";
        }
        if (!res.has_more)
            return "agrees";
        snprintf(after, sizeof(after), "%s", res.list_last_id);
    }
    snprintf(says, size, "the provider lists more refunds of %s than looked at",
             intent);
    return "contradicts";
}

static int refund_resolve(PGconn *conn, const struct resolve_args *ra)
{
    char err[512];
    const char *p[1] = {ra->id};
    int missing, rc = CTL_FAILED;
    struct store_error db_err;
    char *evidence_text = NULL;
    json_t *evidence = NULL;
    json_t *r = ctl_query_json(conn, SQL_REFUND, 1, p, &missing, err, sizeof(err));
    if (!r)
        return missing ? say(CTL_FAILED, "resolve", "no refund %s", ra->id)
                       : say(CTL_FAILED, "resolve", "%s", err);
    const char *cur = json_string_value(json_object_get(r, "status"));
    int from = cur ? attempt_status_parse(cur) : -1;
    if (from != ATTEMPT_STATUS_REQUIRES_REVIEW && from != ATTEMPT_STATUS_UNKNOWN) {
        say(CTL_FAILED, "resolve",
            "refund %s is %s, not REQUIRES_REVIEW or UNKNOWN: only those are resolved",
            ra->id, cur ? cur : "?");
        goto out;
    }
    char says[400] = "", why[400];
    struct provider_listed seen;
    const char *provider = ask_provider(ra, r, &seen, says, sizeof(says));
    if (strcmp(provider, "agrees") != 0 && !ra->force) {
        say(CTL_FAILED, "resolve", "refused: %s; nothing written (--force overrides)",
            says);
        goto out;
    }
    /* What the provider showed of its refund: whose it is is judged on it. */
    evidence = json_pack(
        "{s:s, s:s, s:s*, s:s*, s:s*, s:s*, s:s*, s:b}", "decision", ra->status,
        "provider", provider, "provider_says", says[0] ? says : NULL,
        "provider_refund_id", ra->provider_refund_id, "provider_payment_intent",
        seen.payment_intent[0] ? seen.payment_intent : NULL, "metadata_refund_id",
        seen.refund_id[0] ? seen.refund_id : NULL, "metadata_payment_attempt_id",
        seen.payment_attempt_id[0] ? seen.payment_attempt_id : NULL, "forced",
        ra->force);
    evidence_text = evidence ? json_dumps(evidence, JSON_COMPACT) : NULL;
    if (!evidence_text) {
        say(CTL_FAILED, "resolve", "out of memory");
        goto out;
    }
    struct refund_review_decision d = {
        .refund_id = ra->id,
        .expected = (enum attempt_status)from,
        .status = (enum attempt_status)attempt_status_parse(ra->status),
        .actor = ra->actor,
        .reason = ra->reason,
        .provider_refund_id = ra->provider_refund_id,
        .evidence_json = evidence_text,
        .object_payment_intent = seen.payment_intent,
        .object_refund_meta = seen.refund_id,
        .object_attempt_meta = seen.payment_attempt_id,
        .key_kept_ms = ra->key_kept_ms,
        .force = ra->force,
    };
    enum refund_review_outcome o;
    enum store_rc src = refund_review_resolve(conn, &d, &o, why, sizeof(why), &db_err);
    if (src == STORE_LOCKED) {
        say(CTL_FAILED, "resolve",
            "refund %s is locked by another session right now; nothing written, run "
            "resolve again",
            ra->id);
        goto out;
    }
    if (src == STORE_DATA && !strcmp(db_err.sqlstate, "23505")) {
        say(CTL_FAILED, "resolve", "refused: %s is another refund's; nothing written",
            ra->provider_refund_id ? ra->provider_refund_id : "the provider refund id");
        goto out;
    }
    if (src != STORE_OK) {
        say(CTL_FAILED, "resolve", "%s%s",
            src == STORE_DATA ? "the database refused the resolution: " : "",
            db_err.message);
        goto out;
    }
    switch (o) {
    case REFUND_REVIEW_RESOLVED:
        break;
    case REFUND_REVIEW_NOT_FOUND:
        say(CTL_FAILED, "resolve", "no refund %s", ra->id);
        goto out;
    case REFUND_REVIEW_CHANGED:
        say(CTL_FAILED, "resolve",
            "refund %s changed while it was being resolved; nothing written", ra->id);
        goto out;
    case REFUND_REVIEW_EXCEEDS:
        say(CTL_FAILED, "resolve",
            "refused: refund %s would take the charge's refunds past its amount; "
            "nothing written",
            ra->id);
        goto out;
    case REFUND_REVIEW_LEASED:
        say(CTL_FAILED, "resolve",
            "refused: refund %s is leased by a worker or reconciler that may be "
            "calling the provider under its key now; nothing written (--force "
            "overrides)",
            ra->id);
        goto out;
    case REFUND_REVIEW_MAY_EXECUTE:
        say(CTL_FAILED, "resolve",
            "refused: a call under refund %s's key may still execute at the provider "
            "(its key is younger than WORKER_KEY_RETENTION_MS allows); the reconciler "
            "settles it on evidence; nothing written (--force overrides)",
            ra->id);
        goto out;
    case REFUND_REVIEW_FOREIGN:
        say(CTL_FAILED, "resolve",
            "refused: %s is not refund %s's: %s; another charge's money is never "
            "booked for this one, --force or not; nothing written",
            ra->provider_refund_id, ra->id, why);
        goto out;
    case REFUND_REVIEW_NAMES_ANOTHER:
        say(CTL_FAILED, "resolve",
            "refused: %s is not proven refund %s's: %s; nothing written (--force "
            "overrides)",
            ra->provider_refund_id, ra->id, why);
        goto out;
    case REFUND_REVIEW_UNPROVEN:
        say(CTL_FAILED, "resolve",
            "refused: %s; nothing written. --force books it on your word that it is "
            "this refund's (say, the provider's request log shows it made under the "
            "refund's idempotency key), recorded as forced",
            why);
        goto out;
    case REFUND_REVIEW_OTHER_REFUND:
        say(CTL_FAILED, "resolve",
            "refused: refund %s has another provider refund id recorded, or %s is "
            "another refund's; nothing written",
            ra->id, ra->provider_refund_id ? ra->provider_refund_id : "-");
        goto out;
    }
    if (ra->as_json) {
        json_t *j =
            json_pack("{s:s, s:s, s:s, s:s*, s:s, s:s, s:s, s:O}", "refund_id", ra->id,
                      "old_status", cur, "status", ra->status, "provider_refund_id",
                      ra->provider_refund_id, "cause", "operator", "actor", ra->actor,
                      "reason", ra->reason, "evidence", evidence);
        if (j)
            ctl_print_json(stdout, j);
    } else {
        printf("%-20s %s\n", "refund_id", ra->id);
        printf("%-20s %s -> %s\n", "status", cur, ra->status);
        printf("%-20s %s\n", "provider_refund_id",
               ra->provider_refund_id ? ra->provider_refund_id : "-");
        printf("%-20s %s\n", "actor", ra->actor);
        printf("%-20s %s\n", "reason", ra->reason);
    }
    rc = CTL_OK;
out:
    free(evidence_text);
    json_decref(evidence);
    json_decref(r);
    return rc;
}

int ctl_refund(int argc, char **argv)
{
    static const struct option opts[] = {
        {"attempt", required_argument, NULL, 'A'},
        {"status", required_argument, NULL, 's'},
        {"limit", required_argument, NULL, 'l'},
        {"reason", required_argument, NULL, 'r'},
        {"provider-refund-id", required_argument, NULL, 'p'},
        {"actor", required_argument, NULL, 'a'},
        {"json", no_argument, NULL, 'j'},
        {"force", no_argument, NULL, 'F'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct resolve_args ra = {0};
    const char *attempt = NULL;
    char limit[32] = "50";
    struct store_error err;
    int have_limit = 0, c, rc;

    if (argc < 2)
        return say(CTL_USAGE, NULL, "missing subcommand (show, list, resolve; see %s)",
                   "--help");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    const char *sub = argv[1];
    int show = !strcmp(sub, "show"), list = !strcmp(sub, "list"),
        resolve = !strcmp(sub, "resolve");
    if (!show && !list && !resolve)
        return say(CTL_USAGE, NULL, "unknown subcommand '%s' (show, list, resolve)",
                   sub);
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
        switch (c) {
        case 'A':
            if (!charge_command_is_uuid(optarg))
                return say(CTL_USAGE, sub, "--attempt '%s' is not a UUID", optarg);
            attempt = optarg;
            break;
        case 's':
            if (attempt_status_parse(optarg) < 0)
                return say(CTL_USAGE, sub, "--status '%s' is not a status", optarg);
            ra.status = optarg;
            break;
        case 'l': {
            int64_t n;
            if (decimal_parse(optarg, 100000, &n, NULL) != 0 || n < 1)
                return say(CTL_USAGE, sub, "--limit '%s' must be 1..100000", optarg);
            snprintf(limit, sizeof(limit), "%lld", (long long)n);
            have_limit = 1;
            break;
        }
        case 'r':
            ra.reason = optarg;
            break;
        case 'p':
            ra.provider_refund_id = optarg;
            break;
        case 'a':
            ra.actor = optarg;
            break;
        case 'j':
            ra.as_json = 1;
            break;
        case 'F':
            ra.force = 1;
            break;
        case 'h':
            usage(stdout);
            return CTL_OK;
        default: {
            const char *bad = argv[optind];
            if (optopt && strchr("Aslrpa", optopt) && !strchr(bad, '='))
                return say(CTL_USAGE, sub, "%s needs a value", bad);
            return ctl_bad_option("refund", bad);
        }
        }
    }
    int nargs = argc - 1 - optind;
    const char *id = nargs >= 1 ? argv[1 + optind] : NULL;
    if (list) {
        if (nargs != 0)
            return ctl_unexpected_argument("refund list", id);
        if (ra.reason || ra.provider_refund_id || ra.actor)
            return say(CTL_USAGE, sub,
                       "--reason, --provider-refund-id and --actor are "
                       "for resolve");
    } else {
        if (nargs != 1)
            return nargs == 0 ? say(CTL_USAGE, sub, "give one REFUND_ID (see --help)")
                              : ctl_unexpected_argument("refund", argv[2 + optind]);
        if (!charge_command_is_uuid(id))
            return say(CTL_USAGE, sub, "'%s' is not a UUID", id);
        if (attempt || have_limit || (show && ra.status))
            return say(CTL_USAGE, sub, "--attempt, --limit and --status are for list");
        if (show && (ra.reason || ra.provider_refund_id || ra.actor))
            return say(CTL_USAGE, sub,
                       "--reason, --provider-refund-id and --actor are "
                       "for resolve");
    }
    char canonical[37];
    if (resolve) {
        /* A UUID in lower case: the provider's metadata is text, listed and
         * compared as such, and charged writes it so. */
        snprintf(canonical, sizeof(canonical), "%s", id);
        for (char *p = canonical; *p; p++)
            *p = (char)tolower((unsigned char)*p);
        ra.id = canonical;
        if (!ra.status || (strcmp(ra.status, ATTEMPT_S_SUCCEEDED) &&
                           strcmp(ra.status, ATTEMPT_S_FAILED)))
            return say(CTL_USAGE, sub, "give --status SUCCEEDED or --status FAILED");
        if (!ra.reason)
            return say(CTL_USAGE, sub, "needs --reason TEXT: say how you know");
        if (!utf8_text_line(ra.reason, MAX_REASON))
            return say(CTL_USAGE, sub,
                       "--reason must be 1..%d bytes of UTF-8 on one line", MAX_REASON);
        if (ra.provider_refund_id && !good_refund_id(ra.provider_refund_id))
            return say(CTL_USAGE, sub,
                       "--provider-refund-id '%s' is not a provider refund id (re_...)",
                       ra.provider_refund_id);
        if (!strcmp(ra.status, ATTEMPT_S_SUCCEEDED) && !ra.provider_refund_id)
            return say(CTL_USAGE, sub,
                       "--status SUCCEEDED needs --provider-refund-id re_...: the "
                       "provider's refund");
        if (!ra.actor && !(ra.actor = os_user()))
            return say(CTL_USAGE, sub, "cannot tell who you are: give --actor NAME");
        if (!utf8_text_line(ra.actor, MAX_ACTOR))
            return say(CTL_USAGE, sub,
                       "--actor must be 1..%d bytes of UTF-8 on one line", MAX_ACTOR);
    }
    config_t *cfg = ctl_config("refund");
    if (!cfg)
        return CTL_USAGE;
    if (resolve) {
        char perr[256];
        const char *key = config_str(cfg, CONFIG_PROVIDER_API_KEY);
        if (!key || !*key) {
            config_free(cfg);
            return say(CTL_USAGE, sub,
                       "PROVIDER_API_KEY is not set: resolve asks the provider first");
        }
        ra.pc = provider_client_new(config_str(cfg, CONFIG_PROVIDER_BASE_URL), key,
                                    config_str(cfg, CONFIG_PROVIDER_API_VERSION),
                                    (long)config_int(cfg, CONFIG_PROVIDER_TIMEOUT_MS),
                                    perr, sizeof(perr));
        if (!ra.pc) {
            config_free(cfg);
            return say(CTL_USAGE, sub, "%s", perr);
        }
    }
    ra.key_kept_ms = config_int(cfg, CONFIG_WORKER_KEY_RETENTION_MS);
    PGconn *conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &err);
    if (!conn) {
        rc = say(CTL_FAILED, NULL, "%s", err.message);
        provider_client_free(ra.pc);
        config_free(cfg);
        return rc;
    }
    if (show)
        rc = refund_show(conn, id, ra.as_json);
    else if (list)
        rc = refund_list(conn, attempt, ra.status, limit, ra.as_json);
    else
        rc = refund_resolve(conn, &ra);
    PQfinish(conn);
    provider_client_free(ra.pc);
    config_free(cfg);
    return rc;
}
