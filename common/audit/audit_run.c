#include "audit_run.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "charged_assert.h"
#include "clock.h"
#include "log.h"
#include "metrics.h"

/* Ledger rows not confirmed by the copy, looked up per statement. */
#define LEDGER_BATCH 200

/* Strays of one paid order (intents naming only it), read per statement. */
#define ORDER_STRAYS_BATCH 100

/* One audit in progress: where findings are recorded and counted. */
struct audit_ctx {
    provider_client_t *pc;
    audit_store_t *st;
    long long start, end; /* the window findings are recorded under */
    struct audit_run_result *out;
    const struct audit_step_table *steps; /* the operations' rules */
    struct charged_error *err;
    const struct audit_run_hooks *hooks; /* NULL: none */
};

static enum charged_rc store_failed(struct audit_ctx *c, const char *what,
                                    const struct charged_error *err)
{
    charged_error_set(c->err, "%s: %s", what, err->message);
    return CHARGED_RETRY;
}

static long long or_none(int known, long long v)
{
    return known ? v : -1;
}

/* Records f, the object of second `at`, counts it as observed and, when
 * new, as fresh (logged, as an error when money is wrong: a person acts
 * on each). It is recorded under that second, not under this audit's
 * window: the first audit to find it may be an on-demand one over a day,
 * and the scheduled window that holds the object must still show it. */
static enum charged_rc record_logged(struct audit_ctx *c, struct audit_finding *f,
                                     long long at, int error)
{
    struct charged_error err;
    int fresh = 0;
    int inside = at >= c->start && at < c->end;
    f->window_start = inside ? at : c->start;
    f->window_end = inside ? at + 1 : c->end;
    if (audit_store_add_finding(c->st, f, &fresh, &err) != CHARGED_OK)
        return store_failed(c, "record finding", &err);
    c->out->verdict.findings[f->kind]++;
    if (!fresh)
        return CHARGED_OK;
    c->out->fresh[f->kind]++;
    log_write(error ? LOG_ERROR : LOG_WARN, "audit finding", "kind",
              audit_kind_name(f->kind), "object", f->object_id, "payment_attempt_id",
              f->payment_attempt_id ? f->payment_attempt_id : "", "order_id",
              f->order_id ? f->order_id : "", "other_object",
              f->other_object_id ? f->other_object_id : "", "detail", f->detail, NULL);
    return CHARGED_OK;
}

/* A finding of the money rules (the operations' say their own level). */
static enum charged_rc record(struct audit_ctx *c, struct audit_finding *f,
                              long long at)
{
    return record_logged(
        c, f, at, f->kind == AUDIT_CHARGED_TWICE || f->kind == AUDIT_CHARGED_UNBOOKED);
}

/* Whether an object is settled for the audit's sake, by id, in the lists
 * for audit_store_pending. */
struct judged {
    const char *done[PROVIDER_PAGE_MAX];
    const char *wait[PROVIDER_PAGE_MAX];
    size_t ndone, nwait;
};

/* The finding res made of a listed intent. */
static enum charged_rc record_intent(struct audit_ctx *c,
                                     const struct provider_listed *it,
                                     const struct audit_intent_row *row,
                                     const struct audit_result *res)
{
    int booked = row->facts.booked;
    struct audit_finding f = {
        .kind = res->kind,
        .object_id = it->id,
        .payment_attempt_id = booked ? row->booked_attempt : it->payment_attempt_id,
        .order_id = it->order_id,
        .other_object_id =
            res->kind == AUDIT_FOREIGN_INTENT ? row->recorded : row->other_object,
        .provider_amount = it->amount,
        .provider_currency = it->currency,
        .ledger_amount = or_none(booked, row->facts.booked_amount),
        .ledger_currency = booked ? row->booked_currency : "",
        .detail = res->detail,
    };
    return record(c, &f, it->created);
}

/* Another client used our attempt's metadata: said beside the money
 * finding (which pages), naming the attempt's own intent. */
