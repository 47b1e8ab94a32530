/* Unit tests of worker/pipeline/engine_core: the engine's decisions without
 * I/O. A job moves on each answer as docs/worker.md says (a claim opens the
 * call, a lost lease waits, a closed key window settles without a call),
 * the operation's decide is the one asked, an offset is committed only over
 * jobs that no longer hold theirs, and an epoch that goes back stops the
 * process. */
#include <check.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine_core.h"
#include "test_env.h"

#define NJOBS 3

static struct job jobs[NJOBS];
static job_list_t *list;
static int decided_kind;
static int decided_may_replay;
static enum answer_next next_decided;

/* An operation's decide of the test's own: settles UNKNOWN or retries in
 * 250 ms, as next_decided says, and remembers the kind it was asked for. */
static struct answer_decision test_decide(int kind, const struct engine_policy *p,
                                          enum provider_outcome outcome, int may_replay,
                                          int tries, int key_window_open,
                                          unsigned jitter)
{
    (void)p, (void)outcome, (void)tries, (void)jitter;
    decided_kind = kind;
    decided_may_replay = may_replay;
    if (next_decided == ANSWER_NEXT_RETRY && key_window_open)
        return (struct answer_decision){.next = ANSWER_NEXT_RETRY, .retry_in_ms = 250};
    return (struct answer_decision){.next = ANSWER_NEXT_SETTLE,
                                    .status = ATTEMPT_STATUS_UNKNOWN,
                                    .next_check_ms = 2000,
                                    .reason_code = "outcome_unknown"};
}

static const struct engine_core core = {
    .policy = {.unknown_retries = 2,
               .retry_base_ms = 200,
               .retry_max_ms = 5000,
               .first_look_ms = 2000},
    .max_in_flight = 2,
    .recheck_ms = 500,
    .key_retention_ms = 60000,
    .key_margin_ms = 8000,
    .decide = test_decide,
};

static void setup(void)
{
    memset(jobs, 0, sizeof(jobs));
    list = job_list_new();
    ck_assert_ptr_nonnull(list);
    for (int i = 0; i < NJOBS; i++) {
        jobs[i].partition = 0;
        jobs[i].offset = 10 + i;
        jobs[i].kind = 1;
        jobs[i].have_cmd = 1;
        jobs[i].id = i == 0 ? "a0" : "a1"; /* jobs 1 and 2: one record */
        job_list_add(list, &jobs[i]);
    }
    decided_kind = -1;
    next_decided = ANSWER_NEXT_SETTLE;
}

/* j parsed, recorded, and claimed at lease_epoch at `now`. */
static void claim(struct job *j, int64_t lease_epoch, int64_t key_age_ms, int64_t now)
{
    engine_core_parsed(list, j, 1);
    ck_assert_int_eq(engine_core_recorded(list, j, ENGINE_RECORDED, 0, now),
                     ENGINE_NEXT_NONE);
    ck_assert_int_eq(engine_core_claim_answered(&core, list, j, ENGINE_CLAIMED,
                                                lease_epoch, key_age_ms, 0, now),
                     ENGINE_NEXT_CLAIMED);
}

static void teardown(void)
{
    for (struct job *j; (j = job_list_oldest(list));)
        job_list_remove(list, j);
    job_list_free(list);
    list = NULL;
}

/* A job recorded and claimed at once is on to its call at once; a lost
 * lease makes it look again after recheck, and the next claim takes a
 * newer epoch with the key's age the database read. */
START_TEST(a_claim_opens_the_call_and_a_lost_lease_waits)
{
    struct job *j = &jobs[0];
    engine_core_parsed(list, j, 1);
    ck_assert_int_eq(engine_core_recorded(list, j, ENGINE_RECORDED_CLAIMED, 1, 1000),
                     ENGINE_NEXT_CLAIMED);
    ck_assert_int_eq(j->state, JOB_CALL);
    ck_assert_int_eq(j->lease_epoch, 1);
    ck_assert_int_eq(j->next_at, 0);
    ck_assert_int_eq(j->claimed_at, 1000);
    engine_core_lease_lost(&core, list, j, 1200);
    ck_assert_int_eq(j->state, JOB_WAIT);
    ck_assert_int_eq(j->next_at, 1700);
    ck_assert_int_eq(engine_core_claim_gate(&core, list, j, 1600), ENGINE_NEXT_SKIP);
    ck_assert_int_eq(engine_core_claim_gate(&core, list, j, 1700), ENGINE_NEXT_SEND);
    ck_assert_int_eq(
        engine_core_claim_answered(&core, list, j, ENGINE_CLAIMED, 3, 4000, 0, 1700),
        ENGINE_NEXT_CLAIMED);
    ck_assert_int_eq(j->state, JOB_CALL);
    ck_assert_int_eq(j->lease_epoch, 3);
    ck_assert_int_eq(j->key_age_ms, 4000);
}
END_TEST

