#include "reconciler.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "attempt_store.h"
#include "card_data.h"
#include "charge_op.h"
#include "charge_policy.h"
#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "daemon_policy.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"
#include "provider_client.h"
#include "reconcile_policy.h"
#include "refund_op.h"
#include "refund_store.h"

#define MAX_SCHEDULE 32
/* Calls one look records at most: a look-up, then perhaps a charge or a
 * walk of the list (one record, however many pages). */
#define MAX_CALLS 3
/* Rows recorded for one look at most: the calls, and the answers lost when
 * the HTTP client re-sent a charge itself on a closed pooled connection. */
#define MAX_ROWS 8
/* Calls waiting for the database after a failed write, at most. */
#define PENDING_MAX 64
/* How often the backlog gauges are counted in the database. */
#define BACKLOG_EVERY_MS 5000

struct reconciler {
    config_t *cfg;
    char id[160];
    attempt_store_t *store;
    refund_store_t *refunds;
    provider_client_t *provider;
    long long batch, lease_ms, poll_ms, max_age_ms, search_lag_ms, stale_ms;
    long long key_retention_ms, provider_timeout_ms;
    long long schedule[MAX_SCHEDULE];
    int nschedule;
    int64_t next_poll, next_backlog;
    struct daemon_db db;
    struct attempt_due *due;
    struct refund_due *rdue;
    int on_refunds;       /* the batch is of refunds (rdue), not attempts */
    size_t ndue, looking; /* the batch claimed, and the one looked at */
    int64_t renewed_at;   /* when the batch's leases were last extended */
    struct pending_call {
        char attempt_id[37]; /* or the refund's id */
        int refund;
        const char *operation; /* a string literal */
        int64_t started_ms;
        struct provider_result res;
        int written_maybe; /* a write of it failed, and may yet commit */
    } pending[PENDING_MAX];
    size_t npending;
};

/* What one look found out, and what follows from it. */
struct look {
    const struct attempt_due *d; /* or, for a refund: */
    const struct refund_due *rd;
    int64_t claimed_at;
    struct provider_result res[MAX_CALLS];
    const char *ops[MAX_CALLS];
    int64_t started[MAX_CALLS];
    int ncalls;
    struct provider_result lost; /* what a re-sent charge's first try left */
    enum attempt_status status;  /* == d->status: look again later */
    char reason[512];
    char ppid[PROVIDER_ID_MAX];
    json_t *evidence; /* what the provider said; owned */
};

/* ---- the schedule ---- */

static int parse_schedule(struct reconciler *r, const char *s, char *err,
                          size_t err_size)
{
    r->nschedule = 0;
    while (s && *s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        /* Digits only, at most a year each: the database must be able to add
         * it to now(). */
        if (!isdigit((unsigned char)*s) || end == s || errno || v > 31536000000LL ||
            (*end && (*end != ',' || !end[1])) || r->nschedule == MAX_SCHEDULE) {
            snprintf(err, err_size,
                     "RECONCILER_SCHEDULE_MS: expected up to %d comma-separated "
                     "durations in ms, each at most a year",
                     MAX_SCHEDULE);
            return -1;
        }
        r->schedule[r->nschedule++] = v;
        s = *end ? end + 1 : end;
    }
    if (r->nschedule == 0) {
        snprintf(err, err_size, "RECONCILER_SCHEDULE_MS: empty");
        return -1;
    }
    return 0;
}

/* After `checks` looks, the wait before the next one. */
static long long next_look_ms(const struct reconciler *r, int checks)
{
    return r->schedule[checks < r->nschedule ? checks : r->nschedule - 1];
}

/* ---- evidence ---- */

/* Extends the leases of the batch's attempts from `from` on. */
static void renew_rest(struct reconciler *r, size_t from, size_t n)
{
    struct store_error err;
    const char *ids[1024];
    int64_t epochs[1024];
    int ours[1024];
    size_t k = 0;
    for (size_t i = from; i < n && k < 1024; i++, k++) {
        ids[k] = r->on_refunds ? r->rdue[i].id : r->due[i].id;
        epochs[k] = r->on_refunds ? r->rdue[i].lease_epoch : r->due[i].lease_epoch;
    }
    if ((r->on_refunds
             ? refund_store_renew(r->refunds, ids, epochs, k, r->lease_ms, ours, &err)
             : attempt_store_renew(r->store, ids, epochs, k, r->lease_ms, ours,
                                   &err)) != 0)
        log_warn("could not renew leases; they may expire", "error", err.message, NULL);
}

/* Extends the leases of the attempt looked at and the rest of the batch
 * once a third of a lease has passed: a long look (a list of many pages)
 * must not let them expire under it. */
static void keep_leases(struct reconciler *r)
{
    if (clock_now_ms() - r->renewed_at <= r->lease_ms / 3)
        return;
    renew_rest(r, r->looking, r->ndue);
    r->renewed_at = clock_now_ms();
}

static void call_begin(struct reconciler *r)
{
    /* A look's calls are the loop's longest waits, each bounded by
     * PROVIDER_TIMEOUT_MS: liveness counts from the last one. */
    daemon_heartbeat();
    keep_leases(r);
    metrics_set(METRIC_PROVIDER_IN_FLIGHT, 1);
}

