#include "engine_core.h"

#include <stdio.h>
#include <string.h>

#include "charged_assert.h"
#include "retry_tries.h"

/* The states in which a job holds its record's lease. */
static int leased(enum job_state s)
{
    return s == JOB_CALL || s == JOB_CALLING || s == JOB_CALLING_FENCED ||
           s == JOB_PERSIST || s == JOB_PARKED;
}

/* ---- tries and back-off ---- */

/* The policy's back-off before try number `tries` + 1 (retry_tries.h). */
static long long backoff_ms(const struct engine_policy *p, int tries, unsigned jitter)
{
    return retry_backoff_ms(p->retry_base_ms, p->retry_max_ms, tries, jitter);
}

/* ---- starting ---- */

size_t engine_core_started(const job_list_t *jobs)
{
    size_t n = 0;
    for (int s = 0; s < JOB__COUNT; s++)
        if (s != JOB_BACKLOG && s != JOB_PARKED && s != JOB_WAIT)
            n += job_list_count(jobs, (enum job_state)s);
    /* Every started job that holds an offset is counted, but the parked
     * (they wait for the provider or its budget) and the waiting (for
     * another session's lock or lease, or another record: a capture for
     * its authorization; adversary 38j): neither holds a slot. */
    CHARGED_ASSERT(n + job_list_count(jobs, JOB_PARKED) +
                       job_list_count(jobs, JOB_WAIT) >=
                   job_list_started(jobs));
    return n;
}

void engine_core_parsed(job_list_t *jobs, struct job *j, int ok)
{
    CHARGED_ASSERT(j->state == JOB_BACKLOG);
    CHARGED_ASSERT(!ok || (j->have_cmd && j->id != NULL));

    job_set(jobs, j, ok ? JOB_RECORD : JOB_DEAD_LETTER);
}

/* ---- dead letters ---- */

void engine_core_dead_letter(job_list_t *jobs, struct job *j,
                             enum dead_letter_reason reason)
{
    CHARGED_ASSERT(reason != DEAD_LETTER_NONE);
    /* Only before any call: a job that may have called never dead-letters. */
    CHARGED_ASSERT(!leased(j->state));

    j->dl_reason = reason;
    job_set(jobs, j, JOB_DEAD_LETTER);
    j->next_at = 0;
}

enum engine_next engine_core_dead_letter_gate(job_list_t *jobs, struct job *j,
                                              int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_DEAD_LETTER);
    if (j->next_at > now)
        return ENGINE_NEXT_SKIP;
    if (j->detached) {
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_DONE;
    }
    /* A letter always says why (its reason is a header of it). */
    CHARGED_ASSERT(j->dl_reason != DEAD_LETTER_NONE);
    return ENGINE_NEXT_SEND;
}

enum engine_next engine_core_dead_letter_produced(job_list_t *jobs, struct job *j,
                                                  int err, int too_large, int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_DEAD_LETTER && !j->detached);
    if (err && too_large && !j->dl_cut) {
        j->dl_cut = 1;
        j->next_at = 0;
        return ENGINE_NEXT_CUT;
    }
    if (err) {
        j->next_at = now + 500;
        return ENGINE_NEXT_RETRY;
    }
    job_set(jobs, j, JOB_DEAD_LETTER_SENT);
    return ENGINE_NEXT_SENT;
}

void engine_core_dead_letter_acked(job_list_t *jobs, struct job *j, int err,
                                   int too_large, int64_t now)
{
    /* Only a letter handed to the producer is acknowledged. */
    CHARGED_ASSERT(j->state == JOB_DEAD_LETTER_SENT);
    if (!err) {
        j->outcome = "dead_lettered";
        job_set(jobs, j, JOB_DONE);
        return;
    }
    job_set(jobs, j, JOB_DEAD_LETTER);
    if (too_large && !j->dl_cut) {
        j->dl_cut = 1; /* again at once, cut */
        j->next_at = 0;
    } else {
        j->next_at = now + 1000;
    }
}

/* ---- the store's answers ---- */

