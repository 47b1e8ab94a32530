/* Unit tests of worker/pipeline/job: the moves a job may make (written out
 * here from the worker's pipeline in docs/worker.md, not read from the module),
 * the per-state lists and their order, and the offset accounting through
 * every step a job can take: started, detached in each state, reaped. */
#include <check.h>
#include <signal.h>
#include <unistd.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "job.h"
#include "utf8_text.h"
#include "test_env.h"

/* Every allowed move, as the pipeline runs: anything else is a bug. */
static const struct {
    enum job_state from, to;
} allowed[] = {
    {JOB_BACKLOG, JOB_RECORD},
    {JOB_BACKLOG, JOB_DEAD_LETTER},
    {JOB_BACKLOG, JOB_DONE},
    {JOB_DEAD_LETTER, JOB_DEAD_LETTER_SENT},
    {JOB_DEAD_LETTER, JOB_DONE},
    {JOB_DEAD_LETTER_SENT, JOB_DONE},
    {JOB_DEAD_LETTER_SENT, JOB_DEAD_LETTER}, /* the broker refused it: again */
    {JOB_RECORD, JOB_CLAIM},
    {JOB_RECORD, JOB_CALL}, /* recorded and claimed in one statement */
    {JOB_RECORD, JOB_DEAD_LETTER},
    {JOB_RECORD, JOB_DONE},
    {JOB_CLAIM, JOB_CALL},
    {JOB_CLAIM, JOB_WAIT},
    {JOB_CLAIM, JOB_DONE},
    {JOB_CLAIM, JOB_DEAD_LETTER},
    {JOB_WAIT, JOB_CLAIM}, /* due, a slot free: it takes the slot (engine_core) */
    {JOB_WAIT, JOB_CALL},
    {JOB_WAIT, JOB_WAIT},
    {JOB_WAIT, JOB_DONE},
    {JOB_WAIT, JOB_DEAD_LETTER},
    {JOB_CALL, JOB_CALLING},
    {JOB_CALL, JOB_PERSIST}, /* not sent: the key may be forgotten */
    {JOB_CALL, JOB_WAIT},
    {JOB_CALL, JOB_DONE},
    {JOB_CALL, JOB_PARKED}, /* waiting for the provider budget: slot freed */
    {JOB_CALLING, JOB_CALL},
    {JOB_CALLING, JOB_PERSIST},
    {JOB_CALLING, JOB_CALLING_FENCED},
    {JOB_CALLING, JOB_PARKED}, /* throttled, or its key in use: slot freed */
    {JOB_CALLING, JOB_DONE},
    {JOB_CALLING_FENCED, JOB_WAIT},
    {JOB_CALLING_FENCED, JOB_DONE},
    {JOB_PERSIST, JOB_DONE},
    {JOB_PERSIST, JOB_WAIT},
    {JOB_PARKED, JOB_CALL}, /* due, and a slot is free */
    {JOB_PARKED, JOB_WAIT}, /* its lease lost */
    {JOB_PARKED, JOB_DONE}, /* detached */
};

static int is_allowed(enum job_state from, enum job_state to)
{
    for (size_t i = 0; i < sizeof(allowed) / sizeof(allowed[0]); i++)
        if (allowed[i].from == from && allowed[i].to == to)
            return 1;
    return 0;
}

START_TEST(moves_are_the_pipelines)
{
    for (int from = 0; from < JOB__COUNT; from++)
        for (int to = 0; to < JOB__COUNT; to++)
            ck_assert_msg(job_may_move(from, to) == is_allowed(from, to), "%s -> %s",
                          job_state_name(from), job_state_name(to));
    ck_assert(!job_may_move(JOB__COUNT, JOB_DONE));
    ck_assert(!job_may_move(JOB_BACKLOG, JOB__COUNT));
    ck_assert_str_eq(job_state_name(JOB_CALLING_FENCED), "calling_fenced");
    ck_assert_str_eq(job_state_name(JOB__COUNT), "invalid");
}
END_TEST

#define NJOBS 4

