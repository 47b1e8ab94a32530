/* Integration tests of fleet_status: the lag of a consumer group on a topic
 * of the test's own, against the stack's Kafka (offsets committed at known
 * positions, a partition's start moved by deleting records), and the
 * breakers of "workers" that are a small HTTP server inside the test, a
 * closed port and a port that never answers. */
#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include <librdkafka/rdkafka.h>
#include <microhttpd.h>

#include "config.h"
#include "fleet_status.h"
#include "test_env.h"
#include "test_kafka.h"

#define PARTITIONS 3

static char topic[96], group[112];

/* n messages to each partition p, n[p] of them. */
static void produce(const int n[PARTITIONS])
{
    rd_kafka_t *p = test_kafka_client(RD_KAFKA_PRODUCER, NULL);
    for (int part = 0; part < PARTITIONS; part++)
        for (int i = 0; i < n[part]; i++) {
            char v[32];
            snprintf(v, sizeof(v), "m-%d-%d", part, i);
            ck_assert(!rd_kafka_producev(
                p, RD_KAFKA_V_TOPIC(topic), RD_KAFKA_V_PARTITION(part),
                RD_KAFKA_V_VALUE(v, strlen(v)),
                RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END));
        }
    ck_assert_int_eq(rd_kafka_flush(p, 30000), RD_KAFKA_RESP_ERR_NO_ERROR);
    rd_kafka_destroy(p);
}

/* The group's offsets: offsets[p] >= 0 committed, < 0 left uncommitted. */
static void commit(const int64_t offsets[PARTITIONS])
{
    rd_kafka_t *c = test_kafka_client(RD_KAFKA_CONSUMER, group);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int p = 0; p < PARTITIONS; p++)
        if (offsets[p] >= 0)
            rd_kafka_topic_partition_list_add(l, topic, p)->offset = offsets[p];
    ck_assert(!rd_kafka_assign(c, l));
    rd_kafka_resp_err_t e = rd_kafka_commit(c, l, 0);
    ck_assert_msg(!e, "commit: %s", rd_kafka_err2str(e));
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_consumer_close(c);
    rd_kafka_destroy(c);
}

/* Deletes the records of partition p before `before`: its start moves. */
static void delete_before(int32_t p, int64_t before)
{
    char err[512];
    rd_kafka_t *rk = test_kafka_client(RD_KAFKA_PRODUCER, NULL);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, topic, p)->offset = before;
    rd_kafka_DeleteRecords_t *d = rd_kafka_DeleteRecords_new(l);
    rd_kafka_queue_t *q = rd_kafka_queue_new(rk);
    rd_kafka_AdminOptions_t *o = rd_kafka_AdminOptions_new(rk, RD_KAFKA_ADMIN_OP_ANY);
    ck_assert(!rd_kafka_AdminOptions_set_request_timeout(o, 30000, err, sizeof(err)));
    rd_kafka_DeleteRecords(rk, &d, 1, o, q);
    rd_kafka_event_t *ev = rd_kafka_queue_poll(q, 30000);
    ck_assert_ptr_nonnull(ev);
    ck_assert_msg(!rd_kafka_event_error(ev), "delete records: %s",
                  rd_kafka_event_error_string(ev));
    const rd_kafka_topic_partition_list_t *r =
        rd_kafka_DeleteRecords_result_offsets(rd_kafka_event_DeleteRecords_result(ev));
    ck_assert_int_eq(r->cnt, 1);
    ck_assert_msg(!r->elems[0].err, "delete records: %s",
                  rd_kafka_err2str(r->elems[0].err));
    rd_kafka_event_destroy(ev);
    rd_kafka_AdminOptions_destroy(o);
    rd_kafka_DeleteRecords_destroy(d);
    rd_kafka_queue_destroy(q);
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(rk);
}

static config_t *config_for(const char *brokers)
{
    struct charged_error err;
    ck_assert_int_eq(setenv("KAFKA_BOOTSTRAP_SERVERS", brokers, 1), 0);
    config_t *cfg = config_new(CONFIG_ROLE_CTL, "console", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    return cfg;
}

static void fresh_names(const char *what)
{
    snprintf(topic, sizeof(topic), "fleet-status-%s-%d-%lld", what, (int)getpid(),
             test_env_now_ms());
    snprintf(group, sizeof(group), "%s-group", topic);
}

static json_int_t int_of(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "no integer '%s'", key);
    return json_integer_value(v);
}

