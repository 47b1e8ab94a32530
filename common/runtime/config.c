#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <libpq-fe.h>
#include <librdkafka/rdkafka.h>

#include "charged_assert.h"
#include "log.h"

extern char **environ;

enum config_type {
    CONFIG_T_STR,    /* free text */
    CONFIG_T_SECRET, /* free text, never printed */
    CONFIG_T_INT,    /* integer within [min, max] */
    CONFIG_T_ADDR,   /* host:port; port 1..65535, or min..65535 when max is set */
    CONFIG_T_LEVEL,  /* debug | info | warn | error */
    CONFIG_T_TOPIC,  /* a legal Kafka topic name */
};

struct config_row {
    enum config_key key;
    const char *name; /* environment variable */
    enum config_type type;
    const char *def; /* NULL: no default */
    long long min, max;
    unsigned roles;
    unsigned required; /* the roles that must set it (a subset of roles) */
    const char *help;
};

#define R_ALL                                                                          \
    (CONFIG_ROLE_WORKER | CONFIG_ROLE_RECONCILER | CONFIG_ROLE_RELAY |                 \
     CONFIG_ROLE_API | CONFIG_ROLE_CTL | CONFIG_ROLE_AUDITOR | CONFIG_ROLE_CONSOLE)
#define R_KAFKA (CONFIG_ROLE_WORKER | CONFIG_ROLE_RELAY | CONFIG_ROLE_CTL)
#define R_PROV  (CONFIG_ROLE_WORKER | CONFIG_ROLE_RECONCILER)
#define R_A     CONFIG_ROLE_AUDITOR
#define R_C     CONFIG_ROLE_CONSOLE
#define R_W     CONFIG_ROLE_WORKER
#define R_R     CONFIG_ROLE_RECONCILER

