/* chargectl refund: what happened to a refund, the refunds to look at, and
 * an operator's decision on one automation could not settle. */
#include <ctype.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "attempt_history.h"
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
    " " ATTEMPT_HISTORY_WAITING
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
#define say(rc, sub, ...) ctl_say((rc), "refund", (sub), __VA_ARGS__)

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

static int refund_show(PGconn *conn, const char *id, int as_json)
{
    struct charged_error err;
    const char *p[1] = {id};
    int missing, rc = CTL_FAILED;
    json_t *r = ctl_query_json(conn, SQL_REFUND, 1, p, &missing, &err);
    json_t *tr = NULL, *calls = NULL, *events = NULL;
    if (!r) {
        if (missing)
            return say(CTL_FAILED, "show", "no refund %s", id);
        return say(CTL_FAILED, "show", "%s", err.message);
    }
    tr = ctl_query_json(conn, SQL_TRANSITIONS, 1, p, &missing, &err);
    calls = ctl_query_json(conn, SQL_CALLS, 1, p, &missing, &err);
    events = ctl_query_json(conn, SQL_EVENTS, 1, p, &missing, &err);
    if (!tr || !calls || !events) {
        say(CTL_FAILED, "show", "%s", err.message);
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
    struct charged_error err;
    const char *p[3] = {attempt, status, limit};
    int missing;
    json_t *rows = ctl_query_json(conn, SQL_LIST, 3, p, &missing, &err);
    if (!rows)
        return say(CTL_FAILED, "list", "%s", err.message);
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

/* The refund, when it is one an operator may resolve: its row in *r and
 * its status in *from; else CTL_FAILED (said). */
static int load_reviewable(PGconn *conn, const struct resolve_args *ra, json_t **r,
                           int *from)
{
    struct charged_error err;
    const char *p[1] = {ra->id};
    int missing;
    *r = ctl_query_json(conn, SQL_REFUND, 1, p, &missing, &err);
    if (!*r)
        return missing ? say(CTL_FAILED, "resolve", "no refund %s", ra->id)
                       : say(CTL_FAILED, "resolve", "%s", err.message);
    const char *cur = json_string_value(json_object_get(*r, "status"));
    *from = cur ? attempt_status_parse(cur) : -1;
    if (*from != ATTEMPT_STATUS_REQUIRES_REVIEW && *from != ATTEMPT_STATUS_UNKNOWN)
        return say(
            CTL_FAILED, "resolve",
            "refund %s is %s, not REQUIRES_REVIEW or UNKNOWN: only those are resolved",
            ra->id, cur ? cur : "?");
    return CTL_OK;
}

/* The decision's evidence: what the provider showed of its refund (whose it
 * is is judged on it). NULL when out of memory. */
static json_t *decision_evidence(const struct resolve_args *ra, const char *provider,
                                 const char *says, const struct provider_listed *seen)
{
    return json_pack(
        "{s:s, s:s, s:s*, s:s*, s:s*, s:s*, s:s*, s:b}", "decision", ra->status,
        "provider", provider, "provider_says", says[0] ? says : NULL,
        "provider_refund_id", ra->provider_refund_id, "provider_payment_intent",
        seen->payment_intent[0] ? seen->payment_intent : NULL, "metadata_refund_id",
        seen->refund_id[0] ? seen->refund_id : NULL, "metadata_payment_attempt_id",
        seen->payment_attempt_id[0] ? seen->payment_attempt_id : NULL, "forced",
        ra->force);
}

/* What refund_review_resolve refused, in the operator's terms: CTL_OK when
 * it resolved, else CTL_FAILED (said). */
static int say_outcome(enum refund_review_outcome o, const struct resolve_args *ra,
                       const char *why)
{
    switch (o) {
    case REFUND_REVIEW_RESOLVED:
        return CTL_OK;
    case REFUND_REVIEW_NOT_FOUND:
        return say(CTL_FAILED, "resolve", "no refund %s", ra->id);
    case REFUND_REVIEW_CHANGED:
        return say(CTL_FAILED, "resolve",
                   "refund %s changed while it was being resolved; nothing written",
                   ra->id);
    case REFUND_REVIEW_EXCEEDS:
        return say(CTL_FAILED, "resolve",
                   "refused: refund %s would take the charge's refunds past "
                   "its " REFUND_REVIEW_EXCEEDS_BOUND "; nothing written",
                   ra->id);
    case REFUND_REVIEW_LEASED:
        return say(CTL_FAILED, "resolve",
                   "refused: refund %s is leased by a worker or reconciler that may be "
                   "calling the provider under its key now; nothing written (--force "
                   "overrides)",
                   ra->id);
    case REFUND_REVIEW_MAY_EXECUTE:
        return say(CTL_FAILED, "resolve",
                   "refused: a call under refund %s's key may still execute at the "
                   "provider (its key is younger than WORKER_KEY_RETENTION_MS "
                   "allows); the reconciler settles it on evidence; nothing written "
                   "(--force overrides)",
                   ra->id);
    case REFUND_REVIEW_FOREIGN:
        return say(CTL_FAILED, "resolve",
                   "refused: %s is not refund %s's: %s; another charge's money is "
                   "never booked for this one, --force or not; nothing written",
                   ra->provider_refund_id, ra->id, why);
    case REFUND_REVIEW_NAMES_ANOTHER:
        return say(CTL_FAILED, "resolve",
                   "refused: %s is not proven refund %s's: %s; nothing written "
                   "(--force overrides)",
                   ra->provider_refund_id, ra->id, why);
    case REFUND_REVIEW_UNPROVEN:
        return say(CTL_FAILED, "resolve",
                   "refused: %s; nothing written. --force books it on your word that "
                   "it is this refund's (say, the provider's request log shows it made "
                   "under the refund's idempotency key), recorded as forced",
                   why);
    case REFUND_REVIEW_OTHER_REFUND:
        return say(CTL_FAILED, "resolve",
                   "refused: refund %s has another provider refund id recorded, or %s "
                   "is another refund's; nothing written",
                   ra->id, ra->provider_refund_id ? ra->provider_refund_id : "-");
    }
    return CTL_FAILED;
}

/* Records the decision (refund_review_resolve): CTL_OK, or CTL_FAILED
 * (said). */
static int record_decision(PGconn *conn, const struct resolve_args *ra, int from,
                           const char *evidence_text,
                           const struct provider_listed *seen)
{
    char why[400];
    struct charged_error db_err;
    struct refund_review_decision d = {
        .refund_id = ra->id,
        .expected = (enum attempt_status)from,
        .status = (enum attempt_status)attempt_status_parse(ra->status),
        .actor = ra->actor,
        .reason = ra->reason,
        .provider_refund_id = ra->provider_refund_id,
        .evidence_json = evidence_text,
        .object_payment_intent = seen->payment_intent,
        .object_refund_meta = seen->refund_id,
        .object_attempt_meta = seen->payment_attempt_id,
        .key_kept_ms = ra->key_kept_ms,
        .force = ra->force,
    };
    enum refund_review_outcome o;
    enum charged_rc src =
        refund_review_resolve(conn, &d, &o, why, sizeof(why), &db_err);
    if (src == CHARGED_WAIT)
        return say(CTL_FAILED, "resolve",
                   "refund %s is locked by another session right now; nothing "
                   "written, run resolve again",
                   ra->id);
    if (src == CHARGED_BAD_ITEM && !strcmp(db_err.code, "23505"))
        return say(
            CTL_FAILED, "resolve", "refused: %s is another refund's; nothing written",
            ra->provider_refund_id ? ra->provider_refund_id : "the provider refund id");
    if (src != CHARGED_OK)
        return say(CTL_FAILED, "resolve", "%s%s",
                   src == CHARGED_BAD_ITEM ? "the database refused the resolution: "
                                           : "",
                   db_err.message);
    return say_outcome(o, ra, why);
}

/* What was resolved, as JSON or as lines. */
static void print_resolved(const struct resolve_args *ra, const char *cur,
                           json_t *evidence)
{
    if (ra->as_json) {
        json_t *j =
            json_pack("{s:s, s:s, s:s, s:s*, s:s, s:s, s:s, s:O}", "refund_id", ra->id,
                      "old_status", cur, "status", ra->status, "provider_refund_id",
                      ra->provider_refund_id, "cause", "operator", "actor", ra->actor,
                      "reason", ra->reason, "evidence", evidence);
        if (j)
            ctl_print_json(stdout, j);
        return;
    }
    printf("%-20s %s\n", "refund_id", ra->id);
    printf("%-20s %s -> %s\n", "status", cur, ra->status);
    printf("%-20s %s\n", "provider_refund_id",
           ra->provider_refund_id ? ra->provider_refund_id : "-");
    printf("%-20s %s\n", "actor", ra->actor);
    printf("%-20s %s\n", "reason", ra->reason);
}

static int refund_resolve(PGconn *conn, const struct resolve_args *ra)
{
    int from = -1, rc;
    char *evidence_text = NULL;
    json_t *evidence = NULL, *r = NULL;
    if ((rc = load_reviewable(conn, ra, &r, &from)) != CTL_OK)
        goto out;
    rc = CTL_FAILED;
    char says[400] = "";
    struct provider_listed seen;
    const char *provider = ask_provider(ra, r, &seen, says, sizeof(says));
    if (strcmp(provider, "agrees") != 0 && !ra->force) {
        say(CTL_FAILED, "resolve", "refused: %s; nothing written (--force overrides)",
            says);
        goto out;
    }
    evidence = decision_evidence(ra, provider, says, &seen);
    evidence_text = evidence ? json_dumps(evidence, JSON_COMPACT) : NULL;
    if (!evidence_text) {
        say(CTL_FAILED, "resolve", "out of memory");
        goto out;
    }
    if ((rc = record_decision(conn, ra, from, evidence_text, &seen)) == CTL_OK)
        print_resolved(ra, json_string_value(json_object_get(r, "status")), evidence);
out:
    free(evidence_text);
    json_decref(evidence);
    json_decref(r);
    return rc;
}

/* What `refund show|list|resolve` was asked. */
struct refund_cli {
    struct resolve_args ra;
    const char *sub, *attempt, *id;
    char limit[32], canonical[37];
    int have_limit, show, list, resolve;
};

/* One option into cli; -1 to go on, else the exit status (--help, or a
 * bad value, said). */
static int take_option(int c, const char *arg, struct refund_cli *cli)
{
    struct resolve_args *ra = &cli->ra;
    int64_t n;
    switch (c) {
    case 'A':
        if (!charge_command_is_uuid(arg))
            return say(CTL_USAGE, cli->sub, "--attempt '%s' is not a UUID", arg);
        cli->attempt = arg;
        return -1;
    case 's':
        if (attempt_status_parse(arg) < 0)
            return say(CTL_USAGE, cli->sub, "--status '%s' is not a status", arg);
        ra->status = arg;
        return -1;
    case 'l':
        if (decimal_parse(arg, 100000, &n, NULL) != 0 || n < 1)
            return say(CTL_USAGE, cli->sub, "--limit '%s' must be 1..100000", arg);
        snprintf(cli->limit, sizeof(cli->limit), "%lld", (long long)n);
        cli->have_limit = 1;
        return -1;
    case 'r':
        ra->reason = arg;
        return -1;
    case 'p':
        ra->provider_refund_id = arg;
        return -1;
    case 'a':
        ra->actor = arg;
        return -1;
    case 'j':
        ra->as_json = 1;
        return -1;
    case 'F':
        ra->force = 1;
        return -1;
    default: /* 'h' */
        usage(stdout);
        return CTL_OK;
    }
}

/* The options (argv[0] is the subcommand); -1 to go on, else the exit
 * status. */
static int parse_options(int argc, char **argv, struct refund_cli *cli)
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
    int c, rc;
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == '?') {
            /* argv[0] is the subcommand: the option just read is
             * argv[optind - 1]. */
            const char *bad = argv[optind - 1];
            if (optopt && strchr("Aslrpa", optopt) && !strchr(bad, '='))
                return say(CTL_USAGE, cli->sub, "%s needs a value", bad);
            return ctl_bad_option("refund", bad);
        }
        if ((rc = take_option(c, optarg, cli)) >= 0)
            return rc;
    }
    return -1;
}

