/* One look at a claimed attempt or refund: the calls reconcile_look names,
 * and the settlement (reconciler_int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "card_data.h"
#include "charge_op.h"
#include "charged_assert.h"
#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "reconcile_look.h"
#include "reconcile_policy.h"
#include "reconciler_int.h"
#include "refund_op.h"

/* Rows recorded for one look at most: the calls, and the answers lost when
 * the HTTP client re-sent a call itself on a closed pooled connection. */
#define MAX_ROWS 8
_Static_assert(MAX_ROWS >= RECONCILE_LOOK_MAX_CALLS, "a row for every answer");

struct look_kind;

/* What one look found out, and what follows from it. */
struct look {
    const struct look_kind *k;
    const void *due; /* the claimed row: a struct attempt_due or refund_due */
    const char *id;
    int64_t lease_epoch;
    enum attempt_status from; /* as claimed */
    int checks;               /* looks so far */
    /* Log fields: the charge's order (NULL for a refund: left out), and
     * the value of the kind's about_key. */
    const char *order_id, *about;
    struct reconcile_look core; /* the calls' answers, and what they say */
    const char *ops[RECONCILE_LOOK_MAX_CALLS];
    int64_t started[RECONCILE_LOOK_MAX_CALLS];
    struct provider_result lost; /* what a re-sent call's first try left */
    enum attempt_status status;  /* == from: look again later */
    char reason[512];
    char ppid[PROVIDER_ID_MAX];
    json_t *evidence; /* what the provider said; owned */
};

/* A settlement as both stores take it. */
struct settlement {
    const char *id;
    int64_t lease_epoch;
    enum attempt_status expected, status;
    const char *reason, *object_id, *evidence_json; /* may be NULL */
    long long next_check_ms;                        /* < 0: none */
    const struct look_row *rows;
    size_t nrows;
    int settled, busy; /* out */
};

/* What differs between a look at a charge and at a refund. */
struct look_kind {
    int refund; /* its kept calls go to the refund store */
    /* Words of the log lines, db_failed's stage, the settlement counter. */
    const char *noun, *id_key, *about_key, *object_key, *refused, *settle_stage;
    enum metric_key settlements;
    /* The batch's i-th record into l, its look begun at claimed_at. */
    void (*begin)(struct reconciler *r, struct look *l, size_t i, int64_t claimed_at);
    /* A call other than the list, into *res. */
    void (*call)(struct reconciler *r, const struct look *l, enum reconcile_next next,
                 struct provider_result *res);
    /* One page of its list, after the object `after` ("" first). */
    void (*page)(struct reconciler *r, const struct look *l, const char *after,
                 struct provider_result *page);
    enum charged_rc (*settle)(struct reconciler *r, struct settlement *s,
                              struct charged_error *err);
};

/* ---- the calls ---- */

