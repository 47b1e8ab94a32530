#include "engine.h"

#include <errno.h>
#include <stddef.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <openssl/evp.h>

#include "attempt_status.h"
#include "card_data.h"
#include "charge_policy.h"
#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "job.h"
#include "dead_letter.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"
#include "offset_tracker.h"
#include "provider_breaker.h"

/* The lag while paused: how often it is asked of the broker, and the most
 * the loop spends on it each time. */
#define PAUSED_LAG_MS        5000
#define PAUSED_LAG_BUDGET_MS 1000
#include "provider_client.h"
#include "traceparent.h"

/* Messages held at most, as a multiple of WORKER_MAX_IN_FLIGHT: past it a
 * message polled only to stay in the group is handed back (seek). */
#define HELD_FACTOR 2
/* Provider calls waiting to be written to provider_calls, at most. */
#define CALL_LOG_MAX 4096
/* Items another session's lock held, tried again alone each turn at most:
 * each may wait a lock_timeout (100 ms), and the loop must go on. */
#define HELD_PER_TURN 4
/* Readiness must not rest on a database step long past: after this long
 * without one, a ping asks whether the database still answers. */
#define DB_PING_MS 5000
/* A worker without partitions this long says so, once, with what it looks
 * like under each group protocol: readiness alone says nothing of why. */
#define UNASSIGNED_WARN_MS 30000
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

struct engine {
    config_t *cfg;
    char id[160];
    char instance[256]; /* group.instance.id; "" for dynamic membership */
    const char *group, *commands_topic, *dlq_topic;
    long long max_in_flight, lease_ms;
    struct charge_policy policy;
    long long key_retention_ms, commit_interval_ms, recheck_ms, shutdown_ms, drain_ms;
    long long provider_timeout_ms, key_margin_ms;
    rd_kafka_t *consumer, *producer;
    const struct engine_op *op;
    void *op_state; /* op->open's */
    provider_client_t *provider;
    provider_breaker_t *breaker;
    enum provider_breaker_state breaker_seen; /* as last acted upon */
    uint64_t breaker_opens;                   /* opens acted upon */
    char breaker_error[256]; /* the failure that last opened it, for its log line */
    int breaker_opened_calls, breaker_opened_failures; /* the window that opened it */
    int paused; /* the assigned partitions are paused (breaker) */
    /* The half-open breaker's probe: a refused charge request, so
     * that no attempt (a poisoned one least of all) decides for the others
     * whether the provider is back. */
    struct provider_breaker_ticket probe_ticket;
    int probe_out;
    char probe_tag;          /* its address marks the probe's answer */
    int64_t next_paused_lag; /* paused_lag() */
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
    } * call_log; /* provider calls not yet written */
    size_t call_log_len, call_log_cap;
    struct delivery *deliveries; /* recorded by on_delivery */
    size_t ndeliveries, deliveries_cap;
    struct revocation *revocations; /* recorded by on_rebalance, oldest first */
    int closing;                    /* consumer_close runs: give up at once */
    int fatal;                      /* the consumer failed for good */
};

/* Test builds only (CHARGED_FAILPOINTS): dies on the spot at a named point
 * when asked to by CHARGED_FAILPOINT, to prove that a crash there loses and
 * repeats nothing. Other builds hold neither the code nor the names. */
#ifdef CHARGED_FAILPOINTS
static void failpoint(const char *name)
{
    const char *fp = getenv("CHARGED_FAILPOINT");
    if (fp && !strcmp(fp, name)) {
        log_warn("failpoint reached: killing this worker", "failpoint", name, NULL);
        raise(SIGKILL);
    }
}
#define FAILPOINT(name) failpoint(name)
#else
#define FAILPOINT(name) ((void)0)
#endif

/* ---- jobs ---- */

static enum metric_key outcomes_metric(const engine_t *eng, const struct job *j)
{
    return eng->op->outcomes_metric ? (enum metric_key)eng->op->outcomes_metric(j->kind)
                                    : METRIC_ATTEMPTS;
}

/* A size rounded up so that what follows it is aligned for any type. */
static size_t job_round(size_t n)
{
    const size_t a = _Alignof(max_align_t);
    return (n + a - 1) / a * a;
}

static void job_free(engine_t *eng, struct job *j)
{
    if (j->have_cmd)
        eng->op->release(j->command);
    if (j->msg)
        rd_kafka_message_destroy(j->msg);
    free(j);
}

/* ---- consuming ---- */

static void hand_back(engine_t *eng, const rd_kafka_message_t *m);
static int revoking(const engine_t *eng, int32_t partition);

/* The command's W3C traceparent header into out, when it has exactly one
 * and it is valid; "" otherwise. Only a validated value is ever copied. */
static void read_traceparent(const rd_kafka_message_t *msg, char *out)
{
    rd_kafka_headers_t *h = NULL;
    const void *v = NULL, *again = NULL;
    size_t n = 0, m = 0;

    out[0] = '\0';
    if (rd_kafka_message_headers(msg, &h) != RD_KAFKA_RESP_ERR_NO_ERROR ||
        rd_kafka_header_get(h, 0, "traceparent", &v, &n) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return;
    /* Two of them: which one is the sender's? Neither. */
    if (rd_kafka_header_get(h, 1, "traceparent", &again, &m) ==
        RD_KAFKA_RESP_ERR_NO_ERROR)
        return;
    traceparent_parse(v, n, out);
}

static void take_message(engine_t *eng, rd_kafka_message_t *msg)
{
    /* The operation's command and params live with the job, aligned. */
    size_t head = job_round(sizeof(struct job)), cmd = job_round(eng->op->command_size);
    struct job *j = calloc(1, head + cmd + eng->op->params_size);

    if (!j || offset_tracker_begin(eng->offsets, msg->partition, msg->offset) != 0) {
        /* Without memory we cannot track it: it goes back to Kafka (nothing
         * behind it is taken), and the worker stops. */
        free(j);
        hand_back(eng, msg);
        rd_kafka_message_destroy(msg);
        daemon_fail("out of memory taking a message; stopping");
        return;
    }
    j->command = (char *)j + head;
    j->params = (char *)j + head + cmd;
    j->msg = msg;
    j->partition = msg->partition;
    j->offset = msg->offset;
    read_traceparent(msg, j->traceparent);
    job_list_add(eng->jobs, j);
}

/* Jobs started and not reaped, detached ones included: a call that a job of
 * a revoked partition still has out takes its slot until it ends. */
static size_t jobs_started(const engine_t *eng)
{
    size_t n = 0;
    for (int s = 0; s < JOB__COUNT; s++)
        if (s != JOB_BACKLOG)
            n += job_list_count(eng->jobs, (enum job_state)s);
    return n;
}

/* Starts backlog jobs, oldest first, while fewer than max_in_flight run;
 * none while draining for shutdown (take_new 0), and none of partitions
 * being revoked: they are left to the next owner. */
static void start_jobs(engine_t *eng, int take_new)
{
    char err[256];
    for (struct job *j = job_list_first(eng->jobs, JOB_BACKLOG), *next; take_new && j;
         j = next) {
        next = job_next_in_state(j);
        if ((long long)jobs_started(eng) >= eng->max_in_flight)
            break;
        if (revoking(eng, j->partition))
            continue;
        rd_kafka_message_t *msg = j->msg;
        j->dl_reason =
            eng->op->parse(eng->op_state, msg->key, msg->key_len, msg->payload,
                           msg->len, j->command, err, sizeof(err));
        if (j->dl_reason == DEAD_LETTER_NONE) {
            j->have_cmd = 1;
            j->id = eng->op->id_of(j->command);
            j->order_id = eng->op->order_of(j->command);
            j->kind = eng->op->kind_of ? eng->op->kind_of(j->command) : 0;
            j->id_field = eng->op->id_field ? eng->op->id_field(j->kind) : NULL;
            job_set(eng->jobs, j, JOB_RECORD);
        } else {
            job_set_error(j, "%s", err);
            job_set(eng->jobs, j, JOB_DEAD_LETTER);
        }
    }
}

/* Hands a message back to Kafka: seeks its partition to it, so that it is
 * fetched again later. Nothing past it is taken meanwhile (see fetch), so
 * no offset can be committed over it. */
static void hand_back(engine_t *eng, const rd_kafka_message_t *m)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, rd_kafka_topic_name(m->rkt), m->partition)
        ->offset = m->offset;
    rd_kafka_error_t *e = rd_kafka_seek_partitions(eng->consumer, l, 0);
    if (e)
        rd_kafka_error_destroy(e);
    rd_kafka_topic_partition_list_destroy(l);
    for (size_t i = 0; i < eng->nhandbacks; i++)
        if (eng->handbacks[i].partition == m->partition)
            return; /* the earlier one is still the resume point */
    if (eng->nhandbacks < sizeof(eng->handbacks) / sizeof(eng->handbacks[0]))
        eng->handbacks[eng->nhandbacks++] = (struct handback){m->partition, m->offset};
}

static void forget_handback(engine_t *eng, int32_t partition)
{
    for (size_t i = 0; i < eng->nhandbacks; i++)
        if (eng->handbacks[i].partition == partition) {
            eng->handbacks[i] = eng->handbacks[--eng->nhandbacks];
            return;
        }
}

/* 1 when m comes after a message of its partition that we handed back and
 * have not seen again: it must not be taken before that one. */
static int behind_handback(engine_t *eng, const rd_kafka_message_t *m)
{
    for (size_t i = 0; i < eng->nhandbacks; i++)
        if (eng->handbacks[i].partition == m->partition) {
            if (m->offset > eng->handbacks[i].offset)
                return 1;
            forget_handback(eng, m->partition);
            return 0;
        }
    return 0;
}

static int in_parts(const struct engine *eng,
                    const rd_kafka_topic_partition_list_t *parts, int32_t partition)
{
    return !parts ||
           rd_kafka_topic_partition_list_find(parts, eng->commands_topic, partition);
}

/* 1 when partition is being drained for a revocation: its messages are not
 * taken any more. */
static int revoking(const struct engine *eng, int32_t partition)
{
    for (const struct revocation *r = eng->revocations; r; r = r->next)
        if (in_parts(eng, r->parts, partition))
            return 1;
    return 0;
}

