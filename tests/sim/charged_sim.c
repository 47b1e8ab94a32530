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
 * go through the same stages, with the capture's and the void's own looks
 * (capture_look.c, void_command.c) and the hold of migration 0016 in the
 * store's model. */
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attempt_status.h"
#include "capture.h"
#include "charge_policy.h"
#include "engine_core.h"
#include "job.h"
#include "offset_tracker.h"
#include "payment_answer.h"
#include "reconcile_look.h"
#include "reconcile_policy.h"
#include "sim_provider.h"
#include "sim_rng.h"
#include "sim_store.h"
#include "sim_world.h"
#include "void_command.h"
#include "webhook_event.h"

#define NPARTS           4
#define NWORKERS         3
#define NRECONCILERS     2
#define MAX_JOBS         64 /* a worker's backlog cap (WORKER_MAX_IN_FLIGHT-ish) */
#define TRACE_N          32
#define RECONCILER_ID(i) (100 + (i))
#define START_MS         1700000000000LL

/* ---- the trace: the last steps, formatted only when printed ---- */

enum act {
    A_IDLE,
    A_GEN_CHARGE,
    A_GEN_DUP,
    A_GEN_SECOND,
    A_GEN_SAMEKEY,
    A_GEN_BAD,
    A_GEN_REFUND,
    A_GEN_STEP,
    A_FETCH,
    A_START,
    A_DEAD_LETTER,
    A_RECORD,
    A_CLAIM,
    A_CALL,
    A_KEY_CLOSED,
    A_ANSWER,
    A_PERSIST,
    A_RENEW,
    A_COMMIT,
    A_CRASH,
    A_REBALANCE,
    A_JUMP,
    A_REC_CLAIM,
    A_REC_CALL,
    A_REC_SETTLE,
    A_WEBHOOK,
    A__COUNT
};
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

struct trace_entry {
    uint64_t step;
    int64_t now;
    int actor; /* worker i, RECONCILER_ID(i), -1 the world */
    enum act act;
    long long a, b;
};

/* ---- the world ---- */

/* An authorization is a charge with capture_method manual; a capture or
 * a void names it (charge). */
enum msg_kind { MSG_CHARGE, MSG_REFUND, MSG_BAD, MSG_AUTHORIZE, MSG_CAPTURE, MSG_VOID };

static int is_attempt(int kind)
{
    return kind == MSG_CHARGE || kind == MSG_AUTHORIZE;
}

/* A capture's or a void's step kind (sim_world.h), else 0. */
static int step_kind(int kind)
{
    return kind == MSG_CAPTURE ? SIM_STEP_CAPTURE
           : kind == MSG_VOID  ? SIM_STEP_VOID
                               : 0;
}

struct msg {
    enum msg_kind kind;
    int id; /* attempt id, or refund id */
    int order, key, charge;
    long long amount;
    int dead_lettered;
};

struct partition {
    int *msgs; /* indices into world.msgs */
    size_t n, cap;
    int64_t committed; /* the group's committed position */
};

struct sim_job {
    struct job j; /* first: a struct job * is a struct sim_job * */
    int msg;
    int target;    /* attempt id or refund id */
    char name[16]; /* the record's id, "a12" or "r12": the job's id */
    int intent;    /* refunds: the charge's intent, from the claim */
    int64_t answer_at;
    struct provider_result answer; /* CALLING: what will arrive */
};

struct worker {
    int id, alive;
    job_list_t *jobs;
    offset_tracker_t *offsets;
    unsigned parts; /* assigned partitions, a bit each */
    int64_t pos[NPARTS];
    int64_t last_renew, last_commit;
};

struct look {
    int active, refund, id;
    int step;        /* a capture's or void's look: its SIM_STEP_*; 0 none */
    int manual;      /* an authorization's look */
    long long asked; /* a capture's amount (0: all) */
    int64_t epoch, claimed_at, busy_until;
    enum attempt_status status;
    int intent, prefund;
    int64_t key_age_ms, first_sent_ms, age_ms;
    char name[40], object[48], intent_name[48]; /* the strings core's look reads */
    struct reconcile_look core;
};

struct reconciler {
    int id;
    int64_t next_poll, renewed_at;
    struct look l;
};

struct world {
    uint64_t seed, step;
    unsigned breaks;
    int trace_all;
    int64_t now;
    struct sim_rng rng;
    struct sim_settings set;
    struct engine_core core; /* the workers' limits, for the engine's core */
    struct sim_violation viol;
    struct sim_store *store;
    struct sim_provider *prov;
    struct msg *msgs;
    size_t nmsgs, capmsgs;
    struct partition parts[NPARTS];
    struct worker workers[NWORKERS];
    struct reconciler recs[NRECONCILERS];
    int next_attempt, next_order, next_refund, next_step;
    unsigned char *seen_events;
    size_t nseen;
    struct trace_entry trace[TRACE_N];
    uint64_t trace_hash;
    uint64_t settled, charges_sent, webhooks;
    /* How often the paths that matter ran (printed per seed). */
    uint64_t jumps, crashes, rebalances, key_closed, fenced, takeovers, rec_settled,
        rec_charges, rec_never_executed, webhook_applied, lost, foreign;
    /* Authorizations and their steps (issue 37). */
    uint64_t authorized, captured, voided, step_rejected, hold_lost, step_unknown,
        captured_refunds;
};

static void note(struct world *w, int actor, enum act act, long long a, long long b)
{
    struct trace_entry *t = &w->trace[w->step % TRACE_N];
    *t = (struct trace_entry){w->step, w->now, actor, act, a, b};
    w->trace_hash = sim_hash_mix(
        w->trace_hash, (uint64_t)act << 48 ^ (uint64_t)(actor + 1) << 40 ^ (uint64_t)a);
    if (w->trace_all && act != A_IDLE)
        printf("step %llu t=%lld actor=%d %s %lld %lld\n", (unsigned long long)w->step,
               (long long)(w->now - START_MS), actor, act_names[act], a, b);
}

static void *grow(void *arr, size_t *cap, size_t need, size_t elem)
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

/* A message's outcome is durable when its row no longer needs the message:
 * recorded and not PENDING, and not a worker's claim in progress. */
