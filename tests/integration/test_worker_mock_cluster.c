/* The real `charged worker` against librdkafka's mock cluster, with the
 * stack's PostgreSQL and a psp-sim: broker and group faults that a real
 * Kafka cannot be made to show on demand (the real-Kafka scenarios in
 * tests/e2e stay beside it).
 *
 * Each test hosts a mock cluster in this process, creates the commands and
 * dead-letter topics on it, and runs worker processes pointed at it (its
 * bootstrap address, plaintext: the worker needs no setting of its own). Races are
 * forced, not hoped for: psp-sim is stopped (SIGSTOP) so that calls stay in flight, and
 * broker errors are pushed before the request they hit and cleared when the test has
 * seen what it needs. What passes is judged from psp-sim's ledger, the database and the
 * broker (the group's committed offsets, the dead-letter topic), never from the
 * worker's logs alone; its log lines only say when to take the next step.
 *
 * Without the stack's PostgreSQL the test is skipped (exit 77). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>
#include <openssl/sha.h>

#include "psp_sim_process.h"
#include "test_env.h"

#define COMMANDS_TOPIC "mock.charge.commands"
#define DLQ_TOPIC      "mock.charge.commands.dlq"
#define MAX_WORKERS    2
#define MAX_COMMANDS   16
/* Kafka protocol API keys (librdkafka does not install its table). */
#define API_PRODUCE       0
#define API_OFFSET_COMMIT 8

static void pause_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

struct command {
    char attempt[37], key[64], json[512];
    int32_t partition;
    int64_t offset;
};

struct world {
    rd_kafka_t *host; /* owns the mock cluster */
    rd_kafka_mock_cluster_t *mock;
    char bootstraps[256];
    rd_kafka_t *producer; /* the test's own: commands and raw messages */
    rd_kafka_t *offsets;  /* reads the worker group's committed offsets */
    char group[64];
    int partitions;
    int64_t end[8]; /* messages produced to each commands partition */
    char db[1024];
    PGconn *pg;
    struct psp_sim_process psp;
    int psp_frozen;
    char dir[128];
    pid_t worker[MAX_WORKERS];
    char worker_log[MAX_WORKERS][192];
    char worker_id[MAX_WORKERS][64];
    struct command cmd[MAX_COMMANDS];
    int ncmd;
};

static struct world W;

static rd_kafka_t *kafka_client(rd_kafka_type_t type, const char *group)
{
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const int consumer = type == RD_KAFKA_CONSUMER;
    const char *set[][2] = {
        {"bootstrap.servers", W.bootstraps},
        {"message.max.bytes", "4194304"},
        {consumer ? "group.id" : "linger.ms", consumer ? group : "0"},
        {consumer ? "enable.auto.commit" : "acks", consumer ? "false" : "all"},
        {consumer ? "enable.partition.eof" : "enable.idempotence", "true"},
    };
    for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++)
        ck_assert_msg(rd_kafka_conf_set(conf, set[i][0], set[i][1], errstr,
                                        sizeof(errstr)) == RD_KAFKA_CONF_OK,
                      "%s: %s", set[i][0], errstr);
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof(errstr));
    ck_assert_msg(rk != NULL, "%s", errstr);
    return rk;
}

static void world_abandon(void);

/* A mock cluster of `brokers` brokers (ids from 1) with the two topics. */
static void world_open(const char *name, int partitions, int brokers)
{
    char errstr[512];
    memset(&W, 0, sizeof(W));
    ck_assert(partitions <= (int)(sizeof(W.end) / sizeof(W.end[0])));
    W.partitions = partitions;
    snprintf(W.group, sizeof(W.group), "mock-%s-%d", name, (int)getpid());
    snprintf(W.dir, sizeof(W.dir), "mock-cluster-logs/%s-%d", name, (int)getpid());
    mkdir("mock-cluster-logs", 0777);
    ck_assert_msg(mkdir(W.dir, 0777) == 0 || errno == EEXIST, "mkdir %s", W.dir);

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    /* It only hosts the cluster: no notice that it has no brokers. */
    ck_assert_int_eq(rd_kafka_conf_set(conf, "log_level", "4", errstr, sizeof(errstr)),
                     RD_KAFKA_CONF_OK);
    W.host = rd_kafka_new(RD_KAFKA_PRODUCER, conf, errstr, sizeof(errstr));
    ck_assert_msg(W.host != NULL, "%s", errstr);
    W.mock = rd_kafka_mock_cluster_new(W.host, brokers);
    ck_assert_msg(W.mock != NULL, "cannot start the mock cluster");
    /* The first join needs no wait for other members: the tests start
     * their members one by one, when they choose. */
    rd_kafka_mock_group_initial_rebalance_delay_ms(W.mock, 0);
    snprintf(W.bootstraps, sizeof(W.bootstraps), "%s",
             rd_kafka_mock_cluster_bootstraps(W.mock));
    ck_assert_int_eq(rd_kafka_mock_topic_create(W.mock, COMMANDS_TOPIC, partitions, 1),
                     0);
    ck_assert_int_eq(rd_kafka_mock_topic_create(W.mock, DLQ_TOPIC, 1, 1), 0);
    W.producer = kafka_client(RD_KAFKA_PRODUCER, NULL);
    W.offsets = kafka_client(RD_KAFKA_CONSUMER, W.group);

    test_env_migrated_database(W.db, sizeof(W.db));
    W.pg = test_env_connect(W.db);

    static char psp_log[192];
    snprintf(psp_log, sizeof(psp_log), "%s/psp-sim.log", W.dir);
    W.psp.stderr_path = psp_log;
    psp_sim_start(&W.psp, NULL);
    atexit(world_abandon);
}