/* Another job of ours holds the record's lease: the claim waits for it. */
START_TEST(a_record_held_by_another_job_of_ours_waits)
{
    engine_core_parsed(list, &jobs[1], 1);
    engine_core_recorded(list, &jobs[1], ENGINE_RECORDED_CLAIMED, 1, 0);
    engine_core_parsed(list, &jobs[2], 1);
    engine_core_recorded(list, &jobs[2], ENGINE_RECORDED, 0, 0);
    ck_assert_int_eq(jobs[2].state, JOB_CLAIM);
    ck_assert_int_eq(engine_core_claim_gate(&core, list, &jobs[2], 100),
                     ENGINE_NEXT_SKIP);
    ck_assert_int_eq(jobs[2].state, JOB_WAIT);
    ck_assert_int_eq(jobs[2].next_at, 600);
}
END_TEST

/* The key window closes the margin before the retention: past it, the
 * call is never sent and the record is settled by the operation's
 * decision on "not executed". */
START_TEST(past_the_key_window_nothing_is_sent)
{
    struct job *j = &jobs[0];
    claim(j, 1, 50000, 0);
    ck_assert_int_eq(engine_core_key_kept(&core, j, 1999), 1);
    ck_assert_int_eq(engine_core_key_kept(&core, j, 2000), 0); /* 50 + 2 + 8 s */
    ck_assert_int_eq(engine_core_call_gate(&core, list, j, 1999), ENGINE_NEXT_SEND);
    ck_assert_int_eq(engine_core_call_gate(&core, list, j, 2000),
                     ENGINE_NEXT_KEY_CLOSED);
    ck_assert_int_eq(j->state, JOB_PERSIST);
    ck_assert_int_eq(j->res.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(j->decision.status, ATTEMPT_STATUS_UNKNOWN);
    ck_assert_int_eq(decided_kind, 1);
    ck_assert_int_eq(j->calls, 0);
}
END_TEST

/* An answer is decided by the operation: a retry waits its back-off in
 * CALL; a settlement goes to PERSIST; the answer to a fenced call is
 * dropped and the job looks again. */
START_TEST(an_answer_is_the_operations_to_decide)
{
    struct job *j = &jobs[0];
    claim(j, 1, 0, 0);
    engine_core_call_started(list, j);
    ck_assert_int_eq(j->state, JOB_CALLING);
    ck_assert_int_eq(j->calls, 1);
    j->res.outcome = PROVIDER_UNKNOWN;
    next_decided = ANSWER_NEXT_RETRY;
    ck_assert_int_eq(engine_core_answered(&core, list, j, 0, 0, NULL, 100),
                     ENGINE_NEXT_RETRY);
    ck_assert_int_eq(j->state, JOB_CALL);
    ck_assert_int_eq(j->next_at, 350);
    ck_assert_int_eq(j->tries.unknown, 1);
    engine_core_call_started(list, j);
    next_decided = ANSWER_NEXT_SETTLE;
    ck_assert_int_eq(engine_core_answered(&core, list, j, 0, 0, NULL, 400),
                     ENGINE_NEXT_SETTLE);
    ck_assert_int_eq(j->state, JOB_PERSIST);
    ck_assert_int_eq(j->tries.unknown, 2);

    struct job *f = &jobs[1];
    claim(f, 1, 0, 0);
    engine_core_call_started(list, f);
    engine_core_lease_lost(&core, list, f, 10);
    ck_assert_int_eq(f->state, JOB_CALLING_FENCED);
    ck_assert_int_eq(engine_core_answered(&core, list, f, 0, 0, NULL, 20),
                     ENGINE_NEXT_FENCED);
    ck_assert_int_eq(f->state, JOB_WAIT);
    ck_assert_int_eq(f->next_at, 520);
}
END_TEST

/* The failure that opens the breaker counts no try, once a message. */
START_TEST(the_outage_spares_one_failure)
{
    struct retry_tries t = {0};
    int outage = 0;
    ck_assert_int_eq(retry_tries_count(&t, PROVIDER_UNKNOWN, 1, 1, &outage), 0);
    ck_assert_int_eq(outage, 1);
    ck_assert_int_eq(retry_tries_count(&t, PROVIDER_UNKNOWN, 1, 1, &outage), 1);
    ck_assert_int_eq(outage, 0);
    ck_assert_int_eq(retry_tries_count(&t, PROVIDER_SUCCEEDED, 0, 0, NULL), 1);
    long long b =
        retry_backoff_ms(core.policy.retry_base_ms, core.policy.retry_max_ms, 3, 7);
    ck_assert(b >= 400 && b <= 800); /* 200 * 2^2, jittered into [d/2, d] */
    ck_assert_int_eq(retry_backoff_ms(core.policy.retry_base_ms,
                                      core.policy.retry_max_ms, 40, 7) <= 5000,
                     1);
}
END_TEST

/* An offset is committed only over jobs that no longer hold theirs: a job
 * still working holds every offset from its own; reaped or given up, it
 * holds none. */
START_TEST(a_commit_never_passes_a_held_job)
{
    offset_tracker_t *t = offset_tracker_new();
    for (int i = 0; i < NJOBS; i++)
        offset_tracker_begin(t, 0, jobs[i].offset);
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 10), 1);
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 11), 0);
    ck_assert_int_eq(engine_core_commit_ok(list, 1, 11), 1);
    /* Taken and never started: given up, it is done and holds nothing. */
    ck_assert_int_eq(engine_core_detach(list, &jobs[0]), ENGINE_NEXT_NONE);
    ck_assert_int_eq(jobs[0].state, JOB_DONE);
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 11), 1);
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 12), 0);
    ck_assert_str_eq(engine_core_reap(list, t, &jobs[0]), "released");
    /* A given-up offset is not done: the tracker still stops before it. */
    ck_assert_int_eq(offset_tracker_committable(t, 0), 10);
    /* A job that settled is reaped and its offset done. */
    engine_core_parsed(list, &jobs[1], 1);
    engine_core_recorded(list, &jobs[1], ENGINE_REJECTED, 0, 0);
    ck_assert_str_eq(engine_core_reap(list, t, &jobs[1]), "rejected");
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 12), 1);
    offset_tracker_free(t);
}
END_TEST

