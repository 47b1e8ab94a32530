/* psp-sim, run for real on loopback: Stripe's idempotency rules, declines,
 * key retention, search, and each injected fault, checked against its ledger. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>

#include "psp_sim_process.h"
#include "test_env.h"

static struct psp_sim_process sim;

struct http_answer {
    CURLcode cc;
    long status;
    int replayed;
    char *body;
    size_t len;
    json_t *json;
};

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *u)
{
    struct http_answer *a = u;
    size_t n = size * nmemb;
    a->body = realloc(a->body, a->len + n + 1);
    memcpy(a->body + a->len, ptr, n);
    a->len += n;
    a->body[a->len] = '\0';
    return n;
}

static size_t on_header(char *buf, size_t size, size_t n, void *u)
{
    struct http_answer *a = u;
    if (size * n >= 25 && !strncasecmp(buf, "Idempotent-Replayed: true", 25))
        a->replayed = 1;
    return size * n;
}

static void answer_free(struct http_answer *a)
{
    free(a->body);
    json_decref(a->json);
    memset(a, 0, sizeof(*a));
}

/* One request to the provider API. auth NULL: the right key. */
static struct http_answer request(const char *method, const char *path, const char *key,
                                  const char *body, const char *auth, long timeout_ms)
{
    struct http_answer a = {0};
    struct curl_slist *h = NULL;
    char url[512], hdr[512];
    CURL *e = curl_easy_init();

    snprintf(url, sizeof(url), "%s%s", sim.base_url, path);
    snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s",
             auth ? auth : PSP_SIM_TEST_KEY);
    h = curl_slist_append(h, hdr);
    if (key) {
        snprintf(hdr, sizeof(hdr), "Idempotency-Key: %s", key);
        h = curl_slist_append(h, hdr);
    }
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &a);
    if (body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    a.cc = curl_easy_perform(e);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a.status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    if (a.body)
        a.json = json_loads(a.body, 0, NULL);
    return a;
}

static struct http_answer charge(const char *key, const char *attempt, long amount,
                                 const char *pm)
{
    char body[512];
    snprintf(body, sizeof(body),
             "amount=%ld&currency=eur&payment_method=%s&confirm=true&off_session=true"
             "&metadata%%5Bpayment_attempt_id%%5D=%s&metadata%%5Border_id%%5D=o-%s",
             amount, pm, attempt, attempt);
    return request("POST", "/v1/payment_intents", key, body, NULL, 5000);
}

static const char *jstr(json_t *j, const char *k)
{
    const char *s = json_string_value(json_object_get(j, k));
    return s ? s : "";
}

static const char *err_field(json_t *j, const char *k)
{
    return jstr(json_object_get(j, "error"), k);
}

static void set_faults(const char *json)
{
    json_decref(psp_sim_admin(&sim, "PUT", "/faults", json));
}

static void setup(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    psp_sim_start(&sim, NULL);
}

static void teardown(void)
{
    psp_sim_stop(&sim);
}

