/* dead_letter: the reasons a command is refused, and the dead letter that
 * carries it to the DLQ topic.
 *
 * The reason codes are part of the contract with operators (docs/dead-letters.md
 * lists them); add codes, never rename them. */
#ifndef CHARGED_DEAD_LETTER_H
#define CHARGED_DEAD_LETTER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

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
    DEAD_LETTER__COUNT
};

/* "malformed_json", ...; NULL for DEAD_LETTER_NONE. */
const char *dead_letter_reason_name(enum dead_letter_reason r);
/* The reason named s, or -1. */
int dead_letter_reason_parse(const char *s);

/* Where a dead letter comes from and who refused it. */
struct dead_letter_origin {
    const char *topic;
    int32_t partition;
    int64_t offset;
    int64_t timestamp_ms; /* -1 when the message has none */
    const char *consumer_group;
    const char *worker;
};

/* A dead letter: the original key, value and headers (card digits masked)
 * plus the dlq.* headers of the contract. */
struct dead_letter {
    char *key; /* NULL when the original had none */
    size_t key_len;
    char *value; /* NULL when the original had none */
    size_t value_len;
    rd_kafka_headers_t *headers; /* owned until produced */
};

/* Builds the dead letter of msg. `error` is one human line (it must hold no
 * card digits; it is masked again anyway). 0 / -1 on out of memory. */
int dead_letter_build(const rd_kafka_message_t *msg, enum dead_letter_reason reason,
                      const char *error, const struct dead_letter_origin *origin,
                      struct dead_letter *out);

/* Frees what dead_letter_build allocated (headers only if not produced:
 * rd_kafka_producev takes them on success, so set them NULL then). */
void dead_letter_release(struct dead_letter *dl);

#endif
