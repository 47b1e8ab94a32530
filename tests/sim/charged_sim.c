/* charged-sim: a deterministic, single-threaded simulation of charged's
 * decisions (issue 23). Simulated workers run the engine's own core
 * (worker/pipeline/engine_core.c: every job move, the key window, tries
 * and back-off, the commit check) and the operations' decisions
 * (worker/operations/payment_answer.c) over models of the store, the
 * provider and Kafka, as the engine's I/O files do; reconcilers and the
 * webhook path run the real pure modules (reconcile_policy, webhook_event,
 * offset_tracker, attempt_status) in the control flow of
 * worker/roles/reconciler.c and the api's webhook path, against a model of
 * the store (sim_store) and of the provider (sim_provider), on a simulated
 * clock, interleaved by one seeded scheduler with crashes, rebalances,
 * clock jumps, lost answers and late, duplicated, reordered webhooks. After
 * every step the invariants are checked (those the step could break,
 * counted from the provider's ledger); a violation prints the seed, the
 * step, the rule and the last steps, and exits 1. The same seed and steps
 * give the same final hash. Authorizations, captures and voids (issue 37)
 * go through the same stages, with the authorization's, the capture's and
 * the void's own looks (authorize_policy.c, capture_look.c, void_command.c)
 * and the hold of migrations 0016-0018 in the store's model. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attempt_status.h"
#include "authorize.h"
#include "charge_policy.h"
#include "payment_answer.h"
#include "sim_actors.h"

/* The names of enum act (sim_actors.h), for the trace. */
static const char *const act_names[A__COUNT] = {
    "idle",
    "gen charge",
    "gen redelivery",
    "gen second attempt",
    "gen same key",
    "gen bad",
    "gen refund",
    "gen capture/void",
    "fetch",
    "start",
    "dead letter",
    "record",
    "claim",
    "call",
    "key window closed",
    "answer",
    "persist",
    "renew",
    "commit",
    "crash",
    "rebalance",
    "clock jump",
    "rec claim",
    "rec call",
    "rec settle",
    "webhook",
};

void sim_note(struct world *w, int actor, enum act act, long long a, long long b)
{
    struct trace_entry *t = &w->trace[w->step % TRACE_N];
    *t = (struct trace_entry){w->step, w->now, actor, act, a, b};
    w->trace_hash = sim_hash_mix(
        w->trace_hash, (uint64_t)act << 48 ^ (uint64_t)(actor + 1) << 40 ^ (uint64_t)a);
    if (w->trace_all && act != A_IDLE)
        printf("step %llu t=%lld actor=%d %s %lld %lld\n", (unsigned long long)w->step,
               (long long)(w->now - START_MS), actor, act_names[act], a, b);
}

