/* A dead letter as JSON (masked where it is shown) and its replay to the
 * command topic: chargectl dlq and the console. The reading is
 * dlq_reader.c's. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

#include "card_data.h"
#include "dlq_reader_int.h"
#include "kafka_setup.h"

#define REPLAY_TIMEOUT_MS 30000

/* ---- JSON ---- */

/* A copy of n bytes at p, card numbers masked when mask (NULL for NULL or
 * out of memory: the caller shows null rather than the digits). */
static char *masked_copy(const char *p, size_t n, int mask)
{
    char *c = p ? dlq_copy_bytes(p, n) : NULL;
    if (c && mask)
        card_data_mask_loose(c, n);
    return c;
}

/* Bytes as a JSON value: the parsed JSON, a string, or {"hex": ...}. */
static json_t *bytes_json(const char *p, size_t n, int parse)
{
    if (!p)
        return json_null();
    if (parse) {
        json_t *doc = json_loadb(p, n, 0, NULL);
        if (doc)
            return doc;
    }
    json_t *s = json_stringn(p, n);
    if (s)
        return s;
    char *h = malloc(2 * n + 1);
    for (size_t i = 0; h && i < n; i++)
        sprintf(h + 2 * i, "%02x", (unsigned char)p[i]);
    s = json_pack("{s:s}", "hex", h ? h : "");
    free(h);
    return s;
}

/* bytes_json of a copy, masked when mask. */
static json_t *shown_json(const char *p, size_t n, int parse, int mask)
{
    if (!p)
        return json_null();
    if (!mask)
        return bytes_json(p, n, parse);
    char *c = masked_copy(p, n, 1);
    json_t *j = c ? bytes_json(c, n, parse) : json_null();
    free(c);
    return j;
}

static json_t *headers_json(rd_kafka_headers_t *h, int mask)
{
    json_t *arr = json_array();
    const char *name;
    const void *val;
    size_t sz;
    for (size_t i = 0; h && !rd_kafka_header_get_all(h, i, &name, &val, &sz); i++) {
        json_t *n = shown_json(name, strlen(name), 0, mask);
        json_array_append_new(arr,
                              json_pack("[o, o]", n, shown_json(val, sz, 0, mask)));
    }
    return arr;
}

/* A string member's value, masked when mask; NULL when s is. */
static json_t *text_json(const char *s, int mask)
{
    return s ? shown_json(s, strlen(s), 0, mask) : NULL;
}

static json_t *summary_json(const struct dlq_letter *l, int mask)
{
    char pos[48];
    snprintf(pos, sizeof(pos), "%d:%lld", (int)l->partition, (long long)l->offset);
    return json_pack(
        "{s:s, s:i, s:I, s:o?, s:o?, s:o?, s:o?, s:o?, s:{s:o?, s:o?, s:o?}}",
        "position", pos, "partition", (int)l->partition, "offset",
        (json_int_t)l->offset, "failed_at", text_json(l->failed_at, mask), "reason",
        text_json(l->reason, mask), "payment_attempt_id",
        text_json(l->attempt[0] ? l->attempt : NULL, mask), "order_id",
        text_json(l->order[0] ? l->order : NULL, mask), "error",
        text_json(l->error, mask), "original", "topic", text_json(l->orig_topic, mask),
        "partition", text_json(l->orig_partition, mask), "offset",
        text_json(l->orig_offset, mask));
}

/* Masked too: the summary is printed and shown (chargectl dlq list, the
 * console's list), and an error or header may quote a card number. */
json_t *dlq_letter_summary_json(const struct dlq_letter *l)
{
    return summary_json(l, 1);
}

json_t *dlq_letter_json(const dlq_reader_t *r, const struct dlq_letter *l,
                        int mask_card_digits)
{
    (void)r;
    json_t *j = summary_json(l, mask_card_digits);
    if (!j)
        return NULL;
    json_object_set_new(j, "timestamp_ms", json_integer(l->timestamp_ms));
    json_object_set_new(j, "headers",
                        headers_json(slot_of(l)->headers, mask_card_digits));
    json_object_set_new(j, "key", shown_json(l->key, l->key_len, 0, mask_card_digits));
    json_object_set_new(j, "value",
                        shown_json(l->value, l->value_len, 1, mask_card_digits));
    return j;
}