START_TEST(same_key_same_parameters_replays_with_header)
{
    struct http_answer a = charge("k-replay", "a1", 1000, "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    ck_assert_int_eq(a.replayed, 0);
    ck_assert_str_eq(jstr(a.json, "status"), "succeeded");
    char id[64];
    snprintf(id, sizeof(id), "%s", jstr(a.json, "id"));
    ck_assert(!strncmp(id, "pi_", 3));

    struct http_answer b = charge("k-replay", "a1", 1000, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_str_eq(jstr(b.json, "id"), id);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(same_key_other_parameters_is_400_idempotency_error)
{
    struct http_answer a = charge("k-mismatch", "a1", 1000, "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    struct http_answer b = charge("k-mismatch", "a1", 2000, "pm_card_visa");
    ck_assert_int_eq(b.status, 400);
    ck_assert_str_eq(err_field(b.json, "type"), "idempotency_error");
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

struct racer {
    pthread_barrier_t *barrier;
    struct http_answer a;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    pthread_barrier_wait(r->barrier);
    r->a = charge("k-race", "a-race", 1500, "pm_card_visa");
    return NULL;
}

START_TEST(concurrent_requests_with_one_key_execute_once)
{
    /* The first request holds the key for 500 ms; the other arrives meanwhile. */
    set_faults("{\"latency_ms\": 500}");
    pthread_barrier_t barrier;
    pthread_t t[2];
    struct racer r[2] = {{.barrier = &barrier}, {.barrier = &barrier}};
    pthread_barrier_init(&barrier, NULL, 2);
    for (int i = 0; i < 2; i++)
        pthread_create(&t[i], NULL, race, &r[i]);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    pthread_barrier_destroy(&barrier);
    long s0 = r[0].a.status, s1 = r[1].a.status;
    ck_assert_msg((s0 == 200 && s1 == 409) || (s0 == 409 && s1 == 200),
                  "statuses %ld and %ld", s0, s1);
    struct http_answer *conflict = s0 == 409 ? &r[0].a : &r[1].a;
    ck_assert_str_eq(err_field(conflict->json, "code"), "idempotency_key_in_use");
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-race"), 1);
    answer_free(&r[0].a);
    answer_free(&r[1].a);
}
END_TEST

START_TEST(validation_failure_is_400_and_not_stored)
{
    struct http_answer a = charge("k-invalid", "a1", 0, "pm_card_visa");
    ck_assert_int_eq(a.status, 400);
    ck_assert_str_eq(err_field(a.json, "type"), "invalid_request_error");
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    /* Not stored: the same key with valid parameters executes, no replay. */
    struct http_answer b = charge("k-invalid", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    struct http_answer c = charge("k-invalid-pm", "a2", 100, "pm_card_unknown");
    ck_assert_int_eq(c.status, 400);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
}
END_TEST

START_TEST(declines_are_402_card_errors_and_stored)
{
    struct http_answer a = charge("k-decl", "a1", 100, "pm_card_chargeDeclined");
    ck_assert_int_eq(a.status, 402);
    ck_assert_str_eq(err_field(a.json, "type"), "card_error");
    ck_assert_str_eq(err_field(a.json, "code"), "card_declined");
    ck_assert_str_eq(err_field(a.json, "decline_code"), "generic_decline");
    struct http_answer b =
        charge("k-funds", "a2", 100, "pm_card_chargeDeclinedInsufficientFunds");
    ck_assert_int_eq(b.status, 402);
    ck_assert_str_eq(err_field(b.json, "decline_code"), "insufficient_funds");
    /* Executed requests are stored: the decline replays. */
    struct http_answer c = charge("k-decl", "a1", 100, "pm_card_chargeDeclined");
    ck_assert_int_eq(c.status, 402);
    ck_assert_int_eq(c.replayed, 1);
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_t *charges = json_object_get(l, "charges");
    ck_assert_uint_eq(json_array_size(charges), 2);
    ck_assert_str_eq(jstr(json_array_get(charges, 0), "outcome"), "declined");
    json_decref(l);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
}
END_TEST

START_TEST(key_is_forgotten_after_retention)
{
    json_decref(
        psp_sim_admin(&sim, "PUT", "/retention", "{\"key_retention_ms\": 300}"));
    struct http_answer a = charge("k-expire", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    char first[64];
    snprintf(first, sizeof(first), "%s", jstr(a.json, "id"));
    answer_free(&a);
    /* Replays while the key is kept, charges anew once it is forgotten. */
    long long deadline = test_env_now_ms() + 5000;
    int replays = 0;
    for (;;) {
        struct http_answer b = charge("k-expire", "a1", 100, "pm_card_visa");
        ck_assert_int_eq(b.status, 200);
        if (!b.replayed) {
            ck_assert_str_ne(jstr(b.json, "id"), first);
            answer_free(&b);
            break;
        }
        replays++;
        answer_free(&b);
        ck_assert_msg(test_env_now_ms() < deadline, "key never expired");
        struct timespec ts = {0, 50 * 1000000};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_ge(replays, 1);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-expire"), 2);
}
END_TEST

START_TEST(search_and_retrieve)
{
    struct http_answer a = charge("k-s1", "attempt-one", 100, "pm_card_visa");
    struct http_answer b = charge("k-s2", "attempt-two", 200, "pm_card_visa");
    struct http_answer s = request(
        "GET",
        "/v1/payment_intents/search?query=metadata%5B%27payment_attempt_id%27%5D%3A%27"
        "attempt-two%27",
        NULL, NULL, NULL, 5000);
    ck_assert_int_eq(s.status, 200);
    ck_assert_str_eq(jstr(s.json, "object"), "search_result");
    json_t *data = json_object_get(s.json, "data");
    ck_assert_uint_eq(json_array_size(data), 1);
    ck_assert_str_eq(jstr(json_array_get(data, 0), "id"), jstr(b.json, "id"));

    char path[128];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s", jstr(a.json, "id"));
    struct http_answer r = request("GET", path, NULL, NULL, NULL, 5000);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(r.json, "amount")), 100);
    struct http_answer m =
        request("GET", "/v1/payment_intents/pi_nope", NULL, NULL, NULL, 5000);
    ck_assert_int_eq(m.status, 404);
    answer_free(&a);
    answer_free(&b);
    answer_free(&s);
    answer_free(&r);
    answer_free(&m);
}
END_TEST

START_TEST(missing_or_wrong_api_key_is_401)
{
    struct http_answer a = request("POST", "/v1/payment_intents", "k-auth",
                                   "amount=1&currency=eur&payment_method=pm_card_visa"
                                   "&confirm=true",
                                   "sk_wrong", 5000);
    ck_assert_int_eq(a.status, 401);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    answer_free(&a);
}
END_TEST

START_TEST(fault_error_before_executes_nothing)
{
    set_faults(
        "{\"rules\":[{\"kind\":\"error_before\",\"key\":\"k-eb\",\"times\":1}]}");
    struct http_answer a = charge("k-eb", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 500);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    struct http_answer b = charge("k-eb", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(fault_rate_limit_executes_nothing)
{
    set_faults(
        "{\"rules\":[{\"kind\":\"rate_limit\",\"payment_method\":\"pm_card_visa\","
        "\"times\":1}]}");
    struct http_answer a = charge("k-rl", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 429);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    struct http_answer b = charge("k-rl", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(fault_error_after_executes_then_500)
{
    set_faults("{\"rules\":[{\"kind\":\"error_after\",\"key\":\"k-ea\",\"times\":1}]}");
    struct http_answer a = charge("k-ea", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 500);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    struct http_answer b = charge("k-ea", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(fault_stall_after_executes_then_outlasts_the_client)
{
    set_faults(
        "{\"stall_ms\": 3000, \"rules\":[{\"kind\":\"stall_after\",\"key\":\"k-st\","
        "\"times\":1}]}");
    long long t0 = test_env_now_ms();
    struct http_answer a = request("POST", "/v1/payment_intents", "k-st",
                                   "amount=100&currency=eur&payment_method=pm_card_visa"
                                   "&confirm=true",
                                   NULL, 400);
    ck_assert_int_eq(a.cc, CURLE_OPERATION_TIMEDOUT);
    ck_assert_int_ge(test_env_now_ms() - t0, 400);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
}
END_TEST

START_TEST(fault_drop_after_executes_then_hangs_up)
{
    set_faults("{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"k-dr\",\"times\":1}]}");
    struct http_answer a = charge("k-dr", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 0);
    ck_assert_int_eq(a.cc, CURLE_GOT_NOTHING);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    struct http_answer b = charge("k-dr", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(latency_is_added)
{
    set_faults("{\"latency_ms\": 200, \"latency_jitter_ms\": 50}");
    long long t0 = test_env_now_ms();
    struct http_answer a = charge("k-lat", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    ck_assert_int_ge(test_env_now_ms() - t0, 200);
    answer_free(&a);
}
END_TEST

/* Which of 40 keys a drop_after rule with p=0.5 hits, as a bit string. */
static void fault_pattern(const char *seed, char out[41])
{
    char cfg[256], key[32];
    json_decref(psp_sim_admin(&sim, "POST", "/reset", NULL));
    snprintf(
        cfg, sizeof(cfg),
        "{\"seed\": %s, \"rules\":[{\"kind\":\"drop_after\",\"probability\":0.5}]}",
        seed);
    set_faults(cfg);
    for (int i = 0; i < 40; i++) {
        snprintf(key, sizeof(key), "k-det-%d", i);
        struct http_answer a = charge(key, key, 100, "pm_card_visa");
        out[i] = a.status == 0 ? '1' : '0';
        answer_free(&a);
    }
    out[40] = '\0';
}

START_TEST(faults_are_deterministic_under_a_seed)
{
    char a[41], b[41], c[41];
    fault_pattern("7", a);
    fault_pattern("7", b);
    fault_pattern("8", c);
    ck_assert_str_eq(a, b);
    ck_assert_str_ne(a, c);
    ck_assert_ptr_nonnull(strchr(a, '1'));
    ck_assert_ptr_nonnull(strchr(a, '0'));
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("psp_sim");
    TCase *tc = tcase_create("psp_sim");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, same_key_same_parameters_replays_with_header);
    tcase_add_test(tc, same_key_other_parameters_is_400_idempotency_error);
    tcase_add_test(tc, concurrent_requests_with_one_key_execute_once);
    tcase_add_test(tc, validation_failure_is_400_and_not_stored);
    tcase_add_test(tc, declines_are_402_card_errors_and_stored);
    tcase_add_test(tc, key_is_forgotten_after_retention);
    tcase_add_test(tc, search_and_retrieve);
    tcase_add_test(tc, missing_or_wrong_api_key_is_401);
    tcase_add_test(tc, fault_error_before_executes_nothing);
    tcase_add_test(tc, fault_rate_limit_executes_nothing);
    tcase_add_test(tc, fault_error_after_executes_then_500);
    tcase_add_test(tc, fault_stall_after_executes_then_outlasts_the_client);
    tcase_add_test(tc, fault_drop_after_executes_then_hangs_up);
    tcase_add_test(tc, latency_is_added);
    tcase_add_test(tc, faults_are_deterministic_under_a_seed);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
