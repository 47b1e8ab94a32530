/* The provider client against a real psp-sim: each row of the contract's
 * table maps to its outcome, lost answers are UNKNOWN (never declined), a
 * refused connection is NOT_EXECUTED, retrying a dropped charge with the
 * same key yields the original charge, and a 429's Retry-After parks the
 * job that long (issue 38). */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "engine_core.h"
#include "job.h"
#include "metrics.h"
#include "provider_client.h"
#include "psp_sim_process.h"
#include "test_env.h"

static struct psp_sim_process sim;
static provider_client_t *pc;
static struct charged_error err;

static void setup(void)
{
    psp_sim_start(&sim, NULL);
    pc = provider_client_new(sim.base_url, PSP_SIM_TEST_KEY, "2024-06-20", 1000, &err);
    ck_assert_msg(pc != NULL, "%s", err.message);
}

static void teardown(void)
{
    provider_client_free(pc);
    pc = NULL;
    psp_sim_stop(&sim);
}

static struct provider_charge ch(const char *key, long long amount, const char *pm)
{
    return (struct provider_charge){
        .idempotency_key = key,
        .amount = amount,
        .currency = "EUR",
        .payment_method = pm,
        .payment_attempt_id = key,
        .order_id = "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001",
    };
}

static struct provider_result run(const char *key, long long amount, const char *pm)
{
    struct provider_result r;
    struct provider_charge c = ch(key, amount, pm);
    provider_client_charge(pc, &c, &r);
    /* Whatever the outcome, the secret is in no field. */
    ck_assert_ptr_null(strstr(r.error, PSP_SIM_TEST_KEY));
    return r;
}

static void set_faults(const char *json)
{
    json_decref(psp_sim_admin(&sim, "PUT", "/faults", json));
}

START_TEST(succeeded_keeps_the_payment_id_and_replays)
{
    struct provider_result r = run("pc-ok", 1234, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_int_eq(r.replayed, 0);
    ck_assert(!strncmp(r.provider_payment_id, "pi_", 3));
    ck_assert_int_eq(r.amount, 1234);
    struct provider_result again = run("pc-ok", 1234, "pm_card_visa");
    ck_assert_int_eq(again.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_str_eq(again.provider_payment_id, r.provider_payment_id);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "pc-ok"), 1);
}
END_TEST

START_TEST(processing_is_processing)
{
    struct provider_result r = run("pc-proc", 100, "pm_card_processing");
    ck_assert_int_eq(r.outcome, PROVIDER_PROCESSING);
    ck_assert_str_eq(r.intent_status, "processing");
}
END_TEST

START_TEST(card_error_is_declined_with_codes)
{
    struct provider_result r =
        run("pc-decl", 100, "pm_card_chargeDeclinedInsufficientFunds");
    ck_assert_int_eq(r.outcome, PROVIDER_DECLINED);
    ck_assert_int_eq(r.http_status, 402);
    ck_assert_str_eq(r.code, "card_declined");
    ck_assert_str_eq(r.decline_code, "insufficient_funds");
}
END_TEST

START_TEST(invalid_request_is_invalid)
{
    struct provider_result r = run("pc-inv", 100, "pm_card_nonexistent");
    ck_assert_int_eq(r.outcome, PROVIDER_INVALID);
    ck_assert_int_eq(r.http_status, 400);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
}
END_TEST

START_TEST(idempotency_error_requires_review)
{
    ck_assert_int_eq(run("pc-idem", 100, "pm_card_visa").outcome, PROVIDER_SUCCEEDED);
    struct provider_result r = run("pc-idem", 999, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(r.http_status, 400);
}
END_TEST

struct racer {
    pthread_barrier_t *b;
    struct provider_result r;
};

static void *race(void *arg)
{
    struct racer *x = arg;
    struct provider_charge c = ch("pc-race", 100, "pm_card_visa");
    pthread_barrier_wait(x->b);
    provider_client_charge(pc, &c, &x->r);
    return NULL;
}

START_TEST(key_in_use_409_is_not_executed)
{
    set_faults("{\"latency_ms\": 400}");
    pthread_barrier_t b;
    pthread_t t[2];
    struct racer x[2] = {{.b = &b}, {.b = &b}};
    pthread_barrier_init(&b, NULL, 2);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, race, &x[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&b);
    enum provider_outcome o0 = x[0].r.outcome, o1 = x[1].r.outcome;
    ck_assert_msg((o0 == PROVIDER_SUCCEEDED && o1 == PROVIDER_NOT_EXECUTED) ||
                      (o1 == PROVIDER_SUCCEEDED && o0 == PROVIDER_NOT_EXECUTED),
                  "outcomes %s, %s", provider_outcome_name(o0),
                  provider_outcome_name(o1));
    ck_assert_int_eq(
        o0 == PROVIDER_NOT_EXECUTED ? x[0].r.http_status : x[1].r.http_status, 409);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "pc-race"), 1);
}
END_TEST

