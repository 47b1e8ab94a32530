#include "engine_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "clock.h"
#include "db.h"
#include "log.h"
#include "metrics.h"

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

/* A database stage over a batch of jobs: its statement over the batch,
 * apply, which applies one item's result to its job, and what becomes of
 * an item alone that the database refuses (CHARGED_BAD_ITEM) or another
 * session's lock holds (CHARGED_WAIT). Each returns the charged_rc the
 * stage goes on with. The record and the claim share their refused
 * (stage_dead_letter) and locked (stage_lock_wait), told apart by name and
 * refused_what. */
struct stage {
    const char *name;         /* log lines ("stage"), engine_db_failed */
    const char *refused_what; /* stage_dead_letter's "the database refused the %s" */
    size_t item_size;
    enum charged_rc (*statement)(engine_t *eng, void *items, size_t n,
                                 struct charged_error *err);
    void (*apply)(engine_t *eng, struct job *j, const void *item);
    enum charged_rc (*refused)(engine_t *eng, const struct stage *st, struct job *j,
                               void *item, struct charged_error *err);
    enum charged_rc (*locked)(engine_t *eng, const struct stage *st, struct job *j,
                              void *item);
};

/* The statement over the batch, then, when it succeeded, each item's
 * result on its job. */
static enum charged_rc stage_batch(engine_t *eng, const struct stage *st,
                                   struct job **js, void *items, size_t n,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(n > 0 && st->item_size > 0);
    CHARGED_ASSERT(st->statement != NULL && st->apply != NULL);
    enum charged_rc rc = st->statement(eng, items, n, err);
    for (size_t i = 0; rc == CHARGED_OK && i < n; i++)
        st->apply(eng, js[i], (const char *)items + i * st->item_size);
    return rc;
}

static enum charged_rc stage_alone(engine_t *eng, const struct stage *st,
                                   struct job **j, void *item,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(st->item_size > 0 && *j != NULL);
    db_lock_timeout_override(ALONE_LOCK_TIMEOUT);
    enum charged_rc rc = stage_batch(eng, st, j, item, 1, err);
    db_lock_timeout_override(NULL);
    if (rc == CHARGED_BAD_ITEM)
        rc = st->refused(eng, st, *j, item, err);
    if (rc == CHARGED_WAIT)
        rc = st->locked(eng, st, *j, item);
    return rc;
}

/* The batch in one statement; when the database refuses one of its values
 * or another session's lock holds one of its rows, each item alone, so that
 * one bad or held item never holds the others. */
static enum charged_rc stage_run_kind(engine_t *eng, const struct stage *st,
                                      struct job **js, void *items, size_t n,
                                      struct charged_error *err)
{
    enum charged_rc rc = n ? stage_batch(eng, st, js, items, n, err) : CHARGED_OK;
    CHARGED_ASSERT(st->item_size > 0);
    if (rc != CHARGED_BAD_ITEM && rc != CHARGED_WAIT)
        return rc;
    for (size_t i = 0; i < n; i++) {
        rc = stage_alone(eng, st, &js[i], (char *)items + i * st->item_size, err);
        if (rc != CHARGED_OK)
            break;
    }
    return rc;
}

/* The largest kind among n jobs (0 for an operation of one kind). */
static int max_kind(struct job *const *js, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++) {
        CHARGED_ASSERT(js[i]->kind >= 0); /* a kind is an index of the op's table */
        if (js[i]->kind > k)
            k = js[i]->kind;
    }
    return k;
}

/* stage_run_kind over each kind's items apart, in batch order: each kind
 * writes its own tables in its own statements, so a failure of one kind's
 * statement after another kind's committed would have the committed ones
 * run again alone (a claim just taken then reads as someone's lease). */
static enum charged_rc stage_run(engine_t *eng, const struct stage *st, struct job **js,
                                 void *items, size_t n, struct charged_error *err)
{
    int kinds = max_kind(js, n) + 1;
    enum charged_rc rc = CHARGED_OK;
    if (kinds == 1)
        return stage_run_kind(eng, st, js, items, n, err);
    struct job **sjs = calloc(n, sizeof(*sjs));
    char *sitems = calloc(n, st->item_size);
    if (!sjs || !sitems) {
        charged_error_set(err, "out of memory");
        rc = CHARGED_RETRY;
    }
    size_t ran = 0;
    for (int k = 0; k < kinds && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (js[i]->kind == k) {
                sjs[m] = js[i];
                memcpy(sitems + m++ * st->item_size, (char *)items + i * st->item_size,
                       st->item_size);
            }
        rc = stage_run_kind(eng, st, sjs, sitems, m, err);
        ran += m;
    }
    /* Each item ran in its kind's statement, once. */
    CHARGED_ASSERT(rc != CHARGED_OK || ran == n);
    free(sjs);
    free(sitems);
    return rc;
}