static void worker_stop_all(void);

/* A failed assertion ends the test process (exit): no worker may go on,
 * and psp-sim must not stay stopped. Workers also die with it when Check
 * kills it at its timeout (PR_SET_PDEATHSIG). */
static void world_abandon(void)
{
    for (int i = 0; i < MAX_WORKERS; i++)
        if (W.worker[i] > 0)
            kill(W.worker[i], SIGKILL);
    if (W.psp.pid > 0) {
        kill(W.psp.pid, SIGCONT);
        kill(W.psp.pid, SIGKILL);
    }
}

static void world_close(void)
{
    worker_stop_all();
    if (W.psp_frozen)
        kill(W.psp.pid, SIGCONT);
    psp_sim_stop(&W.psp);
    PQfinish(W.pg);
    rd_kafka_destroy(W.offsets);
    rd_kafka_destroy(W.producer);
    rd_kafka_mock_cluster_destroy(W.mock);
    rd_kafka_destroy(W.host);
}

/* ---- psp-sim ---- */

/* Stopped, psp-sim keeps its port and the kernel still accepts: a call
 * connects, sends, and waits for an answer until psp_thaw. */
static void psp_freeze(void)
{
    ck_assert_int_eq(kill(W.psp.pid, SIGSTOP), 0);
    W.psp_frozen = 1;
}

static void psp_thaw(void)
{
    ck_assert_int_eq(kill(W.psp.pid, SIGCONT), 0);
    W.psp_frozen = 0;
}

/* ---- workers ---- */

static void env_add(char **env, size_t *n, const char *name, const char *value)
{
    size_t len = strlen(name) + strlen(value) + 2;
    env[*n] = malloc(len);
    ck_assert(env[*n] != NULL);
    snprintf(env[*n], len, "%s=%s", name, value);
    (*n)++;
}

/* Starts `charged worker` number i with the test's settings, then extra
 * ("NAME", "value" pairs, NULL-terminated); its log goes to a file. */
