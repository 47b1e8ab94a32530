#include "console_views.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "attempt_history.h"
#include "attempt_review.h"
#include "attempt_store.h"
#include "audit_policy.h"
#include "audit_store.h"
#include "card_data.h"
#include "charged_assert.h"
#include "clock.h"
#include "console_kinds.h"
#include "db.h"
#include "dead_letter_reason.h"
#include "dlq_reader.h"
#include "fleet_status.h"
#include "log.h"
#include "op.h"
#include "provider_client.h"

/* What an overview waits for one worker's metrics or Kafka's answer: a
 * worker that does not answer is shown as such, not waited for. */
#define FLEET_TIMEOUT_MS 2000
#define REVIEW_LIMIT     "200"
/* Reviews shown with their evidence on the list itself; the rest show it
 * when opened. */
#define REVIEW_EVIDENCE_MAX 50
#define LETTERS_DEFAULT     100
#define ACTIONS_LIMIT       200

/* The newest offsets of each dead-letter partition a list or the overview
 * reads (as summaries): a request's memory does not grow with the topic. */
#define LETTERS_READ_CAP 2000

struct console_views {
    const config_t *cfg;
    const char *url;
    console_store_t *cs;
    attempt_store_t *attempts;
    audit_store_t *audit;
    provider_client_t *pc;
    PGconn *conn; /* attempt_history's and attempt_review's */
};

static unsigned answer(json_t **body, unsigned status, const char *fmt, ...)
{
    char text[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    /* An error may quote a letter's header (a refused topic, say). */
    card_data_mask_loose(text, strlen(text));
    *body = json_pack("{s:s}", "error", text);
    return status;
}

static unsigned unavailable(json_t **body, const char *what, const char *why)
{
    log_warn("console: a read failed", "what", what, "error", why, NULL);
    return answer(body, 503, "%s unavailable: %s", what, why);
}

console_views_t *console_views_new(const config_t *cfg, struct charged_error *err)
{
    console_views_t *v = calloc(1, sizeof(*v));
    if (!v) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    v->cfg = cfg;
    v->url = config_str(cfg, CONFIG_DATABASE_URL);
    const char *actor = config_str(cfg, CONFIG_WORKER_ID);
    if (!(v->cs = console_store_new(v->url, err)) ||
        !(v->attempts =
              attempt_store_new(v->url, actor ? actor : "charged-console", err)) ||
        !(v->audit = audit_store_new(v->url, err)))
        goto fail;
    v->pc = provider_client_new(config_str(cfg, CONFIG_PROVIDER_BASE_URL),
                                config_str(cfg, CONFIG_PROVIDER_API_KEY),
                                config_str(cfg, CONFIG_PROVIDER_API_VERSION),
                                (long)config_int(cfg, CONFIG_PROVIDER_TIMEOUT_MS), err);
    if (!v->pc)
        goto fail;
    return v;
fail:
    console_views_free(v);
    return NULL;
}

provider_client_t *console_views_provider(console_views_t *v)
{
    return v->pc;
}

void console_views_free(console_views_t *v)
{
    if (!v)
        return;
    console_store_free(v->cs);
    attempt_store_free(v->attempts);
    audit_store_free(v->audit);
    provider_client_free(v->pc);
    if (v->conn)
        PQfinish(v->conn);
    free(v);
}

console_store_t *console_views_store(console_views_t *v)
{
    return v->cs;
}

/* The connection of the history and review calls, opened again after it
 * broke: the next request after an outage finds the database back. */
static PGconn *conn_get(console_views_t *v, struct charged_error *err)
{
    if (v->conn && PQstatus(v->conn) == CONNECTION_OK)
        return v->conn;
    if (v->conn)
        PQfinish(v->conn);
    v->conn = db_connect(v->url, err);
    return v->conn;
}

/* Masks every card number in every string of v, object keys included
 * (card_data_mask): what a dead letter carries reaches the screen only
 * masked, whichever member it hides in. Returns v, or NULL when out of
 * memory (v is freed then). */
static json_t *masked(json_t *v)
{
    if (json_is_number(v)) {
        /* A card number written as a JSON number (4242424242424242, or
         * 4242424242424242e0, which comes back as the real
         * "4242424242424242.0"): the digits of its mantissa. */
        char text[64], digits[64];
        size_t n = 0, len = json_dumpb(v, text, sizeof(text) - 1, JSON_ENCODE_ANY);
        if (len == 0 || len >= sizeof(text) - 1)
            return v;
        text[len] = '\0';
        if (len > 2 && !strcmp(text + len - 2, ".0"))
            text[len - 2] = '\0'; /* jansson's mark of a real, not a digit */
        for (const char *p = text; *p && *p != 'e' && *p != 'E'; p++)
            if (*p >= '0' && *p <= '9')
                digits[n++] = *p;
        digits[n] = '\0';
        /* A long number as a real has lost its last digits (and with them
         * the Luhn check): one of a card's length and first digit is
         * masked all the same. */
        int card_like = n >= 13 && n <= 19 && digits[0] >= '2' && digits[0] <= '6';
        if (!card_data_found(digits, n) && !card_like)
            return v;
        if (card_data_mask(digits, n) == 0)
            memset(digits, '*', n - 4);
        json_decref(v);
        return json_string(digits);
    }
    if (json_is_string(v)) {
        size_t n = json_string_length(v);
        char *copy = malloc(n + 1);
        if (!copy) {
            json_decref(v);
            return NULL;
        }
        memcpy(copy, json_string_value(v), n + 1);
        if (card_data_mask_loose(copy, n) > 0)
            json_string_setn_nocheck(v, copy, n);
        free(copy);
        return v;
    }
    if (json_is_array(v)) {
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *item = json_incref(json_array_get(v, i));
            if (!(item = masked(item)) || json_array_set_new(v, i, item) != 0) {
                json_decref(v);
                return NULL;
            }
        }
        return v;
    }
    if (json_is_object(v)) {
        json_t *out = json_object();
        const char *k;
        json_t *item;
        json_object_foreach(v, k, item)
        {
            json_t *key = masked(json_string(k));
            json_t *m = masked(json_incref(item));
            if (!out || !key || !m ||
                json_object_set_new_nocheck(out, json_string_value(key), m) != 0) {
                json_decref(key);
                json_decref(m);
                json_decref(out);
                json_decref(v);
                return NULL;
            }
            json_decref(key);
        }
        json_decref(v);
        return out;
    }
    return v;
}

