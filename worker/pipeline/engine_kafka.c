#include "engine_int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "charged_assert.h"
#include "clock.h"
#include "config.h"
#include "dead_letter.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"

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

/* A size rounded up so that what follows it is aligned for any type. */
static size_t job_round(size_t n)
{
    CHARGED_ASSERT(n > 0);
    const size_t a = _Alignof(max_align_t);
    return (n + a - 1) / a * a;
}

static void take_message(engine_t *eng, rd_kafka_message_t *msg)
{
    /* Only a message, never an error event, becomes a job; and only while
     * the memory held stays bounded (engine_fetch). */
    CHARGED_ASSERT(msg->err == RD_KAFKA_RESP_ERR_NO_ERROR && msg->offset >= 0);
    CHARGED_ASSERT((long long)job_list_holding(eng->jobs) <
                   HELD_FACTOR * eng->core.max_in_flight);
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
    CHARGED_ASSERT(j->state == JOB_BACKLOG && !j->detached);
}

/* Starts backlog jobs, oldest first, while fewer than max_in_flight run;
 * none while draining for shutdown (take_new 0), and none of partitions
 * being revoked: they are left to the next owner. */
void engine_start_jobs(engine_t *eng, int take_new)
{
    struct charged_error err;
    for (struct job *j = job_list_first(eng->jobs, JOB_BACKLOG), *next; take_new && j;
         j = next) {
        next = job_next_in_state(j);
        if ((long long)engine_core_started(eng->jobs) >= eng->core.max_in_flight)
            break;
        if (revoking(eng, j->partition))
            continue;
        rd_kafka_message_t *msg = j->msg;
        /* A job not given up keeps its message until it is reaped. */
        CHARGED_ASSERT(msg != NULL && !j->have_cmd && !j->detached);
        j->dl_reason = eng->op->parse(eng->op_state, msg->key, msg->key_len,
                                      msg->payload, msg->len, j->command, &err);
        if (j->dl_reason == DEAD_LETTER_NONE) {
            j->have_cmd = 1;
            j->id = eng->op->id_of(j->command);
            j->order_id = eng->op->order_of(j->command);
            j->kind = eng->op->kind_of ? eng->op->kind_of(j->command) : 0;
            j->id_field = eng->op->id_field ? eng->op->id_field(j->kind) : NULL;
        } else {
            job_set_error(j, "%s", err.message);
        }
        engine_core_parsed(eng->jobs, j, j->dl_reason == DEAD_LETTER_NONE);
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
    CHARGED_ASSERT(eng->nhandbacks <=
                   sizeof(eng->handbacks) / sizeof(eng->handbacks[0]));
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
    CHARGED_ASSERT(m->partition >= 0);
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

/* ---- permissions Kafka denies ---- */

/* What proves a denied permission back: the group's, an assignment (a
 * fetched message proves nothing: fetching needs no group); the commands
 * topic's, an assignment or a fetched message; the DLQ's, a dead letter
 * acknowledged. */
enum denied_kind { DENIED_GROUP = 1, DENIED_TOPIC = 2, DENIED_DLQ = 4 };

/* The kind of permission an authorization error says this worker lacks,
 * written as an ACL's terms ("Read on group G"), or 0 for any other
 * error. The consumer's topic is the commands topic, the producer's the
 * DLQ. */
static int denied_permission(const engine_t *eng, rd_kafka_resp_err_t err,
                             int producing, char *out, size_t size)
{
    switch (err) {
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
        snprintf(out, size, "Read on group %s", eng->group);
        return DENIED_GROUP;
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
        snprintf(out, size, "%s on topic %s", producing ? "Write" : "Read",
                 producing ? eng->dlq_topic : eng->commands_topic);
        return producing ? DENIED_DLQ : DENIED_TOPIC;
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
        /* The idempotent producer's, which Write on a topic implies. */
        snprintf(out, size, "IdempotentWrite on the cluster (or Write on topic %s)",
                 eng->dlq_topic);
        return DENIED_DLQ;
    default:
        return 0;
    }
}

/* 1 when err is an authorization error: then readiness names the missing
 * permission until it is back, and it is logged once, not at every retry
 * (librdkafka retries a denied JoinGroup every few seconds, for ever). */
static int note_denied(engine_t *eng, rd_kafka_resp_err_t err, int producing,
                       const char *error)
{
    char what[128], why[sizeof(eng->denied)];
    int kind = denied_permission(eng, err, producing, what, sizeof(what));
    if (!kind)
        return 0;
    snprintf(why, sizeof(why), "kafka denies %s", what);
    if (strcmp(why, eng->denied) != 0) {
        log_error("kafka denies a permission the worker needs", "permission", what,
                  "error", error, "hint",
                  "grant it to this worker's principal (docs/operations.md, "
                  "Production settings); the worker waits for it",
                  NULL);
        memcpy(eng->denied, why, sizeof(why));
        eng->denied_kind = kind;
    }
    return 1;
}

/* kinds: the denied_kinds that what just happened proves back. */
static void note_permitted(engine_t *eng, int kinds)
{
    if (eng->denied[0] && (eng->denied_kind & kinds)) {
        log_info("kafka permission granted again", "was", eng->denied, NULL);
        eng->denied[0] = '\0';
    }
}

/* Polls the consumer, which also serves rebalances and commit results.
 * Takes messages while the backlog has room. With a full backlog it polls
 * once a second only, so that the group never waits on us; a message such a
 * poll returns is taken only while fewer than HELD_FACTOR x max_in_flight
 * are held, and handed back otherwise, so memory stays bounded however long
 * the jobs are stuck (partitions are never paused: see docs/worker.md). */
void engine_fetch(engine_t *eng, int allow_new)
{
    CHARGED_ASSERT(eng->core.max_in_flight > 0);
    int64_t now = clock_now_ms();
    if ((long long)job_list_holding_in(eng->jobs, JOB_BACKLOG) >=
            eng->core.max_in_flight &&
        allow_new) {
        if (now - eng->last_full_poll_ms < 1000)
            return;
        eng->last_full_poll_ms = now;
    }
    for (;;) {
        /* Never waits: the loop's wait (engine_wait) woke for it. */
        rd_kafka_message_t *m = rd_kafka_consumer_poll(eng->consumer, 0);
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
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF &&
                !note_denied(eng, m->err, 0, rd_kafka_message_errstr(m)))
                log_warn("consumer error", "error", rd_kafka_message_errstr(m), NULL);
            rd_kafka_message_destroy(m);
            continue;
        }
        note_permitted(eng, DENIED_TOPIC);
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
            HELD_FACTOR * eng->core.max_in_flight) {
            hand_back(eng, m);
            rd_kafka_message_destroy(m);
            break;
        }
        take_message(eng, m);
        if ((long long)job_list_holding_in(eng->jobs, JOB_BACKLOG) >=
            eng->core.max_in_flight)
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
    CHARGED_ASSERT(eng->ndeliveries <= eng->deliveries_cap);
}