static void call_begin(struct reconciler *r)
{
    /* A look's calls are the loop's longest waits, each bounded by
     * PROVIDER_TIMEOUT_MS: liveness counts from the last one. */
    daemon_heartbeat();
    reconciler_keep_leases(r);
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

/* A walk's page as reconcile_policy_list_walk asks for it: each one a call
 * of the loop's (liveness, metrics). */
struct walk_page {
    struct reconciler *r;
    const struct look *l;
    const char *op;
};

static void walk_page(void *ctx, const char *after, struct provider_result *page)
{
    const struct walk_page *w = ctx;
    call_begin(w->r);
    w->l->k->page(w->r, w->l, after, page);
    call_end(w->op, page);
}

/* Makes the call a step names. A list is asked of the consistent source
 * whether any call under the key executed: every page walked, matched on
 * the metadata (reconcile_policy says what the pages add up to), and one
 * call row for the walk: the page that decided it, with the walk's
 * latency. */
static void make_call(struct reconciler *r, struct look *l,
                      const struct reconcile_step *st)
{
    const int i = st->call;
    int pages = 0;

    CHARGED_ASSERT(i >= 0 && i < RECONCILE_LOOK_MAX_CALLS && st->operation);
    if (st->next != RECONCILE_LIST)
        call_begin(r);
    l->ops[i] = st->operation;
    l->started[i] = clock_wall_ms();
    if (st->next == RECONCILE_LIST) {
        struct walk_page w = {.r = r, .l = l, .op = st->operation};
        pages = reconcile_policy_list_walk(walk_page, &w, st->answer);
    } else {
        l->k->call(r, l, st->next, st->answer);
        call_end(st->operation, st->answer);
    }
    note(l, st->operation, st->answer, pages);
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
    log_warn("objects name the attempt that are not its own", l->k->id_key, l->id,
             "order_id", l->order_id, "detail", note, NULL);
}

/* One look: reconcile_look names each call in turn and, once the evidence
 * suffices, the decision; this makes the calls. */
static void look(struct reconciler *r, struct look *l)
{
    struct reconcile_step st;
    for (;;) {
        reconcile_look_step(&l->core, clock_now_ms(), &st);
        if (st.next == RECONCILE_SETTLE)
            break;
        make_call(r, l, &st);
    }
    l->status = st.dec.status;
    snprintf(l->reason, sizeof(l->reason), "%s", st.dec.reason);
    snprintf(l->ppid, sizeof(l->ppid), "%s", st.dec.provider_payment_id);
    note_foreign(l, &st.dec);
}

/* ---- the charge's look ---- */

static struct reconcile_limits limits_of(const struct reconciler *r)
{
    return (struct reconcile_limits){
        .key_retention_ms = r->key_retention_ms,
        .provider_timeout_ms = r->provider_timeout_ms,
        .search_lag_ms = r->search_lag_ms,
        .max_age_ms = r->max_age_ms,
    };
}

static void charge_begin(struct reconciler *r, struct look *l, size_t i,
                         int64_t claimed_at)
{
    const struct attempt_due *d = &r->due[i];
    const struct reconcile_limits lim = limits_of(r);
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
    l->due = d;
    l->id = d->id;
    l->lease_epoch = d->lease_epoch;
    l->from = d->status;
    l->checks = d->checks;
    l->order_id = l->about = d->params.order_id;
    reconcile_look_begin(&l->core, RECONCILE_KIND_CHARGE, &lim, &a, claimed_at);
}

static void charge_call(struct reconciler *r, const struct look *l,
                        enum reconcile_next next, struct provider_result *res)
{
    const struct attempt_due *d = l->due;
    if (next == RECONCILE_RETRIEVE) {
        provider_client_retrieve(r->provider, d->provider_payment_id, res);
    } else if (next == RECONCILE_SEARCH || next == RECONCILE_SEARCH_OTHERS) {
        provider_client_search(r->provider, d->id, res);
    } else {
        CHARGED_ASSERT(next == RECONCILE_CHARGE);
        const struct provider_charge ch = charge_op_request(&d->params, d->id);
        provider_client_charge(r->provider, &ch, res);
    }
}

/* The intents created while a call under the attempt's key could have
 * been (reconcile_policy says which window). */
static void charge_page(struct reconciler *r, const struct look *l, const char *after,
                        struct provider_result *page)
{
    const struct attempt_due *d = l->due;
    long long gte, lt;
    reconcile_policy_list_window(d->first_sent_ms, r->key_retention_ms, &gte, &lt);
    provider_client_list(r->provider, d->id, gte, lt, after, page);
}

static enum charged_rc charge_settle(struct reconciler *r, struct settlement *s,
                                     struct charged_error *err)
{
    struct attempt_call calls[MAX_ROWS];
    CHARGED_ASSERT(s->nrows <= MAX_ROWS);
    for (size_t i = 0; i < s->nrows; i++)
        calls[i] = (struct attempt_call){.attempt_id = s->id,
                                         .operation = s->rows[i].operation,
                                         .started_ms = s->rows[i].started_ms,
                                         .res = s->rows[i].res};
    struct attempt_settlement a = {
        .attempt_id = s->id,
        .lease_epoch = s->lease_epoch,
        .expected = s->expected,
        .status = s->status,
        .cause = "reconciler",
        .reason = s->reason,
        .provider_payment_id = s->object_id,
        .evidence_json = s->evidence_json,
        .next_check_ms = s->next_check_ms,
        .calls = calls,
        .ncalls = s->nrows,
    };
    enum charged_rc rc = attempt_store_settle(r->store, &a, 1, err);
    s->settled = a.settled;
    s->busy = a.busy;
    return rc;
}

static const struct look_kind charge_kind = {
    .noun = "attempt",
    .id_key = "payment_attempt_id",
    .about_key = "order_id",
    .object_key = "provider_payment_id",
    .refused = "a settlement",
    .settle_stage = "settle",
    .settlements = METRIC_RECONCILER_SETTLEMENTS,
    .begin = charge_begin,
    .call = charge_call,
    .page = charge_page,
    .settle = charge_settle,
};

/* ---- the refund's look: reconcile_policy's refund order of evidence,
 * with the charge's limits ---- */

static void refund_begin(struct reconciler *r, struct look *l, size_t i,
                         int64_t claimed_at)
{
    const struct refund_due *d = &r->rdue[i];
    const struct reconcile_limits lim = limits_of(r);
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
    l->due = d;
    l->id = d->id;
    l->lease_epoch = d->lease_epoch;
    l->from = d->status;
    l->checks = d->checks;
    l->order_id = NULL;
    l->about = d->params.payment_attempt_id;
    reconcile_look_begin(&l->core, RECONCILE_KIND_REFUND, &lim, &a, claimed_at);
}

/* The refund again, under its key and with its stored parameters
 * (refund_op_request), waited for: the reconciler makes one call at a
 * time, each bounded by PROVIDER_TIMEOUT_MS. */
static void refund_again(struct reconciler *r, const struct refund_due *rd,
                         struct provider_result *res)
{
    const struct provider_refund req = refund_op_request(&rd->params, rd->id);
    struct charged_error err;
    void *tag;
    if (provider_client_start_refund(r->provider, &req, NULL, &err) != CHARGED_OK) {
        memset(res, 0, sizeof(*res));
        res->outcome = PROVIDER_NOT_EXECUTED; /* nothing was started */
        snprintf(res->error, sizeof(res->error), "%.*s", (int)sizeof(res->error) - 1,
                 err.message);
        return;
    }
    while (!provider_client_next_done(r->provider, res, &tag))
        provider_client_perform(r->provider, 100);
}

static void refund_call(struct reconciler *r, const struct look *l,
                        enum reconcile_next next, struct provider_result *res)
{
    const struct refund_due *d = l->due;
    if (next == RECONCILE_RETRIEVE) {
        provider_client_retrieve_refund(r->provider, d->provider_refund_id, res);
    } else {
        CHARGED_ASSERT(next == RECONCILE_CHARGE);
        refund_again(r, d, res);
    }
}

/* The refunds of the charge's intent. */
static void refund_page(struct reconciler *r, const struct look *l, const char *after,
                        struct provider_result *page)
{
    const struct refund_due *d = l->due;
    provider_client_list_refunds(r->provider, d->params.payment_intent, d->id, after,
                                 page);
}

static enum charged_rc refund_settle(struct reconciler *r, struct settlement *s,
                                     struct charged_error *err)
{
    struct refund_call calls[MAX_ROWS];
    CHARGED_ASSERT(s->nrows <= MAX_ROWS);
    for (size_t i = 0; i < s->nrows; i++)
        calls[i] = (struct refund_call){.refund_id = s->id,
                                        .operation = s->rows[i].operation,
                                        .started_ms = s->rows[i].started_ms,
                                        .res = s->rows[i].res};
    struct refund_settlement f = {.refund_id = s->id,
                                  .lease_epoch = s->lease_epoch,
                                  .expected = s->expected,
                                  .status = s->status,
                                  .reason = s->reason,
                                  .provider_refund_id = s->object_id,
                                  .evidence_json = s->evidence_json,
                                  .next_check_ms = s->next_check_ms,
                                  .calls = calls,
                                  .ncalls = s->nrows};
    enum charged_rc rc = refund_store_settle(r->refunds, &f, err);
    s->settled = f.settled;
    s->busy = f.busy;
    return rc;
}

static const struct look_kind refund_kind = {
    .refund = 1,
    .noun = "refund",
    .id_key = "refund_id",
    .about_key = "payment_attempt_id",
    .object_key = "provider_refund_id",
    .refused = "a refund's settlement",
    .settle_stage = "settle refund",
    .settlements = METRIC_RECONCILER_REFUND_SETTLEMENTS,
    .begin = refund_begin,
    .call = refund_call,
    .page = refund_page,
    .settle = refund_settle,
};

/* ---- the settlement ---- */

/* The look's calls as provider_calls records them. */
static size_t rows_of(const struct look *l, struct look_row *rows)
{
    size_t n = 0;
    for (int i = 0; i < l->core.ncalls; i++) {
        /* The HTTP client re-sent the call itself after a pooled
         * connection closed unanswered: that lost answer is a call of its
         * own. Room is kept for every answer still to come: lost sends past it
         * are not recorded, the answers always are. */
        size_t keep = (size_t)(l->core.ncalls - i);
        for (int k = 0; k < l->core.res[i].resent && n + keep < MAX_ROWS; k++)
            rows[n++] = (struct look_row){l->ops[i], l->started[i], &l->lost};
        CHARGED_ASSERT(n < MAX_ROWS);
        rows[n++] = (struct look_row){l->ops[i], l->started[i], &l->core.res[i]};
    }
    return n;
}

/* A value the database refuses (an intent booked for another attempt,
 * say): a human decides, with nothing from outside but the refusal. */
static enum charged_rc settle_for_review(struct reconciler *r, const struct look *l,
                                         struct settlement *s,
                                         struct charged_error *err)
{
    char msg[128], why[256];
    snprintf(msg, sizeof(msg), "the database refused %s; settling it for review",
             l->k->refused);
    log_error(msg, l->k->id_key, l->id, "order_id", l->order_id, "error", err->message,
              NULL);
    snprintf(why, sizeof(why), "requires_review: the database refused %s (sqlstate %s)",
             attempt_status_name(s->status), err->code);
    s->status = ATTEMPT_STATUS_REQUIRES_REVIEW;
    s->reason = why;
    s->object_id = NULL;
    s->next_check_ms = -1;
    return l->k->settle(r, s, err);
}

/* The settlement not written: the look's calls are kept to be written
 * later (a call made, a charge perhaps, must never vanish). -1 when the
 * database is away. */
static int not_settled(struct reconciler *r, const struct look *l, enum charged_rc rc,
                       const struct look_row *rows, size_t n,
                       const struct charged_error *err)
{
    char msg[128];
    reconciler_keep_calls(r, l->k->refund, l->id, l->k->id_key, rows, n);
    if (rc == CHARGED_WAIT) {
        /* Another session's uncommitted change held the statement: nothing
         * written; our lease expires and the next look decides again. */
        snprintf(msg, sizeof(msg),
                 "%s held by another session's transaction; looking again later",
                 l->k->noun);
        log_warn(msg, l->k->id_key, l->id, "order_id", l->order_id, NULL);
        return 0;
    }
    if (rc == CHARGED_RETRY) {
        /* Outage: the decision is taken again at the next look. */
        reconciler_db_failed(r, l->k->settle_stage, err->message);
        return -1;
    }
    snprintf(msg, sizeof(msg), "the database refused %s; the lease is left to expire",
             l->k->refused);
    log_error(msg, l->k->id_key, l->id, "order_id", l->order_id, "error", err->message,
              NULL);
    return 0;
}

/* What a written settlement did, in the log and the settlements' count. */
static void log_settlement(const struct look *l, const struct settlement *s, int stays)
{
    const struct look_kind *k = l->k;
    const char *from = attempt_status_name(l->from),
               *to = attempt_status_name(s->status);
    char msg[128];
    if (s->settled && !stays)
        metrics_add(k->settlements, 1, to);
    if (s->busy) {
        /* Nothing waited for the session that holds it; our lease expires
         * and the next look decides again (its calls are recorded). */
        snprintf(msg, sizeof(msg), "%s locked by another session; looking again later",
                 k->noun);
        log_warn(msg, k->id_key, l->id, "order_id", l->order_id, NULL);
    } else if (!s->settled) {
        log_warn("lease lost before settling; result dropped", k->id_key, l->id,
                 "order_id", l->order_id, NULL);
    } else if (stays) {
        log_debug("looked; looking again later", k->id_key, l->id, "order_id",
                  l->order_id, "status", from, "reason", l->reason, NULL);
    } else if (s->status == ATTEMPT_STATUS_REQUIRES_REVIEW) {
        snprintf(msg, sizeof(msg), "%s needs review", k->noun);
        log_warn(msg, k->id_key, l->id, k->about_key, l->about, "from", from, "reason",
                 l->reason, NULL);
    } else {
        snprintf(msg, sizeof(msg), "%s settled on the provider's evidence", k->noun);
        log_info(msg, k->id_key, l->id, k->about_key, l->about, "from", from, "status",
                 to, k->object_key, l->ppid[0] ? l->ppid : NULL, "reason",
                 l->reason[0] ? l->reason : NULL, NULL);
    }
}

/* Settles one look, whatever it found: a status change, or the next look. */
static int settle(struct reconciler *r, struct look *l)
{
    struct charged_error err;
    struct look_row rows[MAX_ROWS];
    size_t n = rows_of(l, rows);
    /* The look's status, past RECONCILER_MAX_AGE_MS too, is the policy's. */
    int stays = l->status == l->from;
    char *evidence = json_dumps(l->evidence, JSON_COMPACT);
    struct settlement s = {
        .id = l->id,
        .lease_epoch = l->lease_epoch,
        .expected = l->from,
        .status = l->status,
        .reason = l->reason[0] ? l->reason : NULL,
        .object_id = l->ppid,
        .evidence_json = evidence,
        .next_check_ms = reconcile_look_next_check_ms(l->from, l->status, r->schedule,
                                                      r->nschedule, l->checks),
        .rows = rows,
        .nrows = n,
    };
    enum charged_rc rc = l->k->settle(r, &s, &err);
    if (rc == CHARGED_BAD_ITEM && s.status != ATTEMPT_STATUS_REQUIRES_REVIEW)
        rc = settle_for_review(r, l, &s, &err);
    free(evidence);
    if (rc != CHARGED_OK)
        return not_settled(r, l, rc, rows, n, &err);
    reconciler_db_ok(r);
    log_settlement(l, &s, stays);
    return 0;
}

int reconciler_look_at(struct reconciler *r, size_t i, int64_t claimed_at)
{
    const struct look_kind *k = r->on_refunds ? &refund_kind : &charge_kind;
    struct look l = {.k = k};

    CHARGED_ASSERT(i < r->ndue);
    k->begin(r, &l, i, claimed_at);
    l.lost = provider_outcome_lost_answer();
    l.evidence = json_pack("{s:[]}", "calls");
    look(r, &l);
    int failed = settle(r, &l);
    json_decref(l.evidence);
    return failed;
}
