#include "sim_provider.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Faults, per mille of calls (psp-sim's demo mix, roughly). */
#define P_TOO_MANY     30 /* 429 before executing */
#define P_STORM        1  /* a POST starts a storm of 429s (per mille) */
#define P_ERROR_BEFORE 40 /* 5xx before executing: nothing stored */
#define P_DECLINE      80
#define P_PROCESSING   50 /* accepted, settles later */
#define P_ERROR_AFTER  40 /* executed, answered 5xx */
#define P_LOST         60 /* executed, the answer never arrives */
#define P_LOOKUP_FAIL  40 /* retrieve, search, list: 5xx */
#define P_DUP_WEBHOOK  150
#define P_NEVER_FOUND  100 /* by metadata: never, past any lag promised */

static void *grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return arr;
    size_t ncap = *cap ? *cap : 64;
    while (ncap < need)
        ncap *= 2;
    void *n = realloc(arr, ncap * elem);
    if (!n) {
        fprintf(stderr, "charged-sim: out of memory\n");
        exit(2);
    }
    *cap = ncap;
    return n;
}

/* arr[idx] exists, new slots set to `fill` (bytes). */
static void *reach(void *arr, size_t *n, size_t idx, size_t elem, int fill)
{
    if (idx < *n)
        return arr;
    size_t cap = *n, need = idx + 1;
    size_t ncap = cap ? cap : 64;
    while (ncap < need)
        ncap *= 2;
    char *a = realloc(arr, ncap * elem);
    if (!a) {
        fprintf(stderr, "charged-sim: out of memory\n");
        exit(2);
    }
    memset(a + cap * elem, fill, (ncap - cap) * elem);
    *n = ncap;
    return a;
}

struct sim_provider *sim_provider_new(const struct sim_settings *set,
                                      struct sim_rng *rng, struct sim_violation *viol)
{
    struct sim_provider *p = calloc(1, sizeof(*p));
    if (!p)
        return NULL;
    p->set = set;
    p->rng = rng;
    p->viol = viol;
    return p;
}

void sim_provider_free(struct sim_provider *p)
{
    if (!p)
        return;
    free(p->intents);
    free(p->refunds);
    free(p->keys);
    free(p->rkeys);
    free(p->skeys);
    free(p->first_of_attempt);
    free(p->charges_by_key);
    free(p->charges_by_order);
    free(p->refund_executed);
    free(p->processing);
    free(p->hooks);
    free(p);
}

void sim_attempt_name(int attempt, char *buf, size_t size)
{
    snprintf(buf, size, "a%d", attempt);
}

/* kind: enum sim_step_kind's, and -1 a charge's key. */
static struct sim_pkey *key_of(struct sim_provider *p, int key, int kind)
{
    struct sim_pkey **arr = kind < 0                  ? &p->keys
                            : kind == SIM_STEP_REFUND ? &p->rkeys
                                                      : &p->skeys;
    size_t *n = kind < 0                  ? &p->nkeys
                : kind == SIM_STEP_REFUND ? &p->nrkeys
                                          : &p->nskeys;
    size_t old = *n;
    *arr = reach(*arr, n, (size_t)key, sizeof(struct sim_pkey), 0);
    for (size_t i = old; i < *n; i++)
        (*arr)[i].first_post = -1;
    return &(*arr)[key];
}

static void webhook(struct sim_provider *p, int intent, enum sim_evidence ev)
{
    int copies = sim_rng_chance(p->rng, P_DUP_WEBHOOK) ? 2 : 1;
    int id = p->next_event++;
    for (int c = 0; c < copies; c++) {
        p->hooks = grow(p->hooks, &p->caphooks, p->nhooks + 1, sizeof(*p->hooks));
        p->hooks[p->nhooks++] = (struct sim_webhook){
            .event_id = id,
            .intent = intent,
            .evidence = ev,
            .created = p->now,
            .deliver_at = p->now + (int64_t)sim_rng_below(p->rng, 8000),
        };
    }
}

