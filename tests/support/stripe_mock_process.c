#include "stripe_mock_process.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>

#include "test_env.h"

#define START_DEADLINE_MS 20000
#define HTTP_LINE         "Listening for HTTP at address: 127.0.0.1:"
#define HTTPS_LINE        "Listening for HTTPS at address: "

char *stripe_mock_log(const struct stripe_mock_process *p)
{
    size_t n = 0, cap = 4096;
    char *b = malloc(cap);
    ck_assert_ptr_nonnull(b);
    for (;;) {
        if (cap - n < 4096) {
            char *q = realloc(b, cap *= 2);
            ck_assert_ptr_nonnull(q);
            b = q;
        }
        /* pread: the child appends through its own copy of the offset. */
        ssize_t got = pread(p->log_fd, b + n, cap - n - 1, (off_t)n);
        if (got <= 0)
            break;
        n += (size_t)got;
    }
    b[n] = '\0';
    return b;
}

/* Fails the test with why and the end of what stripe-mock logged. */
static void fail_start(struct stripe_mock_process *p, const char *why)
{
    char tail[1024];
    char *log = stripe_mock_log(p);
    size_t n = strlen(log);
    snprintf(tail, sizeof(tail), "%s",
             n > sizeof(tail) - 1 ? log + n + 1 - sizeof(tail) : log);
    free(log);
    stripe_mock_stop(p);
    ck_abort_msg("%s; it logged: %s", why, tail);
}

void stripe_mock_start(struct stripe_mock_process *p)
{
    const char *path = getenv("CHARGED_STRIPE_MOCK");
    char tmpl[256];

    memset(p, 0, sizeof(*p));
    p->log_fd = -1;
    ck_assert_msg(path && *path && access(path, X_OK) == 0,
                  "stripe-mock not found (CHARGED_STRIPE_MOCK=%s): run "
                  "deploy/install-deps.sh, then cmake again",
                  path ? path : "unset");
    /* A file, not a pipe: stripe-mock logs every request to stdout, and Go
     * dies of SIGPIPE on a closed stdout or blocks on a full one. Unlinked
     * at once, so nothing is left behind whatever happens. */
    snprintf(tmpl, sizeof(tmpl), "%s/stripe-mock-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    p->log_fd = mkostemp(tmpl, O_CLOEXEC);
    ck_assert_msg(p->log_fd >= 0, "cannot create stripe-mock's log file in %s", tmpl);
    unlink(tmpl);

    /* Port 0 for both: it binds what the kernel picks and logs the address,
     * so no other process can take a port between our choosing and its
     * binding. HTTPS is given a loopback port too, since with -http-addr
     * alone stripe-mock still opens HTTPS on *:12112. */
    const char *argv[] = {path,          "-http-addr",  "127.0.0.1:0",
                          "-https-addr", "127.0.0.1:0", NULL};
    pid_t parent = getpid();
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        /* Dies with the test process, also one that fails before stop. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        dup2(p->log_fd, STDOUT_FILENO);
        dup2(p->log_fd, STDERR_FILENO);
        execv(path, (char *const *)argv);
        _exit(127);
    }

    long long deadline = test_env_now_ms() + START_DEADLINE_MS;
    for (;;) {
        char *log = stripe_mock_log(p);
        const char *http = strstr(log, HTTP_LINE);
        /* Both listeners bound: after that nothing at start-up can fail. */
        if (http && strstr(log, HTTPS_LINE)) {
            p->port = atoi(http + strlen(HTTP_LINE));
            free(log);
            break;
        }
        free(log);
        int st;
        if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
            p->pid = 0;
            fail_start(p, "stripe-mock exited before it listened");
        }
        if (test_env_now_ms() > deadline)
            fail_start(p, "stripe-mock did not listen within 20 s");
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    if (p->port <= 0)
        fail_start(p, "stripe-mock logged no usable HTTP port");
    snprintf(p->base_url, sizeof(p->base_url), "http://127.0.0.1:%d", p->port);
}

void stripe_mock_stop(struct stripe_mock_process *p)
{
    int st;
    if (p->pid > 0) {
        kill(p->pid, SIGTERM);
        waitpid(p->pid, &st, 0);
        p->pid = 0;
    }
    if (p->log_fd >= 0) {
        close(p->log_fd);
        p->log_fd = -1;
    }
}
