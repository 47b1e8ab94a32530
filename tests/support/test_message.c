#include "test_message.h"

#include <stdlib.h>

#include <check.h>

#include "test_env.h"

struct test_message {
    rd_kafka_t *rk;
    rd_kafka_queue_t *q;
    rd_kafka_event_t *ev;
    const rd_kafka_message_t *msg;
};

test_message_t *test_message_new(const struct test_message_spec *spec)
{
    char err[256];
    test_message_t *m = calloc(1, sizeof(*m));
    rd_kafka_conf_t *conf = rd_kafka_conf_new();
    rd_kafka_headers_t *hdrs = rd_kafka_headers_new(spec->header_count + 1);

    ck_assert_ptr_nonnull(m);
    rd_kafka_conf_set_events(conf, RD_KAFKA_EVENT_DR);
    ck_assert_int_eq(rd_kafka_conf_set(conf, "log_level", "0", err, sizeof(err)),
                     RD_KAFKA_CONF_OK);
    m->rk = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof(err));
    ck_assert_msg(m->rk != NULL, "%s", err);
    m->q = rd_kafka_queue_get_main(m->rk);
    for (size_t i = 0; i < spec->header_count; i++)
        rd_kafka_header_add(hdrs, spec->headers[i].name, -1, spec->headers[i].value,
                            spec->headers[i].value ? (ssize_t)spec->headers[i].size
                                                   : 0);
    rd_kafka_resp_err_t e = rd_kafka_producev(
        m->rk, RD_KAFKA_V_TOPIC("payments.charge.commands"), RD_KAFKA_V_PARTITION(0),
        RD_KAFKA_V_KEY(spec->key, spec->key ? spec->key_len : 0),
        RD_KAFKA_V_VALUE((void *)spec->value, spec->value ? spec->value_len : 0),
        RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(hdrs),
        RD_KAFKA_V_END);
    ck_assert_msg(e == RD_KAFKA_RESP_ERR_NO_ERROR, "%s", rd_kafka_err2str(e));
    ck_assert_int_eq(rd_kafka_purge(m->rk, RD_KAFKA_PURGE_F_QUEUE), 0);
    long long deadline = test_env_now_ms() + 10000;
    while (!m->msg && test_env_now_ms() < deadline) {
        rd_kafka_event_t *ev = rd_kafka_queue_poll(m->q, 100);
        if (ev && rd_kafka_event_type(ev) == RD_KAFKA_EVENT_DR) {
            m->ev = ev;
            m->msg = rd_kafka_event_message_next(ev);
        } else if (ev) {
            rd_kafka_event_destroy(ev);
        }
    }
    ck_assert_msg(m->msg != NULL, "no delivery report within 10 s");
    return m;
}

const rd_kafka_message_t *test_message_get(const test_message_t *m)
{
    return m->msg;
}

void test_message_free(test_message_t *m)
{
    if (!m)
        return;
    if (m->ev)
        rd_kafka_event_destroy(m->ev);
    rd_kafka_queue_destroy(m->q);
    rd_kafka_destroy(m->rk);
    free(m);
}