void engine_core_claimed(job_list_t *jobs, struct job *j, int64_t lease_epoch,
                         int64_t key_age_ms, int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_RECORD || j->state == JOB_CLAIM ||
                   j->state == JOB_WAIT);
    /* Every claim takes the lease at a new epoch: one that went back would
     * let an older claim's outcome through the fence. */
    CHARGED_ASSERT(lease_epoch > 0 && lease_epoch > j->lease_epoch);
    j->lease_epoch = lease_epoch;
    j->key_age_ms = key_age_ms;
    j->claimed_at = now;
    j->calls = 0;
    j->calls_throttled = 0;
    j->busy_persists = 0;
    /* Tries count per claim; the outage's spared failure, per message. */
    j->tries.not_executed = j->tries.unknown = 0;
    job_set(jobs, j, JOB_CALL);
    j->next_at = 0;
}

enum engine_next engine_core_recorded(job_list_t *jobs, struct job *j,
                                      enum engine_record_result result,
                                      int64_t lease_epoch, int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_RECORD);
    CHARGED_ASSERT(result >= ENGINE_RECORDED && result <= ENGINE_RECORDED_CLAIMED);
    switch (result) {
    case ENGINE_RECORDED_CLAIMED:
        engine_core_claimed(jobs, j, lease_epoch, 0, now);
        return ENGINE_NEXT_CLAIMED;
    case ENGINE_RECORDED:
        job_set(jobs, j, JOB_CLAIM);
        return ENGINE_NEXT_NONE;
    case ENGINE_CONFLICT:
        engine_core_dead_letter(jobs, j, DEAD_LETTER_IDEMPOTENCY_KEY_CONFLICT);
        return ENGINE_NEXT_DEAD_LETTER;
    case ENGINE_REJECTED:
        j->outcome = "rejected";
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_REJECTED;
    case ENGINE_RECORD_AGAIN:
        break; /* stays JOB_RECORD */
    }
    return ENGINE_NEXT_NONE;
}

int engine_core_lock_wait(const struct engine_core *c, job_list_t *jobs, struct job *j,
                          int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_RECORD || j->state == JOB_CLAIM ||
                   j->state == JOB_WAIT);
    if (j->state == JOB_CLAIM)
        job_set(jobs, j, JOB_WAIT); /* a record stays where it is */
    int first = j->lock_waits++ == 0;
    j->next_at = now + backoff_ms(&c->policy, j->lock_waits, job_jitter(j));
    return first;
}

/* Does another job of ours hold (or call under) j's record's lease? Then
 * j waits for it: the claim would take a lease of ours as lost. */
static int held_by_another_job(job_list_t *jobs, const struct job *j)
{
    CHARGED_ASSERT(j->id != NULL);

    static const enum job_state holding[] = {JOB_CALL, JOB_CALLING, JOB_CALLING_FENCED,
                                             JOB_PERSIST, JOB_PARKED};
    for (size_t s = 0; s < sizeof(holding) / sizeof(holding[0]); s++)
        for (struct job *o = job_list_first(jobs, holding[s]); o;
             o = job_next_in_state(o))
            if (o != j && o->kind == j->kind && !strcmp(o->id, j->id))
                return 1;
    return 0;
}

enum engine_next engine_core_claim_gate(const struct engine_core *c, job_list_t *jobs,
                                        struct job *j, int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_CLAIM || j->state == JOB_WAIT);
    if (j->next_at > now && j->state == JOB_WAIT)
        return ENGINE_NEXT_SKIP;
    /* A waiting job holds no slot: it claims again when one is free. */
    if (j->state == JOB_WAIT &&
        (long long)engine_core_started(jobs) >= c->max_in_flight)
        return ENGINE_NEXT_SKIP;
    if (j->detached) {
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_DONE;
    }
    if (held_by_another_job(jobs, j)) {
        job_set(jobs, j, JOB_WAIT);
        j->next_at = now + c->recheck_ms;
        return ENGINE_NEXT_SKIP;
    }
    /* It takes its slot now, so that the next of a batch sees it taken
     * (adversary 38k: four due at once, one slot free, took seven of four). */
    if (j->state == JOB_WAIT)
        job_set(jobs, j, JOB_CLAIM);
    return ENGINE_NEXT_SEND;
}