/* Money moved for intent i: the ledger counts it, per key and per order. */
static void book_charge(struct sim_provider *p, int i)
{
    struct sim_intent *in = &p->intents[i];
    p->charges_by_key =
        reach(p->charges_by_key, &p->ncharge_keys, (size_t)in->key, sizeof(int), 0);
    size_t no = p->norders;
    p->charges_by_order =
        reach(p->charges_by_order, &no, (size_t)in->order, sizeof(int), 0);
    p->norders = no;
    p->charged_total += in->manual ? in->captured : in->amount;
    if (++p->charges_by_key[in->key] > 1)
        sim_violate(p->viol, "one-charge-per-key", "key %d charged %d times", in->key,
                    p->charges_by_key[in->key]);
    if (++p->charges_by_order[in->order] > 1)
        sim_violate(p->viol, "one-charge-per-order", "order %d charged %d times",
                    in->order, p->charges_by_order[in->order]);
    if (p->on_charge)
        p->on_charge(p->ctx, in->attempt);
}

void sim_provider_tick(struct sim_provider *p)
{
    for (size_t k = 0; k < p->nprocessing;) {
        struct sim_intent *in = &p->intents[p->processing[k]];
        if (in->settle_at > p->now) {
            k++;
            continue;
        }
        int i = p->processing[k];
        p->processing[k] = p->processing[--p->nprocessing];
        in->state = in->final_success ? SIM_INTENT_SUCCEEDED : SIM_INTENT_FAILED;
        webhook(p, i, in->final_success ? SIM_EV_SUCCEEDED : SIM_EV_FAILED);
        if (in->final_success)
            book_charge(p, i);
    }
}

static void fill_intent(const struct sim_provider *p, int i, struct provider_result *r)
{
    const struct sim_intent *in = &p->intents[i];
    r->amount = in->amount;
    snprintf(r->currency, sizeof(r->currency), "eur");
    sim_attempt_name(in->attempt, r->intent_attempt_id, sizeof(r->intent_attempt_id));
    snprintf(r->provider_payment_id, sizeof(r->provider_payment_id), "pi_%d", i);
    r->matches = 1;
    snprintf(r->capture_method, sizeof(r->capture_method), "%s",
             in->manual ? "manual" : "automatic");
    r->amount_capturable = 0;
    r->amount_received = in->state == SIM_INTENT_SUCCEEDED
                             ? (in->manual ? in->captured : in->amount)
                             : 0;
    r->cancellation_reason[0] = '\0';
    switch (in->state) {
    case SIM_INTENT_SUCCEEDED:
        r->outcome = PROVIDER_SUCCEEDED;
        r->http_status = 200;
        snprintf(r->intent_status, sizeof(r->intent_status), "succeeded");
        break;
    case SIM_INTENT_REQUIRES_CAPTURE:
        r->outcome = PROVIDER_AUTHORIZED;
        r->http_status = 200;
        r->amount_capturable = in->amount;
        snprintf(r->intent_status, sizeof(r->intent_status), "requires_capture");
        break;
    case SIM_INTENT_CANCELED:
        r->outcome = PROVIDER_DECLINED;
        r->http_status = 200;
        snprintf(r->intent_status, sizeof(r->intent_status), "canceled");
        snprintf(r->cancellation_reason, sizeof(r->cancellation_reason),
                 "requested_by_customer");
        break;
    case SIM_INTENT_PROCESSING:
        r->outcome = PROVIDER_PROCESSING;
        r->http_status = 200;
        snprintf(r->intent_status, sizeof(r->intent_status), "processing");
        break;
    case SIM_INTENT_FAILED:
        r->outcome = PROVIDER_DECLINED;
        r->http_status = 402;
        snprintf(r->intent_status, sizeof(r->intent_status), "requires_payment_method");
        snprintf(r->code, sizeof(r->code), "card_declined");
        break;
    }
}

