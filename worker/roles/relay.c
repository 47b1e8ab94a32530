#include "relay.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"
#include "outbox_store.h"

struct relay {
    config_t *cfg;
    char id[160];
    outbox_store_t *store;
    rd_kafka_t *producer;
    rd_kafka_queue_t *queue; /* the producer's main queue: it wakes the loop */
    const char *topic;       /* CHARGE_RESULTS_TOPIC: every event goes there */
    long long batch, poll_ms, retention_ms, backlog_log_ms, ack_timeout_ms;
    int64_t next_poll, next_housekeeping;
    struct daemon_db db;
    int leading;
    int broker_refusing; /* the last batch was not all acknowledged */
    /* "kafka denies Write on topic T" while the broker refuses every event
     * for want of a permission (a revoked ACL), "" otherwise: readiness
     * names it, and it is logged once, not at every batch. */
    char denied[160];
    /* Delivery reports of the batch in hand, by index: recorded by the
     * callback, read by the loop. */
    rd_kafka_resp_err_t *acks;
    int *acked;
    int *produced;
    uintptr_t gen; /* of the batch in hand: reports of older ones are ignored */
};

/* A message's opaque: the batch it was produced in, and its index there. */
#define BATCH_INDEX_BITS 20 /* RELAY_BATCH is at most 100,000 */
#define OPAQUE(gen, i)   ((void *)(uintptr_t)(((gen) << BATCH_INDEX_BITS) | (i)))

/* What the role does, for --help. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged relay\n\n"
            "Publishes the result events of the outbox table to CHARGE_RESULTS_TOPIC,\n"
            "keyed by payment_attempt_id, each attempt's in the order they were\n"
            "written, with an idempotent producer; marks an event published only once\n"
            "the broker acknowledged it; one the broker refuses waits (back-off up to\n"
            "a minute) with the later events of its attempt only. One relay leads\n"
            "(a PostgreSQL advisory lock); others stand by and take over within\n"
            "RELAY_POLL_MS when it goes. Published rows are deleted after\n"
            "RELAY_RETENTION_MS. SIGTERM: finish the batch in hand, exit 0.\n\n");
    config_print_help(out, CONFIG_ROLE_RELAY);
}

static void on_delivery(rd_kafka_t *rk, const rd_kafka_message_t *m, void *opaque)
{
    struct relay *r = opaque;
    uintptr_t tag = (uintptr_t)m->_private;
    size_t i = tag & ((1u << BATCH_INDEX_BITS) - 1);
    (void)rk;
    /* The report of a batch given up on (its acknowledgement came too
     * late): the index now belongs to another event. That event was
     * judged unacknowledged and is published again; its late copy only
     * adds a duplicate, which consumers drop on event_id. */
    if ((tag >> BATCH_INDEX_BITS) != (r->gen & (UINTPTR_MAX >> BATCH_INDEX_BITS)))
        return;
    r->acks[i] = m->err;
    r->acked[i] = 1;
}

/* From a librdkafka thread, when something comes on the producer's queue
 * (an error, a late report): the loop serves it at once, not at the next
 * poll. */
static void on_queue_event(rd_kafka_t *rk, void *opaque)
{
    (void)rk;
    (void)opaque;
    daemon_wake();
}

/* Only the leader reports the outbox's backlog: a standby's numbers would
 * go stale. */
static void forget_backlog(void)
{
    metrics_forget(METRIC_OUTBOX_BACKLOG);
    metrics_forget(METRIC_OUTBOX_OLDEST);
}

static void db_failed(struct relay *r, const char *stage, const char *err)
{
    r->next_poll = daemon_db_failed(&r->db, stage, err);
    if (r->leading) {
        log_warn("leadership lost with the database connection", NULL);
        forget_backlog();
    }
    r->leading = 0;
}

/* Every RELAY_BACKLOG_LOG_MS: the backlog in a log line, and published rows
 * past their retention deleted. */
static void housekeeping(struct relay *r)
{
    struct charged_error err;
    char count[32], age[32], gone[32];
    long long n = 0, oldest = 0, deleted = 0;
    int64_t now = clock_now_ms();
    if (now < r->next_housekeeping)
        return;
    r->next_housekeeping = now + r->backlog_log_ms;
    if (outbox_store_backlog(r->store, &n, &oldest, &err) != CHARGED_OK ||
        outbox_store_purge(r->store, r->retention_ms, &deleted, &err) != CHARGED_OK) {
        db_failed(r, "housekeeping", err.message);
        return;
    }
    metrics_set(METRIC_OUTBOX_BACKLOG, (double)n);
    metrics_set(METRIC_OUTBOX_OLDEST, oldest / 1000.0);
    snprintf(count, sizeof(count), "%lld", n);
    snprintf(age, sizeof(age), "%lld", oldest);
    snprintf(gone, sizeof(gone), "%lld", deleted);
    log_info("outbox backlog", "unpublished", count, "oldest_ms", age, "purged", gone,
             NULL);
}

