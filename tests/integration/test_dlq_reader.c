/* dlq_reader against the stack's Kafka: letters with dlq.* headers are
 * produced to a fresh DLQ topic of two partitions, then read, selected,
 * shown (card digits masked on request, the letter itself untouched) and
 * replayed to a fresh command topic, whose end offset and messages say
 * what was sent, never what the reader believes; letters of transactions
 * (committed, aborted) and one naming another topic try the edges.
 *
 * Without the stack the test is skipped (exit 77). */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>

#include "config.h"
#include "dlq_reader.h"
#include "log.h"
#include "test_env.h"
#include "test_kafka.h"

/* Luhn-valid test card numbers, one per place a card can hide. */
#define KEY_CARD    "4242424242424242"
#define VALUE_CARD  "4111111111111111"
#define HEADER_CARD "5555555555554444"

static char dlq[96], cmds[96];
static char attempt[5][37], order[2][37];
static config_t *cfg;

/* One dead letter; orig_topic NULL leaves dlq.original.topic out. */
static void letter(rd_kafka_t *p, int32_t partition, const char *reason,
                   const char *failed_at, const char *orig_topic, const char *key,
                   const char *value)
{
    rd_kafka_headers_t *h = rd_kafka_headers_new(10);
    rd_kafka_header_add(h, "x-keep", -1, "kept", -1);
    rd_kafka_header_add(h, "x-note", -1, "pan " HEADER_CARD, -1);
    rd_kafka_header_add(h, "dlq.reason", -1, reason, -1);
    rd_kafka_header_add(h, "dlq.error", -1, "refused for the test", -1);
    if (orig_topic)
        rd_kafka_header_add(h, "dlq.original.topic", -1, orig_topic, -1);
    rd_kafka_header_add(h, "dlq.original.partition", -1, "0", -1);
    rd_kafka_header_add(h, "dlq.original.offset", -1, "7", -1);
    rd_kafka_header_add(h, "dlq.failed_at", -1, failed_at, -1);
    rd_kafka_header_add(h, "dlq.id", -1, "x:0:7", -1);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        p, RD_KAFKA_V_TOPIC(dlq), RD_KAFKA_V_PARTITION(partition),
        RD_KAFKA_V_KEY(key, strlen(key)),
        RD_KAFKA_V_VALUE((void *)value, strlen(value)), RD_KAFKA_V_HEADERS(h),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
    ck_assert_msg(!e, "produce: %s", rd_kafka_err2str(e));
}

static void command(char *out, size_t size, const char *a, const char *o, int card)
{
    snprintf(out, size,
             "{\"payment_attempt_id\":\"%s\",\"order_id\":\"%s\",\"amount\":900000%s}",
             a, o, card ? ",\"note\":\"card " VALUE_CARD "\"" : "");
}

/* Fresh topics and five letters:
 *   0:0 amount_over_limit  00:02  attempt 0, order 0, cards in key, value, header
 *   0:1 currency_not_allowed 00:03 attempt 1, order 0
 *   0:2 schema_violation   00:05  attempt 2, no dlq.original.topic
 *   1:0 card_data_refused  00:04  attempt 3
 *   1:1 amount_over_limit  00:01  attempt 4, order 1 */