static void failed(struct provider_result *r, enum provider_outcome o, int http,
                   const char *why)
{
    memset(r, 0, sizeof(*r));
    r->outcome = o;
    r->http_status = http;
    r->sent = 1;
    snprintf(r->error, sizeof(r->error), "%s", why);
}

/* Every POST: never under a key the provider may have forgotten. The model
 * executes a POST when it is sent, but a real one may reach the provider
 * as late as its caller's timeout: it must be safe that late too. */
static void check_retention(struct sim_provider *p, struct sim_pkey *k, int key,
                            const char *what)
{
    int64_t latest = p->now + p->set->provider_timeout_ms;
    if (k->first_post >= 0 && latest >= k->first_post + p->set->key_retention_ms)
        sim_violate(p->viol, "key-after-retention",
                    "POST under %s key %d %lld ms after its first (arriving up to "
                    "%lld ms later), past the retention of %lld ms",
                    what, key, (long long)(p->now - k->first_post),
                    (long long)p->set->provider_timeout_ms,
                    (long long)p->set->key_retention_ms);
    if (k->first_post < 0)
        k->first_post = p->now;
}

/* The answer a caller sees of an executed (or replayed) call; the key is
 * in use while it executes. */
static void transport_after(struct sim_provider *p, struct sim_pkey *k,
                            struct provider_result *r, int *lost)
{
    long latency = 5 + (long)sim_rng_below(p->rng, 300);
    k->busy_until = p->now + latency;
    if (sim_rng_chance(p->rng, P_LOST)) {
        *lost = 1;
        failed(r, PROVIDER_UNKNOWN, 0, "timeout: no answer");
    } else if (sim_rng_chance(p->rng, P_ERROR_AFTER)) {
        failed(r, PROVIDER_UNKNOWN, 500, "api_error after executing");
    }
    r->latency_ms = latency;
}

/* 409: another request under the key is executing (nothing stored). */
static int in_use(struct sim_provider *p, struct sim_pkey *k, struct provider_result *r)
{
    if (p->now >= k->busy_until)
        return 0;
    failed(r, PROVIDER_NOT_EXECUTED, 409, "idempotency key in use");
    p->in_use++;
    r->latency_ms = 5;
    return 1;
}

/* What every POST meets before it executes: the key's retention, a
 * request under it still executing (409), 429, a 5xx. 1: answered so. */
static int post_front(struct sim_provider *p, struct sim_pkey *k, int key,
                      const char *what, struct provider_result *r, int *lost)
{
    *lost = 0;
    check_retention(p, k, key, what);
    if (in_use(p, k, r))
        return 1;
    if (p->now >= p->storm_until && sim_rng_chance(p->rng, P_STORM))
        p->storm_until = p->now + 1000 + (int64_t)sim_rng_below(p->rng, 5000);
    if (p->now < p->storm_until || sim_rng_chance(p->rng, P_TOO_MANY)) {
        failed(r, PROVIDER_NOT_EXECUTED, 429, "rate_limit");
        r->throttled = 1;
        /* Retry-After (whole seconds) half the time. */
        if (sim_rng_chance(p->rng, 500))
            r->retry_after_ms = 1000 * (1 + (long long)sim_rng_below(p->rng, 3));
        r->latency_ms = 5;
        p->throttled++;
        return 1;
    }
    if (sim_rng_chance(p->rng, P_ERROR_BEFORE)) {
        failed(r, PROVIDER_UNKNOWN, 500, "api_error before executing");
        r->latency_ms = 50;
        return 1;
    }
    return 0;
}