/* The one table. Rows are in enum config_key order (checked at load). */
static const struct config_row config_table[CONFIG__COUNT] = {
    {CONFIG_KAFKA_BOOTSTRAP_SERVERS, "KAFKA_BOOTSTRAP_SERVERS", CONFIG_T_STR,
     "localhost:9092", 0, 0, R_KAFKA | R_C, 0, "Kafka brokers, host:port[,host:port]"},
    {CONFIG_KAFKA_GROUP_ID, "KAFKA_GROUP_ID", CONFIG_T_STR, NULL, 0, 0, R_KAFKA, 0,
     "consumer group of the role (default charged-<role>)"},
    {CONFIG_DATABASE_URL, "DATABASE_URL", CONFIG_T_SECRET, "postgresql:///charged", 0,
     0, R_ALL, 0, "libpq connection string or URI (may hold a password)"},
    /* The server ends a statement after this long; the client gives it up
     * a second later, should the server not even say so (a frozen host). */
    {CONFIG_DATABASE_TIMEOUT_MS, "DATABASE_TIMEOUT_MS", CONFIG_T_INT, "10000", 1000,
     600000, R_ALL & ~CONFIG_ROLE_CTL, 0,
     "limit of one database statement, in ms; given up 1 s later without an answer"},
    {CONFIG_PROVIDER_BASE_URL, "PROVIDER_BASE_URL", CONFIG_T_STR,
     "http://127.0.0.1:12111", 0, 0, R_PROV | CONFIG_ROLE_CTL | R_A | R_C, 0,
     "payment provider API root"},
    /* chargectl needs the key for `attempt resolve` only, and says so there. */
    {CONFIG_PROVIDER_API_KEY, "PROVIDER_API_KEY", CONFIG_T_SECRET, NULL, 0, 0,
     R_PROV | CONFIG_ROLE_CTL | R_A | R_C, R_PROV | R_A | R_C,
     "provider secret, sent as Authorization: Bearer (required; chargectl: by "
     "resolve and audit run only)"},
    {CONFIG_PROVIDER_TIMEOUT_MS, "PROVIDER_TIMEOUT_MS", CONFIG_T_INT, "10000", 100,
     600000, R_PROV | CONFIG_ROLE_CTL | R_A | R_C, 0,
     "limit of one provider call, in ms"},
    {CONFIG_PROVIDER_API_VERSION, "PROVIDER_API_VERSION", CONFIG_T_STR, "2024-06-20", 0,
     0, R_PROV | CONFIG_ROLE_CTL | R_A | R_C, 0,
     "provider API version pinned with the Stripe-Version header"},
    /* The fleet's provider budget (docs/architecture.md, "The provider
     * budget"): every process that calls the provider draws from it. */
    {CONFIG_PROVIDER_BUDGET, "PROVIDER_BUDGET", CONFIG_T_INT, "1", 0, 1,
     R_PROV | CONFIG_ROLE_CTL | R_A | R_C, 0,
     "1: provider requests draw from the fleet's budget (chargectl provider limits); "
     "0: this process ignores it (no lease, no wait)"},
    {CONFIG_PROVIDER_BUDGET_ACCOUNT, "PROVIDER_BUDGET_ACCOUNT", CONFIG_T_STR, "default",
     0, 0, R_PROV | CONFIG_ROLE_CTL | R_A | R_C, 0,
     "the provider account whose budget this process draws from"},
    /* Several secrets, so that a rotation loses no delivery: the provider
     * signs with the new one while the old one is still accepted. */
    {CONFIG_WEBHOOK_SIGNING_SECRET, "WEBHOOK_SIGNING_SECRET", CONFIG_T_SECRET, NULL, 0,
     0, CONFIG_ROLE_API, CONFIG_ROLE_API,
     "secret(s) for provider webhook signatures, comma separated; during a "
     "rotation: new,old (required)"},
    {CONFIG_CHARGE_COMMANDS_TOPIC, "CHARGE_COMMANDS_TOPIC", CONFIG_T_TOPIC,
     "payments.charge.commands", 0, 0, R_KAFKA | R_C, 0,
     "input topic of charge commands"},
    {CONFIG_CHARGE_RESULTS_TOPIC, "CHARGE_RESULTS_TOPIC", CONFIG_T_TOPIC,
     "payments.charge.results", 0, 0, CONFIG_ROLE_RELAY, 0,
     "topic the relay publishes every result event to"},
    {CONFIG_CHARGE_DLQ_TOPIC, "CHARGE_DLQ_TOPIC", CONFIG_T_TOPIC,
     "payments.charge.commands.dlq", 0, 0, R_KAFKA | R_C, 0,
     "dead letters of the input topic"},
    {CONFIG_API_ADDR, "API_ADDR", CONFIG_T_ADDR, "127.0.0.1:8080", 0, 0,
     CONFIG_ROLE_API, 0, "listener of charged api, host:port"},
    /* Port 0: one the kernel picks, named in the "admin listener started"
     * log line (tests run many daemons side by side). */
    {CONFIG_ADMIN_ADDR, "ADMIN_ADDR", CONFIG_T_ADDR, "127.0.0.1:9400", 0, 65535,
     R_ALL & ~CONFIG_ROLE_CTL, 0,
     "health, readiness and metrics listener, host:port (port 0: any free one)"},
    {CONFIG_LOG_LEVEL, "LOG_LEVEL", CONFIG_T_LEVEL, "info", 0, 0, R_ALL, 0,
     "debug, info, warn or error"},
    {CONFIG_WORKER_ID, "WORKER_ID", CONFIG_T_STR, NULL, 0, 0, R_ALL, 0,
     "lease owner name, one process's alone (default <hostname>-<pid>-<random>)"},
    /* 1,000: a real provider's 300-1,000 ms at the rate one worker's
     * database path sustains, in about 40 MiB (docs/performance.md). */
    {CONFIG_WORKER_MAX_IN_FLIGHT, "WORKER_MAX_IN_FLIGHT", CONFIG_T_INT, "1000", 1,
     100000, R_W, 0, "attempts in flight at once; fetching stops at this many"},
    {CONFIG_WORKER_LEASE_MS, "WORKER_LEASE_MS", CONFIG_T_INT, "120000", 1000, 86400000,
     R_PROV, 0, "claim lease; must outlast the provider timeout and its retries"},
    {CONFIG_WORKER_UNKNOWN_RETRIES, "WORKER_UNKNOWN_RETRIES", CONFIG_T_INT, "3", 0, 100,
     R_PROV, 0, "retries with the same key of an unknown provider answer"},
    {CONFIG_WORKER_RETRY_BASE_MS, "WORKER_RETRY_BASE_MS", CONFIG_T_INT, "200", 1,
     600000, R_PROV, 0, "first back-off before a retry with the same key"},
    {CONFIG_WORKER_RETRY_MAX_MS, "WORKER_RETRY_MAX_MS", CONFIG_T_INT, "10000", 1,
     3600000, R_PROV, 0, "back-off cap"},
    {CONFIG_WORKER_KEY_RETENTION_MS, "WORKER_KEY_RETENTION_MS", CONFIG_T_INT,
     "86400000", 1000, 31536000000LL, R_PROV | CONFIG_ROLE_CTL | R_C, 0,
     "how long the provider keeps an idempotency key; no re-POST after it"},
    {CONFIG_WORKER_COMMIT_INTERVAL_MS, "WORKER_COMMIT_INTERVAL_MS", CONFIG_T_INT,
     "1000", 10, 60000, R_W, 0, "how often finished offsets are committed"},
    {CONFIG_WORKER_RECHECK_MS, "WORKER_RECHECK_MS", CONFIG_T_INT, "500", 10, 60000, R_W,
     0, "how often attempts leased by a peer are looked at again"},
    {CONFIG_WORKER_BATCH_HOLD_MS, "WORKER_BATCH_HOLD_MS", CONFIG_T_INT, "10", 0, 100,
     R_W, 0, "the longest a ready item waits to share a statement; 0: none waits"},
    {CONFIG_WORKER_MAX_COMMAND_BYTES, "WORKER_MAX_COMMAND_BYTES", CONFIG_T_INT, "65536",
     256, 16777216, R_W, 0, "larger command values are dead letters"},
    {CONFIG_WORKER_MAX_AMOUNT, "WORKER_MAX_AMOUNT", CONFIG_T_INT, "100000000000", 1,
     100000000000LL, R_W, 0, "amounts above this (minor units) are dead letters"},
    {CONFIG_WORKER_ALLOWED_CURRENCIES, "WORKER_ALLOWED_CURRENCIES", CONFIG_T_STR, "", 0,
     0, R_W, 0, "comma-separated allow-list of currencies; empty allows all"},
    /* A rate over a window, not a streak: under partial degradation (one call
     * in five failing, each retry getting through) a streak opened it again
     * and again, and throughput fell thirty-fold. */
    {CONFIG_PROVIDER_BREAKER_FAILURE_RATE, "PROVIDER_BREAKER_FAILURE_RATE",
     CONFIG_T_INT, "50", 0, 100, R_W, 0,
     "percent of provider calls failing (429, 5xx, no answer) over "
     "PROVIDER_BREAKER_WINDOW_MS that opens the breaker; 0: never"},
    {CONFIG_PROVIDER_BREAKER_MIN_CALLS, "PROVIDER_BREAKER_MIN_CALLS", CONFIG_T_INT,
     "50", 2, 100000, R_W, 0,
     "provider calls in the window before the failure rate is judged"},
    {CONFIG_PROVIDER_BREAKER_WINDOW_MS, "PROVIDER_BREAKER_WINDOW_MS", CONFIG_T_INT,
     "30000", 100, 3600000, R_W, 0, "the window the failure rate is taken over, in ms"},
    {CONFIG_PROVIDER_BREAKER_OPEN_MS, "PROVIDER_BREAKER_OPEN_MS", CONFIG_T_INT, "5000",
     10, 3600000, R_W, 0, "how long an open breaker waits before probing the provider"},
    {CONFIG_PROVIDER_BREAKER_PROBES, "PROVIDER_BREAKER_PROBES", CONFIG_T_INT, "3", 1,
     100, R_W, 0,
     "probes, one at a time, the provider must answer in a row to close it"},
    /* Set by Kubernetes' downward API; a stable name across restarts. */
    {CONFIG_POD_NAME, "POD_NAME", CONFIG_T_STR, NULL, 0, 0, R_W, 0,
     "the consumer's group.instance.id (static membership) unless "
     "KAFKA_GROUP_INSTANCE_ID is set"},
    {CONFIG_SHUTDOWN_TIMEOUT_MS, "SHUTDOWN_TIMEOUT_MS", CONFIG_T_INT, "30000", 0,
     3600000, R_ALL & ~CONFIG_ROLE_CTL, 0,
     "time to drain and commit after SIGTERM; a second SIGTERM exits at once"},
    {CONFIG_HEALTH_STALL_MS, "HEALTH_STALL_MS", CONFIG_T_INT, "30000", 1000, 3600000,
     R_ALL & ~CONFIG_ROLE_CTL, 0,
     "/healthz answers 503 once the loop has not turned for this long"},
    {CONFIG_REBALANCE_DRAIN_MS, "REBALANCE_DRAIN_MS", CONFIG_T_INT, "10000", 0, 600000,
     R_W, 0, "time to drain revoked partitions before giving them up"},
    {CONFIG_RECONCILER_BATCH, "RECONCILER_BATCH", CONFIG_T_INT, "16", 1, 1000, R_R, 0,
     "attempts claimed for a look at once"},
    {CONFIG_RECONCILER_FIRST_LOOK_MS, "RECONCILER_FIRST_LOOK_MS", CONFIG_T_INT, "30000",
     0, 86400000, R_W | R_R, 0,
     "an unknown or provider-processing outcome waits this long for a first look"},
    {CONFIG_RECONCILER_LEASE_MS, "RECONCILER_LEASE_MS", CONFIG_T_INT, "120000", 1000,
     86400000, R_R, 0, "claim lease of a look; renewed while a batch is worked on"},
    {CONFIG_RECONCILER_POLL_MS, "RECONCILER_POLL_MS", CONFIG_T_INT, "1000", 10, 600000,
     R_R, 0, "how often the queue is read when nothing was due"},
    {CONFIG_RECONCILER_SCHEDULE_MS, "RECONCILER_SCHEDULE_MS", CONFIG_T_STR,
     "60000,300000,900000,3600000,21600000,86400000", 0, 0, R_R, 0,
     "back-off between looks at one attempt, in ms; the last repeats"},
    {CONFIG_RECONCILER_MAX_AGE_MS, "RECONCILER_MAX_AGE_MS", CONFIG_T_INT, "604800000",
     1000, 31536000000LL, R_R, 0,
     "an attempt still unsettled this long after it was recorded goes to review"},
    {CONFIG_RECONCILER_SEARCH_LAG_MS, "RECONCILER_SEARCH_LAG_MS", CONFIG_T_INT, "60000",
     0, 86400000, R_R | R_C, 0,
     "how far the provider's search may lag; 'not found' counts only after it"},
    {CONFIG_RECONCILER_STALE_LEASE_MS, "RECONCILER_STALE_LEASE_MS", CONFIG_T_INT,
     "300000", 0, 86400000, R_R, 0,
     "a worker's expired lease this old means no worker came back: look"},
    /* The operations' own settings come after the table's rows
     * (config_add_settings). */
    {CONFIG_RELAY_BATCH, "RELAY_BATCH", CONFIG_T_INT, "500", 1, 100000,
     CONFIG_ROLE_RELAY, 0, "result events published at once"},
    {CONFIG_RELAY_POLL_MS, "RELAY_POLL_MS", CONFIG_T_INT, "200", 10, 600000,
     CONFIG_ROLE_RELAY, 0,
     "how often the outbox is read when idle, and a standby tries to lead"},
    {CONFIG_RELAY_RETENTION_MS, "RELAY_RETENTION_MS", CONFIG_T_INT, "604800000", 0,
     31536000000LL, CONFIG_ROLE_RELAY, 0, "published rows are deleted after this"},
    {CONFIG_RELAY_BACKLOG_LOG_MS, "RELAY_BACKLOG_LOG_MS", CONFIG_T_INT, "10000", 100,
     3600000, CONFIG_ROLE_RELAY, 0, "how often the backlog is logged (and purged)"},
    {CONFIG_RELAY_ACK_TIMEOUT_MS, "RELAY_ACK_TIMEOUT_MS", CONFIG_T_INT, "30000", 100,
     600000, CONFIG_ROLE_RELAY, 0,
     "how long a batch waits for the broker's acknowledgements; what is not "
     "acknowledged by then is published again"},
    {CONFIG_API_THREADS, "API_THREADS", CONFIG_T_INT, "4", 1, 64, CONFIG_ROLE_API, 0,
     "requests served at once (one database connection each)"},
    {CONFIG_API_MAX_BODY_BYTES, "API_MAX_BODY_BYTES", CONFIG_T_INT, "65536", 1024,
     10485760, CONFIG_ROLE_API, 0, "largest webhook body accepted; larger gets 413"},
    {CONFIG_API_MAX_CONNECTIONS, "API_MAX_CONNECTIONS", CONFIG_T_INT, "1024", 16, 65536,
     CONFIG_ROLE_API, 0, "connections held open at once"},
    /* A proxy in front carries many clients on its own address: raise it
     * (0: no limit) when the api sits behind one. */
    {CONFIG_API_MAX_CONNECTIONS_PER_IP, "API_MAX_CONNECTIONS_PER_IP", CONFIG_T_INT,
     "64", 0, 65536, CONFIG_ROLE_API, 0,
     "connections one client address may hold (0: no limit)"},
    /* Whole seconds: the provider's list takes its creation times in them. */
    {CONFIG_AUDITOR_WINDOW_MS, "AUDITOR_WINDOW_MS", CONFIG_T_INT, "3600000", 1000,
     86400000, R_A, 0, "length of one audited window of creation time (whole seconds)"},
    /* The provider lists an object some time after making it, and a ledger
     * row is stamped when its transaction began: a window is audited only
     * once both have surely arrived. */
    {CONFIG_AUDITOR_LAG_MS, "AUDITOR_LAG_MS", CONFIG_T_INT, "900000", 0, 604800000LL,
     R_A, 0, "a window is audited once it ended this long ago (provider listing lag)"},
    {CONFIG_AUDITOR_POLL_MS, "AUDITOR_POLL_MS", CONFIG_T_INT, "60000", 100, 3600000,
     R_A, 0, "how often a due window and pending objects are looked for"},
    {CONFIG_AUDITOR_FROM, "AUDITOR_FROM", CONFIG_T_INT, "0", 0, 32503680000LL, R_A, 0,
     "unix seconds where the first window starts (0: the first attempt recorded)"},
    {CONFIG_AUDITOR_PENDING_BATCH, "AUDITOR_PENDING_BATCH", CONFIG_T_INT, "100", 1,
     10000, R_A, 0, "objects not judged yet looked at again per cycle"},
    /* Its own listener, apart from the api's: the api faces the provider,
     * the console only operators, who may keep it internal. */
    {CONFIG_CONSOLE_ADDR, "CONSOLE_ADDR", CONFIG_T_ADDR, "127.0.0.1:8090", 0, 65535,
     R_C, 0, "listener of charged console, host:port (port 0: any free one)"},
    /* At least 2: dead-letter reads (Kafka's timeouts) take at most half. */
    {CONFIG_CONSOLE_THREADS, "CONSOLE_THREADS", CONFIG_T_INT, "4", 2, 64, R_C, 0,
     "requests answered at once (2 or more: half at most read Kafka)"},
    {CONFIG_CONSOLE_SESSION_TTL_S, "CONSOLE_SESSION_TTL_S", CONFIG_T_INT, "28800", 60,
     604800, R_C, 0, "a sign-in lasts this many seconds"},
    /* 0 only behind nothing but plain HTTP on loopback: a Secure cookie is
     * never sent over plain HTTP to another host. */
    {CONFIG_CONSOLE_COOKIE_SECURE, "CONSOLE_COOKIE_SECURE", CONFIG_T_INT, "1", 0, 1,
     R_C, 0, "1: the session cookie is Secure (HTTPS only); 0: plain HTTP too"},
    {CONFIG_CONSOLE_WORKER_GROUP, "CONSOLE_WORKER_GROUP", CONFIG_T_STR,
     "charged-worker", 0, 0, R_C, 0, "the workers' consumer group, for its lag"},
    {CONFIG_CONSOLE_WORKER_METRICS, "CONSOLE_WORKER_METRICS", CONFIG_T_STR, NULL, 0, 0,
     R_C, 0, "the workers' /metrics URLs, comma separated, for their breakers"},
};

