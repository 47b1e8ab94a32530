#include "test_kafka.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

#include "test_env.h"

rd_kafka_t *test_kafka_client(rd_kafka_type_t type, const char *group)
{
    char errstr[512];
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    const int consumer = type == RD_KAFKA_CONSUMER;
    const char *set[][2] = {
        {"bootstrap.servers", test_env_kafka()},
        {consumer ? "group.id" : "acks", consumer ? group : "all"},
        {consumer ? "enable.auto.commit" : "linger.ms", consumer ? "false" : "0"},
    };
    for (size_t i = 0; i < sizeof(set) / sizeof(set[0]); i++)
        ck_assert_msg(rd_kafka_conf_set(conf, set[i][0], set[i][1], errstr,
                                        sizeof(errstr)) == RD_KAFKA_CONF_OK,
                      "%s: %s", set[i][0], errstr);
    rd_kafka_t *rk = rd_kafka_new(type, conf, errstr, sizeof(errstr));
    ck_assert_msg(rk != NULL, "%s", errstr);
    return rk;
}

void test_kafka_create_topic(const char *name, int partitions)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "KAFKA_BOOTSTRAP_SERVERS='%s' '%s' create-topic '%s' %d",
             test_env_kafka(), KAFKA_TEST_TOOL, name, partitions);
    ck_assert_msg(system(cmd) == 0, "cannot create topic %s", name);
}
