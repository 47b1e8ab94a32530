/* stage_lane: a task runs on the lane while the caller goes on, its end
 * wakes the caller's pipe, its result is taken once, and a lane is freed
 * only after the task in hand has ended. Races are forced with a gate the
 * test opens, never with sleeps. */
#include <check.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include "stage_lane.h"
#include "test_env.h"

/* A task that blocks until the test opens its gate. */
struct gated {
    pthread_mutex_t lock;
    pthread_cond_t open_cond;
    int open, started, ran;
};

static void gated_init(struct gated *g)
{
    pthread_mutex_init(&g->lock, NULL);
    pthread_cond_init(&g->open_cond, NULL);
    g->open = g->started = g->ran = 0;
}

static void gated_run(void *arg)
{
    struct gated *g = arg;
    pthread_mutex_lock(&g->lock);
    g->started = 1;
    pthread_cond_broadcast(&g->open_cond);
    while (!g->open)
        pthread_cond_wait(&g->open_cond, &g->lock);
    g->ran++;
    pthread_mutex_unlock(&g->lock);
}

static void gated_open(struct gated *g)
{
    pthread_mutex_lock(&g->lock);
    g->open = 1;
    pthread_cond_broadcast(&g->open_cond);
    pthread_mutex_unlock(&g->lock);
}

static void gated_wait_started(struct gated *g)
{
    pthread_mutex_lock(&g->lock);
    while (!g->started)
        pthread_cond_wait(&g->open_cond, &g->lock);
    pthread_mutex_unlock(&g->lock);
}

static int pipe_ready(int fd, int timeout_ms)
{
    struct pollfd p = {.fd = fd, .events = POLLIN};
    return poll(&p, 1, timeout_ms) == 1;
}

static void make_pipe(int fds[2])
{
    ck_assert_int_eq(pipe(fds), 0);
    fcntl(fds[0], F_SETFL, O_NONBLOCK);
    fcntl(fds[1], F_SETFL, O_NONBLOCK);
}

START_TEST(a_task_runs_while_the_caller_goes_on)
{
    int fds[2];
    struct gated g;
    struct charged_error err;
    make_pipe(fds);
    gated_init(&g);
    stage_lane_t *l = stage_lane_new("lane-test", fds[1], &err);
    ck_assert_ptr_nonnull(l);
    ck_assert(stage_lane_idle(l));
    ck_assert_ptr_null(stage_lane_take(l)); /* none given */
    stage_lane_run(l, gated_run, &g);
    gated_wait_started(&g);
    /* The task is held on the lane: the caller is not, and nothing is
     * taken nor woken before it ends. */
    ck_assert(!stage_lane_idle(l));
    ck_assert_ptr_null(stage_lane_take(l));
    ck_assert(!pipe_ready(fds[0], 0));
    gated_open(&g);
    /* Its end wakes the pipe; the task is taken once. */
    ck_assert(pipe_ready(fds[0], 10000));
    ck_assert_ptr_eq(stage_lane_take(l), &g);
    ck_assert_ptr_null(stage_lane_take(l));
    ck_assert(stage_lane_idle(l));
    ck_assert_int_eq(g.ran, 1);
    stage_lane_free(l);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

START_TEST(a_lane_runs_one_task_after_another)
{
    int fds[2];
    struct gated a, b;
    struct charged_error err;
    make_pipe(fds);
    gated_init(&a);
    gated_init(&b);
    a.open = b.open = 1;
    stage_lane_t *l = stage_lane_new("lane-test", fds[1], &err);
    ck_assert_ptr_nonnull(l);
    stage_lane_run(l, gated_run, &a);
    ck_assert_ptr_eq(stage_lane_wait(l), &a);
    stage_lane_run(l, gated_run, &b);
    ck_assert_ptr_eq(stage_lane_wait(l), &b);
    ck_assert_ptr_null(stage_lane_wait(l)); /* none in hand */
    ck_assert_int_eq(a.ran, 1);
    ck_assert_int_eq(b.ran, 1);
    stage_lane_free(l);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

static void *open_later(void *arg)
{
    struct gated *g = arg;
    gated_wait_started(g);
    gated_open(g);
    return NULL;
}

START_TEST(freeing_a_lane_waits_for_its_task)
{
    int fds[2];
    struct gated g;
    struct charged_error err;
    pthread_t opener;
    make_pipe(fds);
    gated_init(&g);
    stage_lane_t *l = stage_lane_new("lane-test", fds[1], &err);
    ck_assert_ptr_nonnull(l);
    stage_lane_run(l, gated_run, &g);
    ck_assert_int_eq(pthread_create(&opener, NULL, open_later, &g), 0);
    stage_lane_free(l); /* returns only once the task has run */
    ck_assert_int_eq(g.ran, 1);
    pthread_join(opener, NULL);
    stage_lane_free(NULL);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

START_TEST(a_full_wake_pipe_does_not_hold_the_lane)
{
    int fds[2];
    struct gated g;
    struct charged_error err;
    char byte = 'x';
    make_pipe(fds);
    while (write(fds[1], &byte, 1) == 1)
        ; /* full: the caller has a wake pending already */
    gated_init(&g);
    g.open = 1;
    stage_lane_t *l = stage_lane_new("lane-test", fds[1], &err);
    ck_assert_ptr_nonnull(l);
    stage_lane_run(l, gated_run, &g);
    ck_assert_ptr_eq(stage_lane_wait(l), &g);
    stage_lane_free(l);
    close(fds[0]);
    close(fds[1]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("stage_lane");
    TCase *tc = tcase_create("stage_lane");
    tcase_add_test(tc, a_task_runs_while_the_caller_goes_on);
    tcase_add_test(tc, a_lane_runs_one_task_after_another);
    tcase_add_test(tc, freeing_a_lane_waits_for_its_task);
    tcase_add_test(tc, a_full_wake_pipe_does_not_hold_the_lane);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