START_TEST(rate_limit_429_is_not_executed)
{
    set_faults("{\"rules\":[{\"kind\":\"rate_limit\",\"times\":1}]}");
    struct provider_result r = run("pc-429", 100, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(r.http_status, 429);
    /* Issue 38: said so, for the caller to slow down; no Retry-After from
     * this fault, so none. */
    ck_assert_int_eq(r.throttled, 1);
    ck_assert_int_eq(r.retry_after_ms, 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
}
END_TEST

/* The worker's operation, for the core: a not-executed answer is sent
 * again (the charge's table retries it while the key is kept). */
static struct answer_decision send_again(int kind, const struct engine_policy *p,
                                         enum provider_outcome outcome, int may_replay,
                                         int tries, int key_window_open,
                                         unsigned jitter)
{
    (void)kind, (void)p, (void)may_replay, (void)tries, (void)jitter;
    ck_assert_int_eq(outcome, PROVIDER_NOT_EXECUTED);
    ck_assert(key_window_open);
    return (struct answer_decision){.next = ANSWER_NEXT_RETRY, .retry_in_ms = 50};
}

/* Issue 38, Retry-After on the wire: psp-sim's limiter (create 1/s, its
 * Retry-After on) answers the charge over it 429 with `Retry-After: 1`;
 * the client reads 1000 ms; the worker's core, given that very answer,
 * parks the job until no sooner than that (its slot freed), and the charge
 * sent again under its key once the time has passed is served, once. */
START_TEST(retry_after_from_the_limiter_parks_the_job_that_long)
{
    json_decref(psp_sim_admin(&sim, "PUT", "/rate-limits",
                              "{\"classes\": {\"create\": 1}, \"retry_after\": true}"));
    ck_assert_int_eq(run("pc-ra-first", 100, "pm_card_visa").outcome,
                     PROVIDER_SUCCEEDED);
    struct job j = {.partition = 0, .offset = 1, .kind = 0, .have_cmd = 1, .id = "ra"};
    job_list_t *jobs = job_list_new();
    const struct engine_core core = {
        .policy = {.retry_base_ms = 50, .retry_max_ms = 200, .first_look_ms = 1000},
        .max_in_flight = 1,
        .recheck_ms = 100,
        .key_retention_ms = 60000,
        .key_margin_ms = 1000,
        .decide = send_again,
    };
    job_list_add(jobs, &j);
    engine_core_parsed(jobs, &j, 1);
    engine_core_claimed(jobs, &j, 1, 0, clock_now_ms());
    engine_core_call_started(jobs, &j);
    j.res = run("pc-ra", 100, "pm_card_visa");
    int64_t answered = clock_now_ms();
    ck_assert_int_eq(j.res.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(j.res.http_status, 429);
    ck_assert_int_eq(j.res.throttled, 1);
    ck_assert_int_eq(j.res.retry_after_ms, 1000);
    ck_assert_int_eq(engine_core_answered(&core, jobs, &j, 0, 0, NULL, answered),
                     ENGINE_NEXT_PARKED);
    /* Never sooner than the provider said, spread by at most a tenth (not
     * the policy's 50 ms back-off). */
    ck_assert_int_ge(j.next_at - answered, 1000);
    ck_assert_int_le(j.next_at - answered, 1100);
    ck_assert_int_eq(engine_core_park_gate(&core, jobs, &j, j.next_at - 1),
                     ENGINE_NEXT_SKIP);
    while (clock_now_ms() < j.next_at)
        nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
    ck_assert_int_eq(engine_core_park_gate(&core, jobs, &j, clock_now_ms()),
                     ENGINE_NEXT_SEND);
    struct provider_result again = run("pc-ra", 100, "pm_card_visa");
    ck_assert_int_eq(again.outcome, PROVIDER_SUCCEEDED);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "pc-ra"), 1);
    job_list_remove(jobs, &j);
    job_list_free(jobs);
}
END_TEST

START_TEST(refused_connection_is_not_executed)
{
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", psp_sim_free_port());
    provider_client_t *dead =
        provider_client_new(url, PSP_SIM_TEST_KEY, NULL, 1000, &err);
    struct provider_result r;
    struct provider_charge c = ch("pc-refused", 100, "pm_card_visa");
    provider_client_charge(dead, &c, &r);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(r.sent, 0);
    ck_assert_int_eq(r.http_status, 0);
    provider_client_free(dead);
}
END_TEST

START_TEST(server_error_before_executing_is_unknown)
{
    /* The client cannot know the 500 came before executing: UNKNOWN. */
    set_faults("{\"rules\":[{\"kind\":\"error_before\",\"times\":1}]}");
    struct provider_result r = run("pc-500b", 100, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(r.http_status, 500);
}
END_TEST

START_TEST(server_error_after_executing_is_unknown)
{
    set_faults("{\"rules\":[{\"kind\":\"error_after\",\"times\":1}]}");
    struct provider_result r = run("pc-500a", 100, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
}
END_TEST

START_TEST(dropped_answer_is_unknown_and_retry_yields_the_original_charge)
{
    set_faults(
        "{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"pc-drop\",\"times\":1}]}");
    struct provider_result r = run("pc-drop", 100, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(r.sent, 1);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "pc-drop"), 1);
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    const char *charged = json_string_value(json_object_get(
        json_array_get(json_object_get(l, "charges"), 0), "payment_intent_id"));
    struct provider_result again = run("pc-drop", 100, "pm_card_visa");
    ck_assert_int_eq(again.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_str_eq(again.provider_payment_id, charged);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "pc-drop"), 1);
    json_decref(l);
}
END_TEST

START_TEST(stalled_answer_is_unknown_never_declined)
{
    set_faults(
        "{\"stall_ms\": 5000, \"rules\":[{\"kind\":\"stall_after\",\"times\":1}]}");
    struct provider_result r = run("pc-stall", 100, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(r.sent, 1);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
}
END_TEST

START_TEST(lookups_find_what_was_charged)
{
    struct provider_result c = run("pc-look", 4321, "pm_card_visa");
    struct provider_result r;
    provider_client_retrieve(pc, c.provider_payment_id, &r);
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.amount, 4321);
    provider_client_retrieve(pc, "pi_missing", &r);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_FOUND);
    provider_client_search(pc, "pc-look", &r);
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.matches, 1);
    ck_assert_str_eq(r.provider_payment_id, c.provider_payment_id);
    provider_client_search(pc, "never-charged", &r);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_FOUND);
}
END_TEST