static void worker_start(int i, const char *const *extra)
{
    char *env[64];
    size_t n = 0;
    /* Only what the process needs from ours: no stray KAFKA_* or WORKER_*. */
    const char *inherit[] = {"PATH", "LD_LIBRARY_PATH", "ASAN_OPTIONS", "UBSAN_OPTIONS",
                             "LSAN_OPTIONS"};
    for (size_t k = 0; k < sizeof(inherit) / sizeof(inherit[0]); k++)
        if (getenv(inherit[k]))
            env_add(env, &n, inherit[k], getenv(inherit[k]));
    snprintf(W.worker_id[i], sizeof(W.worker_id[i]), "mock-worker-%d-%d", i,
             (int)getpid());
    const char *set[][2] = {
        {"DATABASE_URL", W.db},
        {"KAFKA_BOOTSTRAP_SERVERS", W.bootstraps},
        {"KAFKA_GROUP_ID", W.group},
        {"CHARGE_COMMANDS_TOPIC", COMMANDS_TOPIC},
        {"CHARGE_DLQ_TOPIC", DLQ_TOPIC},
        {"PROVIDER_API_KEY", PSP_SIM_TEST_KEY},
        {"PROVIDER_BASE_URL", W.psp.base_url},
        /* Calls held by a stopped psp-sim must outlive the test's steps. */
        {"PROVIDER_TIMEOUT_MS", "20000"},
        {"WORKER_UNKNOWN_RETRIES", "1"},
        {"WORKER_LEASE_MS", "60000"},
        {"WORKER_RETRY_BASE_MS", "50"},
        {"WORKER_RETRY_MAX_MS", "500"},
        {"WORKER_RECHECK_MS", "100"},
        {"WORKER_COMMIT_INTERVAL_MS", "100"},
        {"REBALANCE_DRAIN_MS", "500"},
        {"SHUTDOWN_TIMEOUT_MS", "10000"},
        /* The mock's rebalance waits for the members at most the session
         * timeout less a second. */
        {"KAFKA_SESSION_TIMEOUT_MS", "3000"},
        {"KAFKA_HEARTBEAT_INTERVAL_MS", "300"},
        {"WORKER_ID", W.worker_id[i]},
        {"ADMIN_ADDR", "127.0.0.1:0"},
        {"LOG_LEVEL", "info"},
    };
    for (size_t k = 0; k < sizeof(set) / sizeof(set[0]); k++)
        env_add(env, &n, set[k][0], set[k][1]);
    for (size_t k = 0; extra && extra[k]; k += 2)
        env_add(env, &n, extra[k], extra[k + 1]);
    env[n] = NULL;
    ck_assert(n < sizeof(env) / sizeof(env[0]));

    snprintf(W.worker_log[i], sizeof(W.worker_log[i]), "%s/worker-%d.log", W.dir, i);
    int fd = open(W.worker_log[i], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ck_assert_msg(fd >= 0, "open %s", W.worker_log[i]);
    pid_t pid = fork();
    ck_assert(pid >= 0);
    if (pid == 0) {
        /* A test that times out must not leave workers behind. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fd, 1);
        dup2(fd, 2);
        char *argv[] = {"charged", "worker", NULL};
        execve(CHARGED_PATH, argv, env);
        _exit(127);
    }
    close(fd);
    for (size_t k = 0; k < n; k++)
        free(env[k]);
    W.worker[i] = pid;
}

static int worker_running(int i)
{
    int status;
    return W.worker[i] > 0 && waitpid(W.worker[i], &status, WNOHANG) == 0;
}

/* SIGTERM, and the exit status once it has exited (SIGKILL after the
 * deadline: -1). */
static int worker_stop(int i)
{
    int status = 0;
    pid_t pid = W.worker[i];
    if (pid <= 0)
        return -1;
    W.worker[i] = 0;
    kill(pid, SIGTERM);
    long long until = test_env_deadline(20000);
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (test_env_now_ms() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            return -1;
        }
        pause_ms(20);
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void worker_stop_all(void)
{
    for (int i = 0; i < MAX_WORKERS; i++)
        worker_stop(i);
}

/* Lines of worker i's log whose "msg" starts with msg and, when field is
 * given, whose field holds a value other than "0". */
static int log_count(int i, const char *msg, const char *field)
{
    char line[65536];
    int n = 0;
    FILE *f = fopen(W.worker_log[i], "r");
    if (!f)
        return 0;
    while (fgets(line, sizeof(line), f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *m = json_string_value(json_object_get(j, "msg"));
        const char *v = field ? json_string_value(json_object_get(j, field)) : NULL;
        if (m && !strncmp(m, msg, strlen(msg)) && (!field || (v && strcmp(v, "0"))))
            n++;
        json_decref(j);
    }
    fclose(f);
    return n;
}

/* The value of `field` in the last line of worker i's log whose "msg"
 * starts with msg and whose field holds a value other than "" and "0";
 * "" when there is none. */
static const char *log_last(int i, const char *msg, const char *field)
{
    static char out[1024];
    char line[65536];
    FILE *f = fopen(W.worker_log[i], "r");
    out[0] = '\0';
    if (!f)
        return out;
    while (fgets(line, sizeof(line), f)) {
        json_t *j = json_loads(line, 0, NULL);
        const char *m = json_string_value(json_object_get(j, "msg"));
        const char *v = json_string_value(json_object_get(j, field));
        if (m && !strncmp(m, msg, strlen(msg)) && v && *v && strcmp(v, "0"))
            snprintf(out, sizeof(out), "%s", v);
        json_decref(j);
    }
    fclose(f);
    return out;
}

/* ---- commands ---- */

/* Produces one message to a chosen partition and returns its offset. */
static int64_t produce(int32_t partition, const void *key, size_t key_len,
                       const void *value, size_t value_len)
{
    rd_kafka_resp_err_t err = rd_kafka_producev(
        W.producer, RD_KAFKA_V_TOPIC(COMMANDS_TOPIC), RD_KAFKA_V_PARTITION(partition),
        RD_KAFKA_V_KEY(key, key_len), RD_KAFKA_V_VALUE((void *)value, value_len),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    ck_assert_msg(!err, "produce: %s", rd_kafka_err2str(err));
    ck_assert_int_eq(rd_kafka_flush(W.producer, 10000), 0);
    /* One producer, flushed each time: offsets follow the order. */
    return W.end[partition]++;
}

/* A valid charge command for a new attempt, on the given partition. */
static struct command *command(int32_t partition)
{
    struct command c = {0};
    char order[37];
    ck_assert(W.ncmd < MAX_COMMANDS);
    test_env_uuid(c.attempt);
    test_env_uuid(order);
    snprintf(c.key, sizeof(c.key), "attempt:%s", c.attempt);
    snprintf(
        c.json, sizeof(c.json),
        "{\"type\":\"charge.requested\",\"version\":1,\"payment_attempt_id\":\"%s\","
        "\"order_id\":\"%s\",\"idempotency_key\":\"%s\",\"amount\":%d,"
        "\"currency\":\"EUR\",\"payment_method\":\"pm_card_visa\"}",
        c.attempt, order, c.key, 1000 + W.ncmd + 1);
    c.partition = partition;
    c.offset = produce(partition, c.attempt, strlen(c.attempt), c.json, strlen(c.json));
    W.cmd[W.ncmd] = c;
    return &W.cmd[W.ncmd++];
}

/* ---- what the database, psp-sim and the broker say ---- */

static long long scalar(const char *sql, const char *param)
{
    const char *params[1] = {param};
    PGresult *r = PQexecParams(W.pg, sql, param ? 1 : 0, NULL, params, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) == 1, "%s: %s",
                  sql, PQerrorMessage(W.pg));
    long long v = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* The group's committed offset of a commands partition; -1 when none. */
static int64_t committed(int32_t partition)
{
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, COMMANDS_TOPIC, partition);
    rd_kafka_resp_err_t err = rd_kafka_committed(W.offsets, l, 5000);
    ck_assert_msg(!err, "committed offsets: %s", rd_kafka_err2str(err));
    int64_t off = l->elems[0].err ? -2 : l->elems[0].offset;
    rd_kafka_topic_partition_list_destroy(l);
    return off < 0 ? -1 : off;
}

static int all_committed(void)
{
    for (int p = 0; p < W.partitions; p++)
        if (committed(p) != (W.end[p] ? W.end[p] : -1))
            return 0;
    return 1;
}

/* Requests of one API the mock received since tracking started, at one
 * broker (0: at any). */
static size_t requests_at(int16_t api_key, int32_t broker)
{
    size_t n = 0, cnt = 0;
    rd_kafka_mock_request_t **r = rd_kafka_mock_get_requests(W.mock, &cnt);
    for (size_t i = 0; i < cnt; i++)
        if (rd_kafka_mock_request_api_key(r[i]) == api_key &&
            (!broker || rd_kafka_mock_request_id(r[i]) == broker))
            n++;
    rd_kafka_mock_request_destroy_array(r, cnt);
    return n;
}

static size_t requests(int16_t api_key)
{
    return requests_at(api_key, 0);
}

/* Every command charged exactly once at the provider (its ledger), for the
 * amount it asked, and SUCCEEDED with that charge in the database; no
 * other charge. */
static void check_charged_once(void)
{
    json_t *ledger = psp_sim_admin(&W.psp, "GET", "/ledger", NULL);
    json_t *charges = json_object_get(ledger, "charges");
    ck_assert_int_eq(json_array_size(charges), W.ncmd);
    for (int i = 0; i < W.ncmd; i++) {
        const struct command *c = &W.cmd[i];
        size_t k, found = 0;
        json_t *ch, *mine = NULL;
        json_array_foreach(charges, k, ch)
        {
            if (!strcmp(json_string_value(json_object_get(ch, "idempotency_key")),
                        c->key)) {
                found++;
                mine = ch;
            }
        }
        ck_assert_msg(found == 1, "attempt %s charged %zu times at the provider",
                      c->attempt, found);
        ck_assert_int_eq(json_integer_value(json_object_get(mine, "amount")),
                         1000 + i + 1);
        const char *params[2] = {
            c->attempt, json_string_value(json_object_get(mine, "payment_intent_id"))};
        PGresult *r =
            PQexecParams(W.pg,
                         "SELECT count(*) FROM payment_attempts WHERE id = $1 AND "
                         "status = 'SUCCEEDED' AND provider_payment_id = $2",
                         2, NULL, params, NULL, NULL, 0);
        ck_assert_int_eq(PQresultStatus(r), PGRES_TUPLES_OK);
        ck_assert_msg(!strcmp(PQgetvalue(r, 0, 0), "1"),
                      "attempt %s is not SUCCEEDED with its charge", c->attempt);
        PQclear(r);
    }
    json_decref(ledger);
    ck_assert_int_eq(scalar("SELECT count(*) FROM payment_attempts", NULL), W.ncmd);
}

static void wait_for(const char *what, int (*cond)(void), long long ms)
{
    long long until = test_env_deadline(ms);
    while (!cond()) {
        ck_assert_msg(test_env_now_ms() < until,
                      "timed out waiting for %s (logs in %s)", what, W.dir);
        pause_ms(50);
    }
}

static int all_succeeded(void)
{
    return scalar("SELECT count(*) FROM payment_attempts WHERE status = 'SUCCEEDED'",
                  NULL) == W.ncmd;
}

static int settled_and_committed(void)
{
    return all_succeeded() && all_committed();
}

/* ---- dead letters ---- */

/* A copy: a message may not outlive its client. */
struct letter {
    void *key, *value;
    size_t key_len, value_len;
    rd_kafka_headers_t *h;
};

/* Every message of the dead-letter topic, oldest first; returns how many. */
static size_t read_letters(struct letter *out, size_t cap)
{
    size_t n = 0;
    rd_kafka_t *rk = kafka_client(RD_KAFKA_CONSUMER, "mock-dlq-reader");
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, DLQ_TOPIC, 0)->offset =
        RD_KAFKA_OFFSET_BEGINNING;
    ck_assert_int_eq(rd_kafka_assign(rk, l), 0);
    rd_kafka_topic_partition_list_destroy(l);
    long long until = test_env_deadline(10000);
    for (;;) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 100);
        ck_assert_msg(test_env_now_ms() < until, "the dead-letter topic did not end");
        if (!m)
            continue;
        if (m->err == RD_KAFKA_RESP_ERR__PARTITION_EOF) {
            rd_kafka_message_destroy(m);
            break;
        }
        ck_assert_msg(!m->err, "reading dead letters: %s", rd_kafka_message_errstr(m));
        ck_assert(n < cap);
        rd_kafka_headers_t *h = NULL;
        out[n].key = malloc(m->key_len + 1);
        out[n].value = malloc(m->len + 1);
        ck_assert(out[n].key && out[n].value);
        memcpy(out[n].key, m->key, m->key_len);
        memcpy(out[n].value, m->payload, m->len);
        out[n].key_len = m->key_len;
        out[n].value_len = m->len;
        out[n].h = rd_kafka_message_headers(m, &h) ? NULL : rd_kafka_headers_copy(h);
        rd_kafka_message_destroy(m);
        n++;
    }
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    return n;
}

static void free_letters(struct letter *l, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (l[i].h)
            rd_kafka_headers_destroy(l[i].h);
        free(l[i].key);
        free(l[i].value);
    }
}

/* A header's value as a string (headers are short text here). */
static const char *header(const struct letter *l, const char *name)
{
    static char out[8][256];
    static int next;
    const void *v;
    size_t size;
    if (!l->h || rd_kafka_header_get_last(l->h, name, &v, &size))
        return "(none)";
    char *o = out[next++ % 8];
    snprintf(o, sizeof(out[0]), "%.*s", (int)size, (const char *)v);
    return o;
}

static size_t dlq_count(void)
{
    struct letter l[8];
    size_t n = read_letters(l, 8);
    free_letters(l, n);
    return n;
}

/* ---- a. a rebalance in the middle of a batch ---- */

/* No partition committed past its first message (offset 0: committing it
 * moves nothing). */
static int nothing_committed(void)
{
    for (int p = 0; p < W.partitions; p++)
        if (committed(p) > 0)
            return 0;
    return 1;
}

/* "0:-1 1:0 ...": the committed offsets, for failure messages. */
static const char *committed_list(void)
{
    static char out[256];
    size_t o = 0;
    out[0] = '\0';
    for (int p = 0; p < W.partitions && o < sizeof(out); p++)
        o += (size_t)snprintf(out + o, sizeof(out) - o, " %d:%lld", p,
                              (long long)committed(p));
    return out;
}

#define A_PARTITIONS 4
#define A_COMMANDS   8

static int a_all_claimed_by_first(void)
{
    return scalar("SELECT count(*) FROM payment_attempts WHERE status = 'PROCESSING' "
                  "AND lease_owner = $1",
                  W.worker_id[0]) == A_COMMANDS;
}

/* Is attempt c leased to worker i? */
static int leased_to(int i, const struct command *c)
{
    const char *params[2] = {c->attempt, W.worker_id[i]};
    PGresult *r =
        PQexecParams(W.pg,
                     "SELECT count(*) FROM payment_attempts WHERE id = $1 AND "
                     "status = 'PROCESSING' AND lease_owner = $2",
                     2, NULL, params, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(W.pg));
    int yes = !strcmp(PQgetvalue(r, 0, 0), "1");
    PQclear(r);
    return yes;
}

static int a_handed_over(void)
{
    return log_count(0, "revoked partitions drained", NULL) > 0 &&
           log_count(1, "partitions assigned", "count") > 0;
}

/* The commands produced after the first A_COMMANDS, each behind attempts
 * the second worker consumes again: leased to it, they show that it has
 * tried to claim those. */
static int a_sentinels_claimed(void)
{
    for (int i = A_COMMANDS; i < W.ncmd; i++)
        if (!leased_to(1, &W.cmd[i]))
            return 0;
    return 1;
}

/* Eight charges in flight at the first worker (psp-sim stopped, so none can
 * finish); a second worker joins; the first drains the partitions it loses
 * for REBALANCE_DRAIN_MS and gives them up with the calls still hanging
 * there (offsets uncommitted). Those calls keep their leases: the second
 * worker consumes their commands again, but must not claim them and call
 * again with the same keys while the first worker's calls are still open.
 * A new command on each partition it took, claimed by it, shows it has
 * tried. Then psp-sim answers: the first worker persists every answer it
 * gets, and psp-sim was never asked twice under a key. */
START_TEST(rebalance_mid_batch)
{
    world_open("rebalance", A_PARTITIONS, 1);
    psp_freeze();
    for (int i = 0; i < A_COMMANDS; i++)
        command(i % A_PARTITIONS);
    worker_start(0, NULL);
    wait_for("every attempt PROCESSING at the first worker, its calls held",
             a_all_claimed_by_first, 20000);
    worker_start(1, NULL);
    wait_for("the first worker giving partitions up to the second", a_handed_over,
             20000);
    ck_assert_msg(
        log_count(0, "drain deadline passed", NULL) > 0,
        "the first worker gave attempts up without its drain deadline passing");
    char taken[1024];
    snprintf(taken, sizeof(taken), "%s",
             log_last(1, "partitions assigned", "partitions"));
    for (char *p = taken, *end; *p; p = *end ? end + 1 : end)
        command((int32_t)strtol(p, &end, 10));
    wait_for("the second worker claiming the commands behind the ones it took over",
             a_sentinels_claimed, 20000);
    for (int i = 0; i < A_COMMANDS; i++)
        ck_assert_msg(leased_to(0, &W.cmd[i]) && !leased_to(1, &W.cmd[i]),
                      "attempt %s, whose call the first worker still holds, is no "
                      "longer leased to it (partitions taken over: %s)",
                      W.cmd[i].attempt, taken);
    /* Nothing is durable yet: the drain's commit must not have moved. */
    ck_assert_msg(nothing_committed(),
                  "an offset was committed before its charge persisted:%s",
                  committed_list());
    psp_thaw();

    wait_for("every attempt settled and every offset committed", settled_and_committed,
             30000);
    check_charged_once();
    ck_assert_int_eq(log_count(0, "lease lost before persisting", NULL), 0);
    /* No second request under a key: none replayed, none refused because
     * the first was still running. */
    json_t *ledger = psp_sim_admin(&W.psp, "GET", "/ledger", NULL);
    json_t *counters = json_object_get(ledger, "counters");
    ck_assert_int_eq(json_integer_value(json_object_get(counters, "replayed")), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(counters, "in_use_409")), 0);
    json_decref(ledger);
    ck_assert(worker_running(0) && worker_running(1));
    ck_assert_int_eq(worker_stop(1), 0);
    ck_assert_int_eq(worker_stop(0), 0);
    world_close();
}
END_TEST