static void call_end(const char *op, const struct provider_result *res)
{
    metrics_set(METRIC_PROVIDER_IN_FLIGHT, 0);
    metrics_observe(METRIC_PROVIDER_DURATION, res->latency_ms / 1000.0, op);
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, op, provider_outcome_name(res->outcome));
}

/* What the provider answered, into the look's evidence; pages: of a list. */
static void note(struct look *l, const char *op, const struct provider_result *res,
                 int pages)
{
    json_t *e = json_pack("{s:s, s:s, s:i, s:i}", "operation", op, "outcome",
                          provider_outcome_name(res->outcome), "http_status",
                          res->http_status, "matches", res->matches);
    if (!e)
        return;
    /* json_object_set_new steals the new values' references. */
    if (pages)
        json_object_set_new(e, "pages", json_integer(pages));
    if (res->intent_status[0])
        json_object_set_new(e, "intent_status", json_string(res->intent_status));
    if (res->provider_payment_id[0])
        json_object_set_new(e, "provider_payment_id",
                            json_string(res->provider_payment_id));
    if (res->decline_code[0])
        json_object_set_new(e, "decline_code", json_string(res->decline_code));
    if (res->error[0])
        json_object_set_new(e, "error", json_string(res->error));
    json_array_append_new(json_object_get(l->evidence, "calls"), e);
}

static void call(struct reconciler *r, struct look *l, const char *op)
{
    int i = l->ncalls++;
    call_begin(r);
    l->ops[i] = op;
    l->started[i] = clock_wall_ms();
    if (!strcmp(op, "retrieve")) {
        provider_client_retrieve(r->provider, l->d->provider_payment_id, &l->res[i]);
    } else if (!strcmp(op, "search")) {
        provider_client_search(r->provider, l->d->id, &l->res[i]);
    } else {
        const struct provider_charge ch = charge_op_request(&l->d->params, l->d->id);
        provider_client_charge(r->provider, &ch, &l->res[i]);
    }
    call_end(op, &l->res[i]);
    note(l, op, &l->res[i], 0);
}

/* One page of a list, after the object `after` ("" first). */
typedef void (*list_page_fn)(struct reconciler *r, const struct look *l,
                             const char *after, struct provider_result *page);

/* The intents created while a call under the attempt's key could have
 * been (reconcile_policy says which window). */
static void intents_page(struct reconciler *r, const struct look *l, const char *after,
                         struct provider_result *page)
{
    long long gte, lt;
    reconcile_policy_list_window(l->d->first_sent_ms, r->key_retention_ms, &gte, &lt);
    provider_client_list(r->provider, l->d->id, gte, lt, after, page);
}

/* The refunds of the charge's intent. */
static void refunds_page(struct reconciler *r, const struct look *l, const char *after,
                         struct provider_result *page)
{
    provider_client_list_refunds(r->provider, l->rd->params.payment_intent, l->rd->id,
                                 after, page);
}

/* A walk's page as reconcile_policy_list_walk asks for it: each one a call
 * of the loop's (liveness, metrics). */
struct walk_page {
    struct reconciler *r;
    const struct look *l;
    const char *op;
    list_page_fn page_of;
};

static void walk_page(void *ctx, const char *after, struct provider_result *page)
{
    const struct walk_page *w = ctx;
    call_begin(w->r);
    w->page_of(w->r, w->l, after, page);
    call_end(w->op, page);
}

/* Asks the consistent source whether any call under the key executed: a
 * list of the provider's, every page walked, matched on the metadata
 * (reconcile_policy says what the pages add up to). One call row for the
 * walk: the page that decided it, with the walk's latency. */
static void list_walk(struct reconciler *r, struct look *l, const char *op,
                      list_page_fn page_of)
{
    int i = l->ncalls++;
    struct walk_page w = {.r = r, .l = l, .op = op, .page_of = page_of};

    l->ops[i] = op;
    l->started[i] = clock_wall_ms();
    int pages = reconcile_policy_list_walk(walk_page, &w, &l->res[i]);
    note(l, op, &l->res[i], pages);
}

/* The refund again, under its key and with its stored parameters
 * (refund_op_request), waited for: the reconciler makes one call at a
 * time, each bounded by PROVIDER_TIMEOUT_MS. */
static void refund_again(struct reconciler *r, const struct refund_due *rd,
                         struct provider_result *res)
{
    const struct provider_refund req = refund_op_request(&rd->params, rd->id);
    char err[256];
    void *tag;
    if (provider_client_start_refund(r->provider, &req, NULL, err, sizeof(err)) != 0) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_NOT_EXECUTED; /* nothing was started */
        snprintf(res->error, sizeof(res->error), "%s", err);
        return;
    }
    while (!provider_client_next_done(r->provider, res, &tag))
        provider_client_perform(r->provider, 100);
}

static void call_refund(struct reconciler *r, struct look *l, const char *op)
{
    int i = l->ncalls++;
    call_begin(r);
    l->ops[i] = op;
    l->started[i] = clock_wall_ms();
    if (!strcmp(op, "retrieve_refund"))
        provider_client_retrieve_refund(r->provider, l->rd->provider_refund_id,
                                        &l->res[i]);
    else
        refund_again(r, l->rd, &l->res[i]);
    call_end(op, &l->res[i]);
    note(l, op, &l->res[i], 0);
}

