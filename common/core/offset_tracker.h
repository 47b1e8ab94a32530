/* offset_tracker: which offsets of each partition may be committed.
 *
 * Messages of one partition finish out of order. A partition's committable
 * position is its lowest unfinished offset, or one past the highest seen
 * when all are finished: a commit never skips a message whose effects are
 * not yet durable. */
#ifndef CHARGED_OFFSET_TRACKER_H
#define CHARGED_OFFSET_TRACKER_H

#include <stddef.h>
#include <stdint.h>

typedef struct offset_tracker offset_tracker_t;

offset_tracker_t *offset_tracker_new(void);
void offset_tracker_free(offset_tracker_t *t);

/* A message was taken from (partition, offset). Offsets of a partition
 * arrive in increasing order. 0 / -1 on out of memory. */
int offset_tracker_begin(offset_tracker_t *t, int32_t partition, int64_t offset);
/* Its effects are durable. */
void offset_tracker_done(offset_tracker_t *t, int32_t partition, int64_t offset);

/* The position to commit for partition (the next offset to read), or -1
 * when nothing was seen. */
int64_t offset_tracker_committable(const offset_tracker_t *t, int32_t partition);
/* Unfinished messages of a partition, and in all. */
size_t offset_tracker_pending(const offset_tracker_t *t, int32_t partition);
size_t offset_tracker_pending_total(const offset_tracker_t *t);

/* Partitions with a position that moved since offset_tracker_mark_committed. */
size_t offset_tracker_dirty(const offset_tracker_t *t, int32_t *partitions, size_t max);
void offset_tracker_mark_committed(offset_tracker_t *t, int32_t partition,
                                   int64_t position);

/* Forgets a partition (revoked or lost). */
void offset_tracker_forget(offset_tracker_t *t, int32_t partition);

#endif
