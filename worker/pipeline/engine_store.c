#include "engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "clock.h"
#include "db.h"
#include "log.h"
#include "metrics.h"
#include "str_index.h"

static enum metric_key outcomes_metric(const engine_t *eng, const struct job *j)
{
    return eng->op->outcomes_metric ? (enum metric_key)eng->op->outcomes_metric(j->kind)
                                    : METRIC_ATTEMPTS;
}

/* ---- the database's state ---- */

int engine_db_ready(engine_t *eng)
{
    return daemon_db_due(&eng->db);
}

void engine_db_ok(engine_t *eng)
{
    daemon_db_ok(&eng->db);
}

void engine_db_failed(engine_t *eng, const char *stage, const char *err)
{
    daemon_db_failed(&eng->db, stage, err);
}

/* ---- a stage: a batch, and each item alone when one holds the rest ---- */

/* What became of one item of a stage's task (on its lane). */
enum item_verdict {
    ITEM_NOT_RUN,   /* its statement did not run: it stays as it was */
    ITEM_DONE,      /* ran: apply its result */
    ITEM_REFUSED,   /* the database refused it alone: sqlstate */
    ITEM_LOCKED,    /* another session's lock held it alone */
    ITEM_ABANDONED, /* refused even as the stage's fallback (review) */
};

struct stage;

/* What a lane's task is, its first member: the persist lane runs both. */
enum task_kind { TASK_STAGE, TASK_UPKEEP };

/* A stage's batch on its way through a lane. The lane reads eng's limits
 * (op, lease_ms, the retry policy) and writes only the task; the jobs it
 * names are held (in_lane) until the loop takes the task back
 * (stage_finish). */
struct stage_task {
    enum task_kind kind; /* TASK_STAGE */
    engine_t *eng;
    const struct stage *st;
    void *op_state; /* the lane's session (the loop's when run in place) */
    struct job **js;
    char *items;
    size_t n;            /* items */
    size_t batch;        /* items [0, batch) go in one statement; the rest alone */
    int64_t alone_until; /* tries alone stop then (ALONE_BUDGET_MS) */
    int final;           /* the stop's last write: every call, at once */
    unsigned char *verdict;
    char (*sqlstate)[16];
    enum charged_rc rc;
    struct charged_error err;
    /* The persist's: its outcomes' texts, and the calls written before
     * them (taken from eng->call_log; those not written go back). */
    char (*reasons)[512];
    char **evidence;
    struct call_entry *calls;
    size_t ncalls;
    enum charged_rc calls_rc;
    struct charged_error calls_err;
};

/* A database stage over a batch of jobs: its statement over the batch (on
 * the lane, with the task's session), apply, which applies one item's
 * result to its job (on the loop), and what becomes of an item alone that
 * the database refuses or another session's lock holds (on the loop). The
 * record and the claim share their refused (stage_dead_letter) and locked
 * (stage_lock_wait), told apart by name and refused_what; the persist
 * turns a refused item into another statement on the lane (review). */
struct stage {
    const char *name;         /* log lines ("stage"), engine_db_failed */
    const char *refused_what; /* stage_dead_letter's "the database refused the %s" */
    size_t item_size;
    enum engine_lane_id lane;
    enum charged_rc (*statement)(struct stage_task *t, void *items, size_t n,
                                 struct charged_error *err);
    void (*apply)(engine_t *eng, struct job *j, const void *item);
    void (*refused)(engine_t *eng, const struct stage *st, struct job *j, void *item,
                    const char *sqlstate);
    void (*locked)(engine_t *eng, const struct stage *st, struct job *j, void *item);
    /* On the lane: item i, refused alone, becomes what review makes of it
     * (ITEM_DONE, ITEM_LOCKED, ITEM_ABANDONED); CHARGED_RETRY when the
     * database failed. NULL: ITEM_REFUSED. */
    enum charged_rc (*review)(struct stage_task *t, size_t i);
};

static void *task_item(const struct stage_task *t, size_t i)
{
    return t->items + i * t->st->item_size;
}

static void task_free(struct stage_task *t)
{
    if (!t)
        return;
    for (size_t i = 0; t->evidence && i < t->n; i++)
        free(t->evidence[i]);
    free(t->evidence);
    free(t->reasons);
    free(t->calls);
    free(t->sqlstate);
    free(t->verdict);
    free(t->items);
    free(t->js);
    free(t);
}

/* A task for up to n items of st; NULL when memory ran out. */
static struct stage_task *task_new(engine_t *eng, const struct stage *st, size_t n)
{
    struct stage_task *t = calloc(1, sizeof(*t));
    size_t m = n ? n : 1;
    if (!t)
        return NULL;
    t->kind = TASK_STAGE;
    t->eng = eng;
    t->st = st;
    t->op_state = eng->op_state;
    t->js = calloc(m, sizeof(*t->js));
    t->items = calloc(m, st->item_size);
    t->verdict = calloc(m, 1);
    t->sqlstate = calloc(m, sizeof(*t->sqlstate));
    if (!t->js || !t->items || !t->verdict || !t->sqlstate) {
        task_free(t);
        return NULL;
    }
    return t;
}

/* On the lane: item i alone, waiting ALONE_LOCK_TIMEOUT at most for a
 * lock (whoever holds it held the batch a whole lock_timeout already). */
static enum charged_rc stage_alone(struct stage_task *t, size_t i)
{
    const struct stage *st = t->st;
    if (clock_now_ms() >= t->alone_until)
        return CHARGED_OK; /* not run: the next batch has it */
    db_lock_timeout_override(ALONE_LOCK_TIMEOUT);
    enum charged_rc rc = st->statement(t, task_item(t, i), 1, &t->err);
    db_lock_timeout_override(NULL);
    switch (rc) {
    case CHARGED_OK:
        t->verdict[i] = ITEM_DONE;
        return CHARGED_OK;
    case CHARGED_BAD_ITEM:
        snprintf(t->sqlstate[i], sizeof(t->sqlstate[i]), "%s", t->err.code);
        if (st->review)
            return st->review(t, i);
        t->verdict[i] = ITEM_REFUSED;
        return CHARGED_OK;
    case CHARGED_WAIT:
        t->verdict[i] = ITEM_LOCKED;
        return CHARGED_OK;
    default:
        return rc;
    }
}

/* On the lane: the m items of one kind (their indexes in idx, copied to
 * scratch) in one statement; when the database refuses one of its values
 * or another session's lock holds one of its rows, each item alone, so
 * that one bad or held item never holds the others. */
