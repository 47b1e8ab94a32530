/* The workers of the simulation (sim_actors.h): worker/pipeline/engine.c's
 * stages over the models, each handing its answer to the engine's own
 * core. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "payment_answer.h"
#include "sim_actors.h"

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
        sim_note(w, wk->id, A_FETCH, p, s->j.offset);
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
    sim_note(w, wk->id, A_START, j->partition, j->offset);
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
        sim_note(w, wk->id, A_DEAD_LETTER, j->partition, j->offset);
        return 1;
    }
    if (!(j = job_list_first(wk->jobs, JOB_DEAD_LETTER)))
        return 0;
    j->next_at = 0; /* the model never fails to produce: no back-off to wait */
    if (engine_core_dead_letter_gate(wk->jobs, j, w->now) == ENGINE_NEXT_SEND)
        engine_core_dead_letter_produced(wk->jobs, j, 0, 0, w->now);
    return 1;
}

static int record_one(struct world *w, struct worker *wk)
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
    sim_note(w, wk->id, A_RECORD, m->id, rc);
    engine_core_recorded(wk->jobs, j, results[rc], epoch, w->now);
    return 1;
}

/* The records ready, as one batch when the gate allows (engine_store.c's
 * engine_record_attempts): each in turn, as the statement's rows. */