/* A lost decline replayed to the reconciler must say whose intent it is:
 * the 402 carries it whole, and the client takes its fields. */
START_TEST(decline_takes_the_intent_from_the_card_error)
{
    struct provider_result r = run("pc-decl-pi", 2468, "pm_card_chargeDeclined");
    ck_assert_int_eq(r.outcome, PROVIDER_DECLINED);
    ck_assert(!strncmp(r.provider_payment_id, "pi_", 3));
    ck_assert_int_eq(r.amount, 2468);
    ck_assert_str_eq(r.currency, "eur");
    ck_assert_str_eq(r.intent_attempt_id, "pc-decl-pi");
    ck_assert_str_eq(r.intent_status, "requires_payment_method");
    ck_assert_str_eq(r.code, "card_declined");
    ck_assert_str_eq(r.decline_code, "generic_decline");
    struct provider_result again = run("pc-decl-pi", 2468, "pm_card_chargeDeclined");
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_int_eq(again.amount, 2468);
    ck_assert_str_eq(again.provider_payment_id, r.provider_payment_id);
}
END_TEST

/* A 400 keeps the provider's code and param; its message loses what it
 * echoes of the request (here the customer). */
START_TEST(invalid_request_keeps_the_code_not_the_customer)
{
    struct provider_charge c = ch("pc-cus", 100, "pm_card_visa");
    c.customer_id = "cus_Secret42-x";
    struct provider_result r;
    char detail[400];
    provider_client_charge(pc, &c, &r);
    ck_assert_int_eq(r.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(r.code, "resource_missing");
    ck_assert_str_eq(r.param, "customer");
    ck_assert_str_eq(r.error, "No such customer: '***'");
    provider_outcome_detail(&r, detail, sizeof(detail));
    ck_assert_str_eq(detail, "resource_missing (customer): No such customer: '***'");
    ck_assert_ptr_null(strstr(detail, "Secret42"));
}
END_TEST

/* The list: pages of 100, newest first, matched on the attempt, a cursor
 * to the next page; consistent, so the search lag does not hide the
 * intent; a window without it, or no answer, finds nothing / no evidence. */
START_TEST(list_pages_match_the_attempt)
{
    char key[32];
    struct provider_result r, p2;
    json_decref(
        psp_sim_admin(&sim, "PUT", "/search-lag", "{\"search_lag_ms\": 600000}"));
    long long now = (long long)time(NULL); /* the provider's created: unix seconds */
    struct provider_result first = run("pc-list-first", 700, "pm_card_visa");
    for (int i = 0; i < 100; i++) {
        snprintf(key, sizeof(key), "pc-list-%d", i);
        ck_assert_int_eq(run(key, 100, "pm_card_visa").outcome, PROVIDER_SUCCEEDED);
    }
    provider_client_search(pc, "pc-list-first", &r);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_FOUND); /* search lags */

    provider_client_list(pc, "pc-list-first", now - 60, now + 60, NULL, &r);
    ck_assert_int_eq(r.http_status, 200);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_FOUND); /* the 100 newest: not ours */
    ck_assert_int_eq(r.matches, 0);
    ck_assert_int_eq(r.has_more, 1);
    ck_assert(!strncmp(r.list_last_id, "pi_", 3));
    provider_client_list(pc, "pc-list-first", now - 60, now + 60, r.list_last_id, &p2);
    ck_assert_int_eq(p2.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(p2.matches, 1);
    ck_assert_int_eq(p2.has_more, 0);
    ck_assert_str_eq(p2.provider_payment_id, first.provider_payment_id);
    ck_assert_int_eq(p2.amount, 700);
    ck_assert_str_eq(p2.intent_attempt_id, "pc-list-first");

    provider_client_list(pc, "pc-list-first", now - 3600, now - 60, NULL, &r);
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_FOUND);
    ck_assert_int_eq(r.has_more, 0);

    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", psp_sim_free_port());
    provider_client_t *down =
        provider_client_new(url, PSP_SIM_TEST_KEY, NULL, 500, &err);
    ck_assert_ptr_nonnull(down);
    provider_client_list(down, "pc-list-first", now - 60, now + 60, NULL, &r);
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN); /* no answer: no evidence */
    provider_client_free(down);
}
END_TEST

