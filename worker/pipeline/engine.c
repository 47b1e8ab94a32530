#include "engine_int.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "charge_policy.h"
#include "charged_assert.h"
#include "clock.h"
#include "config.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"

#ifdef CHARGED_FAILPOINTS
void engine_failpoint(const char *name)
{
    const char *fp = getenv("CHARGED_FAILPOINT");
    if (fp && !strcmp(fp, name)) {
        log_warn("failpoint reached: killing this worker", "failpoint", name, NULL);
        raise(SIGKILL);
    }
}
#endif

/* ---- the loop ---- */

void engine_job_free(engine_t *eng, struct job *j)
{
    /* Freed only once out of every list. */
    CHARGED_ASSERT(!j->prev && !j->next && !j->state_prev && !j->state_next);
    if (eng->budget)
        budget_member_forget(eng->budget, &j->budget);
    /* Its record's wait ends with its claim (migration 0021's trigger). */
    if (j->wait_shown != JOB_WAITING_NONE) {
        CHARGED_ASSERT(eng->waits_shown > 0);
        eng->waits_shown--;
    }
    if (j->have_cmd)
        eng->op->release(j->command);
    if (j->msg)
        rd_kafka_message_destroy(j->msg);
    free(j);
}

void engine_reap(engine_t *eng)
{
    for (struct job *j = job_list_first(eng->jobs, JOB_DONE), *next; j; j = next) {
        next = job_next_in_state(j);
        metrics_add(METRIC_MESSAGES, 1, engine_core_reap(eng->jobs, eng->offsets, j));
        engine_job_free(eng, j);
    }
    CHARGED_ASSERT(job_list_count(eng->jobs, JOB_DONE) == 0);
}

/* When a call may start: the breaker allows it and the pace has room. A
 * half-open breaker allows only its probe, which the budget may hold back
 * until probe_at: the loop need not turn before. */
static int64_t calls_at(engine_t *eng, int64_t now)
{
    int64_t breaker = provider_breaker_next_allow_ms(eng->breaker, now);
    if (eng->probe_at > breaker &&
        provider_breaker_state(eng->breaker, now) == PROVIDER_BREAKER_HALF_OPEN)
        breaker = eng->probe_at;
    int64_t pace = provider_pace_next_ms(&eng->pace, now);
    CHARGED_ASSERT(pace >= now);
    return breaker > pace ? breaker : pace;
}

/* When a gated stage's jobs may run, asked as the stage asks: with the jobs
 * due now (a full batch of them goes at once), or as one when none is due
 * yet (their own times wait then). Counting the jobs not due would see a
 * full batch the stage never runs: 128 outcomes held by another session's
 * locks spun the loop. */
static int64_t gate_at(const struct batch_gate *g, const job_list_t *jobs,
                       enum job_state state, int64_t now)
{
    size_t due = job_list_due(jobs, state, now);
    return batch_gate_due_at(g, due ? due : job_list_count(jobs, state) ? 1 : 0, now);
}

/* Milliseconds until something is due, capped. */
static int idle_ms(engine_t *eng, int cap, int take_new)
{
    int64_t now = clock_now_ms();
    const struct engine_core_wake w = {
        .cap = cap,
        .take_new = take_new,
        .revoking = eng->revocations != NULL,
        .calls_at = calls_at(eng, now),
        .db_at = eng->db.retry_at,
        /* A stage whose lane is busy runs when it ends: its end wakes the
         * wait. */
        .record_at = engine_lane_idle(eng, ENGINE_LANE_RECORD)
                         ? gate_at(&eng->record_gate, eng->jobs, JOB_RECORD, now)
                         : INT64_MAX,
        .claim_at = engine_lane_idle(eng, ENGINE_LANE_CLAIM) ? 0 : INT64_MAX,
        .persist_at = engine_lane_idle(eng, ENGINE_LANE_PERSIST)
                          ? gate_at(&eng->persist_gate, eng->jobs, JOB_PERSIST, now)
                          : INT64_MAX,
    };
    int ms = engine_core_idle_ms(&eng->core, eng->jobs, &w, now);
    CHARGED_ASSERT(ms >= 0 && ms <= cap);
    return ms;
}

