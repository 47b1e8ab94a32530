/* chargectl attempt: what happened to a payment attempt, without SQL. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "charge_command.h"
#include "chargectl.h"
#include "config.h"
#include "clock.h"
#include "ctl_output.h"
#include "ctl_query.h"
#include "db.h"
#include "log.h"

#define TS(col)                                                                        \
    "to_char(" col " AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"

/* clang-format off */
/* provider_calls counts the rows the call log lists: attempt_count counts
 * charges only, not the reconciler's or an operator's look-ups. */
static const char *SQL_ATTEMPT =
    "SELECT row_to_json(a)::text FROM (SELECT id AS payment_attempt_id, order_id,"
    " idempotency_key, status, reason, amount, currency, payment_method, customer_id,"
    " provider_payment_id, refunded_amount, refund_reserved,"
    " (SELECT count(*) FROM provider_calls c WHERE c.payment_attempt_id = p.id)"
    "   AS provider_calls,"
    " last_error, lease_owner, " TS("lease_expires_at") " AS lease_expires_at,"
    " lease_epoch, " TS("first_sent_at") " AS first_sent_at,"
    " " TS("next_check_at") " AS next_check_at,"
    " " TS("created_at") " AS created_at, " TS("updated_at") " AS updated_at"
    " FROM payment_attempts p WHERE id = $1::uuid) a";
/* clang-format on */

static const char *SQL_TRANSITIONS =
    "SELECT coalesce(json_agg(t ORDER BY t.id), '[]')::text FROM (SELECT id,"
    " " TS("created_at") " AS at, old_status, new_status, cause, actor, reason,"
                         " evidence FROM attempt_transitions WHERE payment_attempt_id "
                         "= $1::uuid) t";

static const char *SQL_CALLS =
    "SELECT coalesce(json_agg(c ORDER BY c.id), '[]')::text FROM (SELECT id,"
    " " TS("started_at") " AS started_at, operation, outcome, http_status, replayed,"
                         " latency_ms, provider_payment_id, error, actor FROM "
                         "provider_calls"
                         " WHERE payment_attempt_id = $1::uuid) c";

static const char *SQL_LEDGER =
    "SELECT coalesce(json_agg(l ORDER BY l.id), '[]')::text FROM (SELECT id, kind, "
    "amount,"
    " currency, provider_payment_id, " TS(
        "created_at") " AS created_at"
                      " FROM ledger_entries WHERE payment_attempt_id = $1::uuid) l";

static const char *SQL_EVENTS =
    "SELECT coalesce(json_agg(e ORDER BY e.created_at), '[]')::text FROM (SELECT "
    "event_id,"
    " event_type, topic, " TS(
        "created_at") " AS created_at,"
                      " " TS(
                          "published_at") " AS published_at, payload, created_at AS c"
                                          " FROM outbox WHERE payment_attempt_id = "
                                          "$1::uuid) e";

static const char *SQL_REFUNDS =
    "SELECT coalesce(json_agg(r ORDER BY r.c, r.refund_id), '[]')::text FROM (SELECT"
    " id AS refund_id, status, amount, currency, refund_reason, reason,"
    " provider_refund_id, " TS(
        "updated_at") " AS updated_at, created_at AS c"
                      " FROM refund_attempts WHERE payment_attempt_id = $1::uuid) r";

static const char *SQL_LIST =
    "SELECT coalesce(json_agg(a), '[]')::text FROM (SELECT id AS payment_attempt_id,"
    " order_id, status, amount, currency, provider_payment_id, reason,"
    " " TS("updated_at") " AS updated_at FROM payment_attempts"
                         " WHERE ($1::uuid IS NULL OR order_id = $1::uuid)"
                         "   AND ($2::text IS NULL OR status = $2)"
                         "   AND ($3::bigint IS NULL OR updated_at < now() - "
                         "make_interval(secs => $3 / 1000.0))"
                         " ORDER BY updated_at DESC LIMIT $4::int) a";

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
        "[--json]\n\n"
        "  show           the attempt, every status transition with its cause and\n"
        "                 evidence, every provider call with its outcome, its ledger\n"
        "                 entries, its result events, its refunds (and\n"
        "                 refunded_amount, refund_reserved)\n"
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

