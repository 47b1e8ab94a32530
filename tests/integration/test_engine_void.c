/* The engine runs a second operation, unchanged: the test-only void of
 * tests/support/void_op.c, through the real engine
 * (worker/pipeline/engine.c, in this process), the stack's Kafka and
 * PostgreSQL, and a real psp-sim.
 *
 * What passes is judged from psp-sim's ledger (how many cancels it
 * executed under each key), the void's own tables, the dead-letter topic
 * and the group's committed offsets, never from what the engine believes:
 * - every void command, each delivered twice, cancels its intent once;
 * - a cancel whose answer is lost (psp-sim times out after executing) is
 *   sent again under the same key and executes nothing more;
 * - a void the provider refuses (the intent already succeeded) is FAILED,
 *   with its event, and no cancel;
 * - a malformed command and a key reused for another intent are dead
 *   letters, and every offset is committed once the effects are durable.
 *
 * Without the stack the test is skipped (exit 77). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "config.h"
#include "daemon.h"
#include "engine.h"
#include "log.h"
#include "provider_client.h"
#include "psp_sim_process.h"
#include "test_env.h"
#include "test_kafka.h"
#include "void_op.h"

#define PARTITIONS 3
#define VOIDS      6

static struct psp_sim_process psp;
static char db[1024], topic[96], dlq[112], group[112];
static PGconn *pg;
static int64_t produced[PARTITIONS];

static void produce(rd_kafka_t *p, int32_t partition, const char *key,
                    const char *value)
{
    rd_kafka_resp_err_t err =
        rd_kafka_producev(p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                          RD_KAFKA_V_KEY(key, strlen(key)),
                          RD_KAFKA_V_VALUE((void *)value, strlen(value)),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    ck_assert_msg(!err, "produce: %s", rd_kafka_err2str(err));
    produced[partition]++;
}

/* A payment intent in psp-sim in the status its payment method gives it
 * (pm_card_processing: processing, which may be canceled; pm_card_visa:
 * succeeded, which may not). */
static void intent(provider_client_t *pc, const char *method, char *id, size_t size)
{
    char attempt[37], key[64];
    test_env_uuid(attempt);
    snprintf(key, sizeof(key), "intent-%s", attempt);
    const struct provider_charge ch = {
        .idempotency_key = key,
        .amount = 1500,
        .currency = "EUR",
        .payment_method = method,
        .payment_attempt_id = attempt,
        .order_id = attempt,
    };
    struct provider_result res;
    provider_client_charge(pc, &ch, &res);
    ck_assert_msg(res.provider_payment_id[0], "no intent for %s", method);
    snprintf(id, size, "%s", res.provider_payment_id);
}

struct void_cmd {
    char id[37], key[64], intent[96], json[512];
};

static void void_command(struct void_cmd *v, const char *intent_id, const char *key)
{
    test_env_uuid(v->id);
    snprintf(v->intent, sizeof(v->intent), "%s", intent_id);
    if (key)
        snprintf(v->key, sizeof(v->key), "%s", key);
    else
        snprintf(v->key, sizeof(v->key), "void:%s", v->id);
    snprintf(
        v->json, sizeof(v->json),
        "{\"void_id\":\"%s\",\"payment_intent_id\":\"%s\",\"idempotency_key\":\"%s\"}",
        v->id, v->intent, v->key);
}

/* Cancels psp-sim executed under `key`, from its ledger. */
static size_t cancels_for_key(const char *key)
{
    size_t n = 0, i;
    json_t *l = psp_sim_admin(&psp, "GET", "/ledger", NULL), *row;
    json_t *rows = json_object_get(l, "cancels");
    ck_assert_msg(json_is_array(rows), "psp-sim's ledger has no cancels");
    json_array_foreach(rows, i, row)
    {
        const char *k = json_string_value(json_object_get(row, "idempotency_key"));
        n += k && !strcmp(k, key);
    }
    json_decref(l);
    return n;
}

static long long scalar(const char *sql, const char *param)
{
    const char *p[1] = {param};
    PGresult *r = PQexecParams(pg, sql, param ? 1 : 0, NULL, p, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s",
                  sql, PQerrorMessage(pg));
    long long v = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static int all_committed(rd_kafka_t *offsets)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int p = 0; p < PARTITIONS; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    int ok = rd_kafka_committed(offsets, l, 5000) == RD_KAFKA_RESP_ERR_NO_ERROR;
    for (int p = 0; ok && p < PARTITIONS; p++)
        ok = !l->elems[p].err && l->elems[p].offset == produced[p];
    rd_kafka_topic_partition_list_destroy(l);
    return ok;
}