static int msg_durable(struct world *w, const struct msg *m)
{
    if (m->kind == MSG_BAD || m->dead_lettered)
        return m->dead_lettered;
    enum attempt_status s;
    int owner;
    int64_t next_check;
    if (is_attempt(m->kind)) {
        struct sim_attempt *a = sim_store_attempt(w->store, m->id);
        if (!a)
            return 0;
        if (a->key != m->key || a->order != m->order || a->amount != m->amount ||
            a->manual != (m->kind == MSG_AUTHORIZE))
            return m->dead_lettered;
        s = a->status, owner = a->lease_owner, next_check = a->next_check_at;
    } else {
        struct sim_refund_row *r = m->kind == MSG_REFUND
                                       ? sim_store_refund(w->store, m->id)
                                       : sim_store_step(w->store, m->id);
        if (!r)
            return 0;
        s = r->status, owner = r->lease_owner, next_check = r->next_check_at;
    }
    if (s == ATTEMPT_STATUS_PENDING)
        return 0;
    return !(s == ATTEMPT_STATUS_PROCESSING && next_check == SIM_NULL &&
             owner != SIM_NO_OWNER);
}

/* ---- the command generator: the order service and its redeliveries ---- */

static void append(struct world *w, struct msg m)
{
    w->msgs = grow(w->msgs, &w->capmsgs, w->nmsgs + 1, sizeof(*w->msgs));
    int idx = (int)w->nmsgs++;
    w->msgs[idx] = m;
    int attempt = is_attempt(m.kind) || m.kind == MSG_BAD ? m.id : m.charge;
    struct partition *p = &w->parts[(unsigned)attempt % NPARTS];
    p->msgs = grow(p->msgs, &p->cap, p->n + 1, sizeof(int));
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
        note(w, -1, A_GEN_REFUND, id, old.id);
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
        note(w, -1, A_GEN_STEP, id, old.id * 10 + kinds[k]);
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
        note(w, -1, A_GEN_CHARGE, id, kind);
    } else if (r < 70) {
        if (w->nmsgs == 0)
            return;
        struct msg m = w->msgs[w->nmsgs - 1 -
                               sim_rng_below(&w->rng, w->nmsgs < 64 ? w->nmsgs : 64)];
        m.dead_lettered = 0;
        append(w, m); /* the same command again: a redelivery, a resend */
        note(w, -1, A_GEN_DUP, m.id, m.kind);
    } else if (r < 76) {
        if (!(found = recent(w, MSG_CHARGE)))
            return;
        old_copy = *found;
        int id = w->next_attempt++; /* another device pays the same order */
        append(w, (struct msg){MSG_CHARGE, id, old->order, id, -1, amount, 0});
        note(w, -1, A_GEN_SECOND, id, old->order);
    } else if (r < 78) {
        if (!(found = recent(w, MSG_CHARGE)))
            return;
        old_copy = *found;
        int id = w->next_attempt++; /* a key reused by another attempt */
        append(w,
               (struct msg){MSG_CHARGE, id, w->next_order++, old->key, -1, amount, 0});
        note(w, -1, A_GEN_SAMEKEY, id, old->key);
    } else if (r < 80) {
        append(w, (struct msg){MSG_BAD, -1, -1, -1, w->next_attempt, 0, 0});
        note(w, -1, A_GEN_BAD, 0, 0);
    } else if (r < 92) {
        gen_refund(w);
    } else {
        gen_step(w);
    }
}

/* ---- a worker: worker/pipeline/engine.c's stages, one job at a time ----
 *
 * Each stage is the engine's I/O side over the models: it picks a job, asks
 * the model of the store, the provider or Kafka, and hands the answer to
 * the engine's own core (engine_core.c), which moves the job and says what
 * to do next; the decision on a provider's answer and what its outcome
 * says are the operations' own (payment_answer.c). Nothing here decides. */

static struct sim_job *sj(struct job *j)
{
    return (struct sim_job *)j;
}

static const struct msg *job_msg(struct world *w, struct job *j)
{
    return &w->msgs[sj(j)->msg];
}

static int fetch(struct world *w, struct worker *wk)
{
    if (job_list_holding(wk->jobs) >= MAX_JOBS)
        return 0;
    int p = (int)sim_rng_below(&w->rng, NPARTS);
    for (int k = 0; k < NPARTS; k++, p = (p + 1) % NPARTS) {
        if (!(wk->parts & (1u << p)) || wk->pos[p] >= (int64_t)w->parts[p].n)
            continue;
        struct sim_job *s = calloc(1, sizeof(*s));
        if (!s)
            exit(2);
        s->msg = w->parts[p].msgs[wk->pos[p]];
        s->target = w->msgs[s->msg].id;
        s->j.partition = p;
        s->j.offset = wk->pos[p]++;
        s->j.kind = (int)w->msgs[s->msg].kind;
        job_list_add(wk->jobs, &s->j);
        offset_tracker_begin(wk->offsets, p, s->j.offset);
        if (w->breaks & SIM_BREAK_COMMIT_AFTER_DURABLE)
            offset_tracker_done(wk->offsets, p, s->j.offset); /* the broken consumer */
        note(w, wk->id, A_FETCH, p, s->j.offset);
        return 1;
    }
    return 0;
}

/* The command "parsed": a charge or a refund names its record; a bad
 * message is a schema violation. */
static int start_one(struct world *w, struct worker *wk)
{
    struct job *j = job_list_first(wk->jobs, JOB_BACKLOG);
    if (!j || (long long)engine_core_started(wk->jobs) >= w->core.max_in_flight)
        return 0;
    const struct msg *m = job_msg(w, j);
    if (m->kind == MSG_BAD) {
        j->dl_reason = DEAD_LETTER_SCHEMA_VIOLATION;
    } else {
        snprintf(sj(j)->name, sizeof(sj(j)->name), "%c%d",
                 is_attempt(m->kind)      ? 'a'
                 : m->kind == MSG_REFUND  ? 'r'
                 : m->kind == MSG_CAPTURE ? 'c'
                                          : 'v',
                 m->id);
        j->have_cmd = 1;
        j->id = sj(j)->name;
    }
    engine_core_parsed(wk->jobs, j, m->kind != MSG_BAD);
    note(w, wk->id, A_START, j->partition, j->offset);
    return 1;
}

/* Kafka's model: a dead letter is produced at once, and acknowledged at
 * the stage's next turn. */
