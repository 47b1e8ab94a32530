/* test_kafka: the Kafka clients and topics of the integration tests, on the
 * stack's Kafka (test_env_kafka()). Every failure fails the test at once. */
#ifndef CHARGED_TEST_KAFKA_H
#define CHARGED_TEST_KAFKA_H

#include <librdkafka/rdkafka.h>

/* A producer (acks all, no linger) or, with group, a consumer of that group
 * that commits only when told. */
rd_kafka_t *test_kafka_client(rd_kafka_type_t type, const char *group);

/* Creates a topic of the test's own (kafka_test_tool create-topic). */
void test_kafka_create_topic(const char *name, int partitions);

#endif
