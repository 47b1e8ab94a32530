/* Unit tests of worker/roles/daemon's loop, with a role of the test's own:
 * a step never runs before the time it said it is next due, a loop asleep
 * until a far step wakes for a stop signal taken by another thread and for
 * daemon_wake(), the exit status says what the drain left, and a step due
 * now is called again at once, and a wake-up that lands while the loop
 * empties its pipe is not the last one it ever sees.
 *
 * Each case runs daemon_role_main in a child process of
 * its own, as a role's process would: signals and the loop's state are the
 * process's. What the role saw is written to memory shared with the test. */
#include <check.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "clock.h"
#include "daemon.h"
#include "test_env.h"

#define MAX_STEPS 16
#define HOUR_MS   (3600 * 1000LL)
#define CHILD_MS  30000 /* valgrind included */
#define GAP_MS    20    /* between the steps of a_step_never_runs_early */

/* What the role saw, in memory shared with the test. */
struct seen {
    int steps;
    int64_t now[MAX_STEPS]; /* the `now` each step was given */
    int64_t due[MAX_STEPS]; /* what each step answered */
    int drains, finishes;
    int64_t clock_at_step[MAX_STEPS];
};

static struct seen *seen;

/* What a case's role does at its step `i` (0 first): returns when it is
 * next due. */
typedef int64_t (*plan_fn)(int i, int64_t now);
static plan_fn plan;
static size_t left_undone; /* what the drain says it left */

struct fake {
    config_t *cfg;
};

static enum charged_rc fake_start(config_t *cfg, const char *id, void **state,
                                  struct charged_error *err)
{
    (void)id;
    struct fake *f = calloc(1, sizeof(*f));
    if (!f) {
        config_free(cfg);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    f->cfg = cfg;
    *state = f;
    return CHARGED_OK;
}

static int64_t fake_step(void *state, int64_t now)
{
    (void)state;
    int i = seen->steps++;
    if (i >= MAX_STEPS) {
        daemon_fail("too many steps");
        return DAEMON_NOW;
    }
    seen->now[i] = now;
    seen->clock_at_step[i] = clock_now_ms();
    seen->due[i] = plan(i, now);
    return seen->due[i];
}

static const char *fake_not_ready(void *state)
{
    (void)state;
    return NULL;
}

static size_t fake_drain(void *state, int64_t deadline)
{
    (void)state;
    (void)deadline;
    seen->drains++;
    return left_undone;
}

static void fake_finish(void *state, int flush_ms)
{
    struct fake *f = state;
    (void)flush_ms;
    seen->finishes++;
    config_free(f->cfg);
    free(f);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: charged test\n");
}

static const struct daemon_role_desc desc = {
    .name = "test",
    .config_role = CONFIG_ROLE_RELAY,
    .usage = usage,
    .start = fake_start,
    .step = fake_step,
    .not_ready = fake_not_ready,
    .drain = fake_drain,
    .finish = fake_finish,
};

/* ---- the process ---- */

/* Until the loop's thread (the process's first) sleeps, or 5 s: then the
 * wake-up under test finds it asleep. Either way the outcome asserted is
 * the same; this only makes the asleep case the one tested. */
static void wait_until_loop_sleeps(void)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/self/task/%d/stat", (int)getpid());
    long long deadline = test_env_now_ms() + 5000;
    while (test_env_now_ms() < deadline) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof(buf) - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *end = strrchr(buf, ')');
        if (end && end[1] == ' ' && end[2] == 'S')
            return;
        usleep(1000);
    }
}

/* Runs the role in a child process: returns its exit status, or fails the
 * test when it does not exit within CHILD_MS. */
static int run(void)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char arg0[] = "test";
        char *argv[] = {arg0, NULL};
        setenv("ADMIN_ADDR", "127.0.0.1:0", 1);
        setenv("LOG_LEVEL", "warn", 1);
        /* Past CHILD_MS: a loop that never wakes fails as such, not as a
         * shutdown the watchdog cut short. */
        setenv("SHUTDOWN_TIMEOUT_MS", "120000", 1);
        _exit(daemon_role_main(1, argv, &desc));
    }
    long long deadline = test_env_now_ms() + CHILD_MS;
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &status, WNOHANG)) == 0 && test_env_now_ms() < deadline)
        usleep(5000);
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        ck_abort_msg("the role did not exit within %d ms", CHILD_MS);
    }
    ck_assert_msg(WIFEXITED(status), "the role died of signal %d", WTERMSIG(status));
    return WEXITSTATUS(status);
}

static void setup(void)
{
    seen = mmap(NULL, sizeof(*seen), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                -1, 0);
    ck_assert_ptr_ne(seen, MAP_FAILED);
    memset(seen, 0, sizeof(*seen));
    left_undone = 0;
}

static void teardown(void)
{
    munmap(seen, sizeof(*seen));
}

/* ---- a wake-up inside the loop's read of its pipe ---- */

/* Set by a case: the loop thread's next read of a pipe (its wake-up pipe:
 * the only one it reads) first calls daemon_wake(), as another thread
 * would in the instant between the loop taking its wake-up and emptying
 * the pipe. Forced here, so that the race is not left to chance. */
static volatile int wake_inside_read;

/* Takes the place of libc's read() in this process (the daemon library is
 * linked statically into it); every read but the one above is libc's. */