static enum charged_rc record_foreign(struct audit_ctx *c,
                                      const struct provider_listed *it,
                                      const struct audit_intent_row *row)
{
    struct audit_result foreign = {AUDIT_FINDING, AUDIT_FOREIGN_INTENT,
                                   "another client's intent names our attempt", 0};
    return record_intent(c, it, row, &foreign);
}

/* A booked intent's order paid a second time by intents that name only
 * the order, judged before (unknown_intent, say): charged_twice on every
 * one of them, not the oldest only (the booked intent is judged once a
 * window), each recorded under its own second. */
static enum charged_rc record_order_twins(struct audit_ctx *c,
                                          const struct provider_listed *it,
                                          const struct audit_intent_row *row)
{
    struct audit_result res = audit_policy_order_twin(&row->facts);
    struct audit_order_stray *strays;
    struct charged_error err;
    char after[PROVIDER_ID_MAX] = "";
    long long after_created = LLONG_MIN;
    size_t n = 0;
    enum charged_rc rc = CHARGED_RETRY;
    if (res.outcome != AUDIT_FINDING)
        return CHARGED_OK;
    if (!(strays = calloc(ORDER_STRAYS_BATCH, sizeof(*strays)))) {
        charged_error_set(c->err, "out of memory");
        return CHARGED_RETRY;
    }
    do {
        if (audit_store_order_strays(c->st, row->booked_order, it->id, after_created,
                                     after, strays, ORDER_STRAYS_BATCH, &n,
                                     &err) != CHARGED_OK) {
            store_failed(c, "order strays", &err);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            struct audit_finding f = {
                .kind = res.kind,
                .object_id = strays[i].id,
                .order_id = row->booked_order,
                .other_object_id = it->id,
                .provider_amount = strays[i].amount,
                .provider_currency = strays[i].currency,
                .ledger_amount = -1,
                .detail = res.detail,
            };
            if (record(c, &f, strays[i].created) != CHARGED_OK)
                goto out;
        }
        if (n > 0) {
            snprintf(after, sizeof(after), "%s", strays[n - 1].id);
            after_created = strays[n - 1].created;
        }
    } while (n == ORDER_STRAYS_BATCH);
    rc = CHARGED_OK;
out:
    free(strays);
    return rc;
}

/* The findings of the operations' rules about a manual intent
 * (audit_policy_steps): recorded as every finding is, naming the attempt
 * that recorded the intent. 1 in *waits when one of them cannot be judged
 * yet. */
static enum charged_rc record_steps(struct audit_ctx *c,
                                    const struct provider_listed *it,
                                    const struct audit_intent_row *row, int *waits)
{
    struct audit_result res[AUDIT_STEP_RULES_MAX];
    const struct audit_step_rule *rules[AUDIT_STEP_RULES_MAX];
    const long long *cols[AUDIT_STEP_RULES_MAX];
    const struct audit_step_facts *sf = &row->steps;
    size_t n = 0, k = 0, col = 0;
    /* The store filled the steps of every row it returned. */
    CHARGED_ASSERT(sf->status != NULL && sf->attempt_status != NULL);
    int ours = *row->step_attempt != '\0';
    *waits = audit_policy_steps(sf, c->steps, res, &n);
    for (size_t s = 0; s < c->steps->n; s++) {
        for (size_t r = 0; r < c->steps->sets[s]->nrules; r++, k++) {
            rules[k] = &c->steps->sets[s]->rules[r];
            cols[k] = sf->columns + col;
        }
        col += c->steps->sets[s]->ncolumns;
    }
    CHARGED_ASSERT(k == n);
    for (size_t r = 0; r < n; r++) {
        if (res[r].outcome != AUDIT_FINDING)
            continue;
        /* Ours: what our books hold against the provider's amount. */
        long long books = ours && rules[r]->books ? rules[r]->books(sf, cols[r]) : -1;
        struct audit_finding f = {
            .kind = res[r].kind,
            .object_id = it->id,
            .payment_attempt_id = ours ? row->step_attempt : it->payment_attempt_id,
            .order_id = ours ? row->step_order : it->order_id,
            .provider_amount = rules[r]->money ? sf->amount_received : it->amount,
            .provider_currency = it->currency,
            .ledger_amount = books,
            .ledger_currency = books >= 0 ? row->step_currency : "",
            .detail = res[r].detail,
        };
        if (record_logged(c, &f, it->created, rules[r]->error) != CHARGED_OK)
            return CHARGED_RETRY;
    }
    return CHARGED_OK;
}