/* Objects that name the attempt but are not its own (ownership.h): never
 * settled on, kept in the look's evidence and said loudly; the auditor
 * raises them as foreign_intent. */
static void note_foreign(struct look *l, const struct reconcile_decision *dec)
{
    char note[sizeof(dec->note)];
    if (!dec->note[0])
        return;
    card_data_copy_masked(note, sizeof(note), dec->note);
    /* json_object_set_new steals the new string's reference. */
    json_object_set_new(l->evidence, "foreign", json_string(note));
    log_warn("objects name the attempt that are not its own", "payment_attempt_id",
             l->d->id, "order_id", l->d->params.order_id, "detail", note, NULL);
}

/* One look: reconcile_policy names each call in turn and, once the
 * evidence suffices, the decision; this makes the calls. */
static void look(struct reconciler *r, struct look *l)
{
    const struct attempt_due *d = l->d;
    const struct reconcile_limits lim = {
        .key_retention_ms = r->key_retention_ms,
        .provider_timeout_ms = r->provider_timeout_ms,
        .search_lag_ms = r->search_lag_ms,
        .max_age_ms = r->max_age_ms,
    };
    const struct reconcile_attempt a = {
        .id = d->id,
        .status = d->status,
        .provider_payment_id = d->provider_payment_id,
        .amount = d->params.amount,
        .currency = d->params.currency,
        .key_age_ms = d->key_age_ms,
        .first_sent_ms = d->first_sent_ms,
        .age_ms = d->age_ms,
    };
    struct reconcile_evidence e = {0};
    struct reconcile_decision dec;

    for (;;) {
        /* The key ages while the look goes on: each decision, a charge
         * again above all, is taken on its age now. */
        e.lookup_after_ms = clock_now_ms() - l->claimed_at;
        reconcile_policy_decide(&lim, &a, &e, &dec);
        const struct provider_result *last = &l->res[l->ncalls];
        switch (dec.next) {
        case RECONCILE_RETRIEVE:
            call(r, l, "retrieve");
            e.lookup = last;
            break;
        case RECONCILE_SEARCH:
            call(r, l, "search");
            e.lookup = last;
            break;
        case RECONCILE_SEARCH_OTHERS:
            call(r, l, "search");
            e.search = last;
            break;
        case RECONCILE_CHARGE:
            call(r, l, "charge");
            e.charge = last;
            break;
        case RECONCILE_LIST:
            list_walk(r, l, "list", intents_page);
            e.list = last;
            break;
        case RECONCILE_SETTLE:
            l->status = dec.status;
            snprintf(l->reason, sizeof(l->reason), "%s", dec.reason);
            snprintf(l->ppid, sizeof(l->ppid), "%s", dec.provider_payment_id);
            note_foreign(l, &dec);
            return;
        }
    }
}

/* A look at a refund: reconcile_policy's refund order of evidence, with
 * the charge's limits. */
static void look_refund(struct reconciler *r, struct look *l)
{
    const struct refund_due *d = l->rd;
    const struct reconcile_limits lim = {
        .key_retention_ms = r->key_retention_ms,
        .provider_timeout_ms = r->provider_timeout_ms,
        .search_lag_ms = r->search_lag_ms,
        .max_age_ms = r->max_age_ms,
    };
    const struct reconcile_attempt a = {
        .id = d->id,
        .status = d->status,
        .provider_payment_id = d->provider_refund_id,
        .amount = d->params.amount,
        .key_age_ms = d->key_age_ms,
        .first_sent_ms = -1,
        .age_ms = d->age_ms,
        .payment_intent = d->params.payment_intent,
        .object = "refund",
    };
    struct reconcile_evidence e = {0};
    struct reconcile_decision dec;

    for (;;) {
        e.lookup_after_ms = clock_now_ms() - l->claimed_at;
        reconcile_policy_decide_refund(&lim, &a, &e, &dec);
        const struct provider_result *last = &l->res[l->ncalls];
        switch (dec.next) {
        case RECONCILE_RETRIEVE:
            call_refund(r, l, "retrieve_refund");
            e.lookup = last;
            break;
        case RECONCILE_LIST:
            list_walk(r, l, "list_refunds", refunds_page);
            e.list = last;
            break;
        case RECONCILE_CHARGE:
            call_refund(r, l, "refund");
            e.charge = last;
            break;
        case RECONCILE_SEARCH:
        case RECONCILE_SEARCH_OTHERS:
            /* Never asked for a refund: no search of refunds exists. */
        case RECONCILE_SETTLE:
            l->status = dec.next == RECONCILE_SETTLE ? dec.status : d->status;
            snprintf(l->reason, sizeof(l->reason), "%s", dec.reason);
            snprintf(l->ppid, sizeof(l->ppid), "%s", dec.provider_payment_id);
            return;
        }
    }
}

/* ---- the loop ---- */