/* ---- replay ---- */

static int is_card_letter(const struct dlq_letter *l)
{
    return l->reason && !strcmp(l->reason, "card_data_refused");
}

/* The headers a replay of l carries: the original ones (without the dlq.*
 * ones the worker added) plus where it comes from and who sent it. NULL
 * when out of memory. */
static rd_kafka_headers_t *replay_headers(const dlq_reader_t *r,
                                          const struct dlq_letter *l, const char *actor)
{
    rd_kafka_headers_t *src = slot_of(l)->headers;
    rd_kafka_headers_t *h = rd_kafka_headers_new(8);
    const char *name;
    const void *val;
    size_t sz;
    char from[320];
    if (!h)
        return NULL;
    for (size_t k = 0; src && !rd_kafka_header_get_all(src, k, &name, &val, &sz); k++)
        if (strncmp(name, "dlq.", 4) != 0)
            rd_kafka_header_add(h, name, -1, val, val ? (ssize_t)sz : 0);
    snprintf(from, sizeof(from), "%s:%d:%lld", r->topic, (int)l->partition,
             (long long)l->offset);
    if (rd_kafka_header_add(h, "dlq.replayed_from", -1, from, -1) ||
        rd_kafka_header_add(h, "dlq.replayed_by", -1, actor ? actor : "", -1)) {
        rd_kafka_headers_destroy(h);
        return NULL;
    }
    return h;
}

json_t *dlq_replay_message_json(const dlq_reader_t *r, const struct dlq_letter *l,
                                const char *actor, int mask_card_digits)
{
    rd_kafka_headers_t *h = replay_headers(r, l, actor);
    json_t *j = NULL;
    if (!h)
        return NULL;
    j = json_pack("{s:o?, s:o, s:o, s:o}", "topic",
                  text_json(l->orig_topic, mask_card_digits), "key",
                  shown_json(l->key, l->key_len, 0, mask_card_digits), "value",
                  shown_json(l->value, l->value_len, 1, mask_card_digits), "headers",
                  headers_json(h, mask_card_digits));
    rd_kafka_headers_destroy(h);
    return j;
}

/* Refuses what cannot be replayed before anything is sent, and marks the
 * letters skipped (card digits masked): CHARGED_OK, or
 * CHARGED_BAD_ITEM (err). Only the command topic takes a replay: the
 * header is the letter's word, and anyone who can write a letter could
 * name the results topic. */
static enum charged_rc replay_check(const dlq_reader_t *r,
                                    const struct dlq_letter *const *letters, size_t n,
                                    struct dlq_replay_item *items,
                                    struct charged_error *err)
{
    const char *commands = config_str(r->cfg, CONFIG_CHARGE_COMMANDS_TOPIC);
    for (size_t i = 0; i < n; i++) {
        const struct dlq_letter *l = letters[i];
        if (!l->orig_topic) {
            charged_error_set(err, "%d:%lld has no dlq.original.topic",
                              (int)l->partition, (long long)l->offset);
            return CHARGED_BAD_ITEM;
        }
        if (!commands || strcmp(l->orig_topic, commands) != 0) {
            charged_error_set(err,
                              "%d:%lld names topic '%.*s', not the command topic '%s': "
                              "a replay only produces to the command topic",
                              (int)l->partition, (long long)l->offset, 120,
                              l->orig_topic, commands ? commands : "");
            return CHARGED_BAD_ITEM;
        }
        if (slot_of(l)->summary) {
            charged_error_set(err, "%d:%lld was read without its value",
                              (int)l->partition, (long long)l->offset);
            return CHARGED_BAD_ITEM;
        }
        if (is_card_letter(l)) {
            items[i].skipped = 1;
            snprintf(items[i].error, sizeof(items[i].error), "card digits masked");
        }
    }
    return CHARGED_OK;
}

/* Queues every letter not skipped; one Kafka refuses is reported done
 * with its error in sent[i]. */
