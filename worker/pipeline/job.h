/* A job: one consumed command message on its way through the worker's
 * pipeline, and the list that owns every job.
 *
 * The list keeps the jobs in the order they were consumed, and each state's
 * jobs on a list of their own, so that a stage visits only the jobs it works
 * on. It also keeps the offset accounting: a job holds its message's offset
 * until it is reaped, or until it is detached (its partition was revoked, or
 * the worker stops), and the counts of jobs holding one, per state, are the
 * list's, changed by job_list_add(), job_set(), job_detach() and
 * job_list_remove() alone. */
#ifndef CHARGED_JOB_H
#define CHARGED_JOB_H

#include <stddef.h>
#include <stdint.h>

#include <librdkafka/rdkafka.h>

#include "answer_decision.h"
#include "attempt_status.h"
#include "budget_ask.h"
#include "dead_letter.h"
#include "provider_breaker.h"
#include "provider_client.h"
#include "retry_tries.h"
#include "traceparent.h"

/* The life of one consumed message. Every change goes through job_set(),
 * which checks it against the table of allowed moves (job_may_move). */
enum job_state {
    JOB_BACKLOG,          /* taken from Kafka, not started: over capacity */
    JOB_DEAD_LETTER,      /* to be produced to the DLQ */
    JOB_DEAD_LETTER_SENT, /* waiting for the broker's acknowledgement */
    JOB_RECORD,           /* insert-or-read the attempt (a new one claimed too) */
    JOB_CLAIM,            /* claim it now */
    JOB_WAIT,             /* leased by someone else: claim again at next_at */
    JOB_CALL,             /* ours: call the provider at next_at */
    JOB_CALLING,          /* provider call in flight */
    JOB_CALLING_FENCED,   /* call in flight, but our lease was lost meanwhile:
                             its answer is logged, never persisted */
    JOB_PERSIST,          /* outcome known: persist it */
    JOB_PARKED,           /* throttled (429), its key in use (409), or
                             waiting for the provider budget: not executed;
                             holds its lease and its offset but no in-flight
                             slot; back to CALL at next_at when a slot is
                             free */
    JOB_DONE,             /* effects durable (or given up): reap it */
    JOB__COUNT
};

/* What a job's record says of its wait before the call (migration 0021's
 * waiting_reason; engine_core.h's "the wait a record shows"). */
enum job_waiting {
    JOB_WAITING_NONE,      /* not waiting, or not long enough to say */
    JOB_WAITING_BUDGET,    /* "provider_budget": the fleet's budget */
    JOB_WAITING_THROTTLED, /* "provider_throttled": parked after 429s, or held
                              by the pace the provider's 429s cut */
};

struct job {
    /* The list's own: read them through the functions below, never write. */
    struct job *prev, *next;             /* every job, oldest first */
    struct job *state_prev, *state_next; /* the jobs of this state */
    enum job_state state;
    int detached; /* no longer holds an offset: takes no new step that needs
                     one; a call already in flight still ends, and its outcome
                     is still persisted under our lease */