static enum charged_rc stage_kind(struct stage_task *t, const size_t *idx,
                                  char *scratch, size_t m)
{
    size_t sz = t->st->item_size;
    enum charged_rc rc = t->st->statement(t, scratch, m, &t->err);
    if (rc == CHARGED_OK) {
        for (size_t i = 0; i < m; i++) {
            memcpy(task_item(t, idx[i]), scratch + i * sz, sz);
            t->verdict[idx[i]] = ITEM_DONE;
        }
        return CHARGED_OK;
    }
    if (rc != CHARGED_BAD_ITEM && rc != CHARGED_WAIT)
        return rc;
    for (size_t i = 0; i < m; i++)
        if ((rc = stage_alone(t, idx[i])) != CHARGED_OK)
            return rc;
    return CHARGED_OK;
}

/* On the lane: the m items of idx, each kind in its own statement, in
 * order: each kind writes its own tables in its own statements, so a
 * failure of one kind's statement after another kind's committed would
 * have the committed ones run again alone (a claim just taken then reads
 * as someone's lease). */
static enum charged_rc stage_run(struct stage_task *t, const size_t *idx, size_t m)
{
    size_t sz = t->st->item_size, ran = 0;
    int kinds = 1;
    enum charged_rc rc = CHARGED_OK;
    if (m == 0)
        return CHARGED_OK;
    for (size_t i = 0; i < m; i++) {
        CHARGED_ASSERT(t->js[idx[i]]->kind >= 0); /* an index of the op's table */
        if (t->js[idx[i]]->kind >= kinds)
            kinds = t->js[idx[i]]->kind + 1;
    }
    size_t *sub = calloc(m, sizeof(*sub));
    char *scratch = calloc(m, sz);
    if (!sub || !scratch) {
        charged_error_set(&t->err, "out of memory");
        rc = CHARGED_RETRY;
    }
    for (int k = 0; k < kinds && rc == CHARGED_OK; k++) {
        size_t mm = 0;
        for (size_t i = 0; i < m; i++)
            if (t->js[idx[i]]->kind == k) {
                sub[mm] = idx[i];
                memcpy(scratch + mm++ * sz, task_item(t, idx[i]), sz);
            }
        if (mm)
            rc = stage_kind(t, sub, scratch, mm);
        ran += mm;
    }
    /* Each item ran in its kind's statement, once. */
    CHARGED_ASSERT(rc != CHARGED_OK || ran == m);
    free(sub);
    free(scratch);
    return rc;
}

/* On the lane: the batch, then the items tried alone (those another
 * session's lock held before: each may wait a lock_timeout). */
static void stage_exec(void *arg)
{
    struct stage_task *t = arg;
    t->alone_until = clock_now_ms() + ALONE_BUDGET_MS;
    size_t *idx = calloc(t->batch ? t->batch : 1, sizeof(*idx));
    if (!idx) {
        charged_error_set(&t->err, "out of memory");
        t->rc = CHARGED_RETRY;
        return;
    }
    for (size_t i = 0; i < t->batch; i++)
        idx[i] = i;
    t->rc = stage_run(t, idx, t->batch);
    free(idx);
    for (size_t h = t->batch; t->rc == CHARGED_OK && h < t->n; h++)
        t->rc = stage_alone(t, h);
}

/* A stage's locked: the job's item met another session's uncommitted
 * change (its statement hit lock_timeout): it alone waits, with a back-off,
 * and tries again. */
static void stage_lock_wait(engine_t *eng, const struct stage *st, struct job *j,
                            void *item)
{
    (void)item;
    CHARGED_ASSERT(st->name != NULL);
    if (engine_core_lock_wait(&eng->core, eng->jobs, j, clock_now_ms()))
        log_warn("attempt held by another session's transaction; trying again shortly",
                 JOB_FIELDS(j), "stage", st->name, NULL);
}

/* A stage's refused: a message the database refuses even on its own is a
 * dead letter, so that its partition moves on. The line names the
 * SQLSTATE, never a value. */
static void stage_dead_letter(engine_t *eng, const struct stage *st, struct job *j,
                              void *item, const char *sqlstate)
{
    (void)item;
    CHARGED_ASSERT(st->refused_what != NULL);
    job_set_error(j, "the database refused the %s (sqlstate %s)", st->refused_what,
                  sqlstate);
    engine_core_dead_letter(eng->jobs, j, DEAD_LETTER_DATABASE_REFUSED);
}

/* The database's state after a stage's turn: a failure that may pass
 * (CHARGED_RETRY) holds the stages back; anything else is an answer. */
static void stage_reported(engine_t *eng, const struct stage *st, enum charged_rc rc,
                           const struct charged_error *err)
{
    CHARGED_ASSERT(st->name != NULL && err != NULL);
    if (rc == CHARGED_RETRY)
        engine_db_failed(eng, st->name, err->message);
    else
        engine_db_ok(eng);
}

/* On the loop: each item's result on its job, in batch order. */
static void stage_finish(engine_t *eng, struct stage_task *t)
{
    const struct stage *st = t->st;
    for (size_t i = 0; i < t->n; i++) {
        CHARGED_ASSERT(t->js[i]->in_lane);
        t->js[i]->in_lane = 0;
    }
    for (size_t i = 0; i < t->n; i++) {
        struct job *j = t->js[i];
        switch ((enum item_verdict)t->verdict[i]) {
        case ITEM_DONE:
            st->apply(eng, j, task_item(t, i));
            break;
        case ITEM_REFUSED:
            st->refused(eng, st, j, task_item(t, i), t->sqlstate[i]);
            break;
        case ITEM_LOCKED:
            st->locked(eng, st, j, task_item(t, i));
            break;
        case ITEM_ABANDONED:
            engine_core_abandoned(eng->jobs, j);
            break;
        case ITEM_NOT_RUN:
            break;
        }
        engine_detach_after_lane(eng, j);
    }
    stage_reported(eng, st, t->rc, &t->err);
}

/* Hands t to its stage's lane: its jobs are the lane's until it ends. */
static void stage_dispatch(engine_t *eng, struct stage_task *t, stage_lane_fn exec)
{
    struct engine_lane *l = &eng->lanes[t->st->lane];
    CHARGED_ASSERT(stage_lane_idle(l->lane));
    for (size_t i = 0; i < t->n; i++) {
        CHARGED_ASSERT(!t->js[i]->in_lane); /* one lane's at a time */
        t->js[i]->in_lane = 1;
    }
    t->op_state = l->op_state;
    stage_lane_run(l->lane, exec, t);
}