/* A call out keeps its lease when its message is given up; a call not yet
 * sent lets it go. */
START_TEST(a_given_up_call_keeps_its_lease_only_while_it_is_out)
{
    for (int i = 0; i < 2; i++) {
        engine_core_parsed(list, &jobs[i], 1);
        engine_core_recorded(list, &jobs[i], ENGINE_RECORDED_CLAIMED, 1, 0);
    }
    engine_core_call_started(list, &jobs[1]);
    ck_assert_int_eq(engine_core_detach(list, &jobs[0]), ENGINE_NEXT_RELEASE);
    ck_assert_int_eq(jobs[0].state, JOB_DONE);
    ck_assert_int_eq(engine_core_detach(list, &jobs[1]), ENGINE_NEXT_SKIP);
    ck_assert_int_eq(jobs[1].state, JOB_CALLING);
    ck_assert_int_eq(job_list_holding(list), 1); /* jobs[2], in the backlog */
}
END_TEST

/* The loop wakes at once for a job to reap or to start, otherwise when the
 * earliest due job is, never later than the cap (10 ms while draining). */
START_TEST(the_loop_sleeps_until_something_is_due)
{
    struct engine_core_wake w = {.cap = 100, .take_new = 1, .calls_at = 0, .db_at = 0};
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 1000), 0); /* a backlog */
    w.take_new = 0;
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 1000), 100);
    w.revoking = 1;
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 1000), 10);
    w.revoking = 0;
    engine_core_parsed(list, &jobs[0], 1);
    engine_core_recorded(list, &jobs[0], ENGINE_RECORDED, 0, 1000);
    engine_core_claim_answered(&core, list, &jobs[0], ENGINE_BUSY, 0, 0, 0, 1000);
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 1000), 100); /* at 1500 */
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 1460), 40);
    engine_core_parsed(list, &jobs[1], 1);
    engine_core_recorded(list, &jobs[1], ENGINE_REJECTED, 0, 0);
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 1460), 0); /* to reap */
}
END_TEST

/* Issue 38 (adversary 36): a throttled answer, or a 409 key in use, parks
 * its job: its slot is free for others, it keeps its lease and its offset
 * (nothing is committed past it), and it comes back when due (Retry-After,
 * never less; else the back-off) and a slot is free, before the backlog. */
