/* naive_consumer: the baseline of bench/throughput.py, the simplest correct
 * serial consumer one would write first. One command message at a time:
 *
 *   1. poll one message from the commands topic;
 *   2. call the provider's charge once, with the command's idempotency key;
 *   3. in ONE transaction (synchronous_commit on), write the attempt row
 *      and its outcome row;
 *   4. commit the message's offset synchronously;
 *
 * and only then the next message. No lease, no retry, no reconciliation, no
 * outbox: a baseline, not a product. Its tables live in schema "naive" of
 * the database it is given (created if missing). Every statement is
 * parameterized.
 *
 * Environment: KAFKA_BOOTSTRAP_SERVERS, KAFKA_GROUP_ID,
 * CHARGE_COMMANDS_TOPIC, DATABASE_URL, PROVIDER_BASE_URL, PROVIDER_API_KEY;
 * NAIVE_MAX_MESSAGES (exit 0 once that many were handled; 0 or unset: run
 * until SIGTERM or SIGINT).
 *
 * Prints one JSON line on stdout when it ends: messages handled, by outcome,
 * and the seconds from its first message to its last offset commit. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <libpq-fe.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static const char *env_or_die(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        fprintf(stderr, "naive_consumer: %s is not set\n", name);
        exit(2);
    }
    return v;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

struct buf {
    char *p;
    size_t n;
};

static size_t on_body(char *data, size_t size, size_t nmemb, void *ud)
{
    struct buf *b = ud;
    size_t add = size * nmemb;
    char *p = realloc(b->p, b->n + add + 1);
    if (!p)
        return 0;
    memcpy(p + b->n, data, add);
    b->p = p;
    b->n += add;
    b->p[b->n] = '\0';
    return add;
}

static const char *str_field(json_t *doc, const char *name)
{
    const char *s = json_string_value(json_object_get(doc, name));
    return s ? s : "";
}

/* Appends name=urlencoded(value)& to *form. */
static int form_add(CURL *c, char *form, size_t cap, const char *name,
                    const char *value)
{
    char *esc = curl_easy_escape(c, value, 0);
    if (!esc)
        return -1;
    size_t used = strlen(form);
    int n = snprintf(form + used, cap - used, "%s%s=%s", used ? "&" : "", name, esc);
    curl_free(esc);
    return n < 0 || (size_t)n >= cap - used ? -1 : 0;
}

struct outcome {
    char status[16];   /* SUCCEEDED, FAILED, ERROR */
    char http_code[8]; /* as text: a query parameter */
    char provider_id[128];
    char detail[256];
};

/* One charge call; the outcome is what its answer says, nothing retried. */
static void charge(CURL *c, const char *base_url, const char *auth_header, json_t *cmd,
                   struct outcome *out)
{
    char url[512], form[4096] = "", amount[32], currency[8] = "", idem[300];
    struct buf body = {0};
    struct curl_slist *h = NULL;
    long code = 0;

