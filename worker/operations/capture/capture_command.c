#include "capture_command.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "charged_assert.h"
#include "command_fields.h"

/* Everything that decides what is captured: the same capture id or key
 * with any of these changed is another capture, a conflict. "all" is not
 * a number, so a capture of everything never shares a fingerprint with
 * one of an amount. */
static int fingerprint(struct capture_command *c)
{
    char amount[32];
    const char *fields[] = {"capture", c->capture_id, c->payment_attempt_id, amount};
    CHARGED_ASSERT(c->amount >= 0);
    if (c->amount > 0)
        snprintf(amount, sizeof(amount), "%lld", c->amount);
    else
        snprintf(amount, sizeof(amount), "all");
    return command_fields_fingerprint(fields, sizeof(fields) / sizeof(fields[0]),
                                      c->fingerprint);
}

/* The contract's members, in the order their faults are said. CHARGED_OK,
 * or CHARGED_BAD_ITEM. An absent amount is all that is held (0); a present
 * one is a charge's amount (1..100000000000). */
static enum charged_rc fields_read(json_t *doc, struct capture_command *out,
                                   struct charged_error *err)
{
    if (command_fields_header(doc, CAPTURE_COMMAND_TYPE, err) ||
        command_fields_uuids(doc, "capture_id", out->capture_id, "payment_attempt_id",
                             out->payment_attempt_id, err) ||
        command_fields_idempotency_key(doc, out->idempotency_key, err))
        return CHARGED_BAD_ITEM;
    out->amount = 0;
    if (json_object_get(doc, "amount") && command_fields_amount(doc, &out->amount, err))
        return CHARGED_BAD_ITEM;
    return command_fields_metadata(json_object_get(doc, "metadata"), err);
}

enum dead_letter_reason capture_command_parse(const void *key, size_t key_len,
                                              const void *value, size_t value_len,
                                              size_t max_bytes,
                                              struct capture_command *out,
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
    command_fields_lower(out->capture_id);
    command_fields_lower(out->payment_attempt_id);
    out->metadata_json = command_fields_metadata_json(json_object_get(doc, "metadata"));
    if (!out->metadata_json || fingerprint(out)) {
        r = DEAD_LETTER_SCHEMA_VIOLATION;
        charged_error_set(err, "out of memory");
        capture_command_release(out);
        goto out;
    }
    /* All (0) or a positive amount within a message's bound. */
    CHARGED_ASSERT(out->amount >= 0 && out->amount <= 100000000000LL);
    r = DEAD_LETTER_NONE;
out:
    json_decref(doc);
    return r;
}

void capture_command_release(struct capture_command *cmd)
{
    CHARGED_ASSERT(cmd);
    free(cmd->metadata_json);
    cmd->metadata_json = NULL;
}
