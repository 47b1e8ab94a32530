/* engine_int: what the engine's own files share, and nothing else does.
 *
 * The engine is one object in five files, by layer:
 *   engine_core.c      the decisions, pure (engine_core.h): the simulation
 *                      runs it too;
 *   engine_kafka.c     librdkafka: fetch, hand-back, dead letters and their
 *                      deliveries, rebalances and their drain, commits, the
 *                      pause the breaker holds, lag;
 *   engine_store.c     the operation's store: record, claim, persist, renew,
 *                      the call log, each batch with its one-at-a-time
 *                      fallback;
 *   engine_provider.c  the provider: calls, their answers, the breaker and
 *                      its probe;
 *   engine.c           the loop: start, step, drain, finish.
 * Each I/O file acts on what the core decides. */
#ifndef CHARGED_ENGINE_INT_H
#define CHARGED_ENGINE_INT_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "batch_gate.h"
#include "budget_member.h"
#include "daemon.h"
#include "engine.h"
#include "engine_core.h"
#include "job.h"
#include "offset_tracker.h"
#include "provider_breaker.h"
#include "provider_client.h"
#include "provider_pace.h"
#include "stage_lane.h"
#include "traceparent.h"

/* Messages held at most, as a multiple of WORKER_MAX_IN_FLIGHT: past it a
 * message polled only to stay in the group is handed back (seek). */
#define HELD_FACTOR 2
/* The breaker's probe is a request to the charge endpoint (class create)
 * at a charge's priority: no higher, or a flapping breaker takes the
 * captures' and refunds' budget across the fleet; no lower, or the
 * reconciler's look-ups keep a whole worker paused. */
#define ENGINE_PROBE_CLASS    BUDGET_CLASS_CREATE
#define ENGINE_PROBE_PRIORITY BUDGET_PRIO_CHARGE
/* Provider calls waiting to be written to provider_calls, at most. */
#define CALL_LOG_MAX 4096
/* Items another session's lock held, tried again alone each turn at most:
 * each may wait a lock_timeout (100 ms), and the loop must go on. */
#define HELD_PER_TURN 4
/* The lock_timeout of a try of one item alone after its batch met a row
 * another session holds (db_lock_timeout_override): that holder held it a
 * whole lock_timeout already, and the loop waits for every such try, so a
 * batch of 150 held rows cost 15 s of the loop at the session's 100 ms. */
#define ALONE_LOCK_TIMEOUT "5ms"
/* A lane's task stops its tries of items alone after this long (the rest
 * go in the next batch, without the held ones, which wait a back-off):
 * renewals wait for the persist lane, and 900 calls newly held, 5 ms
 * each, kept it 4.5 s and let leases of ours expire (an outside attack). */
#define ALONE_BUDGET_MS 200
/* Items ready for one statement that run it at once, whatever the gate's
 * hold (batch_gate.h). */
#define BATCH_FULL 128
/* Readiness must not rest on a database step long past: after this long
 * without one, a ping asks whether the database still answers. */
#define DB_PING_MS 5000
/* A worker without partitions this long says so, once, with what it looks
 * like under each group protocol: readiness alone says nothing of why. */
#define UNASSIGNED_WARN_MS 30000
/* The lag while paused: how often it is asked of the broker, and the most
 * the loop spends on it each time. */
#define PAUSED_LAG_MS        5000
#define PAUSED_LAG_BUDGET_MS 1000

/* The database stages that run on lanes of their own (stage_lane.h): a
 * statement of one waiting for a lock holds none of the others, nor the
 * loop. The calls' log goes with the persist, as it must come before it;
 * so do the renewals and the waits, which lock the rows of our claims that
 * the persist writes: on one lane they never wait for each other. */
enum engine_lane_id {
    ENGINE_LANE_RECORD,
    ENGINE_LANE_CLAIM,
    ENGINE_LANE_PERSIST, /* also the renewals and the waits (engine_store.c) */
    ENGINE_LANES
};

struct engine_lane {
    stage_lane_t *lane;
    void *op_state; /* op->open's, the lane's own session */
};

/* A delivery report of a dead letter, recorded by the callback and applied
 * by the loop. */
struct delivery {
    struct job *job;
    rd_kafka_resp_err_t err;
};

/* Partitions taken away by the group, recorded by the rebalance callback;
 * the loop drains their jobs until the deadline, then gives them up. */
struct revocation {
    struct revocation *next;
    rd_kafka_topic_partition_list_t *parts;
    int64_t deadline;
    int lost; /* no drain, no commit: someone else may own them already */
};

/* A provider call not yet written to provider_calls. */
struct call_entry {
    char id[64];
    int kind;
    const char *id_field; /* the job's */
    char order_id[64];
    char traceparent[TRACEPARENT_LEN + 1];
    int64_t started_ms; /* wall clock */
    struct provider_result res;
    int lock_waits;    /* held by another session's lock so far */
    int written_maybe; /* a write of it failed, and may yet commit */
    int64_t next_at;
};