/* Errors of the event itself (its size), not of the broker or the topic:
 * trying it again at once can never help. */
static int own_error(rd_kafka_resp_err_t err)
{
    return err == RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE ||
           err == RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE ||
           err == RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE;
}

/* What became of each event of a batch. */
enum verdict { PUBLISHED = 0, FAILED, BEHIND };

/* 1 when an earlier event of the batch is of the same attempt (key). */
static int behind(const outbox_batch_t *b, size_t i)
{
    const char *key = outbox_batch_get(b, i)->key;
    for (size_t k = 0; k < i; k++)
        if (!strcmp(outbox_batch_get(b, k)->key, key))
            return 1;
    return 0;
}

/* A batch's verdicts: the events published (ids), those that failed (with
 * why), how many failed of their own error, and how many wait behind an
 * earlier event of their attempt. */
struct verdicts {
    enum verdict *v;
    const char **ids, **failed, **why;
    size_t ok, nfailed, nown, nbehind;
    size_t ndenied; /* failed for want of a permission */
};

/* Produces the first event of each attempt in the batch; the others wait
 * behind it. */
static void produce_batch(struct relay *r, const outbox_batch_t *b, size_t n,
                          struct verdicts *vs)
{
    for (size_t i = 0; i < n; i++) {
        const struct outbox_event *e = outbox_batch_get(b, i);
        r->acked[i] = r->produced[i] = 0;
        r->acks[i] = RD_KAFKA_RESP_ERR_NO_ERROR;
        if (behind(b, i)) {
            vs->v[i] = BEHIND;
            vs->nbehind++;
            continue;
        }
        r->acks[i] =
            rd_kafka_producev(r->producer, RD_KAFKA_V_TOPIC(r->topic),
                              RD_KAFKA_V_KEY(e->key, strlen(e->key)),
                              RD_KAFKA_V_VALUE((void *)e->payload, strlen(e->payload)),
                              RD_KAFKA_V_HEADER("event_id", e->event_id, -1),
                              RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                              RD_KAFKA_V_OPAQUE(OPAQUE(r->gen, i)), RD_KAFKA_V_END);
        r->produced[i] = r->acks[i] == RD_KAFKA_RESP_ERR_NO_ERROR;
    }
}

/* Serves delivery reports until every produced event is acknowledged, the
 * acknowledgement time is up, or the daemon stops hard. */
static void wait_acks(struct relay *r, size_t n)
{
    int64_t deadline = clock_now_ms() + r->ack_timeout_ms;
    while (clock_now_ms() < deadline && daemon_stopping() < 2) {
        /* Waiting for the broker is work, not a stuck loop. */
        daemon_heartbeat();
        rd_kafka_poll(r->producer, 50);
        size_t waiting = 0;
        for (size_t i = 0; i < n; i++)
            waiting += r->produced[i] && !r->acked[i];
        if (waiting == 0)
            break;
    }
}

/* Now that the broker answered: published when it acknowledged the event;
 * each failure is recorded with its error. */
static void judge_acks(const struct relay *r, const outbox_batch_t *b, size_t n,
                       struct verdicts *vs)
{
    for (size_t i = 0; i < n; i++) {
        if (vs->v[i] == BEHIND)
            continue;
        const char *event_id = outbox_batch_get(b, i)->event_id;
        if (r->produced[i] && r->acked[i] && !r->acks[i]) {
            vs->v[i] = PUBLISHED;
            vs->ids[vs->ok++] = event_id;
            continue;
        }
        vs->v[i] = FAILED;
        vs->nown += own_error(r->acks[i]);
        vs->ndenied += r->acks[i] == RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED ||
                       r->acks[i] == RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED;
        vs->failed[vs->nfailed] = event_id;
        vs->why[vs->nfailed++] = r->produced[i] && !r->acked[i]
                                     ? "no acknowledgement in time"
                                     : rd_kafka_err2str(r->acks[i]);
    }
}

/* Every event refused for want of a permission: said once, named by
 * readiness until an event is acknowledged again. 1 while denied. */
static int note_denied(struct relay *r, const struct verdicts *vs)
{
    if (vs->ok == 0 && vs->nfailed > 0 && vs->ndenied == vs->nfailed) {
        if (!r->denied[0]) {
            char what[sizeof(r->denied) - 16]; /* "kafka denies " + what */
            snprintf(what, sizeof(what), "Write on topic %s", r->topic);
            log_error("kafka denies a permission the relay needs", "permission", what,
                      "error", vs->why[0], "hint",
                      "grant it to this relay's principal (docs/operations.md, "
                      "Production settings); the relay waits for it",
                      NULL);
            snprintf(r->denied, sizeof(r->denied), "kafka denies %s", what);
        }
        return 1;
    }
    if (r->denied[0] && vs->ok > 0) {
        log_info("kafka permission granted again", "was", r->denied, NULL);
        r->denied[0] = '\0';
    }
    return 0;
}

