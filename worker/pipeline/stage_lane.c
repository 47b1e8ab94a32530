#include "stage_lane.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "charged_assert.h"

enum lane_state { LANE_IDLE, LANE_RUNNING, LANE_ENDED };

struct stage_lane {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    int wake_fd;
    enum lane_state state; /* under lock */
    int stopping;          /* under lock */
    stage_lane_fn fn;
    void *task;
};

static void *lane_main(void *arg)
{
    stage_lane_t *l = arg;
    pthread_mutex_lock(&l->lock);
    for (;;) {
        while (l->state != LANE_RUNNING && !l->stopping)
            pthread_cond_wait(&l->changed, &l->lock);
        if (l->state != LANE_RUNNING)
            break; /* stopping, nothing in hand */
        stage_lane_fn fn = l->fn;
        void *task = l->task;
        pthread_mutex_unlock(&l->lock);
        fn(task);
        pthread_mutex_lock(&l->lock);
        l->state = LANE_ENDED;
        pthread_cond_broadcast(&l->changed);
        /* After the state: the loop that wakes finds the task ended. A full
         * pipe has a wake pending already. */
        ssize_t w = write(l->wake_fd, "l", 1);
        (void)w;
    }
    pthread_mutex_unlock(&l->lock);
    return NULL;
}

stage_lane_t *stage_lane_new(const char *name, int wake_fd, struct charged_error *err)
{
    stage_lane_t *l = calloc(1, sizeof(*l));
    int rc;
    if (!l) {
        charged_error_set(err, "out of memory");
        return NULL;
    }
    l->wake_fd = wake_fd;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->changed, NULL);
    /* Signals are the loop's: a lane started with all of them blocked never
     * takes one, so a SIGTERM always interrupts the loop's own wait. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&l->thread, NULL, lane_main, l);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        charged_error_set(err, "cannot start a database lane: %s", strerror(rc));
        pthread_cond_destroy(&l->changed);
        pthread_mutex_destroy(&l->lock);
        free(l);
        return NULL;
    }
    char short_name[16];
    snprintf(short_name, sizeof(short_name), "%s", name);
    pthread_setname_np(l->thread, short_name); /* a name is a help, not a need */
    return l;
}

void stage_lane_free(stage_lane_t *l)
{
    if (!l)
        return;
    pthread_mutex_lock(&l->lock);
    while (l->state == LANE_RUNNING)
        pthread_cond_wait(&l->changed, &l->lock);
    l->stopping = 1;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
    pthread_join(l->thread, NULL);
    pthread_cond_destroy(&l->changed);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

int stage_lane_idle(const stage_lane_t *l)
{
    /* Only the loop moves a lane out of IDLE or ENDED: it reads its own
     * writes here, and RUNNING -> ENDED keeps it not idle. */
    stage_lane_t *m = (stage_lane_t *)l;
    pthread_mutex_lock(&m->lock);
    int idle = m->state == LANE_IDLE;
    pthread_mutex_unlock(&m->lock);
    return idle;
}

void stage_lane_run(stage_lane_t *l, stage_lane_fn fn, void *task)
{
    CHARGED_ASSERT(fn != NULL && task != NULL);
    pthread_mutex_lock(&l->lock);
    CHARGED_ASSERT(l->state == LANE_IDLE); /* one task at a time */
    l->fn = fn;
    l->task = task;
    l->state = LANE_RUNNING;
    pthread_cond_broadcast(&l->changed);
    pthread_mutex_unlock(&l->lock);
}

static void *take_locked(stage_lane_t *l)
{
    if (l->state != LANE_ENDED)
        return NULL;
    void *task = l->task;
    l->state = LANE_IDLE;
    l->fn = NULL;
    l->task = NULL;
    return task;
}

void *stage_lane_take(stage_lane_t *l)
{
    pthread_mutex_lock(&l->lock);
    void *task = take_locked(l);
    pthread_mutex_unlock(&l->lock);
    return task;
}

void *stage_lane_wait(stage_lane_t *l)
{
    pthread_mutex_lock(&l->lock);
    while (l->state == LANE_RUNNING)
        pthread_cond_wait(&l->changed, &l->lock);
    void *task = take_locked(l);
    pthread_mutex_unlock(&l->lock);
    return task;
}