static enum charged_rc judge_intents(struct audit_ctx *c,
                                     const struct provider_listed *items, size_t n)
{
    struct audit_intent_row *rows = calloc(n ? n : 1, sizeof(*rows));
    struct charged_error err;
    struct judged j = {0};
    enum charged_rc rc = CHARGED_RETRY;
    if (!rows) {
        charged_error_set(c->err, "out of memory");
        return CHARGED_RETRY;
    }
    if (audit_store_intents(c->st, items, n, c->steps, rows, &err) != CHARGED_OK) {
        store_failed(c, "match intents", &err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct provider_listed *it = &items[i];
        const struct audit_intent_row *row = &rows[i];
        struct audit_result res = audit_policy_intent(&row->facts);
        int steps_wait = 0;
        /* Judged every time the intent is seen: a manual intent changes
         * after its window (its steps: taken, released, lapsed). */
        if (record_steps(c, it, row, &steps_wait) != CHARGED_OK)
            goto out;
        if (res.outcome == AUDIT_PENDING || steps_wait) {
            j.wait[j.nwait++] = it->id;
            if (res.outcome == AUDIT_PENDING)
                continue;
        } else {
            j.done[j.ndone++] = it->id;
        }
        if (res.outcome == AUDIT_FINDING &&
            record_intent(c, it, row, &res) != CHARGED_OK)
            goto out;
        if (res.also_foreign && record_foreign(c, it, row) != CHARGED_OK)
            goto out;
        if (record_order_twins(c, it, row) != CHARGED_OK)
            goto out;
    }
    if (audit_store_pending(c->st, "intent", j.done, j.ndone, j.wait, j.nwait, &err) !=
        CHARGED_OK) {
        store_failed(c, "pending intents", &err);
        goto out;
    }
    rc = CHARGED_OK;
out:
    free(rows);
    return rc;
}

static enum charged_rc judge_refunds(struct audit_ctx *c,
                                     const struct provider_listed *items, size_t n)
{
    struct audit_refund_row *rows = calloc(n ? n : 1, sizeof(*rows));
    struct charged_error err;
    struct judged j = {0};
    enum charged_rc rc = CHARGED_RETRY;
    if (!rows) {
        charged_error_set(c->err, "out of memory");
        return CHARGED_RETRY;
    }
    if (audit_store_refunds(c->st, items, n, rows, &err) != CHARGED_OK) {
        store_failed(c, "match refunds", &err);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const struct provider_listed *it = &items[i];
        const struct audit_refund_row *row = &rows[i];
        struct audit_result res = audit_policy_refund(&row->facts);
        if (res.outcome == AUDIT_PENDING)
            j.wait[j.nwait++] = it->id;
        else
            j.done[j.ndone++] = it->id;
        if (res.outcome == AUDIT_FINDING) {
            struct audit_finding f = {
                .kind = res.kind,
                .object_id = it->id,
                .payment_attempt_id = row->payment_attempt_id,
                .order_id = row->order_id,
                .refund_id = *row->refund_attempt ? row->refund_attempt : it->refund_id,
                .other_object_id = it->payment_intent,
                .provider_amount = it->amount,
                .provider_currency = it->currency,
                .ledger_amount = or_none(row->facts.booked, row->facts.booked_amount),
                .detail = res.detail,
            };
            if (record(c, &f, it->created) != CHARGED_OK)
                goto out;
        }
        /* Whatever this refund is, the charge's refunds must fit in it:
         * one finding per intent. */
        if (!strcmp(it->status, "succeeded") && row->charge_amount >= 0 &&
            audit_policy_over_refunded(row->refunded_total, row->charge_amount)) {
            struct audit_finding f = {
                .kind = AUDIT_REFUNDED_OVER_CHARGE,
                .object_id = it->payment_intent,
                .payment_attempt_id = row->payment_attempt_id,
                .order_id = row->order_id,
                .refund_id = *row->refund_attempt ? row->refund_attempt : it->refund_id,
                .other_object_id = it->id,
                .provider_amount = row->refunded_total,
                .provider_currency = it->currency,
                .ledger_amount = row->charge_amount,
                .detail = "succeeded refunds add up past the charge",
            };
            if (record(c, &f, it->created) != CHARGED_OK)
                goto out;
        }
    }
    if (audit_store_pending(c->st, "refund", j.done, j.ndone, j.wait, j.nwait, &err) !=
        CHARGED_OK) {
        store_failed(c, "pending refunds", &err);
        goto out;
    }
    rc = CHARGED_OK;
out:
    free(rows);
    return rc;
}

static enum charged_rc provider_failed(struct audit_ctx *c, const char *what,
                                       const struct provider_result *res)
{
    if (res->throttled)
        charged_error_set(c->err,
                          "%s: no evidence (%s; throttled past the %lld ms a request "
                          "waits for the provider's Retry-After or back-off)",
                          what, res->error, c->hooks ? c->hooks->throttled_wait_ms : 0);
    else
        charged_error_set(c->err, "%s: no evidence (%s)", what, res->error);
    return CHARGED_RETRY;
}

/* Sleeps ms, alive (a heartbeat every 100 ms at most), until done or the
 * hooks say stop: 1 when slept through. */
static int wait_alive(const struct audit_run_hooks *hooks, long long ms)
{
    CHARGED_ASSERT(hooks && ms >= 0);
    const int64_t until = clock_now_ms() + ms;
    for (int64_t now = clock_now_ms(); now < until; now = clock_now_ms()) {
        if (hooks->stopping && hooks->stopping())
            return 0;
        long long slice = until - now < 100 ? until - now : 100;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = slice * 1000000L};
        nanosleep(&ts, NULL);
        if (hooks->heartbeat)
            hooks->heartbeat();
    }
    return !(hooks->stopping && hooks->stopping());
}