int engine_lane_idle(const engine_t *eng, enum engine_lane_id lane)
{
    return !eng->lanes[lane].lane || stage_lane_idle(eng->lanes[lane].lane);
}

/* ---- record ---- */

/* The job holds the record's lease now (engine_core_claimed): on to the
 * provider. */
static void claimed(struct job *j, const char *previous_status)
{
    CHARGED_ASSERT(j->state == JOB_CALL && j->lease_epoch > 0);
    log_debug("attempt claimed", JOB_FIELDS(j), "previous_status", previous_status,
              NULL);
    FAILPOINT("after_claim");
}

static void apply_record(engine_t *eng, struct job *j, const void *item)
{
    const struct engine_record *it = item;
    switch (engine_core_recorded(eng->jobs, j, it->result, it->lease_epoch,
                                 clock_now_ms())) {
    case ENGINE_NEXT_CLAIMED:
        claimed(j, "new");
        break;
    case ENGINE_NEXT_DEAD_LETTER:
        job_set_error(j, "%s", it->reason);
        break;
    case ENGINE_NEXT_REJECTED:
        log_info("attempt rejected before any provider call", JOB_FIELDS(j), "reason",
                 it->reason, NULL);
        metrics_add(outcomes_metric(eng, j), 1, ATTEMPT_S_REJECTED);
        break;
    default:
        break; /* on to the claim, or stays JOB_RECORD */
    }
}

/* The operation's record: each command's record created or read back (a
 * new one claimed with it, under lease_ms). */
static enum charged_rc record_statement(struct stage_task *t, void *items, size_t n,
                                        struct charged_error *err)
{
    return t->eng->op->record(t->op_state, items, n, t->eng->lease_ms, err);
}

static const struct stage record_stage = {
    .name = "record",
    .refused_what = "command",
    .item_size = sizeof(struct engine_record),
    .lane = ENGINE_LANE_RECORD,
    .statement = record_statement,
    .apply = apply_record,
    .refused = stage_dead_letter,
    .locked = stage_lock_wait,
};

static void record_item(struct stage_task *t, size_t i, struct job *j)
{
    struct engine_record *it = task_item(t, i);
    t->js[i] = j;
    it->params = j->params;
    it->command = j->command;
}

void engine_record_attempts(engine_t *eng)
{
    int64_t now = clock_now_ms();
    size_t n = job_list_due(eng->jobs, JOB_RECORD, now), k = 0, held = 0;
    if (n == 0 || !engine_db_ready(eng) || !engine_lane_idle(eng, ENGINE_LANE_RECORD) ||
        batch_gate_due_at(&eng->record_gate, n, now) > now)
        return;
    batch_gate_ran(&eng->record_gate, now);
    struct stage_task *t = task_new(eng, &record_stage, n);
    if (!t)
        return;
    /* Jobs another session's lock held before are tried alone, after the
     * batch and a few a turn: each may wait a lock_timeout. */
    for (int pass = 0; pass < 2; pass++)
        for (struct job *j = job_list_first(eng->jobs, JOB_RECORD); j && k < n;
             j = job_next_in_state(j)) {
            if (j->next_at > now || (j->lock_waits == 0) != (pass == 0))
                continue;
            if (pass == 1) {
                if (held == HELD_PER_TURN)
                    break;
                held++;
            }
            record_item(t, k++, j);
        }
    t->n = k;
    t->batch = k - held;
    CHARGED_ASSERT(t->batch <= t->n && t->n <= n);
    if (t->n == 0) {
        task_free(t);
        return;
    }
    stage_dispatch(eng, t, stage_exec);
}

/* ---- claim ---- */

static void apply_claim(engine_t *eng, struct job *j, const void *item)
{
    const struct engine_claim *it = item;
    switch (engine_core_claim_answered(&eng->core, eng->jobs, j, it->result,
                                       it->lease_epoch, it->key_age_ms,
                                       it->rejected[0] != '\0', clock_now_ms())) {
    case ENGINE_NEXT_CLAIMED:
        claimed(j, it->status);
        break;
    case ENGINE_NEXT_REJECTED:
        log_info("rejected before any provider call", JOB_FIELDS(j), "reason",
                 it->rejected, NULL);
        metrics_add(outcomes_metric(eng, j), 1, ATTEMPT_S_REJECTED);
        break;
    default:
        break; /* settled before, or waits for whoever holds it */
    }
}

/* The operation's claim: each record's lease taken for lease_ms, or what
 * holds it. */
static enum charged_rc claim_statement(struct stage_task *t, void *items, size_t n,
                                       struct charged_error *err)
{
    return t->eng->op->claim(t->op_state, items, n, t->eng->lease_ms, err);
}

static const struct stage claim_stage = {
    .name = "claim",
    .refused_what = "claim",
    .item_size = sizeof(struct engine_claim),
    .lane = ENGINE_LANE_CLAIM,
    .statement = claim_statement,
    .apply = apply_claim,
    .refused = stage_dead_letter,
    .locked = stage_lock_wait,
};

void engine_claim_attempts(engine_t *eng)
{
    int64_t now = clock_now_ms();
    size_t n = 0, k = 0;
    if (!engine_db_ready(eng) || !engine_lane_idle(eng, ENGINE_LANE_CLAIM))
        return;
    n = job_list_count(eng->jobs, JOB_CLAIM) + job_list_due(eng->jobs, JOB_WAIT, now);
    if (n == 0)
        return;
    struct stage_task *t = task_new(eng, &claim_stage, n);
    if (!t)
        return;
    /* Those to claim now, then those whose wait is over. */
    for (int pass = 0; pass < 2; pass++) {
        enum job_state state = pass == 0 ? JOB_CLAIM : JOB_WAIT;
        for (struct job *j = job_list_first(eng->jobs, state), *next; j && k < n;
             j = next) {
            next = job_next_in_state(j);
            if (engine_core_claim_gate(&eng->core, eng->jobs, j, now) !=
                ENGINE_NEXT_SEND)
                continue;
            struct engine_claim *it = task_item(t, k);
            t->js[k++] = j;
            it->id = j->id;
            it->kind = j->kind;
            it->params = j->params;
        }
    }
    CHARGED_ASSERT(k <= n); /* the batch never outgrows what was counted */
    t->n = t->batch = k;
    if (k == 0) {
        task_free(t);
        return;
    }
    stage_dispatch(eng, t, stage_exec);
}