/* What the client does to every provider message it keeps. */
START_TEST(redact_masks_echoed_ids_and_quoted_values)
{
    static const char *cases[][2] = {
        {"No such customer: 'cus_x'", "No such customer: '***'"},
        {"No such PaymentMethod: 'pm_card_visa'; try again",
         "No such PaymentMethod: '***'; try again"},
        {"Customer cus_NffrFeUfNV2Hib has no source", "Customer cus_*** has no source"},
        {"ch_3Mtw1 and re_1Abc and evt_9 and pi_1_secret_2",
         "ch_*** and re_*** and evt_*** and pi_***"},
        {"Invalid API Key provided: sk_test_4eC39HqLyjWDarjtT1zdp7dc",
         "Invalid API Key provided: sk_***"},
        {"Invalid string: \"abc@example.com\"", "Invalid string: \"***\""},
        {"No such customer: 'cus_abc", "No such customer: '***"},
        {"Your card's security code is incorrect.",
         "Your card's security code is incorrect."},
        {"Missing required param: payment_method.",
         "Missing required param: payment_method."},
        {"epi_1 is no id, xpi_2 neither", "epi_1 is no id, xpi_2 neither"},
        {"", ""},
    };
    char out[256];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        provider_client_redact(out, sizeof(out), cases[i][0]);
        ck_assert_str_eq(out, cases[i][1]);
    }
    provider_client_redact(out, sizeof(out), NULL);
    ck_assert_str_eq(out, "");
    /* Bounded, and a quote cut off by the bound is masked all the same. */
    char big[4096];
    memset(big, 'a', sizeof(big));
    memcpy(big + 200, " 'cus_", 6);
    big[sizeof(big) - 1] = '\0';
    char small[64];
    provider_client_redact(small, sizeof(small), big);
    ck_assert_uint_lt(strlen(small), sizeof(small));
    provider_client_redact(out, sizeof(out), big);
    ck_assert_ptr_null(strstr(out, "cus_"));
}
END_TEST

START_TEST(async_charges_complete_with_their_opaque)
{
    enum { N = 300 };
    char keys[N][32];
    int seen[N] = {0};
    set_faults("{\"latency_ms\": 50}");
    for (int i = 0; i < N; i++) {
        snprintf(keys[i], sizeof(keys[i]), "pc-async-%d", i);
        struct provider_charge c = ch(keys[i], 100 + i, "pm_card_visa");
        ck_assert_int_eq(provider_client_start_charge(pc, &c, &seen[i], &err), 0);
    }
    ck_assert_uint_eq(provider_client_in_flight(pc), N);
    long long deadline = test_env_now_ms() + 20000;
    int done = 0;
    while (done < N) {
        struct provider_result r;
        void *op;
        ck_assert_msg(test_env_now_ms() < deadline, "only %d of %d finished", done, N);
        provider_client_perform(pc, 100);
        while (provider_client_next_done(pc, &r, &op)) {
            ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
            int i = (int)((int *)op - seen);
            ck_assert_int_eq(r.amount, 100 + i);
            (*(int *)op)++;
            done++;
        }
    }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(seen[i], 1);
    ck_assert_uint_eq(provider_client_in_flight(pc), 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), N);
}
END_TEST

/* Adversary 40.1: an answer that curl's perform finished at the start of
 * the loop's one wait (it came while the loop was busy) was collected only
 * when something else ended the wait: up to the whole wait later. The wait
 * must return at once with a finished transfer not yet taken. The answer
 * comes 300 ms after the request; the wait asked for after it came is 3 s,
 * with a wake fd nothing writes: it took the 3 s before the mend. */