static void db_failed(struct reconciler *r, const char *stage, const char *err)
{
    r->next_poll = daemon_db_failed(&r->db, stage, err);
}

static void db_ok(struct reconciler *r)
{
    daemon_db_ok(&r->db);
}

/* Calls whose look could not be written, kept (bounded) until the database
 * takes them: a charge made must never vanish from provider_calls. */
static void keep_calls(struct reconciler *r, const struct attempt_call *calls, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (r->npending == PENDING_MAX) {
            log_warn("provider call log full; call kept in the log line only",
                     "payment_attempt_id", calls[i].attempt_id, NULL);
            continue;
        }
        struct pending_call *p = &r->pending[r->npending++];
        snprintf(p->attempt_id, sizeof(p->attempt_id), "%s", calls[i].attempt_id);
        p->refund = 0;
        p->operation = calls[i].operation;
        p->started_ms = calls[i].started_ms;
        p->res = *calls[i].res;
        p->written_maybe = 0;
    }
}

/* As keep_calls, a refund's: a refund made must never vanish either. */
static void keep_refund_calls(struct reconciler *r, const struct refund_call *calls,
                              size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (r->npending == PENDING_MAX) {
            log_warn("provider call log full; call kept in the log line only",
                     "refund_id", calls[i].refund_id, NULL);
            continue;
        }
        struct pending_call *p = &r->pending[r->npending++];
        snprintf(p->attempt_id, sizeof(p->attempt_id), "%s", calls[i].refund_id);
        p->refund = 1;
        p->operation = calls[i].operation;
        p->started_ms = calls[i].started_ms;
        p->res = *calls[i].res;
        p->written_maybe = 0;
    }
}

/* Writes n kept calls, an attempt's with the attempt store and a refund's
 * with the refund store: the worse of the two answers. */
static enum store_rc log_pending(struct reconciler *r, const struct pending_call *p,
                                 size_t n, struct store_error *err)
{
    struct attempt_call calls[PENDING_MAX];
    struct refund_call rcalls[PENDING_MAX];
    size_t nc = 0, nr = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].refund)
            rcalls[nr++] = (struct refund_call){.refund_id = p[i].attempt_id,
                                                .operation = p[i].operation,
                                                .started_ms = p[i].started_ms,
                                                .res = &p[i].res,
                                                .written_maybe = p[i].written_maybe};
        else
            calls[nc++] = (struct attempt_call){.attempt_id = p[i].attempt_id,
                                                .operation = p[i].operation,
                                                .started_ms = p[i].started_ms,
                                                .res = &p[i].res,
                                                .written_maybe = p[i].written_maybe};
    }
    enum store_rc rc =
        nc ? attempt_store_log_calls(r->store, calls, nc, err) : STORE_OK;
    if (rc != STORE_OK || nr == 0)
        return rc;
    return refund_store_log_calls(r->refunds, rcalls, nr, err);
}

/* 0 when nothing waits any more. */
static int flush_pending(struct reconciler *r)
{
    struct store_error err;
    if (r->npending == 0)
        return 0;
    int rc = log_pending(r, r->pending, r->npending, &err);
    if (rc == STORE_RETRY) {
        /* Given up at its deadline, the write may still commit. */
        for (size_t i = 0; i < r->npending; i++)
            r->pending[i].written_maybe = 1;
        db_failed(r, "log provider calls", err.message);
        return -1;
    }
    if (rc == STORE_OK) {
        r->npending = 0;
        return 0;
    }
    /* One call refused, or held by another session's lock: one by one, so
     * that a refused row alone is dropped and a held one kept for later
     * (a charge made must never vanish from provider_calls). With refunds
     * among them the attempts' statement may have committed before the
     * refunds' failed: those are written again only if absent. */
    int mixed = 0;
    for (size_t i = 0; i < r->npending; i++)
        mixed |= r->pending[i].refund;
    size_t kept = 0;
    for (size_t i = 0; i < r->npending; i++) {
        r->pending[i].written_maybe |= mixed && !r->pending[i].refund;
        rc = log_pending(r, &r->pending[i], 1, &err);
        if (rc == STORE_DATA)
            log_error("provider call not recorded: the database refused it",
                      "payment_attempt_id", r->pending[i].attempt_id, "error",
                      err.message, NULL);
        else if (rc != STORE_OK) {
            r->pending[i].written_maybe |= rc == STORE_RETRY;
            r->pending[kept++] = r->pending[i];
        }
    }
    if (kept > 0) {
        char n[32];
        snprintf(n, sizeof(n), "%zu", kept);
        log_warn("provider calls held by another session's lock; kept to write later",
                 "calls", n, NULL);
    }
    r->npending = kept;
    if (rc == STORE_RETRY) {
        db_failed(r, "log provider calls", err.message);
        return -1;
    }
    return 0;
}