static void setup(void)
{
    char id[37], v[512], key[128];
    test_env_uuid(id);
    id[8] = '\0';
    snprintf(dlq, sizeof(dlq), "dlq-reader-%s.dlq", id);
    snprintf(cmds, sizeof(cmds), "dlq-reader-%s.commands", id);
    test_kafka_create_topic(dlq, 2);
    test_kafka_create_topic(cmds, 1);
    for (int i = 0; i < 5; i++)
        test_env_uuid(attempt[i]);
    test_env_uuid(order[0]);
    test_env_uuid(order[1]);

    rd_kafka_t *p = test_kafka_client(RD_KAFKA_PRODUCER, NULL);
    snprintf(key, sizeof(key), "card %s", KEY_CARD);
    command(v, sizeof(v), attempt[0], order[0], 1);
    letter(p, 0, "amount_over_limit", "2026-01-01T00:00:02.000Z", cmds, key, v);
    command(v, sizeof(v), attempt[1], order[0], 0);
    letter(p, 0, "currency_not_allowed", "2026-01-01T00:00:03.000Z", cmds, attempt[1],
           v);
    command(v, sizeof(v), attempt[2], order[1], 0);
    letter(p, 0, "schema_violation", "2026-01-01T00:00:05.000Z", NULL, attempt[2], v);
    command(v, sizeof(v), attempt[3], order[1], 0);
    letter(p, 1, "card_data_refused", "2026-01-01T00:00:04.000Z", cmds, attempt[3], v);
    command(v, sizeof(v), attempt[4], order[1], 0);
    letter(p, 1, "amount_over_limit", "2026-01-01T00:00:01.000Z", cmds, attempt[4], v);
    ck_assert_int_eq(rd_kafka_flush(p, 30000), 0);
    rd_kafka_destroy(p);

    struct charged_error err;
    setenv("KAFKA_BOOTSTRAP_SERVERS", test_env_kafka(), 1);
    setenv("DATABASE_URL", test_env_database_url(), 1);
    setenv("CHARGE_DLQ_TOPIC", dlq, 1);
    setenv("CHARGE_COMMANDS_TOPIC", cmds, 1);
    cfg = config_new(CONFIG_ROLE_CTL, "ctl", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
}

static void teardown(void)
{
    config_free(cfg);
    cfg = NULL;
}

static dlq_reader_t *reader(void)
{
    struct charged_error err;
    dlq_reader_t *r = dlq_reader_new(cfg, &err);
    ck_assert_msg(r != NULL, "%s", err.message);
    return r;
}

static dlq_reader_t *read_all(void)
{
    struct charged_error err;
    dlq_reader_t *r = reader();
    ck_assert_msg(dlq_reader_read_all(r, &err) == CHARGED_OK, "%s", err.message);
    return r;
}

static const struct dlq_letter *at(const dlq_reader_t *r, int32_t p, int64_t o)
{
    for (size_t i = 0; i < dlq_reader_count(r); i++) {
        const struct dlq_letter *l = dlq_reader_letter(r, i);
        if (l->partition == p && l->offset == o)
            return l;
    }
    ck_abort_msg("no letter %d:%lld read", (int)p, (long long)o);
    return NULL;
}

static int64_t end_offset(const char *topic)
{
    struct charged_error err;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", test_env_kafka(), err.message,
                      sizeof(err.message));
    rd_kafka_conf_set(conf, "group.id", "dlq-reader-test", err.message,
                      sizeof(err.message));
    rd_kafka_t *c =
        rd_kafka_new(RD_KAFKA_CONSUMER, conf, err.message, sizeof(err.message));
    int64_t lo = -1, hi = -1;
    ck_assert(c != NULL);
    ck_assert(!rd_kafka_query_watermark_offsets(c, topic, 0, &lo, &hi, 10000));
    rd_kafka_destroy(c);
    return hi;
}

/* The selection's positions as "p:o p:o ...". */
static void positions(const dlq_reader_t *r, const struct dlq_filters *f, char *out,
                      size_t size)
{
    size_t n, used = 0;
    const struct dlq_letter **sel = dlq_reader_select(r, f, &n);
    ck_assert(sel != NULL);
    out[0] = '\0';
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(out + used, size - used, "%s%d:%lld", i ? " " : "",
                                 (int)sel[i]->partition, (long long)sel[i]->offset);
    free(sel);
}

START_TEST(reads_every_letter_and_its_headers)
{
    dlq_reader_t *r = read_all();
    ck_assert_uint_eq(dlq_reader_count(r), 5);
    const struct dlq_letter *l = at(r, 0, 0);
    ck_assert_str_eq(l->reason, "amount_over_limit");
    ck_assert_str_eq(l->error, "refused for the test");
    ck_assert_str_eq(l->orig_topic, cmds);
    ck_assert_str_eq(l->orig_partition, "0");
    ck_assert_str_eq(l->orig_offset, "7");
    ck_assert_str_eq(l->attempt, attempt[0]);
    ck_assert_str_eq(l->order, order[0]);
    ck_assert_int_eq(l->failed_at_ms, 1767225602000LL);
    ck_assert_str_eq(l->key, "card " KEY_CARD);
    ck_assert(at(r, 0, 2)->orig_topic == NULL);
    /* The ids come from the value. */
    ck_assert_str_eq(at(r, 1, 1)->attempt, attempt[4]);
    dlq_reader_free(r);
    dlq_reader_free(NULL);
}
END_TEST