struct provider_result sim_provider_charge(struct sim_provider *p, int key, int attempt,
                                           int order, long long amount, int manual,
                                           int *lost)
{
    struct provider_result r = {0};
    struct sim_pkey *k = key_of(p, key, -1);
    if (post_front(p, k, key, "charge", &r, lost))
        return r;
    if (k->stored && p->now < k->stored_at + p->set->key_retention_ms) {
        /* Replayed: the first execution's answer, whatever the intent did since. */
        fill_intent(p, k->object, &r);
        r.outcome = (enum provider_outcome)k->outcome;
        r.replayed = 1;
        r.sent = 1;
        transport_after(p, k, &r, lost);
        return r;
    }
    p->intents = grow(p->intents, &p->capintents, p->nintents + 1, sizeof(*p->intents));
    int i = (int)p->nintents++;
    struct sim_intent *in = &p->intents[i];
    memset(in, 0, sizeof(*in));
    in->key = key;
    in->attempt = attempt;
    in->order = order;
    in->amount = amount;
    in->created = p->now;
    in->manual = manual;
    in->capture_key = in->void_key = -1;
    in->visible_at = p->now + (int64_t)sim_rng_below(
                                  p->rng, (uint64_t)p->set->provider_search_lag_ms + 1);
    /* Stripe promises no bound on the lag of a look-up by metadata: only
     * the list is consistent. */
    if (sim_rng_chance(p->rng, P_NEVER_FOUND))
        in->visible_at = INT64_MAX;
    size_t na = p->nattempts;
    p->first_of_attempt =
        reach(p->first_of_attempt, &na, (size_t)attempt, sizeof(int), 0xff);
    p->nattempts = na;
    in->next_of_attempt = p->first_of_attempt[attempt];
    p->first_of_attempt[attempt] = i;
    if (sim_rng_chance(p->rng, P_DECLINE)) {
        in->state = SIM_INTENT_FAILED;
        webhook(p, i, SIM_EV_FAILED);
    } else if (manual) {
        /* Held, not taken: the money moves at the capture. */
        in->state = SIM_INTENT_REQUIRES_CAPTURE;
        webhook(p, i, SIM_EV_AUTHORIZED);
    } else if (sim_rng_chance(p->rng, P_PROCESSING)) {
        in->state = SIM_INTENT_PROCESSING;
        in->final_success = !sim_rng_chance(p->rng, 200);
        in->settle_at = p->now + 1000 + (int64_t)sim_rng_below(p->rng, 30000);
        p->processing = grow(p->processing, &p->capprocessing, p->nprocessing + 1,
                             sizeof(*p->processing));
        p->processing[p->nprocessing++] = i;
        webhook(p, i, SIM_EV_PROCESSING);
    } else {
        in->state = SIM_INTENT_SUCCEEDED;
        webhook(p, i, SIM_EV_SUCCEEDED);
        book_charge(p, i);
    }
    fill_intent(p, i, &r);
    r.sent = 1;
    k->stored = 1;
    k->stored_at = p->now;
    k->object = i;
    k->outcome = r.outcome;
    transport_after(p, k, &r, lost);
    return r;
}

/* A step's request under its key replayed: the first execution's
 * outcome, the intent as it is now. 1 when replayed. */
static int step_replay(struct sim_provider *p, struct sim_pkey *k,
                       struct provider_result *r, int *lost)
{
    if (!k->stored || p->now >= k->stored_at + p->set->key_retention_ms)
        return 0;
    fill_intent(p, k->object, r);
    r->outcome = (enum provider_outcome)k->outcome;
    r->replayed = 1;
    r->sent = 1;
    transport_after(p, k, r, lost);
    return 1;
}

/* psp-sim's 400 payment_intent_unexpected_state: nothing executed; the
 * answer describes the intent as it is (capture_refusal_code and
 * void_refusal_code read its status). */
static void unexpected_state(struct sim_provider *p, int i, struct provider_result *r)
{
    fill_intent(p, i, r);
    r->outcome = PROVIDER_INVALID;
    r->http_status = 400;
    r->sent = 1;
    r->latency_ms = 5;
    snprintf(r->code, sizeof(r->code), "payment_intent_unexpected_state");
    snprintf(r->error, sizeof(r->error), "the intent is %s", r->intent_status);
}

