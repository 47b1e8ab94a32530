#include "offset_tracker.h"

#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"

/* One partition: its unfinished-or-not-yet-popped offsets in arrival order,
 * as a ring buffer, with a done flag each. */
struct part {
    int32_t partition;
    int64_t *offsets;
    unsigned char *done;
    size_t head, len, cap;
    size_t pending;    /* not done */
    int64_t next;      /* one past the highest offset seen; -1: none */
    int64_t committed; /* last position marked committed */
};

struct offset_tracker {
    struct part *parts;
    size_t nparts;
    size_t pending_total;
};

offset_tracker_t *offset_tracker_new(void)
{
    return calloc(1, sizeof(offset_tracker_t));
}

static void part_release(struct part *p)
{
    free(p->offsets);
    free(p->done);
}

void offset_tracker_free(offset_tracker_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nparts; i++)
        part_release(&t->parts[i]);
    free(t->parts);
    free(t);
}

/* A partition's ring holds its offsets: what is pending is among them. */
static void part_check(const struct part *p)
{
    CHARGED_ASSERT(p->len <= p->cap && (p->cap == 0 || p->head < p->cap));
    CHARGED_ASSERT(p->pending <= p->len);
}

static struct part *find(const offset_tracker_t *t, int32_t partition)
{
    CHARGED_ASSERT(t);
    for (size_t i = 0; i < t->nparts; i++)
        if (t->parts[i].partition == partition)
            return &t->parts[i];
    return NULL;
}

static struct part *find_or_add(offset_tracker_t *t, int32_t partition)
{
    struct part *p = find(t, partition);
    if (p)
        return p;
    p = realloc(t->parts, (t->nparts + 1) * sizeof(*p));
    if (!p)
        return NULL;
    t->parts = p;
    p = &t->parts[t->nparts++];
    memset(p, 0, sizeof(*p));
    p->partition = partition;
    p->next = -1;
    p->committed = -1;
    return p;
}

static int grow(struct part *p)
{
    CHARGED_ASSERT(p->len == p->cap); /* grown only when full */
    size_t ncap = p->cap ? p->cap * 2 : 64;
    int64_t *o = malloc(ncap * sizeof(*o));
    unsigned char *d = malloc(ncap);
    if (!o || !d) {
        free(o);
        free(d);
        return -1;
    }
    for (size_t i = 0; i < p->len; i++) {
        o[i] = p->offsets[(p->head + i) % p->cap];
        d[i] = p->done[(p->head + i) % p->cap];
    }
    free(p->offsets);
    free(p->done);
    p->offsets = o;
    p->done = d;
    p->head = 0;
    p->cap = ncap;
    CHARGED_ASSERT(p->len < p->cap);
    return 0;
}

int offset_tracker_begin(offset_tracker_t *t, int32_t partition, int64_t offset)
{
    struct part *p = find_or_add(t, partition);
    if (!p || (p->len == p->cap && grow(p) != 0))
        return -1;
    size_t at = (p->head + p->len) % p->cap;
    p->offsets[at] = offset;
    p->done[at] = 0;
    p->len++;
    p->pending++;
    t->pending_total++;
    if (offset + 1 > p->next)
        p->next = offset + 1;
    part_check(p);
    CHARGED_ASSERT(t->pending_total >= p->pending);
    return 0;
}

void offset_tracker_done(offset_tracker_t *t, int32_t partition, int64_t offset)
{
    struct part *p = find(t, partition);
    size_t lo = 0, hi;
    if (!p || p->len == 0)
        return;
    /* Offsets are increasing in the ring: binary search. */
    hi = p->len;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (p->offsets[(p->head + mid) % p->cap] < offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    size_t at = (p->head + lo) % p->cap;
    if (lo == p->len || p->offsets[at] != offset || p->done[at])
        return;
    /* Not done yet: it is counted pending, here and in the total. */
    CHARGED_ASSERT(p->pending > 0 && t->pending_total > 0);
    p->done[at] = 1;
    p->pending--;
    t->pending_total--;
    while (p->len > 0 && p->done[p->head]) {
        p->head = (p->head + 1) % p->cap;
        p->len--;
    }
    part_check(p);
}

int64_t offset_tracker_committable(const offset_tracker_t *t, int32_t partition)
{
    const struct part *p = find(t, partition);
    if (!p || p->next < 0)
        return -1;
    int64_t pos = p->len > 0 ? p->offsets[p->head] : p->next;
    /* Never past what was seen: a commit covers only offsets taken. */
    CHARGED_ASSERT(pos <= p->next);
    return pos;
}

size_t offset_tracker_pending(const offset_tracker_t *t, int32_t partition)
{
    const struct part *p = find(t, partition);
    return p ? p->pending : 0;
}

size_t offset_tracker_pending_total(const offset_tracker_t *t)
{
    return t->pending_total;
}

size_t offset_tracker_dirty(const offset_tracker_t *t, int32_t *partitions, size_t max)
{
    size_t n = 0;
    CHARGED_ASSERT(t && (partitions || max == 0));
    for (size_t i = 0; i < t->nparts && n < max; i++) {
        int64_t pos = offset_tracker_committable(t, t->parts[i].partition);
        if (pos >= 0 && pos != t->parts[i].committed)
            partitions[n++] = t->parts[i].partition;
    }
    return n;
}

void offset_tracker_mark_committed(offset_tracker_t *t, int32_t partition,
                                   int64_t position)
{
    struct part *p = find(t, partition);
    if (p)
        p->committed = position;
}

void offset_tracker_forget(offset_tracker_t *t, int32_t partition)
{
    for (size_t i = 0; i < t->nparts; i++) {
        if (t->parts[i].partition != partition)
            continue;
        CHARGED_ASSERT(t->pending_total >= t->parts[i].pending);
        t->pending_total -= t->parts[i].pending;
        part_release(&t->parts[i]);
        t->parts[i] = t->parts[--t->nparts];
        return;
    }
}
