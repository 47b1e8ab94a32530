/* test_message: Kafka messages as a consumer hands them over, with key,
 * value and headers, made without a broker.
 *
 * They are produced to a producer that has no brokers and purged at once:
 * librdkafka reports each one back, whole, in a delivery event. */
#ifndef CHARGED_TEST_MESSAGE_H
#define CHARGED_TEST_MESSAGE_H

#include <stddef.h>

#include <librdkafka/rdkafka.h>

struct test_message_header {
    const char *name;
    const void *value; /* NULL: a header without a value */
    size_t size;
};

struct test_message_spec {
    const void *key; /* NULL: no key */
    size_t key_len;
    const void *value; /* NULL: no value */
    size_t value_len;
    const struct test_message_header *headers;
    size_t header_count;
};

typedef struct test_message test_message_t;

/* The message of spec, or fails the test. */
test_message_t *test_message_new(const struct test_message_spec *spec);
const rd_kafka_message_t *test_message_get(const test_message_t *m);
void test_message_free(test_message_t *m);

#endif
