#include "daemon.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "admin_http.h"
#include "clock.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"
#include "store.h"

static volatile sig_atomic_t stop_signals, failing;
static long long watchdog_limit_ms;

/* What the admin listener reads, from its own thread. */
static _Atomic int64_t last_turn_ms;
static long long health_stall_ms = 30000;
static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;
static int ready_now;
static char ready_why[160] = "starting";

static void on_signal(int sig)
{
    (void)sig;
    stop_signals++;
}

void daemon_init(void)
{
    struct sigaction act;
    memset(&act, 0, sizeof(act));
    act.sa_handler = on_signal;
    sigemptyset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int daemon_stopping(void)
{
    return stop_signals ? stop_signals : failing;
}

void daemon_fail(const char *why)
{
    log_error(why, NULL);
    failing = 1;
}

void daemon_heartbeat(void)
{
    atomic_store(&last_turn_ms, clock_now_ms());
}

void daemon_set_ready(int ready, const char *why_not)
{
    char why[sizeof(ready_why)];
    snprintf(why, sizeof(why), "%s",
             ready                   ? ""
             : why_not && why_not[0] ? why_not
                                     : "not ready");
    pthread_mutex_lock(&ready_lock);
    int changed = !!ready != ready_now || strcmp(why, ready_why) != 0;
    ready_now = !!ready;
    memcpy(ready_why, why, sizeof(why));
    pthread_mutex_unlock(&ready_lock);
    if (changed)
        log_info(ready ? "ready" : "not ready", "why", ready ? NULL : why, NULL);
}

/* 1 and why when the loop has not turned for longer than HEALTH_STALL_MS. */
static int stalled(char *why, size_t why_size)
{
    int64_t age = clock_now_ms() - atomic_load(&last_turn_ms);
    if (age <= health_stall_ms)
        return 0;
    snprintf(why, why_size, "stalled: the loop has not turned for %lld ms",
             (long long)age);
    return 1;
}

/* Live while the loop turns. Draining counts as live: the watchdog bounds
 * the drain, and a liveness kill would only cut it short. */
static int probe_health(void *arg, char *why, size_t why_size)
{
    (void)arg;
    if (daemon_stopping()) {
        snprintf(why, why_size, "ok: draining");
        return 1;
    }
    return !stalled(why, why_size);
}

static int probe_ready(void *arg, char *why, size_t why_size)
{
    (void)arg;
    if (daemon_stopping()) {
        snprintf(why, why_size, "not ready: draining");
        return 0;
    }
    if (stalled(why, why_size))
        return 0;
    pthread_mutex_lock(&ready_lock);
    int ready = ready_now;
    if (!ready)
        snprintf(why, why_size, "not ready: %s", ready_why);
    pthread_mutex_unlock(&ready_lock);
    return ready;
}

/* charged_ready says what /readyz would answer at the scrape. */
static void on_scrape(void *arg)
{
    char why[200];
    metrics_set(METRIC_READY, probe_ready(arg, why, sizeof(why)));
}

static volatile sig_atomic_t said;

static void *say(void *msg)
{
    log_warn(msg, NULL);
    said = 1;
    return NULL;
}

/* Logs why from another thread and exits within 100 ms whether or not the
 * line could be written: logging takes a lock that a thread blocked on a
 * full stderr may hold. */
static void exit_now(const char *why)
{
    pthread_t t;
    if (pthread_create(&t, NULL, say, (void *)why) == 0) {
        pthread_detach(t);
        for (int i = 0; i < 20 && !said; i++) {
            struct timespec ts = {0, 5 * 1000000L};
            nanosleep(&ts, NULL);
        }
    }
    _exit(1);
}

/* Bounds the whole shutdown, whatever the loop is blocked in (a database
 * call, librdkafka's close or destroy, a blocked stderr). */
static void *watchdog(void *arg)
{
    /* exit_now takes up to 100 ms of the budget. */
    const long long limit_ms =
        watchdog_limit_ms > 200 ? watchdog_limit_ms - 100 : watchdog_limit_ms;
    int64_t first = -1;
    (void)arg;
    for (;;) {
        struct timespec ts = {0, 20 * 1000000L};
        nanosleep(&ts, NULL);
        int n = daemon_stopping();
        if (n >= 2)
            exit_now("second signal: exiting at once; uncommitted messages come back");
        if (n == 1 && first < 0)
            first = clock_now_ms();
        if (first >= 0 && clock_now_ms() - first >= limit_ms)
            exit_now(
                "shutdown timeout passed: exiting; uncommitted messages come back");
    }
    return NULL;
}

int daemon_db_due(const struct daemon_db *db)
{
    return clock_now_ms() >= db->retry_at;
}

void daemon_db_ok(struct daemon_db *db)
{
    db->backoff_ms = 0;
    db->reached = 1;
    db->last_ok_ms = clock_now_ms();
}

void daemon_db_reached(struct daemon_db *db)
{
    db->reached = 1;
    db->last_ok_ms = clock_now_ms();
}

int64_t daemon_db_failed(struct daemon_db *db, const char *stage, const char *err)
{
    char ms[32];
    db->backoff_ms = db->backoff_ms ? db->backoff_ms * 2 : 250;
    if (db->backoff_ms > 5000)
        db->backoff_ms = 5000;
    db->reached = 0;
    snprintf(ms, sizeof(ms), "%lld", (long long)db->backoff_ms);
    char label[64];
    snprintf(label, sizeof(label), "%s", stage);
    for (char *c = label; *c; c++)
        if (*c == ' ')
            *c = '_'; /* "renew leases": renew_leases, as labels are written */
    metrics_add(METRIC_DATABASE_FAILURES, 1, label);
    log_error("database step failed; will retry", "stage", stage, "error", err,
              "retry_in_ms", ms, NULL);
    db->retry_at = clock_now_ms() + db->backoff_ms;
    return db->retry_at;
}

const char *daemon_db_not_ready(const struct daemon_db *db)
{
    if (db->reached)
        return NULL;
    return db->backoff_ms ? "database unreachable" : "database not reached yet";
}

static int start_watchdog(long long shutdown_ms, char *errbuf, size_t errbuf_size)
{
    static int started;
    pthread_t t;
    if (started)
        return 0;
    watchdog_limit_ms = shutdown_ms;
    if (pthread_create(&t, NULL, watchdog, NULL) != 0) {
        snprintf(errbuf, errbuf_size, "cannot start the shutdown watchdog");
        return -1;
    }
    pthread_detach(t);
    started = 1;
    return 0;
}

/* The admin listener on ADMIN_ADDR. Its address, with the kernel's port
 * for port 0, goes to `bound`, for the log line that names it (written once
 * the role started, so that a bad setting found by start() stays the one
 * line on stderr). Returns an admin_http_rc. */
static int start_admin(const config_t *cfg, admin_http_t **admin, char *bound,
                       size_t bound_size, char *err, size_t err_size)
{
    static const struct admin_http_handlers handlers = {probe_health, probe_ready,
                                                        on_scrape, NULL};
    const char *addr = config_str(cfg, CONFIG_ADMIN_ADDR);

    health_stall_ms = config_int(cfg, CONFIG_HEALTH_STALL_MS);
    daemon_heartbeat();
    int rc = admin_http_start(addr, &handlers, admin, err, err_size);
    if (rc != ADMIN_HTTP_OK)
        return rc;
    snprintf(bound, bound_size, "%.*s:%d", (int)(strrchr(addr, ':') - addr), addr,
             admin_http_port(*admin));
    return ADMIN_HTTP_OK;
}

int daemon_main(int argc, char **argv, const struct daemon_program *program)
{
    char err[512] = "", id[160], logname[64];
    struct daemon_role role;

    if (argc > 1) {
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
            program->usage(stdout);
            return 0;
        }
        fprintf(stderr, "charged %s: unexpected argument '%s'\n", program->name,
                argv[1]);
        return 2;
    }
    config_t *cfg = config_new(program->config_role, program->name, err, sizeof(err));
    if (!cfg) {
        fprintf(stderr, "charged %s: %s\n", program->name, err);
        return 2;
    }
    snprintf(logname, sizeof(logname), "charged-%s", program->name);
    log_init(logname,
             (enum log_level)log_level_parse(config_str(cfg, CONFIG_LOG_LEVEL)));
    kafka_setup_worker_id(cfg, id, sizeof(id));
    long long shutdown_ms = config_int(cfg, CONFIG_SHUTDOWN_TIMEOUT_MS);
    /* The deadline of every statement of the role's stores, before start()
     * makes them. */
    store_set_timeout_ms(config_int(cfg, CONFIG_DATABASE_TIMEOUT_MS));
    daemon_init();
    /* Before anything can block (connecting, librdkafka's first log lines
     * on a full stderr): a signal during start-up is bounded too. */
    if (start_watchdog(shutdown_ms, err, sizeof(err)) != 0) {
        fprintf(stderr, "charged %s: %s\n", program->name, err);
        config_free(cfg);
        return 1;
    }
    admin_http_t *admin = NULL;
    char bound[300], port[16];
    int arc = start_admin(cfg, &admin, bound, sizeof(bound), err, sizeof(err));
    if (arc != ADMIN_HTTP_OK) {
        fprintf(stderr, "charged %s: %s\n", program->name, err);
        config_free(cfg);
        return arc == ADMIN_HTTP_BAD_ADDRESS ? 2 : 1;
    }
    int rc = program->start(cfg, id, &role, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "charged %s: %s\n", program->name, err);
        admin_http_free(admin);
        return rc;
    }
    snprintf(port, sizeof(port), "%d", admin_http_port(admin));
    log_info("admin listener started", "role", program->name, "addr", bound, "port",
             port, NULL);
    /* librdkafka may write into err on success: it must not be printed as
     * the reason of a later exit. */
    err[0] = '\0';
    rc = daemon_run(&role, shutdown_ms, err, sizeof(err));
    if (rc != 0 && err[0])
        fprintf(stderr, "charged %s: %s\n", program->name, err);
    admin_http_free(admin);
    return rc;
}

int daemon_run(const struct daemon_role *role, long long shutdown_ms, char *errbuf,
               size_t errbuf_size)
{
    if (start_watchdog(shutdown_ms, errbuf, errbuf_size) != 0)
        return 1;

    while (!daemon_stopping()) {
        daemon_heartbeat();
        role->step(role->state);
    }

    int64_t stopping_at = clock_now_ms();
    long long reserve = shutdown_ms / 4 < 2000 ? shutdown_ms / 4 : 2000;
    log_info("stopping: draining in-flight work", "role", role->name, NULL);
    size_t left = role->drain(role->state, stopping_at + shutdown_ms - reserve);
    int64_t rest = stopping_at + shutdown_ms - clock_now_ms();
    role->finish(role->state, rest > 1000 ? 1000 : rest > 0 ? (int)rest : 0);
    char n[32];
    snprintf(n, sizeof(n), "%zu", left);
    log_info("stopped", "role", role->name, "unfinished", n, NULL);
    return left || failing ? 1 : 0;
}
