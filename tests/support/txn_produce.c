/* txn_produce BOOTSTRAP TOPIC PARTITION VALUE [abort]: one message written
 * in a Kafka transaction, committed (or aborted), as an exactly-once
 * producer writes: the partition's last offset is then the transaction's
 * control record, which no consumer ever receives. For the console's
 * adversary test (tests/e2e/test_console_adversary.py). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <librdkafka/rdkafka.h>

static int fail(const char *what, rd_kafka_error_t *e)
{
    fprintf(stderr, "txn_produce: %s: %s\n", what, e ? rd_kafka_error_string(e) : "");
    return 1;
}

int main(int argc, char **argv)
{
    char err[512];
    if (argc < 5)
        return fprintf(stderr,
                       "usage: txn_produce BOOTSTRAP TOPIC PARTITION VALUE [abort]\n"),
               2;
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    if (rd_kafka_conf_set(conf, "bootstrap.servers", argv[1], err, sizeof(err)) ||
        rd_kafka_conf_set(conf, "transactional.id", "txn-produce-adversary", err,
                          sizeof(err)))
        return fprintf(stderr, "txn_produce: %s\n", err), 1;
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    if (!rk)
        return fprintf(stderr, "txn_produce: %s\n", err), 1;
    rd_kafka_error_t *e;
    if ((e = rd_kafka_init_transactions(rk, 30000)))
        return fail("init", e);
    if ((e = rd_kafka_begin_transaction(rk)))
        return fail("begin", e);
    rd_kafka_resp_err_t pe = rd_kafka_producev(
        rk, RD_KAFKA_V_TOPIC(argv[2]), RD_KAFKA_V_PARTITION(atoi(argv[3])),
        RD_KAFKA_V_VALUE(argv[4], strlen(argv[4])),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY),
        RD_KAFKA_V_HEADER("dlq.reason", "schema_violation", -1), RD_KAFKA_V_END);
    if (pe)
        return fprintf(stderr, "txn_produce: produce: %s\n", rd_kafka_err2str(pe)), 1;
    if (argc > 5 && !strcmp(argv[5], "abort"))
        e = rd_kafka_abort_transaction(rk, 30000);
    else
        e = rd_kafka_commit_transaction(rk, 30000);
    if (e)
        return fail("end", e);
    rd_kafka_destroy(rk);
    return 0;
}
