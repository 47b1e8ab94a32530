/* sim_actors: the simulation's world (tests/sim), shared by its files:
 * charged_sim.c (the scheduler, the order service's commands, the
 * invariants the models call into, the command line), sim_workers.c (the
 * workers' stages over the engine's core) and sim_reconciler.c (the
 * reconcilers' looks and the api's webhook path). Test-only code. */
#ifndef CHARGED_SIM_ACTORS_H
#define CHARGED_SIM_ACTORS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "batch_gate.h"
#include "budget_gate.h"
#include "engine_core.h"
#include "job.h"
#include "offset_tracker.h"
#include "reconcile_look.h"
#include "sim_provider.h"
#include "sim_rng.h"
#include "sim_store.h"
#include "sim_world.h"

#define NPARTS       4
#define NWORKERS     3
#define NRECONCILERS 2
#define MAX_JOBS     64 /* a worker's backlog cap (WORKER_MAX_IN_FLIGHT-ish) */
/* Slots: fewer than MAX_JOBS, so that a backlog waits for them (issue 38:
 * throttled jobs must not hold them all). */
#define MAX_IN_FLIGHT    8
#define TRACE_N          32
#define RECONCILER_ID(i) (100 + (i))
#define START_MS         1700000000000LL

/* ---- the trace: the last steps, formatted only when printed ---- */

enum act {
    A_IDLE,
    A_GEN_CHARGE,
    A_GEN_DUP,
    A_GEN_SECOND,
    A_GEN_SAMEKEY,
    A_GEN_BAD,
    A_GEN_REFUND,
    A_GEN_STEP,
    A_FETCH,
    A_START,
    A_DEAD_LETTER,
    A_RECORD,
    A_CLAIM,
    A_CALL,
    A_KEY_CLOSED,
    A_ANSWER,
    A_PERSIST,
    A_RENEW,
    A_COMMIT,
    A_CRASH,
    A_REBALANCE,
    A_JUMP,
    A_REC_CLAIM,
    A_REC_CALL,
    A_REC_SETTLE,
    A_WEBHOOK,
    A__COUNT
};
struct trace_entry {
    uint64_t step;
    int64_t now;
    int actor; /* worker i, RECONCILER_ID(i), -1 the world */
    enum act act;
    long long a, b;
};

/* ---- the world ---- */

/* An authorization is a charge with capture_method manual; a capture or
 * a void names it (charge). */
enum msg_kind { MSG_CHARGE, MSG_REFUND, MSG_BAD, MSG_AUTHORIZE, MSG_CAPTURE, MSG_VOID };

static inline int is_attempt(int kind)
{
    return kind == MSG_CHARGE || kind == MSG_AUTHORIZE;
}

/* A capture's or a void's step kind (sim_world.h), else 0. */
static inline int step_kind(int kind)
{
    return kind == MSG_CAPTURE ? SIM_STEP_CAPTURE
           : kind == MSG_VOID  ? SIM_STEP_VOID
                               : 0;
}

struct msg {
    enum msg_kind kind;
    int id; /* attempt id, or refund id */
    int order, key, charge;
    long long amount;
    int dead_lettered;
};

struct partition {
    int *msgs; /* indices into world.msgs */
    size_t n, cap;
    int64_t committed; /* the group's committed position */
};

struct sim_job {
    struct job j; /* first: a struct job * is a struct sim_job * */
    int msg;
    int target;    /* attempt id or refund id */
    char name[16]; /* the record's id, "a12" or "r12": the job's id */
    int intent;    /* refunds: the charge's intent, from the claim */
    int64_t answer_at;
    struct provider_result answer; /* CALLING: what will arrive */
    uint64_t due_step;             /* PARKED: the step it was first seen due with a slot
                                      free (0: not so) */
};

/* The most requests/s a worker's share of the budget may be (--budget):
 * the sends of its last second are kept to check it. */
#define SIM_BUDGET_MAX 64