/* Marks the batch's events published or failed: 0, or -1 when the
 * database failed (said). */
static int record_verdicts(struct relay *r, const struct verdicts *vs)
{
    struct charged_error err;
    int denied = note_denied(r, vs);
    if (vs->nfailed > 0 && !denied)
        log_warn("result events not acknowledged; publishing them again", "event_id",
                 vs->failed[0], "error", vs->why[0], "topic", r->topic, NULL);
    /* Nothing acknowledged at all, for no fault of the events: the broker
     * (or our topic) refuses us, and the whole batch is tried again soon.
     * Some acknowledged, or an event's own error: what failed is that
     * event's trouble, and it waits alone. */
    r->broker_refusing = vs->ok == 0 && vs->nfailed > vs->nown;
    if (vs->ok > 0 &&
        outbox_store_mark_published(r->store, vs->ids, vs->ok, &err) != CHARGED_OK) {
        db_failed(r, "mark published", err.message);
        return -1;
    }
    if (vs->nfailed > 0 && !r->broker_refusing) {
        metrics_add(METRIC_OUTBOX_FAILURES, (double)vs->nfailed);
        if (outbox_store_mark_failed(r->store, vs->failed, vs->why, vs->nfailed,
                                     &err) != CHARGED_OK) {
            db_failed(r, "mark failed", err.message);
            return -1;
        }
    }
    return 0;
}

/* Publishes one batch, in seq order, to the relay's own topic, and marks
 * published what the broker acknowledged. Of each attempt only the first
 * event of the batch is produced: the broker may refuse one (its size, say)
 * and take the next, so a later event of an attempt is produced only once
 * the earlier is acknowledged (the next batch, at once). An event that
 * fails holds back only its own attempt, never other attempts'. A relay
 * killed between producing and marking publishes again too, with the same
 * event_id: consumers deduplicate on it. */
static void publish_batch(struct relay *r)
{
    struct charged_error err;
    outbox_batch_t *b;
    if (outbox_store_fetch(r->store, (size_t)r->batch, &b, &err) != CHARGED_OK) {
        db_failed(r, "fetch", err.message);
        return;
    }
    size_t n = outbox_batch_count(b);
    if (n == 0) {
        r->next_poll = clock_now_ms() + r->poll_ms;
        outbox_batch_free(b);
        return;
    }
    struct verdicts vs = {.ids = calloc(n, sizeof(*vs.ids)),
                          .failed = calloc(n, sizeof(*vs.failed)),
                          .why = calloc(n, sizeof(*vs.why)),
                          .v = calloc(n, sizeof(*vs.v))};
    if (!vs.ids || !vs.failed || !vs.why || !vs.v)
        goto out;
    r->gen++;
    produce_batch(r, b, n, &vs);
    wait_acks(r, n);
    judge_acks(r, b, n, &vs);
    /* From here on, a late report of this batch changes nothing. */
    r->gen++;
    if (record_verdicts(r, &vs) != 0)
        goto out;
    daemon_db_ok(&r->db);
    metrics_add(METRIC_OUTBOX_PUBLISHED, (double)vs.ok);
    if (r->broker_refusing)
        r->next_poll = clock_now_ms() + 1000;
    else if (n < (size_t)r->batch && vs.nbehind == 0)
        r->next_poll = clock_now_ms() + r->poll_ms;
out:
    free(vs.ids);
    free(vs.failed);
    free(vs.why);
    free(vs.v);
    outbox_batch_free(b);
}

static void publish_step(struct relay *r, int64_t now)
{
    struct charged_error err;

    if (now < r->next_poll)
        return;
    int rc = outbox_store_lead(r->store, &err);
    if (rc != CHARGED_OK && rc != CHARGED_NOT_LEADER) {
        db_failed(r, "lead", err.message);
        return;
    }
    int lead = rc == CHARGED_OK;
    daemon_db_reached(&r->db);
    if (lead != r->leading)
        log_info(lead ? "leading: publishing the outbox"
                      : "standing by: another relay publishes",
                 "relay", r->id, NULL);
    if (!lead && r->leading)
        forget_backlog();
    r->leading = lead;
    if (!lead) {
        r->next_poll = now + r->poll_ms;
        return;
    }
    housekeeping(r);
    publish_batch(r);
}

