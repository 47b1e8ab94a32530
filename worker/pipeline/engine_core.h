/* engine_core: the engine's decisions, without I/O.
 *
 * Every answer the engine gets (a store's, the provider's, the broker's)
 * moves a job here, and what the engine must do about it comes back as a
 * value: the I/O files around it (engine_kafka.c, engine_store.c,
 * engine_provider.c, engine.c) talk to librdkafka, the store and the
 * provider, log, count, and act on that value. No clock (`now` is passed
 * in), no librdkafka, no libpq, no log of its own (job_set's line before
 * an impossible move aborts is the job list's): the simulation (tests/sim)
 * runs these very functions against its models of the store, the provider
 * and Kafka, as TigerBeetle's VOPR runs its real replica. What must hold
 * whatever the input is asserted (CHARGED_ASSERT): a broken state stops
 * the process before anything past it is written or committed.
 *
 * What differs between operations (how an answer is decided, what an
 * outcome says) comes in through the job's engine_op; the core keeps only
 * what every operation shares: tries and back-off, the key window, leases
 * and their epochs, and the offsets that may be committed. */
#ifndef CHARGED_ENGINE_CORE_H
#define CHARGED_ENGINE_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "job.h"
#include "offset_tracker.h"
#include "provider_outcome.h"

/* ---- what an operation's store answers (engine.h's items carry them) ---- */

enum engine_record_result {
    ENGINE_RECORDED = 0,     /* new or the same command again: claim it */
    ENGINE_CONFLICT,         /* key or id reused with other parameters: dead letter */
    ENGINE_REJECTED,         /* recorded REJECTED before any call: done */
    ENGINE_RECORD_AGAIN,     /* a race moved under us: record again later */
    ENGINE_RECORDED_CLAIMED, /* new, and claimed in the same statement: call */
};

enum engine_claim_result {
    ENGINE_CLAIMED = 0, /* ours: call the provider under lease_epoch */
    ENGINE_SETTLED,     /* nothing to call: the outcome is durable */
    ENGINE_BUSY,        /* leased or locked by someone else: wait */
};

/* What the engine's back-off and every operation's decision take. */
struct engine_policy {
    int unknown_retries;     /* sends again after an unknown outcome */
    long long retry_base_ms; /* first back-off */
    long long retry_max_ms;  /* back-off cap */
    long long first_look_ms; /* an unknown or processing outcome waits this long
                                for the reconciler's first look */
};

/* An operation's decision on a provider's answer to a record of `kind`
 * (engine_op's decide): settle, with what, or send again. may_replay: the
 * answer may be the provider's stored answer of an earlier execution under
 * the key, as old as it (the provider said so, Idempotent-Replayed; or an
 * earlier call under the key may have executed: a retry under this claim,
 * or a claim of a record sent before); tries: sends so far that got this
 * kind of answer under the claim (retry_tries_count), this one included;
 * key_window_open: another send would still reach the provider while it
 * keeps the key; jitter spreads retries apart. */
typedef struct answer_decision (*engine_decide_fn)(
    int kind, const struct engine_policy *p, enum provider_outcome outcome,
    int may_replay, int tries, int key_window_open, unsigned jitter);

/* The engine's limits, from the role's configuration (or the simulation's
 * settings). */
struct engine_core {
    struct engine_policy policy; /* tries and back-off */
    long long max_in_flight;     /* jobs started at once */
    long long recheck_ms;        /* a record leased by someone else: look again */
    /* No call is sent once the key's age plus the margin reaches the
     * provider's retention (the margin: one call's time on the wire and
     * clock differences, charge_policy_key_margin_ms). */
    long long key_retention_ms, key_margin_ms;
    engine_decide_fn decide; /* the operation's */
    /* The event a record of `kind` entering `status` publishes (NULL: the
     * decision's own). */
    const char *(*event_type)(int kind, enum attempt_status status);
    /* Whether a record of `kind` the provider keeps throttling may be set
     * aside (engine_core_answered; NULL: none may). */
    int (*sets_aside)(int kind);
};