/* While both batch gates hold, nothing read now could be written before
 * the first opens: the loop reads it then (at most a hold later), and under
 * load wakes once a hold instead of once an answer (each wake polls every
 * socket of the calls in flight). The milliseconds to sleep, at most
 * wait; 0 when a gate is open. */
static int quiet_ms(engine_t *eng, int wait)
{
    int64_t now = clock_now_ms();
    int64_t record = batch_gate_holds_until(&eng->record_gate, now);
    int64_t persist = batch_gate_holds_until(&eng->persist_gate, now);
    int64_t until = record < persist ? record : persist;
    if (until <= now)
        return 0;
    return until - now < wait ? (int)(until - now) : wait;
}

/* One turn of the loop. take_new: start new messages (not while draining
 * for shutdown). */
static void turn(engine_t *eng, int take_new)
{
    engine_breaker_sync(eng);
    /* One wait over the provider's sockets and the Kafka clients' queues:
     * an answer is read as soon as it comes, and so is a message, unless
     * both batch gates hold what would come of it. */
    int wait = idle_ms(eng, 100, take_new), quiet = quiet_ms(eng, wait);
    if (quiet > 0) {
        /* A lane's end is not held back: its results may start calls. */
        engine_lanes_sleep(eng, quiet);
        wait = 0;
    }
    engine_wait(eng, wait);
    engine_lanes_collect(eng, 0);
    engine_collect_calls(eng, 0);
    engine_fetch(eng, take_new);
    /* What we hold stays bounded, however long the jobs are stuck. */
    CHARGED_ASSERT((long long)job_list_holding(eng->jobs) <=
                   HELD_FACTOR * eng->core.max_in_flight);
    engine_unpark_jobs(eng);
    engine_start_jobs(eng, take_new);
    engine_send_dead_letters(eng);
    rd_kafka_poll(eng->producer, 0);
    engine_apply_deliveries(eng);
    engine_record_attempts(eng);
    engine_claim_attempts(eng);
    engine_start_calls(eng);
    engine_collect_calls(eng, 0);
    /* The renewals first: they share the persist's lane, and under load
     * the persist would otherwise take it every turn. */
    engine_renew_leases(eng);
    engine_write_waits(eng);
    engine_persist_outcomes(eng);
    engine_flush_calls_due(eng);
    engine_reap(eng);
    engine_finish_revocations(eng, 0);
    if (clock_now_ms() - eng->last_commit_ms >= eng->commit_interval_ms)
        engine_commit_offsets(eng, 0, NULL);
    metrics_set(METRIC_PROVIDER_IN_FLIGHT,
                (double)provider_client_in_flight(eng->provider));
}

/* Ready: the database answers, the group gave us partitions, and the
 * provider breaker does not hold fetching (it is closed). */
static void warn_if_unassigned(engine_t *eng)
{
    int64_t now = clock_now_ms();
    if (eng->assigned > 0) {
        eng->unassigned_since_ms = 0;
        eng->unassigned_warned = 0;
        return;
    }
    if (eng->denied[0])
        return; /* said already, and its hint would mislead */
    if (!eng->unassigned_since_ms)
        eng->unassigned_since_ms = now;
    if (eng->unassigned_warned || now - eng->unassigned_since_ms < UNASSIGNED_WARN_MS)
        return;
    eng->unassigned_warned = 1;
    int consumer = kafka_setup_uses_consumer_protocol(eng->cfg);
    log_warn("no partitions assigned for 30 s", "group", eng->group, "group_protocol",
             consumer ? "consumer" : "classic", "hint",
             consumer
                 ? "the consumer protocol needs Kafka 4.0 or newer brokers, and a "
                   "group that still has classic cooperative-sticky members cannot "
                   "move to it until all of them have left (docs/worker.md)"
                 : "more workers than partitions, or the group cannot complete a "
                   "rebalance",
             NULL);
}

static void check_readiness(engine_t *eng)
{
    struct charged_error err;
    if (engine_db_ready(eng) && clock_now_ms() - eng->db.last_ok_ms >= DB_PING_MS) {
        if (eng->op->ping(eng->op_state, &err) == CHARGED_OK)
            engine_db_ok(eng);
        else
            engine_db_failed(eng, "ping", err.message);
    }
    if (eng->assignment_changed) {
        rd_kafka_topic_partition_list_t *l = NULL;
        if (!rd_kafka_assignment(eng->consumer, &l)) {
            eng->assigned = l->cnt;
            eng->assignment_changed = 0;
        }
        if (l)
            rd_kafka_topic_partition_list_destroy(l);
    }
    warn_if_unassigned(eng);
}