/* ---- overview ---- */

static json_t *part_error(const char *why)
{
    return json_pack("{s:s}", "error", why);
}

static json_t *unknown_part(console_views_t *v)
{
    enum attempt_status st[1] = {ATTEMPT_STATUS_UNKNOWN};
    long long count = 0, oldest_ms = 0;
    struct charged_error err;
    if (attempt_store_backlog(v->attempts, st, 1, &count, &oldest_ms, &err) !=
        CHARGED_OK)
        return part_error(err.message);
    return json_pack("{s:I, s:I}", "count", (json_int_t)count, "oldest_age_ms",
                     (json_int_t)oldest_ms);
}

static json_t *letters_part(console_views_t *v)
{
    struct charged_error err;
    json_t *by = json_object(), *o = NULL;
    dlq_reader_t *r = dlq_reader_new(v->cfg, &err);
    if (!r || dlq_reader_read_newest(r, LETTERS_READ_CAP, &err) != CHARGED_OK || !by) {
        o = part_error(err.message);
        goto out;
    }
    size_t n = dlq_reader_count(r);
    for (size_t i = 0; i < n; i++) {
        const char *reason = dlq_reader_letter(r, i)->reason;
        if (!reason)
            reason = "(none)";
        json_t *c = json_object_get(by, reason);
        json_object_set_new(by, reason,
                            json_integer(c ? json_integer_value(c) + 1 : 1));
    }
    o = json_pack("{s:I, s:I, s:I, s:o}", "total", (json_int_t)n, "in_topic",
                  (json_int_t)dlq_reader_total(r), "newest_per_partition",
                  (json_int_t)LETTERS_READ_CAP, "by_reason", masked(json_incref(by)));
out:
    json_decref(by);
    dlq_reader_free(r);
    return o;
}

static json_t *audit_part(console_views_t *v)
{
    long long counts[AUDIT_KIND__COUNT] = {0}, total = 0;
    struct charged_error err;
    if (audit_store_findings_by_kind(v->audit, counts, &err) != CHARGED_OK)
        return part_error(err.message);
    json_t *by = json_object();
    for (int k = 0; by && k < AUDIT_KIND__COUNT; k++) {
        total += counts[k];
        json_object_set_new(by, audit_kind_name(k), json_integer(counts[k]));
    }
    return json_pack("{s:I, s:o}", "total", (json_int_t)total, "by_kind",
                     by ? by : json_null());
}