/* What the I/O side does after a move: log it, count it, let a lease go. */
enum engine_next {
    ENGINE_NEXT_NONE = 0,
    ENGINE_NEXT_CLAIMED,     /* the job holds the lease: on to the provider */
    ENGINE_NEXT_REJECTED,    /* settled REJECTED before any call: done */
    ENGINE_NEXT_DEAD_LETTER, /* to the DLQ: its error text is the caller's */
    ENGINE_NEXT_SKIP,        /* not due, or held by another job of ours */
    ENGINE_NEXT_RELEASE,     /* done without a call: release its lease */
    ENGINE_NEXT_KEY_CLOSED,  /* the key may be forgotten: settled unsent */
    ENGINE_NEXT_SEND,        /* send the call now (if the breaker allows) */
    ENGINE_NEXT_FENCED,      /* the lease was lost: look again later */
    ENGINE_NEXT_SETTLE,      /* an outcome to persist */
    ENGINE_NEXT_RETRY,       /* send again after a back-off */
    ENGINE_NEXT_BUSY,        /* the row is held by another session: wait */
    ENGINE_NEXT_DONE,        /* durable: reap it */
    ENGINE_NEXT_CUT,         /* a dead letter too large: again at once, cut */
    ENGINE_NEXT_SENT,        /* a dead letter queued: its acknowledgement next */
    ENGINE_NEXT_PARKED,      /* throttled or key in use: parked, its slot freed */
    ENGINE_NEXT_SET_ASIDE,   /* throttled: PROCESSING, for the reconciler */
};

/* ---- starting ---- */

/* Jobs started and not reaped, detached ones included: a call a job of a
 * revoked partition still has out takes its slot until it ends. Parked
 * jobs take none. */
size_t engine_core_started(const job_list_t *jobs);
/* A backlog job's command parsed (ok) or not: RECORD, or DEAD_LETTER. */
void engine_core_parsed(job_list_t *jobs, struct job *j, int ok);

/* ---- dead letters ---- */

/* To the DLQ at once, for `reason` (the caller writes its error text). */
void engine_core_dead_letter(job_list_t *jobs, struct job *j,
                             enum dead_letter_reason reason);
/* Whether a DEAD_LETTER job is produced now: SKIP (not due), DONE
 * (detached: the next owner dead-letters it), SEND. */
enum engine_next engine_core_dead_letter_gate(job_list_t *jobs, struct job *j,
                                              int64_t now);
/* The producer's answer to a dead letter (err 0: queued): SENT, or again
 * at once cut (CUT: too_large, once), or after a back-off (RETRY). */
enum engine_next engine_core_dead_letter_produced(job_list_t *jobs, struct job *j,
                                                  int err, int too_large, int64_t now);
/* The broker's acknowledgement of it (err 0) or not. */
void engine_core_dead_letter_acked(job_list_t *jobs, struct job *j, int err,
                                   int too_large, int64_t now);

/* ---- the store's answers ---- */

/* The job holds the record's lease at lease_epoch now: on to the
 * provider. key_age_ms: the key's age at the claim (database clock). */
void engine_core_claimed(job_list_t *jobs, struct job *j, int64_t lease_epoch,
                         int64_t key_age_ms, int64_t now);
/* A record statement's answer: CLAIMED, REJECTED, DEAD_LETTER or NONE. */
enum engine_next engine_core_recorded(job_list_t *jobs, struct job *j,
                                      enum engine_record_result result,
                                      int64_t lease_epoch, int64_t now);
/* Another session's lock held the job's row: it waits with a back-off (a
 * claim in WAIT, a record where it is). 1 the first time (the caller says
 * so once). */
int engine_core_lock_wait(const struct engine_core *c, job_list_t *jobs, struct job *j,
                          int64_t now);
/* Whether a CLAIM or WAIT job goes into this turn's claim: SEND, SKIP (not
 * due, or another job of ours holds its record: it waits), DONE (detached:
 * it is done). */
enum engine_next engine_core_claim_gate(const struct engine_core *c, job_list_t *jobs,
                                        struct job *j, int64_t now);
/* A claim statement's answer: CLAIMED, REJECTED (rejected: settled by this
 * claim before any call), DONE or NONE. */
enum engine_next engine_core_claim_answered(const struct engine_core *c,
                                            job_list_t *jobs, struct job *j,
                                            enum engine_claim_result result,
                                            int64_t lease_epoch, int64_t key_age_ms,
                                            int rejected, int64_t now);