const char *engine_not_ready(engine_t *eng)
{
    const char *why = daemon_db_not_ready(&eng->db);
    if (why)
        return why;
    if (eng->denied[0])
        return eng->denied;
    if (eng->assigned == 0)
        return "no partitions assigned";
    if (eng->paused)
        return "provider breaker open";
    return NULL;
}

/* A turn waits in one poll until something is due (idle_ms): a message, a
 * rebalance, a commit result or a provider answer wakes it (engine_wait),
 * so the step is due again at once. */
int64_t engine_step(engine_t *eng, int64_t now)
{
    CHARGED_ASSERT(eng->jobs != NULL && !eng->closing);
    (void)now;
    turn(eng, 1);
    check_readiness(eng);
    return DAEMON_NOW;
}

/* 1 when the breaker is not closed and every job left waits for a call:
 * draining on would only wait for the deadline, or probe on behalf of the
 * next owner. */
static int held_by_breaker(engine_t *eng)
{
    if (provider_breaker_state(eng->breaker, clock_now_ms()) == PROVIDER_BREAKER_CLOSED)
        return 0;
    return engine_core_only_calls_left(eng->jobs);
}

/* Shutdown: the pipeline runs on, taking nothing new, until every job is
 * finished or the deadline passes; what is left is given up. */
size_t engine_drain(engine_t *eng, int64_t deadline)
{
    CHARGED_ASSERT(eng->jobs != NULL && !eng->closing);
    while (engine_jobs_of(eng, NULL) > 0 && clock_now_ms() < deadline &&
           daemon_stopping() < 2) {
        if (held_by_breaker(eng)) {
            log_warn("provider breaker open: calls not sent are left to the next "
                     "owner",
                     NULL);
            break;
        }
        turn(eng, 0);
    }
    /* Messages of the backlog were taken and are left unfinished too. */
    size_t unstarted = job_list_holding_in(eng->jobs, JOB_BACKLOG);
    engine_finish_revocations(eng, 1);
    size_t left = engine_detach(eng, NULL) + unstarted;
    CHARGED_ASSERT(job_list_holding(eng->jobs) == 0); /* all finished or given up */
    return left;
}

/* ---- start-up ---- */

/* The engine's limits from the configuration, checked against each other:
 * CHARGED_OK, or CHARGED_GIVE_UP and err. */
static enum charged_rc setup_limits(engine_t *eng, struct charged_error *err)
{
    struct engine_core *c = &eng->core;
    eng->group = config_str(eng->cfg, CONFIG_KAFKA_GROUP_ID);
    eng->commands_topic =
        config_str(eng->cfg, (enum config_key)eng->op->commands_topic_key);
    eng->dlq_topic = config_str(eng->cfg, (enum config_key)eng->op->dlq_topic_key);
    c->max_in_flight = config_int(eng->cfg, CONFIG_WORKER_MAX_IN_FLIGHT);
    eng->lease_ms = config_int(eng->cfg, CONFIG_WORKER_LEASE_MS);
    c->policy.unknown_retries =
        (int)config_int(eng->cfg, CONFIG_WORKER_UNKNOWN_RETRIES);
    c->policy.retry_base_ms = config_int(eng->cfg, CONFIG_WORKER_RETRY_BASE_MS);
    c->policy.retry_max_ms = config_int(eng->cfg, CONFIG_WORKER_RETRY_MAX_MS);
    c->policy.first_look_ms = config_int(eng->cfg, CONFIG_RECONCILER_FIRST_LOOK_MS);
    c->key_retention_ms = config_int(eng->cfg, CONFIG_WORKER_KEY_RETENTION_MS);
    eng->commit_interval_ms = config_int(eng->cfg, CONFIG_WORKER_COMMIT_INTERVAL_MS);
    c->recheck_ms = config_int(eng->cfg, CONFIG_WORKER_RECHECK_MS);
    long long hold_ms = config_int(eng->cfg, CONFIG_WORKER_BATCH_HOLD_MS);
    batch_gate_init(&eng->record_gate, hold_ms, BATCH_FULL);
    batch_gate_init(&eng->persist_gate, hold_ms, BATCH_FULL);
    eng->shutdown_ms = config_int(eng->cfg, CONFIG_SHUTDOWN_TIMEOUT_MS);
    eng->drain_ms = config_int(eng->cfg, CONFIG_REBALANCE_DRAIN_MS);
    eng->provider_timeout_ms = config_int(eng->cfg, CONFIG_PROVIDER_TIMEOUT_MS);
    c->event_type = eng->op->event_type;
    c->decide = eng->op->decide;
    c->sets_aside = eng->op->sets_aside;