/* Partition p's entry: its committed offset (-1: null), end and lag. */
static void partition_is(json_t *lag, int p, json_int_t committed, json_int_t end,
                         json_int_t n)
{
    json_t *e = json_array_get(json_object_get(lag, "partitions"), (size_t)p);
    ck_assert_ptr_nonnull(e);
    ck_assert_int_eq(int_of(e, "partition"), p);
    if (committed < 0)
        ck_assert(json_is_null(json_object_get(e, "committed")));
    else
        ck_assert_int_eq(int_of(e, "committed"), committed);
    ck_assert_int_eq(int_of(e, "end"), end);
    ck_assert_int_eq(int_of(e, "lag"), n);
}

START_TEST(lag_is_the_end_less_the_committed_offset_per_partition)
{
    const int n[PARTITIONS] = {5, 3, 4};
    const int64_t at[PARTITIONS] = {2, 3, -1};
    struct charged_error err;
    fresh_names("lag");
    test_kafka_create_topic(topic, PARTITIONS);
    produce(n);
    commit(at);
    config_t *cfg = config_for(test_env_kafka());
    json_t *lag = fleet_status_lag(cfg, group, topic, 15000, &err);
    ck_assert_msg(lag != NULL, "%s", err.message);
    ck_assert_str_eq(json_string_value(json_object_get(lag, "group")), group);
    ck_assert_str_eq(json_string_value(json_object_get(lag, "topic")), topic);
    ck_assert_int_eq(json_array_size(json_object_get(lag, "partitions")), PARTITIONS);
    partition_is(lag, 0, 2, 5, 3);
    partition_is(lag, 1, 3, 3, 0);
    partition_is(lag, 2, -1, 4, 4); /* nothing committed: from the start */
    ck_assert_int_eq(int_of(lag, "total"), 7);
    json_decref(lag);

    /* Without a committed offset the lag counts from the partition's start,
     * not from 0: */
    delete_before(2, 1);
    lag = fleet_status_lag(cfg, group, topic, 15000, &err);
    ck_assert_msg(lag != NULL, "%s", err.message);
    partition_is(lag, 0, 2, 5, 3);
    partition_is(lag, 1, 3, 3, 0);
    partition_is(lag, 2, -1, 4, 3);
    ck_assert_int_eq(int_of(lag, "total"), 6);
    json_decref(lag);

    /* Reading committed nothing (two reads above, and no auto commit). */
    rd_kafka_t *c = test_kafka_client(RD_KAFKA_CONSUMER, group);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(PARTITIONS);
    for (int p = 0; p < PARTITIONS; p++)
        rd_kafka_topic_partition_list_add(l, topic, p);
    ck_assert(!rd_kafka_committed(c, l, 10000));
    ck_assert_int_eq(l->elems[0].offset, 2);
    ck_assert_int_eq(l->elems[1].offset, 3);
    ck_assert_int_eq(l->elems[2].offset, RD_KAFKA_OFFSET_INVALID);
    rd_kafka_topic_partition_list_destroy(l);
    rd_kafka_destroy(c);
    config_free(cfg);
}
END_TEST

START_TEST(a_group_that_never_committed_lags_by_the_whole_topic)
{
    const int n[PARTITIONS] = {1, 0, 2};
    struct charged_error err;
    fresh_names("fresh");
    test_kafka_create_topic(topic, PARTITIONS);
    produce(n);
    config_t *cfg = config_for(test_env_kafka());
    json_t *lag = fleet_status_lag(cfg, group, topic, 15000, &err);
    ck_assert_msg(lag != NULL, "%s", err.message);
    partition_is(lag, 0, -1, 1, 1);
    partition_is(lag, 1, -1, 0, 0);
    partition_is(lag, 2, -1, 2, 2);
    ck_assert_int_eq(int_of(lag, "total"), 3);
    json_decref(lag);
    config_free(cfg);
}
END_TEST

START_TEST(a_missing_topic_is_null_with_the_reason)
{
    struct charged_error err = {0};
    fresh_names("missing");
    config_t *cfg = config_for(test_env_kafka());
    json_t *lag = fleet_status_lag(cfg, group, topic, 10000, &err);
    ck_assert_ptr_null(lag);
    ck_assert_msg(strstr(err.message, "does not exist") && strstr(err.message, topic),
                  "err.message: %s", err.message);
    /* And the broker did not make it for asking. */
    lag = fleet_status_lag(cfg, group, topic, 10000, &err);
    ck_assert_ptr_null(lag);
    ck_assert_ptr_null(fleet_status_lag(cfg, "", topic, 1000, &err));
    ck_assert_ptr_null(fleet_status_lag(cfg, group, NULL, 1000, &err));
    config_free(cfg);
}
END_TEST

/* A loopback port nobody listens on (bound, then closed). */
static unsigned closed_port(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(getsockname(s, (struct sockaddr *)&sa, &sl), 0);
    close(s);
    return ntohs(sa.sin_port);
}