/* One request's 429s so far: how many, and how long they were waited for. */
struct throttle {
    int answers;
    long long waited_ms;
};

/* Issue 38: a throttled answer (429) is no evidence, but the request is
 * safe to ask again: waits the provider's Retry-After (or the back-off)
 * while this request's waits stay within the hooks' bound. 1: ask again;
 * 0: not throttled, past the bound, or stopping (the answer stands). */
static int throttled_again(struct audit_ctx *c, const char *what,
                           const struct provider_result *res, struct throttle *t)
{
    CHARGED_ASSERT(c && res && t && t->answers >= 0);
    if (!res->throttled || !c->hooks)
        return 0;
    long long ms = provider_outcome_throttled_wait_ms(res->retry_after_ms, t->answers);
    if (t->waited_ms + ms > c->hooks->throttled_wait_ms)
        return 0;
    char wait[32];
    snprintf(wait, sizeof(wait), "%lld", ms);
    log_info("the provider throttled the audit; asking again after its wait", "request",
             what, "wait_ms", wait, NULL);
    t->answers++;
    t->waited_ms += ms;
    CHARGED_ASSERT(t->waited_ms <= c->hooks->throttled_wait_ms);
    return wait_alive(c->hooks, ms);
}

/* Every object of one kind created in the window, page by page. */
static enum charged_rc walk(struct audit_ctx *c, enum provider_list_of what,
                            const struct audit_run_hooks *hooks, long long *seen)
{
    struct provider_page *page = malloc(sizeof(*page));
    struct provider_result res;
    char after[PROVIDER_ID_MAX] = "";
    long long after_created = 0;
    enum charged_rc rc = CHARGED_RETRY;
    const char *noun = what == PROVIDER_LIST_REFUNDS ? "refund" : "intent";
    if (!page) {
        charged_error_set(c->err, "out of memory");
        return CHARGED_RETRY;
    }
    for (;;) {
        if (hooks && hooks->stopping && hooks->stopping()) {
            charged_error_set(c->err, "stopping");
            goto out;
        }
        const char *list =
            what == PROVIDER_LIST_REFUNDS ? "refund list" : "intent list";
        struct throttle t = {0};
        do
            provider_client_list_page(c->pc, what, c->start, c->end, after, page, &res);
        while (throttled_again(c, list, &res, &t));
        if (res.outcome != PROVIDER_SUCCEEDED) {
            provider_failed(c, list, &res);
            goto out;
        }
        /* A page after the cursor that holds the cursor's own object did
         * not move on (a provider or proxy that ignores starting_after),
         * nor did one with an object newer than it (the list is newest
         * first): walking on would count the same objects forever. */
        for (size_t i = 0; *after && i < page->n; i++)
            if (!strcmp(page->items[i].id, after) ||
                page->items[i].created > after_created) {
                charged_error_set(
                    c->err,
                    "%s list: no evidence (the page after %s is not older than it)",
                    noun, after);
                goto out;
            }
        if ((what == PROVIDER_LIST_REFUNDS ? judge_refunds : judge_intents)(
                c, page->items, page->n) != CHARGED_OK)
            goto out;
        *seen += (long long)page->n;
        metrics_add(METRIC_AUDIT_OBJECTS, (double)page->n, noun);
        if (hooks && hooks->heartbeat)
            hooks->heartbeat();
        if (!page->has_more)
            break;
        snprintf(after, sizeof(after), "%s", page->items[page->n - 1].id);
        after_created = page->items[page->n - 1].created;
    }
    rc = CHARGED_OK;
out:
    free(page);
    return rc;
}