unsigned console_views_overview(console_views_t *v, json_t **body)
{
    struct charged_error serr;
    struct charged_error err;
    json_t *counts = NULL;
    json_t *o = json_object();
    if (!o)
        return answer(body, 500, "out of memory");
    if (console_store_status_counts(v->cs, &counts, &serr) == CHARGED_OK)
        json_object_set_new(o, "attempts", counts);
    else
        json_object_set_new(o, "attempts", part_error(serr.message));
    json_object_set_new(o, "unknown", unknown_part(v));
    json_object_set_new(o, "dead_letters", letters_part(v));
    json_object_set_new(
        o, "breakers",
        fleet_status_breakers(config_str(v->cfg, CONFIG_CONSOLE_WORKER_METRICS),
                              FLEET_TIMEOUT_MS));
    json_t *lag = fleet_status_lag(
        v->cfg, config_str(v->cfg, CONFIG_CONSOLE_WORKER_GROUP),
        config_str(v->cfg, CONFIG_CHARGE_COMMANDS_TOPIC), FLEET_TIMEOUT_MS, &err);
    json_object_set_new(o, "consumer_lag", lag ? lag : part_error(err.message));
    json_object_set_new(o, "audit_findings", audit_part(v));
    *body = o;
    return 200;
}

/* ---- attempts ---- */

/* The transition that put a review there: its reason and evidence. */
static void add_review_evidence(PGconn *conn, json_t *row)
{
    struct charged_error err;
    json_t *doc = NULL;
    const char *id = json_string_value(json_object_get(row, "payment_attempt_id"));
    struct attempt_history_table t;
    payment_ops_history(&t);
    if (!id || attempt_history_read(conn, id, &t, &doc, &err) != CHARGED_OK)
        return;
    json_t *tr = json_object_get(doc, "transitions");
    json_t *last = json_array_get(tr, json_array_size(tr) - 1);
    if (last)
        json_object_set(row, "review", last);
    json_decref(doc);
}

/* The queue's other kinds (issue 37): the records in review of each
 * operation of the table with a review (its queue_sql), newest first,
 * each with its kind and its authorization's status. */
static const char *SQL_STEPS_HEAD =
    "SELECT coalesce(json_agg(r), '[]')::text FROM (SELECT * FROM (";
static const char *SQL_STEPS_TAIL =
    ") s ORDER BY updated_at DESC, id LIMIT " REVIEW_LIMIT ") r";

/* The statement of the table's reviews' parts into buf: 0 when it does
 * not fit. */
static int steps_sql(const struct step_review_kind *const *r, size_t n, char *buf,
                     size_t size)
{
    size_t used = (size_t)snprintf(buf, size, "%s", SQL_STEPS_HEAD);
    CHARGED_ASSERT(n > 0);
    for (size_t i = 0; i < n && used < size; i++)
        used += (size_t)snprintf(buf + used, size - used, "%s%s", i ? " UNION ALL" : "",
                                 r[i]->queue_sql);
    if (used < size)
        used += (size_t)snprintf(buf + used, size - used, "%s", SQL_STEPS_TAIL);
    return used < size;
}

/* Whether a queue's row is an operation's whose records are attempts. */
static int of_attempts(json_t *st)
{
    const struct step_review_kind *k =
        payment_ops_review(json_string_value(json_object_get(st, "kind")));
    return k && k->attempts;
}

/* The attempts of rows that are not another operation's (those are its
 * review's), each with its kind, "charge". */
static json_t *charges_only(json_t *rows, json_t *steps)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < json_array_size(rows); i++) {
        json_t *a = json_array_get(rows, i);
        const char *id = json_string_value(json_object_get(a, "payment_attempt_id"));
        int theirs = 0;
        for (size_t j = 0; id && j < json_array_size(steps); j++) {
            json_t *st = json_array_get(steps, j);
            theirs |= of_attempts(st) &&
                      !strcmp(json_string_value(json_object_get(st, "id")), id);
        }
        if (!theirs) {
            json_object_set_new(a, "kind", json_string("charge"));
            json_array_append(out, a);
        }
    }
    json_decref(rows);
    return out;
}