START_TEST(selects_by_each_filter_and_limit)
{
    char got[256], upper[37];
    dlq_reader_t *r = read_all();
    struct dlq_filters f = {0};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "1:1 0:0 0:1 1:0 0:2"); /* oldest first */
    f.reason = "amount_over_limit";
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "1:1 0:0");
    f = (struct dlq_filters){0};
    snprintf(upper, sizeof(upper), "%s", attempt[1]);
    for (char *c = upper; *c; c++)
        if (*c >= 'a' && *c <= 'f')
            *c = (char)(*c - 'a' + 'A');
    f.attempt = upper; /* ids match whatever their case */
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "0:1");
    f = (struct dlq_filters){.order = order[0]};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "0:0 0:1");
    f = (struct dlq_filters){.have_since = 1, .since_ms = 1767225603000LL};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "0:1 1:0 0:2");
    f = (struct dlq_filters){.have_until = 1, .until_ms = 1767225603000LL};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "1:1 0:0");
    f = (struct dlq_filters){.limit = 2};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "1:0 0:2"); /* the newest two */
    f = (struct dlq_filters){.order = order[1], .limit = 1};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "0:2");
    f = (struct dlq_filters){.reason = "oversized"};
    positions(r, &f, got, sizeof(got));
    ck_assert_str_eq(got, "");
    dlq_reader_free(r);
}
END_TEST

START_TEST(reads_one_position_or_says_not_found)
{
    struct charged_error err;
    dlq_reader_t *r = reader();
    ck_assert_int_eq(dlq_reader_read_one(r, 1, 0, &err), CHARGED_OK);
    ck_assert_uint_eq(dlq_reader_count(r), 1);
    const struct dlq_letter *first = dlq_reader_letter(r, 0);
    ck_assert_str_eq(first->reason, "card_data_refused");
    ck_assert_int_eq(dlq_reader_read_one(r, 0, 1, &err), CHARGED_OK);
    ck_assert_uint_eq(dlq_reader_count(r), 2);
    ck_assert_ptr_eq(dlq_reader_letter(r, 0), first); /* letters do not move */
    ck_assert_str_eq(dlq_reader_letter(r, 1)->attempt, attempt[1]);
    ck_assert_int_eq(dlq_reader_read_one(r, 0, 99, &err), CHARGED_NOT_FOUND);
    ck_assert_int_eq(dlq_reader_read_one(r, 2, 0, &err), CHARGED_NOT_FOUND);
    ck_assert_uint_eq(dlq_reader_count(r), 2);
    dlq_reader_free(r);

    /* A DLQ topic that does not exist: Kafka has nothing to read. */
    setenv("CHARGE_DLQ_TOPIC", "dlq-reader-no-such-topic", 1);
    config_t *other = config_new(CONFIG_ROLE_CTL, "ctl", &err);
    ck_assert(other != NULL);
    r = dlq_reader_new(other, &err);
    ck_assert(r != NULL);
    ck_assert_int_eq(dlq_reader_read_all(r, &err), CHARGED_RETRY);
    ck_assert_msg(strstr(err.message, "does not exist"), "%s", err.message);
    dlq_reader_free(r);
    config_free(other);
}
END_TEST