/* Polls the consumer, which also serves rebalances and commit results.
 * Takes messages while the backlog has room. With a full backlog it polls
 * once a second only, so that the group never waits on us; a message such a
 * poll returns is taken only while fewer than HELD_FACTOR x max_in_flight
 * are held, and handed back otherwise, so memory stays bounded however long
 * the jobs are stuck (partitions are never paused: see docs/worker.md). */
static void fetch(engine_t *eng, int wait_ms, int allow_new)
{
    int64_t now = clock_now_ms();
    if ((long long)job_list_holding_in(eng->jobs, JOB_BACKLOG) >= eng->max_in_flight &&
        allow_new) {
        if (now - eng->last_full_poll_ms < 1000) {
            struct timespec ts = {0, (long)(wait_ms < 10 ? wait_ms : 10) * 1000000L};
            nanosleep(&ts, NULL);
            return;
        }
        eng->last_full_poll_ms = now;
        wait_ms = 0;
    }
    for (int first = 1;; first = 0) {
        rd_kafka_message_t *m =
            rd_kafka_consumer_poll(eng->consumer, first ? wait_ms : 0);
        if (!m)
            break;
        if (m->err == RD_KAFKA_RESP_ERR__FATAL) {
            /* Fenced (another process with our group.instance.id, say):
             * this consumer can do nothing more. */
            char fatal[256];
            rd_kafka_message_destroy(m);
            if (!eng->fatal) {
                eng->fatal = 1;
                rd_kafka_fatal_error(eng->consumer, fatal, sizeof(fatal));
                log_error("kafka consumer fatal error", "error", fatal, NULL);
                daemon_fail("the kafka consumer failed for good; stopping");
            }
            break;
        }
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                log_warn("consumer error", "error", rd_kafka_message_errstr(m), NULL);
            rd_kafka_message_destroy(m);
            continue;
        }
        if (!allow_new || revoking(eng, m->partition)) {
            /* Not ours to start (stopping, or its partition is going): it
             * comes back to whoever consumes the partition next. */
            rd_kafka_message_destroy(m);
            continue;
        }
        if (behind_handback(eng, m)) {
            /* Fetched before our seek took effect, or the seek was lost:
             * seek again, to the message we handed back. */
            rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
            for (size_t i = 0; i < eng->nhandbacks; i++)
                if (eng->handbacks[i].partition == m->partition)
                    rd_kafka_topic_partition_list_add(l, rd_kafka_topic_name(m->rkt),
                                                      m->partition)
                        ->offset = eng->handbacks[i].offset;
            rd_kafka_error_t *e = rd_kafka_seek_partitions(eng->consumer, l, 0);
            if (e)
                rd_kafka_error_destroy(e);
            rd_kafka_topic_partition_list_destroy(l);
            rd_kafka_message_destroy(m);
            continue;
        }
        if ((long long)job_list_holding(eng->jobs) >=
            HELD_FACTOR * eng->max_in_flight) {
            hand_back(eng, m);
            rd_kafka_message_destroy(m);
            break;
        }
        take_message(eng, m);
        if ((long long)job_list_holding_in(eng->jobs, JOB_BACKLOG) >=
            eng->max_in_flight)
            break;
    }
}

/* ---- dead letters ---- */

/* Errors that producing the same letter again can never cure: it is too
 * large for the producer, the broker or the DLQ topic. */
static int too_large(rd_kafka_resp_err_t err)
{
    return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
           err == RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE ||
           err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

/* Records the report; apply_deliveries() acts on it from the loop. */
static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    engine_t *eng = opaque;
    (void)rk;
    if (!m->_private)
        return;
    if (eng->ndeliveries == eng->deliveries_cap) {
        size_t ncap = eng->deliveries_cap ? eng->deliveries_cap * 2 : 64;
        struct delivery *d = realloc(eng->deliveries, ncap * sizeof(*d));
        if (!d) {
            /* Unrecorded, the job waits in DEAD_LETTER_SENT: its offset
             * stays uncommitted and the message comes back. */
            log_error("out of memory recording a delivery report", NULL);
            return;
        }
        eng->deliveries = d;
        eng->deliveries_cap = ncap;
    }
    eng->deliveries[eng->ndeliveries++] = (struct delivery){m->_private, m->err};
}

static void apply_deliveries(engine_t *eng)
{
    for (size_t i = 0; i < eng->ndeliveries; i++) {
        struct job *j = eng->deliveries[i].job;
        rd_kafka_resp_err_t err = eng->deliveries[i].err;
        if (!err) {
            metrics_add(METRIC_DEAD_LETTERS, 1, dead_letter_reason_name(j->dl_reason));
            j->outcome = "dead_lettered";
            job_set(eng->jobs, j, JOB_DONE);
            continue;
        }
        log_warn("dead letter not acknowledged; retrying", "error",
                 rd_kafka_err2str(err), JOB_FIELDS(j), NULL);
        job_set(eng->jobs, j, JOB_DEAD_LETTER);
        if (too_large(err) && !j->dl_cut) {
            j->dl_cut = 1; /* again at once, cut */
            j->next_at = 0;
        } else {
            j->next_at = clock_now_ms() + 1000;
        }
    }
    eng->ndeliveries = 0;
}

static void send_dead_letters(engine_t *eng)
{
    int64_t now = clock_now_ms();
    for (struct job *j = job_list_first(eng->jobs, JOB_DEAD_LETTER), *next; j;
         j = next) {
        struct dead_letter dl;
        char part[16], off[32];
        next = job_next_in_state(j);
        if (j->next_at > now)
            continue;
        if (j->detached) {
            job_set(eng->jobs, j, JOB_DONE);
            continue;
        }
        const struct dead_letter_origin origin = {
            .topic = eng->commands_topic,
            .partition = j->partition,
            .offset = j->offset,
            .timestamp_ms = rd_kafka_message_timestamp(j->msg, NULL),
            .consumer_group = eng->group,
            .worker = eng->id,
        };
        if (dead_letter_build(j->msg, j->dl_reason, j->dl_error, &origin, j->dl_cut,
                              &dl) != 0) {
            j->next_at = now + 1000;
            continue;
        }
        rd_kafka_resp_err_t err = rd_kafka_producev(
            eng->producer, RD_KAFKA_V_TOPIC(eng->dlq_topic),
            RD_KAFKA_V_KEY(dl.key, dl.key_len),
            RD_KAFKA_V_VALUE(dl.value, dl.value_len), RD_KAFKA_V_HEADERS(dl.headers),
            RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_OPAQUE(j),
            RD_KAFKA_V_END);
        if (err == RD_KAFKA_RESP_ERR_NO_ERROR)
            dl.headers = NULL; /* librdkafka owns them now */
        dead_letter_release(&dl);
        snprintf(part, sizeof(part), "%d", (int)j->partition);
        snprintf(off, sizeof(off), "%lld", (long long)j->offset);
        if (err && too_large(err) && !j->dl_cut) {
            log_warn("dead letter too large for the DLQ; producing it cut", "error",
                     rd_kafka_err2str(err), "partition", part, "offset", off,
                     JOB_FIELDS(j), NULL);
            j->dl_cut = 1;
            j->next_at = 0;
            continue;
        }
        if (err) {
            log_warn("cannot produce dead letter; retrying", "error",
                     rd_kafka_err2str(err), "partition", part, "offset", off,
                     JOB_FIELDS(j), NULL);
            j->next_at = now + 500;
            continue;
        }
        job_set(eng->jobs, j, JOB_DEAD_LETTER_SENT);
        /* The error line never quotes the value; card digits are masked. */
        log_warn("command dead-lettered", "reason",
                 dead_letter_reason_name(j->dl_reason), "error", j->dl_error,
                 "partition", part, "offset", off, JOB_FIELDS(j), NULL);
    }
}

/* ---- database stages ---- */

static int db_ready(engine_t *eng)
{
    return daemon_db_due(&eng->db);
}

static void db_ok(engine_t *eng)
{
    daemon_db_ok(&eng->db);
}

static void db_failed(engine_t *eng, const char *stage, const char *err)
{
    daemon_db_failed(&eng->db, stage, err);
}

/* A message the database refuses even on its own: a dead letter, so that
 * its partition moves on. The line names the SQLSTATE, never a value. */
static void refuse(engine_t *eng, struct job *j, const char *what, const char *sqlstate)
{
    j->dl_reason = DEAD_LETTER_DATABASE_REFUSED;
    job_set_error(j, "the database refused the %s (sqlstate %s)", what, sqlstate);
    job_set(eng->jobs, j, JOB_DEAD_LETTER);
    j->next_at = 0;
}

static void claimed(engine_t *eng, struct job *j, int64_t lease_epoch,
                    int64_t key_age_ms, const char *previous_status);

static void apply_record(engine_t *eng, struct job *j, const struct engine_record *it)
{
    switch (it->result) {
    case ENGINE_RECORDED_CLAIMED:
        claimed(eng, j, it->lease_epoch, 0, "new");
        break;
    case ENGINE_RECORDED:
        job_set(eng->jobs, j, JOB_CLAIM);
        break;
    case ENGINE_CONFLICT:
        j->dl_reason = DEAD_LETTER_IDEMPOTENCY_KEY_CONFLICT;
        job_set_error(j, "%s", it->reason);
        job_set(eng->jobs, j, JOB_DEAD_LETTER);
        j->next_at = 0;
        break;
    case ENGINE_REJECTED:
        log_info("attempt rejected before any provider call", JOB_FIELDS(j), "reason",
                 it->reason, NULL);
        metrics_add(outcomes_metric(eng, j), 1, ATTEMPT_S_REJECTED);
        j->outcome = "rejected";
        job_set(eng->jobs, j, JOB_DONE);
        break;
    case ENGINE_RECORD_AGAIN:
        break; /* stays JOB_RECORD */
    }
}

static int record_batch(engine_t *eng, struct job **js, void *batch, size_t n,
                        struct store_error *err)
{
    struct engine_record *items = batch;
    int rc = eng->op->record(eng->op_state, items, n, eng->lease_ms, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++)
        apply_record(eng, js[i], &items[i]);
    return rc;
}

/* The job's item met another session's uncommitted change (its statement
 * hit lock_timeout): it alone waits, with a back-off, and tries again. */