struct config_kafka_prop {
    char *prop;
    char *value;
};

/* The settings the operations added (config_add_settings), after the
 * table's rows: set once, before any config is read. */
static const struct config_setting *added[CONFIG_SETTINGS_MAX];
static size_t nadded;

struct config {
    char *values[CONFIG__COUNT]; /* as given, or the default */
    long long ints[CONFIG__COUNT];
    long long added_ints[CONFIG_SETTINGS_MAX]; /* added[i]'s */
    struct config_kafka_prop *kafka;
    size_t kafka_count;
};

static char *read_secret_file(const char *path, struct charged_error *err,
                              const char *var)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    size_t len = 0, cap = 0;

    if (!f) {
        charged_error_set(err, "%s: cannot open '%s': %s", var, path, strerror(errno));
        return NULL;
    }
    for (;;) {
        if (len + 4096 + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 8192;
            char *n = realloc(buf, ncap);
            if (!n)
                goto fail;
            buf = n;
            cap = ncap;
        }
        size_t got = fread(buf + len, 1, 4096, f);
        len += got;
        if (got < 4096)
            break;
        if (len > 1024 * 1024) {
            charged_error_set(err, "%s: '%s' is larger than 1 MiB", var, path);
            goto fail_quiet;
        }
    }
    if (ferror(f))
        goto fail;
    fclose(f);
    /* Files written by editors and secret stores end in a newline. */
    while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == '\r'))
        len--;
    buf[len] = '\0';
    return buf;