START_TEST(an_answer_finished_at_the_wait_ends_it)
{
    int wake[2];
    int tag = 0;
    ck_assert_int_eq(pipe(wake), 0);
    set_faults("{\"latency_ms\": 300}");
    struct provider_charge c = ch("pc-wait-ends", 100, "pm_card_visa");
    ck_assert_int_eq(provider_client_start_charge(pc, &c, &tag, &err), 0);
    /* The request goes out (the connect and the send are the first
     * perform's, on loopback); the answer is not back before 300 ms. */
    for (int i = 0; i < 3; i++)
        provider_client_wait(pc, 20, wake, 1);
    struct timespec pause = {0, 700 * 1000000L};
    nanosleep(&pause, NULL); /* the answer is in the socket now */
    long long t0 = test_env_now_ms();
    provider_client_wait(pc, 3000, wake, 1);
    long long took = test_env_now_ms() - t0;
    struct provider_result r;
    void *op = NULL;
    int taken = provider_client_next_done(pc, &r, &op);
    for (long long deadline = t0 + 10000; !taken && test_env_now_ms() < deadline;) {
        provider_client_wait(pc, 100, wake, 1);
        taken = provider_client_next_done(pc, &r, &op);
    }
    ck_assert_msg(taken && op == &tag, "the charge's answer was never taken");
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_msg(took < 1500, "the wait took %lld ms with an answer in hand", took);
    close(wake[0]);
    close(wake[1]);
}
END_TEST

static void *hammer(void *arg)
{
    int t = (int)(long)arg;
    for (int i = 0; i < 25; i++) {
        char key[32];
        struct provider_result r;
        snprintf(key, sizeof(key), "pc-mt-%d-%d", t, i);
        struct provider_charge c = ch(key, 100, "pm_card_visa");
        provider_client_charge(pc, &c, &r);
        if (r.outcome != PROVIDER_SUCCEEDED)
            return (void *)1;
    }
    return NULL;
}

START_TEST(blocking_calls_are_thread_safe)
{
    pthread_t t[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, hammer, (void *)i);
    for (int i = 0; i < 4; i++) {
        void *rv;
        pthread_join(t[i], &rv);
        ck_assert_ptr_null(rv);
    }
    ck_assert_uint_eq(psp_sim_charges(&sim), 100);
}
END_TEST

/* A refund of pi through start_refund, driven to its end within 10 s. */
static struct provider_result refund(const char *key, const char *pi, long long amount,
                                     const char *refund_id)
{
    int marker = 0;
    struct provider_result r;
    void *op = NULL;
    struct provider_refund rf = {
        .idempotency_key = key,
        .payment_intent = pi,
        .amount = amount,
        .reason = "requested_by_customer",
        .refund_id = refund_id,
        .payment_attempt_id = "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0002",
    };
    ck_assert_int_eq(provider_client_start_refund(pc, &rf, &marker, &err), 0);
    long long deadline = test_env_now_ms() + 10000;
    while (!provider_client_next_done(pc, &r, &op)) {
        ck_assert_msg(test_env_now_ms() < deadline, "the refund never finished");
        provider_client_perform(pc, 100);
    }
    ck_assert_ptr_eq(op, &marker);
    ck_assert_ptr_null(strstr(r.error, PSP_SIM_TEST_KEY));
    return r;
}

static long long refund_executions(const char *key)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    long long n = json_integer_value(
        json_object_get(json_object_get(l, "refund_executions"), key));
    json_decref(l);
    return n;
}