enum engine_next engine_core_claim_answered(const struct engine_core *c,
                                            job_list_t *jobs, struct job *j,
                                            enum engine_claim_result result,
                                            int64_t lease_epoch, int64_t key_age_ms,
                                            int rejected, int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_CLAIM || j->state == JOB_WAIT);
    CHARGED_ASSERT(result >= ENGINE_CLAIMED && result <= ENGINE_BUSY);
    switch (result) {
    case ENGINE_CLAIMED:
        engine_core_claimed(jobs, j, lease_epoch, key_age_ms, now);
        return ENGINE_NEXT_CLAIMED;
    case ENGINE_SETTLED:
        j->outcome = rejected ? "rejected" : "already_settled";
        job_set(jobs, j, JOB_DONE);
        return rejected ? ENGINE_NEXT_REJECTED : ENGINE_NEXT_DONE;
    case ENGINE_BUSY:
        job_set(jobs, j, JOB_WAIT);
        j->next_at = now + c->recheck_ms;
        break;
    }
    return ENGINE_NEXT_NONE;
}

enum engine_next engine_core_persisted(const struct engine_core *c, job_list_t *jobs,
                                       struct job *j, int64_t lease_epoch,
                                       int persisted, int busy, int *first_busy,
                                       int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_PERSIST);
    /* The outcome written is the one of this job's claim, fenced on its
     * epoch: never another claim's. */
    CHARGED_ASSERT(lease_epoch > 0 && lease_epoch == j->lease_epoch);
    CHARGED_ASSERT(!(persisted && busy));
    *first_busy = 0;
    if (busy) {
        /* Another session holds the row (a webhook being applied, or a
         * session hung in its transaction): this job waits, its lease
         * renewed, and no other outcome waits with it. */
        *first_busy = j->busy_persists++ == 0;
        j->next_at = now + backoff_ms(&c->policy, j->busy_persists, job_jitter(j));
        return ENGINE_NEXT_BUSY;
    }
    if (!persisted) {
        /* Fenced out: someone took the record over; its result wins. */
        job_set(jobs, j, JOB_WAIT);
        j->next_at = now + c->recheck_ms;
        return ENGINE_NEXT_FENCED;
    }
    j->outcome = "settled";
    job_set(jobs, j, JOB_DONE);
    return ENGINE_NEXT_DONE;
}

void engine_core_abandoned(job_list_t *jobs, struct job *j)
{
    CHARGED_ASSERT(j->state == JOB_PERSIST);

    j->outcome = "abandoned";
    job_set(jobs, j, JOB_DONE);
}

void engine_core_lease_lost(const struct engine_core *c, job_list_t *jobs,
                            struct job *j, int64_t now)
{
    /* Only a lease we hold can be lost (a fenced call has lost it already). */
    CHARGED_ASSERT(leased(j->state) && j->state != JOB_CALLING_FENCED);
    if (j->state == JOB_CALLING) {
        job_set(jobs, j, JOB_CALLING_FENCED);
        return;
    }
    /* Not sent, or a result the fence would refuse: look again. */
    job_set(jobs, j, j->detached ? JOB_DONE : JOB_WAIT);
    j->next_at = now + c->recheck_ms;
}

/* ---- the provider ---- */

int engine_core_key_kept(const struct engine_core *c, const struct job *j, int64_t now)
{
    /* The key's age grows from the claim on a monotonic clock: a margin or
     * an elapsed time below 0 would send under a forgotten key. */
    CHARGED_ASSERT(c->key_margin_ms >= 0 && now >= j->claimed_at);

    return j->key_age_ms + (now - j->claimed_at) + c->key_margin_ms <
           c->key_retention_ms;
}

/* The operation's decision on the job's answer, with its event. */
static void decide(const struct engine_core *c, struct job *j, int tries,
                   int key_window_open, unsigned jitter)
{
    CHARGED_ASSERT(tries >= 0 && c->decide != NULL);
    /* A claim's key is 0 ms old when this claim first sent it. Only a
     * call of this claim that may have executed can be replayed: a 429 is
     * answered before anything executes. */
    int may_replay =
        j->res.replayed || j->calls - j->calls_throttled > 1 || j->key_age_ms > 0;
    j->decision = c->decide(j->kind, &c->policy, j->res.outcome, may_replay, tries,
                            key_window_open, jitter);
    if (c->event_type)
        j->decision.event_type = c->event_type(j->kind, j->decision.status);
    /* A retry waits, only while the key is kept; a settlement names a status
     * past PENDING, and one of a call that may have executed is never
     * FAILED. */
    CHARGED_ASSERT(j->decision.next == ANSWER_NEXT_SETTLE
                       ? j->decision.status != ATTEMPT_STATUS_PENDING
                       : j->decision.retry_in_ms >= 0 && key_window_open);
    CHARGED_ASSERT(j->decision.next == ANSWER_NEXT_RETRY ||
                   j->decision.status != ATTEMPT_STATUS_FAILED ||
                   j->res.outcome == PROVIDER_DECLINED ||
                   j->res.outcome == PROVIDER_INVALID);
}