fail:
    charged_error_set(err, "%s: cannot read '%s'", var, path);
fail_quiet:
    free(buf);
    fclose(f);
    return NULL;
}

/* Value of `name`, or of the file named by `name`_FILE. *out is NULL when
 * neither is set. CHARGED_GIVE_UP with err on a bad setting. */
static enum charged_rc lookup(const char *name, char **out, struct charged_error *err)
{
    char file_var[128];
    const char *direct = getenv(name);
    const char *file;

    *out = NULL;
    snprintf(file_var, sizeof(file_var), "%s_FILE", name);
    file = getenv(file_var);
    if (direct && file) {
        charged_error_set(err, "%s: set either %s or %s, not both", name, name,
                          file_var);
        return CHARGED_GIVE_UP;
    }
    if (file) {
        *out = read_secret_file(file, err, file_var);
        return *out ? CHARGED_OK : CHARGED_GIVE_UP;
    }
    if (direct) {
        *out = strdup(direct);
        if (!*out) {
            charged_error_set(err, "%s: out of memory", name);
            return CHARGED_GIVE_UP;
        }
    }
    return CHARGED_OK;
}

static int parse_int(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end != '\0' || isspace((unsigned char)*s))
        return -1;
    *out = v;
    return 0;
}

/* host:port with the port in [min_port, 65535]. */
static int valid_addr(const char *s, long long min_port)
{
    const char *colon = strrchr(s, ':');
    long long port;
    if (!colon || colon == s)
        return 0;
    if (parse_int(colon + 1, &port) != 0)
        return 0;
    return port >= min_port && port <= 65535;
}