static int record(struct world *w, struct worker *wk)
{
    size_t n = job_list_count(wk->jobs, JOB_RECORD);
    if (n == 0 || batch_gate_due_at(&wk->record_gate, n, w->now) > w->now)
        return 0;
    batch_gate_ran(&wk->record_gate, w->now);
    for (size_t i = 0; i < n && record_one(w, wk); i++)
        ;
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
    sim_note(w, wk->id, A_CLAIM, sj(j)->target, rc);
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

/* ---- the provider budget (--budget): each worker holds a share ---- */

/* A call's endpoint class and priority, as engine_provider.c's budget_of
 * gives them for the operation's name. */
static void budget_of(int kind, enum budget_class *cls, enum budget_priority *prio)
{
    CHARGED_ASSERT(kind >= 0 && kind <= MSG_VOID);
    *cls = BUDGET_CLASS_CREATE;
    *prio = BUDGET_PRIO_CHARGE;
    if (kind == MSG_CAPTURE || kind == MSG_VOID) {
        *cls = BUDGET_CLASS_CAPTURE;
        *prio = BUDGET_PRIO_CAPTURE;
    } else if (kind == MSG_REFUND) {
        *cls = BUDGET_CLASS_REFUND;
        *prio = BUDGET_PRIO_REFUND;
    }
}

static void gate_on(struct world *w, struct worker *wk)
{
    struct budget_share share;
    if (wk->gate_on)
        return;
    budget_share_zero(&share);
    share.global_mrps = w->budget_rps * BUDGET_UNIT;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        share.class_mrps[c] = BUDGET_UNLIMITED;
    budget_gate_init(&wk->gate, w->now);
    budget_gate_set_share(&wk->gate, &share, INT64_MAX / 4, w->now);
    wk->gate_on = 1;
    wk->nsent = 0;
}

/* A job no longer asks (given up, settled, freed): not a waiter. */
static void budget_forget(struct worker *wk, struct job *j)
{
    if (wk->gate_on)
        budget_gate_forget(&wk->gate, &j->budget.t);
    j->budget.asked = 0;
}

/* The invariant: never more calls started in any second than the gate's
 * bound, its share plus its burst (budget_gate.h: BUDGET_GATE_BURST_MS of
 * the rate, at least one request), which the provider's own bucket of the
 * share's size takes. Judged against the share alone, 9 calls in 996 ms
 * under a share of 8 read as a break though the gate works as designed. */
static void budget_sent(struct world *w, struct worker *wk)
{
    CHARGED_ASSERT(w->budget_rps > 0 && w->budget_rps <= SIM_BUDGET_MAX);
    const uint64_t ring = 2 * SIM_BUDGET_MAX;
    long long burst = w->budget_rps * BUDGET_GATE_BURST_MS / 1000;
    uint64_t bound = (uint64_t)(w->budget_rps + (burst > 1 ? burst : 1));
    CHARGED_ASSERT(bound < ring);
    if (wk->nsent >= bound) {
        int64_t first = wk->sent_ms[(wk->nsent - bound) % ring];
        if (w->now - first < 1000)
            sim_violate(&w->viol, "budget-per-second",
                        "worker %d: %llu calls started within %lld ms, share %lld/s "
                        "and its burst",
                        wk->id, (unsigned long long)bound + 1,
                        (long long)(w->now - first), w->budget_rps);
    }
    wk->sent_ms[wk->nsent++ % ring] = w->now;
}

/* Asks the worker's gate for j's call, as engine_provider.c does: 0, send;
 * 1, parked for the gate's wait (engine_core_budget). */
static int budget_waits(struct world *w, struct worker *wk, struct job *j)
{
    if (w->budget_rps <= 0)
        return 0;
    gate_on(w, wk);
    if (!j->budget.asked) {
        enum budget_class cls;
        enum budget_priority prio;
        budget_of(j->kind, &cls, &prio);
        j->budget = (struct budget_ask){{cls, prio, 0}, w->now, 1};
    }
    long long wait = (w->breaks & SIM_BREAK_BUDGET)
                         ? 0
                         : budget_gate_ask(&wk->gate, &j->budget.t, w->now);
    if (engine_core_budget(wk->jobs, j, wait, w->now) == ENGINE_NEXT_NONE) {
        j->budget.asked = 0;
        budget_sent(w, wk);
        return 0;
    }
    engine_core_budget_waited_long(j, w->now);
    w->budget_parked++;
    return 1;
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
        budget_forget(wk, j);
        job_release(w, wk, j);
        break;
    case ENGINE_NEXT_KEY_CLOSED:
        budget_forget(wk, j);
        sim_note(w, wk->id, A_KEY_CLOSED, sj(j)->target, j->kind);
        w->key_closed++;
        break;
    default:
        if (budget_waits(w, wk, j))
            break;
        send_call(w, j);
        engine_core_call_started(wk->jobs, j);
        sim_note(w, wk->id, A_CALL, job_msg(w, j)->id, j->kind);
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
    sim_note(w, wk->id, A_ANSWER, sj(j)->target, j->res.outcome);
    /* No breaker in the model: no answer is a failure that opened it. */
    enum engine_next next =
        engine_core_answered(&w->core, wk->jobs, j, 0, 0, NULL, w->now);
    if (next == ENGINE_NEXT_RELEASE)
        job_release(w, wk, j);
    if (next == ENGINE_NEXT_PARKED)
        w->parked++;
    if (next == ENGINE_NEXT_SET_ASIDE)
        w->set_aside++;
    /* The broken worker: a throttled job waits out its back-off in its
     * slot, as every worker did before issue 38. */
    if (next == ENGINE_NEXT_PARKED && (w->breaks & SIM_BREAK_PARK))
        job_set(wk->jobs, j, JOB_CALL);
    return 1;
}

/* A parked job due goes back to its call when a slot is free. */
static int unpark(struct world *w, struct worker *wk)
{
    if (w->breaks & SIM_BREAK_UNPARK)
        return 0;
    for (struct job *j = job_list_first(wk->jobs, JOB_PARKED); j;
         j = job_next_in_state(j))
        if (engine_core_park_gate(&w->core, wk->jobs, j, w->now) == ENGINE_NEXT_SEND)
            return 1;
    return 0;
}

/* A parked job still settles: once due with a slot free, it is back to
 * its call within PARKED_STEPS steps (the unpark stage's turn comes long
 * before; clock jumps and busy slots do not count against it). */
#define PARKED_STEPS 3000
static void check_parked(struct world *w, struct worker *wk)
{
    int free_slot = (long long)engine_core_started(wk->jobs) < w->core.max_in_flight;
    for (struct job *j = job_list_first(wk->jobs, JOB_PARKED); j;
         j = job_next_in_state(j)) {
        if (!free_slot || j->next_at > w->now) {
            sj(j)->due_step = 0;
        } else if (!sj(j)->due_step) {
            sj(j)->due_step = w->step + 1;
        } else if (w->step + 1 - sj(j)->due_step > PARKED_STEPS) {
            sim_violate(&w->viol, "parked-comes-back",
                        "worker %d: %s parked, due with a slot free for %d steps",
                        wk->id, j->id, PARKED_STEPS);
            return;
        }
    }
}

/* Issue 38 (adversary 36): a job the provider throttled, or whose key was
 * in use, waits out of the in-flight slots: such jobs never hold every
 * slot while another command waits in the backlog. */
static void check_slots(struct world *w, struct worker *wk)
{
    check_parked(w, wk);
    if (!job_list_count(wk->jobs, JOB_BACKLOG) ||
        (long long)engine_core_started(wk->jobs) < w->core.max_in_flight)
        return;
    long long held = 0;
    for (struct job *j = job_list_first(wk->jobs, JOB_CALL); j;
         j = job_next_in_state(j))
        held += j->next_at > w->now && provider_outcome_parks(&j->res);
    if (held >= w->core.max_in_flight)
        sim_violate(&w->viol, "throttled-holds-slots",
                    "worker %d: all %lld in-flight slots held by throttled or "
                    "key-in-use jobs waiting to retry, %zu commands waiting",
                    wk->id, held, job_list_count(wk->jobs, JOB_BACKLOG));
}

static int persist_one(struct world *w, struct worker *wk)
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
    sim_note(w, wk->id, A_PERSIST, sj(j)->target, ok ? (long long)d->status : -1);
    int first_busy;
    if (engine_core_persisted(&w->core, wk->jobs, j, j->lease_epoch, ok, 0, &first_busy,
                              w->now) == ENGINE_NEXT_FENCED)
        w->fenced++;
    else
        w->settled++;
    return 1;
}

