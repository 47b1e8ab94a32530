/* Unit tests of kafka_setup_producer_conf: the preset every charged
 * producer gets, which of its settings KAFKA_* may override and which it
 * may not, and what the relay's and chargectl's presets add. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "kafka_setup.h"
#include "log.h"
#include "test_env.h"

static struct charged_error err;

/* The producer conf for this environment ("NAME=value" pairs, NULL-ended). */
static rd_kafka_conf_t *preset(const struct kafka_setup_producer *p, const char **env)
{
    unsetenv("KAFKA_LINGER_MS");
    unsetenv("KAFKA_MESSAGE_MAX_BYTES");
    unsetenv("KAFKA_MESSAGE_TIMEOUT_MS");
    unsetenv("KAFKA_ACKS");
    unsetenv("KAFKA_ENABLE_IDEMPOTENCE");
    setenv("PROVIDER_API_KEY", "sk_test_unit", 1);
    for (; env && *env; env += 2)
        setenv(env[0], env[1], 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    rd_kafka_conf_t *conf = kafka_setup_producer_conf(cfg, "test", p, &err);
    ck_assert_msg(conf != NULL, "%s", err.message);
    config_free(cfg);
    return conf;
}

/* A property's value; topic properties (acks) are read from the default
 * topic conf, where librdkafka keeps them. */
static const char *get(rd_kafka_conf_t *conf, const char *name)
{
    static char value[256];
    size_t size = sizeof(value);
    if (rd_kafka_conf_get(conf, name, value, &size) == RD_KAFKA_CONF_OK)
        return value;
    rd_kafka_topic_conf_t *t = rd_kafka_conf_get_default_topic_conf(conf);
    size = sizeof(value);
    ck_assert_msg(t && rd_kafka_topic_conf_get(t, name, value, &size) ==
                           RD_KAFKA_CONF_OK,
                  "%s is not set", name);
    return value;
}

START_TEST(defaults_yield_to_kafka_variables_guarantees_do_not)
{
    const struct kafka_setup_producer plain = {0};
    rd_kafka_conf_t *c = preset(&plain, NULL);
    ck_assert_str_eq(get(c, "linger.ms"), "5");
    ck_assert_str_eq(get(c, "message.max.bytes"), "4194304");
    ck_assert_str_eq(get(c, "message.timeout.ms"), "300000"); /* librdkafka's */
    ck_assert_str_eq(get(c, "enable.idempotence"), "true");
    ck_assert_str_eq(get(c, "request.required.acks"), "-1"); /* all */
    rd_kafka_conf_destroy(c);

    const char *env[] = {"KAFKA_LINGER_MS",
                         "20",
                         "KAFKA_MESSAGE_MAX_BYTES",
                         "1000000",
                         "KAFKA_ACKS",
                         "1",
                         "KAFKA_ENABLE_IDEMPOTENCE",
                         "false",
                         NULL};
    c = preset(&plain, env);
    ck_assert_str_eq(get(c, "linger.ms"), "20");
    ck_assert_str_eq(get(c, "message.max.bytes"), "1000000");
    ck_assert_str_eq(get(c, "enable.idempotence"), "true");
    ck_assert_str_eq(get(c, "request.required.acks"), "-1");
    rd_kafka_conf_destroy(c);
}
END_TEST

START_TEST(the_relay_sets_a_message_timeout_an_operator_may_change)
{
    const struct kafka_setup_producer relay = {.message_timeout_ms = 30000};
    rd_kafka_conf_t *c = preset(&relay, NULL);
    ck_assert_str_eq(get(c, "message.timeout.ms"), "30000");
    rd_kafka_conf_destroy(c);
    const char *env[] = {"KAFKA_MESSAGE_TIMEOUT_MS", "9000", NULL};
    c = preset(&relay, env);
    ck_assert_str_eq(get(c, "message.timeout.ms"), "9000");
    rd_kafka_conf_destroy(c);
}
END_TEST

START_TEST(a_pinned_message_size_ignores_kafka_variables)
{
    const struct kafka_setup_producer ctl = {.pin_message_max_bytes = 1};
    const char *env[] = {"KAFKA_MESSAGE_MAX_BYTES", "1000000", "KAFKA_LINGER_MS", "20",
                         NULL};
    rd_kafka_conf_t *c = preset(&ctl, env);
    ck_assert_str_eq(get(c, "message.max.bytes"), "4194304");
    ck_assert_str_eq(get(c, "linger.ms"), "20");
    ck_assert_str_eq(get(c, "enable.idempotence"), "true");
    rd_kafka_conf_destroy(c);
}
END_TEST

int main(void)
{
    log_init("test_kafka_setup", LOG_WARN);
    Suite *s = suite_create("kafka_setup");
    TCase *tc = tcase_create("producer");
    tcase_add_test(tc, defaults_yield_to_kafka_variables_guarantees_do_not);
    tcase_add_test(tc, the_relay_sets_a_message_timeout_an_operator_may_change);
    tcase_add_test(tc, a_pinned_message_size_ignores_kafka_variables);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