static int dead_letter(struct world *w, struct worker *wk)
{
    struct job *j = job_list_first(wk->jobs, JOB_DEAD_LETTER_SENT);
    if (j) {
        w->msgs[sj(j)->msg].dead_lettered = 1;
        engine_core_dead_letter_acked(wk->jobs, j, 0, 0, w->now);
        note(w, wk->id, A_DEAD_LETTER, j->partition, j->offset);
        return 1;
    }
    if (!(j = job_list_first(wk->jobs, JOB_DEAD_LETTER)))
        return 0;
    j->next_at = 0; /* the model never fails to produce: no back-off to wait */
    if (engine_core_dead_letter_gate(wk->jobs, j, w->now) == ENGINE_NEXT_SEND)
        engine_core_dead_letter_produced(wk->jobs, j, 0, 0, w->now);
    return 1;
}

static int record(struct world *w, struct worker *wk)
{
    static const enum engine_record_result results[] = {
        [SIM_RECORDED_CLAIMED] = ENGINE_RECORDED_CLAIMED,
        [SIM_RECORDED] = ENGINE_RECORDED,
        [SIM_RECORD_CONFLICT] = ENGINE_CONFLICT,
        [SIM_RECORD_REJECTED] = ENGINE_REJECTED,
    };
    struct job *j = job_list_first(wk->jobs, JOB_RECORD);
    if (!j)
        return 0;
    const struct msg *m = job_msg(w, j);
    int64_t epoch = 0;
    enum sim_record rc =
        is_attempt(m->kind) ? sim_store_record(w->store, m->id, m->order, m->key,
                                               m->amount, m->kind == MSG_AUTHORIZE,
                                               wk->id, w->set.lease_ms, &epoch)
        : m->kind == MSG_REFUND
            ? sim_store_refund_record(w->store, m->id, m->charge, m->key, m->amount)
            : sim_store_step_record(w->store, m->id, step_kind(m->kind), m->charge,
                                    m->key, m->amount);
    note(w, wk->id, A_RECORD, m->id, rc);
    engine_core_recorded(wk->jobs, j, results[rc], epoch, w->now);
    return 1;
}

static int claim(struct world *w, struct worker *wk)
{
    static const enum engine_claim_result results[] = {
        [SIM_CLAIMED] = ENGINE_CLAIMED,
        [SIM_SETTLED] = ENGINE_SETTLED,
        [SIM_BUSY] = ENGINE_BUSY,
    };
    struct job *j = job_list_first(wk->jobs, JOB_CLAIM);
    if (!j)
        for (j = job_list_first(wk->jobs, JOB_WAIT); j && j->next_at > w->now;
             j = job_next_in_state(j))
            ;
    if (!j)
        return 0;
    if (engine_core_claim_gate(&w->core, wk->jobs, j, w->now) != ENGINE_NEXT_SEND)
        return 1; /* done (detached), or another job of ours holds its record */
    int64_t epoch = 0, key_age = 0;
    enum sim_claim rc =
        is_attempt(j->kind) ? sim_store_claim(w->store, sj(j)->target, wk->id,
                                              w->set.lease_ms, &epoch, &key_age)
        : j->kind == MSG_REFUND
            ? sim_store_refund_claim(w->store, sj(j)->target, wk->id, w->set.lease_ms,
                                     &epoch, &key_age, &sj(j)->intent)
            : sim_store_step_claim(w->store, sj(j)->target, wk->id, w->set.lease_ms,
                                   &epoch, &key_age, &sj(j)->intent);
    note(w, wk->id, A_CLAIM, sj(j)->target, rc);
    w->takeovers += rc == SIM_CLAIMED && epoch > 1;
    engine_core_claim_answered(&w->core, wk->jobs, j, results[rc], epoch, key_age, 0,
                               w->now);
    return 1;
}

static void job_release(struct world *w, struct worker *wk, struct job *j)
{
    if (is_attempt(j->kind))
        sim_store_release(w->store, sj(j)->target, wk->id, j->lease_epoch, 0);
    else if (j->kind == MSG_REFUND)
        sim_store_refund_release(w->store, sj(j)->target, wk->id, j->lease_epoch, 0);
    else
        sim_store_step_release(w->store, sj(j)->target, wk->id, j->lease_epoch, 0);
}

/* The provider's model: the claimed record's parameters, never the
 * message's; the answer arrives after its latency, or is lost. */
static void send_call(struct world *w, struct job *j)
{
    const struct msg *m = job_msg(w, j);
    int lost = 0;
    if (is_attempt(j->kind)) {
        struct sim_attempt *a = sim_store_attempt(w->store, m->id);
        sj(j)->answer = sim_provider_charge(w->prov, a->key, a->id, a->order, a->amount,
                                            a->manual, &lost);
    } else if (j->kind == MSG_CAPTURE || j->kind == MSG_VOID) {
        struct sim_refund_row *r = sim_store_step(w->store, m->id);
        sj(j)->answer =
            j->kind == MSG_CAPTURE
                ? sim_provider_capture(w->prov, r->key, sj(j)->intent, r->amount, &lost)
                : sim_provider_cancel(w->prov, r->key, sj(j)->intent, &lost);
    } else {
        struct sim_refund_row *r = sim_store_refund(w->store, m->id);
        sj(j)->answer = sim_provider_refund(w->prov, r->key, sj(j)->intent, r->id,
                                            r->amount, &lost);
    }
    w->charges_sent++;
    w->lost += lost;
    sj(j)->answer_at =
        w->now + (lost ? w->set.provider_timeout_ms : sj(j)->answer.latency_ms);
}

static int call(struct world *w, struct worker *wk)
{
    struct job *j;
    for (j = job_list_first(wk->jobs, JOB_CALL); j && j->next_at > w->now;
         j = job_next_in_state(j))
        ;
    if (!j)
        return 0;
    switch (engine_core_call_gate(&w->core, wk->jobs, j, w->now)) {
    case ENGINE_NEXT_RELEASE:
        job_release(w, wk, j);
        break;
    case ENGINE_NEXT_KEY_CLOSED:
        note(w, wk->id, A_KEY_CLOSED, sj(j)->target, j->kind);
        w->key_closed++;
        break;
    default:
        send_call(w, j);
        engine_core_call_started(wk->jobs, j);
        note(w, wk->id, A_CALL, job_msg(w, j)->id, j->kind);
        break;
    }
    return 1;
}

static struct job *answered(struct world *w, struct worker *wk, enum job_state s)
{
    for (struct job *j = job_list_first(wk->jobs, s); j; j = job_next_in_state(j))
        if (sj(j)->answer_at <= w->now)
            return j;
    return NULL;
}