static int lock_wait(engine_t *eng, struct job *j, const char *stage)
{
    if (j->lock_waits++ == 0)
        log_warn("attempt held by another session's transaction; trying again shortly",
                 JOB_FIELDS(j), "stage", stage, NULL);
    j->next_at = clock_now_ms() +
                 charge_policy_backoff_ms(&eng->policy, j->lock_waits, job_jitter(j));
    return STORE_OK;
}

/* A database stage over a batch of jobs: its statement, which applies each
 * item's result to its job, and what becomes of an item alone that the
 * database refuses (STORE_DATA) or another session's lock holds
 * (STORE_LOCKED). Each returns the store_rc the stage goes on with. */
struct stage {
    size_t item_size;
    int (*batch)(engine_t *eng, struct job **js, void *items, size_t n,
                 struct store_error *err);
    int (*refused)(engine_t *eng, struct job *j, void *item, struct store_error *err);
    int (*locked)(engine_t *eng, struct job *j, void *item);
};

static int stage_alone(engine_t *eng, const struct stage *st, struct job **j,
                       void *item, struct store_error *err)
{
    int rc = st->batch(eng, j, item, 1, err);
    if (rc == STORE_DATA)
        rc = st->refused(eng, *j, item, err);
    if (rc == STORE_LOCKED)
        rc = st->locked(eng, *j, item);
    return rc;
}

/* The batch in one statement; when the database refuses one of its values
 * or another session's lock holds one of its rows, each item alone, so that
 * one bad or held item never holds the others. */
static int stage_run_kind(engine_t *eng, const struct stage *st, struct job **js,
                          void *items, size_t n, struct store_error *err)
{
    int rc = n ? st->batch(eng, js, items, n, err) : STORE_OK;
    if (rc != STORE_DATA && rc != STORE_LOCKED)
        return rc;
    for (size_t i = 0; i < n; i++) {
        rc = stage_alone(eng, st, &js[i], (char *)items + i * st->item_size, err);
        if (rc != STORE_OK)
            break;
    }
    return rc;
}

/* The largest kind among n jobs (0 for an operation of one kind). */
static int max_kind(struct job *const *js, size_t n)
{
    int k = 0;
    for (size_t i = 0; i < n; i++)
        if (js[i]->kind > k)
            k = js[i]->kind;
    return k;
}

/* stage_run_kind over each kind's items apart, in batch order: each kind
 * writes its own tables in its own statements, so a failure of one kind's
 * statement after another kind's committed would have the committed ones
 * run again alone (a claim just taken then reads as someone's lease). */
static int stage_run(engine_t *eng, const struct stage *st, struct job **js,
                     void *items, size_t n, struct store_error *err)
{
    int kinds = max_kind(js, n) + 1, rc = STORE_OK;
    if (kinds == 1)
        return stage_run_kind(eng, st, js, items, n, err);
    struct job **sjs = calloc(n, sizeof(*sjs));
    char *sitems = calloc(n, st->item_size);
    if (!sjs || !sitems) {
        store_error_set(err, "out of memory");
        rc = STORE_RETRY;
    }
    for (int k = 0; k < kinds && rc == STORE_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (js[i]->kind == k) {
                sjs[m] = js[i];
                memcpy(sitems + m++ * st->item_size, (char *)items + i * st->item_size,
                       st->item_size);
            }
        rc = stage_run_kind(eng, st, sjs, sitems, m, err);
    }
    free(sjs);
    free(sitems);
    return rc;
}

static int record_refused(engine_t *eng, struct job *j, void *item,
                          struct store_error *err)
{
    (void)item;
    refuse(eng, j, "command", err->sqlstate);
    return STORE_OK;
}

static int record_locked(engine_t *eng, struct job *j, void *item)
{
    (void)item;
    return lock_wait(eng, j, "record");
}

static const struct stage record_stage = {sizeof(struct engine_record), record_batch,
                                          record_refused, record_locked};

static void record_attempts(engine_t *eng)
{
    struct store_error err;
    int64_t now = clock_now_ms();
    size_t n = job_list_due(eng->jobs, JOB_RECORD, now), k = 0;
    if (n == 0 || !db_ready(eng))
        return;
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
    int rc = stage_run(eng, &record_stage, js, items, k, &err);
    for (size_t h = 0; rc == STORE_OK && h < held; h++)
        rc = stage_alone(eng, &record_stage, &js[n - 1 - h], &items[n - 1 - h], &err);
    if (rc == STORE_RETRY)
        db_failed(eng, "record", err.message);
    else
        db_ok(eng);
out:
    free(items);
    free(js);
}

/* The job holds the record's lease now: on to the provider. */
static void claimed(engine_t *eng, struct job *j, int64_t lease_epoch,
                    int64_t key_age_ms, const char *previous_status)
{
    j->lease_epoch = lease_epoch;
    j->key_age_ms = key_age_ms;
    j->claimed_at = clock_now_ms();
    j->calls = 0;
    j->busy_persists = 0;
    /* Tries count per claim; the outage's spared failure, per message. */
    j->tries.not_executed = j->tries.unknown = 0;
    job_set(eng->jobs, j, JOB_CALL);
    j->next_at = 0;
    log_debug("attempt claimed", JOB_FIELDS(j), "previous_status", previous_status,
              NULL);
    FAILPOINT("after_claim");
}

static void apply_claim(engine_t *eng, struct job *j, const struct engine_claim *it)
{
    switch (it->result) {
    case ENGINE_CLAIMED:
        claimed(eng, j, it->lease_epoch, it->key_age_ms, it->status);
        break;
    case ENGINE_SETTLED:
        if (it->rejected[0]) {
            log_info("rejected before any provider call", JOB_FIELDS(j), "reason",
                     it->rejected, NULL);
            metrics_add(outcomes_metric(eng, j), 1, ATTEMPT_S_REJECTED);
            j->outcome = "rejected";
            job_set(eng->jobs, j, JOB_DONE);
            break;
        }
        j->outcome = "already_settled";
        job_set(eng->jobs, j, JOB_DONE);
        break;
    case ENGINE_BUSY:
        job_set(eng->jobs, j, JOB_WAIT);
        j->next_at = clock_now_ms() + eng->recheck_ms;
        break;
    }
}

static int claim_batch(engine_t *eng, struct job **js, void *batch, size_t n,
                       struct store_error *err)
{
    struct engine_claim *items = batch;
    int rc = eng->op->claim(eng->op_state, items, n, eng->lease_ms, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++)
        apply_claim(eng, js[i], &items[i]);
    return rc;
}

static int claim_refused(engine_t *eng, struct job *j, void *item,
                         struct store_error *err)
{
    (void)item;
    refuse(eng, j, "claim", err->sqlstate);
    return STORE_OK;
}

static int claim_locked(engine_t *eng, struct job *j, void *item)
{
    (void)item;
    job_set(eng->jobs, j, JOB_WAIT);
    return lock_wait(eng, j, "claim");
}

static const struct stage claim_stage = {sizeof(struct engine_claim), claim_batch,
                                         claim_refused, claim_locked};

/* Does another job of ours hold (or call under) j's record's lease? Then
 * j waits for it: the claim would take a lease of ours as lost. */
static int held_by_another_job(const engine_t *eng, const struct job *j)
{
    static const enum job_state holding[] = {JOB_CALL, JOB_CALLING, JOB_CALLING_FENCED,
                                             JOB_PERSIST};
    for (size_t s = 0; s < sizeof(holding) / sizeof(holding[0]); s++)
        for (struct job *o = job_list_first(eng->jobs, holding[s]); o;
             o = job_next_in_state(o))
            if (o != j && o->kind == j->kind && !strcmp(o->id, j->id))
                return 1;
    return 0;
}

static void claim_attempts(engine_t *eng)
{
    struct store_error err;
    int64_t now = clock_now_ms();
    size_t n = 0, k = 0;
    if (!db_ready(eng))
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
            if (j->next_at > now && state == JOB_WAIT)
                continue;
            if (j->detached) {
                job_set(eng->jobs, j, JOB_DONE);
                continue;
            }
            if (held_by_another_job(eng, j)) {
                job_set(eng->jobs, j, JOB_WAIT);
                j->next_at = now + eng->recheck_ms;
                continue;
            }
            js[k] = j;
            items[k].id = j->id;
            items[k].kind = j->kind;
            items[k++].params = j->params;
        }
    }
    int rc = stage_run(eng, &claim_stage, js, items, k, &err);
    if (rc == STORE_RETRY)
        db_failed(eng, "claim", err.message);
    else
        db_ok(eng);
out:
    free(items);
    free(js);
}

/* Lets go of the lease of a job we will not finish. */
static void release_lease(engine_t *eng, struct job *j)
{
    struct store_error err;
    if (eng->op->release_leases(eng->op_state, &j->id, &j->kind, &j->lease_epoch, 1,
                                &err) != STORE_OK)
        log_warn("could not release lease; it will expire", JOB_FIELDS(j), "error",
                 err.message, NULL);
}

/* ---- the provider ---- */

/* The policy's decision on the job's answer, with the operation's event. */
static void decide(engine_t *eng, struct job *j, int tries, int key_window_open,
                   unsigned jitter)
{
    j->decision = charge_policy_decide(&eng->policy, j->res.outcome, tries,
                                       key_window_open, jitter);
    j->decision.event_type = eng->op->event_type(j->kind, j->decision.status);
}

/* May a call under this attempt's key be sent now? Not once the provider may
 * have forgotten the key: a POST could then charge a second time. The age
 * is the database's (now - first_sent_at at our claim) plus what our own
 * monotonic clock measured since; the margin covers one call's time on the
 * wire and clock differences between the database and the provider. */
static int key_still_kept(const struct engine *eng, const struct job *j, int64_t now)
{
    return charge_policy_key_window_open(j->key_age_ms + (now - j->claimed_at),
                                         eng->key_retention_ms,
                                         eng->provider_timeout_ms);
}

