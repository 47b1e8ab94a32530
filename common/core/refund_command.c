#include "refund_command.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "charge_command.h"
#include "command_fields.h"

static const char *const reasons[] = {"requested_by_customer", "duplicate",
                                      "fraudulent"};

static int reason_ok(const char *s)
{
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(s, reasons[i]))
            return 1;
    return 0;
}

static void lower(char *s)
{
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

/* Everything that decides what is refunded: the same refund id or key
 * with any of these changed is another refund, a conflict. */
static int fingerprint(struct refund_command *c)
{
    char amount[32];
    const char *fields[] = {"refund", c->refund_id, c->payment_attempt_id, amount,
                            c->reason};
    snprintf(amount, sizeof(amount), "%lld", c->amount);
    return command_fields_fingerprint(fields, sizeof(fields) / sizeof(fields[0]),
                                      c->fingerprint);
}

enum dead_letter_reason refund_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             size_t max_bytes,
                                             struct refund_command *out, char *errbuf,
                                             size_t errbuf_size)
{
    enum dead_letter_reason r;
    json_t *doc = NULL, *v, *md;

    memset(out, 0, sizeof(*out));
    if ((r = command_fields_open(key, key_len, value, value_len, max_bytes, &doc,
                                 errbuf, errbuf_size)) != DEAD_LETTER_NONE)
        return r;
    r = DEAD_LETTER_SCHEMA_VIOLATION;
    v = json_object_get(doc, "type");
    if (!json_is_string(v) || strcmp(json_string_value(v), REFUND_COMMAND_TYPE) != 0) {
        snprintf(errbuf, errbuf_size, "'type' must be \"" REFUND_COMMAND_TYPE "\"");
        goto out;
    }
    v = json_object_get(doc, "version");
    if (!json_is_integer(v) || json_integer_value(v) != 1) {
        snprintf(errbuf, errbuf_size, "'version' must be the integer 1");
        goto out;
    }
    if (command_fields_string(doc, "refund_id", 1, 36, 36, out->refund_id,
                              sizeof(out->refund_id), errbuf, errbuf_size) ||
        command_fields_string(doc, "payment_attempt_id", 1, 36, 36,
                              out->payment_attempt_id, sizeof(out->payment_attempt_id),
                              errbuf, errbuf_size))
        goto out;
    if (!charge_command_is_uuid(out->refund_id)) {
        snprintf(errbuf, errbuf_size, "'refund_id' must be a UUID");
        goto out;
    }
    if (!charge_command_is_uuid(out->payment_attempt_id)) {
        snprintf(errbuf, errbuf_size, "'payment_attempt_id' must be a UUID");
        goto out;
    }
    if (command_fields_string(doc, "idempotency_key", 1, 1, 128, out->idempotency_key,
                              sizeof(out->idempotency_key), errbuf, errbuf_size))
        goto out;
    if (!command_fields_key_ok(out->idempotency_key)) {
        snprintf(errbuf, errbuf_size,
                 "'idempotency_key' must be 1..128 characters of [A-Za-z0-9._:-]");
        goto out;
    }
    v = json_object_get(doc, "amount");
    if (!json_is_integer(v)) {
        snprintf(errbuf, errbuf_size, "'amount' must be an integer (minor units)");
        goto out;
    }
    out->amount = json_integer_value(v);
    if (out->amount < 1 || out->amount > 100000000000LL) {
        snprintf(errbuf, errbuf_size, "'amount' %lld is outside 1..100000000000",
                 out->amount);
        goto out;
    }
    if (command_fields_string(doc, "reason", 1, 1, 23, out->reason, sizeof(out->reason),
                              errbuf, errbuf_size) ||
        !reason_ok(out->reason)) {
        snprintf(errbuf, errbuf_size,
                 "'reason' must be requested_by_customer, duplicate or fraudulent");
        goto out;
    }
    md = json_object_get(doc, "metadata");
    if (command_fields_metadata(md, errbuf, errbuf_size))
        goto out;
    if (!key) {
        r = DEAD_LETTER_KEY_MISMATCH;
        snprintf(errbuf, errbuf_size,
                 "the message has no key; it must be the payment_attempt_id");
        goto out;
    }
    if (key_len != 36 || memcmp(key, out->payment_attempt_id, 36) != 0) {
        r = DEAD_LETTER_KEY_MISMATCH;
        snprintf(errbuf, errbuf_size, "the message key is not the payment_attempt_id");
        goto out;
    }
    lower(out->refund_id);
    lower(out->payment_attempt_id);
    out->metadata_json = json_is_object(md)
                             ? json_dumps(md, JSON_COMPACT | JSON_SORT_KEYS)
                             : strdup("{}");
    if (!out->metadata_json || fingerprint(out)) {
        snprintf(errbuf, errbuf_size, "out of memory");
        refund_command_release(out);
        goto out;
    }
    r = DEAD_LETTER_NONE;
out:
    json_decref(doc);
    return r;
}

void refund_command_release(struct refund_command *cmd)
{
    free(cmd->metadata_json);
    cmd->metadata_json = NULL;
}