void engine_release_lease(engine_t *eng, struct job *j)
{
    /* Only a lease we took is released, under its epoch. */
    CHARGED_ASSERT(j->have_cmd && j->lease_epoch > 0);
    struct charged_error err;
    if (eng->op->release_leases(eng->op_state, &j->id, &j->kind, &j->lease_epoch, 1,
                                &err) != CHARGED_OK)
        log_warn("could not release lease; it will expire", JOB_FIELDS(j), "error",
                 err.message, NULL);
}

/* ---- the call log ---- */

/* Bounded: past CALL_LOG_MAX waiting entries (a long database outage) new
 * ones are kept in the log line only, and counted. */
void engine_log_call(engine_t *eng, struct job *j, const struct provider_result *res)
{
    CHARGED_ASSERT(j->have_cmd && j->calls > 0);
    if (eng->call_log_len >= CALL_LOG_MAX) {
        if (eng->call_log_dropped++ % 1000 == 0)
            log_warn("provider call log full; calls kept in log lines only",
                     JOB_FIELDS(j), NULL);
        return;
    }
    if (eng->call_log_len == eng->call_log_cap) {
        size_t ncap = eng->call_log_cap ? eng->call_log_cap * 2 : 64;
        struct call_entry *c = realloc(eng->call_log, ncap * sizeof(*c));
        if (!c)
            return; /* the call stays in the log line only */
        eng->call_log = c;
        eng->call_log_cap = ncap;
    }
    struct call_entry *e = &eng->call_log[eng->call_log_len];
    snprintf(e->id, sizeof(e->id), "%s", j->id);
    e->kind = j->kind;
    e->id_field = job_id_field(j);
    snprintf(e->order_id, sizeof(e->order_id), "%s", j->order_id);
    snprintf(e->traceparent, sizeof(e->traceparent), "%s", j->traceparent);
    e->started_ms = j->call_started_ms;
    e->res = *res;
    e->lock_waits = 0;
    e->written_maybe = 0;
    e->next_at = 0;
    eng->call_log_len++;
    CHARGED_ASSERT(eng->call_log_len <= eng->call_log_cap);
}

static enum charged_rc log_calls_batch(struct stage_task *t,
                                       struct call_entry *const *e, size_t n,
                                       struct charged_error *err)
{
    CHARGED_ASSERT(n > 0);
    struct engine_call *calls = calloc(n, sizeof(*calls));
    if (!calls) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    for (size_t i = 0; i < n; i++) {
        calls[i].id = e[i]->id;
        calls[i].kind = e[i]->kind;
        calls[i].started_ms = e[i]->started_ms;
        calls[i].res = &e[i]->res;
        calls[i].written_maybe = e[i]->written_maybe;
    }
    enum charged_rc rc = t->eng->op->log_calls(t->op_state, calls, n, err);
    for (size_t i = 0; rc == CHARGED_RETRY && i < n; i++)
        e[i]->written_maybe = 1;
    free(calls);
    return rc;
}

/* One call entry alone: written (or refused, and dropped with a log line:
 * CHARGED_OK), held by another session's lock (kept, with a back-off:
 * CHARGED_WAIT), or the database failed (CHARGED_RETRY). */
static enum charged_rc log_call_alone(struct stage_task *t, struct call_entry *e,
                                      struct charged_error *err)
{
    const struct engine_core *core = &t->eng->core;
    db_lock_timeout_override(ALONE_LOCK_TIMEOUT);
    enum charged_rc rc = log_calls_batch(t, &e, 1, err);
    db_lock_timeout_override(NULL);
    if (rc == CHARGED_RETRY)
        return CHARGED_RETRY;
    if (rc == CHARGED_WAIT) {
        e->lock_waits++;
        e->next_at = clock_now_ms() + retry_backoff_ms(core->policy.retry_base_ms,
                                                       core->policy.retry_max_ms,
                                                       e->lock_waits, 0);
        return CHARGED_WAIT;
    }
    if (rc == CHARGED_BAD_ITEM)
        log_error("provider call not recorded: the database refused it", e->id_field,
                  e->id, "order_id", e->order_id, "traceparent",
                  e->traceparent[0] ? e->traceparent : NULL, "sqlstate", err->code,
                  NULL);
    return CHARGED_OK;
}

/* On the lane (or the loop, at the end): writes the task's provider calls,
 * keeping in t->calls those not written. CHARGED_OK when nothing is left
 * but calls another session's lock holds (a foreign-key check waits on a
 * row locked FOR UPDATE): those are tried again alone, HELD_PER_TURN at
 * most a turn, after a back-off, and hold nothing else up (their attempts'
 * own outcomes wait on the same lock). CHARGED_RETRY when the database
 * could not take them now (then nothing else is written either: the outage
 * is the same). A row the database refuses on its own is dropped with a
 * log line. */