unsigned console_views_reviews(console_views_t *v, json_t **body)
{
    struct charged_error err;
    json_t *rows = NULL, *steps = NULL;
    PGconn *conn = conn_get(v, &err);
    struct attempt_history_filter f = {.status = "REQUIRES_REVIEW",
                                       .limit = REVIEW_LIMIT};
    if (!conn || attempt_history_list(conn, &f, &rows, &err) != CHARGED_OK)
        return unavailable(body, "the review queue", err.message);
    const struct step_review_kind *r[PAYMENT_OPS_MAX];
    char sql[8192];
    size_t nr = payment_ops_reviews(r);
    /* The parts are the table's, and fit. */
    CHARGED_ASSERT(steps_sql(r, nr, sql, sizeof(sql)));
    if (db_query_json(conn, sql, 0, NULL, &steps, &err) != CHARGED_OK) {
        json_decref(rows);
        return unavailable(body, "the review queue", err.message);
    }
    rows = charges_only(rows, steps);
    for (size_t i = 0; i < json_array_size(rows) && i < REVIEW_EVIDENCE_MAX; i++)
        add_review_evidence(conn, json_array_get(rows, i));
    *body = json_pack("{s:o, s:o, s:o*}", "reviews", rows, "steps", steps, "step_view",
                      console_kinds_reviews());
    return 200;
}

unsigned console_views_find(console_views_t *v, const char *id, json_t **body)
{
    struct charged_error err;
    json_t *rows = NULL;
    PGconn *conn = conn_get(v, &err);
    if (!conn || attempt_history_find(conn, id, &rows, &err) != CHARGED_OK)
        return unavailable(body, "attempts", err.message);
    *body = json_pack("{s:o}", "attempts", rows);
    return 200;
}

unsigned console_views_attempt(console_views_t *v, const char *id, json_t **body)
{
    struct charged_error err;
    json_t *doc = NULL;
    PGconn *conn = conn_get(v, &err);
    if (!conn)
        return unavailable(body, "the attempt", err.message);
    struct attempt_history_table t;
    payment_ops_history(&t);
    enum charged_rc rc = attempt_history_read(conn, id, &t, &doc, &err);
    if (rc == CHARGED_NOT_FOUND)
        return answer(body, 404, "no payment attempt %s", id);
    if (rc != CHARGED_OK)
        return unavailable(body, "the attempt", err.message);
    console_kinds_steps(doc, &t);
    *body = doc;
    return 200;
}

static const char *outcome_names[] = {
    [ATTEMPT_REVIEW_RESOLVED] = "resolved",
    [ATTEMPT_REVIEW_NOT_FOUND] = "not_found",
    [ATTEMPT_REVIEW_NOT_IN_REVIEW] = "not_in_review",
    [ATTEMPT_REVIEW_BOOKED_ELSEWHERE] = "booked_elsewhere",
    [ATTEMPT_REVIEW_REFUSED] = "refused",
    [ATTEMPT_REVIEW_BUSY] = "busy",
    [ATTEMPT_REVIEW_CHANGED] = "changed",
    [ATTEMPT_REVIEW_ERROR] = "error",
    [ATTEMPT_REVIEW_WITHDRAWN] = "withdrawn",
};

/* A conflict is 409, never a 500: someone else resolved it, holds it, or
 * the intent pays another attempt. The provider's objection is 422: the
 * request was understood and the evidence says no. */
static const unsigned outcome_status[] = {
    [ATTEMPT_REVIEW_RESOLVED] = 200,      [ATTEMPT_REVIEW_NOT_FOUND] = 404,
    [ATTEMPT_REVIEW_NOT_IN_REVIEW] = 409, [ATTEMPT_REVIEW_BOOKED_ELSEWHERE] = 409,
    [ATTEMPT_REVIEW_REFUSED] = 422,       [ATTEMPT_REVIEW_BUSY] = 409,
    [ATTEMPT_REVIEW_CHANGED] = 409,       [ATTEMPT_REVIEW_ERROR] = 503,
    [ATTEMPT_REVIEW_WITHDRAWN] = 401,
};