/* A socket that listens and never accepts: the kernel completes the
 * handshake, nobody ever answers. */
static int silent_listener(unsigned *port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    socklen_t sl = sizeof(sa);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(listen(s, 16), 0);
    ck_assert_int_eq(getsockname(s, (struct sockaddr *)&sa, &sl), 0);
    *port = ntohs(sa.sin_port);
    return s;
}

START_TEST(kafka_that_does_not_answer_is_null_within_the_timeout)
{
    char brokers[64];
    struct charged_error err = {0};
    snprintf(brokers, sizeof(brokers), "127.0.0.1:%u", closed_port());
    config_t *cfg = config_for(brokers);
    /* The timeout, and the handle's end (stretched for slow builds): never
     * the library's own minutes. */
    long long t0 = test_env_now_ms(), until = test_env_deadline(2000) + 1500;
    json_t *lag = fleet_status_lag(cfg, "g", "t", 1500, &err);
    long long took = test_env_now_ms() - t0;
    ck_assert_ptr_null(lag);
    ck_assert_msg(err.message[0], "no reason given");
    ck_assert_msg(t0 + took < until, "took %lld ms", took);
    config_free(cfg);
    unsigned silent;
    int s = silent_listener(&silent);
    snprintf(brokers, sizeof(brokers), "127.0.0.1:%u", silent);
    cfg = config_for(brokers);
    t0 = test_env_now_ms();
    until = test_env_deadline(2000) + 1500;
    lag = fleet_status_lag(cfg, "g", "t", 1500, &err);
    took = test_env_now_ms() - t0;
    ck_assert_ptr_null(lag);
    ck_assert_msg(t0 + took < until, "silent broker: took %lld ms", took);
    close(s);
    config_free(cfg);
}
END_TEST

/* The "workers": each path is a metrics body of its own. */
static const char *body_of(const char *path, unsigned *status)
{
    static const char *const bodies[][2] = {
        {"/open", "# HELP charged_provider_breaker_state Provider circuit breaker: 0 "
                  "closed, 1 half-open, 2 open.\n"
                  "# TYPE charged_provider_breaker_state gauge\n"
                  "charged_provider_breaker_state 2\n"
                  "charged_ready 1\n"},
        {"/closed", "charged_provider_breaker_state 0\n"},
        {"/half", "charged_provider_breaker_state{provider=\"psp\"} 1"},
        {"/none", "charged_ready 1\n"},
    };
    *status = 200;
    for (size_t i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++)
        if (!strcmp(path, bodies[i][0]))
            return bodies[i][1];
    *status = 404;
    return "not found\n";
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size,
                                  void **con_cls)
{
    static char *big;
    struct MHD_Response *r;
    unsigned status = 200;
    (void)cls;
    (void)method;
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    if (!strcmp(url, "/big")) { /* 2 MiB: over the cap */
        if (!big) {
            big = malloc(2 * 1024 * 1024);
            memset(big, '#', 2 * 1024 * 1024);
        }
        r = MHD_create_response_from_buffer(2 * 1024 * 1024, big,
                                            MHD_RESPMEM_PERSISTENT);
    } else {
        const char *b = body_of(url, &status);
        r = MHD_create_response_from_buffer(strlen(b), (void *)b,
                                            MHD_RESPMEM_PERSISTENT);
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static json_t *entry(json_t *list, size_t i, const char *state)
{
    json_t *e = json_array_get(list, i);
    ck_assert_ptr_nonnull(e);
    const char *s = json_string_value(json_object_get(e, "state"));
    ck_assert_msg(s && !strcmp(s, state), "entry %zu: state %s, not %s", i, s, state);
    return e;
}

static const char *url_of(json_t *e)
{
    return json_string_value(json_object_get(e, "url"));
}

static const char *error_of(json_t *e)
{
    return json_string_value(json_object_get(e, "error"));
}

START_TEST(breakers_of_workers_that_answer_and_of_those_that_do_not)
{
    struct sockaddr_in sa = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    struct MHD_Daemon *d =
        MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request,
                         NULL, MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_END);
    ck_assert_ptr_nonnull(d);
    unsigned port = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT)->port;
    unsigned closed = closed_port();
    char urls[2048], want[128];
    snprintf(urls, sizeof(urls),
             "http://metrics:s3cr3t@127.0.0.1:%u/open, http://127.0.0.1:%u/closed,,"
             "HTTP://127.0.0.1:%u/half ,http://127.0.0.1:%u/none,"
             "http://127.0.0.1:%u/metrics,http://127.0.0.1:%u/big,"
             "http://127.0.0.1:%u/metrics,"
             "ftp://metrics:s3cr3t@127.0.0.1:%u/metrics,127.0.0.1:%u/metrics,"
             "file:///etc/passwd,http://metrics:s3/cr3t@host/metrics,"
             "http://metrics:s3cr3t@/x,\x01\xff,",
             port, port, port, port, port, port, closed, port, port);
    json_t *l = fleet_status_breakers(urls, 3000);
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(json_array_size(l), 13);

    json_t *e = entry(l, 0, "open");
    snprintf(want, sizeof(want), "http://127.0.0.1:%u/open", port);
    ck_assert_str_eq(url_of(e), want);
    ck_assert(json_is_null(json_object_get(e, "error")));
    entry(l, 1, "closed");
    e = entry(l, 2, "half_open");
    snprintf(want, sizeof(want), "http://127.0.0.1:%u/half", port);
    ck_assert_str_eq(url_of(e), want);
    ck_assert_str_eq(error_of(entry(l, 3, "unreachable")),
                     "no charged_provider_breaker_state in the metrics");
    ck_assert_str_eq(error_of(entry(l, 4, "unreachable")), "HTTP 404");
    ck_assert_str_eq(error_of(entry(l, 5, "unreachable")), "metrics body over 1 MiB");
    e = entry(l, 6, "unreachable");
    ck_assert_msg(error_of(e) && *error_of(e), "no error for a closed port");
    for (size_t i = 7; i < 13; i++)
        ck_assert_str_eq(error_of(entry(l, i, "unreachable")), "not an http(s) URL");
    snprintf(want, sizeof(want), "ftp://127.0.0.1:%u/metrics", port);
    ck_assert_str_eq(url_of(json_array_get(l, 7)), want);
    ck_assert_str_eq(url_of(json_array_get(l, 12)), "%01%FF");

    /* No login anywhere in the answer, whatever the URL looked like. */
    char *all = json_dumps(l, JSON_COMPACT);
    ck_assert_ptr_nonnull(all);
    ck_assert_msg(!strstr(all, "s3cr3t") && !strstr(all, "cr3t") &&
                      !strstr(all, "metrics:") && !strstr(all, "metrics@"),
                  "%s", all);
    free(all);
    json_decref(l);
    MHD_stop_daemon(d);
}
END_TEST