    snprintf(url, sizeof(url), "%s/v1/payment_intents", base_url);
    snprintf(amount, sizeof(amount), "%lld",
             (long long)json_integer_value(json_object_get(cmd, "amount")));
    const char *cur = str_field(cmd, "currency");
    for (size_t i = 0; cur[i] && i < sizeof(currency) - 1; i++)
        currency[i] = (char)(cur[i] >= 'A' && cur[i] <= 'Z' ? cur[i] + 32 : cur[i]);
    snprintf(idem, sizeof(idem), "Idempotency-Key: %s",
             str_field(cmd, "idempotency_key"));
    h = curl_slist_append(h, auth_header);
    h = curl_slist_append(h, idem);
    if (form_add(c, form, sizeof(form), "amount", amount) ||
        form_add(c, form, sizeof(form), "currency", currency) ||
        form_add(c, form, sizeof(form), "payment_method",
                 str_field(cmd, "payment_method")) ||
        form_add(c, form, sizeof(form), "confirm", "true") ||
        form_add(c, form, sizeof(form), "off_session", "true") ||
        form_add(c, form, sizeof(form), "metadata[payment_attempt_id]",
                 str_field(cmd, "payment_attempt_id")) ||
        form_add(c, form, sizeof(form), "metadata[order_id]",
                 str_field(cmd, "order_id"))) {
        snprintf(out->status, sizeof(out->status), "ERROR");
        snprintf(out->detail, sizeof(out->detail), "command fields too long");
        curl_slist_free_all(h);
        return;
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, form);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
    CURLcode rc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
    snprintf(out->http_code, sizeof(out->http_code), "%ld", code);
    json_t *doc = body.p ? json_loads(body.p, 0, NULL) : NULL;
    const char *pi_status = json_string_value(json_object_get(doc, "status"));
    const char *id = json_string_value(json_object_get(doc, "id"));
    if (rc != CURLE_OK) {
        snprintf(out->status, sizeof(out->status), "ERROR");
        snprintf(out->detail, sizeof(out->detail), "%s", curl_easy_strerror(rc));
    } else if (code == 200 && pi_status && !strcmp(pi_status, "succeeded") && id) {
        snprintf(out->status, sizeof(out->status), "SUCCEEDED");
        snprintf(out->provider_id, sizeof(out->provider_id), "%s", id);
    } else if (code == 402) {
        snprintf(out->status, sizeof(out->status), "FAILED");
        snprintf(out->detail, sizeof(out->detail), "declined");
    } else {
        snprintf(out->status, sizeof(out->status), "ERROR");
        snprintf(out->detail, sizeof(out->detail), "HTTP %ld, status %s", code,
                 pi_status ? pi_status : "-");
    }
    json_decref(doc);
    free(body.p);
    curl_slist_free_all(h);
}

static int exec_ok(PGconn *db, const char *sql)
{
    PGresult *r = PQexec(db, sql);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    if (!ok)
        fprintf(stderr, "naive_consumer: %s: %s", sql, PQerrorMessage(db));
    PQclear(r);
    return ok;
}

static const char *schema_sql =
    "CREATE SCHEMA IF NOT EXISTS naive;"
    "CREATE TABLE IF NOT EXISTS naive.attempts ("
    "  id uuid PRIMARY KEY,"
    "  order_id uuid NOT NULL,"
    "  idempotency_key text NOT NULL UNIQUE,"
    "  amount bigint NOT NULL,"
    "  currency text NOT NULL,"
    "  status text NOT NULL,"
    "  provider_payment_id text,"
    "  created_at timestamptz NOT NULL DEFAULT now());"
    "CREATE TABLE IF NOT EXISTS naive.outcomes ("
    "  id bigserial PRIMARY KEY,"
    "  attempt_id uuid NOT NULL REFERENCES naive.attempts (id),"
    "  status text NOT NULL,"
    "  http_status int,"
    "  detail text,"
    "  created_at timestamptz NOT NULL DEFAULT now());";

/* The attempt and its outcome, in one transaction. A redelivered message
 * (after a crash between the commit and the offset) finds its row. */
