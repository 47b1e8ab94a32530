/* kafka_test_tool: what the end-to-end scripts need from Kafka that no
 * charged program should offer.
 *
 *   kafka_test_tool produce TOPIC < records.jsonl
 *       one record per line: {"key": str|null, "key_hex": str,
 *       "value": str|null, "value_hex": str, "headers": [[name, value], ...]}
 *       (a header value may be {"hex": str} for arbitrary bytes)
 *       (the _hex forms carry arbitrary bytes, such as invalid UTF-8);
 *       "partition": n sends it to partition n whatever its key (a record
 *       the producer of a fleet would route elsewhere, or two records of one
 *       key handled by two workers at once)
 *   kafka_test_tool lag GROUP TOPIC
 *       {"partitions":[{"partition":p,"committed":c,"end":e}],"lag":n}
 *   kafka_test_tool dump TOPIC
 *       every message from the beginning to the current end, as JSON lines
 *       (with its timestamp, ms since the epoch, and timestamp_type: create
 *       for the producer's CreateTime, log_append for the broker's)
 *   kafka_test_tool create-topic TOPIC PARTITIONS
 *       creates a topic (a test's own), succeeding if it exists
 *
 * Brokers come from KAFKA_BOOTSTRAP_SERVERS, SASL and TLS from KAFKA_SASL_*,
 * KAFKA_SSL_* and KAFKA_SECURITY_PROTOCOL. KAFKA_TOOL_COMPRESSION (gzip,
 * snappy, lz4, zstd) compresses what `produce` sends; values may then be
 * larger than the 4 MiB a topic accepts, since the broker limits the
 * compressed batch only (up to 64 MiB uncompressed). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

static const char *brokers(void)
{
    const char *b = getenv("KAFKA_BOOTSTRAP_SERVERS");
    return b ? b : "127.0.0.1:9092";
}

extern char **environ;

/* KAFKA_SECURITY_*, KAFKA_SASL_* and KAFKA_SSL_* go to librdkafka as charged
 * passes them (KAFKA_SASL_USERNAME -> sasl.username): the production
 * profile's brokers take SASL_SSL only. No other KAFKA_*: the scenarios'
 * environment carries the workers' group and session settings too. */
static void security_props(rd_kafka_conf_t *c)
{
    static const char *const prefixes[] = {"KAFKA_SECURITY_", "KAFKA_SASL_",
                                           "KAFKA_SSL_"};
    for (char **e = environ; *e; e++) {
        const char *eq = strchr(*e, '=');
        int ours = 0;
        for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
            ours |= !strncmp(*e, prefixes[i], strlen(prefixes[i]));
        if (!ours || !eq || (size_t)(eq - *e) - 6 >= 128)
            continue;
        char prop[128], err[512];
        size_t n = (size_t)(eq - *e) - 6;
        for (size_t i = 0; i < n; i++) {
            char ch = (*e)[6 + i];
            prop[i] = ch == '_' ? '.' : (char)tolower((unsigned char)ch);
        }
        prop[n] = '\0';
        if (rd_kafka_conf_set(c, prop, eq + 1, err, sizeof(err)) != RD_KAFKA_CONF_OK) {
            fprintf(stderr, "kafka_test_tool: %s: %s\n", prop, err);
            exit(2);
        }
    }
}

static rd_kafka_t *make(rd_kafka_type_t type, const char *group)
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", brokers(), err, sizeof(err));
    security_props(c);
    rd_kafka_conf_set(c, "message.max.bytes", "4194304", err, sizeof(err));
    const char *codec = getenv("KAFKA_TOOL_COMPRESSION");
    if (type == RD_KAFKA_PRODUCER && codec && *codec) {
        /* librdkafka checks message.max.bytes against the uncompressed size. */
        if (rd_kafka_conf_set(c, "compression.codec", codec, err, sizeof(err)) ||
            rd_kafka_conf_set(c, "message.max.bytes", "67108864", err, sizeof(err))) {
            fprintf(stderr, "kafka_test_tool: KAFKA_TOOL_COMPRESSION: %s\n", err);
            exit(2);
        }
    }
    if (group) {
        rd_kafka_conf_set(c, "group.id", group, err, sizeof(err));
        rd_kafka_conf_set(c, "enable.auto.commit", "false", err, sizeof(err));
    }
    rd_kafka_t *rk = rd_kafka_new(type, c, err, sizeof(err));
    if (!rk) {
        fprintf(stderr, "kafka_test_tool: %s\n", err);
        exit(1);
    }
    return rk;
}

static unsigned char *unhex(const char *h, size_t *len)
{
    size_t n = strlen(h) / 2;
    unsigned char *b = malloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        b[i] = (unsigned char)v;
    }
    *len = n;
    return b;
}