    /* The lease must outlast one claim's worth of calls and back-offs, or a
     * peer could take over an attempt whose call is still in flight. */
    long long needed = eng->provider_timeout_ms * (c->policy.unknown_retries + 1) +
                       c->policy.retry_max_ms * c->policy.unknown_retries;
    if (eng->lease_ms <= needed) {
        charged_error_set(
            err,
            "WORKER_LEASE_MS: %lld does not outlast the provider timeout and its "
            "retries (%lld ms); raise it or lower PROVIDER_TIMEOUT_MS, "
            "WORKER_UNKNOWN_RETRIES or WORKER_RETRY_MAX_MS",
            eng->lease_ms, needed);
        return CHARGED_GIVE_UP;
    }
    /* No call is sent once the key's age plus this margin reaches the
     * provider's retention: one call's time on the wire, and clock
     * differences between the database and the provider. */
    c->key_margin_ms =
        charge_policy_key_margin_ms(c->key_retention_ms, eng->provider_timeout_ms);
    if (c->key_retention_ms <= c->key_margin_ms) {
        charged_error_set(
            err,
            "WORKER_KEY_RETENTION_MS: %lld leaves no time to call the provider "
            "(PROVIDER_TIMEOUT_MS plus a margin of a tenth, at most 60 s, is "
            "%lld ms)",
            c->key_retention_ms, c->key_margin_ms);
        return CHARGED_GIVE_UP;
    }
    /* Read no more: set, it would be silently ignored, and the breaker an
     * operator tuned would act otherwise than they think. */
    if (getenv("PROVIDER_BREAKER_FAILURES")) {
        charged_error_set(
            err,
            "PROVIDER_BREAKER_FAILURES: no longer read: the breaker opens on a "
            "failure rate (PROVIDER_BREAKER_FAILURE_RATE, PROVIDER_BREAKER_MIN_CALLS, "
            "PROVIDER_BREAKER_WINDOW_MS); unset it");
        return CHARGED_GIVE_UP;
    }
    if (c->policy.retry_base_ms > c->policy.retry_max_ms) {
        charged_error_set(err, "WORKER_RETRY_BASE_MS: larger than WORKER_RETRY_MAX_MS");
        return CHARGED_GIVE_UP;
    }
    return CHARGED_OK;
}

/* The engine's clients and tables: CHARGED_OK, or CHARGED_GIVE_UP (a
 * setting refused) or CHARGED_RETRY (out of memory, Kafka refused the
 * subscription) and err. */
static enum charged_rc setup(engine_t *eng, struct charged_error *err)
{
    CHARGED_ASSERT(eng->cfg != NULL && eng->op != NULL);
    enum charged_rc rc = setup_limits(eng, err);
    if (rc == CHARGED_OK)
        rc = engine_kafka_setup(eng, err);
    if (rc != CHARGED_OK)
        return rc;
    const struct provider_breaker_config bc = {
        .failure_rate = (int)config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_FAILURE_RATE),
        .min_calls = (int)config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_MIN_CALLS),
        .window_ms = config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_WINDOW_MS),
        .open_ms = config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_OPEN_MS),
        .probes = (int)config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_PROBES),
    };
    eng->breaker = provider_breaker_new(&bc);
    provider_pace_init(&eng->pace, clock_now_ms());
    if (!eng->breaker) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    eng->provider =
        provider_client_new(config_str(eng->cfg, CONFIG_PROVIDER_BASE_URL),
                            config_str(eng->cfg, CONFIG_PROVIDER_API_KEY),
                            config_str(eng->cfg, CONFIG_PROVIDER_API_VERSION),
                            eng->provider_timeout_ms, err);
    if (!eng->provider)
        return CHARGED_GIVE_UP;
    eng->op_state = eng->op->open(eng->cfg, eng->id, err);
    if (!eng->op_state)
        return CHARGED_GIVE_UP;
    if ((rc = engine_lanes_open(eng, err)) != CHARGED_OK)
        return rc;
    if ((rc = budget_member_join(eng->cfg, "worker", 1, &eng->budget, err)) !=
        CHARGED_OK)
        return rc;
    eng->budget_raises = budget_member_settings_raises(eng->budget);
    eng->offsets = offset_tracker_new();
    eng->jobs = job_list_new();
    if (!eng->offsets || !eng->jobs) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    return engine_kafka_subscribe(eng, err);
}