static void replay_produce(const dlq_reader_t *r, rd_kafka_t *rk,
                           const struct dlq_letter *const *letters, size_t n,
                           const char *actor, const struct dlq_replay_item *items,
                           struct kafka_setup_delivery *sent)
{
    for (size_t i = 0; i < n; i++) {
        const struct dlq_letter *l = letters[i];
        if (items[i].skipped)
            continue;
        rd_kafka_headers_t *h = replay_headers(r, l, actor);
        rd_kafka_resp_err_t e =
            h ? rd_kafka_producev(rk, RD_KAFKA_V_TOPIC(l->orig_topic),
                                  RD_KAFKA_V_KEY(l->key, l->key_len),
                                  RD_KAFKA_V_VALUE((void *)l->value, l->value_len),
                                  RD_KAFKA_V_HEADERS(h),
                                  RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
                                  RD_KAFKA_V_OPAQUE(&sent[i]), RD_KAFKA_V_END)
              : RD_KAFKA_RESP_ERR__FAIL;
        if (e) {
            if (h)
                rd_kafka_headers_destroy(h);
            sent[i].done = 1;
            sent[i].err = e;
        }
    }
}

/* Waits for the acknowledgements, then closes the producer: CHARGED_OK,
 * or CHARGED_RETRY (err) when they did not all come in time. */
static enum charged_rc replay_flush(rd_kafka_t *rk, struct charged_error *err)
{
    enum charged_rc rc = CHARGED_OK;
    if (rd_kafka_flush(rk, REPLAY_TIMEOUT_MS) != RD_KAFKA_RESP_ERR_NO_ERROR) {
        charged_error_set(err, "kafka did not acknowledge within %d s",
                          REPLAY_TIMEOUT_MS / 1000);
        rc = CHARGED_RETRY;
        /* No report may arrive after `sent` is gone: what is left is
         * purged (its reports served now); it may still have landed. */
        rd_kafka_purge(rk, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
        rd_kafka_poll(rk, 0);
    }
    rd_kafka_destroy(rk);
    return rc;
}

/* Each item as its delivery report says: how many were not sent. */
static size_t replay_report(const struct kafka_setup_delivery *sent, size_t n,
                            struct dlq_replay_item *items)
{
    size_t failed = 0;
    for (size_t i = 0; i < n; i++) {
        struct dlq_replay_item *it = &items[i];
        if (it->skipped)
            continue;
        if (!sent[i].done || sent[i].err) {
            snprintf(it->error, sizeof(it->error), "%s",
                     sent[i].done && sent[i].err != RD_KAFKA_RESP_ERR__PURGE_QUEUE &&
                             sent[i].err != RD_KAFKA_RESP_ERR__PURGE_INFLIGHT
                         ? rd_kafka_err2str(sent[i].err)
                         : "not acknowledged");
            failed++;
        } else {
            it->sent = 1;
            it->to_partition = sent[i].partition;
            it->to_offset = sent[i].offset;
        }
    }
    return failed;
}

enum charged_rc dlq_reader_replay(dlq_reader_t *r,
                                  const struct dlq_letter *const *letters, size_t n,
                                  const char *actor, int dry_run,
                                  struct dlq_replay_item *items,
                                  struct charged_error *err)
{
    struct kafka_setup_delivery *sent = NULL;
    rd_kafka_t *rk = NULL;
    enum charged_rc rc;

    if (!actor || !*actor) {
        charged_error_set(err, "a replay needs an actor (dlq.replayed_by)");
        return CHARGED_BAD_ITEM;
    }
    for (size_t i = 0; i < n; i++) {
        memset(&items[i], 0, sizeof(items[i]));
        items[i].letter = letters[i];
    }
    if ((rc = replay_check(r, letters, n, items, err)) != CHARGED_OK || dry_run)
        return rc;
    if (!(sent = calloc(n + 1, sizeof(*sent)))) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    if (!(rk = kafka_setup_tool_producer(r->cfg, CLIENT_ID, err))) {
        free(sent);
        return CHARGED_RETRY;
    }
    replay_produce(r, rk, letters, n, actor, items, sent);
    rc = replay_flush(rk, err);
    size_t failed = replay_report(sent, n, items);
    if (failed && rc == CHARGED_OK) {
        charged_error_set(err, "%zu of %zu letters not sent", failed, n);
        rc = CHARGED_RETRY;
    }
    free(sent);
    return rc;
}