static int valid_topic(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 249 || !strcmp(s, ".") || !strcmp(s, ".."))
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != '-')
            return 0;
    }
    return 1;
}

static enum charged_rc validate(const struct config_row *row, const char *v,
                                long long *iv, struct charged_error *err)
{
    switch (row->type) {
    case CONFIG_T_STR:
    case CONFIG_T_SECRET:
        return CHARGED_OK;
    case CONFIG_T_INT:
        if (parse_int(v, iv) != 0) {
            charged_error_set(err, "%s: '%s' is not an integer", row->name, v);
            return CHARGED_GIVE_UP;
        }
        if (*iv < row->min || *iv > row->max) {
            charged_error_set(err, "%s: %lld is outside %lld..%lld", row->name, *iv,
                              row->min, row->max);
            return CHARGED_GIVE_UP;
        }
        return CHARGED_OK;
    case CONFIG_T_ADDR:
        /* An address row's max says whether port 0 is allowed (min 0). */
        if (!valid_addr(v, row->max ? row->min : 1)) {
            charged_error_set(err, "%s: '%s' is not host:port", row->name, v);
            return CHARGED_GIVE_UP;
        }
        return CHARGED_OK;
    case CONFIG_T_LEVEL:
        if (log_level_parse(v) < 0) {
            charged_error_set(err, "%s: '%s' is not one of debug, info, warn, error",
                              row->name, v);
            return CHARGED_GIVE_UP;
        }
        return CHARGED_OK;
    case CONFIG_T_TOPIC:
        if (!valid_topic(v)) {
            charged_error_set(err, "%s: '%s' is not a valid topic name", row->name, v);
            return CHARGED_GIVE_UP;
        }
        return CHARGED_OK;
    }
    return CHARGED_GIVE_UP;
}

