#include "daemon.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "admin_http.h"
#include "charged_assert.h"
#include "clock.h"
#include "daemon_policy.h"
#include "kafka_setup.h"
#include "log.h"
#include "metrics.h"
#include "store.h"

static volatile sig_atomic_t stop_signals, failing;
static long long watchdog_limit_ms;
/* The loop sleeps in poll() on the read end; a signal, daemon_fail() or
 * daemon_wake() writes a byte to the other, from whichever thread. */
static int wake_fds[2] = {-1, -1};
/* A byte is in the pipe that the loop has not read yet: one is enough (a
 * client's queue may call daemon_wake() for every event on it). */
static atomic_int wake_pending;

/* What the admin listener reads, from its own thread. */
static _Atomic int64_t last_turn_ms;
/* While the loop sleeps until its step is due: when it is (0 awake). */
static _Atomic int64_t asleep_until_ms;
static long long health_stall_ms = 30000;
static pthread_mutex_t ready_lock = PTHREAD_MUTEX_INITIALIZER;
static int ready_now;
static char ready_why[160] = "starting";

void daemon_wake(void)
{
    /* From a signal handler too: write() is async-signal-safe, and errno
     * is the interrupted code's. A full pipe already wakes the loop. */
    int saved = errno;
    if (wake_fds[1] >= 0 && !atomic_exchange(&wake_pending, 1)) {
        ssize_t n = write(wake_fds[1], "", 1);
        (void)n;
    }
    errno = saved;
}

static void on_signal(int sig)
{
    (void)sig;
    stop_signals++;
    daemon_wake();
}

enum charged_rc daemon_init(struct charged_error *err)
{
    struct sigaction act;
    if (wake_fds[0] < 0 && pipe2(wake_fds, O_NONBLOCK | O_CLOEXEC) != 0) {
        charged_error_set(err, "cannot make the loop's wake-up pipe: %s",
                          strerror(errno));
        return CHARGED_RETRY;
    }
    memset(&act, 0, sizeof(act));
    act.sa_handler = on_signal;
    sigemptyset(&act.sa_mask);
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    signal(SIGPIPE, SIG_IGN);
    return CHARGED_OK;
}

int daemon_stopping(void)
{
    return stop_signals ? stop_signals : failing;
}

void daemon_fail(const char *why)
{
    log_error(why, NULL);
    failing = 1;
    daemon_wake();
}

void daemon_heartbeat(void)
{
    atomic_store(&last_turn_ms, clock_now_ms());
}

/* A wait for the budget: alive as it goes, ended by a stop signal. */
static int budget_stop(void)
{
    daemon_heartbeat();
    return daemon_stopping() > 0;
}

enum charged_rc daemon_budget_join(struct daemon_budget *b, const config_t *cfg,
                                   const char *role, enum budget_priority prio,
                                   long long max_wait_ms, provider_client_t *pc,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(b != NULL && cfg != NULL && pc != NULL && max_wait_ms > 0);
    enum charged_rc rc = budget_member_join(cfg, role, 1, &b->member, err);
    if (rc != CHARGED_OK)
        return rc;
    b->caller = (struct budget_caller){
        .member = b->member,
        .prio = prio,
        .max_wait_ms = max_wait_ms,
        .stop = budget_stop,
    };
    provider_client_set_gate(pc, budget_member_gate, budget_member_gate_charge,
                             &b->caller);
    return CHARGED_OK;
}

void daemon_budget_leave(struct daemon_budget *b)
{
    CHARGED_ASSERT(b != NULL);
    budget_member_leave(b->member);
    budget_member_free(b->member);
    b->member = NULL;
}

static void set_ready(int ready, const char *why_not)
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

/* 1 and why when the loop has not turned for longer than HEALTH_STALL_MS.
 * A loop asleep until its step is due turns, by design, until then. */