START_TEST(a_throttled_job_parks_and_frees_its_slot)
{
    next_decided = ANSWER_NEXT_RETRY;
    claim(&jobs[0], 1, 0, 0);
    claim(&jobs[1], 1, 0, 0);
    ck_assert_int_eq((long long)engine_core_started(list), core.max_in_flight);
    engine_core_call_started(list, &jobs[0]);
    engine_core_call_started(list, &jobs[1]);
    jobs[0].res = (struct provider_result){.outcome = PROVIDER_NOT_EXECUTED,
                                           .http_status = 429,
                                           .throttled = 1,
                                           .retry_after_ms = 1500};
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[0], 0, 0, NULL, 100),
                     ENGINE_NEXT_PARKED);
    ck_assert_int_eq(jobs[0].state, JOB_PARKED);
    ck_assert(jobs[0].next_at >= 1600 && jobs[0].next_at <= 1750);
    jobs[1].res =
        (struct provider_result){.outcome = PROVIDER_NOT_EXECUTED, .http_status = 409};
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[1], 0, 0, NULL, 100),
                     ENGINE_NEXT_PARKED);
    ck_assert(jobs[1].next_at >= 200 && jobs[1].next_at <= 300); /* back-off, try 1 */
    /* Both slots free; both offsets still held. */
    ck_assert_int_eq(engine_core_started(list), 0);
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 11), 0);
    ck_assert_int_eq(engine_core_only_calls_left(list), 1);
    /* Not due: it stays; the loop wakes when it is. */
    ck_assert_int_eq(engine_core_park_gate(&core, list, &jobs[1], 150),
                     ENGINE_NEXT_SKIP);
    struct engine_core_wake w = {.cap = 1000, .take_new = 0};
    ck_assert_int_eq(engine_core_idle_ms(&core, list, &w, 150),
                     (int)(jobs[1].next_at - 150));
    /* Due: back to CALL, sent with the same claim (its epoch, its key). */
    ck_assert_int_eq(engine_core_park_gate(&core, list, &jobs[1], 300),
                     ENGINE_NEXT_SEND);
    ck_assert_int_eq(jobs[1].state, JOB_CALL);
    ck_assert_int_eq(jobs[1].lease_epoch, 1);
    ck_assert_int_eq(engine_core_call_gate(&core, list, &jobs[1], 300),
                     ENGINE_NEXT_SEND);
    /* A slot taken by another job: a due parked job waits for one. */
    engine_core_parsed(list, &jobs[2], 1);
    ck_assert_int_eq((long long)engine_core_started(list), core.max_in_flight);
    ck_assert_int_eq(engine_core_park_gate(&core, list, &jobs[0], 2000),
                     ENGINE_NEXT_SKIP);
    ck_assert_int_eq(jobs[0].state, JOB_PARKED);
    /* A parked job's lease lost: it looks again; given up: released. */
    engine_core_lease_lost(&core, list, &jobs[0], 2000);
    ck_assert_int_eq(jobs[0].state, JOB_WAIT);
}
END_TEST

/* Issue 38's fleet budget: a call the gate makes wait parks for exactly
 * the gate's wait, out of its slot, its offset held; back, it is sent with
 * the same claim; a wait past ENGINE_BUDGET_LONG_MS is said once. */
START_TEST(a_call_over_the_budget_parks_for_the_gates_wait)
{
    enum budget_class c = BUDGET_CLASS_CREATE;
    enum budget_priority p = BUDGET_PRIO_CHARGE;
    claim(&jobs[0], 1, 0, 0);
    ck_assert_int_eq(engine_core_call_gate(&core, list, &jobs[0], 10),
                     ENGINE_NEXT_SEND);
    ck_assert_int_eq(engine_core_budget(list, &jobs[0], 0, 10), ENGINE_NEXT_NONE);
    ck_assert_int_eq(jobs[0].state, JOB_CALL);
    jobs[0].budget = (struct budget_ask){{c, p, 1}, 10, 1};
    ck_assert_int_eq(engine_core_budget(list, &jobs[0], 37, 10), ENGINE_NEXT_PARKED);
    ck_assert_int_eq(jobs[0].state, JOB_PARKED);
    ck_assert_int_eq(jobs[0].next_at, 47); /* exactly the gate's wait */
    ck_assert_int_eq(engine_core_started(list), 0);
    ck_assert_int_eq(engine_core_commit_ok(list, 0, 11), 0);
    ck_assert_int_eq(engine_core_park_gate(&core, list, &jobs[0], 46),
                     ENGINE_NEXT_SKIP);
    ck_assert_int_eq(engine_core_park_gate(&core, list, &jobs[0], 47),
                     ENGINE_NEXT_SEND);
    ck_assert_int_eq(jobs[0].lease_epoch, 1);
    ck_assert_int_eq(engine_core_budget_waited_long(&jobs[0], 900), 0);
    ck_assert_int_eq(engine_core_budget_waited_long(&jobs[0], 1010), 1);
    ck_assert_int_eq(engine_core_budget_waited_long(&jobs[0], 2000), 0); /* once */
    /* Given up while it waits: released, as a throttled one. */
    ck_assert_int_eq(engine_core_budget(list, &jobs[0], 250, 47), ENGINE_NEXT_PARKED);
    ck_assert_int_eq(engine_core_detach(list, &jobs[0]), ENGINE_NEXT_RELEASE);
}
END_TEST

/* Latency is honest (issue 38): a job held back before its call for
 * ENGINE_BUDGET_LONG_MS says why on its record, since when it waits, until
 * its call starts; a wait shorter than that says nothing; a record is
 * written only when what it should say changes. */
