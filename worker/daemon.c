#include "daemon.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "kafka_setup.h"
#include "log.h"

static volatile sig_atomic_t stop_signals, failing;
static long long watchdog_limit_ms;

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

int64_t daemon_backoff_failed(struct daemon_backoff *b, const char *stage,
                              const char *err)
{
    char ms[32];
    b->ms = b->ms ? b->ms * 2 : 250;
    if (b->ms > 5000)
        b->ms = 5000;
    snprintf(ms, sizeof(ms), "%lld", (long long)b->ms);
    log_error("database step failed; will retry", "stage", stage, "error", err,
              "retry_in_ms", ms, NULL);
    return clock_now_ms() + b->ms;
}

void daemon_backoff_reset(struct daemon_backoff *b)
{
    b->ms = 0;
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
    daemon_init();
    /* Before anything can block (connecting, librdkafka's first log lines
     * on a full stderr): a signal during start-up is bounded too. */
    if (start_watchdog(shutdown_ms, err, sizeof(err)) != 0) {
        fprintf(stderr, "charged %s: %s\n", program->name, err);
        config_free(cfg);
        return 1;
    }
    int rc = program->start(cfg, id, &role, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "charged %s: %s\n", program->name, err);
        return rc;
    }
    rc = daemon_run(&role, shutdown_ms, err, sizeof(err));
    if (rc != 0 && err[0])
        fprintf(stderr, "charged %s: %s\n", program->name, err);
    return rc;
}

int daemon_run(const struct daemon_role *role, long long shutdown_ms, char *errbuf,
               size_t errbuf_size)
{
    if (start_watchdog(shutdown_ms, errbuf, errbuf_size) != 0)
        return 1;

    while (!daemon_stopping())
        role->step(role->state);

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
