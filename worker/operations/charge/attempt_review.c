#include "attempt_review.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "attempt_status.h"
#include "charge_command.h"
#include "charged_assert.h"
#include "clock.h"
#include "db.h"
#include "ownership.h"
#include "provider_outcome.h"
#include "reconcile_policy.h"
#include "utf8_text.h"

/* Also: how long ago the attempt last reached the provider (what the
 * provider's search may not list yet), and when it was first sent (where
 * the list's window starts), both on the database's clock: a call's
 * started_at is its host's clock, so a call counts from when the database
 * recorded it (recorded_at, after the call; rows older than migration 0014
 * have only started_at). */
static const char *SQL_READ =
    "SELECT a.status, a.amount, a.currency, coalesce(a.provider_payment_id, ''),"
    "  greatest(0, (extract(epoch FROM now() - coalesce(greatest((SELECT"
    "    max(coalesce(c.recorded_at, c.started_at)) FROM provider_calls c"
    "    WHERE c.payment_attempt_id = a.id), a.first_sent_at), a.created_at))"
    "    * 1000)::bigint), a.order_id::text,"
    "  (extract(epoch FROM coalesce(a.first_sent_at, a.created_at)) * 1000)::bigint,"
    "  a.capture_method"
    " FROM payment_attempts a WHERE a.id = $1::uuid";

/* An intent is booked for one attempt at most. */
static const char *SQL_BOOKED_ELSEWHERE =
    "SELECT payment_attempt_id::text FROM ledger_entries"
    " WHERE kind = 'charge' AND provider_payment_id = $1"
    "   AND payment_attempt_id <> $2::uuid LIMIT 1";

/* What charged itself recorded of an intent: whether another attempt holds
 * it as the answer to its own call, and whether it answered this attempt's
 * own charge (under its key). */
static const char *SQL_RECORDED =
    "SELECT EXISTS (SELECT 1 FROM payment_attempts o WHERE o.provider_payment_id = $1"
    "    AND o.id <> $2::uuid),"
    "  EXISTS (SELECT 1 FROM provider_calls c WHERE c.payment_attempt_id = $2::uuid"
    "    AND c.operation = 'charge' AND c.provider_payment_id = $1)";

struct review_attempt {
    char status[20];
    long long amount;
    char currency[4];
    char provider_payment_id[PROVIDER_ID_MAX]; /* "" when none is recorded */
    long long last_call_age_ms;                /* since its last provider call */
    char order_id[40];
    long long first_sent_ms; /* since the epoch (its creation if never sent) */
    int authorization;       /* capture_method manual: not this review's */
};

/* Whose intent it is (common/core/ownership), as the evidence shows it. */
struct owner {
    int asked; /* judged: the provider showed the intent */
    enum ownership_verdict verdict;
    char why[160];
    int recorded_elsewhere, own_answer;
    char attempt_meta[64], order_meta[64]; /* its metadata, "" for none */
};

/* One look-up at the provider, as asked and as answered. */
struct lookup {
    const char *operation;       /* "retrieve", "search" or "list" */
    char query[PROVIDER_ID_MAX]; /* the intent id, or the attempt id searched for */
    int64_t started_ms;
    int pages; /* a list's: pages walked */
    struct provider_result res;
};

/* The most look-ups one review makes: FAILED's search, list and retrieve. */
#define MAX_LOOKUPS 3

/* What the provider's answers say of the operator's decision. Ordered: a
 * contradiction outranks an intent proven another's (foreign), which
 * outranks one not proven the attempt's (unproven: asking again will not
 * prove it), which outranks a missing answer, which outranks a search that
 * may not list a recent charge yet. */
enum verdict {
    V_AGREES = 0,
    V_SEARCH_MAY_LAG,
    V_NO_ANSWER,
    V_UNPROVEN,
    V_FOREIGN,
    V_CONTRADICTS
};

static const char *verdict_names[] = {"agrees",   "search_may_lag", "no_answer",
                                      "unproven", "foreign",        "contradicts"};

struct judgement {
    enum verdict verdict;
    char says[512]; /* one line: what the provider says, when it objects */
};