void *sim_grow(void *arr, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return arr;
    size_t ncap = *cap ? *cap * 2 : 64;
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

/* ---- invariants the models call into ---- */

/* An attempt whose key the provider charged is never FAILED. */
static void check_failed_charge(struct world *w, int attempt)
{
    struct sim_attempt *a = sim_store_attempt(w->store, attempt);
    if (!a || a->status != ATTEMPT_STATUS_FAILED)
        return;
    if ((size_t)a->key < w->prov->ncharge_keys && w->prov->charges_by_key[a->key] > 0)
        sim_violate(&w->viol, "failed-with-charge",
                    "attempt a%d is FAILED but the provider charged its key %d",
                    attempt, a->key);
}

/* charged's books never say more than the provider's: a SUCCEEDED attempt
 * was charged, a SUCCEEDED refund was executed. */
static void check_succeeded_money(struct world *w, int attempt)
{
    struct sim_attempt *a = sim_store_attempt(w->store, attempt);
    if (!a || a->status != ATTEMPT_STATUS_SUCCEEDED)
        return;
    if ((size_t)a->key >= w->prov->ncharge_keys || w->prov->charges_by_key[a->key] == 0)
        sim_violate(&w->viol, "succeeded-without-money",
                    "attempt a%d is SUCCEEDED but the provider never charged key %d",
                    attempt, a->key);
}

static void on_refund_status(void *ctx, int refund)
{
    struct world *w = ctx;
    struct sim_refund_row *r = sim_store_refund(w->store, refund);
    if (!r || r->status != ATTEMPT_STATUS_SUCCEEDED)
        return;
    struct sim_attempt *c = sim_store_attempt(w->store, r->charge);
    w->captured_refunds += c && c->manual;
    if ((size_t)refund >= w->prov->nrefund_executed ||
        !w->prov->refund_executed[refund])
        sim_violate(&w->viol, "succeeded-without-money",
                    "refund r%d is SUCCEEDED but the provider never executed it",
                    refund);
}

/* A capture or void charged's books call SUCCEEDED was executed by the
 * provider under its own key; the counts of the run. */
static void on_step_status(void *ctx, int step)
{
    struct world *w = ctx;
    struct sim_refund_row *r = sim_store_step(w->store, step);
    if (r->status == ATTEMPT_STATUS_REJECTED) {
        w->step_rejected++;
        w->hold_lost += !strcmp(r->reason, "authorization_held") ||
                        !strcmp(r->reason, "capture_after_void") ||
                        !strcmp(r->reason, "void_after_capture");
    }
    w->step_unknown += r->status == ATTEMPT_STATUS_UNKNOWN;
    if (r->status != ATTEMPT_STATUS_SUCCEEDED)
        return;
    int capture = r->kind == SIM_STEP_CAPTURE;
    w->captured += capture;
    w->voided += !capture;
    const struct sim_intent *in =
        r->intent >= 0 && (size_t)r->intent < w->prov->nintents
            ? &w->prov->intents[r->intent]
            : NULL;
    if (!in || (capture ? in->capture_key : in->void_key) != r->key)
        sim_violate(&w->viol, "succeeded-without-money",
                    "%s s%d is SUCCEEDED but the provider never executed it",
                    capture ? "capture" : "void", step);
}

static void on_charge(void *ctx, int attempt)
{
    check_failed_charge(ctx, attempt);
}

static void on_status(void *ctx, int attempt)
{
    struct world *w = ctx;
    struct sim_attempt *a = sim_store_attempt(w->store, attempt);
    w->authorized += a->status == ATTEMPT_STATUS_AUTHORIZED;
    check_failed_charge(ctx, attempt);
    check_succeeded_money(ctx, attempt);
}

/* ---- the command generator: the order service and its redeliveries ---- */

static void append(struct world *w, struct msg m)
{
    w->msgs = sim_grow(w->msgs, &w->capmsgs, w->nmsgs + 1, sizeof(*w->msgs));
    int idx = (int)w->nmsgs++;
    w->msgs[idx] = m;
    int attempt = is_attempt(m.kind) || m.kind == MSG_BAD ? m.id : m.charge;
    struct partition *p = &w->parts[(unsigned)attempt % NPARTS];
    p->msgs = sim_grow(p->msgs, &p->cap, p->n + 1, sizeof(int));
    p->msgs[p->n++] = idx;
}

/* A message of the last 64, of a kind. */
static const struct msg *recent(struct world *w, enum msg_kind kind)
{
    for (int t = 0; t < 4 && w->nmsgs > 0; t++) {
        size_t back = (size_t)sim_rng_below(&w->rng, w->nmsgs < 64 ? w->nmsgs : 64);
        const struct msg *m = &w->msgs[w->nmsgs - 1 - back];
        if (m->kind == kind)
            return m;
    }
    return NULL;
}

/* Refunds of a charge: in full, in part, and past the charge (alone, or
 * two that together pass it); of an authorization (a third of them): its
 * whole amount, past a capture of part, or a part. */
static void gen_refund(struct world *w)
{
    const struct msg *found = NULL;
    struct msg old;
    int of_hold = sim_rng_below(&w->rng, 3) == 0;
    if (!(found = recent(w, of_hold ? MSG_AUTHORIZE : MSG_CHARGE)))
        return;
    old = *found; /* append() may move w->msgs */
    unsigned how = (unsigned)sim_rng_below(&w->rng, 4);
    long long amt = how == 0 ? old.amount
                    : how == 1
                        ? 1 + (long long)sim_rng_below(&w->rng, (uint64_t)old.amount)
                    : how == 2 ? old.amount * 6 / 10
                               : old.amount + 1;
    int copies = how == 2 ? 2 : 1;
    for (int c = 0; c < copies; c++) {
        int id = w->next_refund++;
        append(w, (struct msg){MSG_REFUND, id, old.order, id, old.id, amt, 0});
        sim_note(w, -1, A_GEN_REFUND, id, old.id);
    }
}

/* The order service's steps on an authorization: captures of all or part
 * (and past it), two captures, a void, and a void racing a capture. */
static void gen_step(struct world *w)
{
    const struct msg *found = recent(w, MSG_AUTHORIZE);
    if (!found)
        return;
    struct msg old = *found;
    unsigned how = (unsigned)sim_rng_below(&w->rng, 10);
    long long part = 1 + (long long)sim_rng_below(&w->rng, (uint64_t)old.amount);
    /* 0-3 all, 4-5 part, 6 past the authorization, 7 all then part, 8 a
     * void, 9 a capture of all and a void at once. */
    long long amounts[2] = {how == 4 || how == 5 ? part
                            : how == 6           ? old.amount + 1
                                                 : 0,
                            part};
    int kinds[2] = {how == 8 ? MSG_VOID : MSG_CAPTURE,
                    how == 9 ? MSG_VOID : MSG_CAPTURE};
    int n = how >= 7 ? 2 : 1;
    if (how == 9 && sim_rng_below(&w->rng, 2)) {
        kinds[0] = MSG_VOID, kinds[1] = MSG_CAPTURE; /* either may come first */
        amounts[1] = amounts[0];
    }
    for (int k = 0; k < n; k++) {
        int id = w->next_step++;
        long long amt = kinds[k] == MSG_VOID ? 0 : amounts[k];
        append(w, (struct msg){kinds[k], id, old.order, id, old.id, amt, 0});
        sim_note(w, -1, A_GEN_STEP, id, old.id * 10 + kinds[k]);
    }
}

static void generate(struct world *w)
{
    unsigned r = (unsigned)sim_rng_below(&w->rng, 100);
    const struct msg *found;
    struct msg old_copy, *old = &old_copy; /* append() may move w->msgs */
    long long amount = 100 + (long long)sim_rng_below(&w->rng, 9900);
    if (r < 55) {
        /* One in five is an authorization: a charge, capture_method manual. */
        int id = w->next_attempt++;
        enum msg_kind kind = r < 44 ? MSG_CHARGE : MSG_AUTHORIZE;
        append(w, (struct msg){kind, id, w->next_order++, id, -1, amount, 0});
        sim_note(w, -1, A_GEN_CHARGE, id, kind);
    } else if (r < 70) {
        if (w->nmsgs == 0)
            return;
        struct msg m = w->msgs[w->nmsgs - 1 -
                               sim_rng_below(&w->rng, w->nmsgs < 64 ? w->nmsgs : 64)];
        m.dead_lettered = 0;
        append(w, m); /* the same command again: a redelivery, a resend */
        sim_note(w, -1, A_GEN_DUP, m.id, m.kind);
    } else if (r < 76) {
        if (!(found = recent(w, MSG_CHARGE)))
            return;
        old_copy = *found;
        int id = w->next_attempt++; /* another device pays the same order */
        append(w, (struct msg){MSG_CHARGE, id, old->order, id, -1, amount, 0});
        sim_note(w, -1, A_GEN_SECOND, id, old->order);
    } else if (r < 78) {
        if (!(found = recent(w, MSG_CHARGE)))
            return;
        old_copy = *found;
        int id = w->next_attempt++; /* a key reused by another attempt */
        append(w,
               (struct msg){MSG_CHARGE, id, w->next_order++, old->key, -1, amount, 0});
        sim_note(w, -1, A_GEN_SAMEKEY, id, old->key);
    } else if (r < 80) {
        append(w, (struct msg){MSG_BAD, -1, -1, -1, w->next_attempt, 0, 0});
        sim_note(w, -1, A_GEN_BAD, 0, 0);
    } else if (r < 92) {
        gen_refund(w);
    } else {
        gen_step(w);
    }
}

/* ---- the operations' decide (engine_op.decide) ----
 *
 * The void's is payment_answer_decide itself. The authorization's and the
 * capture's are static in authorize.c and capture_op.c, files with the
 * database's and Kafka's I/O that the simulation cannot link: their one
 * rule over payment_answer_decide is modelled here (authorization:
 * AUTHORIZED is its success, SUCCEEDED is for a person; capture: an
 * AUTHORIZED answer is for a person). */
static struct answer_decision sim_decide(int kind, const struct engine_policy *p,
                                         enum provider_outcome outcome, int may_replay,
                                         int tries, int key_window_open,
                                         unsigned jitter)
{
    if ((kind == MSG_AUTHORIZE && outcome == PROVIDER_SUCCEEDED) ||
        (kind == MSG_CAPTURE && outcome == PROVIDER_AUTHORIZED))
        outcome = PROVIDER_REQUIRES_REVIEW;
    struct answer_decision d = payment_answer_decide(kind, p, outcome, may_replay,
                                                     tries, key_window_open, jitter);
    if (kind == MSG_AUTHORIZE && outcome == PROVIDER_AUTHORIZED)
        d = (struct answer_decision){
            .next = ANSWER_NEXT_SETTLE,
            .status = may_replay ? ATTEMPT_STATUS_UNKNOWN : ATTEMPT_STATUS_AUTHORIZED,
            .next_check_ms = may_replay ? p->first_look_ms : -1,
            .reason_code = may_replay ? AUTHORIZE_REPLAYED_HOLD : NULL};
    return d;
}

/* engine_op.sets_aside as the operations set it (op_sets_aside): a
 * charge's, a refund's and an authorization's records may be set aside
 * for the reconciler; a capture's and a void's stay parked. */
static int sim_sets_aside(int kind)
{
    return kind == MSG_CHARGE || kind == MSG_REFUND || kind == MSG_AUTHORIZE;
}

/* ---- the scheduler ---- */

static void world_init(struct world *w, uint64_t seed, unsigned breaks, int trace_all)
{
    memset(w, 0, sizeof(*w));
    w->seed = seed;
    w->breaks = breaks;
    w->trace_all = trace_all;
    w->now = START_MS;
    sim_rng_seed(&w->rng, seed);
    w->set = (struct sim_settings){
        .key_retention_ms = 60000,
        .provider_timeout_ms = 2000,
        .lease_ms = 3000,
        .recheck_ms = 500,
        .search_lag_ms = 5000,
        .provider_search_lag_ms = 3000,
        .stale_ms = 5000,
        .max_age_ms = 600000,
        .commit_interval_ms = 200,
        .batch_hold_ms = 10,
    };
    w->core = (struct engine_core){
        .policy = {.unknown_retries = 2,
                   .retry_base_ms = 200,
                   .retry_max_ms = 5000,
                   .first_look_ms = 2000},
        .max_in_flight = MAX_IN_FLIGHT,
        .recheck_ms = w->set.recheck_ms,
        .key_retention_ms = w->set.key_retention_ms,
        .key_margin_ms = charge_policy_key_margin_ms(w->set.key_retention_ms,
                                                     w->set.provider_timeout_ms),
        .decide = sim_decide,
        .sets_aside = sim_sets_aside,
    };
    /* The worker's key-window rules dropped, through the core's limits. */
    if (breaks & SIM_BREAK_KEY_WINDOW)
        w->core.key_retention_ms = INT64_MAX / 4; /* never closes */
    if (breaks & SIM_BREAK_KEY_MARGIN)
        w->core.key_margin_ms = 0; /* sends until the retention itself */
    w->store = sim_store_new(breaks, &w->viol);
    w->prov = sim_provider_new(&w->set, &w->rng, &w->viol);
    if (!w->store || !w->prov)
        exit(2);
    w->store->on_status = on_status;
    w->store->on_refund_status = on_refund_status;
    w->store->on_step_status = on_step_status;
    w->store->ctx = w;
    w->prov->on_charge = on_charge;
    w->prov->ctx = w;
    for (int i = 0; i < NWORKERS; i++) {
        struct worker *wk = &w->workers[i];
        wk->id = i;
        wk->alive = 1;
        wk->jobs = job_list_new();
        wk->offsets = offset_tracker_new();
        wk->last_renew = wk->last_commit = w->now;
        batch_gate_init(&wk->record_gate, w->set.batch_hold_ms, SIM_BATCH_FULL);
        batch_gate_init(&wk->persist_gate, w->set.batch_hold_ms, SIM_BATCH_FULL);
    }
    for (int p = 0; p < NPARTS; p++)
        w->workers[p % NWORKERS].parts |= 1u << p;
    for (int i = 0; i < NRECONCILERS; i++)
        w->recs[i].id = RECONCILER_ID(i);
}

static void world_release(struct world *w)
{
    for (int i = 0; i < NWORKERS; i++) {
        sim_worker_reset(w, &w->workers[i]);
        job_list_free(w->workers[i].jobs);
        offset_tracker_free(w->workers[i].offsets);
    }
    for (int p = 0; p < NPARTS; p++)
        free(w->parts[p].msgs);
    free(w->msgs);
    free(w->seen_events);
    sim_store_free(w->store);
    sim_provider_free(w->prov);
}

static void step(struct world *w)
{
    w->now += (int64_t)sim_rng_below(&w->rng, 8);
    if (sim_rng_below(&w->rng, 20000) == 0) {
        int64_t jump = 1000 + (int64_t)sim_rng_below(&w->rng, 90000);
        w->now += jump; /* a paused VM, a stalled process: everyone's leases age */
        sim_note(w, -1, A_JUMP, jump, 0);
        w->jumps++;
    }
    w->store->now = w->prov->now = w->now;
    sim_provider_tick(w->prov);
    unsigned r = (unsigned)sim_rng_below(&w->rng, 1000);
    if (r < 60)
        generate(w);
    else if (r < 760)
        sim_worker_step(w, &w->workers[sim_rng_below(&w->rng, NWORKERS)]);
    else if (r < 880)
        sim_rec_step(w, &w->recs[sim_rng_below(&w->rng, NRECONCILERS)]);
    else if (r < 998) {
        if (sim_rng_below(&w->rng, 50) == 0)
            sim_foreign_webhook(w);
        else
            sim_webhook_step(w);
    } else if (sim_rng_below(&w->rng, 8) == 0)
        sim_crash(w, &w->workers[sim_rng_below(&w->rng, NWORKERS)]);
    else if (sim_rng_below(&w->rng, 4) == 0)
        sim_rebalance(w);
}

static uint64_t world_hash(const struct world *w)
{
    uint64_t h = 0xcbf29ce484222325ull;
    h = sim_hash_mix(h, w->seed);
    h = sim_hash_mix(h, (uint64_t)w->now);
    h = sim_hash_mix(h, w->trace_hash);
    h = sim_store_hash(w->store, h);
    h = sim_provider_hash(w->prov, h);
    for (int p = 0; p < NPARTS; p++)
        h = sim_hash_mix(h, (uint64_t)w->parts[p].committed);
    return h;
}

static void print_trace(const struct world *w)
{
    uint64_t from = w->step >= TRACE_N ? w->step - TRACE_N + 1 : 0;
    fprintf(stderr, "last steps:\n");
    for (uint64_t s = from; s <= w->step; s++) {
        const struct trace_entry *t = &w->trace[s % TRACE_N];
        if (t->step != s || (t->act == A_IDLE && s != w->step))
            continue;
        fprintf(stderr, "  step %llu t=+%lldms %s%d %s %lld %lld\n",
                (unsigned long long)t->step, (long long)(t->now - START_MS),
                t->actor >= 100 ? "reconciler "
                : t->actor >= 0 ? "worker "
                                : "world ",
                t->actor >= 100 ? t->actor - 100 : t->actor, act_names[t->act], t->a,
                t->b);
    }
}

/* An assertion of the real code failed (CHARGED_ASSERT aborts): the run
 * is named as a violation is, with its trace, before the process dies. */
static const struct world *aborting;

static void on_abort(int sig)
{
    (void)sig;
    if (aborting) {
        fprintf(stderr, "VIOLATION rule=assertion seed=%llu step=%llu\n",
                (unsigned long long)aborting->seed, (unsigned long long)aborting->step);
        print_trace(aborting);
    }
}

/* ---- the command line ---- */

static const struct {
    const char *name;
    unsigned bit;
    const char *what;
} break_rules[] = {
    {"epoch-fence", SIM_BREAK_EPOCH_FENCE, "persist/settle ignore the lease fence"},
    {"key-window", SIM_BREAK_KEY_WINDOW, "worker/reconciler skip the key-window check"},
    {"one-live-per-order", SIM_BREAK_ONE_LIVE_PER_ORDER,
     "the store drops the one-live-attempt-per-order index"},
    {"commit-after-durable", SIM_BREAK_COMMIT_AFTER_DURABLE,
     "the consumer commits offsets before persisting"},
    {"refund-reservation", SIM_BREAK_REFUND_RESERVATION,
     "refunds are not reserved against the charge"},
    {"key-margin", SIM_BREAK_KEY_MARGIN,
     "worker/reconciler send until the key's retention, with no margin"},
    {"list-skipped", SIM_BREAK_LIST_SKIPPED,
     "the reconciler's list is never asked: not found is never executed"},
    {"ownership", SIM_BREAK_OWNERSHIP,
     "a webhook's intent naming an attempt is taken as the attempt's own"},
    {"capture-hold", SIM_BREAK_CAPTURE_HOLD,
     "a capture takes an authorization captured or held by another capture"},
    {"void-hold", SIM_BREAK_VOID_HOLD,
     "a capture takes an authorization voided or held by a void"},
    {"capture-amount", SIM_BREAK_CAPTURE_AMOUNT,
     "a capture of more than the authorization is claimed and sent"},
    {"park", SIM_BREAK_PARK, "a throttled or key-in-use job retries in its slot"},
    {"unpark", SIM_BREAK_UNPARK, "a parked job never comes back to its call"},
    {"budget", SIM_BREAK_BUDGET,
     "calls sent without asking the budget (with --budget)"},
    {"refund-captured", SIM_BREAK_REFUND_CAPTURED,
     "an authorization's refunds are bound by its amount, not its capture"},
};
#define NBREAKS ((int)(sizeof(break_rules) / sizeof(break_rules[0])))

static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged-sim --seed N --steps N [--seeds K] [--budget R] [--break "
            "RULE]\n"
            "                   [--trace]\n"
            "\n"
            "  option         meaning                                        default\n"
            "  --seed N       the first seed (one seed names one run exactly) 1\n"
            "  --steps N      steps per seed                                  1000000\n"
            "  --seeds K      run K seeds: N, N+1, ... N+K-1                  1\n"
            "  --budget R     each worker's share of the provider budget, 1..64 "
            "requests/s;\n"
            "                 its calls ask the gate first                    none\n"
            "  --break RULE   drop one of charged's rules (test-only models)  none\n"
            "  --trace        print every step                                off\n"
            "  --help         this table\n"
            "\n"
            "  rule (--break)         what is dropped\n");
    for (int i = 0; i < NBREAKS; i++)
        fprintf(out, "  %-22s %s\n", break_rules[i].name, break_rules[i].what);
    fprintf(out,
            "\n"
            "Exit 0: no invariant broken; 1: a violation (seed, step, rule and the\n"
            "last steps on stderr); 2: bad usage. The last line of each seed is its\n"
            "final state hash: the same seed and steps print the same hash.\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !*s)
        return -1;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    uint64_t seed = 1, steps = 1000000, seeds = 1, budget = 0;
    unsigned breaks = 0;
    const char *broken = NULL;
    int trace_all = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--trace")) {
            trace_all = 1;
        } else if (!strcmp(a, "--seed") && parse_u64(v, &seed) == 0) {
            i++;
        } else if (!strcmp(a, "--steps") && parse_u64(v, &steps) == 0) {
            i++;
        } else if (!strcmp(a, "--seeds") && parse_u64(v, &seeds) == 0 && seeds > 0) {
            i++;
        } else if (!strcmp(a, "--budget") && parse_u64(v, &budget) == 0 && budget > 0 &&
                   budget <= SIM_BUDGET_MAX) {
            i++;
        } else if (!strcmp(a, "--break") && v) {
            int k;
            for (k = 0; k < NBREAKS && strcmp(v, break_rules[k].name); k++)
                ;
            if (k == NBREAKS) {
                fprintf(stderr, "charged-sim: unknown rule '%s' (see --help)\n", v);
                return 2;
            }
            breaks |= break_rules[k].bit;
            broken = v;
            i++;
        } else {
            fprintf(stderr, "charged-sim: bad argument '%s' (see --help)\n", a);
            return 2;
        }
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    uint64_t total = 0;
    static struct world w;
    aborting = &w;
    signal(SIGABRT, on_abort);
    for (uint64_t s = seed; s < seed + seeds; s++) {
        world_init(&w, s, breaks, trace_all);
        w.budget_rps = (long long)budget;
        for (w.step = 0; w.step < steps; w.step++) {
            sim_note(&w, -1, A_IDLE, 0, 0);
            step(&w);
            if (w.viol.rule) {
                fprintf(stderr, "VIOLATION rule=%s seed=%llu step=%llu%s%s\n  %s\n",
                        w.viol.rule, (unsigned long long)s, (unsigned long long)w.step,
                        broken ? " break=" : "", broken ? broken : "", w.viol.detail);
                fflush(stdout);
                print_trace(&w);
                printf("seed %llu steps %llu violation %s hash %016llx\n",
                       (unsigned long long)s, (unsigned long long)(w.step + 1),
                       w.viol.rule, (unsigned long long)world_hash(&w));
                world_release(&w);
                return 1;
            }
        }
        total += steps;
        printf(
            "seed %llu steps %llu attempts %d refunds %d calls %llu lost %llu "
            "persisted %llu fenced %llu takeovers %llu key_closed %llu "
            "in_use %llu rec_settled %llu rec_charges %llu never_executed %llu "
            "webhooks %llu "
            "applied %llu foreign %llu jumps %llu crashes %llu rebalances %llu "
            "authorized %llu captured %llu voided %llu step_rejected %llu "
            "hold_lost %llu step_unknown %llu captured_refunds %llu "
            "throttled %llu parked %llu set_aside %llu budget_parked %llu charged %lld "
            "refunded %lld hash %016llx\n",
            (unsigned long long)s, (unsigned long long)steps, w.next_attempt,
            w.next_refund, (unsigned long long)w.charges_sent,
            (unsigned long long)w.lost, (unsigned long long)w.settled,
            (unsigned long long)w.fenced, (unsigned long long)w.takeovers,
            (unsigned long long)w.key_closed, (unsigned long long)w.prov->in_use,
            (unsigned long long)w.rec_settled, (unsigned long long)w.rec_charges,
            (unsigned long long)w.rec_never_executed, (unsigned long long)w.webhooks,
            (unsigned long long)w.webhook_applied, (unsigned long long)w.foreign,
            (unsigned long long)w.jumps, (unsigned long long)w.crashes,
            (unsigned long long)w.rebalances, (unsigned long long)w.authorized,
            (unsigned long long)w.captured, (unsigned long long)w.voided,
            (unsigned long long)w.step_rejected, (unsigned long long)w.hold_lost,
            (unsigned long long)w.step_unknown, (unsigned long long)w.captured_refunds,
            (unsigned long long)w.prov->throttled, (unsigned long long)w.parked,
            (unsigned long long)w.set_aside, (unsigned long long)w.budget_parked,
            w.prov->charged_total, w.prov->refunded_total,
            (unsigned long long)world_hash(&w));
        world_release(&w);
    }
    fflush(stdout);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs =
        (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    fprintf(stderr, "charged-sim: %llu steps in %.2f s (%.0f steps/s); no violation\n",
            (unsigned long long)total, secs, secs > 0 ? (double)total / secs : 0.0);
    return 0;
}