static void start_calls(engine_t *eng)
{
    char err[256];
    int64_t now = clock_now_ms();
    for (struct job *j = job_list_first(eng->jobs, JOB_CALL), *next; j; j = next) {
        next = job_next_in_state(j);
        if (j->next_at > now)
            continue;
        if (j->detached) {
            release_lease(eng, j);
            job_set(eng->jobs, j, JOB_DONE);
            continue;
        }
        if (!key_still_kept(eng, j, now)) {
            /* First call or retry, ours or taken over: never sent. Look-ups
             * (the reconciler) settle it. */
            memset(&j->res, 0, sizeof(j->res));
            j->res.outcome = PROVIDER_NOT_EXECUTED;
            snprintf(j->res.error, sizeof(j->res.error),
                     "key_retention_passed: not sent again, the provider may have "
                     "forgotten the key");
            int tries =
                charge_policy_count_try(&j->tries, PROVIDER_NOT_EXECUTED, 0, 0, NULL);
            decide(eng, j, tries, 0, 0);
            log_warn("idempotency key may be forgotten by the provider; not sending",
                     JOB_FIELDS(j), NULL);
            job_set(eng->jobs, j, JOB_PERSIST);
            j->next_at = 0;
            continue;
        }
        /* Not closed: the job waits as it is, its lease renewed, no try
         * counted, until the breaker's own probes close it. */
        if (!provider_breaker_allow(eng->breaker, now, &j->ticket))
            continue;
        /* The claimed record's parameters, never the message's. */
        j->call_started_ms = clock_wall_ms();
        if (eng->op->start_call(eng->op_state, eng->provider, j->params, j->command, j,
                                err, sizeof(err)) != 0) {
            provider_breaker_cancel(eng->breaker, &j->ticket);
            log_error("cannot start provider call", JOB_FIELDS(j), "error", err, NULL);
            int tries =
                charge_policy_count_try(&j->tries, PROVIDER_NOT_EXECUTED, 0, 0, NULL);
            j->next_at =
                now + charge_policy_backoff_ms(&eng->policy, tries, job_jitter(j));
            continue;
        }
        j->calls++;
        job_set(eng->jobs, j, JOB_CALLING);
    }
}

/* Remembers a provider call for the provider_calls table. Bounded: past
 * CALL_LOG_MAX waiting entries (a long database outage) new ones are kept in
 * the log line only, and counted. */
static void log_call(engine_t *eng, struct job *j, const struct provider_result *res)
{
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
}

static int log_calls_batch(engine_t *eng, struct call_entry *const *e, size_t n,
                           struct store_error *err)
{
    struct engine_call *calls = calloc(n, sizeof(*calls));
    if (!calls) {
        store_error_set(err, "out of memory");
        return STORE_RETRY;
    }
    for (size_t i = 0; i < n; i++) {
        calls[i].id = e[i]->id;
        calls[i].kind = e[i]->kind;
        calls[i].started_ms = e[i]->started_ms;
        calls[i].res = &e[i]->res;
        calls[i].written_maybe = e[i]->written_maybe;
    }
    int rc = eng->op->log_calls(eng->op_state, calls, n, err);
    for (size_t i = 0; rc == STORE_RETRY && i < n; i++)
        e[i]->written_maybe = 1;
    free(calls);
    return rc;
}

/* One call entry alone: written (or refused, and dropped with a log line:
 * 1), held by another session's lock (kept, with a back-off: 0), or the
 * database failed (-1). */
static int log_call_alone(engine_t *eng, struct call_entry *e, struct store_error *err)
{
    int rc = log_calls_batch(eng, &e, 1, err);
    if (rc == STORE_RETRY)
        return -1;
    if (rc == STORE_LOCKED) {
        e->lock_waits++;
        e->next_at =
            clock_now_ms() + charge_policy_backoff_ms(&eng->policy, e->lock_waits, 0);
        return 0;
    }
    if (rc == STORE_DATA)
        log_error("provider call not recorded: the database refused it", e->id_field,
                  e->id, "order_id", e->order_id, "traceparent",
                  e->traceparent[0] ? e->traceparent : NULL, "sqlstate", err->sqlstate,
                  NULL);
    return 1;
}

/* Writes the waiting provider calls. 0 when nothing is left waiting but
 * calls another session's lock holds (a foreign-key check waits on a row
 * locked FOR UPDATE): those are tried again alone, HELD_PER_TURN at most a
 * turn, after a back-off, and hold nothing else up (their attempts' own
 * outcomes wait on the same lock). -1 when the database could not take them
 * now (then nothing else is written either: the outage is the same). A row
 * the database refuses on its own is dropped with a log line. */
static int flush_call_log(engine_t *eng)
{
    struct store_error err;
    size_t n = eng->call_log_len, nfresh = 0, held_tries = 0, kept = 0;
    int64_t now = clock_now_ms();
    int rc = 0;
    if (n == 0)
        return 0;
    if (!db_ready(eng))
        return -1;
    struct call_entry **fresh = calloc(n, sizeof(*fresh));
    char *done = calloc(n, 1);
    if (!fresh || !done) {
        free(fresh);
        free(done);
        return -1;
    }
    /* One batch per kind: a kind's statement that fails after another
     * kind's committed must not have those written again. A kind's batch
     * not run (-1) leaves its entries for the next flush. */
    int kinds = 1, brc[8];
    for (size_t i = 0; i < n; i++)
        if (eng->call_log[i].kind >= kinds)
            kinds = eng->call_log[i].kind + 1;
    if (kinds > (int)(sizeof(brc) / sizeof(brc[0]))) {
        rc = -1;
        store_error_set(&err, "provider calls of %d kinds", kinds);
        goto out;
    }
    for (int k = 0; k < kinds; k++)
        brc[k] = -1;
    for (int k = 0; k < kinds && rc == 0; k++) {
        nfresh = 0;
        for (size_t i = 0; i < n; i++)
            if (eng->call_log[i].lock_waits == 0 && eng->call_log[i].kind == k)
                fresh[nfresh++] = &eng->call_log[i];
        brc[k] = nfresh ? log_calls_batch(eng, fresh, nfresh, &err) : STORE_OK;
        if (brc[k] == STORE_RETRY)
            rc = -1;
    }
    for (size_t i = 0; i < n; i++)
        done[i] =
            eng->call_log[i].lock_waits == 0 && brc[eng->call_log[i].kind] == STORE_OK;
    for (size_t i = 0; i < n && rc == 0; i++) {
        struct call_entry *e = &eng->call_log[i];
        int alone;
        if (done[i])
            continue;
        if (e->lock_waits > 0 && (e->next_at > now || held_tries++ >= HELD_PER_TURN))
            continue;
        if ((alone = log_call_alone(eng, e, &err)) < 0) {
            rc = -1;
            break;
        }
        done[i] = alone == 1;
    }
out:
    for (size_t i = 0; i < n; i++)
        if (!done[i])
            eng->call_log[kept++] = eng->call_log[i];
    eng->call_log_len = kept;
    free(fresh);
    free(done);
    if (rc < 0)
        db_failed(eng, "log provider calls", err.message);
    return rc;
}

static void on_call_done(engine_t *eng, struct job *j)
{
    char status[8];
    int64_t now = clock_now_ms();

    snprintf(status, sizeof(status), "%d", j->res.http_status);
    const char *op = eng->op->kind_name ? eng->op->kind_name(j->kind) : eng->op->name;
    metrics_observe(METRIC_PROVIDER_DURATION, j->res.latency_ms / 1000.0, op);
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, op,
                provider_outcome_name(j->res.outcome));
    for (int i = 0; i < j->res.resent; i++) {
        /* curl re-sent the request itself after a pooled connection closed
         * unanswered: record that lost answer as a call of its own. */
        struct provider_result lost = provider_outcome_lost_answer();
        log_call(eng, j, &lost);
        j->calls++;
    }
    log_call(eng, j, &j->res);
    enum provider_breaker_answer answer = provider_breaker_classify(j->res.http_status);
    uint64_t opens = provider_breaker_opens(eng->breaker);
    int calls = 0, failures = 0;
    provider_breaker_window(eng->breaker, now, &calls, &failures);
    provider_breaker_record(eng->breaker, &j->ticket, answer, now);
    if (provider_breaker_opens(eng->breaker) != opens) {
        /* The window that opened it, this call included, for its log line. */
        eng->breaker_opened_calls = calls + 1;
        eng->breaker_opened_failures = failures + (answer == PROVIDER_BREAKER_FAILURE);
    }
    if (answer == PROVIDER_BREAKER_FAILURE)
        snprintf(eng->breaker_error, sizeof(eng->breaker_error), "%s",
                 j->res.error[0] ? j->res.error : status);
    /* The try this answer counts (the one that opened the breaker counts
     * none): charge_policy_count_try says why. */
    int outage = 0;
    int tries = charge_policy_count_try(
        &j->tries, j->res.outcome, answer == PROVIDER_BREAKER_FAILURE,
        provider_breaker_opens(eng->breaker) != opens, &outage);
    log_info("provider answered", JOB_FIELDS(j), "outcome",
             provider_outcome_name(j->res.outcome), "http_status", status, "replayed",
             j->res.replayed ? "true" : "false", "error",
             j->res.error[0] ? j->res.error : NULL, "outage", outage ? "true" : NULL,
             NULL);
#ifdef CHARGED_FAILPOINTS
    if (j->res.outcome == PROVIDER_SUCCEEDED) {
        /* after_charge, after_refund: the operation executed, nothing
         * persisted yet. */
        char point[48];
        snprintf(point, sizeof(point), "after_%s", op);
        FAILPOINT(point);
    }
#endif
    if (j->state == JOB_CALLING_FENCED) {
        log_warn("lease lost during the call; result left to the new owner",
                 JOB_FIELDS(j), NULL);
        job_set(eng->jobs, j, j->detached ? JOB_DONE : JOB_WAIT);
        j->next_at = now + eng->recheck_ms;
        return;
    }
    if (j->res.outcome == PROVIDER_NOT_EXECUTED &&
        (j->res.http_status == 401 || j->res.http_status == 403 ||
         j->res.http_status == 404))
        log_error("the provider refused our credentials or URL; retrying",
                  JOB_FIELDS(j), "http_status", status, NULL);
    decide(eng, j, tries, key_still_kept(eng, j, now), job_jitter(j));
    if (j->decision.next == CHARGE_NEXT_SETTLE) {
        job_set(eng->jobs, j, JOB_PERSIST);
        j->next_at = 0;
        return;
    }
    if (j->detached) {
        /* Not ours to retry: the next owner of the partition sends again
         * with the same key once our lease is gone. */
        release_lease(eng, j);
        job_set(eng->jobs, j, JOB_DONE);
        return;
    }
    job_set(eng->jobs, j, JOB_CALL);
    j->next_at = now + j->decision.retry_in_ms;
}