START_TEST(parses_positions_whole)
{
    int32_t p;
    int64_t o;
    ck_assert_int_eq(dlq_position_parse("1:42", &p, &o), 0);
    ck_assert_int_eq(p, 1);
    ck_assert_int_eq(o, 42);
    ck_assert_int_eq(dlq_position_parse("2147483647:9223372036854775807", &p, &o), 0);
    const char *bad[] = {"",
                         "1",
                         "1:",
                         ":1",
                         "-1:0",
                         "1:-1",
                         "+1:0",
                         " 1:0",
                         "1:0 ",
                         "2147483648:0",
                         "0:9223372036854775808",
                         "a:0",
                         "1:2:3"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(dlq_position_parse(bad[i], &p, &o) == -1, "'%s' parsed", bad[i]);
}
END_TEST

static char *dump(const json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    ck_assert(s != NULL);
    return s;
}

START_TEST(masks_card_digits_in_copies_only)
{
    dlq_reader_t *r = read_all();
    const struct dlq_letter *l = at(r, 0, 0);
    json_t *masked = dlq_letter_json(r, l, 1);
    json_t *plain = dlq_letter_json(r, l, 0);
    char *m = dump(masked), *p = dump(plain);
    /* Masked: no card number anywhere, the last four kept. */
    ck_assert_msg(!strstr(m, KEY_CARD) && !strstr(m, VALUE_CARD) &&
                      !strstr(m, HEADER_CARD),
                  "%s", m);
    ck_assert_str_eq(json_string_value(json_object_get(masked, "key")),
                     "card ************4242");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(masked, "value"), "note")),
        "card ************1111");
    ck_assert_msg(strstr(m, "[\"x-note\",\"pan ************4444\"]"), "%s", m);
    ck_assert_str_eq(json_string_value(json_object_get(masked, "payment_attempt_id")),
                     attempt[0]);
    /* Unmasked, and the letter itself, untouched. */
    ck_assert_msg(strstr(p, KEY_CARD) && strstr(p, VALUE_CARD) &&
                      strstr(p, HEADER_CARD),
                  "%s", p);
    ck_assert_str_eq(l->key, "card " KEY_CARD);
    ck_assert_msg(strstr(l->value, VALUE_CARD), "%s", l->value);
    ck_assert_int_eq(json_integer_value(json_object_get(masked, "timestamp_ms")),
                     l->timestamp_ms);
    free(m);
    free(p);
    json_decref(masked);
    json_decref(plain);

    /* The replay's message, masked likewise; the headers it sends. */
    json_t *msg = dlq_replay_message_json(r, l, "tester", 1);
    m = dump(msg);
    ck_assert_str_eq(json_string_value(json_object_get(msg, "topic")), cmds);
    ck_assert_str_eq(json_string_value(json_object_get(msg, "key")),
                     "card ************4242");
    ck_assert_msg(!strstr(m, VALUE_CARD) && !strstr(m, HEADER_CARD), "%s", m);
    char from[160], want[512];
    snprintf(from, sizeof(from), "%s:0:0", dlq);
    snprintf(want, sizeof(want),
             "[[\"x-keep\",\"kept\"],[\"x-note\",\"pan ************4444\"],"
             "[\"dlq.replayed_from\",\"%s\"],[\"dlq.replayed_by\",\"tester\"]]",
             from);
    char *h = dump(json_object_get(msg, "headers"));
    ck_assert_str_eq(h, want);
    free(h);
    free(m);
    json_decref(msg);
    dlq_reader_free(r);
}
END_TEST

/* Every message of the original topic from offset `from`, into out (*n);
 * the consumer, to destroy once the messages are (it waits for them). */
static rd_kafka_t *consume(int64_t from, rd_kafka_message_t **out, size_t max,
                           size_t *n)
{
    struct charged_error err;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "bootstrap.servers", test_env_kafka(), err.message,
                      sizeof(err.message));
    rd_kafka_conf_set(conf, "group.id", "dlq-reader-test", err.message,
                      sizeof(err.message));
    rd_kafka_conf_set(conf, "enable.auto.commit", "false", err.message,
                      sizeof(err.message));
    rd_kafka_t *c =
        rd_kafka_new(RD_KAFKA_CONSUMER, conf, err.message, sizeof(err.message));
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, cmds, 0)->offset = from;
    ck_assert(!rd_kafka_assign(c, l));
    int64_t end = end_offset(cmds);
    long long deadline = test_env_deadline(20000);
    *n = 0;
    while (*n < max && from + (int64_t)*n < end && test_env_now_ms() < deadline) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(c, 500);
        if (m && !m->err)
            out[(*n)++] = m;
        else if (m)
            rd_kafka_message_destroy(m);
    }
    rd_kafka_topic_partition_list_destroy(l);
    return c;
}

static const char *msg_header(rd_kafka_message_t *m, const char *name)
{
    rd_kafka_headers_t *h = NULL;
    const void *v;
    size_t sz;
    if (rd_kafka_message_headers(m, &h) || rd_kafka_header_get_last(h, name, &v, &sz))
        return NULL;
    return v;
}