/* Settles one look, whatever it found: a status change, or the next look. */
static int settle(struct reconciler *r, struct look *l)
{
    struct store_error err;
    const struct attempt_due *d = l->d;
    struct attempt_call calls[MAX_ROWS];
    size_t ncalls = 0;
    for (int i = 0; i < l->ncalls; i++) {
        /* The HTTP client re-sent the charge itself after a pooled connection
         * closed unanswered: that lost answer is a call of its own. */
        for (int k = 0; k < l->res[i].resent && ncalls < MAX_ROWS - 1; k++)
            calls[ncalls++] = (struct attempt_call){.attempt_id = d->id,
                                                    .operation = l->ops[i],
                                                    .started_ms = l->started[i],
                                                    .res = &l->lost};
        calls[ncalls++] = (struct attempt_call){.attempt_id = d->id,
                                                .operation = l->ops[i],
                                                .started_ms = l->started[i],
                                                .res = &l->res[i]};
    }
    /* The look's status, past RECONCILER_MAX_AGE_MS too, is the policy's. */
    int stays = l->status == d->status;
    char *evidence = json_dumps(l->evidence, JSON_COMPACT);
    struct attempt_settlement s = {
        .attempt_id = d->id,
        .lease_epoch = d->lease_epoch,
        .expected = d->status,
        .status = l->status,
        .cause = "reconciler",
        .reason = l->reason[0] ? l->reason : NULL,
        .provider_payment_id = l->ppid,
        .evidence_json = evidence,
        .next_check_ms = stays || l->status == ATTEMPT_STATUS_PROCESSING ||
                                 l->status == ATTEMPT_STATUS_UNKNOWN
                             ? next_look_ms(r, d->checks)
                             : -1,
        .calls = calls,
        .ncalls = ncalls,
    };
    int rc = attempt_store_settle(r->store, &s, 1, &err);
    if (rc == STORE_DATA && s.status != ATTEMPT_STATUS_REQUIRES_REVIEW) {
        /* A value the database refuses (an intent booked for another
         * attempt, say): a human decides, with nothing from outside but
         * the refusal. */
        char why[256];
        log_error("the database refused a settlement; settling it for review",
                  "payment_attempt_id", d->id, "order_id", d->params.order_id, "error",
                  err.message, NULL);
        snprintf(why, sizeof(why),
                 "requires_review: the database refused %s (sqlstate %s)",
                 attempt_status_name(s.status), err.sqlstate);
        s.status = ATTEMPT_STATUS_REQUIRES_REVIEW;
        s.reason = why;
        s.provider_payment_id = NULL;
        s.next_check_ms = -1;
        rc = attempt_store_settle(r->store, &s, 1, &err);
    }
    free(evidence);
    if (rc == STORE_LOCKED) {
        /* Another session's uncommitted change held the statement: nothing
         * written; our lease expires and the next look decides again. */
        keep_calls(r, calls, ncalls);
        log_warn("attempt held by another session's transaction; looking again later",
                 "payment_attempt_id", d->id, "order_id", d->params.order_id, NULL);
        return 0;
    }
    if (rc == STORE_RETRY) {
        /* Outage: the decision is taken again at the next look, but the
         * calls made (a charge, perhaps) are kept to be written later. */
        keep_calls(r, calls, ncalls);
        db_failed(r, "settle", err.message);
        return -1;
    }
    if (rc != STORE_OK) {
        keep_calls(r, calls, ncalls);
        log_error("the database refused a settlement; the lease is left to expire",
                  "payment_attempt_id", d->id, "order_id", d->params.order_id, "error",
                  err.message, NULL);
        return 0;
    }
    db_ok(r);
    const char *from = attempt_status_name(d->status),
               *to = attempt_status_name(s.status);
    if (s.settled && !stays)
        metrics_add(METRIC_RECONCILER_SETTLEMENTS, 1, to);
    if (s.busy)
        /* Nothing waited for the session that holds it; our lease expires
         * and the next look decides again (its calls are recorded). */
        log_warn("attempt locked by another session; looking again later",
                 "payment_attempt_id", d->id, "order_id", d->params.order_id, NULL);
    else if (!s.settled)
        log_warn("lease lost before settling; result dropped", "payment_attempt_id",
                 d->id, "order_id", d->params.order_id, NULL);
    else if (stays)
        log_debug("looked; looking again later", "payment_attempt_id", d->id,
                  "order_id", d->params.order_id, "status", from, "reason", l->reason,
                  NULL);
    else if (s.status == ATTEMPT_STATUS_REQUIRES_REVIEW)
        log_warn("attempt needs review", "payment_attempt_id", d->id, "order_id",
                 d->params.order_id, "from", from, "reason", l->reason, NULL);
    else
        log_info("attempt settled on the provider's evidence", "payment_attempt_id",
                 d->id, "order_id", d->params.order_id, "from", from, "status", to,
                 "provider_payment_id", l->ppid[0] ? l->ppid : NULL, "reason",
                 l->reason[0] ? l->reason : NULL, NULL);
    return 0;
}