/* The provider's search lags behind its charges (docs/provider.md): what it
 * does not list is evidence only once the attempt's last call is older than
 * lag_ms. The time left to wait, or 0. */
static long long search_wait_ms(const struct review_attempt *a, long long lag_ms)
{
    return a->last_call_age_ms < lag_ms ? lag_ms - a->last_call_age_ms : 0;
}

int attempt_review_check(const struct attempt_review_request *rq, char *why,
                         size_t why_size)
{
    if (!charge_command_is_uuid(rq->attempt_id))
        snprintf(why, why_size, "attempt id '%s' is not a UUID",
                 rq->attempt_id ? rq->attempt_id : "");
    else if (rq->intent_id && !provider_outcome_id_ok(rq->intent_id))
        snprintf(why, why_size, "intent id '%s' is not a payment intent id (pi_...)",
                 rq->intent_id);
    else if (!rq->intent_id && !rq->reason)
        snprintf(why, why_size,
                 "reason is required for FAILED: say how you know no money moved");
    else if (rq->reason && !utf8_text_line(rq->reason, ATTEMPT_REVIEW_MAX_REASON))
        snprintf(why, why_size, "reason must be 1..%d bytes of UTF-8 on one line",
                 ATTEMPT_REVIEW_MAX_REASON);
    else if (!utf8_text_line(rq->actor, ATTEMPT_REVIEW_MAX_ACTOR))
        snprintf(why, why_size, "actor must be 1..%d bytes of UTF-8 on one line",
                 ATTEMPT_REVIEW_MAX_ACTOR);
    else
        return 0;
    return -1;
}

/* Reads the attempt: 0, 1 when there is none, -1 with err. */
static int read_attempt(PGconn *conn, const char *id, struct review_attempt *a,
                        struct charged_error *err)
{
    CHARGED_ASSERT(conn && id && a);
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
    snprintf(a->order_id, sizeof(a->order_id), "%s", PQgetvalue(r, 0, 5));
    a->first_sent_ms = strtoll(PQgetvalue(r, 0, 6), NULL, 10);
    a->authorization = !strcmp(PQgetvalue(r, 0, 7), "manual");
    PQclear(r);
    return 0;
}

/* The attempt an intent is already booked for, in `other` ("" for none).
 * 0 / -1 with err. */