static struct job jobs[NJOBS];
static job_list_t *list;

static void setup(void)
{
    memset(jobs, 0, sizeof(jobs));
    list = job_list_new();
    ck_assert_ptr_nonnull(list);
    for (int i = 0; i < NJOBS; i++) {
        jobs[i].partition = i % 2;
        jobs[i].offset = 100 + i;
        job_list_add(list, &jobs[i]);
    }
}

static void teardown(void)
{
    for (struct job *j; (j = job_list_oldest(list));)
        job_list_remove(list, j);
    job_list_free(list);
    list = NULL;
}

/* The jobs of `state`, in list order, as indexes into jobs[]: "0,2". */
static const char *in_state(enum job_state state)
{
    static char buf[64];
    size_t n = 0;
    buf[0] = 0;
    for (const struct job *j = job_list_first(list, state); j; j = job_next_in_state(j))
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%d", n ? "," : "",
                              (int)(j - jobs));
    return buf;
}

static const char *all_jobs(void)
{
    static char buf[64];
    size_t n = 0;
    buf[0] = 0;
    for (const struct job *j = job_list_oldest(list); j; j = job_younger(j))
        n += (size_t)snprintf(buf + n, sizeof(buf) - n, "%s%d", n ? "," : "",
                              (int)(j - jobs));
    return buf;
}

START_TEST(new_jobs_wait_in_the_backlog_in_order)
{
    ck_assert_str_eq(in_state(JOB_BACKLOG), "0,1,2,3");
    ck_assert_str_eq(all_jobs(), "0,1,2,3");
    ck_assert_uint_eq(job_list_count(list, JOB_BACKLOG), 4);
    ck_assert_uint_eq(job_list_holding(list), 4);
    ck_assert_uint_eq(job_list_holding_in(list, JOB_BACKLOG), 4);
    ck_assert_uint_eq(job_list_started(list), 0);
    ck_assert_ptr_null(job_list_first(list, JOB_RECORD));
    ck_assert_uint_eq(job_list_count(list, JOB_RECORD), 0);
}
END_TEST

/* A state's list is in the order its jobs entered it, whatever order they
 * were consumed in; a move to the state a job is in keeps its place. */
START_TEST(a_state_lists_its_jobs_in_the_order_they_came)
{
    job_set(list, &jobs[2], JOB_RECORD);
    job_set(list, &jobs[0], JOB_RECORD);
    job_set(list, &jobs[3], JOB_RECORD);
    ck_assert_str_eq(in_state(JOB_RECORD), "2,0,3");
    ck_assert_str_eq(in_state(JOB_BACKLOG), "1");
    ck_assert_uint_eq(job_list_started(list), 3);
    for (int i = 0; i < 4; i++)
        if (i != 1) {
            job_set(list, &jobs[i], JOB_CLAIM);
            job_set(list, &jobs[i], JOB_WAIT);
        }
    ck_assert_str_eq(in_state(JOB_WAIT), "0,2,3");
    job_set(list, &jobs[0], JOB_WAIT);
    ck_assert_str_eq(in_state(JOB_WAIT), "0,2,3");
    ck_assert_uint_eq(job_list_count(list, JOB_WAIT), 3);
    /* The consumption order itself never changes. */
    ck_assert_str_eq(all_jobs(), "0,1,2,3");
}
END_TEST

/* When the process aborts: nothing may have become reapable (DONE, whose
 * offset reap commits), nor any offset be given up. Else it exits without
 * the signal, and the test fails. */
static void nothing_committed_at_abort(int sig)
{
    (void)sig;
    if (job_list_count(list, JOB_DONE) != 0 || job_list_holding(list) != 4 ||
        jobs[1].state != JOB_BACKLOG)
        _exit(3);
}

/* A move the table does not allow stops the process (SIGABRT, in release
 * builds too) before the job could end and its offset be committed. */
START_TEST(a_move_not_allowed_aborts_before_any_commit)
{
    jobs[1].outcome = "charged";
    signal(SIGABRT, nothing_committed_at_abort);
    job_set(list, &jobs[1], JOB_PERSIST);
    /* Not reached. */
    signal(SIGABRT, SIG_DFL);
}
END_TEST