/* Settles one look at a refund, as settle() does an attempt's. */
static int settle_refund(struct reconciler *r, struct look *l)
{
    struct store_error err;
    const struct refund_due *d = l->rd;
    struct refund_call calls[MAX_ROWS];
    size_t ncalls = 0;
    for (int i = 0; i < l->ncalls; i++) {
        for (int k = 0; k < l->res[i].resent && ncalls < MAX_ROWS - 1; k++)
            calls[ncalls++] = (struct refund_call){.refund_id = d->id,
                                                   .operation = l->ops[i],
                                                   .started_ms = l->started[i],
                                                   .res = &l->lost};
        calls[ncalls++] = (struct refund_call){.refund_id = d->id,
                                               .operation = l->ops[i],
                                               .started_ms = l->started[i],
                                               .res = &l->res[i]};
    }
    int stays = l->status == d->status;
    char *evidence = json_dumps(l->evidence, JSON_COMPACT);
    struct refund_settlement s = {
        .refund_id = d->id,
        .lease_epoch = d->lease_epoch,
        .expected = d->status,
        .status = l->status,
        .reason = l->reason[0] ? l->reason : NULL,
        .provider_refund_id = l->ppid,
        .evidence_json = evidence,
        .next_check_ms = stays || l->status == ATTEMPT_STATUS_PROCESSING ||
                                 l->status == ATTEMPT_STATUS_UNKNOWN
                             ? next_look_ms(r, d->checks)
                             : -1,
        .calls = calls,
        .ncalls = ncalls,
    };
    int rc = refund_store_settle(r->refunds, &s, &err);
    if (rc == STORE_DATA && s.status != ATTEMPT_STATUS_REQUIRES_REVIEW) {
        char why[256];
        log_error("the database refused a refund's settlement; settling it for review",
                  "refund_id", d->id, "error", err.message, NULL);
        snprintf(why, sizeof(why),
                 "requires_review: the database refused %s (sqlstate %s)",
                 attempt_status_name(s.status), err.sqlstate);
        s.status = ATTEMPT_STATUS_REQUIRES_REVIEW;
        s.reason = why;
        s.provider_refund_id = NULL;
        s.next_check_ms = -1;
        rc = refund_store_settle(r->refunds, &s, &err);
    }
    free(evidence);
    if (rc == STORE_LOCKED) {
        keep_refund_calls(r, calls, ncalls);
        log_warn("refund held by another session's transaction; looking again later",
                 "refund_id", d->id, NULL);
        return 0;
    }
    if (rc == STORE_RETRY) {
        keep_refund_calls(r, calls, ncalls);
        db_failed(r, "settle refund", err.message);
        return -1;
    }
    if (rc != STORE_OK) {
        keep_refund_calls(r, calls, ncalls);
        log_error("the database refused a refund's settlement; the lease is left to "
                  "expire",
                  "refund_id", d->id, "error", err.message, NULL);
        return 0;
    }
    db_ok(r);
    const char *from = attempt_status_name(d->status),
               *to = attempt_status_name(s.status);
    if (s.settled && !stays)
        metrics_add(METRIC_RECONCILER_REFUND_SETTLEMENTS, 1, to);
    if (s.busy)
        log_warn("refund locked by another session; looking again later", "refund_id",
                 d->id, NULL);
    else if (!s.settled)
        log_warn("lease lost before settling; result dropped", "refund_id", d->id,
                 NULL);
    else if (stays)
        log_debug("looked; looking again later", "refund_id", d->id, "status", from,
                  "reason", l->reason, NULL);
    else if (s.status == ATTEMPT_STATUS_REQUIRES_REVIEW)
        log_warn("refund needs review", "refund_id", d->id, "payment_attempt_id",
                 d->params.payment_attempt_id, "from", from, "reason", l->reason, NULL);
    else
        log_info("refund settled on the provider's evidence", "refund_id", d->id,
                 "payment_attempt_id", d->params.payment_attempt_id, "from", from,
                 "status", to, "provider_refund_id", l->ppid[0] ? l->ppid : NULL,
                 "reason", l->reason[0] ? l->reason : NULL, NULL);
    return 0;
}

/* Hands back the claims of a batch cut short (stopping): a peer may look. */
static void release_rest(struct reconciler *r, size_t from, size_t n)
{
    struct store_error err;
    for (size_t i = from; i < n; i++) {
        const char *id = r->on_refunds ? r->rdue[i].id : r->due[i].id;
        const int64_t *epoch =
            r->on_refunds ? &r->rdue[i].lease_epoch : &r->due[i].lease_epoch;
        if (r->on_refunds ? refund_store_hand_back(r->refunds, &id, epoch, 1, &err)
                          : attempt_store_hand_back(r->store, &id, epoch, 1, &err))
            log_warn("could not release lease; it will expire",
                     r->on_refunds ? "refund_id" : "payment_attempt_id", id, "error",
                     err.message, NULL);
    }
}

/* Claims a batch of attempts (refunds: of refunds) due for a look and
 * settles each. *n: how many were claimed. -1 when the round stops here
 * (the database failed, or stopping). */