/* The probe's answer: any answer but 429 or 5xx (a 400 for the refused
 * request is the expected one) shows a charge endpoint that answers. */
static void probe_done(engine_t *eng, const struct provider_result *res)
{
    char status[16];
    int64_t now = clock_now_ms();
    enum provider_breaker_answer a = provider_breaker_classify(res->http_status);
    snprintf(status, sizeof(status), "%d", res->http_status);
    eng->probe_out = 0;
    provider_breaker_record(eng->breaker, &eng->probe_ticket, a, now);
    if (a == PROVIDER_BREAKER_FAILURE)
        snprintf(eng->breaker_error, sizeof(eng->breaker_error), "%s",
                 res->error[0] ? res->error : status);
    metrics_observe(METRIC_PROVIDER_DURATION, (double)res->latency_ms / 1000.0,
                    "probe");
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, "probe",
                a == PROVIDER_BREAKER_FAILURE ? "failure" : "answered");
    log_info("provider breaker probe answered", "http_status", status, "answer",
             a == PROVIDER_BREAKER_FAILURE ? "failure" : "answered", "error",
             a == PROVIDER_BREAKER_FAILURE && res->error[0] ? res->error : NULL, NULL);
}

static void collect_calls(engine_t *eng, int wait_ms)
{
    struct provider_result res;
    void *op;
    provider_client_perform(eng->provider, wait_ms);
    while (provider_client_next_done(eng->provider, &res, &op)) {
        if (op == &eng->probe_tag) {
            probe_done(eng, &res);
            continue;
        }
        struct job *j = op;
        j->res = res;
        on_call_done(eng, j);
    }
}

/* The attempt's outcome as persisted: the policy's decision, and a reason
 * with the provider's own words. */
static void outcome_of(const struct job *j, struct engine_outcome *o, char *reason,
                       size_t reason_size)
{
    const struct provider_result *r = &j->res;
    const struct charge_decision *d = &j->decision;
    o->status = attempt_status_name(d->status);
    o->event_type = d->event_type;
    o->next_check_ms = d->next_check_ms;
    reason[0] = '\0';
    if (!d->reason_code)
        return;
    if (r->outcome == PROVIDER_DECLINED)
        snprintf(reason, reason_size, "%s: %s%s%s", d->reason_code,
                 r->code[0] ? r->code : "declined", r->decline_code[0] ? ": " : "",
                 r->decline_code);
    else if (r->outcome == PROVIDER_INVALID) {
        /* The provider's code and param, and its message as the client
         * masked it: never what it echoes of the request. */
        char detail[400];
        provider_outcome_detail(r, detail, sizeof(detail));
        snprintf(reason, reason_size, "%s: %s", d->reason_code, detail);
    } else if (r->error[0])
        snprintf(reason, reason_size, "%s: %s", d->reason_code, r->error);
    else
        snprintf(reason, reason_size, "%s", d->reason_code);
    /* Each text was masked as it came in; side by side ("code:
     * decline_code") two of them must not make one card number. */
    card_data_mask_loose(reason, strlen(reason));
}

static char *evidence_of(const struct job *j)
{
    const struct provider_result *r = &j->res;
    json_t *e = json_pack("{s:s, s:i, s:b, s:i, s:I}", "outcome",
                          provider_outcome_name(r->outcome), "http_status",
                          r->http_status, "replayed", r->replayed, "calls", j->calls,
                          "latency_ms", (json_int_t)r->latency_ms);
    if (!e)
        return NULL;
    if (r->provider_payment_id[0])
        json_object_set_new(e, "provider_payment_id",
                            json_string(r->provider_payment_id));
    if (r->code[0])
        json_object_set_new(e, "code", json_string(r->code));
    if (r->decline_code[0])
        json_object_set_new(e, "decline_code", json_string(r->decline_code));
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

static void apply_persist(engine_t *eng, struct job *j, const struct engine_outcome *o)
{
    if (o->busy) {
        /* Another session holds the row (a webhook being applied, or a
         * session hung in its transaction): this job waits, its lease
         * renewed, and no other outcome waits with it. */
        if (j->busy_persists++ == 0)
            log_warn("attempt locked by another session; persisting it again shortly",
                     JOB_FIELDS(j), "outcome", provider_outcome_name(j->res.outcome),
                     NULL);
        j->next_at =
            clock_now_ms() +
            charge_policy_backoff_ms(&eng->policy, j->busy_persists, job_jitter(j));
        return;
    }
    if (!o->persisted) {
        /* Fenced out: someone took the attempt over; its result wins. */
        log_warn("lease lost before persisting; result dropped", JOB_FIELDS(j),
                 "outcome", provider_outcome_name(j->res.outcome), NULL);
        job_set(eng->jobs, j, JOB_WAIT);
        j->next_at = clock_now_ms() + eng->recheck_ms;
        return;
    }
    metrics_add(outcomes_metric(eng, j), 1, o->status);
    j->outcome = "settled";
    log_info("attempt settled", JOB_FIELDS(j), "status", o->status, "reason", o->reason,
             "provider_payment_id",
             j->res.provider_payment_id[0] ? j->res.provider_payment_id : NULL, NULL);
    job_set(eng->jobs, j, JOB_DONE);
}

static int persist_batch(engine_t *eng, struct job **js, void *batch, size_t n,
                         struct store_error *err)
{
    struct engine_outcome *items = batch;
    int rc = eng->op->persist(eng->op_state, items, n, err);
    for (size_t i = 0; rc == STORE_OK && i < n; i++)
        apply_persist(eng, js[i], &items[i]);
    return rc;
}

/* The database refused this outcome even alone (a value from the provider
 * it cannot store). The attempt may have been charged, so it is never
 * FAILED: REQUIRES_REVIEW, with nothing from outside but the outcome's name.
 * If even that is refused, the job ends and the lease is left to expire; a
 * later owner or the reconciler takes the attempt from there. */
static int persist_for_review(engine_t *eng, struct job *j, struct store_error *err)
{
    char reason[256], evidence[160];
    snprintf(reason, sizeof(reason),
             "requires_review: the database refused the outcome '%s' (sqlstate %s)",
             provider_outcome_name(j->res.outcome), err->sqlstate);
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
              "outcome", provider_outcome_name(j->res.outcome), "sqlstate",
              err->sqlstate, NULL);
    int rc = persist_batch(eng, &j, &o, 1, err);
    if (rc == STORE_DATA) {
        log_error("the database refused the review outcome too; lease left to expire",
                  JOB_FIELDS(j), "sqlstate", err->sqlstate, NULL);
        j->outcome = "abandoned";
        job_set(eng->jobs, j, JOB_DONE);
        return STORE_OK;
    }
    return rc;
}

static int persist_refused(engine_t *eng, struct job *j, void *item,
                           struct store_error *err)
{
    (void)item;
    return persist_for_review(eng, j, err);
}

/* Held, as a locked row is: it waits, the rest goes on. */
static int persist_locked(engine_t *eng, struct job *j, void *item)
{
    struct engine_outcome *o = item;
    o->busy = 1;
    apply_persist(eng, j, o);
    return STORE_OK;
}

static const struct stage persist_stage = {sizeof(struct engine_outcome), persist_batch,
                                           persist_refused, persist_locked};

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

static void persist_outcomes(engine_t *eng)
{
    struct store_error err;
    int64_t now = clock_now_ms();
    size_t n = job_list_due(eng->jobs, JOB_PERSIST, now), k = 0;
    if (n == 0 || !db_ready(eng))
        return;
    /* The calls first: support must see every call of a settled attempt,
     * and if the database cannot take them it cannot take outcomes now. */
    if (flush_call_log(eng) != 0)
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
        struct engine_outcome *o = &items[k];
        js[k] = j;
        outcome_of(j, o, reasons[k], sizeof(reasons[k]));
        evidence[k] = evidence_of(j);
        o->id = j->id;
        o->kind = j->kind;
        o->lease_epoch = j->lease_epoch;
        o->reason = reasons[k][0] ? reasons[k] : NULL;
        o->provider_id = j->res.provider_payment_id;
        o->evidence_json = evidence[k];
        o->calls = j->calls;
        o->last_error = j->res.error[0] ? j->res.error : NULL;
        k++;
    }
    int rc = stage_run(eng, &persist_stage, js, items, k, &err);
    if (rc == STORE_RETRY) {
        db_failed(eng, "persist", err.message);
        goto out;
    }
    db_ok(eng);
    if (k > 0)
        FAILPOINT("after_persist");
out:
    for (size_t i = 0; evidence && i < n; i++)
        free(evidence[i]);
    free(evidence);
    free(reasons);
    free(items);
    free(js);
}

/* Extends the leases of claims we still work on. */
static void renew_leases(engine_t *eng)
{
    struct store_error err;
    int64_t now = clock_now_ms();
    size_t n = 0, k = 0;
    if (now - eng->last_renew_ms < eng->lease_ms / 3 || !db_ready(eng))
        return;
    eng->last_renew_ms = now;
    static const enum job_state leased[] = {JOB_CALL, JOB_CALLING, JOB_PERSIST};
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
            js[k] = j;
            ids[k] = j->id;
            kinds[k] = j->kind;
            epochs[k++] = j->lease_epoch;
        }
    if (eng->op->renew(eng->op_state, ids, kinds, epochs, k, eng->lease_ms, ours,
                       &err) != STORE_OK) {
        db_failed(eng, "renew leases", err.message);
        goto out;
    }
    for (size_t i = 0; i < k; i++) {
        struct job *j = js[i];
        if (ours[i])
            continue;
        log_warn("lease lost", JOB_FIELDS(j), NULL);
        if (j->state == JOB_CALLING) {
            job_set(eng->jobs, j, JOB_CALLING_FENCED);
        } else {
            /* Not sent, or a result the fence would refuse: look again. */
            job_set(eng->jobs, j, j->detached ? JOB_DONE : JOB_WAIT);
            j->next_at = now + eng->recheck_ms;
        }
    }
out:
    free(ids);
    free(epochs);
    free(ours);
    free(kinds);
    free(js);
}

/* ---- offsets ---- */