enum engine_next engine_core_call_gate(const struct engine_core *c, job_list_t *jobs,
                                       struct job *j, int64_t now)
{
    /* A call is sent only under a lease of ours. */
    CHARGED_ASSERT(j->state == JOB_CALL && j->lease_epoch > 0);
    if (j->next_at > now)
        return ENGINE_NEXT_SKIP;
    if (j->detached) {
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_RELEASE;
    }
    if (engine_core_key_kept(c, j, now))
        return ENGINE_NEXT_SEND;
    /* First call or retry, ours or taken over: never sent. Look-ups (the
     * reconciler) settle it. */
    memset(&j->res, 0, sizeof(j->res));
    j->res.outcome = PROVIDER_NOT_EXECUTED;
    snprintf(j->res.error, sizeof(j->res.error),
             "key_retention_passed: not sent again, the provider may have "
             "forgotten the key");
    int tries = retry_tries_count(&j->tries, PROVIDER_NOT_EXECUTED, 0, 0, NULL);
    decide(c, j, tries, 0, 0);
    job_set(jobs, j, JOB_PERSIST);
    j->next_at = 0;
    return ENGINE_NEXT_KEY_CLOSED;
}

void engine_core_call_started(job_list_t *jobs, struct job *j)
{
    CHARGED_ASSERT(j->state == JOB_CALL && !j->detached && j->lease_epoch > 0);
    j->calls++;
    job_set(jobs, j, JOB_CALLING);
}

void engine_core_call_not_started(const struct engine_core *c, struct job *j,
                                  int64_t now)
{
    CHARGED_ASSERT(j->state == JOB_CALL);
    int tries = retry_tries_count(&j->tries, PROVIDER_NOT_EXECUTED, 0, 0, NULL);
    j->next_at = now + backoff_ms(&c->policy, tries, job_jitter(j));
}

/* Jobs held for what neither a slot nor the budget moves: parked after
 * the provider's 429s (their last answer one), and waiting for another
 * session or record (a capture for its throttled authorization,
 * adversary 38j). Not the budget's waiters: they park too, and while it
 * binds they fill max_in_flight all the time (adversary 38j, 38k). */
static long long held_stuck(const job_list_t *jobs)
{
    long long n = (long long)job_list_count(jobs, JOB_WAIT);
    for (const struct job *p = job_list_first(jobs, JOB_PARKED); p;
         p = job_next_in_state(p))
        n += p->res.throttled != 0;
    return n;
}

/* ENGINE_SET_ASIDE_AFTER_MS's rule for a throttled answer to j. */
static int sets_aside(const struct engine_core *c, const job_list_t *jobs,
                      const struct job *j, int64_t now)
{
    if (!j->res.throttled || !c->sets_aside || !c->sets_aside(j->kind))
        return 0;
    return held_stuck(jobs) >= c->max_in_flight ||
           (j->throttled_since != 0 &&
            now - j->throttled_since >= ENGINE_SET_ASIDE_AFTER_MS);
}

/* j settles PROCESSING for the reconciler's look after park_ms: the
 * status it already has, so no event, and its reason says why. */
static void set_aside(const struct engine_core *c, job_list_t *jobs, struct job *j,
                      long long park_ms)
{
    CHARGED_ASSERT(j->res.outcome == PROVIDER_NOT_EXECUTED && park_ms >= 0);
    j->decision = (struct answer_decision){
        .next = ANSWER_NEXT_SETTLE,
        .status = ATTEMPT_STATUS_PROCESSING,
        .next_check_ms = park_ms,
        .reason_code = "provider_throttled",
    };
    if (c->event_type)
        j->decision.event_type = c->event_type(j->kind, ATTEMPT_STATUS_PROCESSING);
    /* Nothing is told before the reconciler settles it. */
    CHARGED_ASSERT(j->decision.event_type == NULL);
    job_set(jobs, j, JOB_PERSIST);
    j->next_at = 0;
}