START_TEST(a_long_wait_is_said_on_the_record_until_the_call_starts)
{
    struct job j = {0};
    j.lease_epoch = 1;
    ck_assert_str_eq(engine_core_waiting_name(JOB_WAITING_BUDGET), "provider_budget");
    ck_assert_str_eq(engine_core_waiting_name(JOB_WAITING_THROTTLED),
                     "provider_throttled");
    ck_assert_ptr_null(engine_core_waiting_name(JOB_WAITING_NONE));
    /* The budget: said once it waited a second, since its first ask. */
    j.budget =
        (struct budget_ask){{BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE, 1}, 100, 1};
    ck_assert_int_eq(engine_core_budget_waited_long(&j, 1099), 0);
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    ck_assert_int_eq(engine_core_budget_waited_long(&j, 1100), 1);
    engine_core_wait_budget(&j, 1100, 50000);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_BUDGET);
    ck_assert_int_eq(j.wait_since_ms, 49000);
    ck_assert_int_eq(engine_core_wait_due(&j), 1);
    j.wait_shown = j.wait_want, j.wait_shown_since_ms = j.wait_since_ms; /* written */
    j.wait_shown_epoch = 1;
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    /* Its call starts: the record no longer waits. */
    engine_core_wait_ends(&j);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_NONE);
    ck_assert_int_eq(engine_core_wait_due(&j), 1);
    j.wait_shown = JOB_WAITING_NONE;
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    /* 429s: a short park says nothing; the run of them counts from the
     * first, and one that will have lasted a second is said at once. */
    engine_core_wait_answered(&j, 1, 300, 2000, 60000);
    ck_assert_int_eq(j.throttled_since, 2000);
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    engine_core_wait_ends(&j); /* sent again */
    engine_core_wait_answered(&j, 1, 700, 2400, 60400);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_THROTTLED);
    ck_assert_int_eq(j.wait_since_ms, 60000);
    ck_assert_int_eq(engine_core_wait_due(&j), 1);
    j.wait_shown = j.wait_want, j.wait_shown_since_ms = j.wait_since_ms;
    /* A new claim (its lease lost and taken again) cleared the record: the
     * same wait is said again under it. */
    j.lease_epoch = 2;
    ck_assert_int_eq(engine_core_wait_due(&j), 1);
    j.wait_shown_epoch = 2;
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    /* Sent again and throttled again before the record was written: the
     * same wait, nothing to write. */
    engine_core_wait_ends(&j);
    engine_core_wait_answered(&j, 1, 1000, 3200, 61200);
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    /* Any other answer ends the run: the next 429 starts a new one. */
    engine_core_wait_ends(&j);
    engine_core_wait_answered(&j, 0, 0, 4300, 62300);
    ck_assert_int_eq(j.throttled_since, 0);
    ck_assert_int_eq(engine_core_wait_due(&j), 1); /* the end is written */
    /* A Retry-After of a second or more is said at its first 429. */
    engine_core_wait_answered(&j, 1, 1000, 5000, 63000);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_THROTTLED);
    ck_assert_int_eq(j.wait_since_ms, 63000);
}
END_TEST

/* Adversary 38f: a job held back by the process's 429 pace never asks the
 * budget nor gets a 429 of its own, yet it waits for the provider's word:
 * held a second, its record says provider_throttled, since it was first
 * held (or since its own run of 429s, when earlier), until its call. */
START_TEST(a_job_held_at_the_pace_says_so)
{
    struct job j = {0};
    j.lease_epoch = 1;
    ck_assert_int_eq(engine_core_wait_paced(&j, 500, 40000), 0);
    ck_assert_int_eq(j.paced_since, 500);
    ck_assert_int_eq(engine_core_wait_paced(&j, 1499, 40999), 0);
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    ck_assert_int_eq(engine_core_wait_paced(&j, 1500, 41000), 1);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_THROTTLED);
    ck_assert_int_eq(j.wait_since_ms, 40000);
    ck_assert_int_eq(engine_core_wait_due(&j), 1);
    j.wait_shown = j.wait_want, j.wait_shown_since_ms = j.wait_since_ms; /* written */
    j.wait_shown_epoch = 1;
    /* Held on: the same wait, nothing to write. */
    ck_assert_int_eq(engine_core_wait_paced(&j, 2500, 42000), 1);
    ck_assert_int_eq(engine_core_wait_due(&j), 0);
    /* Its call starts: neither the wait nor the hold goes on. */
    engine_core_wait_ends(&j);
    ck_assert_int_eq(j.paced_since, 0);
    ck_assert_int_eq(engine_core_wait_due(&j), 1);
    j.wait_shown = JOB_WAITING_NONE;
    /* A 429 parked it briefly (not said), then the pace held it: one wait,
     * since that 429. */
    engine_core_wait_answered(&j, 1, 200, 3000, 50000);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_NONE);
    ck_assert_int_eq(engine_core_wait_paced(&j, 3600, 50600), 0);
    ck_assert_int_eq(engine_core_wait_paced(&j, 4000, 51000), 1);
    ck_assert_int_eq(j.wait_since_ms, 50000);
    /* A wait already said keeps its reason and its since. */
    engine_core_wait_ends(&j);
    j.budget =
        (struct budget_ask){{BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE, 1}, 5000, 1};
    ck_assert_int_eq(engine_core_budget_waited_long(&j, 6000), 1);
    engine_core_wait_budget(&j, 6000, 60000);
    ck_assert_int_eq(engine_core_wait_paced(&j, 6100, 60100), 1);
    ck_assert_int_eq(j.wait_want, JOB_WAITING_BUDGET);
    ck_assert_int_eq(j.wait_since_ms, 59000);
}
END_TEST