/* One ledger row on the provider's word: obj as the provider has it, or
 * (found 0) the provider does not have it. */
static enum charged_rc judge_ledger_facts(struct audit_ctx *c,
                                          const struct audit_ledger_row *l, int found,
                                          const struct provider_listed *obj)
{
    struct charged_error err;
    /* A manual intent's money is what the provider took of it. */
    int manual = found && !strcmp(obj->capture_method, "manual");
    struct audit_ledger_facts facts = {
        .provider_status = found ? obj->status : NULL,
        .provider_amount = manual  ? obj->amount_received
                           : found ? obj->amount
                                   : 0,
        .provider_currency = found ? obj->currency : "",
        .amount = l->amount,
        .currency = l->currency,
    };
    struct audit_result r = audit_policy_ledger(&facts);
    if (r.outcome == AUDIT_PENDING) {
        /* Booked while the provider still settles it: looked at again
         * until it succeeds (matched) or does not (booked_not_charged). */
        const char *wait[1] = {l->object_id};
        if (audit_store_pending(c->st, l->refund ? "refund" : "intent", NULL, 0, wait,
                                1, &err) != CHARGED_OK)
            return store_failed(c, "pending ledger object", &err);
        return CHARGED_OK;
    }
    if (r.outcome != AUDIT_FINDING)
        return CHARGED_OK;
    struct audit_finding f = {
        .kind = r.kind,
        .object_id = l->object_id,
        .payment_attempt_id = l->payment_attempt_id,
        .order_id = l->order_id,
        .refund_id = l->refund_id,
        .provider_amount = found ? facts.provider_amount : -1,
        .provider_currency = found ? obj->currency : "",
        .ledger_amount = l->amount,
        .ledger_currency = l->currency,
        .detail = r.detail,
    };
    return record(c, &f, l->created);
}