static void commit_offsets(engine_t *eng, int sync,
                           const rd_kafka_topic_partition_list_t *only)
{
    int32_t parts[1024];
    size_t n = offset_tracker_dirty(eng->offsets, parts, 1024);
    rd_kafka_topic_partition_list_t *list =
        rd_kafka_topic_partition_list_new((int)n + 1);

    for (size_t i = 0; i < n; i++) {
        if (only &&
            !rd_kafka_topic_partition_list_find(only, eng->commands_topic, parts[i]))
            continue;
        rd_kafka_topic_partition_list_add(list, eng->commands_topic, parts[i])->offset =
            offset_tracker_committable(eng->offsets, parts[i]);
    }
    if (list->cnt > 0) {
        rd_kafka_resp_err_t err = rd_kafka_commit(eng->consumer, list, !sync);
        if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            log_warn("offset commit failed; will retry", "error", rd_kafka_err2str(err),
                     NULL);
        } else {
            for (int i = 0; i < list->cnt; i++)
                offset_tracker_mark_committed(eng->offsets, list->elems[i].partition,
                                              list->elems[i].offset);
        }
    }
    rd_kafka_topic_partition_list_destroy(list);
    eng->last_commit_ms = clock_now_ms();
}

static void on_commit(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                      rd_kafka_topic_partition_list_t *offsets, void *opaque)
{
    engine_t *eng = opaque;
    (void)rk;
    if (!err || err == RD_KAFKA_RESP_ERR__NO_OFFSET)
        return;
    log_warn("asynchronous offset commit failed; will commit again", "error",
             rd_kafka_err2str(err), NULL);
    for (int i = 0; offsets && i < offsets->cnt; i++)
        offset_tracker_mark_committed(eng->offsets, offsets->elems[i].partition, -1);
}

/* ---- the breaker ---- */

/* "0,3,7": the partitions of a list, for log lines. */
static const char *parts_str(const rd_kafka_topic_partition_list_t *parts, char *buf,
                             size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (int i = 0; parts && i < parts->cnt && n + 16 < size; i++)
        n += (size_t)snprintf(buf + n, size - n, "%s%d", i ? "," : "",
                              (int)parts->elems[i].partition);
    return buf;
}

/* Pauses or resumes fetching from every assigned partition. Calls in
 * flight and jobs already taken go on; what was fetched before the pause
 * is still taken (librdkafka resumes after the last message it gave us, or
 * at the position of a later seek). */
static void set_paused(engine_t *eng, int pause)
{
    char list[1024];
    rd_kafka_topic_partition_list_t *parts = NULL;
    rd_kafka_resp_err_t err = rd_kafka_assignment(eng->consumer, &parts);
    if (err || !parts) {
        log_warn("cannot read the assignment to pause or resume it; trying again",
                 "error", rd_kafka_err2str(err), NULL);
        if (parts)
            rd_kafka_topic_partition_list_destroy(parts);
        return;
    }
    if (parts->cnt > 0)
        err = pause ? rd_kafka_pause_partitions(eng->consumer, parts)
                    : rd_kafka_resume_partitions(eng->consumer, parts);
    eng->paused = pause;
    log_info(pause ? "fetching paused" : "fetching resumed", "partitions",
             parts_str(parts, list, sizeof(list)), NULL);
    rd_kafka_topic_partition_list_destroy(parts);
}

/* While fetching is paused, librdkafka's statistics keep the high
 * watermarks of the last fetch, and the lag they report stands still while
 * it grows. So every PAUSED_LAG_MS the broker is asked, within a budget
 * that keeps the loop turning. */
static void paused_lag(engine_t *eng, int64_t now)
{
    char key[16];
    rd_kafka_topic_partition_list_t *parts = NULL;
    if (!eng->paused || now < eng->next_paused_lag)
        return;
    eng->next_paused_lag = now + PAUSED_LAG_MS;
    if (rd_kafka_assignment(eng->consumer, &parts) || !parts || parts->cnt == 0 ||
        rd_kafka_committed(eng->consumer, parts, PAUSED_LAG_BUDGET_MS) !=
            RD_KAFKA_RESP_ERR_NO_ERROR)
        goto out;
    int64_t deadline = clock_now_ms() + PAUSED_LAG_BUDGET_MS;
    for (int i = 0; i < parts->cnt && clock_now_ms() < deadline; i++) {
        const rd_kafka_topic_partition_t *p = &parts->elems[i];
        int64_t lo = 0, hi = 0;
        if (rd_kafka_query_watermark_offsets(eng->consumer, p->topic, p->partition, &lo,
                                             &hi, 200) != RD_KAFKA_RESP_ERR_NO_ERROR)
            continue;
        snprintf(key, sizeof(key), "%d", (int)p->partition);
        metrics_set(METRIC_CONSUMER_LAG,
                    (double)(hi - (p->offset >= 0 ? p->offset : lo)),
                    eng->commands_topic, key);
    }
out:
    if (parts)
        rd_kafka_topic_partition_list_destroy(parts);
}

/* Half-open and no probe out: asks the charge endpoint, with a request the
 * provider refuses before executing it, one probe at a time. It must test
 * what the worker needs: a probe that looked an intent up kept the breaker
 * open while charges worked and look-ups failed. */
static void start_probe(engine_t *eng, int64_t now)
{
    char err[256];
    if (eng->probe_out ||
        !provider_breaker_allow_probe(eng->breaker, now, &eng->probe_ticket))
        return;
    if (provider_client_start_probe(eng->provider, &eng->probe_tag, err, sizeof(err)) !=
        0) {
        provider_breaker_cancel(eng->breaker, &eng->probe_ticket);
        log_error("cannot start the provider breaker's probe", "error", err, NULL);
        return;
    }
    eng->probe_out = 1;
}

/* Acts on the breaker: logs each change of state, probes while half-open,
 * and keeps the assigned partitions paused while it is not closed. */
static void breaker_sync(engine_t *eng)
{
    char n[32], calls[32], ms[32], flying[32];
    int64_t now = clock_now_ms();
    enum provider_breaker_state st = provider_breaker_state(eng->breaker, now);
    uint64_t opens = provider_breaker_opens(eng->breaker);

    if (opens != eng->breaker_opens) {
        int first = eng->breaker_seen == PROVIDER_BREAKER_CLOSED;
        snprintf(n, sizeof(n), "%d", first ? eng->breaker_opened_failures : 1);
        snprintf(calls, sizeof(calls), "%d", first ? eng->breaker_opened_calls : 1);
        snprintf(ms, sizeof(ms), "%lld",
                 config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_OPEN_MS));
        snprintf(flying, sizeof(flying), "%zu",
                 provider_client_in_flight(eng->provider));
        log_warn(first ? "provider breaker opened: no new provider calls"
                       : "provider breaker opened again: a probe failed",
                 "breaker_state", "open", "failures", n, "calls", calls, "error",
                 eng->breaker_error, "open_ms", ms, "calls_in_flight", flying, NULL);
        /* Counted once an outage: a failed probe opening it again is the
         * same outage, not a new one (flapping is closed -> open again). */
        if (first)
            metrics_add(METRIC_BREAKER_OPENS, 1);
        eng->breaker_opens = opens;
        eng->breaker_seen = PROVIDER_BREAKER_OPEN;
    }
    if (st != eng->breaker_seen) {
        if (st == PROVIDER_BREAKER_HALF_OPEN) {
            snprintf(n, sizeof(n), "%lld",
                     config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_PROBES));
            log_info("provider breaker half-open: probing the charge endpoint, one at "
                     "a time",
                     "breaker_state", "half_open", "probes", n, NULL);
        } else if (st == PROVIDER_BREAKER_CLOSED) {
            log_info("provider breaker closed: the provider answers again",
                     "breaker_state", "closed", NULL);
        }
        eng->breaker_seen = st;
    }
    /* The gauge is the state as of this turn. */
    metrics_set(METRIC_BREAKER_STATE, (double)st);
    if (st == PROVIDER_BREAKER_HALF_OPEN)
        start_probe(eng, now);
    paused_lag(eng, now);
    int pause = st != PROVIDER_BREAKER_CLOSED;
    if (pause != eng->paused)
        set_paused(eng, pause);
}

/* ---- the loop ---- */

static void reap(engine_t *eng)
{
    for (struct job *j = job_list_first(eng->jobs, JOB_DONE), *next; j; j = next) {
        next = job_next_in_state(j);
        metrics_add(METRIC_MESSAGES, 1,
                    j->outcome    ? j->outcome
                    : j->detached ? "released"
                                  : "error");
        if (!j->detached)
            offset_tracker_done(eng->offsets, j->partition, j->offset);
        job_list_remove(eng->jobs, j);
        job_free(eng, j);
    }
}

/* Milliseconds until something is due, capped. */
static int idle_ms(engine_t *eng, int cap, int take_new)
{
    if (eng->revocations && cap > 10)
        cap = 10; /* draining for a revocation: look often */
    int64_t now = clock_now_ms(), next = now + cap;
    /* A call waits for the breaker too; INT64_MAX (a probe is out) wakes
     * nothing: the probe's answer does. */
    int64_t calls_at = provider_breaker_next_allow_ms(eng->breaker, now);
    /* Database steps wait for its back-off: while it is down, a job due for
     * one would otherwise spin the loop. */
    int64_t db_at = eng->db.retry_at;
    if (job_list_count(eng->jobs, JOB_DONE))
        return 0;
    if (job_list_count(eng->jobs, JOB_CLAIM) && db_at < next)
        next = db_at;
    /* While a revocation drains, the cap looks often enough: the backlog of
     * its partitions does not start. */
    if (take_new && !eng->revocations && job_list_count(eng->jobs, JOB_BACKLOG) &&
        (long long)jobs_started(eng) < eng->max_in_flight)
        return 0;
    if (job_list_count(eng->jobs, JOB_DEAD_LETTER_SENT) && now + 5 < next)
        next = now + 5;
    int64_t at = job_list_next_at(eng->jobs, JOB_CALL);
    if (at < next && calls_at < next)
        next = at > calls_at ? at : calls_at;
    static const enum job_state timed[] = {JOB_RECORD, JOB_WAIT, JOB_DEAD_LETTER,
                                           JOB_PERSIST};
    for (size_t i = 0; i < sizeof(timed) / sizeof(timed[0]); i++) {
        at = job_list_next_at(eng->jobs, timed[i]);
        if (timed[i] != JOB_DEAD_LETTER && at < db_at)
            at = db_at;
        if (at < next)
            next = at;
    }
    if (eng->db.retry_at > now && eng->db.retry_at < next)
        next = eng->db.retry_at;
    return next <= now ? 0 : (int)(next - now);
}