/* An executed step: its answer stored under the key. */
static void step_executed(struct sim_provider *p, struct sim_pkey *k, int i,
                          struct provider_result *r, int *lost)
{
    fill_intent(p, i, r);
    r->outcome = PROVIDER_SUCCEEDED;
    r->sent = 1;
    k->stored = 1;
    k->stored_at = p->now;
    k->object = i;
    k->outcome = PROVIDER_SUCCEEDED;
    transport_after(p, k, r, lost);
}

struct provider_result sim_provider_capture(struct sim_provider *p, int key, int intent,
                                            long long amount, int *lost)
{
    struct provider_result r = {0};
    struct sim_pkey *k = key_of(p, key, SIM_STEP_CAPTURE);
    if (post_front(p, k, key, "capture", &r, lost) || step_replay(p, k, &r, lost))
        return r;
    if (intent < 0 || (size_t)intent >= p->nintents || !p->intents[intent].manual) {
        failed(&r, PROVIDER_INVALID, 400, "not a manual intent");
        return r;
    }
    struct sim_intent *in = &p->intents[intent];
    /* What psp-sim refuses (400), charged must never have asked: its hold
     * lets one step at a time at an authorization, and only from
     * AUTHORIZED. */
    if (in->state == SIM_INTENT_SUCCEEDED)
        sim_violate(p->viol, "one-capture-per-authorization",
                    "capture key %d asks intent pi_%d, captured already (%lld) under "
                    "capture key %d",
                    key, intent, in->captured, in->capture_key);
    else if (in->state == SIM_INTENT_CANCELED)
        sim_violate(p->viol, "capture-after-void",
                    "capture key %d asks intent pi_%d, canceled by void key %d", key,
                    intent, in->void_key);
    else if (in->state == SIM_INTENT_REQUIRES_CAPTURE && amount > in->amount)
        sim_violate(p->viol, "captured-within-authorized",
                    "capture key %d asks %lld of intent pi_%d, which holds %lld", key,
                    amount, intent, in->amount);
    if (in->state != SIM_INTENT_REQUIRES_CAPTURE || amount > in->amount) {
        unexpected_state(p, intent, &r);
        return r;
    }
    in->state = SIM_INTENT_SUCCEEDED;
    in->captured = amount > 0 ? amount : in->amount;
    in->capture_key = key;
    p->captures++;
    p->captured_total += in->captured;
    book_charge(p, intent);
    step_executed(p, k, intent, &r, lost);
    return r;
}

struct provider_result sim_provider_cancel(struct sim_provider *p, int key, int intent,
                                           int *lost)
{
    struct provider_result r = {0};
    struct sim_pkey *k = key_of(p, key, SIM_STEP_VOID);
    if (post_front(p, k, key, "void", &r, lost) || step_replay(p, k, &r, lost))
        return r;
    if (intent < 0 || (size_t)intent >= p->nintents ||
        p->intents[intent].state != SIM_INTENT_REQUIRES_CAPTURE) {
        if (intent >= 0 && (size_t)intent < p->nintents)
            unexpected_state(p, intent, &r);
        else
            failed(&r, PROVIDER_INVALID, 400, "no such intent");
        return r;
    }
    struct sim_intent *in = &p->intents[intent];
    in->state = SIM_INTENT_CANCELED;
    in->void_key = key;
    p->voids++;
    step_executed(p, k, intent, &r, lost);
    return r;
}

struct provider_result sim_provider_retrieve(struct sim_provider *p, int intent)
{
    struct provider_result r = {0};
    if (sim_rng_chance(p->rng, P_LOOKUP_FAIL)) {
        failed(&r, PROVIDER_UNKNOWN, 500, "api_error");
        return r;
    }
    if (intent < 0 || (size_t)intent >= p->nintents) {
        failed(&r, PROVIDER_NOT_FOUND, 404, "resource_missing");
        return r;
    }
    fill_intent(p, intent, &r);
    return r;
}