/* Writes one row of console_actions: 0, or -1 (logged) when it could not. */
static int record(console_views_t *v, const char *actor, const char *action,
                  const char *target, const char *outcome, json_t *detail)
{
    struct charged_error err;
    char *text = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
    int rc = 0;
    if (console_store_record(v->cs, actor, action, target, outcome, text, &err) !=
        CHARGED_OK) {
        log_error("console: an action was not recorded", "actor", actor, "action",
                  action, "target", target, "outcome", outcome, "error", err.message,
                  NULL);
        rc = -1;
    }
    free(text);
    return rc;
}

/* The session behind a resolution, asked again before it is written. */
struct still_signed_in {
    console_views_t *v;
    const char *session;
    const struct console_who *who;
};

static int still_operator(void *ctx)
{
    struct still_signed_in *s = ctx;
    struct console_who now;
    struct charged_error err;
    return console_store_session(s->v->cs, s->session, &now, &err) == CHARGED_OK &&
           now.role == CONSOLE_ROLE_OPERATOR && !strcmp(now.name, s->who->name);
}

unsigned console_views_resolve(console_views_t *v, const struct console_who *who,
                               const char *session, const char *attempt_id,
                               const struct console_resolve_input *in, json_t **body)
{
    struct still_signed_in signed_in = {v, session, who};
    struct attempt_review_request rq = {
        .attempt_id = attempt_id,
        .intent_id = in->failed ? NULL : in->intent_id,
        .reason = in->reason[0] ? in->reason : NULL,
        .actor = who->name,
        .force = in->force,
        .still_allowed = still_operator,
        .ctx = &signed_in,
    };
    struct attempt_review_result res;
    struct charged_error err;
    char why[512];

    if (attempt_review_check(&rq, why, sizeof(why)) != 0)
        return answer(body, 400, "%s", why);
    PGconn *conn = conn_get(v, &err);
    if (!conn)
        return unavailable(body, "the database", err.message);
    /* Recorded before the provider is asked: no decision without its record. */
    json_t *asked =
        json_pack("{s:s, s:s?, s:b}", "decision", in->failed ? "FAILED" : "SUCCEEDED",
                  "payment_intent_id", rq.intent_id, "force", in->force);
    int unrecorded = record(v, who->name, "resolve", attempt_id, "requested", asked);
    json_decref(asked);
    if (unrecorded)
        return answer(body, 503, "the action could not be recorded; nothing decided");
    attempt_review_resolve(
        conn, v->attempts, v->pc, config_int(v->cfg, CONFIG_RECONCILER_SEARCH_LAG_MS),
        config_int(v->cfg, CONFIG_WORKER_KEY_RETENTION_MS), &rq, &res);
    const char *outcome = outcome_names[res.outcome];
    json_t *o = json_pack("{s:s, s:s, s:s, s:s?, s:b, s:s?, s:s?, s:s?, s:s}",
                          "payment_attempt_id", attempt_id, "outcome", outcome,
                          "decision", in->failed ? "FAILED" : "SUCCEEDED", "verdict",
                          res.verdict, "forced", res.forced, "provider_says",
                          res.provider_says[0] ? res.provider_says : NULL, "status",
                          res.status[0] ? res.status : NULL, "provider_payment_id",
                          res.provider_payment_id[0] ? res.provider_payment_id : NULL,
                          "message", res.message);
    if (o && res.evidence)
        json_object_set(o, "evidence", res.evidence);
    if (o && res.outcome != ATTEMPT_REVIEW_RESOLVED)
        json_object_set_new(o, "error", json_string(res.message));
    if (o && res.outcome == ATTEMPT_REVIEW_REFUSED)
        json_object_set_new(o, "can_force", json_true());
    json_t *detail = json_pack("{s:s, s:s?, s:s?, s:b, s:s?, s:s?}", "decision",
                               in->failed ? "FAILED" : "SUCCEEDED", "payment_intent_id",
                               rq.intent_id, "reason", rq.reason, "force", in->force,
                               "verdict", res.verdict, "message", res.message);
    record(v, who->name, "resolve", attempt_id, outcome, detail);
    json_decref(detail);
    log_info("console: review resolve", "actor", who->name, "payment_attempt_id",
             attempt_id, "outcome", outcome, "forced", res.forced ? "true" : "false",
             NULL);
    unsigned status = outcome_status[res.outcome];
    attempt_review_result_clear(&res);
    *body = o;
    return status;
}

/* ---- dead letters ---- */

static unsigned letters_unreachable(json_t **body, enum charged_rc rc, const char *err)
{
    if (rc == CHARGED_NOT_FOUND)
        return answer(body, 404, "%s", err);
    return unavailable(body, "dead letters", err);
}