struct worker {
    int id, alive;
    /* Its share of the provider budget (--budget): the real gate, and its
     * last sends; the gate is new after a crash (a new process). */
    int gate_on;
    struct budget_gate gate;
    int64_t sent_ms[2 * SIM_BUDGET_MAX]; /* the last calls' starts, a ring */
    uint64_t nsent;
    job_list_t *jobs;
    offset_tracker_t *offsets;
    unsigned parts; /* assigned partitions, a bit each */
    int64_t pos[NPARTS];
    int64_t last_renew, last_commit;
    /* Record and persist run as batches, when their gates allow (the
     * engine's batch_gate; new after a crash). */
    struct batch_gate record_gate, persist_gate;
};

/* A batch this large goes at once, whatever the hold: small, so that the
 * simulation takes that path too. */
#define SIM_BATCH_FULL 4

struct look {
    int active, refund, id;
    int step;        /* a capture's or void's look: its SIM_STEP_*; 0 none */
    int manual;      /* an authorization's look */
    long long asked; /* a capture's amount (0: all) */
    int64_t epoch, claimed_at, busy_until;
    enum attempt_status status;
    int intent, prefund;
    int64_t key_age_ms, first_sent_ms, age_ms;
    char name[40], object[48], intent_name[48]; /* the strings core's look reads */
    struct reconcile_look core;
};

struct reconciler {
    int id;
    int64_t next_poll, renewed_at;
    struct look l;
};

struct world {
    uint64_t seed, step;
    unsigned breaks;
    int trace_all;
    int64_t now;
    struct sim_rng rng;
    struct sim_settings set;
    struct engine_core core; /* the workers' limits, for the engine's core */
    struct sim_violation viol;
    struct sim_store *store;
    struct sim_provider *prov;
    struct msg *msgs;
    size_t nmsgs, capmsgs;
    struct partition parts[NPARTS];
    struct worker workers[NWORKERS];
    struct reconciler recs[NRECONCILERS];
    int next_attempt, next_order, next_refund, next_step;
    unsigned char *seen_events;
    size_t nseen;
    struct trace_entry trace[TRACE_N];
    uint64_t trace_hash;
    uint64_t settled, charges_sent, webhooks;
    /* How often the paths that matter ran (printed per seed). */
    uint64_t jumps, crashes, rebalances, key_closed, fenced, takeovers, rec_settled,
        rec_charges, rec_never_executed, webhook_applied, lost, foreign;
    /* Authorizations and their steps (issue 37). */
    uint64_t authorized, captured, voided, step_rejected, hold_lost, step_unknown,
        captured_refunds;
    uint64_t parked;        /* jobs throttled or their key in use, parked (issue 38) */
    uint64_t set_aside;     /* throttled jobs set aside for the reconciler */
    long long budget_rps;   /* each worker's share of the provider budget; 0: none */
    uint64_t budget_parked; /* calls parked for the budget */
};

/* "pi_12" -> 12; "" -> SIM_NULL. */
static inline int id_of(const char *s)
{
    const char *u = strchr(s, '_');
    return u ? atoi(u + 1) : SIM_NULL;
}

/* The trace: one entry for the step (the last thing it did). */
void sim_note(struct world *w, int actor, enum act act, long long a, long long b);
/* arr with room for need elements (exits when memory runs out). */
void *sim_grow(void *arr, size_t *cap, size_t need, size_t elem);

/* sim_workers.c: one stage of a worker's turn; a worker's jobs and
 * offsets gone (a crash, or the end of a seed); a crash; a partition moved
 * to another worker. */
void sim_worker_step(struct world *w, struct worker *wk);
void sim_worker_reset(struct world *w, struct worker *wk);
void sim_crash(struct world *w, struct worker *wk);
void sim_rebalance(struct world *w);

/* sim_reconciler.c: one step of a reconciler (a claim, a call, a
 * settlement); one webhook delivered; another client's event naming an
 * attempt of ours. */
void sim_rec_step(struct world *w, struct reconciler *r);
void sim_webhook_step(struct world *w);
void sim_foreign_webhook(struct world *w);

#endif