/* The attempt's intents created in [gte_ms, lt_ms) and seen by `visible`. */
static struct provider_result find(struct sim_provider *p, int attempt, int lagging,
                                   int64_t gte_ms, int64_t lt_ms)
{
    struct provider_result r = {0};
    int first = -1, n = 0;
    if (attempt >= 0 && (size_t)attempt < p->nattempts)
        for (int i = p->first_of_attempt[attempt]; i >= 0;
             i = p->intents[i].next_of_attempt) {
            const struct sim_intent *in = &p->intents[i];
            if (lagging && in->visible_at > p->now)
                continue;
            if (in->created < gte_ms || in->created >= lt_ms)
                continue;
            first = i; /* the list is newest first: the last found is oldest */
            n++;
        }
    if (n == 0) {
        r.outcome = PROVIDER_NOT_FOUND;
        r.http_status = 200;
        return r;
    }
    fill_intent(p, first, &r);
    r.matches = n;
    return r;
}

struct provider_result sim_provider_search(struct sim_provider *p, int attempt)
{
    struct provider_result r = {0};
    if (sim_rng_chance(p->rng, P_LOOKUP_FAIL)) {
        failed(&r, PROVIDER_UNKNOWN, 500, "api_error");
        return r;
    }
    return find(p, attempt, 1, INT64_MIN, INT64_MAX);
}

struct provider_result sim_provider_list(struct sim_provider *p, int attempt,
                                         long long gte, long long lt)
{
    struct provider_result r = {0};
    if (sim_rng_chance(p->rng, P_LOOKUP_FAIL)) {
        failed(&r, PROVIDER_UNKNOWN, 500, "api_error");
        return r;
    }
    return find(p, attempt, 0, gte * 1000, lt * 1000);
}

static void fill_refund(const struct sim_provider *p, int f, struct provider_result *r)
{
    const struct sim_prefund *rf = &p->refunds[f];
    r->outcome = PROVIDER_SUCCEEDED;
    r->http_status = 200;
    r->amount = rf->amount;
    snprintf(r->currency, sizeof(r->currency), "eur");
    snprintf(r->intent_attempt_id, sizeof(r->intent_attempt_id), "r%d", rf->refund);
    snprintf(r->provider_payment_id, sizeof(r->provider_payment_id), "re_%d", f);
    snprintf(r->intent_status, sizeof(r->intent_status), "succeeded");
    r->matches = 1;
}

