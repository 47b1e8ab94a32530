#include "dead_letter.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/evp.h>

#include "card_data.h"
#include "clock.h"

static char *masked_copy(const void *p, size_t n)
{
    char *c = malloc(n ? n : 1);
    if (!c)
        return NULL;
    if (n)
        memcpy(c, p, n);
    card_data_mask(c, n);
    return c;
}

void dead_letter_release(struct dead_letter *dl)
{
    free(dl->key);
    free(dl->value);
    if (dl->headers)
        rd_kafka_headers_destroy(dl->headers);
    memset(dl, 0, sizeof(*dl));
}

static int add(rd_kafka_headers_t *h, const char *name, const char *value)
{
    return rd_kafka_header_add(h, name, -1, value, -1) == RD_KAFKA_RESP_ERR_NO_ERROR
               ? 0
               : -1;
}

static size_t headers_size(const rd_kafka_headers_t *h, size_t *count)
{
    const char *name;
    const void *val;
    size_t sz, total = 0, i;
    for (i = 0; h && !rd_kafka_header_get_all(h, i, &name, &val, &sz); i++)
        total += strlen(name) + sz;
    *count = i;
    return total;
}

/* Headers that say what a cut letter left out. */
static int add_cut_headers(struct dead_letter *out, size_t full_value_len,
                           size_t full_key_len, size_t dropped_headers)
{
    char num[32], hex[2 * EVP_MAX_MD_SIZE + 1];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;

    if (full_value_len > out->value_len) {
        if (!EVP_Digest(out->value, full_value_len, md, &mdlen, EVP_sha256(), NULL))
            return -1;
        for (unsigned i = 0; i < mdlen; i++)
            snprintf(hex + 2 * i, 3, "%02x", md[i]);
        snprintf(num, sizeof(num), "%zu", full_value_len);
        if (add(out->headers, "dlq.value.truncated", "true") ||
            add(out->headers, "dlq.value.original_size", num) ||
            add(out->headers, "dlq.value.sha256", hex))
            return -1;
    }
    if (full_key_len > out->key_len) {
        snprintf(num, sizeof(num), "%zu", full_key_len);
        if (add(out->headers, "dlq.key.truncated", "true") ||
            add(out->headers, "dlq.key.original_size", num))
            return -1;
    }
    if (dropped_headers) {
        snprintf(num, sizeof(num), "%zu", dropped_headers);
        if (add(out->headers, "dlq.headers.dropped", num))
            return -1;
    }
    return 0;
}

int dead_letter_build(const rd_kafka_message_t *msg, enum dead_letter_reason reason,
                      const char *error, const struct dead_letter_origin *origin,
                      int cut, struct dead_letter *out)
{
    rd_kafka_headers_t *orig = NULL;
    char num[32], failed_at[CLOCK_RFC3339_SIZE], line[512], *id = NULL;
    size_t full_value = 0, full_key = 0, nheaders = 0, dropped = 0;

    memset(out, 0, sizeof(*out));
    if (msg->key) {
        out->key = masked_copy(msg->key, msg->key_len);
        out->key_len = full_key = msg->key_len;
        if (!out->key)
            goto fail;
    }
    if (msg->payload) {
        out->value = masked_copy(msg->payload, msg->len);
        out->value_len = full_value = msg->len;
        if (!out->value)
            goto fail;
    }
    if (rd_kafka_message_headers(msg, &orig) != RD_KAFKA_RESP_ERR_NO_ERROR)
        orig = NULL;
    if (cut) {
        if (out->value_len > DEAD_LETTER_CUT_VALUE)
            out->value_len = DEAD_LETTER_CUT_VALUE;
        if (out->key_len > DEAD_LETTER_CUT_KEY)
            out->key_len = DEAD_LETTER_CUT_KEY;
        if (headers_size(orig, &nheaders) > DEAD_LETTER_CUT_HEADERS) {
            dropped = nheaders;
            orig = NULL;
        }
    }
    /* The original headers, in order, card digits masked in names and
     * values alike. */
    out->headers = rd_kafka_headers_new(16);
    if (!out->headers)
        goto fail;
    if (orig) {
        const char *name;
        const void *val;
        size_t sz;
        for (size_t i = 0; !rd_kafka_header_get_all(orig, i, &name, &val, &sz); i++) {
            size_t name_len = strlen(name);
            char *n = masked_copy(name, name_len);
            char *v = val ? masked_copy(val, sz) : NULL;
            if (!n || (val && !v)) {
                free(n);
                free(v);
                goto fail;
            }
            rd_kafka_header_add(out->headers, n, (ssize_t)name_len, v,
                                val ? (ssize_t)sz : 0);
            free(n);
            free(v);
        }
    }
    snprintf(line, sizeof(line), "%s", error ? error : "");
    card_data_mask(line, strlen(line));
    clock_rfc3339(clock_wall_ms(), failed_at, sizeof(failed_at));

    if (add(out->headers, "dlq.reason", dead_letter_reason_name(reason)) ||
        add(out->headers, "dlq.error", line) ||
        add(out->headers, "dlq.original.topic", origin->topic))
        goto fail;
    snprintf(num, sizeof(num), "%d", (int)origin->partition);
    if (add(out->headers, "dlq.original.partition", num))
        goto fail;
    snprintf(num, sizeof(num), "%lld", (long long)origin->offset);
    if (add(out->headers, "dlq.original.offset", num))
        goto fail;
    snprintf(num, sizeof(num), "%lld", (long long)origin->timestamp_ms);
    if (add(out->headers, "dlq.original.timestamp", num) ||
        add(out->headers, "dlq.consumer.group", origin->consumer_group) ||
        add(out->headers, "dlq.worker", origin->worker) ||
        add(out->headers, "dlq.failed_at", failed_at))
        goto fail;
    size_t idlen = strlen(origin->topic) + 48;
    if (!(id = malloc(idlen)))
        goto fail;
    snprintf(id, idlen, "%s:%d:%lld", origin->topic, (int)origin->partition,
             (long long)origin->offset);
    if (add(out->headers, "dlq.id", id))
        goto fail;
    free(id);
    id = NULL;
    if (cut && add_cut_headers(out, full_value, full_key, dropped))
        goto fail;
    return 0;
fail:
    free(id);
    dead_letter_release(out);
    return -1;
}