static int collect(struct world *w, struct worker *wk)
{
    struct job *j = answered(w, wk, JOB_CALLING);
    if (!j)
        j = answered(w, wk, JOB_CALLING_FENCED);
    if (!j)
        return 0;
    j->res = sj(j)->answer;
    note(w, wk->id, A_ANSWER, sj(j)->target, j->res.outcome);
    /* No breaker in the model: no answer is a failure that opened it. */
    if (engine_core_answered(&w->core, wk->jobs, j, 0, 0, NULL, w->now) ==
        ENGINE_NEXT_RELEASE)
        job_release(w, wk, j);
    return 1;
}

/* "pi_12" -> 12; "" -> SIM_NULL. */
static int id_of(const char *s)
{
    const char *u = strchr(s, '_');
    return u ? atoi(u + 1) : SIM_NULL;
}

static int persist(struct world *w, struct worker *wk)
{
    struct job *j;
    char reason[512];
    const char *provider_id = "";
    for (j = job_list_first(wk->jobs, JOB_PERSIST); j && j->next_at > w->now;
         j = job_next_in_state(j))
        ;
    if (!j)
        return 0;
    const struct answer_decision *d = &j->decision;
    /* What the outcome says (its reason and evidence) is the operation's. */
    free(payment_answer_outcome(j->kind, &j->res, d, j->calls, reason, sizeof(reason),
                                &provider_id));
    int obj = provider_id[0] ? id_of(provider_id) : SIM_NULL;
    int ok =
        is_attempt(j->kind)
            ? sim_store_persist(w->store, sj(j)->target, wk->id, j->lease_epoch,
                                d->status, obj, d->next_check_ms)
        : j->kind == MSG_REFUND
            ? sim_store_refund_persist(w->store, sj(j)->target, wk->id, j->lease_epoch,
                                       d->status, obj, d->next_check_ms)
            /* capture_store_persist books what the answer says it received */
            : sim_store_step_persist(
                  w->store, sj(j)->target, wk->id, j->lease_epoch, d->status,
                  j->kind == MSG_CAPTURE ? j->res.amount_received : 0,
                  d->next_check_ms);
    note(w, wk->id, A_PERSIST, sj(j)->target, ok ? (long long)d->status : -1);
    int first_busy;
    if (engine_core_persisted(&w->core, wk->jobs, j, j->lease_epoch, ok, 0, &first_busy,
                              w->now) == ENGINE_NEXT_FENCED)
        w->fenced++;
    else
        w->settled++;
    return 1;
}

static int renew(struct world *w, struct worker *wk)
{
    static const enum job_state leased[] = {JOB_CALL, JOB_CALLING, JOB_PERSIST};
    if (w->now - wk->last_renew < w->set.lease_ms / 3)
        return 0;
    wk->last_renew = w->now;
    for (size_t s = 0; s < sizeof(leased) / sizeof(leased[0]); s++)
        for (struct job *j = job_list_first(wk->jobs, leased[s]), *next; j; j = next) {
            next = job_next_in_state(j);
            int ours = is_attempt(j->kind)
                           ? sim_store_renew(w->store, sj(j)->target, wk->id,
                                             j->lease_epoch, w->set.lease_ms)
                       : j->kind == MSG_REFUND
                           ? sim_store_refund_renew(w->store, sj(j)->target, wk->id,
                                                    j->lease_epoch, w->set.lease_ms)
                           : sim_store_step_renew(w->store, sj(j)->target, wk->id,
                                                  j->lease_epoch, w->set.lease_ms);
            if (!ours)
                engine_core_lease_lost(&w->core, wk->jobs, j, w->now);
        }
    note(w, wk->id, A_RENEW, 0, 0);
    return 1;
}

/* Commits what offset_tracker allows; the invariant: every message below
 * the new position has a durable outcome, by the store's model and by the
 * engine's own check (engine_core_commit_ok). */
static void commit(struct world *w, struct worker *wk, int only)
{
    for (int p = 0; p < NPARTS; p++) {
        if (!(wk->parts & (1u << p)) || (only >= 0 && p != only))
            continue;
        int64_t pos = offset_tracker_committable(wk->offsets, p);
        struct partition *part = &w->parts[p];
        if (pos <= part->committed)
            continue;
        for (int64_t o = part->committed; o < pos; o++)
            if (!msg_durable(w, &w->msgs[part->msgs[o]]))
                sim_violate(&w->viol, "commit-after-durable",
                            "worker %d committed partition %d to %lld, but offset %lld "
                            "(message %d) has no durable outcome",
                            wk->id, p, (long long)pos, (long long)o, part->msgs[o]);
        if (!engine_core_commit_ok(wk->jobs, p, pos))
            sim_violate(
                &w->viol, "commit-after-durable",
                "worker %d committed partition %d to %lld over a job that still "
                "holds its offset",
                wk->id, p, (long long)pos);
        part->committed = pos;
        offset_tracker_mark_committed(wk->offsets, p, pos);
        note(w, wk->id, A_COMMIT, p, pos);
    }
}

static int reap_commit(struct world *w, struct worker *wk)
{
    int n = 0;
    for (struct job *j = job_list_first(wk->jobs, JOB_DONE), *next; j; j = next) {
        next = job_next_in_state(j);
        engine_core_reap(wk->jobs, wk->offsets, j);
        free(sj(j));
        n++;
    }
    if (w->now - wk->last_commit >= w->set.commit_interval_ms) {
        wk->last_commit = w->now;
        commit(w, wk, -1);
        n++;
    }
    return n;
}

static void worker_step(struct world *w, struct worker *wk)
{
    /* One stage, at random: the stages of a turn interleave with the other
     * actors at the finest grain the engine's own order allows. */
    int (*const stages[])(struct world *, struct worker *) = {
        fetch, start_one, dead_letter, record, claim,
        call,  collect,   persist,     renew,  reap_commit};
    int n = (int)(sizeof(stages) / sizeof(stages[0]));
    int s = (int)sim_rng_below(&w->rng, (uint64_t)n);
    for (int k = 0; k < n; k++)
        if (stages[(s + k) % n](w, wk))
            return;
}

static void worker_reset(struct world *w, struct worker *wk)
{
    for (struct job *j = job_list_oldest(wk->jobs), *next; j; j = next) {
        next = job_younger(j);
        job_list_remove(wk->jobs, j);
        free(sj(j));
    }
    offset_tracker_free(wk->offsets);
    wk->offsets = offset_tracker_new();
    for (int p = 0; p < NPARTS; p++)
        wk->pos[p] = w->parts[p].committed;
    wk->last_renew = wk->last_commit = w->now;
}