/* A persist statement's answer for j's outcome, written under
 * lease_epoch: DONE (settled), BUSY (held by another session: again after
 * a back-off; *first_busy says to log it), FENCED (the lease was lost:
 * look again). */
enum engine_next engine_core_persisted(const struct engine_core *c, job_list_t *jobs,
                                       struct job *j, int64_t lease_epoch,
                                       int persisted, int busy, int *first_busy,
                                       int64_t now);
/* Even the review outcome was refused: the job ends, the lease expires. */
void engine_core_abandoned(job_list_t *jobs, struct job *j);
/* The lease renewal found j's lease lost. */
void engine_core_lease_lost(const struct engine_core *c, job_list_t *jobs,
                            struct job *j, int64_t now);

/* ---- the provider ---- */

/* May a call under j's key be sent at `now`? Not once the provider may
 * have forgotten the key: a POST could then charge a second time. The age
 * is the database's at the claim plus what our clock measured since. */
int engine_core_key_kept(const struct engine_core *c, const struct job *j, int64_t now);
/* Whether a CALL job is sent now: SKIP (not due), RELEASE (detached: done,
 * its lease to release), KEY_CLOSED (settled unsent: PERSIST) or SEND. */
enum engine_next engine_core_call_gate(const struct engine_core *c, job_list_t *jobs,
                                       struct job *j, int64_t now);
/* The call is out (CALLING). */
void engine_core_call_started(job_list_t *jobs, struct job *j);
/* The call could not be started: a try, and a back-off. */
void engine_core_call_not_started(const struct engine_core *c, struct job *j,
                                  int64_t now);
/* A throttled job of a kind that may be set aside (engine_core.sets_aside)
 * is, instead of parked, when the jobs held for what neither a slot nor
 * the budget moves (parked after 429s, and waiting for another session or
 * record: captures for their throttled authorizations, adversary 38j; not
 * the budget's waiters) already fill max_in_flight, or its
 * run of 429s has lasted this long: persisted PROCESSING, its lease let go,
 * its next look due when its park would have ended. The reconciler claims
 * it then and sends it again under its key (reconcile_policy's replay).
 * A parked job holds its message and offset: what the provider throttles
 * by itself (one card, adversary 38i) would otherwise fill the messages
 * the worker may hold (HELD_FACTOR x max_in_flight) and stop it fetching
 * anything else, and hold its partition's commits back for as long. */
#define ENGINE_SET_ASIDE_AFTER_MS 60000

/* j->res is the provider's answer. failure: the breaker took it as a
 * failure; opened: recording it opened the breaker; *outage: it was spared
 * as the outage's. FENCED (the lease was lost meanwhile), SETTLE
 * (PERSIST), RELEASE (detached, not ours to retry: done), PARKED (a retry
 * of a throttled answer or a key in use, provider_outcome_parks: its slot
 * freed until engine_core_park_ms has passed), SET_ASIDE (throttled, and
 * ENGINE_SET_ASIDE_AFTER_MS's rule: PERSIST, PROCESSING, reason
 * provider_throttled, next look after the park) or RETRY (in its slot). */
enum engine_next engine_core_answered(const struct engine_core *c, job_list_t *jobs,
                                      struct job *j, int failure, int opened,
                                      int *outage, int64_t now);

/* How long a job parks: the provider's Retry-After (never less, spread by
 * up to a tenth by jitter), else the policy's back-off for `tries`
 * (capped exponential, jittered). */
long long engine_core_park_ms(const struct engine_policy *p,
                              const struct provider_result *res, int tries,
                              unsigned jitter);
/* Whether a PARKED job goes back to CALL now: SEND (due and a slot free:
 * it is CALL, due now) or SKIP. Parked jobs come back before backlog jobs
 * start: they are older. */
enum engine_next engine_core_park_gate(const struct engine_core *c, job_list_t *jobs,
                                       struct job *j, int64_t now);

/* ---- the provider budget ---- */

/* A wait for the budget this long is said (engine_provider.c's
 * engine_budget_waited_long): the attempt is queued, not failed. */
#define ENGINE_BUDGET_LONG_MS 1000

/* The gate's answer for a CALL job the engine was about to send: wait_ms
 * 0 sends it (NONE: nothing moves); else it parks (PARKED), out of its
 * slot, for exactly wait_ms (the gate has no burst: a late ask loses
 * time), its lease and offset kept, and asks again with the same ticket
 * when it is back. */