/* Started jobs of `parts` (all when NULL) that still hold an offset: what a
 * drain waits for (it starts nothing from the backlog). */
static size_t jobs_of(engine_t *eng, const rd_kafka_topic_partition_list_t *parts)
{
    size_t n = 0;
    if (!parts)
        return job_list_started(eng->jobs);
    for (struct job *j = job_list_oldest(eng->jobs); j; j = job_younger(j))
        if (!j->detached && j->state != JOB_BACKLOG &&
            in_parts(eng, parts, j->partition))
            n++;
    return n;
}

/* Gives up the unfinished jobs of `parts` (all when NULL): their offsets are
 * not committed, so the messages come back to the next owner, who waits out
 * or takes over our leases. We release those of calls not sent yet, so that
 * it need not wait. A call in flight keeps its lease: the next owner must
 * not send under its key while it is out; it still ends, and its outcome is
 * persisted under that lease. Returns how many were unfinished. */
static size_t detach(engine_t *eng, const rd_kafka_topic_partition_list_t *parts)
{
    size_t left = 0;
    for (struct job *j = job_list_oldest(eng->jobs); j; j = job_younger(j)) {
        if (j->detached || !in_parts(eng, parts, j->partition))
            continue;
        job_detach(eng->jobs, j);
        /* librdkafka gets the message back now: closing or destroying the
         * consumer would wait for it otherwise. */
        if (j->msg) {
            rd_kafka_message_destroy(j->msg);
            j->msg = NULL;
        }
        if (j->state == JOB_BACKLOG) {
            job_set(eng->jobs, j, JOB_DONE);
            continue;
        }
        left++;
        if (j->state == JOB_CALL)
            release_lease(eng, j);
        if (j->state != JOB_CALLING && j->state != JOB_CALLING_FENCED &&
            j->state != JOB_PERSIST && j->state != JOB_DEAD_LETTER_SENT)
            job_set(eng->jobs, j, JOB_DONE);
    }
    if (left) {
        char n[32];
        snprintf(n, sizeof(n), "%zu", left);
        log_warn("drain deadline passed; unfinished messages left uncommitted", "count",
                 n, NULL);
    }
    reap(eng);
    return left;
}

/* Ends a revocation: what is unfinished is given up, what finished is
 * committed (unless the partitions were lost), and librdkafka is told. The
 * caller frees r. */
static void give_up(engine_t *eng, struct revocation *r)
{
    detach(eng, r->parts);
    if (!r->lost)
        commit_offsets(eng, 1, r->parts);
    for (int i = 0; i < r->parts->cnt; i++) {
        offset_tracker_forget(eng->offsets, r->parts->elems[i].partition);
        forget_handback(eng, r->parts->elems[i].partition);
    }
    /* librdkafka keeps a partition's pause past its assignment: one given
     * up paused would come back to us paused, and never be fetched. */
    if (eng->paused)
        rd_kafka_resume_partitions(eng->consumer, r->parts);
    if (!strcmp(rd_kafka_rebalance_protocol(eng->consumer), "COOPERATIVE"))
        rd_kafka_incremental_unassign(eng->consumer, r->parts);
    else
        rd_kafka_assign(eng->consumer, NULL);
    eng->assignment_changed = 1;
    char count[16];
    char list[1024];
    snprintf(count, sizeof(count), "%d", r->parts->cnt);
    log_info(r->lost ? "lost partitions given up" : "revoked partitions drained",
             "count", count, "partitions", parts_str(r->parts, list, sizeof(list)),
             NULL);
}

static void finish_revocation(engine_t *eng, struct revocation *r)
{
    give_up(eng, r);
    rd_kafka_topic_partition_list_destroy(r->parts);
    free(r);
}

static void finish_revocations(engine_t *eng, int all)
{
    int64_t now = clock_now_ms();
    for (struct revocation **rp = &eng->revocations; *rp;) {
        struct revocation *r = *rp;
        if (all || r->lost || now >= r->deadline || jobs_of(eng, r->parts) == 0) {
            *rp = r->next;
            finish_revocation(eng, r);
        } else {
            rp = &r->next;
        }
    }
}

/* librdkafka's statistics (every statistics.interval.ms): the lag of each
 * partition we consume, after the group's committed offset. Called from
 * the loop's consumer poll; returns 0, so librdkafka frees json. */
static int on_stats(rd_kafka_t *rk, char *json, size_t json_len, void *opaque)
{
    engine_t *eng = opaque;
    /* Paused, the statistics' lag is stale: paused_lag() asks the broker. */
    if (eng->paused)
        return 0;
    json_t *root = json_loadb(json, json_len, 0, NULL);
    json_t *parts = json_object_get(
        json_object_get(json_object_get(root, "topics"), eng->commands_topic),
        "partitions");
    const char *key;
    json_t *p;
    (void)rk;
    json_object_foreach(parts, key, p)
    {
        json_int_t lag = json_integer_value(json_object_get(p, "consumer_lag"));
        /* Partition -1 is librdkafka's own; lag -1 means not known yet. */
        if (!strcmp(key, "-1") || !json_is_true(json_object_get(p, "desired")) ||
            !json_is_integer(json_object_get(p, "consumer_lag")) || lag < 0)
            continue;
        metrics_set(METRIC_CONSUMER_LAG, (double)lag, eng->commands_topic, key);
    }
    json_decref(root);
    return 0;
}

/* Records what the group decided; the loop does the draining. Assignments
 * are applied here (they touch no job); a revocation still draining when a
 * new assignment arrives is finished first, so the two never overlap. While
 * the consumer closes (after the final drain) everything is finished here. */
static void on_rebalance(rd_kafka_t *rk, rd_kafka_resp_err_t err,
                         rd_kafka_topic_partition_list_t *parts, void *opaque)
{
    engine_t *eng = opaque;
    char count[16], list[1024];

    snprintf(count, sizeof(count), "%d", parts->cnt);
    eng->assignment_changed = 1;
    metrics_add(METRIC_REBALANCES, 1,
                err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS ? "assign"
                : rd_kafka_assignment_lost(rk)              ? "lost"
                                                            : "revoke");
    /* Lag is reported for what we hold now: the statistics refill it. */
    metrics_forget(METRIC_CONSUMER_LAG);
    parts_str(parts, list, sizeof(list));
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
        finish_revocations(eng, 1);
        log_info("partitions assigned", "count", count, "partitions", list, "paused",
                 eng->paused ? "true" : NULL, NULL);
        if (!strcmp(rd_kafka_rebalance_protocol(rk), "COOPERATIVE"))
            rd_kafka_incremental_assign(rk, parts);
        else
            rd_kafka_assign(rk, parts);
        /* While the breaker holds fetching, new partitions wait too. */
        if (eng->paused)
            rd_kafka_pause_partitions(rk, parts);
        return;
    }
    struct revocation *r = calloc(1, sizeof(*r));
    if (r)
        r->parts = rd_kafka_topic_partition_list_copy(parts);
    if (!r || !r->parts) {
        /* Cannot record it: give the partitions up now, as if lost. */
        log_error("out of memory recording a revocation; giving the partitions up",
                  NULL);
        free(r);
        struct revocation now = {.parts = parts, .lost = 1};
        give_up(eng, &now);
        return;
    }
    r->lost = rd_kafka_assignment_lost(rk);
    r->deadline = clock_now_ms() + (r->lost ? 0 : eng->drain_ms);
    struct revocation **tail = &eng->revocations;
    while (*tail)
        tail = &(*tail)->next;
    *tail = r;
    log_info(r->lost ? "partitions lost" : "partitions revoked; draining them", "count",
             count, "partitions", list, NULL);
    if (eng->closing)
        finish_revocations(eng, 1);
}

/* One turn of the loop. take_new: start new messages (not while draining
 * for shutdown). */