/* Serves the producer's queue (the loop is woken when something comes on
 * it), and publishes when the poll is due: next due at the next poll. */
static int64_t relay_step(void *state, int64_t now)
{
    struct relay *r = state;
    rd_kafka_poll(r->producer, 0);
    publish_step(r, now);
    return r->next_poll;
}

/* Ready: the database answers, and the producer works: no fatal error, and
 * the broker acknowledged the last batch (a standby, which publishes
 * nothing, is ready to take over while the database answers). */
static const char *relay_not_ready(void *state)
{
    struct relay *r = state;
    char fatal[256];
    const char *why = daemon_db_not_ready(&r->db);
    if (why)
        return why;
    if (rd_kafka_fatal_error(r->producer, fatal, sizeof(fatal)))
        return "producer failed";
    if (r->broker_refusing && r->denied[0])
        return r->denied;
    if (r->broker_refusing)
        return "broker not acknowledging result events";
    return NULL;
}

/* Nothing is in flight between steps: each step waits for its batch's
 * acknowledgements. */
static size_t relay_drain(void *state, int64_t deadline)
{
    (void)state;
    (void)deadline;
    return 0;
}

static void teardown(struct relay *r, int flush_ms)
{
    if (r->producer) {
        rd_kafka_flush(r->producer, flush_ms);
        rd_kafka_purge(r->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(r->producer, 0);
        if (r->queue) {
            rd_kafka_queue_cb_event_enable(r->queue, NULL, NULL);
            rd_kafka_queue_destroy(r->queue);
        }
        rd_kafka_destroy(r->producer);
    }
    outbox_store_free(r->store);
    free(r->acks);
    free(r->acked);
    free(r->produced);
    config_free(r->cfg);
    free(r);
}

static void relay_finish(void *state, int flush_ms)
{
    teardown(state, flush_ms);
}

static enum charged_rc setup(void *state, config_t *cfg, const char *id,
                             struct charged_error *err)
{
    struct relay *r = state;
    r->cfg = cfg;
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->batch = config_int(r->cfg, CONFIG_RELAY_BATCH);
    r->poll_ms = config_int(r->cfg, CONFIG_RELAY_POLL_MS);
    r->retention_ms = config_int(r->cfg, CONFIG_RELAY_RETENTION_MS);
    r->backlog_log_ms = config_int(r->cfg, CONFIG_RELAY_BACKLOG_LOG_MS);
    r->ack_timeout_ms = config_int(r->cfg, CONFIG_RELAY_ACK_TIMEOUT_MS);
    r->topic = config_str(r->cfg, CONFIG_CHARGE_RESULTS_TOPIC);
    r->acks = calloc((size_t)r->batch, sizeof(*r->acks));
    r->acked = calloc((size_t)r->batch, sizeof(*r->acked));
    r->produced = calloc((size_t)r->batch, sizeof(*r->produced));
    if (!r->acks || !r->acked || !r->produced) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    /* The preset's idempotent producer keeps each attempt's events in
     * order: a retry never duplicates or reorders within a partition. */
    const struct kafka_setup_producer preset = {.message_timeout_ms =
                                                    r->ack_timeout_ms};
    if (kafka_setup_check_security(r->cfg, KAFKA_SECURITY_CHECK_MS, err) != CHARGED_OK)
        return CHARGED_GIVE_UP;
    rd_kafka_conf_t *pc = kafka_setup_producer_conf(r->cfg, r->id, &preset, err);
    if (!pc)
        return CHARGED_GIVE_UP;
    rd_kafka_conf_set_opaque(pc, r);
    rd_kafka_conf_set_dr_msg_cb(pc, on_delivery);
    char rderr[sizeof(err->message)];
    r->producer = rd_kafka_new(RD_KAFKA_PRODUCER, pc, rderr, sizeof(rderr));
    if (!r->producer) {
        charged_error_set(err, "%s", rderr);
        /* rd_kafka_new takes pc only on success. */
        rd_kafka_conf_destroy(pc);
        return CHARGED_GIVE_UP;
    }
    r->queue = rd_kafka_queue_get_main(r->producer);
    rd_kafka_queue_cb_event_enable(r->queue, on_queue_event, NULL);
    /* Does not connect: started while the database is down, it waits. */
    r->store = outbox_store_new(config_str(r->cfg, CONFIG_DATABASE_URL), err);
    if (!r->store)
        return CHARGED_GIVE_UP;
    return CHARGED_OK;
}

const struct daemon_role_desc relay_role = {
    .name = "relay",
    .config_role = CONFIG_ROLE_RELAY,
    .usage = usage,
    .state_size = sizeof(struct relay),
    .setup = setup,
    .step = relay_step,
    .not_ready = relay_not_ready,
    .drain = relay_drain,
    .finish = relay_finish,
};