static enum charged_rc calls_write(struct stage_task *t)
{
    struct charged_error *err = &t->calls_err;
    size_t n = t->ncalls, nfresh = 0, held_tries = 0, kept = 0;
    int64_t now = clock_now_ms();
    enum charged_rc rc = CHARGED_OK;
    if (n == 0)
        return CHARGED_OK;
    struct call_entry **fresh = calloc(n, sizeof(*fresh));
    char *done = calloc(n, 1);
    if (!fresh || !done) {
        free(fresh);
        free(done);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    /* One batch per kind: a kind's statement that fails after another
     * kind's committed must not have those written again. A kind's batch
     * not run (CHARGED_RETRY) leaves its entries for the next flush. */
    int kinds = 1;
    enum charged_rc brc[8];
    for (size_t i = 0; i < n; i++)
        if (t->calls[i].kind >= kinds)
            kinds = t->calls[i].kind + 1;
    if (kinds > (int)(sizeof(brc) / sizeof(brc[0]))) {
        rc = CHARGED_RETRY;
        charged_error_set(err, "provider calls of %d kinds", kinds);
        goto out;
    }
    for (int k = 0; k < kinds; k++)
        brc[k] = CHARGED_RETRY;
    for (int k = 0; k < kinds && rc == CHARGED_OK; k++) {
        nfresh = 0;
        for (size_t i = 0; i < n; i++)
            if (t->calls[i].lock_waits == 0 && t->calls[i].kind == k)
                fresh[nfresh++] = &t->calls[i];
        brc[k] = nfresh ? log_calls_batch(t, fresh, nfresh, err) : CHARGED_OK;
        if (brc[k] == CHARGED_RETRY)
            rc = CHARGED_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        done[i] = t->calls[i].lock_waits == 0 && brc[t->calls[i].kind] == CHARGED_OK;
    for (size_t i = 0; i < n && rc == CHARGED_OK; i++) {
        struct call_entry *e = &t->calls[i];
        enum charged_rc alone;
        if (done[i])
            continue;
        /* At the stop every call is tried, whatever its back-off: there is
         * no later turn (an outside attack: a call held a moment before
         * was left out of provider_calls). */
        if (!t->final && (clock_now_ms() >= t->alone_until ||
                          (e->lock_waits > 0 &&
                           (e->next_at > now || held_tries++ >= HELD_PER_TURN))))
            continue;
        if ((alone = log_call_alone(t, e, err)) == CHARGED_RETRY) {
            rc = CHARGED_RETRY;
            break;
        }
        done[i] = alone == CHARGED_OK;
    }
out:
    for (size_t i = 0; i < n; i++)
        if (!done[i])
            t->calls[kept++] = t->calls[i];
    t->ncalls = kept;
    CHARGED_ASSERT(kept <= n);
    free(fresh);
    free(done);
    return rc;
}

/* Moves the waiting calls into t (the loop's log is empty after). */
static void calls_take(engine_t *eng, struct stage_task *t)
{
    CHARGED_ASSERT(t->calls == NULL);
    t->calls = eng->call_log;
    t->ncalls = eng->call_log_len;
    eng->call_log = NULL;
    eng->call_log_len = eng->call_log_cap = 0;
}

/* The calls t did not write go back to the loop's log, before those logged
 * since: nothing is lost, and CALL_LOG_MAX only bounds new ones. */
static void calls_give_back(engine_t *eng, struct stage_task *t)
{
    if (t->ncalls == 0)
        return;
    size_t n = t->ncalls + eng->call_log_len;
    struct call_entry *c = realloc(t->calls, n * sizeof(*c));
    if (!c) {
        log_error("out of memory: provider calls kept in log lines only", NULL);
        return;
    }
    if (eng->call_log_len)
        memcpy(c + t->ncalls, eng->call_log, eng->call_log_len * sizeof(*c));
    free(eng->call_log);
    eng->call_log = c;
    eng->call_log_len = eng->call_log_cap = n;
    t->calls = NULL;
    t->ncalls = 0;
}

/* ---- persist ---- */

static void apply_persist(engine_t *eng, struct job *j, const void *item)
{
    const struct engine_outcome *o = item;
    int first_busy;
    switch (engine_core_persisted(&eng->core, eng->jobs, j, o->lease_epoch,
                                  o->persisted, o->busy, &first_busy, clock_now_ms())) {
    case ENGINE_NEXT_BUSY:
        /* Another session holds the row: this job waits, its lease
         * renewed, and no other outcome waits with it. */
        if (first_busy)
            log_warn("attempt locked by another session; persisting it again shortly",
                     JOB_FIELDS(j), "outcome", provider_outcome_name(j->res.outcome),
                     NULL);
        break;
    case ENGINE_NEXT_FENCED:
        /* Fenced out: someone took the attempt over; its result wins. */
        log_warn("lease lost before persisting; result dropped", JOB_FIELDS(j),
                 "outcome", provider_outcome_name(j->res.outcome), NULL);
        break;
    default:
        metrics_add(outcomes_metric(eng, j), 1, o->status);
        log_info("attempt settled", JOB_FIELDS(j), "status", o->status, "reason",
                 o->reason, "provider_payment_id",
                 j->res.provider_payment_id[0] ? j->res.provider_payment_id : NULL,
                 NULL);
        break;
    }
}

/* The operation's persist: each outcome written under its claim's epoch. */
static enum charged_rc persist_statement(struct stage_task *t, void *items, size_t n,
                                         struct charged_error *err)
{
    return t->eng->op->persist(t->op_state, items, n, err);
}

/* On the lane: the database refused this outcome even alone (a value from
 * the provider it cannot store). The attempt may have been charged, so it
 * is never FAILED: REQUIRES_REVIEW, with nothing from outside but the
 * outcome's name. If even that is refused, the job ends and the lease is
 * left to expire; a later owner or the reconciler takes the attempt from
 * there. */
static enum charged_rc persist_review(struct stage_task *t, size_t i)
{
    struct job *j = t->js[i];
    const char *sqlstate = t->sqlstate[i];
    CHARGED_ASSERT(j->state == JOB_PERSIST && j->lease_epoch > 0);
    char evidence[160];
    snprintf(t->reasons[i], sizeof(t->reasons[i]),
             "requires_review: the database refused the outcome '%s' (sqlstate %s)",
             provider_outcome_name(j->res.outcome), sqlstate);
    snprintf(evidence, sizeof(evidence), "{\"outcome\":\"%s\",\"http_status\":%d}",
             provider_outcome_name(j->res.outcome), j->res.http_status);
    free(t->evidence[i]);
    if (!(t->evidence[i] = strdup(evidence))) {
        charged_error_set(&t->err, "out of memory");
        return CHARGED_RETRY;
    }
    struct engine_outcome *o = task_item(t, i);
    *o = (struct engine_outcome){
        .id = j->id,
        .lease_epoch = j->lease_epoch,
        .status = "REQUIRES_REVIEW",
        .reason = t->reasons[i],
        .kind = j->kind,
        .event_type = t->eng->op->event_type(j->kind, ATTEMPT_STATUS_REQUIRES_REVIEW),
        .evidence_json = t->evidence[i],
        .calls = j->calls,
        .next_check_ms = -1,
    };
    log_error("the database refused an outcome; settling it for review", JOB_FIELDS(j),
              "outcome", provider_outcome_name(j->res.outcome), "sqlstate", sqlstate,
              NULL);
    enum charged_rc rc = persist_statement(t, o, 1, &t->err);
    switch (rc) {
    case CHARGED_OK:
        t->verdict[i] = ITEM_DONE;
        return CHARGED_OK;
    case CHARGED_BAD_ITEM:
        log_error("the database refused the review outcome too; lease left to expire",
                  JOB_FIELDS(j), "sqlstate", t->err.code, NULL);
        t->verdict[i] = ITEM_ABANDONED;
        return CHARGED_OK;
    case CHARGED_WAIT:
        t->verdict[i] = ITEM_LOCKED;
        return CHARGED_OK;
    default:
        return rc;
    }
}

/* Held, as a locked row is: it waits, the rest goes on. */
static void persist_locked(engine_t *eng, const struct stage *st, struct job *j,
                           void *item)
{
    (void)st;
    struct engine_outcome *o = item;
    o->busy = 1;
    apply_persist(eng, j, o);
}

/* A refused outcome is settled for review, never dead-lettered: the
 * attempt may have been charged. */
static const struct stage persist_stage = {
    .name = "persist",
    .item_size = sizeof(struct engine_outcome),
    .lane = ENGINE_LANE_PERSIST,
    .statement = persist_statement,
    .apply = apply_persist,
    .locked = persist_locked,
    .review = persist_review,
};

/* On the lane: the calls first (support must see every call of a settled
 * attempt, and if the database cannot take them it cannot take outcomes
 * now), then the outcomes whose calls are all written. */
static void persist_exec(void *arg)
{
    struct stage_task *t = arg;
    t->alone_until = clock_now_ms() + ALONE_BUDGET_MS;
    t->calls_rc = calls_write(t);
    if (t->calls_rc != CHARGED_OK || t->n == 0)
        return;
    size_t *idx = calloc(t->n, sizeof(*idx)), m = 0;
    if (!idx) {
        charged_error_set(&t->err, "out of memory");
        t->rc = CHARGED_RETRY;
        return;
    }
    /* An outcome whose call waits to be written (another session's lock
     * holds its row) waits with it: no attempt is seen settled without its
     * calls. */
    for (size_t i = 0; i < t->n; i++) {
        const struct engine_outcome *o = task_item(t, i);
        int pending = 0;
        for (size_t c = 0; c < t->ncalls && !pending; c++)
            pending = t->calls[c].kind == o->kind && !strcmp(t->calls[c].id, o->id);
        if (!pending)
            idx[m++] = i;
    }
    t->rc = stage_run(t, idx, m);
    free(idx);
}

static void persist_finish(engine_t *eng, struct stage_task *t)
{
    calls_give_back(eng, t);
    if (t->calls_rc != CHARGED_OK) {
        for (size_t i = 0; i < t->n; i++) {
            t->js[i]->in_lane = 0;
            engine_detach_after_lane(eng, t->js[i]);
        }
        engine_db_failed(eng, "log provider calls", t->calls_err.message);
        return;
    }
    size_t ran = 0;
    for (size_t i = 0; i < t->n; i++)
        ran += t->verdict[i] != ITEM_NOT_RUN;
    stage_finish(eng, t);
    if (t->rc != CHARGED_RETRY && ran > 0)
        FAILPOINT("after_persist");
}

/* A persist task of the waiting calls alone. */
static struct stage_task *calls_task(engine_t *eng)
{
    struct stage_task *t = task_new(eng, &persist_stage, 0);
    if (t)
        calls_take(eng, t);
    return t;
}

enum charged_rc engine_flush_call_log(engine_t *eng)
{
    if (eng->call_log_len == 0)
        return CHARGED_OK;
    /* In place, on the loop's own session: the lanes have ended (the
     * stop), and a call that took money must not wait for the next turn.
     * Whatever the database's back-off: a lane's failure just applied
     * (a renewal at its timeout) says nothing of this session, and this is
     * the last try (an outside attack: the row of a charge missing). */
    CHARGED_ASSERT(engine_lane_idle(eng, ENGINE_LANE_PERSIST));
    struct stage_task *t = calls_task(eng);
    if (!t)
        return CHARGED_RETRY;
    t->final = 1;
    persist_exec(t);
    enum charged_rc rc = t->calls_rc;
    for (size_t i = 0; i < t->ncalls; i++)
        log_error("provider call not recorded at the stop: another session holds its "
                  "row; this line is its record",
                  t->calls[i].id_field, t->calls[i].id, "order_id",
                  t->calls[i].order_id, "traceparent",
                  t->calls[i].traceparent[0] ? t->calls[i].traceparent : NULL, NULL);
    persist_finish(eng, t);
    task_free(t);
    return rc;
}

void engine_flush_calls_due(engine_t *eng)
{
    int64_t now = clock_now_ms();
    if (eng->call_log_len == 0 || !engine_db_ready(eng) ||
        !engine_lane_idle(eng, ENGINE_LANE_PERSIST) ||
        batch_gate_due_at(&eng->persist_gate, eng->call_log_len, now) > now)
        return;
    batch_gate_ran(&eng->persist_gate, now);
    struct stage_task *t = calls_task(eng);
    if (t)
        stage_dispatch(eng, t, persist_exec);
}

void engine_persist_outcomes(engine_t *eng)
{
    int64_t now = clock_now_ms();
    size_t n = job_list_due(eng->jobs, JOB_PERSIST, now), k = 0;
    if (n == 0 || !engine_db_ready(eng) ||
        !engine_lane_idle(eng, ENGINE_LANE_PERSIST) ||
        batch_gate_due_at(&eng->persist_gate, n, now) > now)
        return;
    batch_gate_ran(&eng->persist_gate, now);
    struct stage_task *t = task_new(eng, &persist_stage, n);
    if (!t || !(t->reasons = calloc(n, sizeof(*t->reasons))) ||
        !(t->evidence = calloc(n, sizeof(*t->evidence)))) {
        task_free(t);
        return;
    }
    for (struct job *j = job_list_first(eng->jobs, JOB_PERSIST); j && k < n;
         j = job_next_in_state(j)) {
        if (j->next_at > now)
            continue;
        CHARGED_ASSERT(j->lease_epoch > 0); /* an outcome only under our claim */
        struct engine_outcome *o = task_item(t, k);
        const struct answer_decision *d = &j->decision;
        t->js[k] = j;
        /* The operation's decision, and what it says of the answer. */
        t->evidence[k] = eng->op->outcome(j->kind, &j->res, d, j->calls, t->reasons[k],
                                          sizeof(t->reasons[k]), &o->provider_id);
        o->status = attempt_status_name(d->status);
        o->event_type = d->event_type;
        o->next_check_ms = d->next_check_ms;
        o->id = j->id;
        o->kind = j->kind;
        o->lease_epoch = j->lease_epoch;
        o->reason = t->reasons[k][0] ? t->reasons[k] : NULL;
        o->evidence_json = t->evidence[k];
        o->calls = j->calls;
        o->last_error = j->res.error[0] ? j->res.error : NULL;
        k++;
    }
    CHARGED_ASSERT(k <= n); /* the batch never outgrows what was counted */
    t->n = t->batch = k;
    calls_take(eng, t);
    stage_dispatch(eng, t, persist_exec);
}

/* ---- upkeep: leases and waits, on the persist lane ---- */

/* A renewal or a write of waits, on the persist lane: both lock rows of
 * our claims (skipping those another session holds) for their statement,
 * and an outcome written beside them on another session waited for those
 * locks (an outside attack: 4-15 persists of 1,500 found "busy" by a
 * renewal a second). One lane, one statement at a time: none waits. It names its jobs
 * by copies of their ids and claims' epochs, never by pointer: the jobs go on meanwhile
 * (an answer, a persist) and may end before it does; the loop finds those still there
 * when it takes the task back. */
struct upkeep_task {
    enum task_kind kind; /* TASK_UPKEEP */
    engine_t *eng;
    void *op_state; /* the lane's */
    int renew;      /* else the waits */
    size_t n;
    char **ids;
    int *kinds;
    int64_t *epochs;
    int *ours;               /* renew: still ours */
    struct store_wait *w;    /* waits: what is written */
    enum job_waiting *wants; /* waits: the same, as the job says it */
    enum charged_rc rc;
    struct charged_error err;
};

static void upkeep_free(struct upkeep_task *t)
{
    if (!t)
        return;
    for (size_t i = 0; t->ids && i < t->n; i++)
        free(t->ids[i]);
    free(t->ids);
    free(t->kinds);
    free(t->epochs);
    free(t->ours);
    free(t->w);
    free(t->wants);
    free(t);
}

static struct upkeep_task *upkeep_new(engine_t *eng, int renew, size_t n)
{
    struct upkeep_task *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    t->kind = TASK_UPKEEP;
    t->eng = eng;
    t->renew = renew;
    t->ids = calloc(n, sizeof(*t->ids));
    t->kinds = calloc(n, sizeof(*t->kinds));
    t->epochs = calloc(n, sizeof(*t->epochs));
    t->ours = calloc(n, sizeof(*t->ours));
    if (!renew) {
        t->w = calloc(n, sizeof(*t->w));
        t->wants = calloc(n, sizeof(*t->wants));
    }
    if (!t->ids || !t->kinds || !t->epochs || !t->ours ||
        (!renew && (!t->w || !t->wants))) {
        upkeep_free(t);
        return NULL;
    }
    return t;
}

/* Adds j to t (0), or -1 when memory ran out. */
static int upkeep_add(struct upkeep_task *t, const struct job *j)
{
    CHARGED_ASSERT(j->lease_epoch > 0); /* a claim of ours */
    size_t k = t->n;
    if (!(t->ids[k] = strdup(j->id)))
        return -1;
    t->kinds[k] = j->kind;
    t->epochs[k] = j->lease_epoch;
    t->n++;
    return 0;
}

/* On the lane. One statement each, no transaction: nothing is held across
 * a call. */
static void upkeep_exec(void *arg)
{
    struct upkeep_task *t = arg;
    const struct engine_op *op = t->eng->op;
    if (t->renew)
        t->rc = op->renew(t->op_state, (const char *const *)t->ids, t->kinds, t->epochs,
                          t->n, t->eng->lease_ms, t->ours, &t->err);
    else
        t->rc = op->wait(t->op_state, t->w, t->n, &t->err);
}

static const enum job_state claimed_states[] = {JOB_CALL, JOB_CALLING, JOB_PERSIST,
                                                JOB_PARKED};
#define NCLAIMED (sizeof(claimed_states) / sizeof(claimed_states[0]))

/* The job of entry i, if it still holds that claim and no lane holds it. */
static struct job *upkeep_job(engine_t *eng, const struct upkeep_task *t, size_t i)
{
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]); j;
             j = job_next_in_state(j))
            if (!j->in_lane && j->kind == t->kinds[i] &&
                j->lease_epoch == t->epochs[i] && !strcmp(j->id, t->ids[i]))
                return j;
    return NULL;
}