/* The positional arguments and options fit the subcommand: -1, or
 * CTL_USAGE (said). extra is the argument after the id. */
static int check_args(const struct refund_cli *cli, int nargs, const char *extra)
{
    const struct resolve_args *ra = &cli->ra;
    const char *sub = cli->sub;
    if (cli->list) {
        if (nargs != 0)
            return ctl_unexpected_argument("refund list", cli->id);
        if (ra->reason || ra->provider_refund_id || ra->actor)
            return say(CTL_USAGE, sub,
                       "--reason, --provider-refund-id and --actor are "
                       "for resolve");
        return -1;
    }
    if (nargs != 1)
        return nargs == 0 ? say(CTL_USAGE, sub, "give one REFUND_ID (see --help)")
                          : ctl_unexpected_argument("refund", extra);
    if (!charge_command_is_uuid(cli->id))
        return say(CTL_USAGE, sub, "'%s' is not a UUID", cli->id);
    if (cli->attempt || cli->have_limit || (cli->show && ra->status))
        return say(CTL_USAGE, sub, "--attempt, --limit and --status are for list");
    if (cli->show && (ra->reason || ra->provider_refund_id || ra->actor))
        return say(CTL_USAGE, sub,
                   "--reason, --provider-refund-id and --actor are "
                   "for resolve");
    return -1;
}

