#include "job.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "charged_assert.h"
#include "log.h"
#include "utf8_text.h"

struct state_list {
    struct job *head, *tail;
    size_t count;   /* jobs in the state */
    size_t holding; /* of which hold an offset */
};

struct job_list {
    struct job *oldest, *youngest;
    struct state_list states[JOB__COUNT];
    size_t holding; /* jobs holding an offset, all states */
};

static const char *const job_state_names[JOB__COUNT] = {
    "backlog", "dead_letter", "dead_letter_sent", "record",  "claim",  "wait",
    "call",    "calling",     "calling_fenced",   "persist", "parked", "done"};

#define M(s) (1u << (s))
/* Where each state may go next. */
static const unsigned job_moves[JOB__COUNT] = {
    [JOB_BACKLOG] = M(JOB_RECORD) | M(JOB_DEAD_LETTER) | M(JOB_DONE),
    [JOB_DEAD_LETTER] = M(JOB_DEAD_LETTER_SENT) | M(JOB_DONE),
    [JOB_DEAD_LETTER_SENT] = M(JOB_DONE) | M(JOB_DEAD_LETTER),
    [JOB_RECORD] = M(JOB_CLAIM) | M(JOB_CALL) | M(JOB_DEAD_LETTER) | M(JOB_DONE),
    [JOB_CLAIM] = M(JOB_CALL) | M(JOB_WAIT) | M(JOB_DONE) | M(JOB_DEAD_LETTER),
    [JOB_WAIT] =
        M(JOB_CLAIM) | M(JOB_CALL) | M(JOB_WAIT) | M(JOB_DONE) | M(JOB_DEAD_LETTER),
    [JOB_CALL] =
        M(JOB_CALLING) | M(JOB_PERSIST) | M(JOB_WAIT) | M(JOB_PARKED) | M(JOB_DONE),
    [JOB_CALLING] = M(JOB_CALL) | M(JOB_PERSIST) | M(JOB_CALLING_FENCED) |
                    M(JOB_PARKED) | M(JOB_DONE),
    [JOB_CALLING_FENCED] = M(JOB_WAIT) | M(JOB_DONE),
    [JOB_PERSIST] = M(JOB_DONE) | M(JOB_WAIT),
    [JOB_PARKED] = M(JOB_CALL) | M(JOB_WAIT) | M(JOB_DONE),
    [JOB_DONE] = 0,
};
#undef M

job_list_t *job_list_new(void)
{
    return calloc(1, sizeof(struct job_list));
}

void job_list_free(job_list_t *list)
{
    free(list);
}

static void state_link(job_list_t *list, struct job *j)
{
    struct state_list *s = &list->states[j->state];
    CHARGED_ASSERT(j->state < JOB__COUNT);
    j->state_next = NULL;
    j->state_prev = s->tail;
    if (s->tail)
        s->tail->state_next = j;
    else
        s->head = j;
    s->tail = j;
    s->count++;
    if (!j->detached)
        s->holding++;
}

static void state_unlink(job_list_t *list, struct job *j)
{
    struct state_list *s = &list->states[j->state];
    /* The counts the offsets rest on never go below 0. */
    CHARGED_ASSERT(s->count > 0 && (j->detached || s->holding > 0));
    if (j->state_prev)
        j->state_prev->state_next = j->state_next;
    else
        s->head = j->state_next;
    if (j->state_next)
        j->state_next->state_prev = j->state_prev;
    else
        s->tail = j->state_prev;
    j->state_prev = j->state_next = NULL;
    s->count--;
    if (!j->detached)
        s->holding--;
}

void job_list_add(job_list_t *list, struct job *j)
{
    /* A job is on one list at a time. */
    CHARGED_ASSERT(!j->prev && !j->next && !j->state_prev && !j->state_next);
    j->state = JOB_BACKLOG;
    j->detached = 0;
    j->next = NULL;
    j->prev = list->youngest;
    if (list->youngest)
        list->youngest->next = j;
    else
        list->oldest = j;
    list->youngest = j;
    list->holding++;
    state_link(list, j);
}