void engine_apply_deliveries(engine_t *eng)
{
    CHARGED_ASSERT(eng->ndeliveries <= eng->deliveries_cap);
    for (size_t i = 0; i < eng->ndeliveries; i++) {
        struct job *j = eng->deliveries[i].job;
        rd_kafka_resp_err_t err = eng->deliveries[i].err;
        if (!err) {
            metrics_add(METRIC_DEAD_LETTERS, 1, dead_letter_reason_name(j->dl_reason));
            note_permitted(eng, DENIED_DLQ);
        } else if (!note_denied(eng, err, 1, rd_kafka_err2str(err)))
            log_warn("dead letter not acknowledged; retrying", "error",
                     rd_kafka_err2str(err), JOB_FIELDS(j), NULL);
        engine_core_dead_letter_acked(eng->jobs, j, err != RD_KAFKA_RESP_ERR_NO_ERROR,
                                      too_large(err), clock_now_ms());
    }
    eng->ndeliveries = 0;
}

void engine_send_dead_letters(engine_t *eng)
{
    int64_t now = clock_now_ms();
    for (struct job *j = job_list_first(eng->jobs, JOB_DEAD_LETTER), *next; j;
         j = next) {
        struct dead_letter dl;
        char part[16], off[32];
        next = job_next_in_state(j);
        if (engine_core_dead_letter_gate(eng->jobs, j, now) != ENGINE_NEXT_SEND)
            continue;
        CHARGED_ASSERT(j->msg != NULL); /* not given up: the message is ours */
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
        enum engine_next next_step = engine_core_dead_letter_produced(
            eng->jobs, j, err != RD_KAFKA_RESP_ERR_NO_ERROR, too_large(err), now);
        if (next_step == ENGINE_NEXT_CUT) {
            log_warn("dead letter too large for the DLQ; producing it cut", "error",
                     rd_kafka_err2str(err), "partition", part, "offset", off,
                     JOB_FIELDS(j), NULL);
            continue;
        }
        if (next_step == ENGINE_NEXT_RETRY) {
            log_warn("cannot produce dead letter; retrying", "error",
                     rd_kafka_err2str(err), "partition", part, "offset", off,
                     JOB_FIELDS(j), NULL);
            continue;
        }
        /* The error line never quotes the value; card digits are masked. */
        log_warn("command dead-lettered", "reason",
                 dead_letter_reason_name(j->dl_reason), "error", j->dl_error,
                 "partition", part, "offset", off, JOB_FIELDS(j), NULL);
    }
}