    rd_kafka_message_t *msg;
    int32_t partition;
    int64_t offset;
    int64_t next_at; /* WAIT, CALL, PARKED, DEAD_LETTER, PERSIST: not before */
    /* The operation's parsed command and what its claim says to send: its
     * engine_op's command_size and params_size bytes, owned with the job. */
    void *command, *params;
    int have_cmd;
    const char *id, *order_id;             /* the command's, once parsed (have_cmd) */
    int kind;                              /* its engine_op kind_of */
    const char *id_field;                  /* the log field of id; NULL: the default */
    char traceparent[TRACEPARENT_LEN + 1]; /* the command's, when valid; or "" */
    enum dead_letter_reason dl_reason;
    char dl_error[256];
    int dl_cut;          /* produce the dead letter with key/value cut */
    int64_t lease_epoch; /* of our claim, when we hold one */
    int64_t claimed_at;  /* clock_now_ms of our claim */
    int64_t key_age_ms;  /* the key's age at claimed_at (database clock) */
    int calls;           /* provider calls under this claim */
    int calls_throttled; /* of them, answered 429: proven not executed */
    struct provider_breaker_ticket ticket; /* CALLING: what the breaker allowed */
    struct retry_tries tries;              /* answers counted under this claim */
    int64_t call_started_ms;               /* wall clock, for provider_calls */
    int64_t call_sent_ms;                  /* clock_now_ms of the same: the pace's */
    struct provider_result res;            /* the last answer */
    struct answer_decision decision;       /* PERSIST: what to write (the
                                              operation's decide) */
    int busy_persists; /* PERSIST: tries that found the row held by a peer */
    int lock_waits;    /* RECORD, CLAIM: statements another session's lock held */
    int in_lane; /* RECORD, CLAIM, WAIT, PERSIST: a database lane's statement holds
                    it (engine_store.c); the loop leaves it alone until it ends */
    struct budget_ask budget; /* CALL, PARKED: its call's place at the budget's
                                 gate (engine_provider.c's budget_of) */
    int budget_long;          /* its wait for the budget passed
                                 ENGINE_BUDGET_LONG_MS (said once a wait) */
    int64_t throttled_since;  /* clock_now_ms of the first 429 of the answers
                                 it got since one that was not (0: none) */
    int64_t paced_since;      /* CALL: clock_now_ms it was first held back by
                                 the process's 429 pace (0: not held) */
    /* The wait its record should show (want, since when: wall ms), and
     * what it shows as far as this worker wrote (shown, under the claim of
     * shown_epoch: a new claim's record shows none). */
    enum job_waiting wait_want, wait_shown;
    int64_t wait_since_ms, wait_shown_since_ms, wait_shown_epoch;
    /* What became of the message, for charged_messages_total once the job
     * is reaped: a string literal; NULL when it was given up (detached). */
    const char *outcome;
};

typedef struct job_list job_list_t;

job_list_t *job_list_new(void);
/* Frees the list, not the jobs: remove them first. NULL is a no-op. */
void job_list_free(job_list_t *list);

/* Appends j (zeroed but for its message fields) as the youngest job, in
 * JOB_BACKLOG, holding its offset. The list does not own j's memory. */
void job_list_add(job_list_t *list, struct job *j);
/* Unlinks j; the caller frees it. */
void job_list_remove(job_list_t *list, struct job *j);

/* Moves j to `to`. A move the table does not allow is a bug of ours: it is
 * logged and the process aborts, so that no offset past it is committed. A
 * move to the state it is in keeps its place. */
void job_set(job_list_t *list, struct job *j, enum job_state to);
/* Writes j's dead-letter error text (printf-style) into dl_error: cut to fit
 * on a character boundary, never inside a UTF-8 sequence, with what
 * utf8_text_copy replaces replaced (it becomes a Kafka header and a log
 * field). */
void job_set_error(struct job *j, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* j no longer holds an offset. Idempotent. */
void job_detach(job_list_t *list, struct job *j);

/* Oldest first: every job, or the jobs of one state in the order they
 * entered it. A caller that moves the job it stands on takes the next one
 * first. */
struct job *job_list_oldest(const job_list_t *list);
struct job *job_younger(const struct job *j);
struct job *job_list_first(const job_list_t *list, enum job_state state);
struct job *job_next_in_state(const struct job *j);

/* Jobs in `state`; of those, the ones holding an offset; and the ones due
 * (next_at <= now). */
size_t job_list_count(const job_list_t *list, enum job_state state);
size_t job_list_holding_in(const job_list_t *list, enum job_state state);
size_t job_list_due(const job_list_t *list, enum job_state state, int64_t now);
/* The earliest next_at in `state`; INT64_MAX when it has no job. */
int64_t job_list_next_at(const job_list_t *list, enum job_state state);
/* Jobs holding an offset, and of those the ones started (not BACKLOG). */
size_t job_list_holding(const job_list_t *list);
size_t job_list_started(const job_list_t *list);

int job_may_move(enum job_state from, enum job_state to);
const char *job_state_name(enum job_state state);

/* What log lines about a job name (absent ones are left out: a message
 * that is no command has no ids). */
const char *job_attempt(const struct job *j);
const char *job_order(const struct job *j);
const char *job_trace(const struct job *j);
/* The log field a job's id is ("payment_attempt_id", "refund_id"). */
const char *job_id_field(const struct job *j);
#define JOB_FIELDS(j)                                                                  \
    job_id_field(j), job_attempt(j), "order_id", job_order(j), "traceparent",          \
        job_trace(j)
/* Spreads the retries of many attempts apart. */
unsigned job_jitter(const struct job *j);

#endif
