/* dlq_reader_int: what the reader (dlq_reader.c) and the letters' JSON and
 * replay (dlq_letter.c) share of a reader and its letters. Private to the
 * kafka library. */
#ifndef CHARGED_DLQ_READER_INT_H
#define CHARGED_DLQ_READER_INT_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "config.h"
#include "dlq_reader.h"

/* The client chargectl always was: the console's reads and replays look
 * the same to the brokers. */
#define CLIENT_ID "chargectl"

/* A letter and what it points into; each one allocated on its own, so
 * that a letter's address outlives later reads. */
struct slot {
    struct dlq_letter l; /* first: a letter's address is its slot's */
    rd_kafka_headers_t *headers;
    int summary; /* read by dlq_reader_read_newest: the value is not kept */
};

struct dlq_reader {
    const config_t *cfg;
    const char *topic;
    rd_kafka_t *consumer;
    struct slot **slots;
    size_t n, cap;
    int64_t total; /* offsets in the partitions at the last whole/newest read */
};

/* The slot a letter is (a letter's address is its slot's). */
static inline const struct slot *slot_of(const struct dlq_letter *l)
{
    return (const struct slot *)l;
}

/* A copy of n bytes at p, NUL-terminated; NULL when out of memory. */
char *dlq_copy_bytes(const void *p, size_t n);

#endif