static void renew_finish(engine_t *eng, struct upkeep_task *t)
{
    int64_t now = clock_now_ms();
    if (t->rc != CHARGED_OK) {
        engine_db_failed(eng, "renew leases", t->err.message);
        return;
    }
    for (size_t i = 0; i < t->n; i++) {
        struct job *j;
        if (t->ours[i] || !(j = upkeep_job(eng, t, i)))
            continue; /* renewed, or the claim ended meanwhile */
        log_warn("lease lost", JOB_FIELDS(j), NULL);
        engine_core_lease_lost(&eng->core, eng->jobs, j, now);
        /* Not sent: it looks again (WAIT) or ends; either way it stops
         * asking the budget, and a ticket kept would hold back every lower
         * priority for as long (a new claim asks from a new one). */
        budget_member_forget(eng->budget, &j->budget);
    }
}

static void waits_finish(engine_t *eng, struct upkeep_task *t)
{
    if (t->rc != CHARGED_OK) {
        engine_db_failed(eng, "write waits", t->err.message);
        return;
    }
    str_index_t *by_id = str_index_new(t->n);
    if (!by_id)
        return; /* written; the jobs write it again, as still due */
    for (size_t i = 0; i < t->n; i++) {
        int full = str_index_add(by_id, t->ids[i], (int)i);
        CHARGED_ASSERT(!full); /* one entry an item */
    }
    /* What each record shows now, for the jobs that still hold the claim
     * it was written under. */
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]); j;
             j = job_next_in_state(j))
            for (int e = str_index_find(by_id, j->id); e >= 0;
                 e = str_index_next(by_id, e)) {
                size_t i = (size_t)str_index_value(by_id, e);
                if (t->kinds[i] != j->kind || t->epochs[i] != j->lease_epoch)
                    continue;
                eng->waits_shown += t->wants[i] != JOB_WAITING_NONE;
                eng->waits_shown -= j->wait_shown != JOB_WAITING_NONE;
                j->wait_shown = t->wants[i];
                j->wait_shown_since_ms = t->w[i].since_ms;
                j->wait_shown_epoch = t->epochs[i];
            }
    str_index_free(by_id);
}