/* The dead letters so far: how many, and how many carry `reason`. */
static size_t dead_letters(const char *reason, size_t *with_reason)
{
    rd_kafka_t *c = test_kafka_client(RD_KAFKA_CONSUMER, group);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    int64_t lo = 0, hi = 0;
    size_t n = 0;
    *with_reason = 0;
    ck_assert(!rd_kafka_query_watermark_offsets(c, dlq, 0, &lo, &hi, 5000));
    rd_kafka_topic_partition_list_add(l, dlq, 0)->offset = lo;
    ck_assert(!rd_kafka_assign(c, l));
    long long until = test_env_deadline(10000);
    while ((int64_t)n < hi - lo && test_env_now_ms() < until) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 200);
        if (!m)
            continue;
        if (!m->err) {
            rd_kafka_headers_t *h = NULL;
            const void *v = NULL;
            size_t vn = 0;
            n++;
            if (!rd_kafka_message_headers(m, &h) &&
                !rd_kafka_header_get_last(h, "dlq.reason", &v, &vn) &&
                vn == strlen(reason) && !memcmp(v, reason, vn))
                (*with_reason)++;
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    return n;
}

static void setenv_or_fail(const char *name, const char *value)
{
    ck_assert_int_eq(setenv(name, value, 1), 0);
}