struct engine {
    config_t *cfg;
    char id[160];
    char instance[256]; /* group.instance.id; "" for dynamic membership */
    const char *group, *commands_topic, *dlq_topic;
    struct engine_core core; /* the limits its decisions take */
    long long lease_ms;
    long long commit_interval_ms, shutdown_ms, drain_ms, provider_timeout_ms;
    rd_kafka_t *consumer, *producer;
    /* The loop's one wait wakes when either client's queue gets an event:
     * librdkafka writes to wake[1] (rd_kafka_queue_io_event_enable), the
     * wait reads wake[0] beside the provider's sockets. */
    rd_kafka_queue_t *consumer_queue, *producer_queue;
    int wake[2], wake_open;
    /* The lanes write to their own pipe when a statement ends: the wait
     * sees it beside wake[0], and so does the quiet sleep, which does not
     * wake for answers or messages. */
    int lane_wake[2], lane_wake_open;
    int upkeep_out; /* the persist lane runs a renewal or the waits */
    const struct engine_op *op;
    void *op_state; /* op->open's: the loop's own session */
    struct engine_lane lanes[ENGINE_LANES];
    provider_client_t *provider;
    provider_breaker_t *breaker;
    enum provider_breaker_state breaker_seen; /* as last acted upon */
    uint64_t breaker_opens;                   /* opens acted upon */
    char breaker_error[256]; /* the failure that last opened it, for its log line */
    int breaker_opened_calls, breaker_opened_failures; /* the window that opened it */
    int paused; /* the assigned partitions are paused (breaker) */
    /* Calls started per second, lowered by 429s (provider_pace.h). */
    struct provider_pace pace;
    /* When the record and the persist stages (and the calls' log, with
     * the persist) may run a statement: at once at low load, gathered
     * for at most WORKER_BATCH_HOLD_MS under load. */
    struct batch_gate record_gate, persist_gate;
    /* This process's share of the fleet's provider budget: every call asks
     * its gate first (budget_member.h). */
    budget_member_t *budget;
    /* The budget's raises of its limits the pace last started under
     * (engine_follow_budget, budget_member_settings_raises). */
    long long budget_raises;
    size_t waits_shown; /* jobs whose record shows a wait (engine_write_waits) */
    size_t waits_paced; /* jobs the pace held this turn whose record should say
                           so (engine_start_calls, engine_write_waits) */
    /* The half-open breaker's probe: a refused charge request, so
     * that no attempt (a poisoned one least of all) decides for the others
     * whether the provider is back. */
    struct provider_breaker_ticket probe_ticket;
    int probe_out;
    char probe_tag; /* its address marks the probe's answer */
    /* The probe asks the fleet's budget as a call does (ENGINE_PROBE_*);
     * told to wait, it is not sent before probe_at. */
    struct budget_ask probe_ask;
    int64_t probe_at;
    int64_t next_paused_lag; /* engine_paused_lag() */
    offset_tracker_t *offsets;
    job_list_t *jobs;
    int64_t last_full_poll_ms;
    int64_t last_commit_ms, last_renew_ms;
    struct daemon_db db;
    int assigned;                /* partitions the group gave us */
    int assignment_changed;      /* a rebalance since they were counted */
    int64_t unassigned_since_ms; /* 0 while partitions are assigned */
    int unassigned_warned;
    size_t call_log_dropped;
    struct handback {
        int32_t partition;
        int64_t offset;
    } handbacks[64]; /* messages handed back (seek) and not yet seen again */
    size_t nhandbacks;
    struct call_entry *call_log; /* provider calls not yet written */
    size_t call_log_len, call_log_cap;
    struct delivery *deliveries; /* recorded by on_delivery */
    size_t ndeliveries, deliveries_cap;
    struct revocation *revocations; /* recorded by on_rebalance, oldest first */
    int closing;                    /* consumer_close runs: give up at once */
    int fatal;                      /* the consumer failed for good */
    /* A permission Kafka denies us ("kafka denies Read on group G"), ""
     * while none is; denied_kind says what proves it back (engine_kafka.c). */
    char denied[160];
    int denied_kind;
};

/* Test builds only (CHARGED_FAILPOINTS): dies on the spot at a named point
 * when asked to by CHARGED_FAILPOINT, to prove that a crash there loses and
 * repeats nothing. Other builds hold neither the code nor the names. */
#ifdef CHARGED_FAILPOINTS
void engine_failpoint(const char *name);
#define FAILPOINT(name) engine_failpoint(name)
#else
#define FAILPOINT(name) ((void)0)
#endif

/* ---- engine.c ---- */

/* Reaps the jobs that are DONE: their offsets become committable. */
void engine_reap(engine_t *eng);
void engine_job_free(engine_t *eng, struct job *j);