static int kind_one_sets_aside(int kind)
{
    return kind == 1;
}

/* j, parked, sent again at `now` and answered `res` then. */
static enum engine_next again(const struct engine_core *c, struct job *j,
                              const struct provider_result *res, int64_t now)
{
    ck_assert_int_eq(engine_core_park_gate(c, list, j, now), ENGINE_NEXT_SEND);
    ck_assert_int_eq(engine_core_call_gate(c, list, j, now), ENGINE_NEXT_SEND);
    engine_core_call_started(list, j);
    j->res = *res;
    return engine_core_answered(c, list, j, 0, 0, NULL, now);
}

static const struct provider_result throttled_1s = {.outcome = PROVIDER_NOT_EXECUTED,
                                                    .http_status = 429,
                                                    .throttled = 1,
                                                    .retry_after_ms = 1000};

/* Adversary 38i: parked jobs hold their messages; with as many parked as
 * may be started, the next throttled one of a kind that may be set aside
 * settles PROCESSING for the reconciler's look when its park would end
 * (no event, reason provider_throttled) and lets its message go. A key in
 * use (409) still parks. */
START_TEST(a_throttled_job_is_set_aside_once_parked_jobs_fill_the_slots)
{
    struct engine_core c = core;
    c.sets_aside = kind_one_sets_aside;
    next_decided = ANSWER_NEXT_RETRY;
    jobs[2].id = "a2";
    for (int i = 0; i < 2; i++) {
        claim(&jobs[i], 1, 0, 0);
        engine_core_call_started(list, &jobs[i]);
        jobs[i].res = throttled_1s;
        ck_assert_int_eq(engine_core_answered(&c, list, &jobs[i], 0, 0, NULL, 100),
                         ENGINE_NEXT_PARKED);
    }
    ck_assert_int_eq((long long)job_list_count(list, JOB_PARKED), c.max_in_flight);
    claim(&jobs[2], 1, 0, 100);
    engine_core_call_started(list, &jobs[2]);
    jobs[2].res =
        (struct provider_result){.outcome = PROVIDER_NOT_EXECUTED, .http_status = 409};
    ck_assert_int_eq(engine_core_answered(&c, list, &jobs[2], 0, 0, NULL, 100),
                     ENGINE_NEXT_PARKED);
    ck_assert_int_eq(again(&c, &jobs[2], &throttled_1s, jobs[2].next_at),
                     ENGINE_NEXT_SET_ASIDE);
    const struct answer_decision *d = &jobs[2].decision;
    ck_assert_int_eq(jobs[2].state, JOB_PERSIST);
    ck_assert_int_eq(d->next, ANSWER_NEXT_SETTLE);
    ck_assert_int_eq(d->status, ATTEMPT_STATUS_PROCESSING);
    ck_assert_str_eq(d->reason_code, "provider_throttled");
    ck_assert_ptr_null(d->event_type);
    ck_assert(d->next_check_ms >= 1000 && d->next_check_ms <= 1100);
    /* The parked ones still are. */
    ck_assert_int_eq(jobs[0].state, JOB_PARKED);
    ck_assert_int_eq(jobs[1].state, JOB_PARKED);
}
END_TEST

/* A job the provider has throttled for ENGINE_SET_ASIDE_AFTER_MS is set
 * aside however few are parked: its offset no longer holds its partition's
 * commits. A kind that may not be set aside stays parked. */
START_TEST(a_job_throttled_a_minute_is_set_aside)
{
    struct engine_core c = core;
    c.sets_aside = kind_one_sets_aside;
    c.key_retention_ms = 24 * 3600 * 1000LL;
    next_decided = ANSWER_NEXT_RETRY;
    jobs[1].kind = 2;
    for (int i = 0; i < 2; i++) {
        struct job *j = &jobs[i];
        int64_t t = 1000;
        claim(j, 1, 0, t);
        engine_core_call_started(list, j);
        j->res = throttled_1s;
        ck_assert_int_eq(engine_core_answered(&c, list, j, 0, 0, NULL, t),
                         ENGINE_NEXT_PARKED);
        engine_core_wait_answered(j, 1, j->next_at - t, t, t);
        t += ENGINE_SET_ASIDE_AFTER_MS - 1;
        ck_assert_int_eq(again(&c, j, &throttled_1s, t), ENGINE_NEXT_PARKED);
        engine_core_wait_answered(j, 1, j->next_at - t, t, t);
        t = j->next_at;
        ck_assert_int_eq(again(&c, j, &throttled_1s, t),
                         i == 0 ? ENGINE_NEXT_SET_ASIDE : ENGINE_NEXT_PARKED);
    }
    ck_assert_int_eq(jobs[0].state, JOB_PERSIST);
    ck_assert_int_eq(jobs[1].state, JOB_PARKED);
}
END_TEST