static void upkeep_dispatch(engine_t *eng, struct upkeep_task *t)
{
    struct engine_lane *l = &eng->lanes[ENGINE_LANE_PERSIST];
    eng->upkeep_out = 1;
    t->op_state = l->op_state;
    stage_lane_run(l->lane, upkeep_exec, t);
}

/* Extends the leases of claims we still work on. */
void engine_renew_leases(engine_t *eng)
{
    int64_t now = clock_now_ms();
    size_t n = 0;
    if (now - eng->last_renew_ms < eng->lease_ms / 3 || !engine_db_ready(eng) ||
        !engine_lane_idle(eng, ENGINE_LANE_PERSIST))
        return;
    eng->last_renew_ms = now;
    for (size_t s = 0; s < NCLAIMED; s++)
        n += job_list_count(eng->jobs, claimed_states[s]);
    if (n == 0)
        return;
    struct upkeep_task *t = upkeep_new(eng, 1, n);
    if (!t)
        return;
    /* An outcome a lane writes now is not renewed: if it settled, nothing
     * is left to renew; if not, the next renewal has it. */
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]); j;
             j = job_next_in_state(j))
            if (!j->in_lane && upkeep_add(t, j) != 0) {
                upkeep_free(t);
                return;
            }
    CHARGED_ASSERT(t->n <= n);
    if (t->n == 0) {
        upkeep_free(t);
        return;
    }
    upkeep_dispatch(eng, t);
}