/* The worker dies: its jobs and answers in flight are gone (the provider
 * executed what it executed), its leases stay until they expire; it comes
 * back with the same id and reads from the committed offsets. */
static void crash(struct world *w, struct worker *wk)
{
    note(w, wk->id, A_CRASH, 0, 0);
    w->crashes++;
    worker_reset(w, wk);
}

/* Partition p moves to another worker: the old one commits what finished,
 * gives the rest up (engine_kafka.c's engine_detach, by the core's
 * engine_core_detach), forgets the partition. */
static void rebalance(struct world *w)
{
    int p = (int)sim_rng_below(&w->rng, NPARTS);
    struct worker *from = NULL;
    for (int i = 0; i < NWORKERS; i++)
        if (w->workers[i].parts & (1u << p))
            from = &w->workers[i];
    struct worker *to = &w->workers[sim_rng_below(&w->rng, NWORKERS)];
    if (!from || from == to)
        return;
    reap_commit(w, from);
    commit(w, from, p);
    for (struct job *j = job_list_oldest(from->jobs); j; j = job_younger(j))
        if (!j->detached && j->partition == p &&
            engine_core_detach(from->jobs, j) == ENGINE_NEXT_RELEASE)
            job_release(w, from, j);
    offset_tracker_forget(from->offsets, p);
    from->parts &= ~(1u << p);
    to->parts |= 1u << p;
    to->pos[p] = w->parts[p].committed;
    note(w, to->id, A_REBALANCE, p, from->id);
    w->rebalances++;
}

/* ---- a reconciler: reconcile_look's look, as worker/roles/reconciler_look.c
 * runs it, one provider call a step ---- */

static const long long schedule_ms[] = {1000, 5000, 15000, 30000};
#define NSCHEDULE ((int)(sizeof(schedule_ms) / sizeof(schedule_ms[0])))

/* The model's provider never expires an authorization (no automatic
 * cancel): the default of RECONCILER_AUTHORIZATION_EXPIRY_MS, and
 * AUTHORIZED attempts are not on the reconciler's queue. */
#define CHARGED_SIM_AUTHORIZATION_EXPIRY_MS 604800000LL

/* The limits the look decides on; the broken key margin: the policy's
 * margin is the timeout plus a tenth of the retention (at most 60 s), and a
 * timeout of minus that tenth makes it 0. */
static struct reconcile_limits rec_limits(const struct world *w)
{
    struct reconcile_limits lim = {w->set.key_retention_ms, w->set.provider_timeout_ms,
                                   w->set.search_lag_ms, w->set.max_age_ms,
                                   CHARGED_SIM_AUTHORIZATION_EXPIRY_MS};
    if (w->breaks & SIM_BREAK_KEY_MARGIN) {
        int64_t tenth = w->set.key_retention_ms / 10;
        lim.provider_timeout_ms = -(tenth < 60000 ? tenth : 60000);
    }
    return lim;
}

/* capture_reconcile.c's order of evidence (a static table there): the
 * capture's own decision, capture_look_decide. */
static const struct reconcile_order sim_capture_order = {
    .decide = capture_look_decide,
    .operation = {[RECONCILE_RETRIEVE] = "retrieve", [RECONCILE_CHARGE] = "capture"},
};

/* The claimed record as reconcile_look reads it (reconciler_look.c's
 * charge_begin and refund_begin, and the steps' own). */
static void rec_begin(struct world *w, struct look *l)
{
    const struct reconcile_limits lim = rec_limits(w);
    struct reconcile_attempt ra = {
        .id = l->name,
        .status = l->status,
        .provider_payment_id = l->object,
        .key_age_ms = l->key_age_ms,
        .first_sent_ms = l->first_sent_ms,
        .age_ms = l->age_ms,
    };
    if (l->step) {
        /* capture_reconcile.c's capture_begin, void_reconcile.c's. */
        snprintf(l->name, sizeof(l->name), "s%d", l->id);
        if (l->intent != SIM_NULL)
            snprintf(l->object, sizeof(l->object), "pi_%d", l->intent);
        ra.amount = l->asked;
        ra.first_sent_ms = -1;
        reconcile_look_begin_order(&l->core,
                                   l->step == SIM_STEP_CAPTURE ? &sim_capture_order
                                                               : &void_look_order,
                                   &lim, &ra, l->claimed_at);
        return;
    }
    if (!l->refund) {
        sim_attempt_name(l->id, l->name, sizeof(l->name));
        if (l->intent != SIM_NULL)
            snprintf(l->object, sizeof(l->object), "pi_%d", l->intent);
        ra.amount = sim_store_attempt(w->store, l->id)->amount;
        ra.currency = "EUR";
        ra.manual = l->manual;
    } else {
        snprintf(l->name, sizeof(l->name), "r%d", l->id);
        if (l->prefund != SIM_NULL)
            snprintf(l->object, sizeof(l->object), "re_%d", l->prefund);
        if (l->intent != SIM_NULL)
            snprintf(l->intent_name, sizeof(l->intent_name), "pi_%d", l->intent);
        ra.amount = sim_store_refund(w->store, l->id)->amount;
        ra.payment_intent = l->intent_name;
        ra.object = "refund";
    }
    reconcile_look_begin(&l->core,
                         l->refund   ? RECONCILE_KIND_REFUND
                         : l->manual ? RECONCILE_KIND_AUTHORIZATION
                                     : RECONCILE_KIND_CHARGE,
                         &lim, &ra, l->claimed_at);
}