static int stalled(char *why, size_t why_size)
{
    /* asleep_until_ms first: the loop clears it only after its heartbeat
     * on waking, so one of the two is always fresh. */
    int64_t asleep = atomic_load(&asleep_until_ms);
    int64_t now = clock_now_ms(), turned = atomic_load(&last_turn_ms);
    if (asleep > turned)
        turned = daemon_policy_earliest(asleep, now);
    int64_t age = now - turned;
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
    db->backoff_ms = daemon_policy_backoff_ms(db->backoff_ms);
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

static enum charged_rc start_watchdog(long long shutdown_ms, struct charged_error *err)
{
    static int started;
    pthread_t t;
    if (started)
        return CHARGED_OK;
    watchdog_limit_ms = shutdown_ms;
    if (pthread_create(&t, NULL, watchdog, NULL) != 0) {
        charged_error_set(err, "cannot start the shutdown watchdog");
        return CHARGED_RETRY;
    }
    pthread_detach(t);
    started = 1;
    return CHARGED_OK;
}

/* The admin listener on ADMIN_ADDR. Its address, with the kernel's port
 * for port 0, goes to `bound`, for the log line that names it (written once
 * the role started, so that a bad setting found by start() stays the one
 * line on stderr). Returns admin_http_start's code. */
static enum charged_rc start_admin(const config_t *cfg, admin_http_t **admin,
                                   char *bound, size_t bound_size,
                                   struct charged_error *err)
{
    static const struct admin_http_handlers handlers = {probe_health, probe_ready,
                                                        on_scrape, NULL};
    const char *addr = config_str(cfg, CONFIG_ADMIN_ADDR);

    health_stall_ms = config_int(cfg, CONFIG_HEALTH_STALL_MS);
    daemon_heartbeat();
    enum charged_rc rc = admin_http_start(addr, &handlers, admin, err);
    if (rc != CHARGED_OK)
        return rc;
    snprintf(bound, bound_size, "%.*s:%d", (int)(strrchr(addr, ':') - addr), addr,
             admin_http_port(*admin));
    return CHARGED_OK;
}

/* What daemon_role_main and daemon_main share, up to building the role. */
struct launch {
    config_t *cfg; /* the role's once start() is called */
    char id[160];
    long long shutdown_ms;
    admin_http_t *admin;
    char bound[300];
};

/* The environment, logging, signals, the watchdog and the admin listener,
 * up to building the role. CHARGED_OK, or with err: CHARGED_GIVE_UP for a
 * bad setting or address, CHARGED_RETRY when the process cannot run (no
 * wake-up pipe, no watchdog, the address taken); what was built is freed. */
static enum charged_rc launch(const char *name, unsigned config_role, struct launch *l,
                              struct charged_error *err)
{
    char logname[64];
    enum charged_rc rc;

    l->cfg = config_new(config_role, name, err);
    if (!l->cfg)
        return CHARGED_GIVE_UP;
    snprintf(logname, sizeof(logname), "charged-%s", name);
    log_init(logname,
             (enum log_level)log_level_parse(config_str(l->cfg, CONFIG_LOG_LEVEL)));
    kafka_setup_worker_id(l->cfg, l->id, sizeof(l->id));
    l->shutdown_ms = config_int(l->cfg, CONFIG_SHUTDOWN_TIMEOUT_MS);
    /* The deadline of every statement of the role's stores, before start()
     * makes them. */
    store_set_timeout_ms(config_int(l->cfg, CONFIG_DATABASE_TIMEOUT_MS));
    /* Before anything can block (connecting, librdkafka's first log lines
     * on a full stderr): a signal during start-up is bounded too. */
    if ((rc = daemon_init(err)) != CHARGED_OK ||
        (rc = start_watchdog(l->shutdown_ms, err)) != CHARGED_OK ||
        (rc = start_admin(l->cfg, &l->admin, l->bound, sizeof(l->bound), err)) !=
            CHARGED_OK)
        config_free(l->cfg);
    return rc;
}

/* The process's exit status for a role that could not start: the one place
 * a code becomes one. 2 for what only a change of configuration or usage
 * mends, 1 for anything else (a runtime failure). */
static int exit_status(enum charged_rc rc)
{
    CHARGED_ASSERT(rc != CHARGED_OK);
    return rc == CHARGED_GIVE_UP ? 2 : 1;
}

/* Sleeps until `due` (clock_now_ms, after now) or a wake-up, whichever
 * comes first. Returns 1 when woken (the pipe is emptied), 0 otherwise. */
static int sleep_until(int64_t now, int64_t due)
{
    struct pollfd p = {.fd = wake_fds[0], .events = POLLIN};
    char buf[64];

    atomic_store(&asleep_until_ms, due);
    int n = poll(&p, 1, daemon_policy_wait_ms(now, due));
    daemon_heartbeat();
    atomic_store(&asleep_until_ms, 0);
    if (n <= 0)
        return 0; /* the time came, or a signal interrupted: the loop looks */
    /* Cleared after the pipe is emptied: cleared first, a wake-up in
     * between would write a byte this loop drains and leave the flag set
     * with the pipe empty, and no wake-up would write again. One that
     * comes before the flag is cleared is seen by the step that follows. */
    while (read(wake_fds[0], buf, sizeof(buf)) > 0)
        ;
    atomic_store(&wake_pending, 0);
    return 1;
}

/* Steps the role whenever it is due until a signal, then drains it and
 * finishes it. Returns the exit status. */
static int run_role(const struct daemon_role_desc *d, void *state,
                    long long shutdown_ms)
{
    int64_t due = DAEMON_NOW;

    while (!daemon_stopping()) {
        int64_t now = clock_now_ms();
        if (now < due) {
            if (sleep_until(now, due))
                due = DAEMON_NOW; /* woken: something the step answers came */
            continue;
        }
        daemon_heartbeat();
        due = d->step(state, now);
        if (d->not_ready) {
            const char *why = d->not_ready(state);
            set_ready(!why, why);
        }
    }

    int64_t stopping_at = clock_now_ms();
    log_info("stopping: draining in-flight work", "role", d->name, NULL);
    size_t left =
        d->drain(state, daemon_policy_drain_deadline(stopping_at, shutdown_ms));
    d->finish(state, daemon_policy_flush_ms(stopping_at, shutdown_ms, clock_now_ms()));
    char n[32];
    snprintf(n, sizeof(n), "%zu", left);
    log_info("stopped", "role", d->name, "unfinished", n, NULL);
    return left || failing ? 1 : 0;
}

/* A role built from state_size and setup (daemon_role_desc). */
static enum charged_rc build(const struct daemon_role_desc *d, config_t *cfg,
                             const char *id, void **state, struct charged_error *err)
{
    char msg[80];
    void *s = calloc(1, d->state_size);
    if (!s) {
        config_free(cfg);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    enum charged_rc rc = d->setup(s, cfg, id, err);
    if (rc != CHARGED_OK) {
        d->finish(s, 0);
        return rc;
    }
    snprintf(msg, sizeof(msg), "%s started", d->name);
    log_info(msg, d->name, id, NULL);
    *state = s;
    return CHARGED_OK;
}

int daemon_role_main(int argc, char **argv, const struct daemon_role_desc *desc)
{
    struct launch l = {0};
    struct charged_error err = {0};
    void *state = NULL;
    enum charged_rc rc = CHARGED_GIVE_UP;
    char port[16];

    if (argc > 1) {
        if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
            desc->usage(stdout);
            return 0;
        }
        charged_error_set(&err, "unexpected argument '%s'", argv[1]);
        goto failed;
    }
    if ((rc = launch(desc->name, desc->config_role, &l, &err)) != CHARGED_OK)
        goto failed;
    rc = desc->start ? desc->start(l.cfg, l.id, &state, &err)
                     : build(desc, l.cfg, l.id, &state, &err);
    if (rc != CHARGED_OK)
        goto failed;
    snprintf(port, sizeof(port), "%d", admin_http_port(l.admin));
    log_info("admin listener started", "role", desc->name, "addr", l.bound, "port",
             port, NULL);
    int status = run_role(desc, state, l.shutdown_ms);
    admin_http_free(l.admin);
    return status;
failed:
    fprintf(stderr, "charged %s: %s\n", desc->name, err.message);
    admin_http_free(l.admin); /* NULL unless the role failed to start */
    return exit_status(rc);
}