/* ---- b. a commit during a rebalance ---- */

#define B_PARTITIONS 4
#define B_COMMANDS   8

static int b_commits_refused(void)
{
    return requests(API_OFFSET_COMMIT) >= 3;
}

/* The first worker gave the second some partitions, drained (committing
 * synchronously, refused), and the second was refused a commit of offsets
 * of its own: it took the commands delivered again as done. */
static int b_handed_over(void)
{
    return log_count(0, "revoked partitions drained", NULL) > 0 &&
           log_count(1, "partitions assigned", "count") > 0 &&
           log_count(1, "asynchronous offset commit failed", NULL) > 0;
}

/* Every OffsetCommit of the group is refused REBALANCE_IN_PROGRESS while
 * the commands are charged and a second worker joins: the first worker's
 * commit at the revocation is refused like the others, so the partitions
 * it hands over come to the second one uncommitted, and their commands
 * are delivered again. Then two commits are refused ILLEGAL_GENERATION
 * (librdkafka takes it as a lost assignment: the group rejoins and the
 * commands come back once more). No command is sent to the provider
 * again; once commits are taken the group commits everything, and new
 * commands are charged and committed as usual. */
START_TEST(commit_during_rebalance)
{
    rd_kafka_resp_err_t errs[400];
    world_open("commit", B_PARTITIONS, 1);
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++)
        errs[i] = RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS;
    rd_kafka_mock_start_request_tracking(W.mock);
    /* More than the test can use up: they end when it clears them. */
    rd_kafka_mock_push_request_errors_array(W.mock, API_OFFSET_COMMIT,
                                            sizeof(errs) / sizeof(errs[0]), errs);
    for (int i = 0; i < B_COMMANDS; i++)
        command(i % B_PARTITIONS);
    worker_start(0, NULL);
    wait_for("every attempt SUCCEEDED", all_succeeded, 20000);
    wait_for("commits refused", b_commits_refused, 20000);
    ck_assert_msg(nothing_committed(),
                  "an offset was committed through refused commits:%s",
                  committed_list());
    worker_start(1, NULL);
    wait_for("partitions handed over uncommitted, their commands taken again",
             b_handed_over, 20000);
    ck_assert_msg(nothing_committed(),
                  "an offset was committed through refused commits:%s",
                  committed_list());
    rd_kafka_mock_clear_request_errors(W.mock, API_OFFSET_COMMIT);
    rd_kafka_mock_push_request_errors(W.mock, API_OFFSET_COMMIT, 2,
                                      RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION,
                                      RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION);

    /* The errors go in order: a commit taken comes after both. */
    wait_for("every offset committed once commits are taken", settled_and_committed,
             30000);
    ck_assert_int_eq(scalar("SELECT count(*) FROM provider_calls", NULL), B_COMMANDS);
    ck_assert_int_eq(scalar("SELECT count(DISTINCT payment_attempt_id) FROM "
                            "provider_calls",
                            NULL),
                     B_COMMANDS);
    ck_assert(worker_running(0) && worker_running(1));
    command(0);
    command(1);
    wait_for("new commands charged and committed", settled_and_committed, 20000);
    check_charged_once();
    ck_assert_int_eq(worker_stop(1), 0);
    ck_assert_int_eq(worker_stop(0), 0);
    world_close();
}
END_TEST