/* One ledger row the copy did not confirm, on the provider's word. */
static enum charged_rc judge_ledger_row(struct audit_ctx *c,
                                        const struct audit_ledger_row *l)
{
    struct provider_listed obj;
    struct provider_result res;
    struct charged_error err;
    enum provider_list_of what =
        l->refund ? PROVIDER_LIST_REFUNDS : PROVIDER_LIST_INTENTS;
    struct throttle t = {0};
    do
        provider_client_fetch(c->pc, what, l->object_id, &obj, &res);
    while (throttled_again(c, "ledger object look-up", &res, &t));
    if (res.outcome != PROVIDER_SUCCEEDED && res.outcome != PROVIDER_NOT_FOUND)
        return provider_failed(c, "ledger object look-up", &res);
    int found = res.outcome == PROVIDER_SUCCEEDED;
    if (found) {
        /* The copy learns it: its own window's audit, or the next look at
         * this one, need not ask again. */
        if (what == PROVIDER_LIST_REFUNDS) {
            struct audit_refund_row row;
            if (audit_store_refunds(c->st, &obj, 1, &row, &err) != CHARGED_OK)
                return store_failed(c, "copy refund", &err);
        } else {
            struct audit_intent_row row;
            if (audit_store_intents(c->st, &obj, 1, c->steps, &row, &err) != CHARGED_OK)
                return store_failed(c, "copy intent", &err);
        }
    }
    return judge_ledger_facts(c, l, found, &obj);
}

static enum charged_rc ledger_side(struct audit_ctx *c,
                                   const struct audit_run_hooks *hooks)
{
    struct audit_ledger_row *rows = calloc(LEDGER_BATCH, sizeof(*rows));
    struct charged_error err;
    long long after = 0;
    size_t n = 0;
    enum charged_rc rc = CHARGED_RETRY;
    if (!rows) {
        charged_error_set(c->err, "out of memory");
        return CHARGED_RETRY;
    }
    if (audit_store_ledger_count(c->st, c->start, c->end, &c->out->verdict.ledger_rows,
                                 &err) != CHARGED_OK) {
        store_failed(c, "count ledger rows", &err);
        goto out;
    }
    metrics_add(METRIC_AUDIT_OBJECTS, (double)c->out->verdict.ledger_rows,
                "ledger_row");
    do {
        if (audit_store_ledger_unmatched(c->st, c->start, c->end, after, rows,
                                         LEDGER_BATCH, &n, &err) != CHARGED_OK) {
            store_failed(c, "unmatched ledger rows", &err);
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            if (hooks && hooks->stopping && hooks->stopping()) {
                charged_error_set(c->err, "stopping");
                goto out;
            }
            if (judge_ledger_row(c, &rows[i]) != CHARGED_OK)
                goto out;
            after = rows[i].id;
            /* Each row may be a provider call: the loop is alive. */
            if (hooks && hooks->heartbeat)
                hooks->heartbeat();
        }
        if (hooks && hooks->heartbeat)
            hooks->heartbeat();
    } while (n == LEDGER_BATCH);
    rc = CHARGED_OK;
out:
    free(rows);
    return rc;
}

enum charged_rc audit_run_window(provider_client_t *pc, audit_store_t *st,
                                 long long start, long long end, int scheduled,
                                 const char *auditor,
                                 const struct audit_step_table *steps,
                                 const struct audit_run_hooks *hooks,
                                 struct audit_run_result *out, int *recorded,
                                 struct charged_error *err)
{
    struct audit_ctx c = {pc, st, start, end, out, steps, err, hooks};
    CHARGED_ASSERT(steps != NULL);
    struct charged_error serr;
    long long id = 0, pending = 0;
    memset(out, 0, sizeof(*out));
    *recorded = 0;
    out->verdict.start = start;
    out->verdict.end = end;
    out->verdict.scheduled = scheduled;
    out->verdict.auditor = auditor;
    out->verdict.started_ms = clock_wall_ms();
    if (walk(&c, PROVIDER_LIST_INTENTS, hooks, &out->verdict.intents) != CHARGED_OK ||
        walk(&c, PROVIDER_LIST_REFUNDS, hooks, &out->verdict.refunds) != CHARGED_OK ||
        ledger_side(&c, hooks) != CHARGED_OK)
        return CHARGED_RETRY;
    if (audit_store_pending_count(st, &pending, &serr) != CHARGED_OK)
        return store_failed(&c, "count pending", &serr);
    out->verdict.pending += pending;
    if (audit_store_finish(st, &out->verdict, recorded, &id, &serr) != CHARGED_OK)
        return store_failed(&c, "record verdict", &serr);
    out->verdict_id = id;
    return CHARGED_OK;
}