/* Each step of the table acts on jobs[job]; the counts are checked after
 * it. SET moves, DETACH detaches, REMOVE reaps. */
enum op { SET, DETACH, REMOVE };
static const struct step {
    enum op op;
    int job;
    enum job_state to;
    size_t holding, started, backlog_holding;
} script[] = {
    {SET, 0, JOB_RECORD, 4, 1, 3},
    {SET, 1, JOB_DEAD_LETTER, 4, 2, 2},
    {SET, 0, JOB_CLAIM, 4, 2, 2},
    {SET, 0, JOB_CALL, 4, 2, 2},
    {SET, 0, JOB_CALLING, 4, 2, 2},
    /* Detached while its call is in flight: no offset, still on its list. */
    {DETACH, 0, 0, 3, 1, 2},
    {DETACH, 0, 0, 3, 1, 2}, /* twice changes nothing */
    {SET, 0, JOB_PERSIST, 3, 1, 2},
    {SET, 0, JOB_DONE, 3, 1, 2},
    {REMOVE, 0, 0, 3, 1, 2},
    /* Detached in the backlog: it never starts. */
    {DETACH, 2, 0, 2, 1, 1},
    {SET, 2, JOB_DONE, 2, 1, 1},
    {REMOVE, 2, 0, 2, 1, 1},
    /* Reaped while holding its offset. */
    {SET, 1, JOB_DEAD_LETTER_SENT, 2, 1, 1},
    {SET, 1, JOB_DONE, 2, 1, 1},
    {REMOVE, 1, 0, 1, 0, 1},
    {SET, 3, JOB_RECORD, 1, 1, 0},
    {DETACH, 3, 0, 0, 0, 0},
    {SET, 3, JOB_DONE, 0, 0, 0},
    {REMOVE, 3, 0, 0, 0, 0},
};

START_TEST(offsets_are_counted_through_every_step)
{
    for (size_t i = 0; i < sizeof(script) / sizeof(script[0]); i++) {
        const struct step *st = &script[i];
        struct job *j = &jobs[st->job];
        if (st->op == SET)
            job_set(list, j, st->to);
        else if (st->op == DETACH)
            job_detach(list, j);
        else
            job_list_remove(list, j);
        ck_assert_msg(job_list_holding(list) == st->holding, "step %zu: holding %zu", i,
                      job_list_holding(list));
        ck_assert_msg(job_list_started(list) == st->started, "step %zu: started %zu", i,
                      job_list_started(list));
        ck_assert_msg(job_list_holding_in(list, JOB_BACKLOG) == st->backlog_holding,
                      "step %zu: backlog %zu", i,
                      job_list_holding_in(list, JOB_BACKLOG));
        /* Whatever the step, the lists and their counts agree. */
        size_t total = 0, holding = 0;
        for (int s = 0; s < JOB__COUNT; s++) {
            size_t n = 0, h = 0;
            for (const struct job *k = job_list_first(list, s); k;
                 k = job_next_in_state(k)) {
                ck_assert_int_eq(k->state, s);
                n++;
                h += !k->detached;
            }
            ck_assert_uint_eq(n, job_list_count(list, s));
            ck_assert_uint_eq(h, job_list_holding_in(list, s));
            total += n;
            holding += h;
        }
        size_t listed = 0;
        for (const struct job *k = job_list_oldest(list); k; k = job_younger(k))
            listed++;
        ck_assert_uint_eq(total, listed);
        ck_assert_uint_eq(holding, job_list_holding(list));
    }
    ck_assert_ptr_null(job_list_oldest(list));
}
END_TEST