static int persist(PGconn *db, json_t *cmd, const struct outcome *o)
{
    char amount[32];
    snprintf(amount, sizeof(amount), "%lld",
             (long long)json_integer_value(json_object_get(cmd, "amount")));
    const char *attempt[] = {str_field(cmd, "payment_attempt_id"),
                             str_field(cmd, "order_id"),
                             str_field(cmd, "idempotency_key"),
                             amount,
                             str_field(cmd, "currency"),
                             o->status,
                             o->provider_id[0] ? o->provider_id : NULL};
    const char *outcome[] = {str_field(cmd, "payment_attempt_id"), o->status,
                             o->http_code, o->detail};
    if (!exec_ok(db, "BEGIN"))
        return -1;
    PGresult *r = PQexecParams(
        db,
        "INSERT INTO naive.attempts (id, order_id, idempotency_key, amount, currency,"
        " status, provider_payment_id) VALUES ($1, $2, $3, $4, $5, $6, $7)"
        " ON CONFLICT (id) DO UPDATE SET status = EXCLUDED.status,"
        " provider_payment_id = EXCLUDED.provider_payment_id",
        7, NULL, attempt, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    if (ok) {
        r = PQexecParams(db,
                         "INSERT INTO naive.outcomes (attempt_id, status, http_status,"
                         " detail) VALUES ($1, $2, $3, $4)",
                         4, NULL, outcome, NULL, NULL, 0);
        ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        PQclear(r);
    }
    if (!ok) {
        fprintf(stderr, "naive_consumer: persist: %s", PQerrorMessage(db));
        exec_ok(db, "ROLLBACK");
        return -1;
    }
    return exec_ok(db, "COMMIT") ? 0 : -1;
}

int main(void)
{
    const char *brokers = env_or_die("KAFKA_BOOTSTRAP_SERVERS");
    const char *group = env_or_die("KAFKA_GROUP_ID");
    const char *topic = env_or_die("CHARGE_COMMANDS_TOPIC");
    const char *dburl = env_or_die("DATABASE_URL");
    const char *base_url = env_or_die("PROVIDER_BASE_URL");
    const char *api_key = env_or_die("PROVIDER_API_KEY");
    const char *max_env = getenv("NAIVE_MAX_MESSAGES");
    long max_messages = max_env ? strtol(max_env, NULL, 10) : 0;
    char err[512], auth[512];

    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);

    PGconn *db = PQconnectdb(dburl);
    if (PQstatus(db) != CONNECTION_OK) {
        fprintf(stderr, "naive_consumer: database: %s", PQerrorMessage(db));
        return 1;
    }
    if (!exec_ok(db, "SET synchronous_commit = on") || !exec_ok(db, schema_sql))
        return 1;

    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);

    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", brokers, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "group.id", group, err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "enable.auto.commit", "false", err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "auto.offset.reset", "earliest", err, sizeof(err))) {
        fprintf(stderr, "naive_consumer: %s\n", err);
        return 2;
    }
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof(err));
    if (!rk) {
        fprintf(stderr, "naive_consumer: %s\n", err);
        return 1;
    }
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *subs = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(subs, topic, RD_KAFKA_PARTITION_UA);
    rd_kafka_resp_err_t e = rd_kafka_subscribe(rk, subs);
    rd_kafka_topic_partition_list_destroy(subs);
    if (e) {
        fprintf(stderr, "naive_consumer: subscribe: %s\n", rd_kafka_err2str(e));
        return 1;
    }

    long handled = 0, succeeded = 0, failed = 0, errors = 0;
    double first = 0, last = 0;
    int rc = 0;
    while (!stop && (max_messages <= 0 || handled < max_messages)) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m)
            continue;
        if (m->err) {
            if (m->err != RD_KAFKA_RESP_ERR__PARTITION_EOF)
                fprintf(stderr, "naive_consumer: consume: %s\n",
                        rd_kafka_message_errstr(m));
            rd_kafka_message_destroy(m);
            continue;
        }
        if (!handled)
            first = now_s();
        json_t *cmd = m->payload ? json_loadb(m->payload, m->len, 0, NULL) : NULL;
        struct outcome o = {0};
        if (!json_is_object(cmd)) {
            errors++; /* not a command: skipped, its offset committed */
        } else {
            charge(c, base_url, auth, cmd, &o);
            if (persist(db, cmd, &o) != 0) {
                rc = 1;
                json_decref(cmd);
                rd_kafka_message_destroy(m);
                break;
            }
            succeeded += !strcmp(o.status, "SUCCEEDED");
            failed += !strcmp(o.status, "FAILED");
            errors += !strcmp(o.status, "ERROR");
        }
        json_decref(cmd);
        e = rd_kafka_commit_message(rk, m, 0); /* synchronous */
        rd_kafka_message_destroy(m);
        if (e) {
            fprintf(stderr, "naive_consumer: commit: %s\n", rd_kafka_err2str(e));
            rc = 1;
            break;
        }
        handled++;
        last = now_s();
    }
    printf("{\"handled\":%ld,\"succeeded\":%ld,\"failed\":%ld,\"errors\":%ld,"
           "\"seconds\":%.3f}\n",
           handled, succeeded, failed, errors, handled ? last - first : 0.0);
    fflush(stdout);
    rd_kafka_consumer_close(rk);
    rd_kafka_destroy(rk);
    curl_easy_cleanup(c);
    curl_global_cleanup();
    PQfinish(db);
    return rc;
}
