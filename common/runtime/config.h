/* config: every setting of every charged program, read from the environment.
 *
 * One table (config.c) holds name, type, default, bounds, roles and help of
 * each setting, and the operations add their own after it
 * (config_add_settings); loading, validation and --help all come from it. A setting
 * NAME may instead be given as NAME_FILE, the path of a file holding the
 * value (for secrets); setting both is an error. Any other KAFKA_<PROP>
 * variable is passed through to librdkafka as <prop> ('_' becomes '.'). */
#ifndef CHARGED_CONFIG_H
#define CHARGED_CONFIG_H

#include <stdio.h>
#include <stddef.h>

#include "charged_error.h"

/* Which programs read a setting; --help of a role lists only its rows. */
enum config_role {
    CONFIG_ROLE_WORKER = 1u << 0,
    CONFIG_ROLE_RECONCILER = 1u << 1,
    CONFIG_ROLE_RELAY = 1u << 2,
    CONFIG_ROLE_API = 1u << 3,
    CONFIG_ROLE_CTL = 1u << 4,
    CONFIG_ROLE_AUDITOR = 1u << 5,
    CONFIG_ROLE_CONSOLE = 1u << 6,
};

/* Keys of the table; the order matches the table in config.c. */
enum config_key {
    CONFIG_KAFKA_BOOTSTRAP_SERVERS,
    CONFIG_KAFKA_GROUP_ID,
    CONFIG_DATABASE_URL,
    CONFIG_DATABASE_TIMEOUT_MS,
    CONFIG_PROVIDER_BASE_URL,
    CONFIG_PROVIDER_API_KEY,
    CONFIG_PROVIDER_TIMEOUT_MS,
    CONFIG_PROVIDER_API_VERSION,
    CONFIG_PROVIDER_BUDGET,
    CONFIG_PROVIDER_BUDGET_ACCOUNT,
    CONFIG_WEBHOOK_SIGNING_SECRET,
    CONFIG_CHARGE_COMMANDS_TOPIC,
    CONFIG_CHARGE_RESULTS_TOPIC,
    CONFIG_CHARGE_DLQ_TOPIC,
    CONFIG_API_ADDR,
    CONFIG_ADMIN_ADDR,
    CONFIG_LOG_LEVEL,
    CONFIG_WORKER_ID,
    CONFIG_WORKER_MAX_IN_FLIGHT,
    CONFIG_WORKER_LEASE_MS,
    CONFIG_WORKER_UNKNOWN_RETRIES,
    CONFIG_WORKER_RETRY_BASE_MS,
    CONFIG_WORKER_RETRY_MAX_MS,
    CONFIG_WORKER_KEY_RETENTION_MS,
    CONFIG_WORKER_COMMIT_INTERVAL_MS,
    CONFIG_WORKER_RECHECK_MS,
    CONFIG_WORKER_BATCH_HOLD_MS,
    CONFIG_WORKER_MAX_COMMAND_BYTES,
    CONFIG_WORKER_MAX_AMOUNT,
    CONFIG_WORKER_ALLOWED_CURRENCIES,
    CONFIG_PROVIDER_BREAKER_FAILURE_RATE,
    CONFIG_PROVIDER_BREAKER_MIN_CALLS,
    CONFIG_PROVIDER_BREAKER_WINDOW_MS,
    CONFIG_PROVIDER_BREAKER_OPEN_MS,
    CONFIG_PROVIDER_BREAKER_PROBES,
    CONFIG_POD_NAME,
    CONFIG_SHUTDOWN_TIMEOUT_MS,
    CONFIG_HEALTH_STALL_MS,
    CONFIG_REBALANCE_DRAIN_MS,
    CONFIG_RECONCILER_BATCH,
    CONFIG_RECONCILER_FIRST_LOOK_MS,
    CONFIG_RECONCILER_LEASE_MS,
    CONFIG_RECONCILER_POLL_MS,
    CONFIG_RECONCILER_SCHEDULE_MS,
    CONFIG_RECONCILER_MAX_AGE_MS,
    CONFIG_RECONCILER_SEARCH_LAG_MS,
    CONFIG_RECONCILER_STALE_LEASE_MS,
    CONFIG_RELAY_BATCH,
    CONFIG_RELAY_POLL_MS,
    CONFIG_RELAY_RETENTION_MS,
    CONFIG_RELAY_BACKLOG_LOG_MS,
    CONFIG_RELAY_ACK_TIMEOUT_MS,
    CONFIG_API_THREADS,
    CONFIG_API_MAX_BODY_BYTES,
    CONFIG_API_MAX_CONNECTIONS,
    CONFIG_API_MAX_CONNECTIONS_PER_IP,
    CONFIG_AUDITOR_WINDOW_MS,
    CONFIG_AUDITOR_LAG_MS,
    CONFIG_AUDITOR_POLL_MS,
    CONFIG_AUDITOR_FROM,
    CONFIG_AUDITOR_PENDING_BATCH,
    CONFIG_CONSOLE_ADDR,
    CONFIG_CONSOLE_THREADS,
    CONFIG_CONSOLE_SESSION_TTL_S,
    CONFIG_CONSOLE_COOKIE_SECURE,
    CONFIG_CONSOLE_WORKER_GROUP,
    CONFIG_CONSOLE_WORKER_METRICS,
    CONFIG__COUNT
};

typedef struct config config_t;

/* Reads the table's settings for `roles` (a mask of enum config_role) from
 * the environment. `role_name` names the program's role, for the default
 * consumer group "charged-<role_name>". Returns NULL and one line in err
 * that names the variable on a bad value (a configuration error: the
 * caller gives up). */
config_t *config_new(unsigned roles, const char *role_name, struct charged_error *err);
void config_free(config_t *cfg);

/* Values; the key must be of the matching type. Strings are owned by cfg
 * and may be NULL for a setting without default that was not given. */
const char *config_str(const config_t *cfg, enum config_key key);
long long config_int(const config_t *cfg, enum config_key key);

/* The setting's environment name, e.g. "DATABASE_URL". */
const char *config_name(enum config_key key);

/* Pass-through librdkafka properties from KAFKA_* variables, in
 * environment order: property name and value, owned by cfg. */
size_t config_kafka_count(const config_t *cfg);
void config_kafka_get(const config_t *cfg, size_t i, const char **prop,
                      const char **value);

/* Prints the settings of `roles` as a table for --help: the table's rows,
 * then the added settings. */
void config_print_help(FILE *out, unsigned roles);

/* ---- settings an operation adds (worker/operations/op.h's settings) ---- */

/* An integer setting of its own, read and printed as the table's rows. */
struct config_setting {
    const char *name; /* environment variable */
    const char *def;  /* its default */
    long long min, max;
    unsigned roles; /* which programs read it (enum config_role) */
    const char *help;
};

#define CONFIG_SETTINGS_MAX 16

/* Adds settings after the table's rows, for every config_new and
 * config_print_help after: called once, before either, by the program
 * (charged's main, from the operations table). 0, or -1 when more than
 * CONFIG_SETTINGS_MAX would be added. */
int config_add_settings(const struct config_setting *const *s, size_t n);

/* The value of an added setting. */
long long config_setting_int(const config_t *cfg, const struct config_setting *s);

/* 1 and err, naming the version, when the librdkafka loaded at run time
 * (not the one built against: LD_LIBRARY_PATH comes first) is older than
 * 2.10, which fixed the lost assignment of a commit during a cooperative
 * rebalance; 0 otherwise. Checked wherever a librdkafka conf is first made. */
int config_librdkafka_too_old(struct charged_error *err);

#endif