static int look_at_batch(struct reconciler *r, int refunds, size_t *n)
{
    struct store_error err;

    *n = 0;
    int rc = refunds ? refund_store_claim_due(r->refunds, r->rdue, (size_t)r->batch, n,
                                              r->lease_ms, r->stale_ms, &err)
                     : attempt_store_claim_due(r->store, r->due, (size_t)r->batch, n,
                                               r->lease_ms, r->stale_ms, &err);
    if (rc != STORE_OK) {
        db_failed(r, refunds ? "claim refunds" : "claim", err.message);
        return -1;
    }
    db_ok(r);
    int64_t claimed_at = clock_now_ms();
    r->on_refunds = refunds;
    r->ndue = *n;
    r->renewed_at = claimed_at;
    for (size_t i = 0; i < *n; i++) {
        if (daemon_stopping()) {
            release_rest(r, i, *n);
            return -1;
        }
        r->looking = i;
        keep_leases(r);
        struct look l = {.claimed_at = claimed_at};
        l.lost = provider_outcome_lost_answer();
        l.evidence = json_pack("{s:[]}", "calls");
        int failed;
        if (refunds) {
            l.rd = &r->rdue[i];
            look_refund(r, &l);
            failed = settle_refund(r, &l);
        } else {
            l.d = &r->due[i];
            look(r, &l);
            failed = settle(r, &l);
        }
        json_decref(l.evidence);
        if (failed) {
            release_rest(r, i + 1, *n);
            return -1;
        }
    }
    return 0;
}

static void look_at_due(struct reconciler *r, int64_t now)
{
    size_t n = 0, nr = 0;

    if (now < r->next_poll)
        return;
    if (flush_pending(r) != 0)
        return;
    if (look_at_batch(r, 0, &n) != 0 || look_at_batch(r, 1, &nr) != 0)
        return;
    /* A full batch: more may be due at once. */
    r->next_poll = (long long)n < r->batch && (long long)nr < r->batch
                       ? clock_now_ms() + r->poll_ms
                       : 0;
}

/* Every BACKLOG_EVERY_MS: how many attempts wait for a look, and how old
 * the oldest is, per status (one indexed count; with several reconcilers
 * each reports the same numbers). */
static void count_backlog(struct reconciler *r, int64_t now)
{
    static const enum attempt_status statuses[] = {ATTEMPT_STATUS_UNKNOWN,
                                                   ATTEMPT_STATUS_PROCESSING};
    long long counts[2], oldest[2];
    struct store_error err;
    if (now < r->next_backlog || (r->db.backoff_ms && now < r->next_poll))
        return; /* not due, or the database is being waited for */
    r->next_backlog = now + BACKLOG_EVERY_MS;
    if (attempt_store_backlog(r->store, statuses, 2, counts, oldest, &err) !=
        STORE_OK) {
        db_failed(r, "count backlog", err.message);
        return;
    }
    for (int i = 0; i < 2; i++) {
        const char *name = attempt_status_name(statuses[i]);
        metrics_set(METRIC_RECONCILER_BACKLOG, (double)counts[i], name);
        metrics_set(METRIC_RECONCILER_OLDEST, oldest[i] / 1000.0, name);
    }
    if (refund_store_backlog(r->refunds, statuses, 2, counts, oldest, &err) !=
        STORE_OK) {
        db_failed(r, "count refund backlog", err.message);
        return;
    }
    for (int i = 0; i < 2; i++) {
        const char *name = attempt_status_name(statuses[i]);
        metrics_set(METRIC_RECONCILER_REFUND_BACKLOG, (double)counts[i], name);
        metrics_set(METRIC_RECONCILER_REFUND_OLDEST, oldest[i] / 1000.0, name);
    }
}

/* Next due: the next poll for due attempts, or the backlog's count if it
 * comes first (while the database is backed off from, it waits for the
 * poll too). */
static int64_t reconciler_step(void *state, int64_t now)
{
    struct reconciler *r = state;
    count_backlog(r, now);
    look_at_due(r, clock_now_ms());
    if (r->db.backoff_ms)
        return r->next_poll;
    return daemon_policy_earliest(r->next_poll, r->next_backlog);
}

/* Ready: the database answers (the reconciler's work is all in it). */
static const char *reconciler_not_ready(void *state)
{
    struct reconciler *r = state;
    return daemon_db_not_ready(&r->db);
}

/* Nothing is in flight between steps: each step settles its batch or hands
 * the rest back. */
static size_t reconciler_drain(void *state, int64_t deadline)
{
    (void)state;
    (void)deadline;
    return 0;
}

static void teardown(struct reconciler *r)
{
    provider_client_free(r->provider);
    attempt_store_free(r->store);
    refund_store_free(r->refunds);
    free(r->due);
    free(r->rdue);
    config_free(r->cfg);
    free(r);
}

static void reconciler_finish(void *state, int flush_ms)
{
    (void)flush_ms;
    teardown(state);
}