unsigned console_views_letters(console_views_t *v, const struct console_letter_query *q,
                               json_t **body)
{
    struct charged_error err;
    struct dlq_filters f = {
        .reason = q->reason[0] ? q->reason : NULL,
        .attempt = q->attempt[0] ? q->attempt : NULL,
        .order = q->order[0] ? q->order : NULL,
        .limit = q->limit ? q->limit : LETTERS_DEFAULT,
    };
    if (q->since[0] && clock_parse_time_ms(q->since, &f.since_ms) != 0)
        return answer(body, 400, "since is not an RFC 3339 UTC time or a duration");
    if (q->until[0] && clock_parse_time_ms(q->until, &f.until_ms) != 0)
        return answer(body, 400, "until is not an RFC 3339 UTC time or a duration");
    f.have_since = q->since[0] != '\0';
    f.have_until = q->until[0] != '\0';
    dlq_reader_t *r = dlq_reader_new(v->cfg, &err);
    if (!r)
        return unavailable(body, "dead letters", err.message);
    enum charged_rc rc = dlq_reader_read_newest(r, LETTERS_READ_CAP, &err);
    if (rc != CHARGED_OK) {
        dlq_reader_free(r);
        return letters_unreachable(body, rc, err.message);
    }
    size_t n = 0;
    const struct dlq_letter **sel = dlq_reader_select(r, &f, &n);
    json_t *list = json_array();
    for (size_t i = 0; sel && list && i < n; i++)
        json_array_append_new(list, masked(dlq_letter_summary_json(sel[i])));
    json_t *reasons = json_array();
    for (int i = 0; reasons && i < DEAD_LETTER__COUNT; i++)
        if (dead_letter_reason_name(i))
            json_array_append_new(reasons, json_string(dead_letter_reason_name(i)));
    *body = json_pack(
        "{s:o, s:I, s:I, s:I, s:I, s:o}", "letters", list ? list : json_array(), "read",
        (json_int_t)dlq_reader_count(r), "in_topic", (json_int_t)dlq_reader_total(r),
        "newest_per_partition", (json_int_t)LETTERS_READ_CAP, "limit",
        (json_int_t)f.limit, "reasons", reasons ? reasons : json_array());
    free(sel);
    dlq_reader_free(r);
    return 200;
}

static int replayable(const config_t *cfg, const struct dlq_letter *l)
{
    /* As dlq_reader_replay decides: the command topic only. */
    const char *commands = config_str(cfg, CONFIG_CHARGE_COMMANDS_TOPIC);
    return l->orig_topic && commands && !strcmp(l->orig_topic, commands) &&
           !(l->reason && !strcmp(l->reason, "card_data_refused"));
}

unsigned console_views_letter(console_views_t *v, const char *position, json_t **body)
{
    struct charged_error err;
    int32_t p;
    int64_t off;
    if (console_input_position(position, &p, &off) != 0)
        return answer(body, 400, "not PARTITION:OFFSET");
    dlq_reader_t *r = dlq_reader_new(v->cfg, &err);
    if (!r)
        return unavailable(body, "dead letters", err.message);
    enum charged_rc rc = dlq_reader_read_one(r, p, off, &err);
    if (rc != CHARGED_OK || dlq_reader_count(r) == 0) {
        dlq_reader_free(r);
        return letters_unreachable(body, rc == CHARGED_OK ? CHARGED_NOT_FOUND : rc,
                                   rc == CHARGED_OK ? "no such dead letter"
                                                    : err.message);
    }
    const struct dlq_letter *l = dlq_reader_letter(r, 0);
    json_t *o = masked(dlq_letter_json(r, l, 1));
    if (o)
        json_object_set_new(o, "replayable", json_boolean(replayable(v->cfg, l)));
    dlq_reader_free(r);
    *body = o;
    return 200;
}