/* resolve's own arguments, the id made canonical: -1, or CTL_USAGE (said). */
static int check_resolve(struct refund_cli *cli)
{
    struct resolve_args *ra = &cli->ra;
    const char *sub = cli->sub;
    /* A UUID in lower case: the provider's metadata is text, listed and
     * compared as such, and charged writes it so. */
    snprintf(cli->canonical, sizeof(cli->canonical), "%s", cli->id);
    for (char *p = cli->canonical; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    ra->id = cli->canonical;
    if (!ra->status || (strcmp(ra->status, ATTEMPT_S_SUCCEEDED) &&
                        strcmp(ra->status, ATTEMPT_S_FAILED)))
        return say(CTL_USAGE, sub, "give --status SUCCEEDED or --status FAILED");
    if (!ra->reason)
        return say(CTL_USAGE, sub, "needs --reason TEXT: say how you know");
    if (!utf8_text_line(ra->reason, MAX_REASON))
        return say(CTL_USAGE, sub, "--reason must be 1..%d bytes of UTF-8 on one line",
                   MAX_REASON);
    if (ra->provider_refund_id && !good_refund_id(ra->provider_refund_id))
        return say(CTL_USAGE, sub,
                   "--provider-refund-id '%s' is not a provider refund id (re_...)",
                   ra->provider_refund_id);
    if (!strcmp(ra->status, ATTEMPT_S_SUCCEEDED) && !ra->provider_refund_id)
        return say(CTL_USAGE, sub,
                   "--status SUCCEEDED needs --provider-refund-id re_...: the "
                   "provider's refund");
    if (!ra->actor && !(ra->actor = ctl_os_user()))
        return say(CTL_USAGE, sub, "cannot tell who you are: give --actor NAME");
    if (!utf8_text_line(ra->actor, MAX_ACTOR))
        return say(CTL_USAGE, sub, "--actor must be 1..%d bytes of UTF-8 on one line",
                   MAX_ACTOR);
    return -1;
}

/* resolve asks the provider first: its client in ra->pc; -1, or CTL_USAGE
 * (said). */
static int open_provider(const config_t *cfg, struct refund_cli *cli)
{
    struct charged_error perr;
    const char *key = config_str(cfg, CONFIG_PROVIDER_API_KEY);
    if (!key || !*key)
        return say(CTL_USAGE, cli->sub,
                   "PROVIDER_API_KEY is not set: resolve asks the provider first");
    cli->ra.pc = ctl_provider_open(cfg, BUDGET_PRIO_LOOKUP, &perr);
    if (!cli->ra.pc)
        return say(CTL_USAGE, cli->sub, "%s", perr.message);
    return -1;
}

/* Connects and runs the subcommand. */
static int refund_run(config_t *cfg, struct refund_cli *cli)
{
    struct charged_error err;
    int rc;
    cli->ra.key_kept_ms = config_int(cfg, CONFIG_WORKER_KEY_RETENTION_MS);
    PGconn *conn = db_connect(config_str(cfg, CONFIG_DATABASE_URL), &err);
    if (!conn)
        return say(CTL_FAILED, NULL, "%s", err.message);
    if (cli->show)
        rc = refund_show(conn, cli->id, cli->ra.as_json);
    else if (cli->list)
        rc = refund_list(conn, cli->attempt, cli->ra.status, cli->limit,
                         cli->ra.as_json);
    else
        rc = refund_resolve(conn, &cli->ra);
    PQfinish(conn);
    return rc;
}

int ctl_refund(int argc, char **argv)
{
    struct refund_cli cli = {.limit = "50"};
    int rc;

    if (argc < 2)
        return say(CTL_USAGE, NULL, "missing subcommand (show, list, resolve; see %s)",
                   "--help");
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return CTL_OK;
    }
    cli.sub = argv[1];
    cli.show = !strcmp(cli.sub, "show");
    cli.list = !strcmp(cli.sub, "list");
    cli.resolve = !strcmp(cli.sub, "resolve");
    if (!cli.show && !cli.list && !cli.resolve)
        return say(CTL_USAGE, NULL, "unknown subcommand '%s' (show, list, resolve)",
                   cli.sub);
    if ((rc = parse_options(argc - 1, argv + 1, &cli)) >= 0)
        return rc;
    int nargs = argc - 1 - optind;
    cli.id = nargs >= 1 ? argv[1 + optind] : NULL;
    if ((rc = check_args(&cli, nargs, nargs > 1 ? argv[2 + optind] : NULL)) >= 0)
        return rc;
    if (cli.resolve && (rc = check_resolve(&cli)) >= 0)
        return rc;
    config_t *cfg = ctl_config("refund");
    if (!cfg)
        return CTL_USAGE;
    if (!cli.resolve || (rc = open_provider(cfg, &cli)) < 0)
        rc = refund_run(cfg, &cli);
    ctl_provider_close(cli.ra.pc);
    config_free(cfg);
    return rc;
}