START_TEST(refund_succeeds_replays_and_is_found_again)
{
    struct provider_result c = run("pc-rf-charge", 1000, "pm_card_visa");
    ck_assert_int_eq(c.outcome, PROVIDER_SUCCEEDED);
    struct provider_result r = refund("pc-rf-1", c.provider_payment_id, 400, "rf-1");
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert(!strncmp(r.provider_payment_id, "re_", 3));
    ck_assert_str_eq(r.intent_status, "succeeded");
    ck_assert_str_eq(r.intent_attempt_id, "rf-1");
    ck_assert_int_eq(r.amount, 400);
    ck_assert_str_eq(r.currency, "eur");
    ck_assert_int_eq(r.replayed, 0);
    struct provider_result again =
        refund("pc-rf-1", c.provider_payment_id, 400, "rf-1");
    ck_assert_int_eq(again.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_str_eq(again.provider_payment_id, r.provider_payment_id);
    ck_assert_int_eq(refund_executions("pc-rf-1"), 1);

    struct provider_result got;
    provider_client_retrieve_refund(pc, r.provider_payment_id, &got);
    ck_assert_int_eq(got.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(got.intent_attempt_id, "rf-1");
    provider_client_retrieve_refund(pc, "re_nosuchrefund", &got);
    ck_assert_int_eq(got.outcome, PROVIDER_NOT_FOUND);

    /* Another refund attempt of the same intent is not ours. */
    ck_assert_int_eq(refund("pc-rf-2", c.provider_payment_id, 100, "rf-2").outcome,
                     PROVIDER_SUCCEEDED);
    provider_client_list_refunds(pc, c.provider_payment_id, "rf-1", NULL, &got);
    ck_assert_int_eq(got.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(got.matches, 1);
    ck_assert_int_eq(got.has_more, 0);
    ck_assert_str_eq(got.provider_payment_id, r.provider_payment_id);
    provider_client_list_refunds(pc, c.provider_payment_id, "rf-none", NULL, &got);
    ck_assert_int_eq(got.outcome, PROVIDER_NOT_FOUND);
    ck_assert_int_eq(got.matches, 0);
}
END_TEST

START_TEST(refund_pending_is_processing_and_failed_is_declined)
{
    struct provider_result p = run("pc-rf-pend", 500, "pm_card_refundPendingFail");
    struct provider_result r = refund("pc-rf-p", p.provider_payment_id, 500, "rf-p");
    ck_assert_int_eq(r.outcome, PROVIDER_PROCESSING);
    ck_assert_str_eq(r.intent_status, "pending");
    char path[PROVIDER_ID_MAX + 64];
    snprintf(path, sizeof(path), "/refunds/%s/settle", r.provider_payment_id);
    json_decref(psp_sim_admin(&sim, "POST", path, "{\"status\":\"failed\"}"));
    struct provider_result got;
    provider_client_retrieve_refund(pc, r.provider_payment_id, &got);
    ck_assert_int_eq(got.outcome, PROVIDER_DECLINED);
    ck_assert_str_eq(got.code, "expired_or_canceled_card");
    /* A failed refund gives its amount back: another may take it. */
    struct provider_result f = run("pc-rf-failc", 500, "pm_card_refundFail");
    struct provider_result fr = refund("pc-rf-f", f.provider_payment_id, 500, "rf-f");
    ck_assert_int_eq(fr.outcome, PROVIDER_DECLINED);
    ck_assert_str_eq(fr.intent_status, "failed");
    ck_assert_str_eq(fr.code, "lost_or_stolen_card");
    ck_assert_int_eq(refund("pc-rf-f2", f.provider_payment_id, 500, "rf-f2").outcome,
                     PROVIDER_DECLINED);
}
END_TEST

START_TEST(refund_refusals_and_faults_are_classified_as_a_charges)
{
    struct provider_result c = run("pc-rf-c2", 1000, "pm_card_visa");
    const char *pi = c.provider_payment_id;
    struct provider_result r = refund("pc-rf-big", pi, 1001, "rf-big");
    ck_assert_int_eq(r.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(r.code, "amount_too_large");
    ck_assert_int_eq(refund("pc-rf-none", "pi_nosuchintent", 10, "rf-none").outcome,
                     PROVIDER_INVALID);
    ck_assert_int_eq(refund("pc-rf-m", pi, 100, "rf-m").outcome, PROVIDER_SUCCEEDED);
    r = refund("pc-rf-m", pi, 200, "rf-m");
    ck_assert_int_eq(r.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(r.http_status, 400);

    set_faults("{\"rules\":[{\"kind\":\"rate_limit\",\"probability\":1,"
               "\"key\":\"pc-rf-429\",\"times\":1},"
               "{\"kind\":\"error_before\",\"probability\":1,\"key\":\"pc-rf-500\","
               "\"times\":1},"
               "{\"kind\":\"drop_after\",\"probability\":1,\"key\":\"pc-rf-drop\","
               "\"times\":1}]}");
    ck_assert_int_eq(refund("pc-rf-429", pi, 10, "rf-429").outcome,
                     PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(refund("pc-rf-500", pi, 10, "rf-500").outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(refund_executions("pc-rf-500"), 0);
    /* On a new connection: curl sends a request again by itself only on a
     * reused one that closed (that is `resent`, tested with charges). */
    provider_client_free(pc);
    pc = provider_client_new(sim.base_url, PSP_SIM_TEST_KEY, "2024-06-20", 1000, &err);
    r = refund("pc-rf-drop", pi, 10, "rf-drop");
    ck_assert_int_eq(r.resent, 0);
    ck_assert_int_eq(r.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(r.sent, 1);
    ck_assert_int_eq(refund_executions("pc-rf-drop"), 1);
    /* The retry with the same key is the refund the lost answer was. */
    r = refund("pc-rf-drop", pi, 10, "rf-drop");
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.replayed, 1);
    ck_assert_int_eq(refund_executions("pc-rf-drop"), 1);
}
END_TEST

/* A gated client's requests, as its gate and its charges saw them. */
static int gate_asks[BUDGET_CLASS_COUNT], gate_charged[BUDGET_CLASS_COUNT];

static int count_gate(void *ctx, enum budget_class cls, char *why, size_t why_size)
{
    (void)ctx;
    (void)why;
    (void)why_size;
    gate_asks[cls]++;
    return 0;
}

static void count_charge(void *ctx, enum budget_class cls, int n)
{
    ck_assert_ptr_eq(ctx, gate_asks);
    gate_charged[cls] += n;
}

/* The charges psp-sim's ledger holds. */
static long long psp_charges(void)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    long long n = (long long)json_array_size(json_object_get(l, "charges"));
    json_decref(l);
    return n;
}

static int refuse_gate(void *ctx, enum budget_class cls, char *why, size_t why_size)
{
    (void)ctx;
    gate_asks[cls]++;
    snprintf(why, why_size, "no share of the provider budget in time");
    return -1;
}

/* A blocking request the gate refuses is not sent, and reads as a throttled
 * one (not executed, throttled, no Retry-After): its caller backs off as
 * for a 429, a reconciler's look is no look. */
START_TEST(a_request_the_gate_refuses_reads_throttled)
{
    memset(gate_asks, 0, sizeof(gate_asks));
    provider_client_set_gate(pc, refuse_gate, NULL, NULL);
    long long before = psp_charges();
    struct provider_result r = run("pc-gate-refused", 100, "pm_card_visa");
    ck_assert_int_eq(r.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(r.throttled, 1);
    ck_assert_int_eq(r.retry_after_ms, 0);
    ck_assert_str_eq(r.error, "no share of the provider budget in time");
    ck_assert_int_eq(gate_asks[BUDGET_CLASS_CREATE], 1);
    ck_assert_int_eq(psp_charges(), before);
}
END_TEST

/* The answer of the one asynchronous charge in flight, and its opaque. */
static struct provider_result finish_async(void **op)
{
    struct provider_result r;
    long long deadline = test_env_now_ms() + 10000;
    while (!provider_client_next_done(pc, &r, op)) {
        ck_assert_msg(test_env_now_ms() < deadline, "the charge never finished");
        provider_client_perform(pc, 100);
    }
    return r;
}

/* Every arrival is paid for: a request curl sent again by itself on a
 * fresh connection (a pooled one closed unanswered: resent) is charged to
 * the gate with its class, a blocking one at once, an asynchronous one at
 * next_done, which hands back the caller's own opaque. */
START_TEST(a_gated_clients_resent_request_is_charged)
{
    memset(gate_asks, 0, sizeof(gate_asks));
    memset(gate_charged, 0, sizeof(gate_charged));
    provider_client_set_gate(pc, count_gate, count_charge, gate_asks);
    /* A first charge leaves its connection in the pool. */
    ck_assert_int_eq(run("pc-gate-warm", 100, "pm_card_visa").outcome,
                     PROVIDER_SUCCEEDED);
    set_faults("{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"pc-gate-drop\","
               "\"times\":1}]}");
    struct provider_result r = run("pc-gate-drop", 100, "pm_card_visa");
    ck_assert_int_eq(r.resent, 1);
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.replayed, 1);
    ck_assert_int_eq(gate_asks[BUDGET_CLASS_CREATE], 2);
    ck_assert_int_eq(gate_charged[BUDGET_CLASS_CREATE], 1);

    /* Asynchronous: the same, once the multi handle pools a connection. */
    int warm = 0, drop = 0;
    void *op = NULL;
    struct provider_charge c = ch("pc-gate-awarm", 100, "pm_card_visa");
    ck_assert_int_eq(provider_client_start_charge(pc, &c, &warm, &err), CHARGED_OK);
    r = finish_async(&op);
    ck_assert_ptr_eq(op, &warm);
    ck_assert_int_eq(r.resent, 0);
    set_faults("{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"pc-gate-adrop\","
               "\"times\":1}]}");
    c = ch("pc-gate-adrop", 100, "pm_card_visa");
    ck_assert_int_eq(provider_client_start_charge(pc, &c, &drop, &err), CHARGED_OK);
    r = finish_async(&op);
    ck_assert_ptr_eq(op, &drop);
    ck_assert_int_eq(r.resent, 1);
    ck_assert_int_eq(gate_asks[BUDGET_CLASS_CREATE], 4);
    ck_assert_int_eq(gate_charged[BUDGET_CLASS_CREATE], 2);
    ck_assert_uint_eq(provider_client_in_flight(pc), 0);
}
END_TEST

/* The value of one series in the process's /metrics text (0: absent). */
static double metric_value(const char *series)
{
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(metrics_render(&text, &len), 0);
    double v = 0;
    size_t n = strlen(series);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            v = strtod(p + n + 1, NULL);
    free(text);
    return v;
}

/* Every role but the worker gates its client, and the client counts a
 * gated request's answer (blocking or started) where the worker's engine
 * counts its own: charged_provider_responses_total by operation and
 * outcome, a 429 in charged_provider_throttled_total by endpoint class, so
 * that ChargedProviderThrottled fires for every role. A request the gate
 * refused reached nothing and counts nowhere; an ungated client (the
 * worker's) counts nothing here. */
START_TEST(a_gated_clients_answers_and_429s_are_counted)
{
    const char *charge_ok =
        "charged_provider_responses_total{operation=\"charge\",class=\"succeeded\"}";
    const char *charge_429 =
        "charged_provider_responses_total{operation=\"charge\",class=\"not_executed\"}";
    const char *create_429 = "charged_provider_throttled_total{class=\"create\"}";
    metrics_reset();
    /* Ungated: the worker's engine counts, not the client. */
    ck_assert_int_eq(run("pc-count-ungated", 100, "pm_card_visa").outcome,
                     PROVIDER_SUCCEEDED);
    ck_assert(metric_value(charge_ok) == 0);

    memset(gate_asks, 0, sizeof(gate_asks));
    provider_client_set_gate(pc, count_gate, count_charge, gate_asks);
    ck_assert_int_eq(run("pc-count-ok", 100, "pm_card_visa").outcome,
                     PROVIDER_SUCCEEDED);
    ck_assert(metric_value(charge_ok) == 1);
    set_faults("{\"rules\":[{\"kind\":\"rate_limit\",\"times\":2}]}");
    struct provider_result r = run("pc-count-429", 100, "pm_card_visa");
    ck_assert_int_eq(r.http_status, 429);
    ck_assert(metric_value(charge_429) == 1);
    ck_assert(metric_value(create_429) == 1);
    /* Started: counted at next_done, under the class it was started with. */
    int tag = 0;
    void *op = NULL;
    struct provider_charge c = ch("pc-count-a429", 100, "pm_card_visa");
    ck_assert_int_eq(provider_client_start_charge(pc, &c, &tag, &err), CHARGED_OK);
    r = finish_async(&op);
    ck_assert_ptr_eq(op, &tag);
    ck_assert_int_eq(r.http_status, 429);
    ck_assert(metric_value(charge_429) == 2);
    ck_assert(metric_value(create_429) == 2);
    /* Refused by the gate: not sent, not an answer, not a 429. */
    provider_client_set_gate(pc, refuse_gate, NULL, NULL);
    r = run("pc-count-refused", 100, "pm_card_visa");
    ck_assert_int_eq(r.throttled, 1);
    ck_assert(metric_value(charge_429) == 2);
    ck_assert(metric_value(create_429) == 2);
    metrics_reset();
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("provider_client");
    TCase *tc = tcase_create("provider_client");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, succeeded_keeps_the_payment_id_and_replays);
    tcase_add_test(tc, a_gated_clients_resent_request_is_charged);
    tcase_add_test(tc, a_request_the_gate_refuses_reads_throttled);
    tcase_add_test(tc, a_gated_clients_answers_and_429s_are_counted);
    tcase_add_test(tc, processing_is_processing);
    tcase_add_test(tc, card_error_is_declined_with_codes);
    tcase_add_test(tc, invalid_request_is_invalid);
    tcase_add_test(tc, idempotency_error_requires_review);
    tcase_add_test(tc, key_in_use_409_is_not_executed);
    tcase_add_test(tc, rate_limit_429_is_not_executed);
    tcase_add_test(tc, retry_after_from_the_limiter_parks_the_job_that_long);
    tcase_add_test(tc, refused_connection_is_not_executed);
    tcase_add_test(tc, server_error_before_executing_is_unknown);
    tcase_add_test(tc, server_error_after_executing_is_unknown);
    tcase_add_test(tc, dropped_answer_is_unknown_and_retry_yields_the_original_charge);
    tcase_add_test(tc, stalled_answer_is_unknown_never_declined);
    tcase_add_test(tc, lookups_find_what_was_charged);
    tcase_add_test(tc, decline_takes_the_intent_from_the_card_error);
    tcase_add_test(tc, invalid_request_keeps_the_code_not_the_customer);
    tcase_add_test(tc, list_pages_match_the_attempt);
    tcase_add_test(tc, async_charges_complete_with_their_opaque);
    tcase_add_test(tc, an_answer_finished_at_the_wait_ends_it);
    tcase_add_test(tc, blocking_calls_are_thread_safe);
    tcase_add_test(tc, refund_succeeds_replays_and_is_found_again);
    tcase_add_test(tc, refund_pending_is_processing_and_failed_is_declined);
    tcase_add_test(tc, refund_refusals_and_faults_are_classified_as_a_charges);
    suite_add_tcase(s, tc);
    TCase *pure = tcase_create("redact");
    tcase_add_test(pure, redact_masks_echoed_ids_and_quoted_values);
    suite_add_tcase(s, pure);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