enum engine_next engine_core_answered(const struct engine_core *c, job_list_t *jobs,
                                      struct job *j, int failure, int opened,
                                      int *outage, int64_t now)
{
    /* Only a call sent under this claim is answered. */
    CHARGED_ASSERT(j->state == JOB_CALLING || j->state == JOB_CALLING_FENCED);
    CHARGED_ASSERT(j->calls > 0 && j->lease_epoch > 0);
    /* The try this answer counts (the one that opened the breaker counts
     * none): retry_tries_count says why. */
    int tries = retry_tries_count(&j->tries, j->res.outcome, failure, opened, outage);
    if (j->res.throttled)
        j->calls_throttled++;
    CHARGED_ASSERT(j->calls_throttled <= j->calls);
    if (j->state == JOB_CALLING_FENCED) {
        job_set(jobs, j, j->detached ? JOB_DONE : JOB_WAIT);
        j->next_at = now + c->recheck_ms;
        return ENGINE_NEXT_FENCED;
    }
    decide(c, j, tries, engine_core_key_kept(c, j, now), job_jitter(j));
    if (j->decision.next == ANSWER_NEXT_SETTLE) {
        job_set(jobs, j, JOB_PERSIST);
        j->next_at = 0;
        return ENGINE_NEXT_SETTLE;
    }
    if (j->detached) {
        /* Not ours to retry: the next owner of the partition sends again
         * with the same key once our lease is gone. */
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_RELEASE;
    }
    if (provider_outcome_parks(&j->res)) {
        /* Throttled, or the key in use upstream: nothing executed and the
         * provider is not down. Waiting in its slot held every slot once
         * enough such answers came (adversary 36): it parks instead. */
        long long park = engine_core_park_ms(&c->policy, &j->res, tries, job_jitter(j));
        if (sets_aside(c, jobs, j, now)) {
            set_aside(c, jobs, j, park);
            return ENGINE_NEXT_SET_ASIDE;
        }
        job_set(jobs, j, JOB_PARKED);
        j->next_at = now + park;
        return ENGINE_NEXT_PARKED;
    }
    job_set(jobs, j, JOB_CALL);
    j->next_at = now + j->decision.retry_in_ms;
    return ENGINE_NEXT_RETRY;
}

long long engine_core_park_ms(const struct engine_policy *p,
                              const struct provider_result *res, int tries,
                              unsigned jitter)
{
    CHARGED_ASSERT(res->retry_after_ms >= 0 &&
                   res->retry_after_ms <= PROVIDER_RETRY_AFTER_MAX_MS);
    if (res->retry_after_ms <= 0)
        return backoff_ms(p, tries, jitter);
    /* The provider's word, never less; spread by up to a tenth so that
     * the jobs it answered together do not all come back at once. */
    long long ms =
        res->retry_after_ms + res->retry_after_ms / 10 * (jitter % 1000) / 1000;
    CHARGED_ASSERT(ms >= res->retry_after_ms);
    return ms;
}

enum engine_next engine_core_park_gate(const struct engine_core *c, job_list_t *jobs,
                                       struct job *j, int64_t now)
{
    /* A parked job holds its lease and its offset (engine_core_detach
     * ends it when it would not). */
    CHARGED_ASSERT(j->state == JOB_PARKED && !j->detached && j->lease_epoch > 0);
    if (j->next_at > now || (long long)engine_core_started(jobs) >= c->max_in_flight)
        return ENGINE_NEXT_SKIP;
    job_set(jobs, j, JOB_CALL);
    j->next_at = now;
    return ENGINE_NEXT_SEND;
}

/* ---- the provider budget ---- */

enum engine_next engine_core_budget(job_list_t *jobs, struct job *j, long long wait_ms,
                                    int64_t now)
{
    /* Asked only for a call about to be sent under a lease of ours. */
    CHARGED_ASSERT(j->state == JOB_CALL && !j->detached && j->lease_epoch > 0);
    CHARGED_ASSERT(wait_ms >= 0 && wait_ms <= BUDGET_GATE_WAIT_MAX_MS);
    if (wait_ms == 0)
        return ENGINE_NEXT_NONE;
    /* Its slot is freed as a throttled job's is: the budget, not a slot,
     * is what it waits for. */
    job_set(jobs, j, JOB_PARKED);
    j->next_at = now + wait_ms;
    return ENGINE_NEXT_PARKED;
}