static json_t *replay_item_json(dlq_reader_t *r, const struct dlq_replay_item *it,
                                const char *actor, int dry_run)
{
    json_t *o = dlq_letter_summary_json(it->letter);
    if (!o)
        return NULL;
    json_object_set_new(o, "skipped", json_boolean(it->skipped));
    if (it->skipped)
        json_object_set_new(
            o, "why_skipped",
            json_string("card_data_refused: its card digits are masked, "
                        "so it cannot be sent again; the sender must "
                        "send a clean command"));
    if (dry_run && !it->skipped)
        json_object_set_new(o, "message",
                            dlq_replay_message_json(r, it->letter, actor, 1));
    if (!dry_run) {
        json_object_set_new(o, "sent", json_boolean(it->sent));
        if (it->sent) {
            json_object_set_new(o, "sent_partition", json_integer(it->to_partition));
            json_object_set_new(o, "sent_offset", json_integer(it->to_offset));
        }
    }
    if (it->error[0])
        json_object_set_new(o, "send_error", json_string(it->error));
    return o;
}

unsigned console_views_replay(console_views_t *v, const struct console_who *who,
                              const struct console_replay_input *in, json_t **body)
{
    struct charged_error err;
    char target[96];
    unsigned status = 200;
    const struct dlq_letter **sel = calloc(in->n + 1, sizeof(*sel));
    struct dlq_replay_item *items = calloc(in->n + 1, sizeof(*items));
    dlq_reader_t *r = NULL;
    json_t *list = NULL;

    if (!sel || !items) {
        status = answer(body, 500, "out of memory");
        goto out;
    }
    if (!(r = dlq_reader_new(v->cfg, &err))) {
        status = unavailable(body, "dead letters", err.message);
        goto out;
    }
    enum charged_rc got =
        dlq_reader_read_positions(r, in->partition, in->offset, in->n, sel, &err);
    if (got != CHARGED_OK) {
        status = letters_unreachable(body, got, err.message);
        goto out;
    }
    snprintf(target, sizeof(target), "%d:%lld%s", (int)in->partition[0],
             (long long)in->offset[0], in->n > 1 ? " and more" : "");
    if (!in->dry_run) {
        /* Recorded before anything is sent: no replay without its record. */
        json_t *asked = json_pack("{s:I}", "letters", (json_int_t)in->n);
        int unrecorded = record(v, who->name, "replay", target, "requested", asked);
        json_decref(asked);
        if (unrecorded) {
            status =
                answer(body, 503, "the action could not be recorded; nothing sent");
            goto out;
        }
    }
    enum charged_rc rc = dlq_reader_replay(r, (const struct dlq_letter *const *)sel,
                                           in->n, who->name, in->dry_run, items, &err);
    if (rc == CHARGED_BAD_ITEM) {
        status = answer(body, 409, "%s", err.message);
        if (!in->dry_run) {
            json_t *why = json_pack("{s:O}", "error", json_object_get(*body, "error"));
            record(v, who->name, "replay", target, "refused", why);
            json_decref(why);
        }
        goto out;
    }
    list = json_array();
    for (size_t i = 0; list && i < in->n; i++)
        json_array_append_new(list,
                              replay_item_json(r, &items[i], who->name, in->dry_run));
    list = masked(list);
    if (rc == CHARGED_RETRY)
        status = 502; /* Kafka did not take every letter: the list says which */
    *body = json_pack("{s:b, s:O, s:s?}", "dry_run", in->dry_run, "letters",
                      list ? list : json_null(), "error",
                      rc == CHARGED_OK ? NULL : err.message);
    if (!in->dry_run) {
        json_t *detail = json_pack("{s:O}", "letters", list ? list : json_null());
        record(v, who->name, "replay", target, rc == CHARGED_OK ? "ok" : "failed",
               detail);
        json_decref(detail);
        log_info("console: dead letters replayed", "actor", who->name, "first", target,
                 "result", rc == CHARGED_OK ? "ok" : "failed", NULL);
    }
out:
    json_decref(list);
    dlq_reader_free(r);
    free(sel);
    free(items);
    return status;
}

unsigned console_views_actions(console_views_t *v, json_t **body)
{
    struct charged_error err;
    json_t *rows = NULL;
    if (console_store_actions(v->cs, ACTIONS_LIMIT, &rows, &err) != CHARGED_OK)
        return unavailable(body, "the action log", err.message);
    *body = json_pack("{s:o}", "actions", rows);
    return 200;
}

/* ---- an operation's review (op.h's review, step_review.h; issue 37) ---- */