/* A stage's locked: the job's item met another session's uncommitted
 * change (its statement hit lock_timeout): it alone waits, with a back-off,
 * and tries again. */
static enum charged_rc stage_lock_wait(engine_t *eng, const struct stage *st,
                                       struct job *j, void *item)
{
    (void)item;
    CHARGED_ASSERT(st->name != NULL);
    if (engine_core_lock_wait(&eng->core, eng->jobs, j, clock_now_ms()))
        log_warn("attempt held by another session's transaction; trying again shortly",
                 JOB_FIELDS(j), "stage", st->name, NULL);
    return CHARGED_OK;
}

/* A stage's refused: a message the database refuses even on its own is a
 * dead letter, so that its partition moves on. The line names the
 * SQLSTATE, never a value. */
static enum charged_rc stage_dead_letter(engine_t *eng, const struct stage *st,
                                         struct job *j, void *item,
                                         struct charged_error *err)
{
    (void)item;
    CHARGED_ASSERT(st->refused_what != NULL);
    job_set_error(j, "the database refused the %s (sqlstate %s)", st->refused_what,
                  err->code);
    engine_core_dead_letter(eng->jobs, j, DEAD_LETTER_DATABASE_REFUSED);
    return CHARGED_OK;
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
static enum charged_rc record_statement(engine_t *eng, void *items, size_t n,
                                        struct charged_error *err)
{
    return eng->op->record(eng->op_state, items, n, eng->lease_ms, err);
}

static const struct stage record_stage = {
    .name = "record",
    .refused_what = "command",
    .item_size = sizeof(struct engine_record),
    .statement = record_statement,
    .apply = apply_record,
    .refused = stage_dead_letter,
    .locked = stage_lock_wait,
};

void engine_record_attempts(engine_t *eng)
{
    struct charged_error err;
    int64_t now = clock_now_ms();
    size_t n = job_list_due(eng->jobs, JOB_RECORD, now), k = 0;
    if (n == 0 || !engine_db_ready(eng) ||
        batch_gate_due_at(&eng->record_gate, n, now) > now)
        return;
    batch_gate_ran(&eng->record_gate, now);
    struct engine_record *items = calloc(n, sizeof(*items));
    struct job **js = calloc(n, sizeof(*js));
    if (!items || !js)
        goto out;
    /* Jobs another session's lock held before are tried alone, after the
     * batch and a few a turn: each may wait a lock_timeout. */
    size_t held = 0;
    for (struct job *j = job_list_first(eng->jobs, JOB_RECORD); j && k + held < n;
         j = job_next_in_state(j)) {
        if (j->next_at > now)
            continue;
        if (j->lock_waits == 0) {
            js[k] = j;
            items[k].params = j->params;
            items[k++].command = j->command;
        } else if (held < HELD_PER_TURN) {
            js[n - 1 - held] = j;
            items[n - 1 - held].params = j->params;
            items[n - 1 - held].command = j->command;
            held++;
        }
    }
    CHARGED_ASSERT(k + held <= n && held <= HELD_PER_TURN);
    enum charged_rc rc = stage_run(eng, &record_stage, js, items, k, &err);
    for (size_t h = 0; rc == CHARGED_OK && h < held; h++)
        rc = stage_alone(eng, &record_stage, &js[n - 1 - h], &items[n - 1 - h], &err);
    stage_reported(eng, &record_stage, rc, &err);
out:
    free(items);
    free(js);
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
static enum charged_rc claim_statement(engine_t *eng, void *items, size_t n,
                                       struct charged_error *err)
{
    return eng->op->claim(eng->op_state, items, n, eng->lease_ms, err);
}

static const struct stage claim_stage = {
    .name = "claim",
    .refused_what = "claim",
    .item_size = sizeof(struct engine_claim),
    .statement = claim_statement,
    .apply = apply_claim,
    .refused = stage_dead_letter,
    .locked = stage_lock_wait,
};

void engine_claim_attempts(engine_t *eng)
{
    struct charged_error err;
    int64_t now = clock_now_ms();
    size_t n = 0, k = 0;
    if (!engine_db_ready(eng))
        return;
    n = job_list_count(eng->jobs, JOB_CLAIM) + job_list_due(eng->jobs, JOB_WAIT, now);
    if (n == 0)
        return;
    struct engine_claim *items = calloc(n, sizeof(*items));
    struct job **js = calloc(n, sizeof(*js));
    if (!items || !js)
        goto out;
    /* Those to claim now, then those whose wait is over. */
    for (int pass = 0; pass < 2; pass++) {
        enum job_state state = pass == 0 ? JOB_CLAIM : JOB_WAIT;
        for (struct job *j = job_list_first(eng->jobs, state), *next; j && k < n;
             j = next) {
            next = job_next_in_state(j);
            if (engine_core_claim_gate(&eng->core, eng->jobs, j, now) !=
                ENGINE_NEXT_SEND)
                continue;
            js[k] = j;
            items[k].id = j->id;
            items[k].kind = j->kind;
            items[k++].params = j->params;
        }
    }
    CHARGED_ASSERT(k <= n); /* the batch never outgrows what was counted */
    enum charged_rc rc = stage_run(eng, &claim_stage, js, items, k, &err);
    stage_reported(eng, &claim_stage, rc, &err);
out:
    free(items);
    free(js);
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

static enum charged_rc log_calls_batch(engine_t *eng, struct call_entry *const *e,
                                       size_t n, struct charged_error *err)
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
    enum charged_rc rc = eng->op->log_calls(eng->op_state, calls, n, err);
    for (size_t i = 0; rc == CHARGED_RETRY && i < n; i++)
        e[i]->written_maybe = 1;
    free(calls);
    return rc;
}

/* One call entry alone: written (or refused, and dropped with a log line:
 * CHARGED_OK), held by another session's lock (kept, with a back-off:
 * CHARGED_WAIT), or the database failed (CHARGED_RETRY). */
static enum charged_rc log_call_alone(engine_t *eng, struct call_entry *e,
                                      struct charged_error *err)
{
    db_lock_timeout_override(ALONE_LOCK_TIMEOUT);
    enum charged_rc rc = log_calls_batch(eng, &e, 1, err);
    db_lock_timeout_override(NULL);
    if (rc == CHARGED_RETRY)
        return CHARGED_RETRY;
    if (rc == CHARGED_WAIT) {
        e->lock_waits++;
        e->next_at = clock_now_ms() + retry_backoff_ms(eng->core.policy.retry_base_ms,
                                                       eng->core.policy.retry_max_ms,
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

/* Writes the waiting provider calls. CHARGED_OK when nothing is left waiting but
 * calls another session's lock holds (a foreign-key check waits on a row
 * locked FOR UPDATE): those are tried again alone, HELD_PER_TURN at most a
 * turn, after a back-off, and hold nothing else up (their attempts' own
 * outcomes wait on the same lock). CHARGED_RETRY when the database could not take them
 * now (then nothing else is written either: the outage is the same). A row
 * the database refuses on its own is dropped with a log line. */
enum charged_rc engine_flush_call_log(engine_t *eng)
{
    struct charged_error err;
    size_t n = eng->call_log_len, nfresh = 0, held_tries = 0, kept = 0;
    int64_t now = clock_now_ms();
    enum charged_rc rc = CHARGED_OK;
    if (n == 0)
        return CHARGED_OK;
    if (!engine_db_ready(eng))
        return CHARGED_RETRY;
    struct call_entry **fresh = calloc(n, sizeof(*fresh));
    char *done = calloc(n, 1);
    if (!fresh || !done) {
        free(fresh);
        free(done);
        return CHARGED_RETRY;
    }
    /* One batch per kind: a kind's statement that fails after another
     * kind's committed must not have those written again. A kind's batch
     * not run (CHARGED_RETRY) leaves its entries for the next flush. */
    int kinds = 1;
    enum charged_rc brc[8];
    for (size_t i = 0; i < n; i++)
        if (eng->call_log[i].kind >= kinds)
            kinds = eng->call_log[i].kind + 1;
    if (kinds > (int)(sizeof(brc) / sizeof(brc[0]))) {
        rc = CHARGED_RETRY;
        charged_error_set(&err, "provider calls of %d kinds", kinds);
        goto out;
    }
    for (int k = 0; k < kinds; k++)
        brc[k] = CHARGED_RETRY;
    for (int k = 0; k < kinds && rc == CHARGED_OK; k++) {
        nfresh = 0;
        for (size_t i = 0; i < n; i++)
            if (eng->call_log[i].lock_waits == 0 && eng->call_log[i].kind == k)
                fresh[nfresh++] = &eng->call_log[i];
        brc[k] = nfresh ? log_calls_batch(eng, fresh, nfresh, &err) : CHARGED_OK;
        if (brc[k] == CHARGED_RETRY)
            rc = CHARGED_RETRY;
    }
    for (size_t i = 0; i < n; i++)
        done[i] = eng->call_log[i].lock_waits == 0 &&
                  brc[eng->call_log[i].kind] == CHARGED_OK;
    for (size_t i = 0; i < n && rc == CHARGED_OK; i++) {
        struct call_entry *e = &eng->call_log[i];
        enum charged_rc alone;
        if (done[i])
            continue;
        if (e->lock_waits > 0 && (e->next_at > now || held_tries++ >= HELD_PER_TURN))
            continue;
        if ((alone = log_call_alone(eng, e, &err)) == CHARGED_RETRY) {
            rc = CHARGED_RETRY;
            break;
        }
        done[i] = alone == CHARGED_OK;
    }
out:
    for (size_t i = 0; i < n; i++)
        if (!done[i])
            eng->call_log[kept++] = eng->call_log[i];
    eng->call_log_len = kept;
    CHARGED_ASSERT(kept <= n);
    free(fresh);
    free(done);
    if (rc != CHARGED_OK)
        engine_db_failed(eng, "log provider calls", err.message);
    return rc;
}

void engine_flush_calls_due(engine_t *eng)
{
    int64_t now = clock_now_ms();
    if (eng->call_log_len == 0 ||
        batch_gate_due_at(&eng->persist_gate, eng->call_log_len, now) > now)
        return;
    batch_gate_ran(&eng->persist_gate, now);
    engine_flush_call_log(eng);
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
static enum charged_rc persist_statement(engine_t *eng, void *items, size_t n,
                                         struct charged_error *err)
{
    return eng->op->persist(eng->op_state, items, n, err);
}

/* The database refused this outcome even alone (a value from the provider
 * it cannot store). The attempt may have been charged, so it is never
 * FAILED: REQUIRES_REVIEW, with nothing from outside but the outcome's name.
 * If even that is refused, the job ends and the lease is left to expire; a
 * later owner or the reconciler takes the attempt from there. */
static enum charged_rc persist_for_review(engine_t *eng, const struct stage *st,
                                          struct job *j, struct charged_error *err)
{
    CHARGED_ASSERT(j->state == JOB_PERSIST && j->lease_epoch > 0);
    char reason[256], evidence[160];
    snprintf(reason, sizeof(reason),
             "requires_review: the database refused the outcome '%s' (sqlstate %s)",
             provider_outcome_name(j->res.outcome), err->code);
    snprintf(evidence, sizeof(evidence), "{\"outcome\":\"%s\",\"http_status\":%d}",
             provider_outcome_name(j->res.outcome), j->res.http_status);
    struct engine_outcome o = {
        .id = j->id,
        .lease_epoch = j->lease_epoch,
        .status = "REQUIRES_REVIEW",
        .reason = reason,
        .kind = j->kind,
        .event_type = eng->op->event_type(j->kind, ATTEMPT_STATUS_REQUIRES_REVIEW),
        .evidence_json = evidence,
        .calls = j->calls,
        .next_check_ms = -1,
    };
    log_error("the database refused an outcome; settling it for review", JOB_FIELDS(j),
              "outcome", provider_outcome_name(j->res.outcome), "sqlstate", err->code,
              NULL);
    enum charged_rc rc = stage_batch(eng, st, &j, &o, 1, err);
    if (rc == CHARGED_BAD_ITEM) {
        log_error("the database refused the review outcome too; lease left to expire",
                  JOB_FIELDS(j), "sqlstate", err->code, NULL);
        engine_core_abandoned(eng->jobs, j);
        return CHARGED_OK;
    }
    return rc;
}

static enum charged_rc persist_refused(engine_t *eng, const struct stage *st,
                                       struct job *j, void *item,
                                       struct charged_error *err)
{
    (void)item;
    return persist_for_review(eng, st, j, err);
}

/* Held, as a locked row is: it waits, the rest goes on. */
static enum charged_rc persist_locked(engine_t *eng, const struct stage *st,
                                      struct job *j, void *item)
{
    (void)st;
    struct engine_outcome *o = item;
    o->busy = 1;
    apply_persist(eng, j, o);
    return CHARGED_OK;
}

/* A refused outcome is settled for review, never dead-lettered: the
 * attempt may have been charged. */
static const struct stage persist_stage = {
    .name = "persist",
    .item_size = sizeof(struct engine_outcome),
    .statement = persist_statement,
    .apply = apply_persist,
    .refused = persist_refused,
    .locked = persist_locked,
};

/* True while a provider call of j waits to be written (another session's
 * lock holds its row): its outcome waits with it, so that no attempt is
 * seen settled without its calls. */
static int calls_pending(const engine_t *eng, const struct job *j)
{
    for (size_t i = 0; i < eng->call_log_len; i++)
        if (eng->call_log[i].kind == j->kind && strcmp(eng->call_log[i].id, j->id) == 0)
            return 1;
    return 0;
}

void engine_persist_outcomes(engine_t *eng)
{
    struct charged_error err;
    int64_t now = clock_now_ms();
    size_t n = job_list_due(eng->jobs, JOB_PERSIST, now), k = 0;
    if (n == 0 || !engine_db_ready(eng) ||
        batch_gate_due_at(&eng->persist_gate, n, now) > now)
        return;
    batch_gate_ran(&eng->persist_gate, now);
    /* The calls first: support must see every call of a settled attempt,
     * and if the database cannot take them it cannot take outcomes now. */
    if (engine_flush_call_log(eng) != CHARGED_OK)
        return;
    struct engine_outcome *items = calloc(n, sizeof(*items));
    struct job **js = calloc(n, sizeof(*js));
    char(*reasons)[512] = calloc(n, sizeof(*reasons));
    char **evidence = calloc(n, sizeof(*evidence));
    if (!items || !js || !reasons || !evidence)
        goto out;
    for (struct job *j = job_list_first(eng->jobs, JOB_PERSIST); j && k < n;
         j = job_next_in_state(j)) {
        if (j->next_at > now || calls_pending(eng, j))
            continue;
        CHARGED_ASSERT(j->lease_epoch > 0); /* an outcome only under our claim */
        struct engine_outcome *o = &items[k];
        const struct answer_decision *d = &j->decision;
        js[k] = j;
        /* The operation's decision, and what it says of the answer. */
        evidence[k] = eng->op->outcome(j->kind, &j->res, d, j->calls, reasons[k],
                                       sizeof(reasons[k]), &o->provider_id);
        o->status = attempt_status_name(d->status);
        o->event_type = d->event_type;
        o->next_check_ms = d->next_check_ms;
        o->id = j->id;
        o->kind = j->kind;
        o->lease_epoch = j->lease_epoch;
        o->reason = reasons[k][0] ? reasons[k] : NULL;
        o->evidence_json = evidence[k];
        o->calls = j->calls;
        o->last_error = j->res.error[0] ? j->res.error : NULL;
        k++;
    }
    CHARGED_ASSERT(k <= n); /* the batch never outgrows what was counted */
    enum charged_rc rc = stage_run(eng, &persist_stage, js, items, k, &err);
    stage_reported(eng, &persist_stage, rc, &err);
    if (rc != CHARGED_RETRY && k > 0)
        FAILPOINT("after_persist");
out:
    for (size_t i = 0; evidence && i < n; i++)
        free(evidence[i]);
    free(evidence);
    free(reasons);
    free(items);
    free(js);
}

/* ---- leases ---- */

/* Extends the leases of claims we still work on. */
void engine_renew_leases(engine_t *eng)
{
    struct charged_error err;
    int64_t now = clock_now_ms();
    size_t n = 0, k = 0;
    if (now - eng->last_renew_ms < eng->lease_ms / 3 || !engine_db_ready(eng))
        return;
    eng->last_renew_ms = now;
    static const enum job_state leased[] = {JOB_CALL, JOB_CALLING, JOB_PERSIST,
                                            JOB_PARKED};
    for (size_t i = 0; i < sizeof(leased) / sizeof(leased[0]); i++)
        n += job_list_count(eng->jobs, leased[i]);
    if (n == 0)
        return;
    const char **ids = calloc(n, sizeof(*ids));
    int64_t *epochs = calloc(n, sizeof(*epochs));
    int *ours = calloc(n, sizeof(*ours)), *kinds = calloc(n, sizeof(*kinds));
    struct job **js = calloc(n, sizeof(*js));
    if (!ids || !epochs || !ours || !kinds || !js)
        goto out;
    for (size_t i = 0; i < sizeof(leased) / sizeof(leased[0]); i++)
        for (struct job *j = job_list_first(eng->jobs, leased[i]); j && k < n;
             j = job_next_in_state(j)) {
            CHARGED_ASSERT(j->lease_epoch > 0);
            js[k] = j;
            ids[k] = j->id;
            kinds[k] = j->kind;
            epochs[k++] = j->lease_epoch;
        }
    CHARGED_ASSERT(k == n); /* every leased job renews: none is left to expire */
    if (eng->op->renew(eng->op_state, ids, kinds, epochs, k, eng->lease_ms, ours,
                       &err) != CHARGED_OK) {
        engine_db_failed(eng, "renew leases", err.message);
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        struct job *j = js[i];
        if (ours[i])
            continue;
        log_warn("lease lost", JOB_FIELDS(j), NULL);
        engine_core_lease_lost(&eng->core, eng->jobs, j, now);
        /* Not sent: it looks again (WAIT) or ends; either way it stops
         * asking the budget, and a ticket kept would hold back every lower
         * priority for as long (a new claim asks from a new one). */
        budget_member_forget(eng->budget, &j->budget);
    }
out:
    free(ids);
    free(epochs);
    free(ours);
    free(kinds);
    free(js);
}

/* ---- waits ---- */

static const enum job_state claimed_states[] = {JOB_CALL, JOB_CALLING, JOB_PERSIST,
                                                JOB_PARKED};
#define NCLAIMED (sizeof(claimed_states) / sizeof(claimed_states[0]))

void engine_write_waits(engine_t *eng)
{
    struct charged_error err;
    size_t n = 0, k = 0;
    /* Nothing waits and no record says so: the common case costs nothing. */
    if (!eng->op->wait ||
        (job_list_count(eng->jobs, JOB_PARKED) == 0 && eng->waits_shown == 0 &&
         eng->waits_paced == 0) ||
        !engine_db_ready(eng))
        return;
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]); j;
             j = job_next_in_state(j))
            n += (size_t)engine_core_wait_due(j);
    if (n == 0)
        return;
    struct store_wait *w = calloc(n, sizeof(*w));
    struct job **js = calloc(n, sizeof(*js));
    if (!w || !js)
        goto out;
    for (size_t s = 0; s < NCLAIMED; s++)
        for (struct job *j = job_list_first(eng->jobs, claimed_states[s]); j && k < n;
             j = job_next_in_state(j)) {
            if (!engine_core_wait_due(j))
                continue;
            CHARGED_ASSERT(j->lease_epoch > 0); /* a claim of ours */
            js[k] = j;
            w[k++] = (struct store_wait){j->id, j->kind, j->lease_epoch,
                                         engine_core_waiting_name(j->wait_want),
                                         j->wait_since_ms};
        }
    CHARGED_ASSERT(k == n);
    /* One statement, no transaction: nothing is held across a call. */
    if (eng->op->wait(eng->op_state, w, k, &err) != CHARGED_OK) {
        engine_db_failed(eng, "write waits", err.message);
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        struct job *j = js[i];
        eng->waits_shown += j->wait_want != JOB_WAITING_NONE;
        eng->waits_shown -= j->wait_shown != JOB_WAITING_NONE;
        j->wait_shown = j->wait_want;
        j->wait_shown_since_ms = j->wait_since_ms;
        j->wait_shown_epoch = j->lease_epoch;
    }
out:
    free(w);
    free(js);
}