/* ---- c. a dead letter too large for the broker ---- */

#define C_VALUE_BYTES (100 * 1024)
#define C_KEY_BYTES   2048

static int c_done(void)
{
    return settled_and_committed() && dlq_count() >= 1;
}

/* A command too large to process (oversized, with a 2 KiB key) whose dead
 * letter the broker refuses as MSG_SIZE_TOO_LARGE: as dead-letters.md
 * promises, the letter is produced once more, cut (value to 64 KiB, key to
 * 1 KiB) with headers saying so, and the valid command behind it on the
 * same partition is charged and the partition committed past both. */
START_TEST(dead_letter_too_large)
{
    static char value[C_VALUE_BYTES], key[C_KEY_BYTES];
    unsigned char sha[SHA256_DIGEST_LENGTH];
    char sha_hex[2 * SHA256_DIGEST_LENGTH + 1], size[32];
    const char pad[] = "oversized-command-padding/";
    world_open("too_large", 1, 1);
    for (size_t i = 0; i < sizeof(value); i++)
        value[i] = pad[i % (sizeof(pad) - 1)];
    for (size_t i = 0; i < sizeof(key); i++)
        key[i] = "oversized-key/"[i % 14];
    SHA256((const unsigned char *)value, sizeof(value), sha);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
        snprintf(sha_hex + 2 * i, 3, "%02x", sha[i]);

    rd_kafka_mock_start_request_tracking(W.mock);
    int64_t off = produce(0, key, sizeof(key), value, sizeof(value));
    command(0);
    rd_kafka_mock_clear_requests(W.mock);
    rd_kafka_mock_push_request_errors(W.mock, API_PRODUCE, 1,
                                      RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE);
    worker_start(0, NULL);
    wait_for("the valid command charged, a dead letter, the partition committed",
             c_done, 20000);
    ck_assert_msg(requests(API_PRODUCE) >= 2,
                  "the broker's refusal was not met: %zu produce requests",
                  requests(API_PRODUCE));
    check_charged_once();

    struct letter l[4];
    size_t n = read_letters(l, 4);
    /* The refused letter was not written; the cut one once. */
    ck_assert_int_eq(n, 1);
    ck_assert_int_eq(l[0].value_len, 65536);
    ck_assert(!memcmp(l[0].value, value, 65536));
    ck_assert_int_eq(l[0].key_len, 1024);
    ck_assert(!memcmp(l[0].key, key, 1024));
    ck_assert_str_eq(header(&l[0], "dlq.reason"), "oversized");
    ck_assert_str_eq(header(&l[0], "dlq.value.truncated"), "true");
    snprintf(size, sizeof(size), "%d", C_VALUE_BYTES);
    ck_assert_str_eq(header(&l[0], "dlq.value.original_size"), size);
    ck_assert_str_eq(header(&l[0], "dlq.value.sha256"), sha_hex);
    ck_assert_str_eq(header(&l[0], "dlq.key.truncated"), "true");
    snprintf(size, sizeof(size), "%d", C_KEY_BYTES);
    ck_assert_str_eq(header(&l[0], "dlq.key.original_size"), size);
    ck_assert_str_eq(header(&l[0], "dlq.original.topic"), COMMANDS_TOPIC);
    ck_assert_str_eq(header(&l[0], "dlq.original.partition"), "0");
    snprintf(size, sizeof(size), "%lld", (long long)off);
    ck_assert_str_eq(header(&l[0], "dlq.original.offset"), size);
    snprintf(size, sizeof(size), "%s:0:%lld", COMMANDS_TOPIC, (long long)off);
    ck_assert_str_eq(header(&l[0], "dlq.id"), size);
    free_letters(l, n);
    ck_assert_int_eq(worker_stop(0), 0);
    world_close();
}
END_TEST