static const char *step_outcome_names[] = {
    [STEP_REVIEW_RESOLVED] = "resolved",
    [STEP_REVIEW_NOT_FOUND] = "not_found",
    [STEP_REVIEW_NOT_IN_REVIEW] = "not_in_review",
    [STEP_REVIEW_REFUSED] = "refused",
    [STEP_REVIEW_BUSY] = "busy",
    [STEP_REVIEW_CHANGED] = "changed",
    [STEP_REVIEW_ERROR] = "error",
    [STEP_REVIEW_WITHDRAWN] = "withdrawn",
};

/* As an attempt's: a conflict 409, the provider's objection 422. */
static const unsigned step_outcome_status[] = {
    [STEP_REVIEW_RESOLVED] = 200,      [STEP_REVIEW_NOT_FOUND] = 404,
    [STEP_REVIEW_NOT_IN_REVIEW] = 409, [STEP_REVIEW_REFUSED] = 422,
    [STEP_REVIEW_BUSY] = 409,          [STEP_REVIEW_CHANGED] = 409,
    [STEP_REVIEW_ERROR] = 503,         [STEP_REVIEW_WITHDRAWN] = 401,
};

/* The review of a kind the route took (console.c: one of the table's). */
static const struct step_review_kind *step_kind(const char *kind)
{
    const struct step_review_kind *k = payment_ops_review(kind);
    CHARGED_ASSERT(k != NULL);
    return k;
}

/* The answer to a step's resolution, and the action log's detail. */
static json_t *step_answer(const char *kind, const char *id,
                           const struct console_step_resolve_input *in,
                           const struct step_review_result *res)
{
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:s?, s:b, s:s?, s:s?, s:s}", "kind",
                          kind, "id", id, "outcome", step_outcome_names[res->outcome],
                          "decision", in->decision, "verdict", res->verdict, "forced",
                          res->forced, "provider_says",
                          res->provider_says[0] ? res->provider_says : NULL, "status",
                          res->status[0] ? res->status : NULL, "message", res->message);
    if (o && res->evidence)
        json_object_set(o, "evidence", res->evidence);
    if (o && res->outcome != STEP_REVIEW_RESOLVED)
        json_object_set_new(o, "error", json_string(res->message));
    if (o && res->outcome == STEP_REVIEW_REFUSED)
        json_object_set_new(o, "can_force", json_true());
    return o;
}

unsigned console_views_step_resolve(console_views_t *v, const struct console_who *who,
                                    const char *session, const char *kind,
                                    const char *id,
                                    const struct console_step_resolve_input *in,
                                    json_t **body)
{
    CHARGED_ASSERT(v && who && kind && id && in && body);
    const struct step_review_kind *k = step_kind(kind);
    struct still_signed_in signed_in = {v, session, who};
    int decision = attempt_status_parse(in->decision);
    char names[80];
    if (decision < 0 || !(k->decisions & (1u << decision)))
        return answer(body, 400, "a %s's decision is %s", kind,
                      step_review_decisions(k, names, sizeof(names)));
    struct step_review_request rq = {
        .id = id,
        .decision = (enum attempt_status)decision,
        .reason = in->reason,
        .actor = who->name,
        .force = in->force,
        .key_kept_ms = config_int(v->cfg, CONFIG_WORKER_KEY_RETENTION_MS),
        .still_allowed = still_operator,
        .ctx = &signed_in,
    };
    /* Recorded before the provider is asked: no decision without its record. */
    json_t *asked = json_pack("{s:s, s:s, s:b}", "kind", kind, "decision", in->decision,
                              "force", in->force);
    int unrecorded = record(v, who->name, "resolve", id, "requested", asked);
    json_decref(asked);
    if (unrecorded)
        return answer(body, 503, "the action could not be recorded; nothing decided");
    struct step_review_result res;
    step_review_resolve(k, v->url, v->pc, &rq, &res);
    const char *outcome = step_outcome_names[res.outcome];
    json_t *detail =
        json_pack("{s:s, s:s, s:s, s:b, s:s?, s:s}", "kind", kind, "decision",
                  in->decision, "reason", in->reason, "force", in->force, "verdict",
                  res.verdict, "message", res.message);
    record(v, who->name, "resolve", id, outcome, detail);
    json_decref(detail);
    log_info("console: review resolve", "actor", who->name, "kind", kind, "id", id,
             "outcome", outcome, "forced", res.forced ? "true" : "false", NULL);
    *body = step_answer(kind, id, in, &res);
    unsigned status = step_outcome_status[res.outcome];
    step_review_result_clear(&res);
    return status;
}
