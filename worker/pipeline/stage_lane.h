/* stage_lane: a thread that runs one of the loop's database stages at a
 * time, on a database session of its own, while the loop goes on.
 *
 * The worker's loop is one thread and its statements were synchronous: a
 * statement waiting for a row lock another session held (100 ms a batch)
 * held every provider answer unread and every other stage with it. A stage
 * now hands its batch to its lane and goes on; the lane writes one byte to
 * the loop's wake pipe when it is done, so the loop's one wait (engine_wait)
 * wakes for it as for an answer or a Kafka event, and applies the results
 * on the loop's thread. The stores' transactions are multi-statement with
 * decisions between statements (record, then the rejected path): run on a
 * lane as they are, each keeps its code and its tests.
 *
 * A lane knows nothing of stages: a task is a function and its argument.
 * What a task touches on the lane is its own (the items, the lane's store
 * session); the jobs it names are the loop's, which leaves them alone while
 * the task holds them (engine_store.c). One task at a time. */
#ifndef CHARGED_STAGE_LANE_H
#define CHARGED_STAGE_LANE_H

#include "charged_error.h"

typedef struct stage_lane stage_lane_t;

typedef void (*stage_lane_fn)(void *task);

/* A lane whose finished tasks write a byte to wake_fd (non-blocking; a full
 * pipe has woken the loop already); its thread is called name (at most 15
 * bytes are kept: top -H, perf). NULL and err when no thread starts. */
stage_lane_t *stage_lane_new(const char *name, int wake_fd, struct charged_error *err);
/* Waits for a task in hand to end (its result is dropped: take it first),
 * then stops the thread. NULL: nothing. */
void stage_lane_free(stage_lane_t *lane);

/* 1 when the lane holds no task: none given, or the last one taken. */
int stage_lane_idle(const stage_lane_t *lane);
/* Runs fn(task) on the lane. The lane must be idle. */
void stage_lane_run(stage_lane_t *lane, stage_lane_fn fn, void *task);
/* The task given, once it has ended (the lane is idle again); NULL while
 * it runs or when none was given. */
void *stage_lane_take(stage_lane_t *lane);
/* The same, waiting for it to end: NULL only when none was given. */
void *stage_lane_wait(stage_lane_t *lane);
#endif