/* Settings the table owns are not passed through as librdkafka properties. */
static int is_table_name(const char *name)
{
    for (size_t i = 0; i < CONFIG__COUNT; i++)
        if (!strcmp(config_table[i].name, name))
            return 1;
    for (size_t i = 0; i < nadded; i++)
        if (!strcmp(added[i]->name, name))
            return 1;
    return 0;
}

/* An added setting as a row of the table, for validate and --help. */
static struct config_row added_row(const struct config_setting *s)
{
    CHARGED_ASSERT(s && s->name && s->def && s->help && s->min <= s->max);
    return (struct config_row){CONFIG__COUNT, s->name, CONFIG_T_INT,
                               s->def,        s->min,  s->max,
                               s->roles,      0,       s->help};
}

/* The added settings' values into cfg. */
static enum charged_rc load_added(config_t *cfg, struct charged_error *err)
{
    for (size_t i = 0; i < nadded; i++) {
        const struct config_row row = added_row(added[i]);
        char *v = NULL;
        if (lookup(row.name, &v, err) != 0)
            return CHARGED_GIVE_UP;
        int bad = validate(&row, v ? v : row.def, &cfg->added_ints[i], err) != 0;
        free(v);
        if (bad)
            return CHARGED_GIVE_UP;
    }
    return CHARGED_OK;
}