static int booked_elsewhere(PGconn *conn, const char *intent, const char *id,
                            char *other, size_t other_size, struct charged_error *err)
{
    CHARGED_ASSERT(conn && intent && id && other && other_size > 0);
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
    CHARGED_ASSERT(pc && l && operation && query);
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
    __attribute__((format(printf, 3, 4)));
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

int attempt_review_intent_pays(const struct provider_result *r, const char *intent,
                               const char *attempt_id, long long amount,
                               const char *currency, char *says, size_t says_size)
{
    if (r->outcome == PROVIDER_NOT_FOUND)
        snprintf(says, says_size, "the provider has no payment intent %s", intent);
    else if (strcmp(r->intent_status, "succeeded") != 0)
        snprintf(says, says_size, "the provider says %s is %s, not succeeded", intent,
                 r->intent_status[0] ? r->intent_status : "of no known status");
    else if (r->amount != amount)
        /* 0 too (or none given): a charge of the attempt's amount is what
         * would be booked, and nothing shows one. */
        snprintf(says, says_size,
                 "the provider says %s is of amount %lld, the attempt's is %lld",
                 intent, r->amount, amount);
    else if (r->currency[0] && strcasecmp(r->currency, currency) != 0)
        snprintf(says, says_size, "the provider says %s is in %s, the attempt's is %s",
                 intent, r->currency, currency);
    else if (r->intent_attempt_id[0] &&
             strcasecmp(r->intent_attempt_id, attempt_id) != 0)
        snprintf(says, says_size,
                 "the provider says %s belongs to another attempt (%s)", intent,
                 r->intent_attempt_id);
    else
        return 0;
    return -1;
}

/* SUCCEEDED as PI: the provider must hold PI, succeeded, of the attempt's
 * amount (attempt_review_intent_pays), and list it under this attempt (its
 * metadata payment_attempt_id): the search by the attempt id. The search
 * describes one intent of those it holds (the most settled): when it holds
 * several and describes another succeeded one, PI may be among them, and
 * PI's own metadata must name the attempt (judge_ownership reads it):
 * returns 1 then, else 0. Whose intent it is, judge_ownership says. */
static int judge_succeeded(provider_client_t *pc, const char *id,
                           const struct review_attempt *a, const char *intent,
                           long long lag_ms, struct lookup *ls, size_t *n,
                           struct judgement *j)
{
    CHARGED_ASSERT(pc && id && a && intent && ls && n && j);
    struct lookup *get = &ls[(*n)++], *find = &ls[(*n)++];
    const struct provider_result *r = &get->res, *s = &find->res;
    char says[sizeof(j->says)];

    ask(pc, get, "retrieve", intent);
    ask(pc, find, "search", id);
    int paid = 0;
    if (!answered(r))
        object(j, V_NO_ANSWER, "the provider did not answer the look-up of %s: %s",
               intent, why_unanswered(r));
    else if (attempt_review_intent_pays(r, intent, id, a->amount, a->currency, says,
                                        sizeof(says)) != 0)
        object(j, V_CONTRADICTS, "%s", says);
    else
        paid = 1;

    if (!answered(s))
        object(j, V_NO_ANSWER,
               "the provider did not answer the search for this attempt: %s",
               why_unanswered(s));
    else if (!strcmp(s->provider_payment_id, intent))
        return 0; /* listed under this attempt: its metadata names it */
    else if (s->outcome == PROVIDER_SUCCEEDED && s->matches > 1 && paid)
        return 1;
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
    return 0;
}

/* One page of the provider's list of intents, in the window of the calls
 * the attempt's key could have made. */
struct list_ask {
    provider_client_t *pc;
    const char *id;
    long long gte, lt;
};

static void intents_page(void *ctx, const char *after, struct provider_result *page)
{
    const struct list_ask *q = ctx;
    provider_client_list(q->pc, q->id, q->gte, q->lt, after, page);
}

/* The provider's list, every page, as the reconciler walks it before it
 * calls an attempt never executed (reconcile_policy): unlike the search it
 * is consistent, so what it does not hold was never charged. */
static void ask_list(provider_client_t *pc, struct lookup *l, const char *id,
                     const struct review_attempt *a, long long key_retention_ms)
{
    CHARGED_ASSERT(pc && l && id && a);
    struct list_ask q = {.pc = pc, .id = id};
    reconcile_policy_list_window(a->first_sent_ms, key_retention_ms, &q.gte, &q.lt);
    l->operation = "list";
    snprintf(l->query, sizeof(l->query), "%s", id);
    l->started_ms = clock_wall_ms();
    l->pages = reconcile_policy_list_walk(intents_page, &q, &l->res);
}

/* FAILED: no intent for the attempt may be succeeded or processing, found
 * by the search on the attempt id, on the provider's list of the key's
 * window, or as the intent recorded on it. The search lags (by more than
 * anyone can promise, docs/reconciler.md), so its "none" is not enough:
 * the list is asked as well, unless the search already found money or
 * the provider did not answer it. */
static void judge_failed(provider_client_t *pc, const char *id,
                         const struct review_attempt *a, long long lag_ms,
                         long long key_retention_ms, struct lookup *ls, size_t *n,
                         struct judgement *j)
{
    CHARGED_ASSERT(pc && id && a && ls && n && j);
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
    else {
        if (search_wait_ms(a, lag_ms) > 0)
            object(j, V_SEARCH_MAY_LAG,
                   "the provider's search lists no paid intent for this attempt, but "
                   "may not be up to date yet: try again in %llds",
                   (search_wait_ms(a, lag_ms) + 999) / 1000);
        struct lookup *walk = &ls[(*n)++];
        const struct provider_result *w = &walk->res;
        ask_list(pc, walk, id, a, key_retention_ms);
        if (w->outcome == PROVIDER_SUCCEEDED || w->outcome == PROVIDER_PROCESSING)
            object(j, V_CONTRADICTS,
                   "the provider's list holds a %s intent %s for this attempt, which "
                   "its search did not show",
                   w->intent_status, w->provider_payment_id);
        else if (!answered(w)) /* a page failed, or too many: no evidence */
            object(j, V_NO_ANSWER, "the provider's list of intents is no evidence: %s",
                   why_unanswered(w));
    }
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

/* Metadata naming another of ours: a non-empty id that is not ours (a
 * UUID may be written in either case). */
static int names_other(const char *named, const char *ours)
{
    return named[0] && strcasecmp(named, ours) != 0;
}

/* The objection to a foreign intent, in the attempt's terms: what showed
 * it another's, in the order ownership_judge weighs it. */
static void object_foreign(struct judgement *j, const struct owner *ow, const char *id,
                           const struct review_attempt *a, const char *intent)
{
    if (ow->recorded_elsewhere)
        object(j, V_FOREIGN,
               "%s is not this attempt's: charged recorded it for another attempt",
               intent);
    else if (a->provider_payment_id[0])
        object(j, V_FOREIGN, "%s is not this attempt's: %s (%s)", intent, ow->why,
               a->provider_payment_id);
    else if (names_other(ow->attempt_meta, id))
        object(j, V_FOREIGN, "%s is not this attempt's: its metadata names attempt %s",
               intent, ow->attempt_meta);
    else
        object(j, V_FOREIGN,
               "%s is not this attempt's: its metadata names order %s, the attempt's "
               "is %s",
               intent, ow->order_meta, a->order_id);
}

/* SUCCEEDED as PI books PI for this attempt, so PI must be proven the
 * attempt's (common/core/ownership, the rule every path settles by): the
 * id recorded from the attempt's own call, or the answer to that call
 * under its key, whatever the metadata says now. Otherwise it is foreign
 * when charged recorded it for another attempt or its metadata (as the
 * provider shows it: the look-up's result carries no order) names another
 * attempt or another order, and unproven when it only names this one:
 * both refused unless forced. got is the look-up of PI: its metadata is
 * asked for only when PI was there; found is the search for the attempt,
 * and several says it held other intents and did not show PI's (then
 * PI's metadata must name the attempt). 0, or -1 with err when the
 * database cannot say. */
static int judge_ownership(PGconn *conn, provider_client_t *pc, const char *id,
                           const struct review_attempt *a, const char *intent,
                           const struct provider_result *got,
                           const struct provider_result *found, int several,
                           struct owner *ow, struct judgement *j,
                           struct charged_error *err)
{
    CHARGED_ASSERT(conn && pc && id && a && ow && j);
    const char *p[2] = {intent, id};
    PGresult *r = db_exec(conn, SQL_RECORDED, 2, p, err);
    if (!r)
        return -1;
    ow->recorded_elsewhere = PQgetvalue(r, 0, 0)[0] == 't';
    ow->own_answer = PQgetvalue(r, 0, 1)[0] == 't';
    PQclear(r);
    if (answered(got) && got->outcome != PROVIDER_NOT_FOUND) {
        struct provider_listed obj;
        struct provider_result res;
        provider_client_fetch(pc, PROVIDER_LIST_INTENTS, intent, &obj, &res);
        if (res.outcome == PROVIDER_SUCCEEDED) {
            ow->asked = 1;
            snprintf(ow->attempt_meta, sizeof(ow->attempt_meta), "%s",
                     obj.payment_attempt_id);
            snprintf(ow->order_meta, sizeof(ow->order_meta), "%s", obj.order_id);
        } else if (!answered(&res))
            object(j, V_NO_ANSWER, "the provider did not show %s's metadata: %s",
                   intent, why_unanswered(&res));
    }
    struct ownership_claim c = {
        .recorded_id = a->provider_payment_id,
        .object_id = intent,
        .own_answer = ow->own_answer,
        .recorded_elsewhere = ow->recorded_elsewhere,
        .names_another = names_other(ow->attempt_meta, id) ||
                         names_other(ow->order_meta, a->order_id),
    };
    ow->verdict = ownership_judge(&c, ow->why, sizeof(ow->why));
    int names_it = ow->asked && !strcasecmp(ow->attempt_meta, id);
    if (several && ow->asked && !ow->attempt_meta[0])
        object(j, V_CONTRADICTS,
               "the provider does not list %s under this attempt: its metadata "
               "payment_attempt_id names none",
               intent);
    if (ow->verdict == OWNERSHIP_FOREIGN)
        object_foreign(j, ow, id, a, intent);
    else if (ow->verdict == OWNERSHIP_UNPROVEN)
        /* Only names it: anyone may have made it, and the attempt's own
         * call under its key may have charged as well (then one of the two
         * charges would be booked nowhere). */
        object(j, V_UNPROVEN,
               "%s is not proven this attempt's: %sneither recorded from the "
               "attempt's own call nor the answer under its key%s",
               intent,
               names_it ? "it only names it (metadata is anyone's to write), " : "",
               found->matches > 1 ? "; the provider's search holds several intents "
                                    "naming it"
                                  : "");
    return 0;
}

static json_t *owner_json(const struct owner *ow)
{
    return json_pack(
        "{s:s, s:s?, s:b, s:b, s:s?, s:s?}", "verdict",
        ownership_verdict_name(ow->verdict), "why", ow->why[0] ? ow->why : NULL,
        "recorded_for_another_attempt", ow->recorded_elsewhere,
        "answer_to_its_own_call", ow->own_answer, "payment_attempt_id",
        ow->asked && ow->attempt_meta[0] ? ow->attempt_meta : NULL, "order_id",
        ow->asked && ow->order_meta[0] ? ow->order_meta : NULL);
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
    int list = !strcmp(l->operation, "list");
    int search = list || !strcmp(l->operation, "search");
    json_object_set_new(o, "operation", json_string(l->operation));
    json_object_set_new(o, search ? "payment_attempt_id" : "payment_intent_id",
                        json_string(l->query));
    json_object_set_new(o, "outcome", json_string(provider_outcome_name(r->outcome)));
    json_object_set_new(o, "http_status",
                        r->http_status ? json_integer(r->http_status) : json_null());
    if (search)
        json_object_set_new(o, "matches", json_integer(r->matches));
    if (list)
        json_object_set_new(o, "pages", json_integer(l->pages));
    json_object_set_new(o, "provider_payment_id", str_or_null(r->provider_payment_id));
    json_object_set_new(o, "intent_status", str_or_null(r->intent_status));
    json_object_set_new(o, "amount", r->amount ? json_integer(r->amount) : json_null());
    json_object_set_new(o, "error", str_or_null(r->error));
    return o;
}

/* The transition's evidence: the decision, whether the provider agreed,
 * whether force overrode it, every look-up's answer, and (SUCCEEDED) whose
 * intent it is. */
static json_t *evidence_json(const char *decision, const struct review_attempt *a,
                             const struct judgement *j, int forced, long long lag_ms,
                             const struct lookup *ls, size_t n, const struct owner *ow)
{
    CHARGED_ASSERT(decision && a && j && (ls || n == 0));
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
    if (ow && json_object_set_new(o, "ownership", owner_json(ow)) != 0) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Ends a resolution that wrote nothing: outcome and its one line. */
static void say(struct attempt_review_result *out, enum attempt_review_outcome o,
                const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(struct attempt_review_result *out, enum attempt_review_outcome o,
                const char *fmt, ...)
{
    va_list ap;
    out->outcome = o;
    va_start(ap, fmt);
    vsnprintf(out->message, sizeof(out->message), fmt, ap);
    va_end(ap);
}

/* One resolution under way: the decision, the attempt as read, and what
 * the provider said of it. */
struct review {
    const struct attempt_review_request *rq;
    char id[37];
    const char *intent; /* SUCCEEDED with this intent; NULL: FAILED */
    enum attempt_status status;
    struct review_attempt a;
    struct lookup ls[MAX_LOOKUPS];
    size_t n; /* look-ups made */
    struct judgement j;
    struct owner ow;
};

/* A call the contract refuses before anything is read: 1 (said), or 0. */
static int refuse_call(PGconn *conn, attempt_store_t *st, provider_client_t *pc,
                       const struct attempt_review_request *rq,
                       struct attempt_review_result *out)
{
    CHARGED_ASSERT(conn && st && pc && rq && out);
    char why[256];
    if (!conn || !st || !pc || !rq) {
        say(out, ATTEMPT_REVIEW_ERROR, "attempt_review_resolve called without %s",
            !conn ? "a connection"
            : !st ? "an attempt store"
            : !pc ? "a provider client"
                  : "a request");
        return 1;
    }
    if (attempt_review_check(rq, why, sizeof(why)) != 0) {
        say(out, ATTEMPT_REVIEW_ERROR, "%s", why);
        return 1;
    }
    if (PQtransactionStatus(conn) != PQTRANS_IDLE) {
        /* Its locks would be held while the provider is asked. */
        say(out, ATTEMPT_REVIEW_ERROR,
            "the connection is inside a transaction: a review asks the provider "
            "outside any");
        return 1;
    }
    return 0;
}

/* Reads the attempt: 0 when it is in review and its intent (SUCCEEDED) is
 * booked for no other; else -1 (said). */
static int load(PGconn *conn, struct review *rv, struct attempt_review_result *out)
{
    CHARGED_ASSERT(conn && rv && out);
    struct charged_error err;
    int found = read_attempt(conn, rv->id, &rv->a, &err);
    if (found != 0) {
        if (found < 0)
            say(out, ATTEMPT_REVIEW_ERROR, "%s", err.message);
        else
            say(out, ATTEMPT_REVIEW_NOT_FOUND, "no attempt %s", rv->id);
        return -1;
    }
    snprintf(out->status, sizeof(out->status), "%s", rv->a.status);
    snprintf(out->provider_payment_id, sizeof(out->provider_payment_id), "%s",
             rv->a.provider_payment_id);
    /* An authorization settles into other states, on other evidence, and
     * books what was captured: authorization_review's. */
    if (rv->a.authorization) {
        say(out, ATTEMPT_REVIEW_NOT_IN_REVIEW,
            "attempt %s is an authorization (capture_method manual): resolve it with "
            "chargectl authorization resolve",
            rv->id);
        return -1;
    }
    if (strcmp(rv->a.status, ATTEMPT_S_REQUIRES_REVIEW) != 0) {
        say(out, ATTEMPT_REVIEW_NOT_IN_REVIEW,
            "attempt %s is %s, not REQUIRES_REVIEW: only attempts in review are "
            "resolved",
            rv->id, rv->a.status);
        return -1;
    }
    if (!rv->intent)
        return 0;
    if (booked_elsewhere(conn, rv->intent, rv->id, out->other_attempt,
                         sizeof(out->other_attempt), &err) != 0) {
        say(out, ATTEMPT_REVIEW_ERROR, "%s", err.message);
        return -1;
    }
    if (out->other_attempt[0]) {
        say(out, ATTEMPT_REVIEW_BOOKED_ELSEWHERE,
            "%s is already booked for attempt %s: one intent pays one attempt",
            rv->intent, out->other_attempt);
        return -1;
    }
    return 0;
}

/* Asks the provider and judges its answers: 0 when the decision may be
 * written (the provider agrees, or force overrides it), else -1 (said). */
static int judge(PGconn *conn, provider_client_t *pc, struct review *rv,
                 long long search_lag_ms, long long key_retention_ms,
                 struct attempt_review_result *out)
{
    CHARGED_ASSERT(conn && pc && rv && out);
    struct charged_error err;
    const struct attempt_review_request *rq = rv->rq;
    if (rv->intent) {
        int several = judge_succeeded(pc, rv->id, &rv->a, rv->intent, search_lag_ms,
                                      rv->ls, &rv->n, &rv->j);
        if (judge_ownership(conn, pc, rv->id, &rv->a, rv->intent, &rv->ls[0].res,
                            &rv->ls[1].res, several, &rv->ow, &rv->j, &err) != 0) {
            say(out, ATTEMPT_REVIEW_ERROR, "%s", err.message);
            return -1;
        }
    } else
        judge_failed(pc, rv->id, &rv->a, search_lag_ms, key_retention_ms, rv->ls,
                     &rv->n, &rv->j);
    out->verdict = verdict_names[rv->j.verdict];
    snprintf(out->provider_says, sizeof(out->provider_says), "%s", rv->j.says);
    if (rv->j.verdict != V_AGREES && !rq->force) {
        /* The look-ups are not logged: nothing is written for a refusal. */
        if (rv->j.verdict == V_UNPROVEN)
            say(out, ATTEMPT_REVIEW_REFUSED,
                "refused: %s. Only force books it: on the operator's word that it is "
                "this attempt's (say, the provider's request log shows it made under "
                "the attempt's idempotency key), recorded as forced",
                rv->j.says);
        else
            say(out, ATTEMPT_REVIEW_REFUSED, "refused: %s", rv->j.says);
        return -1;
    }
    if (rq->still_allowed && !rq->still_allowed(rq->ctx)) {
        say(out, ATTEMPT_REVIEW_WITHDRAWN,
            "%s may no longer decide (signed out or revoked while the provider was "
            "asked); nothing written",
            rq->actor);
        return -1;
    }
    return 0;
}

/* Settles the attempt from REQUIRES_REVIEW with the look-ups logged, as
 * the operator (no lease): attempt_store_settle's result, *s's flags. */
static enum charged_rc settle(attempt_store_t *st, const struct review *rv,
                              const char *evidence_text, struct attempt_settlement *s,
                              struct charged_error *err)
{
    CHARGED_ASSERT(st && rv && s);
    struct attempt_call calls[MAX_LOOKUPS];
    /* An operator settles a review, and only as SUCCEEDED or FAILED. */
    CHARGED_ASSERT(
        attempt_status_transition_allowed(ATTEMPT_STATUS_REQUIRES_REVIEW, rv->status));
    CHARGED_ASSERT(rv->n <= MAX_LOOKUPS);
    for (size_t i = 0; i < rv->n; i++)
        calls[i] = (struct attempt_call){.attempt_id = rv->id,
                                         .operation = rv->ls[i].operation,
                                         .started_ms = rv->ls[i].started_ms,
                                         .res = &rv->ls[i].res};
    *s = (struct attempt_settlement){
        .attempt_id = rv->id,
        .lease_epoch = -1, /* an operator holds no lease */
        .expected = ATTEMPT_STATUS_REQUIRES_REVIEW,
        .status = rv->status,
        .cause = "operator",
        .actor = rv->rq->actor,
        .reason = rv->rq->reason ? rv->rq->reason : ATTEMPT_REVIEW_DEFAULT_REASON,
        .provider_payment_id = rv->intent,
        .evidence_json = evidence_text,
        .next_check_ms = -1,
        .calls = calls,
        .ncalls = rv->n,
    };
    enum charged_rc rc = attempt_store_settle(st, s, 1, err);
    s->calls = NULL; /* they lived on this frame */
    s->ncalls = 0;
    return rc;
}

/* What a settlement that wrote nothing means: 0 when it settled, else -1
 * (said). */
static int say_unsettled(PGconn *conn, struct review *rv, enum charged_rc src,
                         const struct attempt_settlement *s, struct charged_error *err,
                         struct attempt_review_result *out)
{
    CHARGED_ASSERT(conn && rv && s && err && out);
    if (src == CHARGED_BAD_ITEM && !strcmp(err->code, "23505")) {
        /* The one-booking-per-intent index: another attempt got it first. */
        struct charged_error ignore;
        if (rv->intent)
            booked_elsewhere(conn, rv->intent, rv->id, out->other_attempt,
                             sizeof(out->other_attempt), &ignore);
        say(out, ATTEMPT_REVIEW_BOOKED_ELSEWHERE,
            "refused: %s is booked for another attempt (even --force cannot book one "
            "charge twice); nothing written",
            rv->intent ? rv->intent : "the intent");
        return -1;
    }
    if (src == CHARGED_WAIT || (src == CHARGED_OK && s->busy)) {
        /* A session holds the attempt's row right now (a webhook being
         * applied, or one hung in its transaction): nothing waited for it. */
        say(out, ATTEMPT_REVIEW_BUSY,
            "attempt %s is locked by another session right now; nothing written, run "
            "resolve again",
            rv->id);
        return -1;
    }
    if (src != CHARGED_OK) {
        say(out, ATTEMPT_REVIEW_ERROR, "%s%s",
            src == CHARGED_BAD_ITEM ? "the database refused the resolution: " : "",
            err->message);
        return -1;
    }
    if (s->settled)
        return 0;
    /* Someone else resolved it (or a process holds it) since we read it. */
    if (read_attempt(conn, rv->id, &rv->a, err) == 0)
        snprintf(out->status, sizeof(out->status), "%s", rv->a.status);
    else
        out->status[0] = '\0';
    say(out, ATTEMPT_REVIEW_CHANGED,
        "attempt %s changed while it was being resolved (now %s); nothing written",
        rv->id, out->status[0] ? out->status : "unknown");
    return -1;
}

/* The decision written: the result says so, and takes the evidence. */
static void say_resolved(const struct review *rv, int forced, json_t *evidence,
                         struct attempt_review_result *out)
{
    out->forced = forced;
    snprintf(out->status, sizeof(out->status), "%s", attempt_status_name(rv->status));
    if (rv->intent)
        snprintf(out->provider_payment_id, sizeof(out->provider_payment_id), "%s",
                 rv->intent);
    out->evidence = evidence;
    if (forced)
        say(out, ATTEMPT_REVIEW_RESOLVED,
            "attempt %s resolved %s over the provider's objection (%s): %s", rv->id,
            out->status, out->verdict, out->provider_says);
    else
        say(out, ATTEMPT_REVIEW_RESOLVED, "attempt %s resolved %s; the provider agrees",
            rv->id, out->status);
}

int attempt_review_resolve(PGconn *conn, attempt_store_t *st, provider_client_t *pc,
                           long long search_lag_ms, long long key_retention_ms,
                           const struct attempt_review_request *rq,
                           struct attempt_review_result *out)
{
    CHARGED_ASSERT(conn && st && pc && rq && out);
    struct review rv = {.rq = rq, .j = {V_AGREES, ""}};
    struct charged_error err;
    struct attempt_settlement s;
    char *evidence_text = NULL;
    json_t *evidence = NULL;

    if (!out)
        return -1;
    memset(out, 0, sizeof(*out));
    if (refuse_call(conn, st, pc, rq, out))
        return 0;
    /* One id however it is written: the database reads either case, but
     * the provider's metadata is text, searched and listed as such. */
    snprintf(rv.id, sizeof(rv.id), "%s", rq->attempt_id);
    for (char *p = rv.id; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    rv.intent = rq->intent_id;
    rv.status = rv.intent ? ATTEMPT_STATUS_SUCCEEDED : ATTEMPT_STATUS_FAILED;
    if (load(conn, &rv, out) != 0 ||
        judge(conn, pc, &rv, search_lag_ms, key_retention_ms, out) != 0)
        goto out;
    int forced = rv.j.verdict != V_AGREES;
    evidence = evidence_json(attempt_status_name(rv.status), &rv.a, &rv.j, forced,
                             search_lag_ms, rv.ls, rv.n, rv.intent ? &rv.ow : NULL);
    evidence_text =
        evidence ? json_dumps(evidence, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (!evidence_text) {
        say(out, ATTEMPT_REVIEW_ERROR, "out of memory");
        goto out;
    }
    enum charged_rc src = settle(st, &rv, evidence_text, &s, &err);
    if (say_unsettled(conn, &rv, src, &s, &err, out) != 0)
        goto out;
    say_resolved(&rv, forced, evidence, out);
    evidence = NULL; /* the result's now */
out:
    free(evidence_text);
    json_decref(evidence);
    return 0;
}

void attempt_review_result_clear(struct attempt_review_result *r)
{
    if (!r)
        return;
    json_decref(r->evidence);
    r->evidence = NULL;
}