START_TEST(due_and_next_at_look_at_one_state)
{
    ck_assert_int_eq(job_list_next_at(list, JOB_WAIT), INT64_MAX);
    ck_assert_uint_eq(job_list_due(list, JOB_WAIT, 0), 0);
    int64_t at[NJOBS] = {500, 100, 300, 0};
    for (int i = 0; i < NJOBS; i++) {
        jobs[i].next_at = at[i];
        job_set(list, &jobs[i], JOB_RECORD);
        job_set(list, &jobs[i], JOB_CLAIM);
        if (i < 3)
            job_set(list, &jobs[i], JOB_WAIT);
    }
    ck_assert_int_eq(job_list_next_at(list, JOB_WAIT), 100);
    ck_assert_uint_eq(job_list_due(list, JOB_WAIT, 99), 0);
    ck_assert_uint_eq(job_list_due(list, JOB_WAIT, 300), 2);
    ck_assert_uint_eq(job_list_due(list, JOB_WAIT, 1000), 3);
    /* jobs[3] (due at 0) is in CLAIM, not counted for WAIT. */
    ck_assert_int_eq(job_list_next_at(list, JOB_CLAIM), 0);
}
END_TEST

START_TEST(log_names_and_jitter)
{
    struct job j = {0};
    ck_assert_ptr_null(job_attempt(&j));
    ck_assert_ptr_null(job_order(&j));
    ck_assert_ptr_null(job_trace(&j));
    j.have_cmd = 1;
    j.id = "3f2c6a1e-0000-4000-8000-000000000001";
    j.order_id = "7d1e0c2a-0000-4000-8000-000000000002";
    snprintf(j.traceparent, sizeof(j.traceparent), "%s",
             "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    ck_assert_str_eq(job_attempt(&j), "3f2c6a1e-0000-4000-8000-000000000001");
    ck_assert_str_eq(job_order(&j), "7d1e0c2a-0000-4000-8000-000000000002");
    ck_assert_str_eq(job_trace(&j),
                     "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01");
    /* Neighbouring messages of one partition retry apart. */
    struct job k = j;
    j.offset = 7;
    k.offset = 8;
    ck_assert_uint_ne(job_jitter(&j), job_jitter(&k));
    job_list_free(NULL);
}
END_TEST

/* A dead letter's error text (a Kafka header, a log field) too long for
 * dl_error is cut before a character, never inside one: 254 ASCII bytes
 * then a 2-byte character leaves no room for the character's second byte. */
START_TEST(a_long_error_is_cut_between_characters)
{
    struct job j = {0};
    char text[300];
    memset(text, 'a', 254);
    snprintf(text + 254, sizeof(text) - 254, "\xc3\xa9 and more");
    job_set_error(&j, "%s", text);
    ck_assert_uint_eq(strlen(j.dl_error), 254);
    ck_assert_int_eq(utf8_text_valid(j.dl_error, strlen(j.dl_error)), 1);
    job_set_error(&j, "refused the %s (sqlstate %s)", "attempt", "23505");
    ck_assert_str_eq(j.dl_error, "refused the attempt (sqlstate 23505)");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("job");
    TCase *moves = tcase_create("moves");
    tcase_add_test(moves, moves_are_the_pipelines);
    tcase_add_test(moves, log_names_and_jitter);
    tcase_add_test(moves, a_long_error_is_cut_between_characters);
    suite_add_tcase(s, moves);
    TCase *lists = tcase_create("lists");
    tcase_add_checked_fixture(lists, setup, teardown);
    tcase_add_test(lists, new_jobs_wait_in_the_backlog_in_order);
    tcase_add_test(lists, a_state_lists_its_jobs_in_the_order_they_came);
    /* The abort ends the process it runs in: only where each test has a
     * process of its own (not the valgrind run's CK_FORK=no). */
    const char *fork_mode = getenv("CK_FORK");
    if (!fork_mode || strcmp(fork_mode, "no") != 0)
        tcase_add_test_raise_signal(lists, a_move_not_allowed_aborts_before_any_commit,
                                    SIGABRT);
    tcase_add_test(lists, offsets_are_counted_through_every_step);
    tcase_add_test(lists, due_and_next_at_look_at_one_state);
    suite_add_tcase(s, lists);
    return test_env_run_suite(s);
}