/* ---- engine_kafka.c ---- */

/* Polls the consumer (which also serves rebalances and commit results) and
 * takes messages while the backlog has room. */
void engine_fetch(engine_t *eng, int allow_new);
/* The loop's only wait: at most wait_ms, until a provider answer, a Kafka
 * event (a message, a rebalance, a commit's or a delivery's result) or
 * curl's own timer; the Kafka clients' queues are then served without
 * waiting. */
void engine_wait(engine_t *eng, int wait_ms);
/* Starts backlog jobs while fewer than max_in_flight run. */
void engine_start_jobs(engine_t *eng, int take_new);
void engine_send_dead_letters(engine_t *eng);
void engine_apply_deliveries(engine_t *eng);
/* Commits what offset_tracker allows, of `only` (all when NULL). */
void engine_commit_offsets(engine_t *eng, int sync,
                           const rd_kafka_topic_partition_list_t *only);
void engine_set_paused(engine_t *eng, int pause);
void engine_paused_lag(engine_t *eng, int64_t now);
/* Ends revocations drained or past their deadline (all: every one). */
void engine_finish_revocations(engine_t *eng, int all);
/* Started jobs of `parts` (all when NULL) that still hold an offset. */
size_t engine_jobs_of(engine_t *eng, const rd_kafka_topic_partition_list_t *parts);
/* Gives up the unfinished jobs of `parts` (all when NULL); how many. A job
 * a lane holds is detached at once and moved once its result is applied: */
size_t engine_detach(engine_t *eng, const rd_kafka_topic_partition_list_t *parts);
void engine_detach_after_lane(engine_t *eng, struct job *j);
/* The consumer and the dead-letter producer, configured (CHARGED_GIVE_UP
 * and err on a setting refused), and subscribed later (CHARGED_RETRY and
 * err when Kafka refuses). */
enum charged_rc engine_kafka_setup(engine_t *eng, struct charged_error *err);
enum charged_rc engine_kafka_subscribe(engine_t *eng, struct charged_error *err);
/* Serves the dead letters' delivery reports, flush_ms at most: before the
 * jobs they point at are freed. */
void engine_kafka_flush(engine_t *eng, int flush_ms);
/* The consumer, the producer and the revocations, after the jobs. */
void engine_kafka_teardown(engine_t *eng);

/* ---- engine_store.c ---- */

int engine_db_ready(engine_t *eng);
/* The lanes, each with its session, once the wake pipe is open; closed
 * (a task in hand dropped: its jobs are freed after) by engine_lanes_close. */
enum charged_rc engine_lanes_open(engine_t *eng, struct charged_error *err);
void engine_lanes_close(engine_t *eng);
/* Until a lane's statement ends, at most ms (the quiet sleep). */
void engine_lanes_sleep(engine_t *eng, int ms);
/* Ends a renewal or a write of waits in flight (quick: they skip what
 * another session holds), so that a lease released now is not one of the
 * rows it locked (releases skip those). */
void engine_lanes_upkeep_wait(engine_t *eng);
/* Applies what the lanes finished (all: waits for each to end). */
void engine_lanes_collect(engine_t *eng, int all);
/* A lane is free for its stage's next statement. */
int engine_lane_idle(const engine_t *eng, enum engine_lane_id lane);
void engine_db_ok(engine_t *eng);
void engine_db_failed(engine_t *eng, const char *stage, const char *err);
void engine_record_attempts(engine_t *eng);
void engine_claim_attempts(engine_t *eng);
void engine_persist_outcomes(engine_t *eng);
/* Writes the waiting provider calls: CHARGED_OK, or CHARGED_RETRY when the
 * database could not take them now. */
enum charged_rc engine_flush_call_log(engine_t *eng);
/* The same, when the persist stage's gate allows a statement: the calls
 * of jobs that do not persist yet (retries, parked) share one. */
void engine_flush_calls_due(engine_t *eng);
void engine_renew_leases(engine_t *eng);
/* Writes the waits the core decided for the claimed jobs (one statement
 * for the turn's, engine_core_wait_due). */
void engine_write_waits(engine_t *eng);
/* Lets go of the lease of a job we will not finish. */
void engine_release_lease(engine_t *eng, struct job *j);
/* Remembers a provider call for the provider_calls table. */
void engine_log_call(engine_t *eng, struct job *j, const struct provider_result *res);

/* ---- engine_provider.c ---- */

void engine_start_calls(engine_t *eng);
/* Parked jobs due, back to CALL while slots are free: before the backlog
 * starts (they are older). */
void engine_unpark_jobs(engine_t *eng);
/* Serves curl for up to wait_ms and acts on every answer that came. */
void engine_collect_calls(engine_t *eng, int wait_ms);
/* Acts on the breaker: logs, probes, pauses. */
void engine_breaker_sync(engine_t *eng);

#endif