static int attempt_show(PGconn *conn, const char *id, int as_json)
{
    char err[512];
    const char *p[1] = {id};
    int missing;
    json_t *a = ctl_query_json(conn, SQL_ATTEMPT, 1, p, &missing, err, sizeof(err));
    if (!a) {
        if (missing)
            fprintf(stderr, "chargectl attempt show: no attempt %s\n", id);
        else
            fprintf(stderr, "chargectl attempt show: %s\n", err);
        return CTL_FAILED;
    }
    json_t *tr =
        ctl_query_json(conn, SQL_TRANSITIONS, 1, p, &missing, err, sizeof(err));
    json_t *calls = ctl_query_json(conn, SQL_CALLS, 1, p, &missing, err, sizeof(err));
    json_t *ledger = ctl_query_json(conn, SQL_LEDGER, 1, p, &missing, err, sizeof(err));
    json_t *events = ctl_query_json(conn, SQL_EVENTS, 1, p, &missing, err, sizeof(err));
    json_t *refunds =
        ctl_query_json(conn, SQL_REFUNDS, 1, p, &missing, err, sizeof(err));
    if (!tr || !calls || !ledger || !events || !refunds) {
        fprintf(stderr, "chargectl attempt show: %s\n", err);
        json_decref(a);
        json_decref(tr);
        json_decref(calls);
        json_decref(ledger);
        json_decref(events);
        json_decref(refunds);
        return CTL_FAILED;
    }
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) json_object_del(e, "c");
    json_array_foreach(refunds, i, e) json_object_del(e, "c");
    if (as_json) {
        /* json_object_set_new steals each reference. */
        json_object_set_new(a, "transitions", tr);
        json_object_set_new(a, "provider_call_log", calls);
        json_object_set_new(a, "ledger_entries", ledger);
        json_object_set_new(a, "result_events", events);
        json_object_set_new(a, "refunds", refunds);
        ctl_print_json(stdout, a);
        return CTL_OK;
    }
    const char *k;
    json_t *v;
    json_object_foreach(a, k, v)
    {
        char buf[512];
        const char *s = ctl_cell(a, k, buf, sizeof(buf));
        printf("%-20s %s\n", k, s ? s : "-");
    }
    printf("\ntransitions:\n");
    const char *th[] = {"AT",    "FROM",   "TO",       "CAUSE",
                        "ACTOR", "REASON", "EVIDENCE", NULL};
    const char *tk[] = {"at",    "old_status", "new_status", "cause",
                        "actor", "reason",     "evidence",   NULL};
    ctl_print_rows(tr, th, tk);
    printf("\nprovider calls:\n");
    const char *ch[] = {"STARTED_AT", "OPERATION",  "OUTCOME", "HTTP", "REPLAYED",
                        "LATENCY_MS", "PAYMENT_ID", "ERROR",   NULL};
    const char *ck[] = {"started_at",          "operation", "outcome",
                        "http_status",         "replayed",  "latency_ms",
                        "provider_payment_id", "error",     NULL};
    ctl_print_rows(calls, ch, ck);
    printf("\nledger entries:\n");
    const char *lh[] = {"CREATED_AT", "KIND", "AMOUNT", "CURRENCY", "PAYMENT_ID", NULL};
    const char *lk[] = {"created_at",          "kind", "amount", "currency",
                        "provider_payment_id", NULL};
    ctl_print_rows(ledger, lh, lk);
    printf("\nresult events:\n");
    const char *eh[] = {"CREATED_AT", "TYPE", "EVENT_ID", "PUBLISHED_AT", NULL};
    const char *ek[] = {"created_at", "event_type", "event_id", "published_at", NULL};
    ctl_print_rows(events, eh, ek);
    printf("\nrefunds:\n");
    const char *rh[] = {"REFUND",           "STATUS",     "AMOUNT", "REFUND_REASON",
                        "REFUND_ID_AT_PSP", "UPDATED_AT", "REASON", NULL};
    const char *rk[] = {"refund_id",          "status",     "amount", "refund_reason",
                        "provider_refund_id", "updated_at", "reason", NULL};
    ctl_print_rows(refunds, rh, rk);
    json_decref(refunds);
    json_decref(a);
    json_decref(tr);
    json_decref(calls);
    json_decref(ledger);
    json_decref(events);
    return CTL_OK;
}