/* ---- waits ---- */

void engine_write_waits(engine_t *eng)
{
    size_t n = 0;
    /* Nothing waits and no record says so: the common case costs nothing. */
    if (!eng->op->wait ||
        (job_list_count(eng->jobs, JOB_PARKED) == 0 && eng->waits_shown == 0 &&
         eng->waits_paced == 0) ||
        !engine_db_ready(eng) || !engine_lane_idle(eng, ENGINE_LANE_PERSIST))
        return;
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]); j;
             j = job_next_in_state(j))
            n += !j->in_lane && engine_core_wait_due(j);
    if (n == 0)
        return;
    struct upkeep_task *t = upkeep_new(eng, 0, n);
    if (!t)
        return;
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]);
             j && t->n < n; j = job_next_in_state(j)) {
            if (j->in_lane || !engine_core_wait_due(j))
                continue;
            size_t k = t->n;
            if (upkeep_add(t, j) != 0) {
                upkeep_free(t);
                return;
            }
            t->wants[k] = j->wait_want;
            t->w[k] = (struct store_wait){t->ids[k], j->kind, j->lease_epoch,
                                          engine_core_waiting_name(j->wait_want),
                                          j->wait_since_ms};
        }
    CHARGED_ASSERT(t->n == n);
    upkeep_dispatch(eng, t);
}

/* ---- the lanes ---- */

/* Applies a lane's ended task on the loop, and frees it. */
static void task_finish(engine_t *eng, enum engine_lane_id lane, void *task)
{
    if (*(const enum task_kind *)task == TASK_UPKEEP) {
        struct upkeep_task *u = task;
        eng->upkeep_out = 0;
        if (u->renew)
            renew_finish(eng, u);
        else
            waits_finish(eng, u);
        upkeep_free(u);
        return;
    }
    struct stage_task *t = task;
    if (lane == ENGINE_LANE_PERSIST)
        persist_finish(eng, t);
    else
        stage_finish(eng, t);
    task_free(t);
}

void engine_lanes_upkeep_wait(engine_t *eng)
{
    stage_lane_t *l = eng->lanes[ENGINE_LANE_PERSIST].lane;
    void *t;
    if (eng->upkeep_out && l && (t = stage_lane_wait(l)))
        task_finish(eng, ENGINE_LANE_PERSIST, t);
    CHARGED_ASSERT(!eng->upkeep_out);
}

void engine_lanes_collect(engine_t *eng, int all)
{
    for (int i = 0; i < ENGINE_LANES; i++) {
        stage_lane_t *l = eng->lanes[i].lane;
        void *t = !l ? NULL : all ? stage_lane_wait(l) : stage_lane_take(l);
        if (t)
            task_finish(eng, (enum engine_lane_id)i, t);
    }
}

void engine_lanes_sleep(engine_t *eng, int ms)
{
    struct pollfd p = {.fd = eng->lane_wake[0], .events = POLLIN};
    CHARGED_ASSERT(eng->lane_wake_open && ms >= 0);
    if (poll(&p, 1, ms) < 0 && errno != EINTR)
        log_warn("poll of the lanes' pipe failed", "error", strerror(errno), NULL);
}

/* Non-blocking both ways: a full pipe already wakes the loop, and a lane
 * must never block writing to it. */
static enum charged_rc lanes_pipe(engine_t *eng, struct charged_error *err)
{
    if (pipe(eng->lane_wake) != 0) {
        charged_error_set(err, "cannot make the lanes' pipe: %s", strerror(errno));
        return CHARGED_RETRY;
    }
    eng->lane_wake_open = 1;
    for (int i = 0; i < 2; i++)
        if (fcntl(eng->lane_wake[i], F_SETFL, O_NONBLOCK) != 0 ||
            fcntl(eng->lane_wake[i], F_SETFD, FD_CLOEXEC) != 0) {
            charged_error_set(err, "cannot set up the lanes' pipe: %s",
                              strerror(errno));
            return CHARGED_RETRY;
        }
    return CHARGED_OK;
}

enum charged_rc engine_lanes_open(engine_t *eng, struct charged_error *err)
{
    if (lanes_pipe(eng, err) != CHARGED_OK)
        return CHARGED_RETRY;
    static const char *const names[ENGINE_LANES] = {"lane-record", "lane-claim",
                                                    "lane-persist"};
    for (int i = 0; i < ENGINE_LANES; i++) {
        struct engine_lane *l = &eng->lanes[i];
        if (!(l->op_state = eng->op->open(eng->cfg, eng->id, err)) ||
            !(l->lane = stage_lane_new(names[i], eng->lane_wake[1], err)))
            return CHARGED_RETRY;
    }
    return CHARGED_OK;
}

void engine_lanes_close(engine_t *eng)
{
    for (int i = 0; i < ENGINE_LANES; i++) {
        struct engine_lane *l = &eng->lanes[i];
        if (l->lane) {
            /* A task still in hand (a failed start, a teardown): its jobs
             * are freed next, unapplied; their messages are not committed. */
            void *t = stage_lane_wait(l->lane);
            if (t && *(const enum task_kind *)t == TASK_UPKEEP) {
                upkeep_free(t);
            } else {
                if (t && i == ENGINE_LANE_PERSIST)
                    calls_give_back(eng, t);
                task_free(t);
            }
            stage_lane_free(l->lane);
        }
        if (l->op_state)
            eng->op->close(l->op_state);
        l->lane = NULL;
        l->op_state = NULL;
    }
    if (eng->lane_wake_open) {
        close(eng->lane_wake[0]);
        close(eng->lane_wake[1]);
        eng->lane_wake_open = 0;
    }
}