START_TEST(replays_to_the_original_topic)
{
    struct charged_error err;
    dlq_reader_t *r = read_all();
    const struct dlq_letter *sel[] = {at(r, 0, 0), at(r, 1, 0), at(r, 0, 1)};
    struct dlq_replay_item items[3];
    int64_t before = end_offset(cmds);

    /* A dry run sends nothing. */
    ck_assert_int_eq(dlq_reader_replay(r, sel, 3, "tester", 1, items, &err),
                     CHARGED_OK);
    ck_assert(!items[0].sent && !items[1].sent && !items[2].sent);
    ck_assert(items[1].skipped && !items[0].skipped);
    ck_assert_int_eq(end_offset(cmds), before);

    /* A letter without its original topic refuses the whole call. */
    const struct dlq_letter *bad[] = {at(r, 0, 0), at(r, 0, 2)};
    ck_assert_int_eq(dlq_reader_replay(r, bad, 2, "tester", 0, items, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(err.message, "0:2"), "%s", err.message);
    ck_assert_int_eq(dlq_reader_replay(r, sel, 1, "", 0, items, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(end_offset(cmds), before);

    /* A replay: the card letter skipped, the others on the original topic. */
    ck_assert_msg(dlq_reader_replay(r, sel, 3, "tester", 0, items, &err) == CHARGED_OK,
                  "%s", err.message);
    ck_assert(items[0].sent && !items[1].sent && items[2].sent);
    ck_assert(items[1].skipped);
    ck_assert_int_eq(items[0].to_partition, 0);
    ck_assert_int_eq(items[0].to_offset, before);
    ck_assert_int_eq(items[2].to_offset, before + 1);
    ck_assert_int_eq(end_offset(cmds), before + 2);

    rd_kafka_message_t *got[4];
    size_t ngot;
    rd_kafka_t *c = consume(before, got, 4, &ngot);
    ck_assert_uint_eq(ngot, 2);
    for (int i = 0; i < 2; i++) {
        const struct dlq_letter *l = sel[i * 2];
        char from[160];
        snprintf(from, sizeof(from), "%s:%d:%lld", dlq, (int)l->partition,
                 (long long)l->offset);
        ck_assert_uint_eq(got[i]->key_len, l->key_len);
        ck_assert(!memcmp(got[i]->key, l->key, l->key_len)); /* byte for byte */
        ck_assert_uint_eq(got[i]->len, l->value_len);
        ck_assert(!memcmp(got[i]->payload, l->value, l->value_len));
        ck_assert_str_eq(msg_header(got[i], "dlq.replayed_from"), from);
        ck_assert_str_eq(msg_header(got[i], "dlq.replayed_by"), "tester");
        ck_assert_str_eq(msg_header(got[i], "x-keep"), "kept");
        ck_assert_str_eq(msg_header(got[i], "x-note"), "pan " HEADER_CARD);
        const char *dropped[] = {"dlq.reason", "dlq.error", "dlq.original.topic",
                                 "dlq.failed_at", "dlq.id"};
        for (size_t k = 0; k < sizeof(dropped) / sizeof(dropped[0]); k++)
            ck_assert_msg(msg_header(got[i], dropped[k]) == NULL, "%s sent",
                          dropped[k]);
        rd_kafka_message_destroy(got[i]);
    }
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
    dlq_reader_free(r);
}
END_TEST

/* One letter written in a transaction of its own, committed or aborted:
 * the partition then ends in the transaction's marker, an offset no
 * consumer receives. */
static void txn_letter(int32_t partition, const char *value, int commit)
{
    struct charged_error err;
    char txid[64], id[37];
    test_env_uuid(id);
    snprintf(txid, sizeof(txid), "dlq-reader-test-%s", id);
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    ck_assert(!rd_kafka_conf_set(conf, "bootstrap.servers", test_env_kafka(),
                                 err.message, sizeof(err.message)));
    ck_assert(!rd_kafka_conf_set(conf, "transactional.id", txid, err.message,
                                 sizeof(err.message)));
    rd_kafka_t *p =
        rd_kafka_new(RD_KAFKA_PRODUCER, conf, err.message, sizeof(err.message));
    ck_assert_msg(p != NULL, "%s", err.message);
    ck_assert(!rd_kafka_init_transactions(p, 30000));
    ck_assert(!rd_kafka_begin_transaction(p));
    ck_assert(
        !rd_kafka_producev(p, RD_KAFKA_V_TOPIC(dlq), RD_KAFKA_V_PARTITION(partition),
                           RD_KAFKA_V_VALUE((void *)value, strlen(value)),
                           RD_KAFKA_V_HEADER("dlq.reason", "schema_violation", -1),
                           RD_KAFKA_V_HEADER("dlq.original.topic", cmds, -1),
                           RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END));
    /* Written before the end: an abort drops what is not yet sent. */
    ck_assert_int_eq(rd_kafka_flush(p, 30000), 0);
    rd_kafka_error_t *e = commit ? rd_kafka_commit_transaction(p, 30000)
                                 : rd_kafka_abort_transaction(p, 30000);
    ck_assert_msg(!e, "%s", e ? rd_kafka_error_string(e) : "");
    rd_kafka_destroy(p);
}

START_TEST(skips_transaction_markers_and_aborted_letters)
{
    struct charged_error err;
    /* 1:2 the committed letter, 1:3 its marker, 1:4 aborted, 1:5 marker. */
    txn_letter(1, "{\"committed\":true}", 1);
    txn_letter(1, "{\"aborted\":true}", 0);
    long long t0 = test_env_now_ms();
    dlq_reader_t *r = read_all();
    ck_assert_msg(test_env_now_ms() - t0 < 5000, "read in %lld ms",
                  test_env_now_ms() - t0);
    ck_assert_uint_eq(dlq_reader_count(r), 6);
    ck_assert_str_eq(at(r, 1, 2)->value, "{\"committed\":true}");
    ck_assert_int_eq(dlq_reader_total(r), 3 + 6);
    for (size_t i = 0; i < dlq_reader_count(r); i++)
        ck_assert(!strstr(dlq_reader_letter(r, i)->value, "aborted"));
    /* A marker's position or an aborted letter's holds no letter. */
    ck_assert_int_eq(dlq_reader_read_one(r, 1, 3, &err), CHARGED_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "1:3"), "%s", err.message);
    ck_assert_int_eq(dlq_reader_read_one(r, 1, 4, &err), CHARGED_NOT_FOUND);
    ck_assert_int_eq(dlq_reader_read_one(r, 1, 2, &err), CHARGED_OK);
    dlq_reader_free(r);

    /* The newest two offsets of partition 1 are markers and an aborted
     * letter: no letter there, and no wait for one. */
    r = reader();
    t0 = test_env_now_ms();
    ck_assert_int_eq(dlq_reader_read_newest(r, 2, &err), CHARGED_OK);
    ck_assert_msg(test_env_now_ms() - t0 < 5000, "read in %lld ms",
                  test_env_now_ms() - t0);
    ck_assert_uint_eq(dlq_reader_count(r), 2); /* 0:1 and 0:2 */
    dlq_reader_free(r);
}
END_TEST

START_TEST(reads_the_newest_as_summaries)
{
    struct charged_error err;
    struct dlq_replay_item items[1];
    dlq_reader_t *r = reader();
    ck_assert_int_eq(dlq_reader_total(r), 0);
    ck_assert_int_eq(dlq_reader_read_newest(r, 1, &err), CHARGED_OK);
    ck_assert_uint_eq(dlq_reader_count(r), 2);
    ck_assert_int_eq(dlq_reader_total(r), 5);
    const struct dlq_letter *l = at(r, 0, 2);
    ck_assert_str_eq(l->attempt, attempt[2]); /* ids taken before the value went */
    ck_assert_str_eq(l->order, order[1]);
    ck_assert(l->value == NULL && l->value_len == 0);
    ck_assert_str_eq(at(r, 1, 1)->reason, "amount_over_limit");
    /* Without its value a letter is not sent. */
    const struct dlq_letter *sel[] = {at(r, 1, 1)};
    ck_assert_int_eq(dlq_reader_replay(r, sel, 1, "tester", 1, items, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(err.message, "1:1"), "%s", err.message);
    dlq_reader_free(r);

    r = reader();
    ck_assert_int_eq(dlq_reader_read_newest(r, 1000, &err), CHARGED_OK);
    ck_assert_uint_eq(dlq_reader_count(r), 5);
    dlq_reader_free(r);
}
END_TEST

START_TEST(reads_positions_together)
{
    struct charged_error err;
    const struct dlq_letter *got[4];
    dlq_reader_t *r = reader();
    int32_t p[] = {0, 1, 0, 0};
    int64_t o[] = {2, 1, 0, 2};
    ck_assert_msg(dlq_reader_read_positions(r, p, o, 4, got, &err) == CHARGED_OK, "%s",
                  err.message);
    ck_assert_uint_eq(dlq_reader_count(r), 3); /* 0:2 named twice, read once */
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(got[i]->partition, p[i]);
        ck_assert_int_eq(got[i]->offset, o[i]);
    }
    ck_assert_ptr_eq(got[0], got[3]);
    ck_assert_str_eq(got[2]->attempt, attempt[0]);
    ck_assert(got[1]->value != NULL); /* whole letters: they can be replayed */

    /* One position missing: nothing is read, the first missing named. */
    int32_t p2[] = {1, 0, 1};
    int64_t o2[] = {0, 99, 7};
    ck_assert_int_eq(dlq_reader_read_positions(r, p2, o2, 3, got, &err),
                     CHARGED_NOT_FOUND);
    ck_assert_msg(strstr(err.message, "0:99"), "%s", err.message);
    int32_t p3[] = {5};
    int64_t o3[] = {0};
    ck_assert_int_eq(dlq_reader_read_positions(r, p3, o3, 1, got, &err),
                     CHARGED_NOT_FOUND);
    ck_assert_uint_eq(dlq_reader_count(r), 3);
    dlq_reader_free(r);
}
END_TEST

START_TEST(replays_only_to_the_command_topic)
{
    struct charged_error err;
    struct dlq_replay_item items[2];
    char results[128];
    snprintf(results, sizeof(results), "%s.results", dlq);
    rd_kafka_t *p = test_kafka_client(RD_KAFKA_PRODUCER, NULL);
    letter(p, 1, "database_refused", "2026-01-01T00:00:06.000Z", results, "k",
           "{\"event_type\":\"charge.succeeded\"}");
    ck_assert_int_eq(rd_kafka_flush(p, 30000), 0);
    rd_kafka_destroy(p);
    int64_t before = end_offset(cmds);
    dlq_reader_t *r = read_all();
    const struct dlq_letter *sel[] = {at(r, 0, 0), at(r, 1, 2)};
    ck_assert_int_eq(dlq_reader_replay(r, sel, 2, "tester", 0, items, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(err.message, "1:2") && strstr(err.message, results), "%s",
                  err.message);
    ck_assert_int_eq(dlq_reader_replay(r, sel, 2, "tester", 1, items, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(end_offset(cmds), before); /* not even the good one */
    dlq_reader_free(r);
}
END_TEST

int main(void)
{
    const char *kafka = getenv("CHARGED_TEST_KAFKA");
    const char *url = getenv("CHARGED_TEST_DATABASE_URL");
    if (!kafka || !*kafka || !url || !*url) {
        printf(
            "skipped: the stack is not running (tools/run-all-tests.sh starts it)\n");
        return 77;
    }
    log_init("dlq-reader-test", LOG_OFF);
    Suite *s = suite_create("dlq_reader");
    TCase *tc = tcase_create("reader");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, reads_every_letter_and_its_headers);
    tcase_add_test(tc, selects_by_each_filter_and_limit);
    tcase_add_test(tc, reads_one_position_or_says_not_found);
    tcase_add_test(tc, parses_positions_whole);
    tcase_add_test(tc, masks_card_digits_in_copies_only);
    tcase_add_test(tc, replays_to_the_original_topic);
    tcase_add_test(tc, skips_transaction_markers_and_aborted_letters);
    tcase_add_test(tc, reads_the_newest_as_summaries);
    tcase_add_test(tc, reads_positions_together);
    tcase_add_test(tc, replays_only_to_the_command_topic);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