int config_add_settings(const struct config_setting *const *s, size_t n)
{
    CHARGED_ASSERT(s || n == 0);
    if (n > CONFIG_SETTINGS_MAX - nadded)
        return -1;
    for (size_t i = 0; i < n; i++)
        added[nadded++] = s[i];
    return 0;
}

long long config_setting_int(const config_t *cfg, const struct config_setting *s)
{
    CHARGED_ASSERT(cfg && s);
    for (size_t i = 0; i < nadded; i++)
        if (added[i] == s)
            return cfg->added_ints[i];
    /* Read only once added: the program added its operations' settings. */
    CHARGED_ASSERT(!"a setting that was not added");
    return 0;
}

/* librdkafka properties that hold credentials. */
static int is_secret_prop(const char *prop)
{
    return strstr(prop, "password") || strstr(prop, "secret") || strstr(prop, "jaas") ||
           strstr(prop, "ssl.key.pem") || strstr(prop, "oauthbearer.config");
}

static enum charged_rc load_kafka_props(config_t *cfg, struct charged_error *err)
{
    /* Made for the first pass-through property only: a conf is hundreds of
     * defaults, and most environments pass none. */
    rd_kafka_conf_t *probe = NULL;
    enum charged_rc rc = CHARGED_GIVE_UP;

    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        char name[256], prop[256], rderr[256];
        size_t nlen;
        char *value = NULL;

        if (strncmp(*e, "KAFKA_", 6) != 0 || !eq)
            continue;
        nlen = (size_t)(eq - *e);
        if (nlen >= sizeof(name))
            continue;
        memcpy(name, *e, nlen);
        name[nlen] = '\0';
        /* NAME_FILE is read under NAME. */
        if (nlen > 5 && !strcmp(name + nlen - 5, "_FILE")) {
            name[nlen - 5] = '\0';
            if (getenv(name))
                continue; /* lookup() reports the clash below */
        }
        if (is_table_name(name) || strlen(name) == 6)
            continue;
        for (size_t i = 6, j = 0;; i++, j++) {
            char c = name[i];
            prop[j] = c == '_' ? '.' : (char)tolower((unsigned char)c);
            if (!c)
                break;
        }
        if (lookup(name, &value, err) != 0)
            goto out;
        if (!value) /* duplicate of a _FILE we already took */
            continue;
        for (size_t i = 0; i < cfg->kafka_count; i++) {
            if (!strcmp(cfg->kafka[i].prop, prop)) {
                free(value);
                value = NULL;
                break;
            }
        }
        if (!value)
            continue;
        /* A TLS file that cannot be read: librdkafka would say only
         * "ssl.ca.location failed: ... system lib". ("probe": the system's.) */
        size_t plen = strlen(prop);
        if (plen > 9 && !strcmp(prop + plen - 9, ".location") &&
            !is_secret_prop(prop) && strcmp(value, "probe") != 0 &&
            access(value, R_OK) != 0) {
            charged_error_set(err, "%s: cannot read '%s': %s", name, value,
                              strerror(errno));
            free(value);
            goto out;
        }
        if (!probe && !(probe = rd_kafka_conf_new())) {
            free(value);
            charged_error_set(err, "%s: out of memory", name);
            goto out;
        }
        if (rd_kafka_conf_set(probe, prop, value, rderr, sizeof(rderr)) !=
            RD_KAFKA_CONF_OK) {
            /* An old library refuses properties it predates: say why. */
            if (config_librdkafka_too_old(err)) {
                free(value);
                goto out;
            }
            /* librdkafka's message may quote the value; never echo a secret. */
            if (is_secret_prop(prop))
                charged_error_set(err, "%s: librdkafka refused property '%s'", name,
                                  prop);
            else
                charged_error_set(err, "%s: %s", name, rderr);
            free(value);
            goto out;
        }
        struct config_kafka_prop *n =
            realloc(cfg->kafka, (cfg->kafka_count + 1) * sizeof(*n));
        if (!n) {
            free(value);
            charged_error_set(err, "%s: out of memory", name);
            goto out;
        }
        cfg->kafka = n;
        n[cfg->kafka_count].prop = strdup(prop);
        n[cfg->kafka_count].value = value;
        if (!n[cfg->kafka_count].prop) {
            free(value);
            charged_error_set(err, "%s: out of memory", name);
            goto out;
        }
        cfg->kafka_count++;
        if (is_secret_prop(prop) && log_add_secret(value) != 0) {
            charged_error_set(err, "%s: out of memory", name);
            goto out;
        }
    }
    rc = CHARGED_OK;