int engine_core_budget_waited_long(struct job *j, int64_t now)
{
    CHARGED_ASSERT(j->budget.asked && now >= j->budget.first_ms);
    if (j->budget_long || now - j->budget.first_ms < ENGINE_BUDGET_LONG_MS)
        return 0;
    j->budget_long = 1;
    return 1;
}

/* ---- the wait a record shows ---- */

const char *engine_core_waiting_name(enum job_waiting w)
{
    switch (w) {
    case JOB_WAITING_BUDGET:
        return "provider_budget";
    case JOB_WAITING_THROTTLED:
        return "provider_throttled";
    case JOB_WAITING_NONE:
        break;
    }
    return NULL;
}

void engine_core_wait_budget(struct job *j, int64_t now, int64_t wall)
{
    CHARGED_ASSERT(j->budget_long && now - j->budget.first_ms >= ENGINE_BUDGET_LONG_MS);
    j->wait_want = JOB_WAITING_BUDGET;
    j->wait_since_ms = wall - (now - j->budget.first_ms);
}

void engine_core_wait_answered(struct job *j, int throttled, long long park_ms,
                               int64_t now, int64_t wall)
{
    CHARGED_ASSERT(park_ms >= 0);
    if (!throttled) {
        j->throttled_since = 0;
        return;
    }
    if (j->throttled_since == 0)
        j->throttled_since = now;
    CHARGED_ASSERT(now >= j->throttled_since);
    if (now - j->throttled_since + park_ms < ENGINE_BUDGET_LONG_MS)
        return;
    j->wait_want = JOB_WAITING_THROTTLED;
    j->wait_since_ms = wall - (now - j->throttled_since);
}

int engine_core_wait_paced(struct job *j, int64_t now, int64_t wall)
{
    if (j->paced_since == 0)
        j->paced_since = now;
    CHARGED_ASSERT(now >= j->paced_since);
    if (j->wait_want != JOB_WAITING_NONE)
        return 1;
    /* Its own 429s, parked too briefly to be said, and the pace since are
     * one wait for the provider's word. */
    int64_t since = j->paced_since;
    if (j->throttled_since != 0 && j->throttled_since < since)
        since = j->throttled_since;
    if (now - since < ENGINE_BUDGET_LONG_MS)
        return 0;
    j->wait_want = JOB_WAITING_THROTTLED;
    j->wait_since_ms = wall - (now - since);
    return 1;
}

void engine_core_wait_ends(struct job *j)
{
    j->paced_since = 0;
    j->wait_want = JOB_WAITING_NONE;
    j->wait_since_ms = 0;
    j->budget_long = 0;
}

int engine_core_wait_due(const struct job *j)
{
    /* Only a claim of ours writes its record; a wait said has a start. */
    CHARGED_ASSERT(j->wait_want == JOB_WAITING_NONE || j->wait_since_ms > 0);
    if (j->wait_want != j->wait_shown)
        return 1;
    /* The same wait, begun anew, or said again under a new claim (which
     * cleared it). */
    return j->wait_want != JOB_WAITING_NONE &&
           (j->wait_since_ms != j->wait_shown_since_ms ||
            j->wait_shown_epoch != j->lease_epoch);
}

/* ---- offsets and the loop ---- */

enum engine_next engine_core_detach(job_list_t *jobs, struct job *j)
{
    job_detach(jobs, j);
    CHARGED_ASSERT(j->detached);
    switch (j->state) {
    case JOB_BACKLOG:
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_NONE; /* never started: nothing was left */
    case JOB_CALLING:
    case JOB_CALLING_FENCED:
    case JOB_PERSIST:
    case JOB_DEAD_LETTER_SENT:
        /* A call in flight keeps its lease: the next owner must not send
         * under its key while it is out. It still ends, and its outcome is
         * persisted under that lease. */
        return ENGINE_NEXT_SKIP;
    case JOB_CALL:
    case JOB_PARKED:
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_RELEASE;
    default:
        job_set(jobs, j, JOB_DONE);
        return ENGINE_NEXT_DONE;
    }
}