static void rec_claim(struct world *w, struct reconciler *r)
{
    struct look *l = &r->l;
    int64_t epoch;
    int id = sim_store_claim_due(w->store, r->id, 2 * w->set.lease_ms, w->set.stale_ms,
                                 &epoch);
    int refund = 0, step = 0;
    if (id < 0) {
        id = sim_store_refund_claim_due(w->store, r->id, 2 * w->set.lease_ms,
                                        w->set.stale_ms, &epoch);
        refund = 1;
    }
    if (id < 0) {
        id = sim_store_step_claim_due(w->store, r->id, 2 * w->set.lease_ms,
                                      w->set.stale_ms, &epoch);
        refund = 0, step = 1;
    }
    if (id < 0) {
        r->next_poll = w->now + 500;
        return;
    }
    memset(l, 0, sizeof(*l)); /* large: only when a look starts */
    l->active = 1;
    l->refund = refund;
    l->id = id;
    l->epoch = epoch;
    l->claimed_at = r->renewed_at = w->now;
    if (step) {
        struct sim_refund_row *f = sim_store_step(w->store, id);
        l->step = f->kind;
        l->status = f->status;
        l->intent = f->intent;
        l->asked = f->amount;
        l->key_age_ms = f->first_sent_at == SIM_NULL ? -1 : w->now - f->first_sent_at;
        l->age_ms = w->now - f->created_at;
    } else if (!refund) {
        struct sim_attempt *a = sim_store_attempt(w->store, id);
        l->status = a->status;
        l->intent = a->intent;
        l->manual = a->manual;
        l->key_age_ms = a->first_sent_at == SIM_NULL ? -1 : w->now - a->first_sent_at;
        l->first_sent_ms = a->first_sent_at == SIM_NULL ? -1 : a->first_sent_at;
        l->age_ms = w->now - a->created_at;
    } else {
        struct sim_refund_row *f = sim_store_refund(w->store, id);
        l->status = f->status;
        l->intent = f->intent;
        l->prefund = f->prefund;
        l->key_age_ms = f->first_sent_at == SIM_NULL ? -1 : w->now - f->first_sent_at;
        l->first_sent_ms = f->first_sent_at == SIM_NULL ? -1 : f->first_sent_at;
        l->age_ms = w->now - f->created_at;
    }
    if (w->breaks & SIM_BREAK_KEY_WINDOW)
        l->key_age_ms = -1; /* the broken look: every key counts as new */
    rec_begin(w, l);
    note(w, r->id, A_REC_CLAIM, id, refund + 2 * l->step);
}

static void rec_settle(struct world *w, struct reconciler *r,
                       const struct reconcile_decision *dec)
{
    struct look *l = &r->l;
    int checks;
    int obj = dec->provider_payment_id[0] ? id_of(dec->provider_payment_id) : SIM_NULL;
    if (l->step)
        checks = sim_store_step(w->store, l->id)->reconcile_checks;
    else if (!l->refund)
        checks = sim_store_attempt(w->store, l->id)->reconcile_checks;
    else
        checks = sim_store_refund(w->store, l->id)->reconcile_checks;
    int stays = dec->status == l->status;
    int64_t next = reconcile_look_next_check_ms(l->status, dec->status, schedule_ms,
                                                NSCHEDULE, checks);
    int ok = l->step     ? sim_store_step_settle(w->store, l->id, l->status, r->id,
                                                 l->epoch, dec->status, dec->amount, next)
             : l->refund ? sim_store_refund_settle(w->store, l->id, l->status, r->id,
                                                   l->epoch, dec->status, obj, next)
                         : sim_store_settle(w->store, l->id, l->status, r->id, l->epoch,
                                            dec->status, obj, next);
    note(w, r->id, A_REC_SETTLE, l->id, ok ? (long long)dec->status : -1);
    w->rec_settled += ok && !stays;
    w->rec_never_executed += ok && dec->rule == RECONCILE_NEVER_EXECUTED;
    l->active = 0;
}

/* One page of the list is the whole walk here (the models' lists are
 * short), folded as reconcile_policy_list_walk folds each. */
static struct provider_result rec_walk(const struct provider_result *page)
{
    struct provider_result walk = {0};
    reconcile_policy_list_fold(&walk, page, 1);
    return walk;
}

/* A charge's call, as reconciler_look.c's charge_call and charge_page make it;
 * 1 when its answer is lost. */
static int rec_call(struct world *w, struct look *l, const struct reconcile_step *st)
{
    struct sim_attempt *a = sim_store_attempt(w->store, l->id);
    int lost = 0;
    switch (st->next) {
    case RECONCILE_RETRIEVE:
        *st->answer = sim_provider_retrieve(w->prov, l->intent);
        break;
    case RECONCILE_SEARCH:
    case RECONCILE_SEARCH_OTHERS:
        *st->answer = sim_provider_search(w->prov, l->id);
        break;
    case RECONCILE_CHARGE:
        *st->answer = sim_provider_charge(w->prov, a->key, a->id, a->order, a->amount,
                                          a->manual, &lost);
        w->charges_sent++;
        w->rec_charges++;
        break;
    case RECONCILE_LIST: {
        long long gte, lt;
        reconcile_policy_list_window(l->first_sent_ms, w->set.key_retention_ms, &gte,
                                     &lt);
        struct provider_result page = sim_provider_list(w->prov, l->id, gte, lt);
        if (w->breaks & SIM_BREAK_LIST_SKIPPED) /* the list not asked */
            page = (struct provider_result){.outcome = PROVIDER_NOT_FOUND,
                                            .http_status = 200};
        *st->answer = rec_walk(&page);
        break;
    }
    case RECONCILE_SETTLE:
        break;
    }
    return lost;
}

/* A refund's call, as reconciler_look.c's refund_call and refund_page. */
static int rec_call_refund(struct world *w, struct look *l,
                           const struct reconcile_step *st)
{
    struct sim_refund_row *f = sim_store_refund(w->store, l->id);
    int lost = 0;
    if (st->next == RECONCILE_RETRIEVE) {
        *st->answer = sim_provider_retrieve_refund(w->prov, l->prefund);
    } else if (st->next == RECONCILE_LIST) {
        struct provider_result page =
            sim_provider_list_refunds(w->prov, l->intent, l->id);
        *st->answer = rec_walk(&page);
    } else {
        *st->answer =
            sim_provider_refund(w->prov, f->key, l->intent, f->id, f->amount, &lost);
        w->charges_sent++;
    }
    return lost;
}

/* A capture's or void's call, as capture_reconcile.c's and
 * void_reconcile.c's: the step again under its key, or the intent by our
 * recorded id. */
static int rec_call_step(struct world *w, struct look *l,
                         const struct reconcile_step *st)
{
    struct sim_refund_row *f = sim_store_step(w->store, l->id);
    int lost = 0;
    if (st->next == RECONCILE_CHARGE) {
        *st->answer =
            l->step == SIM_STEP_CAPTURE
                ? sim_provider_capture(w->prov, f->key, l->intent, f->amount, &lost)
                : sim_provider_cancel(w->prov, f->key, l->intent, &lost);
        w->charges_sent++;
    } else {
        *st->answer = sim_provider_retrieve(w->prov, l->intent);
    }
    return lost;
}

