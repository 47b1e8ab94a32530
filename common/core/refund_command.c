#include "refund_command.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "charge_command.h"
#include "charged_assert.h"
#include "command_fields.h"

static const char *const reasons[] = {"requested_by_customer", "duplicate",
                                      "fraudulent"};

static int reason_ok(const char *s)
{
    CHARGED_ASSERT(s);
    for (size_t i = 0; i < sizeof(reasons) / sizeof(reasons[0]); i++)
        if (!strcmp(s, reasons[i]))
            return 1;
    return 0;
}

/* Everything that decides what is refunded: the same refund id or key
 * with any of these changed is another refund, a conflict. */
static int fingerprint(struct refund_command *c)
{
    char amount[32];
    const char *fields[] = {"refund", c->refund_id, c->payment_attempt_id, amount,
                            c->reason};
    CHARGED_ASSERT(c->amount >= 1); /* only a valid refund is fingerprinted */
    snprintf(amount, sizeof(amount), "%lld", c->amount);
    return command_fields_fingerprint(fields, sizeof(fields) / sizeof(fields[0]),
                                      c->fingerprint);
}

/* The contract's members, in the order their faults are said. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
static enum charged_rc fields_read(json_t *doc, struct refund_command *out,
                                   struct charged_error *err)
{
    if (command_fields_header(doc, REFUND_COMMAND_TYPE, err) ||
        command_fields_uuids(doc, "refund_id", out->refund_id, "payment_attempt_id",
                             out->payment_attempt_id, err) ||
        command_fields_idempotency_key(doc, out->idempotency_key, err) ||
        command_fields_amount(doc, &out->amount, err))
        return CHARGED_BAD_ITEM;
    if (command_fields_string(doc, "reason", 1, 1, 23, out->reason, sizeof(out->reason),
                              err) ||
        !reason_ok(out->reason)) {
        charged_error_set(
            err, "'reason' must be requested_by_customer, duplicate or fraudulent");
        return CHARGED_BAD_ITEM;
    }
    return command_fields_metadata(json_object_get(doc, "metadata"), err);
}

enum dead_letter_reason refund_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             size_t max_bytes,
                                             struct refund_command *out,
                                             struct charged_error *err)
{
    enum dead_letter_reason r;
    json_t *doc = NULL;

    CHARGED_ASSERT(out && err);
    memset(out, 0, sizeof(*out));
    if ((r = command_fields_open(key, key_len, value, value_len, max_bytes, &doc,
                                 err)) != DEAD_LETTER_NONE)
        return r;
    r = DEAD_LETTER_SCHEMA_VIOLATION;
    if (fields_read(doc, out, err))
        goto out;
    if ((r = command_fields_key_is(key, key_len, out->payment_attempt_id, err)) !=
        DEAD_LETTER_NONE)
        goto out;
    command_fields_lower(out->refund_id);
    command_fields_lower(out->payment_attempt_id);
    out->metadata_json = command_fields_metadata_json(json_object_get(doc, "metadata"));
    if (!out->metadata_json || fingerprint(out)) {
        r = DEAD_LETTER_SCHEMA_VIOLATION;
        charged_error_set(err, "out of memory");
        refund_command_release(out);
        goto out;
    }
    /* A valid refund is of a positive amount: the charge's money is never
     * added to by one. */
    CHARGED_ASSERT(out->amount >= 1);
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