const char *engine_core_reap(job_list_t *jobs, offset_tracker_t *offsets, struct job *j)
{
    CHARGED_ASSERT(j->state == JOB_DONE);
    const char *what = j->outcome ? j->outcome : j->detached ? "released" : "error";
    if (!j->detached)
        offset_tracker_done(offsets, j->partition, j->offset);
    job_list_remove(jobs, j);
    return what;
}

int engine_core_commit_ok(const job_list_t *jobs, int32_t partition, int64_t offset)
{
    CHARGED_ASSERT(partition >= 0);

    for (struct job *j = job_list_oldest(jobs); j; j = job_younger(j))
        if (!j->detached && j->partition == partition && j->offset < offset)
            return 0;
    return 1;
}

int engine_core_idle_ms(const struct engine_core *c, const job_list_t *jobs,
                        const struct engine_core_wake *w, int64_t now)
{
    CHARGED_ASSERT(w->cap >= 0);
    int cap = w->revoking && w->cap > 10 ? 10 : w->cap; /* draining: look often */
    int64_t next = now + cap, db_at = w->db_at;
    if (job_list_count(jobs, JOB_DONE))
        return 0;
    if (job_list_count(jobs, JOB_CLAIM)) {
        int64_t claim_at = db_at > w->claim_at ? db_at : w->claim_at;
        if (claim_at < next)
            next = claim_at;
    }
    /* While a revocation drains, the cap looks often enough: the backlog of
     * its partitions does not start. */
    if (w->take_new && !w->revoking && job_list_count(jobs, JOB_BACKLOG) &&
        (long long)engine_core_started(jobs) < c->max_in_flight)
        return 0;
    if (job_list_count(jobs, JOB_DEAD_LETTER_SENT) && now + 5 < next)
        next = now + 5;
    /* A parked job comes back when due, if a slot is free (a slot freed
     * wakes the loop itself: its job is DONE). */
    if ((long long)engine_core_started(jobs) < c->max_in_flight &&
        job_list_next_at(jobs, JOB_PARKED) < next)
        next = job_list_next_at(jobs, JOB_PARKED) > now
                   ? job_list_next_at(jobs, JOB_PARKED)
                   : now;
    /* A call waits for the breaker too; INT64_MAX (a probe is out) wakes
     * nothing: the probe's answer does. */
    int64_t at = job_list_next_at(jobs, JOB_CALL);
    if (at < next && w->calls_at < next)
        next = at > w->calls_at ? at : w->calls_at;
    /* Database steps wait for its back-off: while it is down, a job due for
     * one would otherwise spin the loop. */
    static const enum job_state timed[] = {JOB_RECORD, JOB_WAIT, JOB_DEAD_LETTER,
                                           JOB_PERSIST};
    int slot_free = (long long)engine_core_started(jobs) < c->max_in_flight;
    for (size_t i = 0; i < sizeof(timed) / sizeof(timed[0]); i++) {
        /* A waiting job claims again only with a slot free (as a parked
         * one calls). */
        if (timed[i] == JOB_WAIT && !slot_free)
            continue;
        at = job_list_next_at(jobs, timed[i]);
        if (timed[i] != JOB_DEAD_LETTER && at < db_at)
            at = db_at;
        if (timed[i] == JOB_WAIT && at < w->claim_at)
            at = w->claim_at;
        if (timed[i] == JOB_RECORD && at < w->record_at)
            at = w->record_at;
        if (timed[i] == JOB_PERSIST && at < w->persist_at)
            at = w->persist_at;
        if (at < next)
            next = at;
    }
    if (db_at > now && db_at < next)
        next = db_at;
    CHARGED_ASSERT(next <= now + cap); /* never past the cap */
    return next <= now ? 0 : (int)(next - now);
}

int engine_core_only_calls_left(const job_list_t *jobs)
{
    /* Messages in the backlog are not started while draining: they wait
     * like the calls do. */
    size_t waiting = job_list_holding_in(jobs, JOB_CALL) +
                     job_list_holding_in(jobs, JOB_PARKED) +
                     job_list_holding_in(jobs, JOB_BACKLOG);
    CHARGED_ASSERT(waiting <= job_list_holding(jobs));
    return job_list_holding(jobs) == waiting;
}