ssize_t read(int fd, void *buf, size_t count)
{
    struct stat st;
    if (wake_inside_read && syscall(SYS_gettid) == getpid() && fstat(fd, &st) == 0 &&
        S_ISFIFO(st.st_mode)) {
        wake_inside_read = 0;
        daemon_wake();
    }
    return syscall(SYS_read, fd, buf, count);
}

/* ---- the cases ---- */

static void *send_stop(void *arg)
{
    (void)arg;
    wait_until_loop_sleeps();
    /* To this thread, not the loop's: poll() in the loop is not
     * interrupted, as when a library's thread takes the signal. */
    pthread_kill(pthread_self(), SIGTERM);
    return NULL;
}

static void *send_wake(void *arg)
{
    (void)arg;
    wait_until_loop_sleeps();
    daemon_wake();
    return NULL;
}

static void start_thread(void *(*fn)(void *))
{
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, fn, NULL), 0);
    pthread_detach(t);
}

/* Five steps GAP_MS apart, each due GAP_MS after the one before; the
 * sixth stops the process. */
static int64_t gaps_then_stop(int i, int64_t now)
{
    if (i < 5)
        return now + GAP_MS;
    raise(SIGTERM);
    return now + HOUR_MS;
}

START_TEST(a_step_never_runs_early)
{
    plan = gaps_then_stop;
    ck_assert_int_eq(run(), 0);
    ck_assert_int_eq(seen->steps, 6);
    for (int i = 1; i < seen->steps; i++) {
        ck_assert_int_ge(seen->now[i], seen->due[i - 1]);
        /* The `now` a step is given is the clock's at its turn. */
        ck_assert_int_le(seen->now[i], seen->clock_at_step[i]);
    }
    ck_assert_int_eq(seen->drains, 1);
    ck_assert_int_eq(seen->finishes, 1);
}
END_TEST

/* One step, due in an hour; a signal stops the sleep. */
static int64_t far_then_stop(int i, int64_t now)
{
    if (i == 0)
        start_thread(send_stop);
    return now + HOUR_MS;
}

START_TEST(a_signal_to_another_thread_wakes_the_sleeping_loop)
{
    plan = far_then_stop;
    ck_assert_int_eq(run(), 0);
    ck_assert_int_eq(seen->steps, 1);
    ck_assert_int_eq(seen->drains, 1);
    ck_assert_int_eq(seen->finishes, 1);
}
END_TEST

/* Due in an hour; daemon_wake() makes the loop step at once, and that step
 * stops the process. */
static int64_t far_then_woken(int i, int64_t now)
{
    if (i == 0)
        start_thread(send_wake);
    else
        raise(SIGTERM);
    return now + HOUR_MS;
}

START_TEST(a_wake_up_steps_before_the_step_is_due)
{
    plan = far_then_woken;
    ck_assert_int_eq(run(), 0);
    ck_assert_int_eq(seen->steps, 2);
    ck_assert_int_lt(seen->now[1], seen->due[0]);
    ck_assert_int_eq(seen->finishes, 1);
}
END_TEST

static int64_t stop_at_once(int i, int64_t now)
{
    (void)i;
    raise(SIGTERM);
    return now;
}

START_TEST(work_left_after_the_drain_exits_1)
{
    plan = stop_at_once;
    left_undone = 3;
    ck_assert_int_eq(run(), 1);
    ck_assert_int_eq(seen->steps, 1);
    ck_assert_int_eq(seen->drains, 1);
    ck_assert_int_eq(seen->finishes, 1);
}
END_TEST

/* A step due again now (the worker's, which waits in its own polls) is
 * called again at once; the fourth stops the process. */
static int64_t due_now(int i, int64_t now)
{
    (void)now;
    if (i == 3)
        raise(SIGTERM);
    return DAEMON_NOW;
}

START_TEST(a_step_due_now_steps_again_at_once)
{
    plan = due_now;
    ck_assert_int_eq(run(), 0);
    ck_assert_int_eq(seen->steps, 4);
    ck_assert_int_eq(seen->drains, 1);
    ck_assert_int_eq(seen->finishes, 1);
}
END_TEST

/* Step 0 is woken, and a second wake-up comes while the loop empties its
 * pipe; step 1 is due in 5 s and woken before; step 2 stops the process. */
static int64_t woken_twice(int i, int64_t now)
{
    if (i == 0) {
        wake_inside_read = 1;
        start_thread(send_wake);
        return now + HOUR_MS;
    }
    if (i == 1) {
        start_thread(send_wake);
        return now + 5000;
    }
    raise(SIGTERM);
    return now + HOUR_MS;
}

START_TEST(a_wake_up_while_the_pipe_is_emptied_loses_no_later_one)
{
    plan = woken_twice;
    ck_assert_int_eq(run(), 0);
    ck_assert_int_eq(seen->steps, 3);
    /* Woken, not reached by its time: a wake-up lost for good would leave
     * every later one (and a stop signal another thread takes) unheard. */
    ck_assert_int_lt(seen->now[2], seen->due[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("daemon");
    TCase *tc = tcase_create("daemon");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_step_never_runs_early);
    tcase_add_test(tc, a_signal_to_another_thread_wakes_the_sleeping_loop);
    tcase_add_test(tc, a_wake_up_steps_before_the_step_is_due);
    tcase_add_test(tc, work_left_after_the_drain_exits_1);
    tcase_add_test(tc, a_step_due_now_steps_again_at_once);
    tcase_add_test(tc, a_wake_up_while_the_pipe_is_emptied_loses_no_later_one);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