/* An answer may be a replay of an earlier call of the claim only if that
 * call may have executed: after a 429 (answered before anything executes)
 * the next answer is the first execution's (chaos seed 5: an
 * authorization's hold after a 429 was taken for a replay, UNKNOWN, and
 * its capture refused meanwhile); after an unknown outcome it may not be. */
START_TEST(only_a_call_that_may_have_executed_makes_a_replay)
{
    next_decided = ANSWER_NEXT_RETRY;
    claim(&jobs[0], 1, 0, 0);
    engine_core_call_started(list, &jobs[0]);
    jobs[0].res = throttled_1s;
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[0], 0, 0, NULL, 0),
                     ENGINE_NEXT_PARKED);
    ck_assert_int_eq(decided_may_replay, 0);
    next_decided = ANSWER_NEXT_SETTLE;
    const struct provider_result held = {.outcome = PROVIDER_AUTHORIZED,
                                         .http_status = 200};
    ck_assert_int_eq(again(&core, &jobs[0], &held, jobs[0].next_at),
                     ENGINE_NEXT_SETTLE);
    ck_assert_int_eq(decided_may_replay, 0);

    /* An unknown outcome first: the next answer may be its replay. */
    next_decided = ANSWER_NEXT_RETRY;
    claim(&jobs[1], 1, 0, 0);
    engine_core_call_started(list, &jobs[1]);
    jobs[1].res =
        (struct provider_result){.outcome = PROVIDER_UNKNOWN, .http_status = 503};
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[1], 0, 0, NULL, 0),
                     ENGINE_NEXT_RETRY);
    next_decided = ANSWER_NEXT_SETTLE;
    ck_assert_int_eq(engine_core_call_gate(&core, list, &jobs[1], jobs[1].next_at),
                     ENGINE_NEXT_SEND);
    engine_core_call_started(list, &jobs[1]);
    jobs[1].res = held;
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[1], 0, 0, NULL, 300),
                     ENGINE_NEXT_SETTLE);
    ck_assert_int_eq(decided_may_replay, 1);
}
END_TEST

/* Adversary 38j: the set-aside rule counts parked jobs to tell that the
 * card's throttled ones fill the slots, but a call waiting for the fleet
 * budget is parked too (engine_core_budget). Under a budget that binds,
 * jobs waiting for it (up to BUDGET_GATE_WAIT_MAX_MS each time) fill
 * max_in_flight all the time, so a charge the provider throttled once is
 * set aside and sent again by the reconciler, whose calls wait below every
 * charge's (test_adv38j_aside_behind_budget:
 * 12-17 s behind 334-427 later charges, against 0.6-2.4 s parked). A wait
 * for the budget is no throttle: with only such waits parked, a throttled
 * job parks. */
START_TEST(jobs_waiting_for_the_budget_do_not_set_a_throttled_one_aside)
{
    struct engine_core c = core;
    c.sets_aside = kind_one_sets_aside;
    next_decided = ANSWER_NEXT_RETRY;
    jobs[2].id = "a2";
    for (int i = 0; i < 2; i++) {
        claim(&jobs[i], 1, 0, 0);
        ck_assert_int_eq(engine_core_call_gate(&c, list, &jobs[i], 10),
                         ENGINE_NEXT_SEND);
        jobs[i].budget =
            (struct budget_ask){{BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE, 1}, 10, 1};
        ck_assert_int_eq(engine_core_budget(list, &jobs[i], 250, 10),
                         ENGINE_NEXT_PARKED);
    }
    ck_assert_int_eq((long long)job_list_count(list, JOB_PARKED), c.max_in_flight);
    claim(&jobs[2], 1, 0, 20);
    ck_assert_int_eq(engine_core_call_gate(&c, list, &jobs[2], 20), ENGINE_NEXT_SEND);
    engine_core_call_started(list, &jobs[2]);
    jobs[2].res = throttled_1s;
    ck_assert_int_eq(engine_core_answered(&c, list, &jobs[2], 0, 0, NULL, 30),
                     ENGINE_NEXT_PARKED);
}
END_TEST

/* Adversary 38k: waiting jobs hold no slot, but one that passes the claim
 * gate takes one at once: with one slot free, the first of two due
 * waiting jobs is claimed, the second waits for another slot. */
START_TEST(waiting_jobs_due_together_take_only_the_free_slots)
{
    jobs[2].id = "a2";
    claim(&jobs[0], 1, 0, 0);
    for (int i = 1; i < 3; i++) {
        engine_core_parsed(list, &jobs[i], 1);
        ck_assert_int_eq(engine_core_recorded(list, &jobs[i], ENGINE_RECORDED, 0, 0),
                         ENGINE_NEXT_NONE);
        ck_assert_int_eq(
            engine_core_claim_answered(&core, list, &jobs[i], ENGINE_BUSY, 0, 0, 0, 0),
            ENGINE_NEXT_NONE);
        ck_assert_int_eq(jobs[i].state, JOB_WAIT);
    }
    /* Waiting, they hold none of the two slots. */
    ck_assert_int_eq(engine_core_started(list), 1);
    int64_t due = jobs[2].next_at > jobs[1].next_at ? jobs[2].next_at : jobs[1].next_at;
    ck_assert_int_eq(engine_core_claim_gate(&core, list, &jobs[1], due),
                     ENGINE_NEXT_SEND);
    ck_assert_int_eq(jobs[1].state, JOB_CLAIM);
    ck_assert_int_eq((long long)engine_core_started(list), core.max_in_flight);
    ck_assert_int_eq(engine_core_claim_gate(&core, list, &jobs[2], due),
                     ENGINE_NEXT_SKIP);
    ck_assert_int_eq(jobs[2].state, JOB_WAIT);
}
END_TEST