struct provider_result sim_provider_refund(struct sim_provider *p, int key, int intent,
                                           int refund, long long amount, int *lost)
{
    struct provider_result r = {0};
    struct sim_pkey *k = key_of(p, key, SIM_STEP_REFUND);
    if (post_front(p, k, key, "refund", &r, lost))
        return r;
    if (k->stored && p->now < k->stored_at + p->set->key_retention_ms) {
        fill_refund(p, k->object, &r);
        r.replayed = 1;
        r.sent = 1;
        transport_after(p, k, &r, lost);
        return r;
    }
    if (intent < 0 || (size_t)intent >= p->nintents ||
        p->intents[intent].state != SIM_INTENT_SUCCEEDED) {
        failed(&r, PROVIDER_INVALID, 400, "charge not refundable");
        snprintf(r.code, sizeof(r.code), "charge_not_refundable");
        return r;
    }
    struct sim_intent *in = &p->intents[intent];
    if (in->manual && in->refunded + amount > in->captured) {
        /* An authorization's money is what its capture took (0016's
         * CHECK): charged's reservation keeps refunds within it. */
        sim_violate(p->viol, "refund-within-captured",
                    "refund %d of %lld asked on intent pi_%d that captured %lld of "
                    "%lld held, %lld already refunded",
                    refund, amount, intent, in->captured, in->amount, in->refunded);
        failed(&r, PROVIDER_INVALID, 400, "amount exceeds the capture");
        return r;
    }
    if (in->refunded + amount > in->amount) {
        /* The provider refuses it, but charged should never have asked:
         * its reservation keeps every refund sent within the charge. */
        sim_violate(p->viol, "refund-within-charge",
                    "refund %d of %lld asked on intent pi_%d of %lld, %lld already "
                    "refunded",
                    refund, amount, intent, in->amount, in->refunded);
        failed(&r, PROVIDER_INVALID, 400, "amount exceeds the charge");
        return r;
    }
    p->refunds = grow(p->refunds, &p->caprefunds, p->nrefunds + 1, sizeof(*p->refunds));
    int f = (int)p->nrefunds++;
    p->refunds[f] = (struct sim_prefund){key, intent, refund, amount, p->now};
    in->refunded += amount;
    p->refunded_total += amount;
    p->refund_executed =
        reach(p->refund_executed, &p->nrefund_executed, (size_t)refund, 1, 0);
    p->refund_executed[refund] = 1;
    webhook(p, f, SIM_EV_REFUND);
    fill_refund(p, f, &r);
    r.sent = 1;
    k->stored = 1;
    k->stored_at = p->now;
    k->object = f;
    k->outcome = PROVIDER_SUCCEEDED;
    transport_after(p, k, &r, lost);
    return r;
}

struct provider_result sim_provider_list_refunds(struct sim_provider *p, int intent,
                                                 int refund)
{
    struct provider_result r = {0};
    if (sim_rng_chance(p->rng, P_LOOKUP_FAIL)) {
        failed(&r, PROVIDER_UNKNOWN, 500, "api_error");
        return r;
    }
    /* Few refunds per run: a scan is cheap enough, and newest first. */
    for (size_t f = p->nrefunds; f-- > 0;)
        if (p->refunds[f].intent == intent && p->refunds[f].refund == refund) {
            fill_refund(p, (int)f, &r);
            return r;
        }
    r.outcome = PROVIDER_NOT_FOUND;
    r.http_status = 200;
    return r;
}

struct provider_result sim_provider_retrieve_refund(struct sim_provider *p, int prefund)
{
    struct provider_result r = {0};
    if (sim_rng_chance(p->rng, P_LOOKUP_FAIL)) {
        failed(&r, PROVIDER_UNKNOWN, 500, "api_error");
        return r;
    }
    if (prefund < 0 || (size_t)prefund >= p->nrefunds) {
        failed(&r, PROVIDER_NOT_FOUND, 404, "resource_missing");
        return r;
    }
    fill_refund(p, prefund, &r);
    return r;
}

int sim_provider_next_webhook(struct sim_provider *p, struct sim_webhook *out)
{
    if (p->nhooks == 0)
        return 0;
    /* A few tries at random: delivery order is the provider's, not ours. */
    for (int t = 0; t < 4; t++) {
        size_t k = (size_t)sim_rng_below(p->rng, p->nhooks);
        if (p->hooks[k].deliver_at > p->now)
            continue;
        *out = p->hooks[k];
        p->hooks[k] = p->hooks[--p->nhooks];
        return 1;
    }
    return 0;
}

uint64_t sim_provider_hash(const struct sim_provider *p, uint64_t h)
{
    h = sim_hash_mix(h, p->nintents);
    h = sim_hash_mix(h, p->nrefunds);
    h = sim_hash_mix(h, (uint64_t)p->charged_total);
    h = sim_hash_mix(h, (uint64_t)p->refunded_total);
    h = sim_hash_mix(h, (uint64_t)p->captured_total);
    h = sim_hash_mix(h, p->captures << 20 ^ p->voids);
    for (size_t i = 0; i < p->nintents; i++)
        h = sim_hash_mix(h, (uint64_t)p->intents[i].state * 31 +
                                (uint64_t)p->intents[i].key);
    return h;
}