static void turn(engine_t *eng, int take_new)
{
    breaker_sync(eng);
    int wait = idle_ms(eng, 100, take_new);
    if (provider_client_in_flight(eng->provider) > 0) {
        collect_calls(eng, wait < 10 ? wait : 10);
        wait = 0;
    }
    fetch(eng, wait, take_new);
    start_jobs(eng, take_new);
    send_dead_letters(eng);
    rd_kafka_poll(eng->producer, 0);
    apply_deliveries(eng);
    record_attempts(eng);
    claim_attempts(eng);
    start_calls(eng);
    collect_calls(eng, 0);
    persist_outcomes(eng);
    flush_call_log(eng);
    renew_leases(eng);
    reap(eng);
    finish_revocations(eng, 0);
    if (clock_now_ms() - eng->last_commit_ms >= eng->commit_interval_ms)
        commit_offsets(eng, 0, NULL);
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
    struct store_error err;
    if (db_ready(eng) && clock_now_ms() - eng->db.last_ok_ms >= DB_PING_MS) {
        if (eng->op->ping(eng->op_state, &err) == STORE_OK)
            db_ok(eng);
        else
            db_failed(eng, "ping", err.message);
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
    if (eng->assigned == 0)
        return "no partitions assigned";
    if (eng->paused)
        return "provider breaker open";
    return NULL;
}

/* A turn waits in the consumer's poll and curl's until something is due
 * (idle_ms): those are what wake it when a message, a rebalance, a commit
 * result or a provider answer comes, so the step is due again at once. */
int64_t engine_step(engine_t *eng, int64_t now)
{
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
    /* Messages in the backlog are not started while draining: they wait
     * like the calls do. */
    return job_list_holding(eng->jobs) ==
           job_list_holding_in(eng->jobs, JOB_CALL) +
               job_list_holding_in(eng->jobs, JOB_BACKLOG);
}

/* Shutdown: the pipeline runs on, taking nothing new, until every job is
 * finished or the deadline passes; what is left is given up. */
size_t engine_drain(engine_t *eng, int64_t deadline)
{
    while (jobs_of(eng, NULL) > 0 && clock_now_ms() < deadline &&
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
    finish_revocations(eng, 1);
    return detach(eng, NULL) + unstarted;
}

/* ---- start-up ---- */

static int setup(engine_t *eng, char *err, size_t err_size)
{
    rd_kafka_conf_t *cc = NULL, *pc = NULL;

    eng->group = config_str(eng->cfg, CONFIG_KAFKA_GROUP_ID);
    eng->commands_topic =
        config_str(eng->cfg, (enum config_key)eng->op->commands_topic_key);
    eng->dlq_topic = config_str(eng->cfg, (enum config_key)eng->op->dlq_topic_key);
    eng->max_in_flight = config_int(eng->cfg, CONFIG_WORKER_MAX_IN_FLIGHT);
    eng->lease_ms = config_int(eng->cfg, CONFIG_WORKER_LEASE_MS);
    eng->policy.unknown_retries =
        (int)config_int(eng->cfg, CONFIG_WORKER_UNKNOWN_RETRIES);
    eng->policy.retry_base_ms = config_int(eng->cfg, CONFIG_WORKER_RETRY_BASE_MS);
    eng->policy.retry_max_ms = config_int(eng->cfg, CONFIG_WORKER_RETRY_MAX_MS);
    eng->policy.first_look_ms = config_int(eng->cfg, CONFIG_RECONCILER_FIRST_LOOK_MS);
    eng->key_retention_ms = config_int(eng->cfg, CONFIG_WORKER_KEY_RETENTION_MS);
    eng->commit_interval_ms = config_int(eng->cfg, CONFIG_WORKER_COMMIT_INTERVAL_MS);
    eng->recheck_ms = config_int(eng->cfg, CONFIG_WORKER_RECHECK_MS);
    eng->shutdown_ms = config_int(eng->cfg, CONFIG_SHUTDOWN_TIMEOUT_MS);
    eng->drain_ms = config_int(eng->cfg, CONFIG_REBALANCE_DRAIN_MS);
    eng->provider_timeout_ms = config_int(eng->cfg, CONFIG_PROVIDER_TIMEOUT_MS);

    /* The lease must outlast one claim's worth of calls and back-offs, or a
     * peer could take over an attempt whose call is still in flight. */
    long long needed = eng->provider_timeout_ms * (eng->policy.unknown_retries + 1) +
                       eng->policy.retry_max_ms * eng->policy.unknown_retries;
    if (eng->lease_ms <= needed) {
        snprintf(err, err_size,
                 "WORKER_LEASE_MS: %lld does not outlast the provider timeout and its "
                 "retries (%lld ms); raise it or lower PROVIDER_TIMEOUT_MS, "
                 "WORKER_UNKNOWN_RETRIES or WORKER_RETRY_MAX_MS",
                 eng->lease_ms, needed);
        return 2;
    }
    /* No call is sent once the key's age plus this margin reaches the
     * provider's retention: one call's time on the wire, and clock
     * differences between the database and the provider. */
    eng->key_margin_ms =
        charge_policy_key_margin_ms(eng->key_retention_ms, eng->provider_timeout_ms);
    if (eng->key_retention_ms <= eng->key_margin_ms) {
        snprintf(err, err_size,
                 "WORKER_KEY_RETENTION_MS: %lld leaves no time to call the provider "
                 "(PROVIDER_TIMEOUT_MS plus a margin of a tenth, at most 60 s, is "
                 "%lld ms)",
                 eng->key_retention_ms, eng->key_margin_ms);
        return 2;
    }
    /* Read no more: set, it would be silently ignored, and the breaker an
     * operator tuned would act otherwise than they think. */
    if (getenv("PROVIDER_BREAKER_FAILURES")) {
        snprintf(
            err, err_size,
            "PROVIDER_BREAKER_FAILURES: no longer read: the breaker opens on a "
            "failure rate (PROVIDER_BREAKER_FAILURE_RATE, PROVIDER_BREAKER_MIN_CALLS, "
            "PROVIDER_BREAKER_WINDOW_MS); unset it");
        return 2;
    }
    if (eng->policy.retry_base_ms > eng->policy.retry_max_ms) {
        snprintf(err, err_size,
                 "WORKER_RETRY_BASE_MS: larger than WORKER_RETRY_MAX_MS");
        return 2;
    }

    cc = kafka_setup_conf(eng->cfg, eng->id, err, err_size);
    if (!cc)
        goto usage;
    /* The dead-letter producer: the preset, idempotent, acks=all. */
    pc = kafka_setup_producer_conf(eng->cfg, eng->id, &(struct kafka_setup_producer){0},
                                   err, err_size);
    if (!pc)
        goto usage;
    /* Defaults an operator may override with KAFKA_*... The consumer
     * protocol (KIP-848) has the broker assign, incrementally; the classic
     * one gets the client-side cooperative assignor. */
    if (kafka_setup_set(cc, "auto.offset.reset", "earliest", err, err_size) ||
        (!kafka_setup_uses_consumer_protocol(eng->cfg) &&
         kafka_setup_set(cc, "partition.assignment.strategy", "cooperative-sticky", err,
                         err_size)) ||
        kafka_setup_set(cc, "statistics.interval.ms", "5000", err, err_size))
        goto usage;
    kafka_setup_apply_env(cc, eng->cfg);
    if (kafka_setup_group_instance(cc, eng->cfg, eng->instance, sizeof(eng->instance),
                                   err, err_size) != 0)
        goto usage;
    /* ...and what exactly-once charging depends on, which nobody may. */
    if (kafka_setup_set(cc, "group.id", eng->group, err, err_size) ||
        kafka_setup_set(cc, "enable.auto.commit", "false", err, err_size) ||
        kafka_setup_set(cc, "enable.auto.offset.store", "false", err, err_size))
        goto usage;
    rd_kafka_conf_set_opaque(cc, eng);
    rd_kafka_conf_set_opaque(pc, eng);
    rd_kafka_conf_set_rebalance_cb(cc, on_rebalance);
    rd_kafka_conf_set_stats_cb(cc, on_stats);
    rd_kafka_conf_set_offset_commit_cb(cc, on_commit);
    rd_kafka_conf_set_dr_msg_cb(pc, on_delivery);

    eng->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, cc, err, err_size);
    if (!eng->consumer)
        goto usage;
    cc = NULL; /* owned by the consumer */
    eng->producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, err, err_size);
    if (!eng->producer)
        goto usage;
    pc = NULL;
    rd_kafka_poll_set_consumer(eng->consumer);

    const struct provider_breaker_config bc = {
        .failure_rate = (int)config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_FAILURE_RATE),
        .min_calls = (int)config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_MIN_CALLS),
        .window_ms = config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_WINDOW_MS),
        .open_ms = config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_OPEN_MS),
        .probes = (int)config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_PROBES),
    };
    eng->breaker = provider_breaker_new(&bc);
    if (!eng->breaker) {
        snprintf(err, err_size, "out of memory");
        return 1;
    }
    eng->provider =
        provider_client_new(config_str(eng->cfg, CONFIG_PROVIDER_BASE_URL),
                            config_str(eng->cfg, CONFIG_PROVIDER_API_KEY),
                            config_str(eng->cfg, CONFIG_PROVIDER_API_VERSION),
                            eng->provider_timeout_ms, err, err_size);
    if (!eng->provider)
        return 2;
    eng->op_state = eng->op->open(eng->cfg, eng->id, err, err_size);
    if (!eng->op_state)
        return 2;
    eng->offsets = offset_tracker_new();
    eng->jobs = job_list_new();
    if (!eng->offsets || !eng->jobs) {
        snprintf(err, err_size, "out of memory");
        return 1;
    }
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, eng->commands_topic,
                                      RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t kerr = rd_kafka_subscribe(eng->consumer, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (kerr) {
        snprintf(err, err_size, "cannot subscribe to '%s': %s", eng->commands_topic,
                 rd_kafka_err2str(kerr));
        return 1;
    }
    return 0;
usage:
    if (cc)
        rd_kafka_conf_destroy(cc);
    if (pc)
        rd_kafka_conf_destroy(pc);
    return 2;
}

/* Every step is bounded: flush_ms for dead letters still unacknowledged;
 * the rest does not wait on anything the jobs hold. */
static void teardown(engine_t *eng, int flush_ms)
{
    if (eng->provider)
        provider_client_abandon_all(eng->provider);
    /* Delivery reports point at jobs: serve them, purging what the broker
     * has not acknowledged in time, before the jobs go. */
    if (eng->producer) {
        rd_kafka_flush(eng->producer, flush_ms);
        rd_kafka_purge(eng->producer,
                       RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(eng->producer, 0);
    }
    /* Messages go back to librdkafka before its clients do: rd_kafka_destroy
     * waits for every message the application still holds. */
    for (struct job *j; eng->jobs && (j = job_list_oldest(eng->jobs));) {
        job_list_remove(eng->jobs, j);
        job_free(eng, j);
    }
    job_list_free(eng->jobs);
    eng->jobs = NULL;
    if (eng->producer)
        rd_kafka_destroy(eng->producer);
    if (eng->consumer)
        rd_kafka_destroy(eng->consumer);
    while (eng->revocations) {
        struct revocation *r = eng->revocations;
        eng->revocations = r->next;
        rd_kafka_topic_partition_list_destroy(r->parts);
        free(r);
    }
    provider_client_free(eng->provider);
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
    commit_offsets(eng, 1, NULL);
    eng->closing = 1;
    rd_kafka_consumer_close(eng->consumer);
    teardown(eng, flush_ms);
    free(eng);
}

int engine_start(config_t *cfg, const char *id, const struct engine_op *op,
                 engine_t **out, char *err, size_t err_size)
{
    engine_t *eng = calloc(1, sizeof(*eng));
    if (!eng) {
        config_free(cfg);
        snprintf(err, err_size, "out of memory");
        return 1;
    }
    eng->cfg = cfg;
    eng->op = op;
    snprintf(eng->id, sizeof(eng->id), "%s", id);
    int rc = setup(eng, err, err_size);
    if (rc != 0) {
        teardown(eng, 0);
        free(eng);
        return rc;
    }
    char lease[32], mif[32];
    snprintf(lease, sizeof(lease), "%lld", eng->lease_ms);
    snprintf(mif, sizeof(mif), "%lld", eng->max_in_flight);
    log_info("worker started", "worker", eng->id, "group", eng->group,
             "group_instance_id", eng->instance[0] ? eng->instance : NULL, "topic",
             eng->commands_topic, "lease_ms", lease, "max_in_flight", mif, "librdkafka",
             rd_kafka_version_str(), "group_protocol",
             kafka_setup_uses_consumer_protocol(eng->cfg) ? "consumer" : "classic",
             NULL);
    *out = eng;
    return 0;
}