static int setup(struct reconciler *r, char *err, size_t err_size)
{
    r->batch = config_int(r->cfg, CONFIG_RECONCILER_BATCH);
    r->lease_ms = config_int(r->cfg, CONFIG_RECONCILER_LEASE_MS);
    r->poll_ms = config_int(r->cfg, CONFIG_RECONCILER_POLL_MS);
    r->max_age_ms = config_int(r->cfg, CONFIG_RECONCILER_MAX_AGE_MS);
    r->search_lag_ms = config_int(r->cfg, CONFIG_RECONCILER_SEARCH_LAG_MS);
    r->stale_ms = config_int(r->cfg, CONFIG_RECONCILER_STALE_LEASE_MS);
    r->key_retention_ms = config_int(r->cfg, CONFIG_WORKER_KEY_RETENTION_MS);
    r->provider_timeout_ms = config_int(r->cfg, CONFIG_PROVIDER_TIMEOUT_MS);
    /* A provider call is the longest a step waits between heartbeats. */
    long long stall_ms = config_int(r->cfg, CONFIG_HEALTH_STALL_MS);
    if (stall_ms <= r->provider_timeout_ms) {
        snprintf(err, err_size,
                 "HEALTH_STALL_MS: %lld does not outlast one provider call "
                 "(PROVIDER_TIMEOUT_MS %lld): a slow provider would look like a "
                 "stuck reconciler",
                 stall_ms, r->provider_timeout_ms);
        return 2;
    }
    if (parse_schedule(r, config_str(r->cfg, CONFIG_RECONCILER_SCHEDULE_MS), err,
                       err_size) != 0)
        return 2;
    /* One look makes two calls at most, a walk of the list apart (which
     * renews the lease as it goes); the lease must outlast them, or a peer
     * could look at the same attempt meanwhile. */
    if (r->lease_ms <= 2 * MAX_CALLS * r->provider_timeout_ms) {
        snprintf(err, err_size,
                 "RECONCILER_LEASE_MS: %lld does not outlast a look's calls (%lld ms); "
                 "raise it or lower PROVIDER_TIMEOUT_MS",
                 r->lease_ms, 2 * MAX_CALLS * r->provider_timeout_ms);
        return 2;
    }
    if (r->key_retention_ms <=
        charge_policy_key_margin_ms(r->key_retention_ms, r->provider_timeout_ms)) {
        snprintf(err, err_size,
                 "WORKER_KEY_RETENTION_MS: %lld leaves no time to call the provider",
                 r->key_retention_ms);
        return 2;
    }
    r->due = calloc((size_t)r->batch, sizeof(*r->due));
    r->rdue = calloc((size_t)r->batch, sizeof(*r->rdue));
    if (!r->due || !r->rdue) {
        snprintf(err, err_size, "out of memory");
        return 1;
    }
    r->provider = provider_client_new(config_str(r->cfg, CONFIG_PROVIDER_BASE_URL),
                                      config_str(r->cfg, CONFIG_PROVIDER_API_KEY),
                                      config_str(r->cfg, CONFIG_PROVIDER_API_VERSION),
                                      r->provider_timeout_ms, err, err_size);
    if (!r->provider)
        return 2;
    /* Does not connect: started while the database is down, it waits. */
    struct store_error serr;
    r->store = attempt_store_new(config_str(r->cfg, CONFIG_DATABASE_URL), r->id, &serr);
    if (!r->store) {
        snprintf(err, err_size, "%s", serr.message);
        return 2;
    }
    r->refunds =
        refund_store_new(config_str(r->cfg, CONFIG_DATABASE_URL), r->id, &serr);
    if (!r->refunds) {
        snprintf(err, err_size, "%s", serr.message);
        return 2;
    }
    return 0;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged reconciler\n\n"
            "Settles attempts whose outcome is unknown on the provider's evidence,\n"
            "and only on an intent proven the attempt's own: its recorded intent id\n"
            "(looked up), or, with none recorded, the answer to the charge again\n"
            "under the attempt's key while the provider keeps it (409: still\n"
            "executing, look again). An intent found by search or list only names\n"
            "the attempt: past the key's window it goes to REQUIRES_REVIEW; FAILED\n"
            "only when the provider's (consistent) list of the key's window holds\n"
            "none at all, after the key's retention and the search's lag.\n"
            "Looks again on RECONCILER_SCHEDULE_MS; past RECONCILER_MAX_AGE_MS, or on\n"
            "contradictory evidence, the attempt goes to REQUIRES_REVIEW.\n"
            "Refunds left UNKNOWN or PROCESSING alike: by refund id, else the refund\n"
            "again with its key while the provider keeps it; past that, a refund in\n"
            "the intent's list naming it goes to REQUIRES_REVIEW, none is FAILED.\n"
            "SIGTERM: finish the look in hand, hand the rest back, exit 0.\n\n");
    config_print_help(out, CONFIG_ROLE_RECONCILER);
}

static int reconciler_start(config_t *cfg, const char *id, void **state, char *err,
                            size_t err_size)
{
    struct reconciler *r = calloc(1, sizeof(*r));
    if (!r) {
        config_free(cfg);
        snprintf(err, err_size, "out of memory");
        return 1;
    }
    r->cfg = cfg;
    snprintf(r->id, sizeof(r->id), "%s", id);
    int rc = setup(r, err, err_size);
    if (rc != 0) {
        teardown(r);
        return rc;
    }
    log_info("reconciler started", "reconciler", r->id, NULL);
    *state = r;
    return 0;
}

int reconciler_main(int argc, char **argv)
{
    static const struct daemon_role_desc desc = {
        .name = "reconciler",
        .config_role = CONFIG_ROLE_RECONCILER,
        .usage = usage,
        .start = reconciler_start,
        .step = reconciler_step,
        .not_ready = reconciler_not_ready,
        .drain = reconciler_drain,
        .finish = reconciler_finish,
    };
    return daemon_role_main(argc, argv, &desc);
}
