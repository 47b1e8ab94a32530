/* dead_letter_reason: the reasons a command is refused.
 *
 * The reason codes are part of the contract with operators (docs/dead-letters.md
 * lists them); add codes, never rename them.
 *
 * A verdict, not an error code: what a parse says of a message, which the
 * letter carries (dlq.reason). Every reason but DEAD_LETTER_NONE means the
 * same thing to the caller, CHARGED_BAD_ITEM of charged_error.h (the item
 * is dead-lettered), so it stays an enum of its own beside the contract. */
#ifndef CHARGED_DEAD_LETTER_REASON_H
#define CHARGED_DEAD_LETTER_REASON_H

enum dead_letter_reason {
    DEAD_LETTER_NONE = 0,
    DEAD_LETTER_EMPTY_VALUE,
    DEAD_LETTER_OVERSIZED,
    DEAD_LETTER_CARD_DATA,
    DEAD_LETTER_INVALID_UTF8,
    DEAD_LETTER_MALFORMED_JSON,
    DEAD_LETTER_SCHEMA_VIOLATION,
    DEAD_LETTER_KEY_MISMATCH,
    DEAD_LETTER_AMOUNT_OVER_LIMIT,
    DEAD_LETTER_CURRENCY_NOT_ALLOWED,
    DEAD_LETTER_IDEMPOTENCY_KEY_CONFLICT,
    DEAD_LETTER_DATABASE_REFUSED, /* valid, but the database refused a value */
    DEAD_LETTER__COUNT
};

/* "malformed_json", ...; NULL for DEAD_LETTER_NONE. */
const char *dead_letter_reason_name(enum dead_letter_reason r);
/* The reason named s, or -1. */
int dead_letter_reason_parse(const char *s);

#endif