/* Every step is bounded: flush_ms for dead letters still unacknowledged;
 * the rest does not wait on anything the jobs hold. */
static void teardown(engine_t *eng, int flush_ms)
{
    engine_lanes_close(eng);
    if (eng->provider)
        provider_client_abandon_all(eng->provider);
    engine_kafka_flush(eng, flush_ms);
    /* Messages go back to librdkafka before its clients do: rd_kafka_destroy
     * waits for every message the application still holds. */
    for (struct job *j; eng->jobs && (j = job_list_oldest(eng->jobs));) {
        job_list_remove(eng->jobs, j);
        engine_job_free(eng, j);
    }
    job_list_free(eng->jobs);
    eng->jobs = NULL;
    engine_kafka_teardown(eng);
    provider_client_free(eng->provider);
    budget_member_free(eng->budget);
    provider_breaker_free(eng->breaker);
    if (eng->op_state)
        eng->op->close(eng->op_state);
    offset_tracker_free(eng->offsets);
    free(eng->call_log);
    free(eng->deliveries);
    config_free(eng->cfg);
}

/* After the drain: commit what finished, leave the group, let go. */
void engine_finish(engine_t *eng, int flush_ms)
{
    CHARGED_ASSERT(!eng->closing); /* finished once */
    engine_lanes_collect(eng, 1);
    /* The calls not written yet (the persist gate held them, or the drain
     * ended early), whatever the gate: a call that took money is never
     * left out of provider_calls by a clean stop. */
    engine_flush_call_log(eng);
    engine_commit_offsets(eng, 1, NULL);
    budget_member_leave(eng->budget); /* its share free at once */
    eng->closing = 1;
    rd_kafka_consumer_close(eng->consumer);
    teardown(eng, flush_ms);
    free(eng);
}

enum charged_rc engine_start(config_t *cfg, const char *id, const struct engine_op *op,
                             engine_t **out, struct charged_error *err)
{
    /* What the engine calls of every operation: the descriptor's contract. */
    CHARGED_ASSERT(cfg != NULL && op != NULL && out != NULL && op->command_size > 0);
    CHARGED_ASSERT(op->open && op->close && op->parse && op->release && op->id_of &&
                   op->order_of && op->ping && op->record && op->claim &&
                   op->log_calls && op->persist && op->renew && op->release_leases &&
                   op->start_call && op->event_type && op->decide && op->outcome);
    engine_t *eng = calloc(1, sizeof(*eng));
    if (!eng) {
        config_free(cfg);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    eng->cfg = cfg;
    eng->op = op;
    snprintf(eng->id, sizeof(eng->id), "%s", id);
    enum charged_rc rc = setup(eng, err);
    if (rc != CHARGED_OK) {
        teardown(eng, 0);
        free(eng);
        return rc;
    }
    char lease[32], mif[32];
    snprintf(lease, sizeof(lease), "%lld", eng->lease_ms);
    snprintf(mif, sizeof(mif), "%lld", eng->core.max_in_flight);
    log_info("worker started", "worker", eng->id, "group", eng->group,
             "group_instance_id", eng->instance[0] ? eng->instance : NULL, "topic",
             eng->commands_topic, "lease_ms", lease, "max_in_flight", mif, "librdkafka",
             rd_kafka_version_str(), "group_protocol",
             kafka_setup_uses_consumer_protocol(eng->cfg) ? "consumer" : "classic",
             NULL);
    *out = eng;
    return CHARGED_OK;
}