START_TEST(workers_that_never_answer_are_waited_for_together_once)
{
    unsigned p1, p2;
    int s1 = silent_listener(&p1), s2 = silent_listener(&p2);
    char urls[256];
    snprintf(urls, sizeof(urls),
             "http://127.0.0.1:%u/metrics,http://127.0.0.1:%u/metrics", p1, p2);
    long long t0 = test_env_now_ms();
    json_t *l = fleet_status_breakers(urls, 1000);
    long long took = test_env_now_ms() - t0;
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(json_array_size(l), 2);
    entry(l, 0, "unreachable");
    entry(l, 1, "unreachable");
    /* Side by side: one timeout, not one per worker (one after the other
     * would take two at least). */
    ck_assert_msg(took >= 900 && took < 2 * 1000, "took %lld ms", took);
    json_decref(l);
    close(s1);
    close(s2);
}
END_TEST

START_TEST(no_urls_no_workers)
{
    json_t *l = fleet_status_breakers(NULL, 1000);
    ck_assert(json_is_array(l) && json_array_size(l) == 0);
    json_decref(l);
    l = fleet_status_breakers("", 1000);
    ck_assert(json_is_array(l) && json_array_size(l) == 0);
    json_decref(l);
    l = fleet_status_breakers(" , ,\t,", 1000);
    ck_assert(json_is_array(l) && json_array_size(l) == 0);
    json_decref(l);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("fleet_status");
    TCase *lag = tcase_create("lag");
    tcase_set_timeout(lag, 120);
    tcase_add_test(lag, lag_is_the_end_less_the_committed_offset_per_partition);
    tcase_add_test(lag, a_group_that_never_committed_lags_by_the_whole_topic);
    tcase_add_test(lag, a_missing_topic_is_null_with_the_reason);
    tcase_add_test(lag, kafka_that_does_not_answer_is_null_within_the_timeout);
    suite_add_tcase(s, lag);
    TCase *br = tcase_create("breakers");
    tcase_set_timeout(br, 60);
    tcase_add_test(br, breakers_of_workers_that_answer_and_of_those_that_do_not);
    tcase_add_test(br, workers_that_never_answer_are_waited_for_together_once);
    tcase_add_test(br, no_urls_no_workers);
    suite_add_tcase(s, br);
    return test_env_run_suite(s);
}