static int attempt_list(PGconn *conn, const char *order, const char *status,
                        const char *older, const char *limit, int as_json)
{
    char err[512];
    const char *p[4] = {order, status, older, limit};
    int missing;
    json_t *rows = ctl_query_json(conn, SQL_LIST, 4, p, &missing, err, sizeof(err));
    if (!rows) {
        fprintf(stderr, "chargectl attempt list: %s\n", err);
        return CTL_FAILED;
    }
    if (as_json) {
        ctl_print_json(stdout, rows);
        return CTL_OK;
    }
    const char *h[] = {"ATTEMPT",  "ORDER",      "STATUS", "AMOUNT",
                       "CURRENCY", "UPDATED_AT", "REASON", NULL};
    const char *k[] = {"payment_attempt_id", "order_id",   "status", "amount",
                       "currency",           "updated_at", "reason", NULL};
    ctl_print_rows(rows, h, k);
    json_decref(rows);
    return CTL_OK;
}

int ctl_attempt(int argc, char **argv)
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
    const char *order = NULL, *status = NULL;
    char older[32], limit[32] = "50";
    struct store_error err;
    int have_older = 0, have_limit = 0, as_json = 0, c, rc;

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
    optind = 1;
    opterr = 0; /* we say it ourselves, in one line */
    while ((c = getopt_long(argc - 1, argv + 1, "", opts, NULL)) != -1) {
        switch (c) {
        case 'o':
            if (!charge_command_is_uuid(optarg)) {
                fprintf(stderr, "chargectl attempt: --order '%s' is not a UUID\n",
                        optarg);
                return CTL_USAGE;
            }
            order = optarg;
            break;
        case 's': {
            if (attempt_status_parse(optarg) < 0) {
                fprintf(stderr, "chargectl attempt: --status '%s' is not a status\n",
                        optarg);
                return CTL_USAGE;
            }
            status = optarg;
            break;
        }
        case 'a': {
            int64_t ms;
            if (clock_parse_duration_ms(optarg, &ms) != 0) {
                fprintf(
                    stderr,
                    "chargectl attempt: --older-than '%s' is not a duration (30s, 15m, "
                    "2h, 7d)\n",
                    optarg);
                return CTL_USAGE;
            }
            snprintf(older, sizeof(older), "%lld", (long long)ms);
            have_older = 1;
            break;
        }
        case 'l': {
            int64_t n;
            if (ctl_parse_number(optarg, 100000, &n, NULL) != 0 || n < 1) {
                fprintf(stderr, "chargectl attempt: --limit '%s' must be 1..100000\n",
                        optarg);
                return CTL_USAGE;
            }
            snprintf(limit, sizeof(limit), "%lld", (long long)n);
            have_limit = 1;
            break;
        }
        case 'j':
            as_json = 1;
            break;
        case 'h':
            usage(stdout);
            return CTL_OK;
        default:
            return ctl_bad_option("attempt", argv[optind]);
        }
    }
    int nargs = argc - 1 - optind;
    const char *id = nargs == 1 ? argv[1 + optind] : NULL;
    if (!strcmp(sub, "show")) {
        if (nargs != 1 || order || status || have_older || have_limit) {
            fprintf(stderr,
                    "chargectl attempt show: give one PAYMENT_ATTEMPT_ID (and "
                    "optionally --json)%s\n",
                    order        ? "; --order is for list"
                    : status     ? "; --status is for list"
                    : have_older ? "; --older-than is for list"
                    : have_limit ? "; --limit is for list"
                                 : "");
            return CTL_USAGE;
        }
        if (!charge_command_is_uuid(id)) {
            fprintf(stderr, "chargectl attempt show: '%s' is not a UUID\n", id);
            return CTL_USAGE;
        }
    } else if (nargs != 0) {
        fprintf(stderr, "chargectl attempt list: takes no positional argument\n");
        return CTL_USAGE;
    }
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
        rc = attempt_show(conn, id, as_json);
    else
        rc = attempt_list(conn, order, status, have_older ? older : NULL, limit,
                          as_json);
    PQfinish(conn);
    config_free(cfg);
    return rc;
}