/* Bytes of field `name` or `name`_hex; *is_null when JSON null or absent. */
static unsigned char *field(json_t *rec, const char *name, size_t *len, int *is_null)
{
    char hexname[32];
    snprintf(hexname, sizeof(hexname), "%s_hex", name);
    json_t *hx = json_object_get(rec, hexname), *v = json_object_get(rec, name);
    *is_null = 0;
    if (json_is_string(hx))
        return unhex(json_string_value(hx), len);
    if (json_is_string(v)) {
        *len = json_string_length(v);
        unsigned char *b = malloc(*len + 1);
        memcpy(b, json_string_value(v), *len);
        return b;
    }
    *is_null = 1;
    *len = 0;
    return NULL;
}

static int produce(const char *topic)
{
    rd_kafka_t *rk = make(RD_KAFKA_PRODUCER, NULL);
    char *line = NULL;
    size_t cap = 0;
    int n = 0;
    while (getline(&line, &cap, stdin) > 0) {
        json_error_t jerr;
        json_t *rec = json_loads(line, 0, &jerr);
        if (!rec)
            continue;
        size_t klen, vlen;
        int knull, vnull;
        unsigned char *k = field(rec, "key", &klen, &knull);
        unsigned char *v = field(rec, "value", &vlen, &vnull);
        rd_kafka_headers_t *h = rd_kafka_headers_new(4);
        json_t *hs = json_object_get(rec, "headers"), *pair;
        size_t i;
        json_array_foreach(hs, i, pair)
        {
            const char *name = json_string_value(json_array_get(pair, 0));
            json_t *hv = json_object_get(json_array_get(pair, 1), "hex");
            if (json_is_string(hv)) { /* any bytes: NUL, invalid UTF-8 */
                size_t hlen;
                unsigned char *b = unhex(json_string_value(hv), &hlen);
                rd_kafka_header_add(h, name, -1, b, (ssize_t)hlen);
                free(b);
            } else {
                rd_kafka_header_add(h, name, -1,
                                    json_string_value(json_array_get(pair, 1)), -1);
            }
        }
        json_t *part = json_object_get(rec, "partition");
        int32_t partition = json_is_integer(part) ? (int32_t)json_integer_value(part)
                                                  : RD_KAFKA_PARTITION_UA;
        rd_kafka_resp_err_t e;
        do {
            e = rd_kafka_producev(
                rk, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(partition),
                RD_KAFKA_V_KEY(knull ? NULL : k, klen),
                RD_KAFKA_V_VALUE(vnull ? NULL : v, vlen), RD_KAFKA_V_HEADERS(h),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
            if (e == RD_KAFKA_RESP_ERR__QUEUE_FULL)
                rd_kafka_poll(rk, 100);
        } while (e == RD_KAFKA_RESP_ERR__QUEUE_FULL);
        if (e) {
            fprintf(stderr, "kafka_test_tool: produce: %s\n", rd_kafka_err2str(e));
            rd_kafka_headers_destroy(h);
            return 1;
        }
        free(k);
        free(v);
        json_decref(rec);
        n++;
        rd_kafka_poll(rk, 0);
    }
    free(line);
    if (rd_kafka_flush(rk, 30000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kafka_test_tool: flush timed out\n");
        return 1;
    }
    rd_kafka_destroy(rk);
    fprintf(stderr, "produced %d\n", n);
    return 0;
}

static int partitions_of(rd_kafka_t *rk, const char *topic)
{
    const struct rd_kafka_metadata *md;
    rd_kafka_topic_t *t = rd_kafka_topic_new(rk, topic, NULL);
    if (rd_kafka_metadata(rk, 0, t, &md, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kafka_test_tool: no metadata for %s\n", topic);
        exit(1);
    }
    int n = md->topic_cnt ? md->topics[0].partition_cnt : 0;
    rd_kafka_metadata_destroy(md);
    rd_kafka_topic_destroy(t);
    return n;
}

static int lag(const char *group, const char *topic)
{
    rd_kafka_t *rk = make(RD_KAFKA_CONSUMER, group);
    int n = partitions_of(rk, topic);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    for (int p = 0; p < n; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    if (rd_kafka_committed(rk, l, 10000) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        fprintf(stderr, "kafka_test_tool: committed offsets unavailable\n");
        return 1;
    }
    json_t *parts = json_array();
    long long total = 0;
    for (int p = 0; p < n; p++) {
        int64_t lo, hi;
        rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &hi, 10000);
        int64_t c = l->elems[p].offset;
        total += hi - (c < 0 ? lo : c);
        json_array_append_new(parts,
                              json_pack("{s:i, s:I, s:I}", "partition", p, "committed",
                                        (json_int_t)c, "end", (json_int_t)hi));
    }
    json_t *out =
        json_pack("{s:o, s:I}", "partitions", parts, "lag", (json_int_t)total);
    char *s = json_dumps(out, JSON_COMPACT);
    printf("%s\n", s);
    free(s);
    json_decref(out);
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return 0;
}

static json_t *bytes_json(const void *p, size_t n)
{
    if (!p)
        return json_null();
    json_t *s = json_stringn(p, n);
    if (s)
        return s;
    char *h = malloc(2 * n + 1);
    for (size_t i = 0; i < n; i++)
        sprintf(h + 2 * i, "%02x", ((const unsigned char *)p)[i]);
    s = json_pack("{s:s}", "hex", h);
    free(h);
    return s;
}

static int dump(const char *topic)
{
    rd_kafka_t *rk = make(RD_KAFKA_CONSUMER, "kafka-test-tool-dump");
    int n = partitions_of(rk, topic);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(n);
    int64_t *end = calloc((size_t)n, sizeof(*end));
    int open = 0;
    for (int p = 0; p < n; p++) {
        int64_t lo;
        rd_kafka_query_watermark_offsets(rk, topic, p, &lo, &end[p], 10000);
        if (end[p] > lo) {
            rd_kafka_topic_partition_list_add(l, topic, p)->offset = lo;
            open++;
        }
    }
    rd_kafka_assign(rk, l);
    while (open > 0) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 10000);
        if (!m) {
            fprintf(stderr, "kafka_test_tool: dump timed out\n");
            return 1;
        }
        if (m->err) {
            rd_kafka_message_destroy(m);
            continue;
        }
        json_t *hs = json_array();
        rd_kafka_headers_t *h;
        if (!rd_kafka_message_headers(m, &h)) {
            const char *name;
            const void *val;
            size_t sz;
            for (size_t i = 0; !rd_kafka_header_get_all(h, i, &name, &val, &sz); i++)
                json_array_append_new(hs,
                                      json_pack("[s, o]", name, bytes_json(val, sz)));
        }
        rd_kafka_timestamp_type_t tstype;
        int64_t ts = rd_kafka_message_timestamp(m, &tstype);
        json_t *rec = json_pack(
            "{s:i, s:I, s:o, s:o, s:o, s:I, s:s}", "partition", m->partition, "offset",
            (json_int_t)m->offset, "key", bytes_json(m->key, m->key_len), "value",
            bytes_json(m->payload, m->len), "headers", hs, "timestamp", (json_int_t)ts,
            "timestamp_type",
            tstype == RD_KAFKA_TIMESTAMP_CREATE_TIME       ? "create"
            : tstype == RD_KAFKA_TIMESTAMP_LOG_APPEND_TIME ? "log_append"
                                                           : "none");
        char *s = json_dumps(rec, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(rec);
        if (m->offset + 1 >= end[m->partition])
            open--;
        rd_kafka_message_destroy(m);
    }
    free(end);
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
    return 0;
}

static int create_topic(const char *topic, int partitions)
{
    char err[256];
    rd_kafka_t *rk = make(RD_KAFKA_PRODUCER, NULL);
    rd_kafka_NewTopic_t *nt =
        rd_kafka_NewTopic_new(topic, partitions, 1, err, sizeof(err));
    rd_kafka_NewTopic_set_config(nt, "max.message.bytes", "4194304");
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_CreateTopics(rk, &nt, 1, NULL, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    int rc = 1;
    if (ev) {
        const rd_kafka_CreateTopics_result_t *res =
            rd_kafka_event_CreateTopics_result(ev);
        size_t n;
        const rd_kafka_topic_result_t **tr =
            rd_kafka_CreateTopics_result_topics(res, &n);
        rd_kafka_resp_err_t e =
            n ? rd_kafka_topic_result_error(tr[0]) : rd_kafka_event_error(ev);
        if (e == RD_KAFKA_RESP_ERR_NO_ERROR ||
            e == RD_KAFKA_RESP_ERR_TOPIC_ALREADY_EXISTS)
            rc = 0;
        else
            fprintf(stderr, "kafka_test_tool: create %s: %s\n", topic,
                    rd_kafka_err2str(e));
        rd_kafka_event_destroy(ev);
    }
    rd_kafka_queue_destroy(q);
    rd_kafka_NewTopic_destroy(nt);
    /* Wait until the topic's partitions have leaders. */
    for (int i = 0; rc == 0 && i < 100; i++) {
        if (partitions_of(rk, topic) == partitions)
            break;
        rd_kafka_poll(rk, 100);
    }
    rd_kafka_destroy(rk);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "create-topic"))
        return create_topic(argv[2], atoi(argv[3]));
    if (argc == 3 && !strcmp(argv[1], "produce"))
        return produce(argv[2]);
    if (argc == 4 && !strcmp(argv[1], "lag"))
        return lag(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "dump"))
        return dump(argv[2]);
    fprintf(stderr,
            "usage: kafka_test_tool produce TOPIC | lag GROUP TOPIC | dump TOPIC | "
            "create-topic TOPIC PARTITIONS\n");
    return 2;
}