enum engine_next engine_core_budget(job_list_t *jobs, struct job *j, long long wait_ms,
                                    int64_t now);
/* 1 once a wait, when j has waited for the budget ENGINE_BUDGET_LONG_MS or
 * more. */
int engine_core_budget_waited_long(struct job *j, int64_t now);

/* ---- the wait a record shows (docs/states.md, "Waiting") ----
 *
 * A claimed job that waits before its call for ENGINE_BUDGET_LONG_MS or
 * more says so on its record, so that its status reads queued, not failed:
 * engine_store.c writes what these decide, one UPDATE per batch, outside
 * any transaction and never across a provider call. now is clock_now_ms,
 * wall clock_wall_ms at the same instant (the record's since is wall). */

/* The record's name of a wait ("provider_budget", "provider_throttled"),
 * NULL for none. */
const char *engine_core_waiting_name(enum job_waiting w);
/* j's budget wait passed ENGINE_BUDGET_LONG_MS (engine_core_budget_waited_long
 * said 1): its record says provider_budget since its first ask. */
void engine_core_wait_budget(struct job *j, int64_t now, int64_t wall);
/* j was answered: a 429 parks it for park_ms (its run of 429s begins at
 * the first), any other answer ends the run. A run that, with this park,
 * lasts ENGINE_BUDGET_LONG_MS or more is said at once, since its first 429:
 * the job will have waited that long before it may call again. */
void engine_core_wait_answered(struct job *j, int throttled, long long park_ms,
                               int64_t now, int64_t wall);
/* j was due to be sent but the process's pace (provider_pace.h, cut only
 * by the provider's 429s) held it back: once held ENGINE_BUDGET_LONG_MS, its
 * record says provider_throttled since it was first held, or since its own
 * run of 429s began when that was earlier. A wait already said is kept:
 * the record says why it has waited since. Returns 1 when it says a wait. */
int engine_core_wait_paced(struct job *j, int64_t now, int64_t wall);
/* j's call starts: its record no longer waits, nor is it held at the pace
 * (the run of 429s goes on until an answer that is no 429). */
void engine_core_wait_ends(struct job *j);
/* 1 when j's record must be written for its wait to be true: what it
 * should show differs from what this worker last wrote under this claim. */
int engine_core_wait_due(const struct job *j);

/* ---- offsets and the loop ---- */

/* A job given up (its partition revoked, or the worker stopping): it no
 * longer holds an offset. NONE (taken, never started: done), RELEASE (its
 * call not sent: done, let the lease go), SKIP (a call out, an outcome or
 * a dead letter in flight: it ends on its own), DONE (done now). */
enum engine_next engine_core_detach(job_list_t *jobs, struct job *j);
/* Reaps a DONE job: its offset is done (when it still holds one) and it
 * leaves the list; the caller frees it. What became of the message, for
 * charged_messages_total. */
const char *engine_core_reap(job_list_t *jobs, offset_tracker_t *offsets,
                             struct job *j);
/* 1 when committing `offset` for `partition` commits over no job that
 * still holds an offset there: only durable work is committed. */
int engine_core_commit_ok(const job_list_t *jobs, int32_t partition, int64_t offset);

/* What the loop waits on besides its jobs. */
struct engine_core_wake {
    int cap;          /* the most to wait, ms */
    int take_new;     /* backlog jobs may start */
    int revoking;     /* a revocation drains */
    int64_t calls_at; /* the breaker allows a call (INT64_MAX: a probe's answer) */
    int64_t db_at;    /* the database's back-off ends */
    /* The record and the persist stages' batch gates allow a statement
     * (batch_gate.h): their jobs wait for it too. */
    int64_t record_at, persist_at;
    /* The claim stage may run (its lane is free): JOB_CLAIM and JOB_WAIT
     * wait for it. */
    int64_t claim_at;
};
/* Milliseconds until something is due, capped. */
int engine_core_idle_ms(const struct engine_core *c, const job_list_t *jobs,
                        const struct engine_core_wake *w, int64_t now);
/* 1 when every job left waits for a call (or has not started). */
int engine_core_only_calls_left(const job_list_t *jobs);

#endif
