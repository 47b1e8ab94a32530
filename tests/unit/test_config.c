/* Unit tests of common/runtime/config: defaults, environment, NAME_FILE secrets,
 * KAFKA_* pass-through and each kind of bad value. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "kafka_setup.h"
#include "log.h"
#include "test_env.h"

extern char **environ;

static struct charged_error err;

/* Each test starts from an environment without any charged setting. */
static void clean_env(void)
{
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; e && *e; e++) {
            const char *eq = strchr(*e, '=');
            char name[256];
            if (!eq || (size_t)(eq - *e) >= sizeof(name))
                continue;
            memcpy(name, *e, (size_t)(eq - *e));
            name[eq - *e] = '\0';
            for (int k = 0; k < CONFIG__COUNT; k++) {
                const char *n = config_name((enum config_key)k);
                if (!strncmp(name, n, strlen(n)) || !strncmp(name, "KAFKA_", 6)) {
                    unsetenv(name);
                    again = 1;
                    break;
                }
            }
            if (again)
                break;
        }
    }
    setenv("PROVIDER_API_KEY", "sk_test_unit", 1);
    log_clear_secrets();
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* librdkafka reads group.protocol without regard to case: so must the
 * worker, or it sets the classic assignor under the consumer protocol and
 * librdkafka blames the operator for a property they never set. */