static void rec_step(struct world *w, struct reconciler *r)
{
    struct look *l = &r->l;
    struct reconcile_step st;
    if (!l->active) {
        if (w->now >= r->next_poll)
            rec_claim(w, r);
        return;
    }
    if (w->now < l->busy_until)
        return; /* inside a call: the provider has not answered yet */
    /* reconciler_look.c measures the look's time before each decision, and
     * makes the call it names at once; the broken look: no time passed. */
    reconcile_look_step(&l->core,
                        w->breaks & SIM_BREAK_KEY_WINDOW ? l->claimed_at : w->now, &st);
    if (st.next == RECONCILE_SETTLE) {
        rec_settle(w, r, &st.dec);
        return;
    }
    int lost = l->step     ? rec_call_step(w, l, &st)
               : l->refund ? rec_call_refund(w, l, &st)
                           : rec_call(w, l, &st);
    l->busy_until =
        w->now + (lost ? w->set.provider_timeout_ms : 5 + st.answer->latency_ms);
    note(w, r->id, A_REC_CALL, l->id, (l->refund ? 100 : 0) + st.next);
}

/* ---- webhooks: the api's path (webhook_store_apply) ---- */

/* A refund's event (apply_refund of webhook_store.c): one refund named. */
static void refund_webhook(struct world *w, const struct sim_webhook *h)
{
    const struct sim_prefund *f = &w->prov->refunds[h->intent];
    struct sim_refund_row *row = sim_store_refund(w->store, f->refund);
    w->webhooks++;
    if (!row) {
        note(w, -1, A_WEBHOOK, h->event_id, -1);
        return;
    }
    struct webhook_refund r = {.amount = f->amount};
    snprintf(r.id, sizeof(r.id), "re_%d", h->intent);
    snprintf(r.status, sizeof(r.status), "succeeded");
    snprintf(r.currency, sizeof(r.currency), "EUR");
    snprintf(r.payment_intent, sizeof(r.payment_intent), "pi_%d", f->intent);
    snprintf(r.refund_id, sizeof(r.refund_id), "r%d", f->refund);
    struct webhook_refund_row wr = {
        .status = row->status,
        .amount = row->amount,
        .currency = "EUR",
        .intent_differs = row->intent != SIM_NULL && row->intent != f->intent,
        .provider_id_recorded = row->prefund != SIM_NULL,
        .provider_id_differs = row->prefund != SIM_NULL && row->prefund != h->intent,
        .provider_id_elsewhere = 0,
    };
    struct webhook_refund_decision d;
    webhook_refund_decide(&r, &wr, &d);
    int ok = d.action == WEBHOOK_REFUND_APPLY &&
             sim_store_refund_webhook_settle(w->store, row->id, d.status, h->intent);
    w->webhook_applied += ok;
    note(w, -1, A_WEBHOOK, 1000000 + row->id, d.action * 10 + ok);
}

static void webhook_step(struct world *w)
{
    static struct webhook_event
        ev; /* large (its refunds): kept, not zeroed each time */
    struct sim_webhook h;
    if (!sim_provider_next_webhook(w->prov, &h))
        return;
    if ((size_t)h.event_id >= w->nseen) {
        size_t was = w->nseen;
        w->seen_events = grow(w->seen_events, &w->nseen, (size_t)h.event_id + 1, 1);
        memset(w->seen_events + was, 0, w->nseen - was); /* never read unset bytes */
    }
    if (w->seen_events[h.event_id] == 1) {
        note(w, -1, A_WEBHOOK, h.event_id, -2); /* duplicate: already processed */
        return;
    }
    w->seen_events[h.event_id] = 1;
    if (h.evidence == SIM_EV_REFUND) {
        refund_webhook(w, &h);
        return;
    }
    const struct sim_intent *in = &w->prov->intents[h.intent];
    struct sim_attempt *a = sim_store_attempt(w->store, in->attempt);
    w->webhooks++;
    if (!a) {
        note(w, -1, A_WEBHOOK, h.event_id, -1); /* unmatched: kept for review */
        return;
    }
    ev.evidence = h.evidence == SIM_EV_SUCCEEDED    ? WEBHOOK_EVIDENCE_SUCCEEDED
                  : h.evidence == SIM_EV_FAILED     ? WEBHOOK_EVIDENCE_FAILED
                  : h.evidence == SIM_EV_AUTHORIZED ? WEBHOOK_EVIDENCE_AUTHORIZED
                                                    : WEBHOOK_EVIDENCE_PROCESSING;
    /* An authorization's events (amount_capturable_updated, payment_failed)
     * carry the intent's manual-capture fields. */
    snprintf(ev.capture_method, sizeof(ev.capture_method), "%s",
             in->manual ? "manual" : "automatic");
    ev.amount_capturable = h.evidence == SIM_EV_AUTHORIZED ? in->amount : 0;
    ev.amount_received = -1;
    ev.cancellation_reason[0] = '\0';
    ev.created = h.created / 1000;
    snprintf(ev.intent_id, sizeof(ev.intent_id), "pi_%d", h.intent);
    ev.amount = in->amount;
    snprintf(ev.currency, sizeof(ev.currency), "EUR");
    sim_attempt_name(in->attempt, ev.attempt_id, sizeof(ev.attempt_id));
    ev.nrefunds = 0;
    struct webhook_attempt wa = {
        .status = a->status,
        .amount = a->amount,
        .currency = "EUR",
        .updated_at = a->updated_at / 1000,
        .intent_recorded = a->intent != SIM_NULL,
        .intent_differs = a->intent != SIM_NULL && a->intent != h.intent,
        .intent_elsewhere = 0,
        .order_has_other_live = w->store->live_count[a->order] -
                                    (attempt_status_is_live(a->status) ? 1 : 0) >
                                0,
    };
    struct webhook_decision d;
    /* The api's routing: a manual intent's events are the authorization's. */
    if (in->manual)
        webhook_event_decide_authorization(&ev, &wa, &d);
    else
        webhook_event_decide(&ev, &wa, &d);
    int ok = 0;
    if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW)
        ok = sim_store_webhook_settle(w->store, a->id, d.status,
                                      d.action == WEBHOOK_APPLY ? h.intent : SIM_NULL);
    note(w, -1, A_WEBHOOK, a->id, d.action * 10 + ok);
    w->webhook_applied += ok;
}