/* ---- offsets ---- */

void engine_commit_offsets(engine_t *eng, int sync,
                           const rd_kafka_topic_partition_list_t *only)
{
    int32_t parts[1024];
    size_t n = offset_tracker_dirty(eng->offsets, parts, 1024);
    CHARGED_ASSERT(n <= 1024);
    rd_kafka_topic_partition_list_t *list =
        rd_kafka_topic_partition_list_new((int)n + 1);

    for (size_t i = 0; i < n; i++) {
        if (only &&
            !rd_kafka_topic_partition_list_find(only, eng->commands_topic, parts[i]))
            continue;
        rd_kafka_topic_partition_list_add(list, eng->commands_topic, parts[i])->offset =
            offset_tracker_committable(eng->offsets, parts[i]);
        /* Only durable work is committed: no job below the offset still
         * works on its message. A commit over one would lose it. */
        CHARGED_ASSERT(engine_core_commit_ok(
            eng->jobs, parts[i], offset_tracker_committable(eng->offsets, parts[i])));
    }
    if (list->cnt > 0) {
        rd_kafka_resp_err_t err = rd_kafka_commit(eng->consumer, list, !sync);
        if (err && err != RD_KAFKA_RESP_ERR__NO_OFFSET) {
            if (!note_denied(eng, err, 0, rd_kafka_err2str(err)))
                log_warn("offset commit failed; will retry", "error",
                         rd_kafka_err2str(err), NULL);
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
    if (!note_denied(eng, err, 0, rd_kafka_err2str(err)))
        log_warn("asynchronous offset commit failed; will commit again", "error",
                 rd_kafka_err2str(err), NULL);
    for (int i = 0; offsets && i < offsets->cnt; i++)
        offset_tracker_mark_committed(eng->offsets, offsets->elems[i].partition, -1);
}

/* ---- the breaker's pause ---- */

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
void engine_set_paused(engine_t *eng, int pause)
{
    CHARGED_ASSERT(pause == 0 || pause == 1);
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
void engine_paused_lag(engine_t *eng, int64_t now)
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

/* ---- rebalances ---- */

/* Started jobs of `parts` (all when NULL) that still hold an offset: what a
 * drain waits for (it starts nothing from the backlog, and waits for no
 * parked job: throttled, it is left to the next owner at once). */
size_t engine_jobs_of(engine_t *eng, const rd_kafka_topic_partition_list_t *parts)
{
    CHARGED_ASSERT(eng->jobs != NULL);
    size_t n = 0;
    if (!parts)
        return job_list_started(eng->jobs) - job_list_holding_in(eng->jobs, JOB_PARKED);
    for (struct job *j = job_list_oldest(eng->jobs); j; j = job_younger(j))
        if (!j->detached && j->state != JOB_BACKLOG && j->state != JOB_PARKED &&
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
size_t engine_detach(engine_t *eng, const rd_kafka_topic_partition_list_t *parts)
{
    size_t left = 0;
    /* A renewal of ours in flight would keep a lease we release below: it
     * locks the rows it renews, and a release skips locked rows. */
    engine_lanes_upkeep_wait(eng);
    for (struct job *j = job_list_oldest(eng->jobs); j; j = job_younger(j)) {
        if (j->detached || !in_parts(eng, parts, j->partition))
            continue;
        /* librdkafka gets the message back now: closing or destroying the
         * consumer would wait for it otherwise. */
        if (j->msg) {
            rd_kafka_message_destroy(j->msg);
            j->msg = NULL;
        }
        if (j->in_lane) {
            /* A lane's statement holds it, and the loop does not wait for
             * a statement (a lock may hold it for seconds): it holds no
             * offset from now on, and goes where a given-up job goes once
             * its result is applied (engine_detach_after_lane). */
            job_detach(eng->jobs, j);
            budget_member_forget(eng->budget, &j->budget);
            left++;
            continue;
        }
        enum engine_next next = engine_core_detach(eng->jobs, j);
        CHARGED_ASSERT(j->detached && j->msg == NULL);
        /* Revoked or stopping while it waited for the budget: no longer a
         * waiter. */
        budget_member_forget(eng->budget, &j->budget);
        left += next != ENGINE_NEXT_NONE;
        if (next == ENGINE_NEXT_RELEASE)
            engine_release_lease(eng, j);
    }
    if (left) {
        char n[32];
        snprintf(n, sizeof(n), "%zu", left);
        log_warn("drain deadline passed; unfinished messages left uncommitted", "count",
                 n, NULL);
    }
    engine_reap(eng);
    /* Given up for good (shutdown): not one job still holds an offset. */
    CHARGED_ASSERT(parts != NULL || job_list_holding(eng->jobs) == 0);
    return left;
}

void engine_detach_after_lane(engine_t *eng, struct job *j)
{
    CHARGED_ASSERT(!j->in_lane);
    /* Settled, or an outcome still to persist under our lease (a call
     * that was out): as engine_detach leaves them. */
    if (!j->detached || j->state == JOB_DONE || j->state == JOB_PERSIST)
        return;
    if (engine_core_detach(eng->jobs, j) == ENGINE_NEXT_RELEASE)
        engine_release_lease(eng, j);
}

/* Ends a revocation: what is unfinished is given up, what finished is
 * committed (unless the partitions were lost), and librdkafka is told. The
 * caller frees r. */
static void give_up(engine_t *eng, struct revocation *r)
{
    engine_detach(eng, r->parts);
    /* Nothing of the partitions given up holds an offset any more: what
     * is committed below is what finished. */
    CHARGED_ASSERT(engine_jobs_of(eng, r->parts) == 0);
    if (!r->lost)
        engine_commit_offsets(eng, 1, r->parts);
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
    CHARGED_ASSERT(r != NULL && r->parts != NULL);
    give_up(eng, r);
    rd_kafka_topic_partition_list_destroy(r->parts);
    free(r);
}

void engine_finish_revocations(engine_t *eng, int all)
{
    int64_t now = clock_now_ms();
    for (struct revocation **rp = &eng->revocations; *rp;) {
        struct revocation *r = *rp;
        if (all || r->lost || now >= r->deadline ||
            engine_jobs_of(eng, r->parts) == 0) {
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
    /* Paused, the statistics' lag is stale: engine_paused_lag() asks the broker. */
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
    CHARGED_ASSERT(parts != NULL);

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
        note_permitted(eng, DENIED_GROUP | DENIED_TOPIC);
        engine_finish_revocations(eng, 1);
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
        engine_finish_revocations(eng, 1);
}

/* ---- start-up and teardown ---- */

/* The consumer's settings: defaults an operator may override with KAFKA_*,
 * then what exactly-once charging depends on, which nobody may. CHARGED_OK,
 * or CHARGED_GIVE_UP and err (a setting librdkafka or Kafka refuses). */
static enum charged_rc consumer_settings(engine_t *eng, rd_kafka_conf_t *cc,
                                         struct charged_error *err)
{
    /* The consumer protocol (KIP-848) has the broker assign,
     * incrementally; the classic one gets the client-side cooperative
     * assignor. */
    if (kafka_setup_set(cc, "auto.offset.reset", "earliest", err) ||
        (!kafka_setup_uses_consumer_protocol(eng->cfg) &&
         kafka_setup_set(cc, "partition.assignment.strategy", "cooperative-sticky",
                         err)) ||
        kafka_setup_set(cc, "statistics.interval.ms", "5000", err))
        return CHARGED_GIVE_UP;
    kafka_setup_apply_env(cc, eng->cfg);
    if (kafka_setup_group_instance(cc, eng->cfg, eng->instance, sizeof(eng->instance),
                                   err) != CHARGED_OK)
        return CHARGED_GIVE_UP;
    if (kafka_setup_set(cc, "group.id", eng->group, err) ||
        kafka_setup_set(cc, "enable.auto.commit", "false", err) ||
        kafka_setup_set(cc, "enable.auto.offset.store", "false", err))
        return CHARGED_GIVE_UP;
    return CHARGED_OK;
}

/* librdkafka writes a byte to the pipe when a queue gets an event after
 * it was served: the loop's wait (engine_wait) sees it with the provider's
 * sockets. Non-blocking both ways: a full pipe already wakes the loop,
 * and librdkafka must never block writing to it. */
static enum charged_rc wake_on_events(engine_t *eng, struct charged_error *err)
{
    CHARGED_ASSERT(!eng->wake_open);
    if (pipe(eng->wake) != 0) {
        charged_error_set(err, "cannot make the loop's wake pipe: %s", strerror(errno));
        return CHARGED_RETRY;
    }
    eng->wake_open = 1;
    for (int i = 0; i < 2; i++)
        if (fcntl(eng->wake[i], F_SETFL, O_NONBLOCK) != 0 ||
            fcntl(eng->wake[i], F_SETFD, FD_CLOEXEC) != 0) {
            charged_error_set(err, "cannot set up the loop's wake pipe: %s",
                              strerror(errno));
            return CHARGED_RETRY;
        }
    eng->consumer_queue = rd_kafka_queue_get_consumer(eng->consumer);
    eng->producer_queue = rd_kafka_queue_get_main(eng->producer);
    if (!eng->consumer_queue || !eng->producer_queue) {
        charged_error_set(err, "kafka: no queue to wait on");
        return CHARGED_RETRY;
    }
    rd_kafka_queue_io_event_enable(eng->consumer_queue, eng->wake[1], "1", 1);
    rd_kafka_queue_io_event_enable(eng->producer_queue, eng->wake[1], "1", 1);
    return CHARGED_OK;
}

void engine_wait(engine_t *eng, int wait_ms)
{
    CHARGED_ASSERT(wait_ms >= 0 && eng->wake_open);
    char drain[64];
    int fds[2] = {eng->wake[0], eng->lane_wake_open ? eng->lane_wake[0] : -1};
    provider_client_wait(eng->provider, wait_ms, fds, eng->lane_wake_open ? 2 : 1);
    /* Emptied before the queues and the lanes are served: an event after
     * this wakes the next wait. */
    for (int i = 0; i < (eng->lane_wake_open ? 2 : 1); i++)
        while (read(fds[i], drain, sizeof(drain)) > 0)
            ;
}

enum charged_rc engine_kafka_setup(engine_t *eng, struct charged_error *err)
{
    CHARGED_ASSERT(eng->consumer == NULL && eng->producer == NULL);
    rd_kafka_conf_t *cc = NULL, *pc = NULL;
    char rderr[sizeof(err->message)];

    /* TLS material that does not verify would otherwise be retried, and
     * logged, for ever: said once, exit 2. */
    if (kafka_setup_check_security(eng->cfg, KAFKA_SECURITY_CHECK_MS, err) !=
        CHARGED_OK)
        return CHARGED_GIVE_UP;

    cc = kafka_setup_conf(eng->cfg, eng->id, err);
    if (!cc)
        goto usage;
    /* The dead-letter producer: the preset, idempotent, acks=all. */
    pc = kafka_setup_producer_conf(eng->cfg, eng->id, &(struct kafka_setup_producer){0},
                                   err);
    if (!pc || consumer_settings(eng, cc, err) != CHARGED_OK)
        goto usage;
    rd_kafka_conf_set_opaque(cc, eng);
    rd_kafka_conf_set_opaque(pc, eng);
    rd_kafka_conf_set_rebalance_cb(cc, on_rebalance);
    rd_kafka_conf_set_stats_cb(cc, on_stats);
    rd_kafka_conf_set_offset_commit_cb(cc, on_commit);
    rd_kafka_conf_set_dr_msg_cb(pc, on_delivery);

    eng->consumer = rd_kafka_new(RD_KAFKA_CONSUMER, cc, rderr, sizeof(rderr));
    if (!eng->consumer)
        goto refused;
    cc = NULL; /* owned by the consumer */
    eng->producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, rderr, sizeof(rderr));
    if (!eng->producer)
        goto refused;
    pc = NULL;
    rd_kafka_poll_set_consumer(eng->consumer);
    return wake_on_events(eng, err);
refused:
    charged_error_set(err, "%s", rderr);
usage:
    if (cc)
        rd_kafka_conf_destroy(cc);
    if (pc)
        rd_kafka_conf_destroy(pc);
    return CHARGED_GIVE_UP;
}

enum charged_rc engine_kafka_subscribe(engine_t *eng, struct charged_error *err)
{
    CHARGED_ASSERT(eng->consumer != NULL && eng->commands_topic != NULL);
    rd_kafka_topic_partition_list_t *topics = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(topics, eng->commands_topic,
                                      RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t kerr = rd_kafka_subscribe(eng->consumer, topics);
    rd_kafka_topic_partition_list_destroy(topics);
    if (kerr) {
        charged_error_set(err, "cannot subscribe to '%s': %s", eng->commands_topic,
                          rd_kafka_err2str(kerr));
        return CHARGED_RETRY;
    }
    return CHARGED_OK;
}

/* Delivery reports point at jobs: they are served, purging what the broker
 * has not acknowledged in time, before the jobs go. */
void engine_kafka_flush(engine_t *eng, int flush_ms)
{
    if (!eng->producer)
        return;
    rd_kafka_flush(eng->producer, flush_ms);
    rd_kafka_purge(eng->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
    rd_kafka_poll(eng->producer, 0);
}

/* After the jobs: rd_kafka_destroy waits for every message the application
 * still holds. */
void engine_kafka_teardown(engine_t *eng)
{
    /* The queues' handles go before their clients, which wait for them. */
    rd_kafka_queue_t *queues[] = {eng->consumer_queue, eng->producer_queue};
    for (size_t i = 0; i < 2; i++) {
        if (!queues[i])
            continue;
        rd_kafka_queue_io_event_enable(queues[i], -1, NULL, 0);
        rd_kafka_queue_destroy(queues[i]);
    }
    eng->consumer_queue = eng->producer_queue = NULL;
    if (eng->wake_open) {
        close(eng->wake[0]);
        close(eng->wake[1]);
        eng->wake_open = 0;
    }
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
}