START_TEST(consumer_protocol_in_any_case)
{
    const char *cases[][2] = {{"consumer", "1"},
                              {"CONSUMER", "1"},
                              {"Consumer", "1"},
                              {"classic", "0"},
                              {NULL, "0"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        clean_env();
        if (cases[i][0])
            setenv("KAFKA_GROUP_PROTOCOL", cases[i][0], 1);
        config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
        ck_assert_msg(cfg != NULL, "%s", err.message);
        ck_assert_msg(kafka_setup_uses_consumer_protocol(cfg) == atoi(cases[i][1]),
                      "KAFKA_GROUP_PROTOCOL=%s", cases[i][0] ? cases[i][0] : "(unset)");
        config_free(cfg);
    }
}
END_TEST

START_TEST(defaults_are_the_contracts)
{
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_str_eq(config_str(cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS), "localhost:9092");
    ck_assert_str_eq(config_str(cfg, CONFIG_KAFKA_GROUP_ID), "charged-worker");
    ck_assert_str_eq(config_str(cfg, CONFIG_DATABASE_URL), "postgresql:///charged");
    ck_assert_str_eq(config_str(cfg, CONFIG_PROVIDER_BASE_URL),
                     "http://127.0.0.1:12111");
    ck_assert_int_eq(config_int(cfg, CONFIG_PROVIDER_TIMEOUT_MS), 10000);
    ck_assert_str_eq(config_str(cfg, CONFIG_CHARGE_COMMANDS_TOPIC),
                     "payments.charge.commands");
    ck_assert_str_eq(config_str(cfg, CONFIG_CHARGE_RESULTS_TOPIC),
                     "payments.charge.results");
    ck_assert_str_eq(config_str(cfg, CONFIG_CHARGE_DLQ_TOPIC),
                     "payments.charge.commands.dlq");
    ck_assert_str_eq(config_str(cfg, CONFIG_API_ADDR), "127.0.0.1:8080");
    ck_assert_str_eq(config_str(cfg, CONFIG_ADMIN_ADDR), "127.0.0.1:9400");
    ck_assert_int_eq(config_int(cfg, CONFIG_HEALTH_STALL_MS), 30000);
    ck_assert_str_eq(config_str(cfg, CONFIG_LOG_LEVEL), "info");
    ck_assert_int_eq(config_int(cfg, CONFIG_WORKER_MAX_IN_FLIGHT), 1000);
    ck_assert_ptr_null(config_str(cfg, CONFIG_WEBHOOK_SIGNING_SECRET));
    ck_assert_uint_eq(config_kafka_count(cfg), 0);
    config_free(cfg);
}
END_TEST

START_TEST(admin_addr_takes_port_zero)
{
    setenv("ADMIN_ADDR", "127.0.0.1:0", 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_str_eq(config_str(cfg, CONFIG_ADMIN_ADDR), "127.0.0.1:0");
    config_free(cfg);
}
END_TEST

START_TEST(group_default_names_the_role)
{
    config_t *cfg = config_new(CONFIG_ROLE_RELAY, "relay", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_str_eq(config_str(cfg, CONFIG_KAFKA_GROUP_ID), "charged-relay");
    config_free(cfg);
}
END_TEST

START_TEST(environment_overrides_defaults)
{
    setenv("KAFKA_BOOTSTRAP_SERVERS", "10.0.0.1:9092,10.0.0.2:9092", 1);
    setenv("KAFKA_GROUP_ID", "payments-eu", 1);
    setenv("PROVIDER_TIMEOUT_MS", "2500", 1);
    setenv("LOG_LEVEL", "debug", 1);
    setenv("CHARGE_DLQ_TOPIC", "dead.letters", 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_str_eq(config_str(cfg, CONFIG_KAFKA_BOOTSTRAP_SERVERS),
                     "10.0.0.1:9092,10.0.0.2:9092");
    ck_assert_str_eq(config_str(cfg, CONFIG_KAFKA_GROUP_ID), "payments-eu");
    ck_assert_int_eq(config_int(cfg, CONFIG_PROVIDER_TIMEOUT_MS), 2500);
    ck_assert_str_eq(config_str(cfg, CONFIG_LOG_LEVEL), "debug");
    ck_assert_str_eq(config_str(cfg, CONFIG_CHARGE_DLQ_TOPIC), "dead.letters");
    /* Table settings are not passed through to librdkafka. */
    ck_assert_uint_eq(config_kafka_count(cfg), 0);
    config_free(cfg);
}
END_TEST

START_TEST(file_variant_reads_a_secret)
{
    char path[] = "/tmp/charged-secret-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, "sk_live_from_file\n");
    unsetenv("PROVIDER_API_KEY");
    setenv("PROVIDER_API_KEY_FILE", path, 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    /* The trailing newline of the file is not part of the secret. */
    ck_assert_str_eq(config_str(cfg, CONFIG_PROVIDER_API_KEY), "sk_live_from_file");
    config_free(cfg);
    unlink(path);
}
END_TEST

START_TEST(file_variant_missing_file_is_an_error)
{
    unsetenv("PROVIDER_API_KEY");
    setenv("PROVIDER_API_KEY_FILE", "/nonexistent/key", 1);
    ck_assert_ptr_null(config_new(CONFIG_ROLE_WORKER, "worker", &err));
    ck_assert_msg(strstr(err.message, "PROVIDER_API_KEY_FILE") &&
                      strstr(err.message, "/nonexistent/key"),
                  "%s", err.message);
}
END_TEST

START_TEST(both_variants_is_an_error)
{
    setenv("PROVIDER_API_KEY_FILE", "/etc/hostname", 1);
    ck_assert_ptr_null(config_new(CONFIG_ROLE_WORKER, "worker", &err));
    ck_assert_msg(strstr(err.message, "PROVIDER_API_KEY") &&
                      strstr(err.message, "not both"),
                  "%s", err.message);
}
END_TEST

START_TEST(required_secret_missing_names_it)
{
    unsetenv("PROVIDER_API_KEY");
    ck_assert_ptr_null(config_new(CONFIG_ROLE_WORKER, "worker", &err));
    ck_assert_str_eq(err.message, "PROVIDER_API_KEY: required but not set");
    /* ...but a role that does not call the provider does not need it. */
    config_t *cfg = config_new(CONFIG_ROLE_CTL, "ctl", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    config_free(cfg);
}
END_TEST

START_TEST(kafka_properties_pass_through)
{
    setenv("KAFKA_SECURITY_PROTOCOL", "SASL_SSL", 1);
    setenv("KAFKA_SASL_MECHANISM", "PLAIN", 1);
    setenv("KAFKA_SASL_PASSWORD", "hunter2-kafka", 1);
    setenv("KAFKA_STATISTICS_INTERVAL_MS", "5000", 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_uint_eq(config_kafka_count(cfg), 4);
    int seen = 0;
    for (size_t i = 0; i < config_kafka_count(cfg); i++) {
        const char *p, *v;
        config_kafka_get(cfg, i, &p, &v);
        if (!strcmp(p, "security.protocol")) {
            seen |= 1;
            ck_assert_str_eq(v, "SASL_SSL");
        } else if (!strcmp(p, "sasl.mechanism")) {
            seen |= 2;
            ck_assert_str_eq(v, "PLAIN");
        } else if (!strcmp(p, "sasl.password")) {
            seen |= 4;
            ck_assert_str_eq(v, "hunter2-kafka");
        } else if (!strcmp(p, "statistics.interval.ms")) {
            seen |= 8;
            ck_assert_str_eq(v, "5000");
        } else
            ck_abort_msg("unexpected property %s", p);
    }
    ck_assert_int_eq(seen, 15);
    config_free(cfg);
}
END_TEST

START_TEST(kafka_property_from_file)
{
    char path[] = "/tmp/charged-kpw-XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, "pw-from-file");
    setenv("KAFKA_SASL_PASSWORD_FILE", path, 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_uint_eq(config_kafka_count(cfg), 1);
    const char *p, *v;
    config_kafka_get(cfg, 0, &p, &v);
    ck_assert_str_eq(p, "sasl.password");
    ck_assert_str_eq(v, "pw-from-file");
    config_free(cfg);
    unlink(path);
}
END_TEST

START_TEST(unknown_kafka_property_is_refused)
{
    setenv("KAFKA_NO_SUCH_THING", "1", 1);
    ck_assert_ptr_null(config_new(CONFIG_ROLE_WORKER, "worker", &err));
    ck_assert_msg(!strncmp(err.message, "KAFKA_NO_SUCH_THING: ", 21), "%s",
                  err.message);
}
END_TEST

/* librdkafka would say only "ssl.ca.location failed: ... system lib". */
START_TEST(unreadable_tls_file_is_named)
{
    setenv("KAFKA_SSL_CA_LOCATION", "/nonexistent/charged-ca.crt", 1);
    ck_assert_ptr_null(config_new(CONFIG_ROLE_WORKER, "worker", &err));
    ck_assert_str_eq(
        err.message,
        "KAFKA_SSL_CA_LOCATION: cannot read '/nonexistent/charged-ca.crt': "
        "No such file or directory");
    /* "probe": the system's CAs, not a file. */
    setenv("KAFKA_SSL_CA_LOCATION", "probe", 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    config_free(cfg);
}
END_TEST

/* Each kind of bad value exits with one line naming the variable and why. */
static const struct {
    const char *var, *value, *expect;
} bad_values[] = {
    {"PROVIDER_TIMEOUT_MS", "ten", "PROVIDER_TIMEOUT_MS: 'ten' is not an integer"},
    {"PROVIDER_TIMEOUT_MS", "12ms", "PROVIDER_TIMEOUT_MS: '12ms' is not an integer"},
    {"PROVIDER_TIMEOUT_MS", "", "PROVIDER_TIMEOUT_MS: '' is not an integer"},
    {"PROVIDER_TIMEOUT_MS", "99", "PROVIDER_TIMEOUT_MS: 99 is outside 100..600000"},
    {"WORKER_MAX_IN_FLIGHT", "0", "WORKER_MAX_IN_FLIGHT: 0 is outside 1..100000"},
    {"WORKER_MAX_IN_FLIGHT", "99999999999999999999",
     "WORKER_MAX_IN_FLIGHT: '99999999999999999999' is not an integer"},
    {"LOG_LEVEL", "verbose",
     "LOG_LEVEL: 'verbose' is not one of debug, info, warn, error"},
    {"API_ADDR", "8080", "API_ADDR: '8080' is not host:port"},
    {"ADMIN_ADDR", "127.0.0.1:70000", "ADMIN_ADDR: '127.0.0.1:70000' is not host:port"},
    {"ADMIN_ADDR", "127.0.0.1:-1", "ADMIN_ADDR: '127.0.0.1:-1' is not host:port"},
    /* Port 0 (any free port) is for the admin listener only. */
    {"API_ADDR", "127.0.0.1:0", "API_ADDR: '127.0.0.1:0' is not host:port"},
    {"HEALTH_STALL_MS", "999", "HEALTH_STALL_MS: 999 is outside 1000..3600000"},
    {"CHARGE_COMMANDS_TOPIC", "bad topic",
     "CHARGE_COMMANDS_TOPIC: 'bad topic' is not "
     "a valid topic name"},
};

START_TEST(bad_value_names_variable_and_reason)
{
    setenv("WEBHOOK_SIGNING_SECRET", "whsec_unit_test", 1); /* required by api */
    setenv(bad_values[_i].var, bad_values[_i].value, 1);
    ck_assert_ptr_null(
        config_new(CONFIG_ROLE_WORKER | CONFIG_ROLE_API, "worker", &err));
    ck_assert_str_eq(err.message, bad_values[_i].expect);
}
END_TEST

START_TEST(api_requires_a_signing_secret)
{
    ck_assert_ptr_null(config_new(CONFIG_ROLE_API, "api", &err));
    ck_assert_str_eq(err.message, "WEBHOOK_SIGNING_SECRET: required but not set");
    setenv("WEBHOOK_SIGNING_SECRET", "whsec_unit_test", 1);
    config_t *cfg = config_new(CONFIG_ROLE_API, "api", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    ck_assert_int_eq(config_int(cfg, CONFIG_API_THREADS), 4);
    ck_assert_int_eq(config_int(cfg, CONFIG_API_MAX_BODY_BYTES), 65536);
    config_free(cfg);
}
END_TEST

START_TEST(help_lists_the_roles_settings)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    config_print_help(f, CONFIG_ROLE_WORKER);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "KAFKA_BOOTSTRAP_SERVERS"));
    ck_assert_ptr_nonnull(strstr(buf, "PROVIDER_API_KEY"));
    ck_assert_ptr_nonnull(strstr(buf, "[default: payments.charge.commands]"));
    /* The API's listener is not a worker setting. */
    ck_assert_ptr_null(strstr(buf, "API_ADDR "));
    free(buf);
}
END_TEST

START_TEST(secrets_never_reach_a_log_line)
{
    setenv("PROVIDER_API_KEY", "sk_live_topsecret", 1);
    config_t *cfg = config_new(CONFIG_ROLE_WORKER, "worker", &err);
    ck_assert_msg(cfg != NULL, "%s", err.message);
    char out[256];
    log_redact("calling with sk_live_topsecret now", out, sizeof(out));
    ck_assert_str_eq(out, "calling with [redacted] now");
    config_free(cfg);
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *tc = tcase_create("config");
    tcase_add_checked_fixture(tc, clean_env, NULL);
    tcase_add_test(tc, defaults_are_the_contracts);
    tcase_add_test(tc, admin_addr_takes_port_zero);
    tcase_add_test(tc, group_default_names_the_role);
    tcase_add_test(tc, environment_overrides_defaults);
    tcase_add_test(tc, file_variant_reads_a_secret);
    tcase_add_test(tc, file_variant_missing_file_is_an_error);
    tcase_add_test(tc, both_variants_is_an_error);
    tcase_add_test(tc, required_secret_missing_names_it);
    tcase_add_test(tc, kafka_properties_pass_through);
    tcase_add_test(tc, kafka_property_from_file);
    tcase_add_test(tc, unknown_kafka_property_is_refused);
    tcase_add_test(tc, unreadable_tls_file_is_named);
    tcase_add_loop_test(tc, bad_value_names_variable_and_reason, 0,
                        sizeof(bad_values) / sizeof(bad_values[0]));
    tcase_add_test(tc, api_requires_a_signing_secret);
    tcase_add_test(tc, help_lists_the_roles_settings);
    tcase_add_test(tc, secrets_never_reach_a_log_line);
    tcase_add_test(tc, consumer_protocol_in_any_case);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(config_suite());
}