/* The outcomes due, as one batch when the gate allows
 * (engine_persist_outcomes). */
static int persist(struct world *w, struct worker *wk)
{
    size_t n = job_list_due(wk->jobs, JOB_PERSIST, w->now);
    if (n == 0 || batch_gate_due_at(&wk->persist_gate, n, w->now) > w->now)
        return 0;
    batch_gate_ran(&wk->persist_gate, w->now);
    for (size_t i = 0; i < n && persist_one(w, wk); i++)
        ;
    return 1;
}

static int renew(struct world *w, struct worker *wk)
{
    static const enum job_state leased[] = {JOB_CALL, JOB_CALLING, JOB_PERSIST,
                                            JOB_PARKED};
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
            if (!ours) {
                engine_core_lease_lost(&w->core, wk->jobs, j, w->now);
                budget_forget(wk, j); /* as engine_store.c: it stops asking */
            }
        }
    sim_note(w, wk->id, A_RENEW, 0, 0);
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
        sim_note(w, wk->id, A_COMMIT, p, pos);
    }
}

static int reap_commit(struct world *w, struct worker *wk)
{
    int n = 0;
    for (struct job *j = job_list_first(wk->jobs, JOB_DONE), *next; j; j = next) {
        next = job_next_in_state(j);
        engine_core_reap(wk->jobs, wk->offsets, j);
        budget_forget(wk, j);
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

void sim_worker_step(struct world *w, struct worker *wk)
{
    /* One stage, at random: the stages of a turn interleave with the other
     * actors at the finest grain the engine's own order allows. */
    int (*const stages[])(struct world *, struct worker *) = {
        fetch,   start_one, dead_letter, record, claim,      call,
        collect, unpark,    persist,     renew,  reap_commit};
    int n = (int)(sizeof(stages) / sizeof(stages[0]));
    int s = (int)sim_rng_below(&w->rng, (uint64_t)n);
    for (int k = 0; k < n; k++)
        if (stages[(s + k) % n](w, wk))
            break;
    check_slots(w, wk);
}

void sim_worker_reset(struct world *w, struct worker *wk)
{
    for (struct job *j = job_list_oldest(wk->jobs), *next; j; j = next) {
        next = job_younger(j);
        job_list_remove(wk->jobs, j);
        free(sj(j));
    }
    offset_tracker_free(wk->offsets);
    wk->offsets = offset_tracker_new();
    wk->gate_on = 0; /* a new process: a new gate */
    for (int p = 0; p < NPARTS; p++)
        wk->pos[p] = w->parts[p].committed;
    wk->last_renew = wk->last_commit = w->now;
    batch_gate_init(&wk->record_gate, w->set.batch_hold_ms, SIM_BATCH_FULL);
    batch_gate_init(&wk->persist_gate, w->set.batch_hold_ms, SIM_BATCH_FULL);
}

/* The worker dies: its jobs and answers in flight are gone (the provider
 * executed what it executed), its leases stay until they expire; it comes
 * back with the same id and reads from the committed offsets. */
void sim_crash(struct world *w, struct worker *wk)
{
    sim_note(w, wk->id, A_CRASH, 0, 0);
    w->crashes++;
    sim_worker_reset(w, wk);
}

/* Partition p moves to another worker: the old one commits what finished,
 * gives the rest up (engine_kafka.c's engine_detach, by the core's
 * engine_core_detach), forgets the partition. */
void sim_rebalance(struct world *w)
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
        if (!j->detached && j->partition == p) {
            if (engine_core_detach(from->jobs, j) == ENGINE_NEXT_RELEASE)
                job_release(w, from, j);
            budget_forget(from, j); /* revoked while it waited for the budget */
        }
    offset_tracker_forget(from->offsets, p);
    from->parts &= ~(1u << p);
    to->parts |= 1u << p;
    to->pos[p] = w->parts[p].committed;
    sim_note(w, to->id, A_REBALANCE, p, from->id);
    w->rebalances++;
}