/* Another client of the provider account charges with metadata naming an
 * attempt of ours (issue 34): its event only names the attempt, whatever
 * the attempt's state, and must never move it. Its intent is not one the
 * model's provider made for us (no id of ours is that large). */
#define SIM_FOREIGN_INTENT (1 << 30)

static void foreign_webhook(struct world *w)
{
    static struct webhook_event ev; /* large: kept, not zeroed each time */
    if (w->next_attempt == 0)
        return;
    int id = (int)sim_rng_below(&w->rng, (uint64_t)w->next_attempt);
    struct sim_attempt *a = sim_store_attempt(w->store, id);
    if (!a)
        return;
    ev.evidence = sim_rng_below(&w->rng, 2) ? WEBHOOK_EVIDENCE_SUCCEEDED
                                            : WEBHOOK_EVIDENCE_FAILED;
    ev.created = w->now / 1000;
    snprintf(ev.intent_id, sizeof(ev.intent_id), "pi_%d", SIM_FOREIGN_INTENT + id);
    ev.amount = a->amount;
    snprintf(ev.currency, sizeof(ev.currency), "EUR");
    sim_attempt_name(id, ev.attempt_id, sizeof(ev.attempt_id));
    ev.nrefunds = 0;
    struct webhook_attempt wa = {
        .status = a->status,
        .amount = a->amount,
        .currency = "EUR",
        .updated_at = a->updated_at / 1000,
        .intent_recorded = a->intent != SIM_NULL,
        .intent_differs = a->intent != SIM_NULL,
    };
    if (w->breaks & SIM_BREAK_OWNERSHIP) {
        /* The rule dropped: metadata naming the attempt taken as ours. */
        wa.intent_recorded = 1;
        wa.intent_differs = 0;
    }
    struct webhook_decision d;
    webhook_event_decide(&ev, &wa, &d);
    w->foreign++;
    note(w, -1, A_WEBHOOK, id, 100 + d.action);
    if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW)
        sim_violate(&w->viol, "settled-by-foreign",
                    "attempt a%d (%s) moved to %s by intent %s that only names it", id,
                    attempt_status_name(a->status), attempt_status_name(d.status),
                    ev.intent_id);
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
                                         enum provider_outcome outcome, int tries,
                                         int key_window_open, unsigned jitter)
{
    if ((kind == MSG_AUTHORIZE && outcome == PROVIDER_SUCCEEDED) ||
        (kind == MSG_CAPTURE && outcome == PROVIDER_AUTHORIZED))
        outcome = PROVIDER_REQUIRES_REVIEW;
    struct answer_decision d =
        payment_answer_decide(kind, p, outcome, tries, key_window_open, jitter);
    if (kind == MSG_AUTHORIZE && outcome == PROVIDER_AUTHORIZED)
        d = (struct answer_decision){.next = ANSWER_NEXT_SETTLE,
                                     .status = ATTEMPT_STATUS_AUTHORIZED,
                                     .next_check_ms = -1};
    return d;
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
    };
    w->core = (struct engine_core){
        .policy = {.unknown_retries = 2,
                   .retry_base_ms = 200,
                   .retry_max_ms = 5000,
                   .first_look_ms = 2000},
        .max_in_flight = MAX_JOBS,
        .recheck_ms = w->set.recheck_ms,
        .key_retention_ms = w->set.key_retention_ms,
        .key_margin_ms = charge_policy_key_margin_ms(w->set.key_retention_ms,
                                                     w->set.provider_timeout_ms),
        .decide = sim_decide,
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
    }
    for (int p = 0; p < NPARTS; p++)
        w->workers[p % NWORKERS].parts |= 1u << p;
    for (int i = 0; i < NRECONCILERS; i++)
        w->recs[i].id = RECONCILER_ID(i);
}

static void world_release(struct world *w)
{
    for (int i = 0; i < NWORKERS; i++) {
        worker_reset(w, &w->workers[i]);
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
        note(w, -1, A_JUMP, jump, 0);
        w->jumps++;
    }
    w->store->now = w->prov->now = w->now;
    sim_provider_tick(w->prov);
    unsigned r = (unsigned)sim_rng_below(&w->rng, 1000);
    if (r < 60)
        generate(w);
    else if (r < 760)
        worker_step(w, &w->workers[sim_rng_below(&w->rng, NWORKERS)]);
    else if (r < 880)
        rec_step(w, &w->recs[sim_rng_below(&w->rng, NRECONCILERS)]);
    else if (r < 998) {
        if (sim_rng_below(&w->rng, 50) == 0)
            foreign_webhook(w);
        else
            webhook_step(w);
    } else if (sim_rng_below(&w->rng, 8) == 0)
        crash(w, &w->workers[sim_rng_below(&w->rng, NWORKERS)]);
    else if (sim_rng_below(&w->rng, 4) == 0)
        rebalance(w);
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
    {"refund-captured", SIM_BREAK_REFUND_CAPTURED,
     "an authorization's refunds are bound by its amount, not its capture"},
};
#define NBREAKS ((int)(sizeof(break_rules) / sizeof(break_rules[0])))

static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: charged-sim --seed N --steps N [--seeds K] [--break RULE] [--trace]\n"
        "\n"
        "  option         meaning                                        default\n"
        "  --seed N       the first seed (one seed names one run exactly) 1\n"
        "  --steps N      steps per seed                                  1000000\n"
        "  --seeds K      run K seeds: N, N+1, ... N+K-1                  1\n"
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
    uint64_t seed = 1, steps = 1000000, seeds = 1;
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
        for (w.step = 0; w.step < steps; w.step++) {
            note(&w, -1, A_IDLE, 0, 0);
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
        printf("seed %llu steps %llu attempts %d refunds %d calls %llu lost %llu "
               "persisted %llu fenced %llu takeovers %llu key_closed %llu "
               "in_use %llu rec_settled %llu rec_charges %llu never_executed %llu "
               "webhooks %llu "
               "applied %llu foreign %llu jumps %llu crashes %llu rebalances %llu "
               "authorized %llu captured %llu voided %llu step_rejected %llu "
               "hold_lost %llu step_unknown %llu captured_refunds %llu "
               "charged %lld "
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
               (unsigned long long)w.step_unknown,
               (unsigned long long)w.captured_refunds, w.prov->charged_total,
               w.prov->refunded_total, (unsigned long long)world_hash(&w));
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
