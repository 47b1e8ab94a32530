#include "dead_letter_reason.h"

#include <string.h>

#include "charged_assert.h"

static const char *reason_names[DEAD_LETTER__COUNT] = {
    NULL,
    "empty_value",
    "oversized",
    "card_data_refused",
    "invalid_utf8",
    "malformed_json",
    "schema_violation",
    "key_mismatch",
    "amount_over_limit",
    "currency_not_allowed",
    "idempotency_key_conflict",
    "database_refused",
};

const char *dead_letter_reason_name(enum dead_letter_reason r)
{
    if (r <= DEAD_LETTER_NONE || r >= DEAD_LETTER__COUNT)
        return NULL;
    CHARGED_ASSERT(reason_names[r] != NULL); /* every reason has its name */
    return reason_names[r];
}

int dead_letter_reason_parse(const char *s)
{
    for (int i = 1; i < DEAD_LETTER__COUNT; i++)
        if (s && !strcmp(s, reason_names[i]))
            return i;
    return -1;
}