START_TEST(voids_run_through_the_engine_at_most_once)
{
    char id[PROVIDER_ID_MAX];
    struct charged_error cerr;
    struct void_cmd ok[VOIDS], refused, malformed_key, reused;

    /* The world: the void's tables, psp-sim, the topics. */
    test_env_fresh_database(db, sizeof(db));
    pg = test_env_connect(db);
    for (const char *const *q = void_op_schema; *q; q++)
        test_env_sql(pg, *q, 0, NULL);
    psp_sim_start(&psp, NULL);
    snprintf(topic, sizeof(topic), "engine-void-%d-%lld", (int)getpid(),
             test_env_now_ms());
    snprintf(dlq, sizeof(dlq), "%s.dlq", topic);
    snprintf(group, sizeof(group), "%s-group", topic);
    test_kafka_create_topic(topic, PARTITIONS);
    test_kafka_create_topic(dlq, 1);

    provider_client_t *pc =
        provider_client_new(psp.base_url, PSP_SIM_TEST_KEY, NULL, 10000, &cerr);
    ck_assert_msg(pc != NULL, "%s", cerr.message);
    for (int i = 0; i < VOIDS; i++) {
        intent(pc, "pm_card_processing", id, sizeof(id));
        void_command(&ok[i], id, NULL);
    }
    intent(pc, "pm_card_visa", id, sizeof(id));
    void_command(&refused, id, NULL);
    /* Another intent under ok[0]'s key: refused before any call. */
    intent(pc, "pm_card_processing", id, sizeof(id));
    void_command(&reused, id, ok[0].key);
    provider_client_free(pc);

    /* ok[0]'s first cancel is executed and its answer lost (the
     * connection closes unanswered): the engine must send it again under
     * the same key, and the provider replay it. */
    char faults[256];
    snprintf(faults, sizeof(faults),
             "{\"rules\":[{\"kind\":\"drop_after\",\"probability\":1,"
             "\"key\":\"%s\",\"times\":1}]}",
             ok[0].key);
    json_decref(psp_sim_admin(&psp, "PUT", "/faults", faults));

    rd_kafka_t *p = test_kafka_client(RD_KAFKA_PRODUCER, NULL);
    for (int round = 0; round < 2; round++) /* every command delivered twice */
        for (int i = 0; i < VOIDS; i++)
            produce(p, i % PARTITIONS, ok[i].id, ok[i].json);
    produce(p, 0, refused.id, refused.json);
    /* After ok[0] on its partition: the first one recorded keeps the key. */
    produce(p, 0, reused.id, reused.json);
    test_env_uuid(malformed_key.id);
    produce(p, 2, malformed_key.id, "{\"void_id\": 12}");
    ck_assert_int_eq(rd_kafka_flush(p, 10000), 0);
    rd_kafka_destroy(p);

    /* The engine, as the worker runs it, with the void's descriptor. */
    setenv_or_fail("DATABASE_URL", db);
    setenv_or_fail("KAFKA_BOOTSTRAP_SERVERS", test_env_kafka());
    setenv_or_fail("KAFKA_GROUP_ID", group);
    setenv_or_fail("CHARGE_COMMANDS_TOPIC", topic);
    setenv_or_fail("CHARGE_DLQ_TOPIC", dlq);
    setenv_or_fail("PROVIDER_BASE_URL", psp.base_url);
    setenv_or_fail("PROVIDER_API_KEY", PSP_SIM_TEST_KEY);
    setenv_or_fail("PROVIDER_TIMEOUT_MS", "2000");
    setenv_or_fail("WORKER_LEASE_MS", "30000");
    setenv_or_fail("WORKER_RETRY_BASE_MS", "100");
    setenv_or_fail("WORKER_RETRY_MAX_MS", "1000");
    setenv_or_fail("WORKER_COMMIT_INTERVAL_MS", "100");
    /* Its database holds the void's table alone, not charged's schema:
     * no provider_budget to lease a share from. */
    setenv_or_fail("PROVIDER_BUDGET", "0");
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &cerr);
    ck_assert_msg(cfg != NULL, "%s", cerr.message);
    engine_t *eng = NULL;
    ck_assert_msg(engine_start(cfg, "engine-void-test", &void_op, &eng, &cerr) ==
                      CHARGED_OK,
                  "%s", cerr.message);

    rd_kafka_t *offsets = test_kafka_client(RD_KAFKA_CONSUMER, group);
    long long until = test_env_deadline(60000), next_look = 0;
    int done = 0;
    while (!done && test_env_now_ms() < until) {
        engine_step(eng, test_env_now_ms());
        if (test_env_now_ms() < next_look)
            continue;
        next_look = test_env_now_ms() + 250;
        done = scalar("SELECT count(*) FROM voids WHERE status NOT IN "
                      "('PENDING', 'PROCESSING')",
                      NULL) == VOIDS + 1 &&
               all_committed(offsets);
    }
    ck_assert_msg(done, "the voids were not all settled and committed in time");
    ck_assert_uint_eq(engine_drain(eng, test_env_now_ms() + 5000), 0);
    engine_finish(eng, 1000);

    /* What the provider did: one cancel a void, the lost answer included. */
    for (int i = 0; i < VOIDS; i++) {
        ck_assert_uint_eq(cancels_for_key(ok[i].key), 1);
        ck_assert_int_eq(scalar("SELECT count(*) FROM voids WHERE id = $1 AND status = "
                                "'SUCCEEDED' AND provider_id IS NOT NULL",
                                ok[i].id),
                         1);
        ck_assert_int_eq(scalar("SELECT count(*) FROM void_events WHERE void_id = $1 "
                                "AND event_type = 'void.succeeded'",
                                ok[i].id),
                         1);
    }
    /* The lost answer: ok[0] was sent more than once, one cancel; every
     * other void, once. */
    ck_assert_int_ge(
        scalar("SELECT count(*) FROM void_calls WHERE void_id = $1", ok[0].id), 2);
    ck_assert_int_eq(
        scalar("SELECT count(*) FROM void_calls WHERE void_id <> $1", ok[0].id), VOIDS);
    /* The refused void: FAILED with its event, nothing executed. */
    ck_assert_uint_eq(cancels_for_key(refused.key), 0);
    ck_assert_int_eq(scalar("SELECT count(*) FROM voids WHERE id = $1 AND status = "
                            "'FAILED'",
                            refused.id),
                     1);
    ck_assert_int_eq(scalar("SELECT count(*) FROM void_events WHERE void_id = $1 AND "
                            "event_type = 'void.failed'",
                            refused.id),
                     1);
    /* The reused key and the malformed command: dead letters, no row. */
    ck_assert_int_eq(scalar("SELECT count(*) FROM voids WHERE id = $1", reused.id), 0);
    size_t conflicts = 0, schema = 0;
    ck_assert_uint_eq(dead_letters("idempotency_key_conflict", &conflicts), 2);
    dead_letters("schema_violation", &schema);
    ck_assert_uint_eq(conflicts, 1);
    ck_assert_uint_eq(schema, 1);

    rd_kafka_destroy(offsets);
    psp_sim_stop(&psp);
    PQfinish(pg);
}
END_TEST

int main(void)
{
    const char *url = getenv("CHARGED_TEST_DATABASE_URL");
    const char *kafka = getenv("CHARGED_TEST_KAFKA");
    if (!url || !*url || !kafka || !*kafka || PQping(url) != PQPING_OK) {
        printf(
            "skipped: the stack is not running (tools/run-all-tests.sh starts it)\n");
        return 77;
    }
    log_init("engine-void-test", LOG_WARN);
    Suite *s = suite_create("engine_void");
    TCase *tc = tcase_create("void");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, voids_run_through_the_engine_at_most_once);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