enum charged_rc audit_run_pending(provider_client_t *pc, audit_store_t *st, size_t max,
                                  const struct audit_step_table *steps,
                                  const struct audit_run_hooks *hooks,
                                  struct audit_run_result *out,
                                  struct charged_error *err)
{
    char(*ids)[PROVIDER_ID_MAX] = calloc(max ? max : 1, sizeof(*ids));
    int *is_refund = calloc(max ? max : 1, sizeof(*is_refund));
    struct audit_ctx c = {pc, st, 0, 0, out, steps, err, hooks};
    CHARGED_ASSERT(steps != NULL);
    struct charged_error serr;
    size_t n = 0;
    enum charged_rc rc = CHARGED_RETRY;
    if (!ids || !is_refund) {
        charged_error_set(err, "out of memory");
        goto out;
    }
    if (audit_store_pending_due(st, max, ids, is_refund, &n, &serr) != CHARGED_OK) {
        store_failed(&c, "pending objects", &serr);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        struct provider_listed obj;
        struct provider_result res;
        if (hooks && hooks->stopping && hooks->stopping())
            break; /* the rest is looked at next time */
        if (hooks && hooks->heartbeat)
            hooks->heartbeat();
        enum provider_list_of what =
            is_refund[i] ? PROVIDER_LIST_REFUNDS : PROVIDER_LIST_INTENTS;
        struct throttle t = {0};
        do
            provider_client_fetch(pc, what, ids[i], &obj, &res);
        while (throttled_again(&c, "pending object look-up", &res, &t));
        if (res.outcome == PROVIDER_NOT_FOUND) {
            /* Gone from the provider: nothing of it is left to judge but
             * the ledger row booked on it, if any. The ledger side may have
             * judged that row already (it put the object here, pending):
             * it is judged now, as the ledger side judges a booked object
             * the provider does not have, under the second it was booked. */
            const char *done[1] = {ids[i]};
            struct audit_ledger_row l;
            int booked = 0;
            if (audit_store_ledger_of(st, ids[i], is_refund[i], &l, &booked, &serr) !=
                CHARGED_OK) {
                store_failed(&c, "ledger row of a pending object", &serr);
                goto out;
            }
            c.start = booked ? l.created : 0;
            c.end = booked ? l.created + 1 : 0;
            if (booked && judge_ledger_facts(&c, &l, 0, NULL) != CHARGED_OK)
                goto out;
            if (audit_store_pending(st, is_refund[i] ? "refund" : "intent", done, 1,
                                    NULL, 0, &serr) != CHARGED_OK) {
                store_failed(&c, "pending objects", &serr);
                goto out;
            }
            continue;
        }
        if (res.outcome != PROVIDER_SUCCEEDED) {
            provider_failed(&c, "pending object look-up", &res);
            goto out;
        }
        /* Found on a later look: recorded under the second it was made. */
        c.start = obj.created;
        c.end = obj.created + 1;
        if ((is_refund[i] ? judge_refunds : judge_intents)(&c, &obj, 1) != CHARGED_OK)
            goto out;
    }
    rc = CHARGED_OK;
out:
    free(ids);
    free(is_refund);
    return rc;
}
