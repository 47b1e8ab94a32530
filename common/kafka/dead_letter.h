/* dead_letter: the dead letter that carries a refused command to the DLQ
 * topic (the reasons it is refused: dead_letter_reason.h). */
#ifndef CHARGED_DEAD_LETTER_H
#define CHARGED_DEAD_LETTER_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "dead_letter_reason.h"

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
 * plus the dlq.* headers of the contract, and dlq.id
 * ("<topic>:<partition>:<offset>" of the original), the same whoever
 * produces it, so that consumers can deduplicate letters sent twice. */
struct dead_letter {
    char *key; /* NULL when the original had none */
    size_t key_len;
    char *value; /* NULL when the original had none */
    size_t value_len;
    rd_kafka_headers_t *headers; /* owned until produced */
};

/* Limits of a cut dead letter, for one the DLQ refused as too large. */
#define DEAD_LETTER_CUT_VALUE   (64 * 1024)
#define DEAD_LETTER_CUT_KEY     1024
#define DEAD_LETTER_CUT_HEADERS (64 * 1024)

/* Builds the dead letter of msg. `error` is one human line (it must hold no
 * card digits; it is masked again anyway).
 *
 * cut != 0 builds the letter for a DLQ that refused the whole one: value and
 * key are cut to the prefixes above and the original headers are left out
 * when together larger than DEAD_LETTER_CUT_HEADERS. Headers then say what
 * was cut: dlq.value.truncated "true", dlq.value.original_size (bytes) and
 * dlq.value.sha256 (hex, of the whole masked value: the original's unless it
 * held card digits); dlq.key.truncated, dlq.headers.dropped (how many). The
 * original stays readable at its offset. 0 / -1 on out of memory. */
int dead_letter_build(const rd_kafka_message_t *msg, enum dead_letter_reason reason,
                      const char *error, const struct dead_letter_origin *origin,
                      int cut, struct dead_letter *out);

/* Frees what dead_letter_build allocated (headers only if not produced:
 * rd_kafka_producev takes them on success, so set them NULL then). */
void dead_letter_release(struct dead_letter *dl);

#endif