void job_list_remove(job_list_t *list, struct job *j)
{
    state_unlink(list, j);
    CHARGED_ASSERT(j->detached || list->holding > 0);
    if (!j->detached)
        list->holding--;
    if (j->prev)
        j->prev->next = j->next;
    else
        list->oldest = j->next;
    if (j->next)
        j->next->prev = j->prev;
    else
        list->youngest = j->prev;
    j->prev = j->next = NULL;
}

int job_may_move(enum job_state from, enum job_state to)
{
    return from < JOB__COUNT && to < JOB__COUNT && ((job_moves[from] >> to) & 1u);
}

void job_set(job_list_t *list, struct job *j, enum job_state to)
{
    /* A pipeline that makes an impossible move is broken: it stops here,
     * before reap commits any offset. The supervisor restarts the worker,
     * the lease fences the attempt, and the message is consumed again.
     * CHARGED_ASSERT, not assert(): it stays on in release builds (NDEBUG). */
    if (!job_may_move(j->state, to))
        log_error("bug: job moved where it may not go; stopping", "from",
                  job_state_name(j->state), "to", job_state_name(to), JOB_FIELDS(j),
                  NULL);
    CHARGED_ASSERT(job_may_move(j->state, to));
    /* A lane's statement holds it: its result decides where it goes. */
    CHARGED_ASSERT(!j->in_lane);
    if (to == j->state)
        return;
    state_unlink(list, j);
    j->state = to;
    state_link(list, j);
}

void job_set_error(struct job *j, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    utf8_text_copy(j->dl_error, sizeof(j->dl_error), text);
}

void job_detach(job_list_t *list, struct job *j)
{
    if (j->detached)
        return;
    CHARGED_ASSERT(list->holding > 0 && list->states[j->state].holding > 0);
    j->detached = 1;
    list->holding--;
    list->states[j->state].holding--;
}

struct job *job_list_oldest(const job_list_t *list)
{
    return list->oldest;
}

struct job *job_younger(const struct job *j)
{
    return j->next;
}

struct job *job_list_first(const job_list_t *list, enum job_state state)
{
    CHARGED_ASSERT(state < JOB__COUNT);
    return list->states[state].head;
}

struct job *job_next_in_state(const struct job *j)
{
    return j->state_next;
}

size_t job_list_count(const job_list_t *list, enum job_state state)
{
    return list->states[state].count;
}

size_t job_list_holding_in(const job_list_t *list, enum job_state state)
{
    return list->states[state].holding;
}

size_t job_list_due(const job_list_t *list, enum job_state state, int64_t now)
{
    size_t n = 0;
    for (const struct job *j = list->states[state].head; j; j = j->state_next)
        n += j->next_at <= now;
    return n;
}

int64_t job_list_next_at(const job_list_t *list, enum job_state state)
{
    int64_t at = INT64_MAX;
    for (const struct job *j = list->states[state].head; j; j = j->state_next)
        if (j->next_at < at)
            at = j->next_at;
    return at;
}

size_t job_list_holding(const job_list_t *list)
{
    return list->holding;
}

size_t job_list_started(const job_list_t *list)
{
    CHARGED_ASSERT(list->holding >= list->states[JOB_BACKLOG].holding);
    return list->holding - list->states[JOB_BACKLOG].holding;
}

const char *job_state_name(enum job_state state)
{
    return state < JOB__COUNT ? job_state_names[state] : "invalid";
}

const char *job_id_field(const struct job *j)
{
    return j->id_field ? j->id_field : "payment_attempt_id";
}

const char *job_attempt(const struct job *j)
{
    return j->have_cmd ? j->id : NULL;
}

const char *job_order(const struct job *j)
{
    return j->have_cmd ? j->order_id : NULL;
}

const char *job_trace(const struct job *j)
{
    return j->traceparent[0] ? j->traceparent : NULL;
}

unsigned job_jitter(const struct job *j)
{
    return (unsigned)(j->offset * 2654435761u) ^ (unsigned)j->partition;
}