/* ---- d. broker errors on the dead letter's produce ---- */

static struct command *d_after, *d_other, *d_probe;

#define D_COMMANDS_BROKER 1
#define D_DLQ_BROKER      2

static int d_refused_and_other_committed(void)
{
    return requests_at(API_PRODUCE, D_DLQ_BROKER) >= 4 && all_succeeded() &&
           committed(d_other->partition) == d_other->offset + 1;
}

static int d_probe_committed(void)
{
    return all_succeeded() && committed(d_probe->partition) == d_probe->offset + 1;
}

static int d_done(void)
{
    return settled_and_committed() && dlq_count() >= 1;
}

/* A malformed command at the head of partition 0, a valid one behind it,
 * and valid ones on partition 1. The dead-letter topic's leader (broker 2;
 * the commands are on broker 1) answers every produce NOT_LEADER_FOR_PARTITION
 * or REQUEST_TIMED_OUT: meanwhile the valid commands are charged and
 * partition 1 is committed, but partition 0 stays at the letter, since its
 * offset moves only once the letter is acknowledged. Then the leadership
 * moves to broker 1 (what NOT_LEADER_FOR_PARTITION says), the letter is
 * delivered, byte for byte with its headers, and partition 0 committed. */
START_TEST(dead_letter_produce_errors)
{
    const char bad[] = "{\"type\":\"charge.requested\", not json";
    const char bad_key[] = "00000000-0000-4000-8000-00000000bad0";
    char want[64];
    world_open("produce_errors", 2, 2);
    for (int p = 0; p < 2; p++)
        ck_assert_int_eq(rd_kafka_mock_partition_set_leader(W.mock, COMMANDS_TOPIC, p,
                                                            D_COMMANDS_BROKER),
                         0);
    ck_assert_int_eq(
        rd_kafka_mock_partition_set_leader(W.mock, DLQ_TOPIC, 0, D_DLQ_BROKER), 0);
    int64_t off = produce(0, bad_key, strlen(bad_key), bad, strlen(bad));
    d_after = command(0);
    d_other = command(1);
    rd_kafka_mock_start_request_tracking(W.mock);
    /* More than the test can use up: the errors end when the leader moves. */
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(rd_kafka_mock_broker_push_request_error_rtts(
                             W.mock, D_DLQ_BROKER, API_PRODUCE, 2,
                             RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, 0,
                             RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, 0),
                         0);
    worker_start(0, NULL);
    wait_for(
        "the dead letter refused, the valid commands charged, partition 1 committed",
        d_refused_and_other_committed, 20000);
    /* A commit that follows the charge behind the letter (another command,
     * published only now) must still leave partition 0 at the letter. */
    d_probe = command(1);
    wait_for("a later commit", d_probe_committed, 20000);
    int64_t held = committed(0);
    ck_assert_msg(
        held == -1 || held == off,
        "partition 0 committed to %lld before its dead letter was acknowledged",
        (long long)held);
    ck_assert_int_eq(dlq_count(), 0);
    ck_assert_int_eq(
        rd_kafka_mock_partition_set_leader(W.mock, DLQ_TOPIC, 0, D_COMMANDS_BROKER), 0);

    wait_for("the dead letter delivered and partition 0 committed", d_done, 20000);
    check_charged_once();
    struct letter l[4];
    size_t n = read_letters(l, 4);
    ck_assert_uint_ge(n, 1);
    snprintf(want, sizeof(want), "%s:0:%lld", COMMANDS_TOPIC, (long long)off);
    for (size_t i = 0; i < n; i++) {
        /* Produced again or not, every copy is the same letter. */
        ck_assert_str_eq(header(&l[i], "dlq.id"), want);
        ck_assert_str_eq(header(&l[i], "dlq.reason"), "malformed_json");
        ck_assert_int_eq(l[i].value_len, strlen(bad));
        ck_assert(!memcmp(l[i].value, bad, strlen(bad)));
        ck_assert_int_eq(l[i].key_len, strlen(bad_key));
        ck_assert(!memcmp(l[i].key, bad_key, strlen(bad_key)));
        ck_assert_str_eq(header(&l[i], "dlq.value.truncated"), "(none)");
    }
    free_letters(l, n);
    ck_assert_int_eq(worker_stop(0), 0);
    world_close();
}
END_TEST

/* The stack's PostgreSQL is all this test needs of it. */
static const char *stack_missing(void)
{
    const char *url = getenv("CHARGED_TEST_DATABASE_URL");
    if (!url || !*url)
        return "CHARGED_TEST_DATABASE_URL is not set";
    if (PQping(url) != PQPING_OK)
        return "the stack's PostgreSQL does not answer";
    return NULL;
}

int main(void)
{
    const char *why = stack_missing();
    if (why) {
        printf("skipped: %s (tools/run-all-tests.sh starts the stack)\n", why);
        return 77;
    }
    Suite *s = suite_create("worker_mock_cluster");
    /* One case each, so that CK_RUN_CASE runs one alone. */
    const struct {
        const char *name;
        const TTest *test;
    } cases[] = {
        {"rebalance_mid_batch", rebalance_mid_batch},
        {"commit_during_rebalance", commit_during_rebalance},
        {"dead_letter_too_large", dead_letter_too_large},
        {"dead_letter_produce_errors", dead_letter_produce_errors},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        TCase *tc = tcase_create(cases[i].name);
        tcase_set_timeout(tc, 60);
        tcase_add_test(tc, cases[i].test);
        suite_add_tcase(s, tc);
    }
    return test_env_run_suite(s);
}