START_TEST(a_parked_job_given_up_lets_its_lease_go)
{
    next_decided = ANSWER_NEXT_RETRY;
    claim(&jobs[0], 1, 0, 0);
    engine_core_call_started(list, &jobs[0]);
    jobs[0].res = (struct provider_result){
        .outcome = PROVIDER_NOT_EXECUTED, .http_status = 429, .throttled = 1};
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[0], 0, 0, NULL, 0),
                     ENGINE_NEXT_PARKED);
    ck_assert_int_eq(engine_core_detach(list, &jobs[0]), ENGINE_NEXT_RELEASE);
    ck_assert_int_eq(jobs[0].state, JOB_DONE);
    /* Other not-executed answers (nothing sent, 401...) retry in their slot. */
    claim(&jobs[1], 1, 0, 0);
    engine_core_call_started(list, &jobs[1]);
    jobs[1].res = (struct provider_result){.outcome = PROVIDER_NOT_EXECUTED};
    ck_assert_int_eq(engine_core_answered(&core, list, &jobs[1], 0, 0, NULL, 0),
                     ENGINE_NEXT_RETRY);
    ck_assert_int_eq(jobs[1].state, JOB_CALL);
    /* The park time: Retry-After, never less, spread by up to a tenth;
     * else the policy's back-off. */
    struct provider_result r = {.retry_after_ms = 2000};
    for (unsigned j = 0; j < 50; j++) {
        long long ms = engine_core_park_ms(&core.policy, &r, 3, j * 7919u);
        ck_assert(ms >= 2000 && ms <= 2200);
    }
    r.retry_after_ms = 0;
    ck_assert(engine_core_park_ms(&core.policy, &r, 3, 7) >= 400 &&
              engine_core_park_ms(&core.policy, &r, 3, 7) <= 800);
}
END_TEST

/* A claim whose epoch is not above the job's last one would let an older
 * claim's outcome through the fence: the process stops. */
START_TEST(an_epoch_that_goes_back_aborts)
{
    struct job *j = &jobs[0];
    claim(j, 5, 0, 0);
    engine_core_lease_lost(&core, list, j, 0);
    engine_core_claim_answered(&core, list, j, ENGINE_CLAIMED, 5, 0, 0, 600);
    ck_abort_msg("still running after an epoch went back");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("engine_core");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, a_claim_opens_the_call_and_a_lost_lease_waits);
    tcase_add_test(tc, a_record_held_by_another_job_of_ours_waits);
    tcase_add_test(tc, past_the_key_window_nothing_is_sent);
    tcase_add_test(tc, an_answer_is_the_operations_to_decide);
    tcase_add_test(tc, the_outage_spares_one_failure);
    tcase_add_test(tc, a_commit_never_passes_a_held_job);
    tcase_add_test(tc, a_given_up_call_keeps_its_lease_only_while_it_is_out);
    tcase_add_test(tc, the_loop_sleeps_until_something_is_due);
    tcase_add_test(tc, a_throttled_job_parks_and_frees_its_slot);
    tcase_add_test(tc, a_parked_job_given_up_lets_its_lease_go);
    tcase_add_test(tc, a_throttled_job_is_set_aside_once_parked_jobs_fill_the_slots);
    tcase_add_test(tc, a_job_throttled_a_minute_is_set_aside);
    tcase_add_test(tc, only_a_call_that_may_have_executed_makes_a_replay);
    tcase_add_test(tc, waiting_jobs_due_together_take_only_the_free_slots);
    tcase_add_test(tc, jobs_waiting_for_the_budget_do_not_set_a_throttled_one_aside);
    tcase_add_test(tc, a_call_over_the_budget_parks_for_the_gates_wait);
    tcase_add_test(tc, a_long_wait_is_said_on_the_record_until_the_call_starts);
    tcase_add_test(tc, a_job_held_at_the_pace_says_so);
    /* The abort ends the process it runs in: only where each test has a
     * process of its own (not the valgrind run's CK_FORK=no). */
    const char *fork_mode = getenv("CK_FORK");
    if (!fork_mode || strcmp(fork_mode, "no") != 0)
        tcase_add_test_raise_signal(tc, an_epoch_that_goes_back_aborts, SIGABRT);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