out:
    if (probe)
        rd_kafka_conf_destroy(probe);
    return rc;
}

/* A libpq error can quote the password alone (a bad %-escape in it, say):
 * the whole URL being secret is not enough, so its password is too. 0 / -1
 * out of memory. */
static int add_password_secret(const char *database_url)
{
    int rc = 0;
    PQconninfoOption *opts = PQconninfoParse(database_url, NULL);
    for (PQconninfoOption *o = opts; o && o->keyword; o++)
        if (!strcmp(o->keyword, "password") && o->val && o->val[0])
            rc = log_add_secret(o->val);
    PQconninfoFree(opts);
    return rc;
}

config_t *config_new(unsigned roles, const char *role_name, struct charged_error *err)
{
    config_t *cfg = calloc(1, sizeof(*cfg));
    if (!cfg) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    for (size_t i = 0; i < CONFIG__COUNT; i++) {
        const struct config_row *row = &config_table[i];
        char *v = NULL;

        if (row->key != (enum config_key)i) {
            charged_error_set(err, "config table out of order at %s", row->name);
            goto fail;
        }
        if (lookup(row->name, &v, err) != 0)
            goto fail;
        if (!v && row->def)
            v = strdup(row->def);
        if (!v && row->key == CONFIG_KAFKA_GROUP_ID) {
            char def[128];
            snprintf(def, sizeof(def), "charged-%s", role_name ? role_name : "worker");
            v = strdup(def);
        }
        if (!v) {
            if (row->required & roles) {
                charged_error_set(err, "%s: required but not set", row->name);
                goto fail;
            }
            continue;
        }
        cfg->values[i] = v;
        /* A secret that could not be registered could be printed. */
        if ((row->type == CONFIG_T_SECRET && v[0] && log_add_secret(v) != 0) ||
            (row->key == CONFIG_DATABASE_URL && add_password_secret(v) != 0)) {
            charged_error_set(err, "%s: out of memory", row->name);
            goto fail;
        }
        if (validate(row, v, &cfg->ints[i], err) != 0)
            goto fail;
    }
    if (load_added(cfg, err) != CHARGED_OK || load_kafka_props(cfg, err) != 0)
        goto fail;
    return cfg;
fail:
    config_free(cfg);
    return NULL;
}

void config_free(config_t *cfg)
{
    if (!cfg)
        return;
    for (size_t i = 0; i < CONFIG__COUNT; i++)
        free(cfg->values[i]);
    for (size_t i = 0; i < cfg->kafka_count; i++) {
        free(cfg->kafka[i].prop);
        free(cfg->kafka[i].value);
    }
    free(cfg->kafka);
    free(cfg);
}

const char *config_str(const config_t *cfg, enum config_key key)
{
    return cfg->values[key];
}

long long config_int(const config_t *cfg, enum config_key key)
{
    return cfg->ints[key];
}

const char *config_name(enum config_key key)
{
    return config_table[key].name;
}

size_t config_kafka_count(const config_t *cfg)
{
    return cfg->kafka_count;
}

void config_kafka_get(const config_t *cfg, size_t i, const char **prop,
                      const char **value)
{
    *prop = cfg->kafka[i].prop;
    *value = cfg->kafka[i].value;
}

static void print_row(FILE *out, const struct config_row *row)
{
    fprintf(out, "  %-28s %s", row->name, row->help);
    if (row->def && row->def[0])
        fprintf(out, " [default: %s]", row->def);
    fputc('\n', out);
}

void config_print_help(FILE *out, unsigned roles)
{
    fprintf(out, "Environment (NAME_FILE reads NAME from a file; any other "
                 "KAFKA_<PROP> goes to librdkafka as <prop>):\n");
    for (size_t i = 0; i < CONFIG__COUNT; i++) {
        const struct config_row *row = &config_table[i];
        if (!(row->roles & roles))
            continue;
        print_row(out, row);
    }
    for (size_t i = 0; i < nadded; i++) {
        const struct config_row row = added_row(added[i]);
        if (row.roles & roles)
            print_row(out, &row);
    }
}

int config_librdkafka_too_old(struct charged_error *err)
{
    if (rd_kafka_version() >= 0x020a00ff) /* 2.10.0, released */
        return 0;
    charged_error_set(
        err,
        "librdkafka %s is loaded; charged needs 2.10 or newer (Kafka 4.x, "
        "cooperative rebalance fixes): see deploy/librdkafka/build.sh",
        rd_kafka_version_str());
    return 1;
}
