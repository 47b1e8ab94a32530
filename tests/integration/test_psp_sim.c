/* psp-sim, run for real on loopback: Stripe's idempotency rules, declines,
 * key retention, search, and each injected fault, checked against its ledger;
 * form decoding, the customer and automatic_payment_methods fields, processing
 * intents that settle later, search that lags, its ephemeral ports and how it
 * refuses each bad flag. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* One request to base_url; auth NULL: the right key; extra_header: one
 * more "Name: value" line, or NULL. */
static struct http_answer request_to(const char *base_url, const char *method,
                                     const char *path, const char *key,
                                     const char *body, const char *auth,
                                     const char *extra_header, long timeout_ms)
{
    struct http_answer a = {0};
    struct curl_slist *h = NULL;
    char url[512], hdr[512];
    CURL *e = curl_easy_init();

    snprintf(url, sizeof(url), "%s%s", base_url, path);
    snprintf(hdr, sizeof(hdr), "Authorization: Bearer %s",
             auth ? auth : PSP_SIM_TEST_KEY);
    h = curl_slist_append(h, hdr);
    if (key) {
        snprintf(hdr, sizeof(hdr), "Idempotency-Key: %s", key);
        h = curl_slist_append(h, hdr);
    }
    if (extra_header)
        h = curl_slist_append(h, extra_header);
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

/* One request to the provider API of the suite's psp-sim. */
static struct http_answer request(const char *method, const char *path, const char *key,
                                  const char *body, const char *auth, long timeout_ms)
{
    return request_to(sim.base_url, method, path, key, body, auth, NULL, timeout_ms);
}

/* POST /v1/payment_intents with this form body. */
static struct http_answer create(const char *key, const char *body)
{
    return request("POST", "/v1/payment_intents", key, body, NULL, 5000);
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
    /* Both ends are truncated to the millisecond: 400 ms can read as 399. */
    ck_assert_int_ge(test_env_now_ms() - t0, 400 - 1);
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
    /* Both ends are truncated to the millisecond: 200 ms can read as 199. */
    ck_assert_int_ge(test_env_now_ms() - t0, 200 - 1);
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

#define FORM_BASE "amount=100&currency=eur&payment_method=pm_card_visa&confirm=true"
#define FORM_BASE_PROCESSING                                                           \
    "amount=100&currency=eur&payment_method=pm_card_processing&confirm=true"

static const char *meta(json_t *pi, const char *k)
{
    return jstr(json_object_get(pi, "metadata"), k);
}

START_TEST(form_names_and_values_are_decoded)
{
    /* Brackets escaped (either case of hex) or not, '+' a space, %2B a plus,
     * %26 and %3D literal, UTF-8; bare names and empty pairs are harmless. */
    struct http_answer a =
        create("k-form", FORM_BASE "&&off_session&metadata%5Bpayment_attempt_id%5D="
                                   "a+b%2Bc%26d%3De%25"
                                   "&metadata%5border_id%5d=%E2%82%AC%2Fo&");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(meta(a.json, "payment_attempt_id"), "a b+c&d=e%");
    ck_assert_str_eq(meta(a.json, "order_id"), "\xe2\x82\xac/o");
    struct http_answer b = create("k-form-raw", FORM_BASE "&metadata[order_id]=o%201");
    ck_assert_int_eq(b.status, 200);
    ck_assert_str_eq(meta(b.json, "order_id"), "o 1");
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    ck_assert_str_eq(
        jstr(json_array_get(json_object_get(l, "charges"), 0), "payment_attempt_id"),
        "a b+c&d=e%");
    json_decref(l);
    /* A NUL byte or bytes that are not UTF-8 make no parameter: refused,
     * nothing executed (amount=1%00x is not amount 1). */
    struct http_answer c =
        create("k-form-nul", "amount=1%00x&currency=eur&payment_method=pm_card_visa"
                             "&confirm=true");
    ck_assert_int_eq(c.status, 400);
    ck_assert_str_eq(err_field(c.json, "type"), "invalid_request_error");
    struct http_answer d =
        create("k-form-utf8", FORM_BASE "&metadata%5Border_id%5D=%FF");
    ck_assert_int_eq(d.status, 400);
    ck_assert_uint_eq(psp_sim_charges(&sim), 2);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
    answer_free(&d);
}
END_TEST

START_TEST(customer_and_automatic_payment_methods_are_accepted)
{
    struct http_answer a = request_to(
        sim.base_url, "POST", "/v1/payment_intents", "k-apm",
        FORM_BASE "&off_session=true&automatic_payment_methods%5Benabled%5D=true"
                  "&automatic_payment_methods%5Ballow_redirects%5D=never"
                  "&customer=cus_Nf0aB12&metadata%5Bpayment_attempt_id%5D=a-apm",
        NULL, "Stripe-Version: 2024-06-20", 5000);
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "status"), "succeeded");
    ck_assert_str_eq(jstr(a.json, "customer"), "cus_Nf0aB12");
    json_t *apm = json_object_get(a.json, "automatic_payment_methods");
    ck_assert(json_is_true(json_object_get(apm, "enabled")));
    ck_assert_str_eq(jstr(apm, "allow_redirects"), "never");

    /* Stored on the intent, and in the ledger. */
    char path[128];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s", jstr(a.json, "id"));
    struct http_answer r = request("GET", path, NULL, NULL, NULL, 5000);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(jstr(r.json, "customer"), "cus_Nf0aB12");
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    ck_assert_str_eq(jstr(json_array_get(json_object_get(l, "charges"), 0), "customer"),
                     "cus_Nf0aB12");
    json_decref(l);

    /* Without them the intent says null, as Stripe's does. */
    struct http_answer b = charge("k-apm-none", "a2", 100, "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert(json_is_null(json_object_get(b.json, "customer")));
    ck_assert(json_is_null(json_object_get(b.json, "automatic_payment_methods")));
    answer_free(&a);
    answer_free(&r);
    answer_free(&b);
}
END_TEST

START_TEST(automatic_payment_methods_values_are_checked)
{
    struct http_answer a =
        create("k-apm-bool", FORM_BASE "&automatic_payment_methods%5Benabled%5D=yes");
    ck_assert_int_eq(a.status, 400);
    ck_assert_str_eq(err_field(a.json, "param"), "automatic_payment_methods[enabled]");
    struct http_answer b =
        create("k-apm-redir",
               FORM_BASE "&automatic_payment_methods%5Benabled%5D=true"
                         "&automatic_payment_methods%5Ballow_redirects%5D=maybe");
    ck_assert_int_eq(b.status, 400);
    ck_assert_str_eq(err_field(b.json, "param"),
                     "automatic_payment_methods[allow_redirects]");
    struct http_answer c =
        create("k-apm-alone",
               FORM_BASE "&automatic_payment_methods%5Ballow_redirects%5D=never");
    ck_assert_int_eq(c.status, 400);
    ck_assert_str_eq(err_field(c.json, "code"), "parameter_missing");
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
}
END_TEST

/* Creates an intent for this customer (form-encoded already). */
static struct http_answer charge_customer(const char *key, const char *customer)
{
    char body[1024];
    snprintf(body, sizeof(body), FORM_BASE "&customer=%s", customer);
    return create(key, body);
}

static void expect_no_such_customer(const char *encoded, const char *message)
{
    struct http_answer a = charge_customer("k-cus-bad", encoded);
    ck_assert_int_eq(a.status, 400);
    ck_assert_str_eq(err_field(a.json, "type"), "invalid_request_error");
    ck_assert_str_eq(err_field(a.json, "code"), "resource_missing");
    ck_assert_str_eq(err_field(a.json, "param"), "customer");
    ck_assert_str_eq(err_field(a.json, "message"), message);
    answer_free(&a);
}

START_TEST(customer_that_is_no_customer_id_is_400_resource_missing)
{
    char longval[400], want[128];
    expect_no_such_customer("bob", "No such customer: 'bob'");
    expect_no_such_customer("cus_", "No such customer: 'cus_'");
    expect_no_such_customer("", "No such customer: ''");
    expect_no_such_customer("cus_a-b", "No such customer: 'cus_a-b'");
    expect_no_such_customer("cus_%E2%82%AC%09", "No such customer: 'cus_\?\?\?\?'");
    /* The value is bounded in the message: 64 bytes, then "...". */
    memset(longval, 'x', 300);
    longval[300] = '\0';
    snprintf(want, sizeof(want), "No such customer: '%.64s...'", longval);
    expect_no_such_customer(longval, want);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    /* Not stored under the key: a good customer with it executes. */
    struct http_answer b = charge_customer("k-cus-bad", "cus_Good1");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    answer_free(&b);
}
END_TEST

START_TEST(customer_is_part_of_the_idempotency_fingerprint)
{
    struct http_answer a = charge_customer("k-cus", "cus_A1");
    ck_assert_int_eq(a.status, 200);
    struct http_answer b = charge_customer("k-cus", "cus_B2");
    ck_assert_int_eq(b.status, 400);
    ck_assert_str_eq(err_field(b.json, "type"), "idempotency_error");
    struct http_answer c = create("k-cus", FORM_BASE);
    ck_assert_int_eq(c.status, 400);
    ck_assert_str_eq(err_field(c.json, "type"), "idempotency_error");
    struct http_answer d = charge_customer("k-cus", "cus_A1");
    ck_assert_int_eq(d.status, 200);
    ck_assert_int_eq(d.replayed, 1);
    ck_assert_str_eq(jstr(d.json, "id"), jstr(a.json, "id"));
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-cus"), 1);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
    answer_free(&d);
}
END_TEST

/* One request to the admin API of p, whatever it answers. */
static struct http_answer admin_to(struct psp_sim_process *p, const char *method,
                                   const char *path, const char *body)
{
    char base[64];
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", p->admin_port);
    return request_to(base, method, path, NULL, body, NULL, NULL, 5000);
}

/* GET /v1/payment_intents/<id> on p. */
static struct http_answer retrieve_on(struct psp_sim_process *p, const char *id)
{
    char path[160];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s", id);
    return request_to(p->base_url, "GET", path, NULL, NULL, NULL, NULL, 5000);
}

/* GET /v1/payment_intents/search for this attempt id (plain letters) on p. */
static struct http_answer search_on(struct psp_sim_process *p, const char *attempt)
{
    char path[256];
    snprintf(path, sizeof(path),
             "/v1/payment_intents/search?query=metadata%%5B%%27payment_attempt_id"
             "%%27%%5D%%3A%%27%s%%27",
             attempt);
    return request_to(p->base_url, "GET", path, NULL, NULL, NULL, NULL, 5000);
}

/* POST /intents/<id>/settle on p. */
static struct http_answer settle_on(struct psp_sim_process *p, const char *id,
                                    const char *body)
{
    char path[160];
    snprintf(path, sizeof(path), "/intents/%s/settle", id);
    return admin_to(p, "POST", path, body);
}

/* The ledger row of this intent (a new reference), failing when it has
 * none or more than one. */
static json_t *ledger_row(struct psp_sim_process *p, const char *id)
{
    json_t *l = psp_sim_admin(p, "GET", "/ledger", NULL), *c, *found = NULL;
    size_t i, n = 0;
    json_array_foreach(json_object_get(l, "charges"), i, c)
    {
        if (!strcmp(jstr(c, "payment_intent_id"), id)) {
            found = c;
            n++;
        }
    }
    ck_assert_msg(n == 1, "intent %s has %zu ledger rows", id, n);
    json_incref(found);
    json_decref(l);
    return found;
}

static long long ledger_counter(struct psp_sim_process *p, const char *name)
{
    json_t *l = psp_sim_admin(p, "GET", "/ledger", NULL);
    long long v =
        json_integer_value(json_object_get(json_object_get(l, "counters"), name));
    json_decref(l);
    return v;
}

static void pause_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

/* Polls retrieve until the intent leaves processing, within 10 s; returns
 * the status it reached. */
static void wait_settled(struct psp_sim_process *p, const char *id, char *status,
                         size_t len)
{
    long long deadline = test_env_now_ms() + 10000;
    for (;;) {
        struct http_answer r = retrieve_on(p, id);
        ck_assert_int_eq(r.status, 200);
        snprintf(status, len, "%s", jstr(r.json, "status"));
        answer_free(&r);
        if (strcmp(status, "processing") != 0)
            return;
        ck_assert_msg(test_env_now_ms() < deadline, "intent %s never settled", id);
        pause_ms(20);
    }
}

START_TEST(processing_intent_is_settled_by_admin)
{
    struct http_answer a = charge("k-proc", "a-proc", 700, "pm_card_processing");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "status"), "processing");
    char id[64];
    snprintf(id, sizeof(id), "%s", jstr(a.json, "id"));

    /* A bad body is 400 and changes nothing. */
    static const char *const bad[] = {
        "not json",
        "[]",
        "{}",
        "{\"status\":\"processing\"}",
        "{\"status\":\"succeeded\",\"decline_code\":\"insufficient_funds\"}",
        "{\"status\":\"requires_payment_method\",\"decline_code\":\"Bad Code\"}",
        "{\"status\":\"succeeded\",\"amount\":1}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct http_answer b = settle_on(&sim, id, bad[i]);
        ck_assert_msg(b.status == 400, "%s: %ld", bad[i], b.status);
        ck_assert_str_eq(err_field(b.json, "type"), "invalid_request_error");
        answer_free(&b);
    }
    struct http_answer still = retrieve_on(&sim, id);
    ck_assert_str_eq(jstr(still.json, "status"), "processing");
    ck_assert_int_eq(ledger_counter(&sim, "processing"), 1);

    struct http_answer s = settle_on(&sim, id, "{\"status\":\"succeeded\"}");
    ck_assert_int_eq(s.status, 200);
    ck_assert_str_eq(jstr(s.json, "id"), id);
    ck_assert_str_eq(jstr(s.json, "status"), "succeeded");

    /* Retrieve and search both see it settled. */
    struct http_answer r = retrieve_on(&sim, id);
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(jstr(r.json, "status"), "succeeded");
    ck_assert(json_is_null(json_object_get(r.json, "last_payment_error")));
    struct http_answer q = search_on(&sim, "a-proc");
    ck_assert_int_eq(q.status, 200);
    json_t *data = json_object_get(q.json, "data");
    ck_assert_uint_eq(json_array_size(data), 1);
    ck_assert_str_eq(jstr(json_array_get(data, 0), "status"), "succeeded");

    /* The ledger: one row, now succeeded, with the fields of a charge that
     * succeeded at once. */
    struct http_answer v = charge("k-visa", "a-visa", 300, "pm_card_visa");
    ck_assert_int_eq(v.status, 200);
    json_t *row = ledger_row(&sim, id), *vrow = ledger_row(&sim, jstr(v.json, "id"));
    ck_assert_str_eq(jstr(row, "outcome"), "succeeded");
    ck_assert_str_eq(jstr(row, "idempotency_key"), "k-proc");
    ck_assert_str_eq(jstr(row, "payment_attempt_id"), "a-proc");
    ck_assert_int_eq(json_integer_value(json_object_get(row, "amount")), 700);
    ck_assert(json_is_integer(json_object_get(row, "settled_at_ms")));
    ck_assert(json_is_null(json_object_get(vrow, "settled_at_ms")));
    ck_assert_uint_eq(json_object_size(row), json_object_size(vrow));
    const char *k;
    json_t *val;
    json_object_foreach(vrow, k, val)
        ck_assert_msg(json_object_get(row, k) != NULL, "settled row has no %s", k);
    json_decref(row);
    json_decref(vrow);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-proc"), 1);
    ck_assert_int_eq(ledger_counter(&sim, "succeeded"), 2);
    ck_assert_int_eq(ledger_counter(&sim, "processing"), 0);
    ck_assert_int_eq(ledger_counter(&sim, "settled"), 1);

    /* Settling twice is a conflict and counts nothing. */
    struct http_answer t = settle_on(&sim, id, "{\"status\":\"succeeded\"}");
    ck_assert_int_eq(t.status, 409);
    ck_assert_str_eq(err_field(t.json, "code"), "payment_intent_unexpected_state");
    ck_assert_uint_eq(psp_sim_charges(&sim), 2);
    ck_assert_int_eq(ledger_counter(&sim, "succeeded"), 2);

    /* A replay under the key answers what the create did, as Stripe's. */
    struct http_answer p = charge("k-proc", "a-proc", 700, "pm_card_processing");
    ck_assert_int_eq(p.replayed, 1);
    ck_assert_str_eq(jstr(p.json, "status"), "processing");
    answer_free(&a);
    answer_free(&still);
    answer_free(&s);
    answer_free(&r);
    answer_free(&q);
    answer_free(&v);
    answer_free(&t);
    answer_free(&p);
}
END_TEST

START_TEST(processing_intent_is_declined_or_canceled_by_admin)
{
    struct http_answer a = charge("k-pd", "a-pd", 100, "pm_card_processing");
    struct http_answer b = charge("k-pc", "a-pc", 100, "pm_card_processing");
    struct http_answer v = charge("k-pv", "a-pv", 100, "pm_card_visa");
    char ida[64], idb[64];
    snprintf(ida, sizeof(ida), "%s", jstr(a.json, "id"));
    snprintf(idb, sizeof(idb), "%s", jstr(b.json, "id"));

    struct http_answer d = settle_on(&sim, ida,
                                     "{\"status\":\"requires_payment_method\","
                                     "\"decline_code\":\"insufficient_funds\"}");
    ck_assert_int_eq(d.status, 200);
    struct http_answer r = retrieve_on(&sim, ida);
    ck_assert_str_eq(jstr(r.json, "status"), "requires_payment_method");
    json_t *lpe = json_object_get(r.json, "last_payment_error");
    ck_assert_str_eq(jstr(lpe, "code"), "card_declined");
    ck_assert_str_eq(jstr(lpe, "decline_code"), "insufficient_funds");
    json_t *row = ledger_row(&sim, ida);
    ck_assert_str_eq(jstr(row, "outcome"), "declined");
    json_decref(row);

    struct http_answer c = settle_on(&sim, idb, "{\"status\":\"canceled\"}");
    ck_assert_int_eq(c.status, 200);
    ck_assert_str_eq(jstr(c.json, "status"), "canceled");
    row = ledger_row(&sim, idb);
    ck_assert_str_eq(jstr(row, "outcome"), "canceled");
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&sim, "declined"), 1);
    ck_assert_int_eq(ledger_counter(&sim, "canceled"), 1);
    ck_assert_int_eq(ledger_counter(&sim, "processing"), 0);

    /* Only a processing intent settles; an unknown one is 404. */
    struct http_answer s =
        settle_on(&sim, jstr(v.json, "id"), "{\"status\":\"canceled\"}");
    ck_assert_int_eq(s.status, 409);
    struct http_answer n = settle_on(&sim, "pi_nope", "{\"status\":\"succeeded\"}");
    ck_assert_int_eq(n.status, 404);
    ck_assert_str_eq(err_field(n.json, "code"), "resource_missing");
    ck_assert_str_eq(err_field(n.json, "message"), "No such payment_intent: 'pi_nope'");
    answer_free(&a);
    answer_free(&b);
    answer_free(&v);
    answer_free(&d);
    answer_free(&r);
    answer_free(&c);
    answer_free(&s);
    answer_free(&n);
}
END_TEST

START_TEST(processing_intent_settles_by_itself_after_n_ms)
{
    struct psp_sim_process other = {0};
    const char *args[] = {"--processing-settle-ms", "800", NULL};
    psp_sim_start(&other, args);
    struct http_answer a =
        request_to(other.base_url, "POST", "/v1/payment_intents", "k-self",
                   FORM_BASE_PROCESSING "&metadata%5Bpayment_attempt_id%5D=a-self",
                   NULL, NULL, 5000);
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "status"), "processing");
    char id[64], status[64];
    snprintf(id, sizeof(id), "%s", jstr(a.json, "id"));

    wait_settled(&other, id, status, sizeof(status));
    ck_assert_str_eq(status, "succeeded");
    struct http_answer q = search_on(&other, "a-self");
    ck_assert_str_eq(jstr(json_array_get(json_object_get(q.json, "data"), 0), "status"),
                     "succeeded");
    /* Booked as of when it was due, once. */
    json_t *row = ledger_row(&other, id);
    ck_assert_str_eq(jstr(row, "outcome"), "succeeded");
    ck_assert_int_eq(json_integer_value(json_object_get(row, "settled_at_ms")) -
                         json_integer_value(json_object_get(row, "at_ms")),
                     800);
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&other, "succeeded"), 1);
    ck_assert_int_eq(ledger_counter(&other, "processing"), 0);
    struct http_answer t = settle_on(&other, id, "{\"status\":\"canceled\"}");
    ck_assert_int_eq(t.status, 409);
    psp_sim_stop(&other);

    /* The same at run time; the ledger alone sees it settle too. */
    json_decref(psp_sim_admin(&sim, "PUT", "/processing-settle",
                              "{\"processing_settle_ms\": 200}"));
    struct http_answer b = charge("k-self2", "a-self2", 100, "pm_card_processing");
    ck_assert_str_eq(jstr(b.json, "status"), "processing");
    long long deadline = test_env_now_ms() + 10000;
    for (;;) {
        json_t *r = ledger_row(&sim, jstr(b.json, "id"));
        int done = !strcmp(jstr(r, "outcome"), "succeeded");
        json_decref(r);
        if (done)
            break;
        ck_assert_msg(test_env_now_ms() < deadline, "never settled in the ledger");
        pause_ms(20);
    }
    struct http_answer bad =
        admin_to(&sim, "PUT", "/processing-settle", "{\"processing_settle_ms\": -1}");
    ck_assert_int_eq(bad.status, 400);
    answer_free(&a);
    answer_free(&q);
    answer_free(&t);
    answer_free(&b);
    answer_free(&bad);
}
END_TEST

START_TEST(search_lags_behind_creation)
{
    const long lag = 1500;
    char cfg[64];
    snprintf(cfg, sizeof(cfg), "{\"search_lag_ms\": %ld}", lag);
    json_decref(psp_sim_admin(&sim, "PUT", "/search-lag", cfg));
    long long t0 = test_env_now_ms();
    struct http_answer a = charge("k-lag", "a-lag", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 200);

    /* Retrieve by id finds it at once; search does not, yet. */
    struct http_answer r = retrieve_on(&sim, jstr(a.json, "id"));
    ck_assert_int_eq(r.status, 200);
    struct http_answer s = search_on(&sim, "a-lag");
    ck_assert_int_eq(s.status, 200);
    ck_assert_msg(json_array_size(json_object_get(s.json, "data")) == 0 ||
                      test_env_now_ms() - t0 >= lag,
                  "search found the intent before the lag had passed");

    /* Then it does, not before the lag (give or take the two clocks). */
    for (;;) {
        struct http_answer f = search_on(&sim, "a-lag");
        size_t n = json_array_size(json_object_get(f.json, "data"));
        if (n == 1)
            ck_assert_str_eq(
                jstr(json_array_get(json_object_get(f.json, "data"), 0), "id"),
                jstr(a.json, "id"));
        answer_free(&f);
        if (n == 1)
            break;
        ck_assert_msg(test_env_now_ms() - t0 < 10000, "search never found it");
        pause_ms(20);
    }
    ck_assert_int_ge(test_env_now_ms() - t0, lag - 50);

    /* By flag, and the lag applies to intents made before it changed. */
    struct psp_sim_process other = {0};
    const char *args[] = {"--search-lag-ms", "600000", NULL};
    psp_sim_start(&other, args);
    struct http_answer b = request_to(
        other.base_url, "POST", "/v1/payment_intents", "k-lag2",
        FORM_BASE "&metadata%5Bpayment_attempt_id%5D=a-lag2", NULL, NULL, 5000);
    ck_assert_int_eq(b.status, 200);
    struct http_answer br = retrieve_on(&other, jstr(b.json, "id"));
    ck_assert_int_eq(br.status, 200);
    struct http_answer bs = search_on(&other, "a-lag2");
    ck_assert_uint_eq(json_array_size(json_object_get(bs.json, "data")), 0);
    json_decref(psp_sim_admin(&other, "PUT", "/search-lag", "{\"search_lag_ms\": 0}"));
    struct http_answer bf = search_on(&other, "a-lag2");
    ck_assert_uint_eq(json_array_size(json_object_get(bf.json, "data")), 1);
    struct http_answer bad = admin_to(&other, "PUT", "/search-lag", "{\"lag\": 1}");
    ck_assert_int_eq(bad.status, 400);
    psp_sim_stop(&other);
    answer_free(&a);
    answer_free(&r);
    answer_free(&s);
    answer_free(&b);
    answer_free(&br);
    answer_free(&bs);
    answer_free(&bf);
    answer_free(&bad);
}
END_TEST

static struct http_answer list_page(const char *query)
{
    char path[512];
    snprintf(path, sizeof(path), "/v1/payment_intents%s%s", *query ? "?" : "", query);
    return request("GET", path, NULL, NULL, NULL, 5000);
}

static long long jint(json_t *j, const char *k)
{
    return json_integer_value(json_object_get(j, k));
}

/* The list is Stripe's: newest first, limit, starting_after, has_more, the
 * created bounds; and consistent: a search lag does not hide anything. */
START_TEST(list_pages_newest_first_without_search_lag)
{
    char ids[5][64], key[32], attempt[32], q[256];
    json_decref(
        psp_sim_admin(&sim, "PUT", "/search-lag", "{\"search_lag_ms\": 600000}"));
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "k-list%d", i);
        snprintf(attempt, sizeof(attempt), "a-list%d", i);
        struct http_answer c = charge(key, attempt, 100 + i, "pm_card_visa");
        ck_assert_int_eq(c.status, 200);
        snprintf(ids[i], sizeof(ids[i]), "%s", jstr(c.json, "id"));
        answer_free(&c);
    }
    struct http_answer none = search_on(&sim, "a-list0");
    ck_assert_uint_eq(json_array_size(json_object_get(none.json, "data")), 0);
    answer_free(&none);

    /* Two pages of 2 and one of 1, newest first, each after the last. */
    const char *after = "";
    int seen = 0;
    char last[64] = "";
    for (int page = 0; page < 3; page++) {
        snprintf(q, sizeof(q), "created%%5Bgte%%5D=0&limit=2%s%s",
                 *after ? "&starting_after=" : "", after);
        struct http_answer a = list_page(q);
        ck_assert_int_eq(a.status, 200);
        ck_assert_str_eq(jstr(a.json, "object"), "list");
        json_t *data = json_object_get(a.json, "data");
        ck_assert_uint_eq(json_array_size(data), page < 2 ? 2 : 1);
        ck_assert(json_is_boolean(json_object_get(a.json, "has_more")));
        ck_assert_int_eq(json_is_true(json_object_get(a.json, "has_more")), page < 2);
        for (size_t i = 0; i < json_array_size(data); i++, seen++) {
            json_t *pi = json_array_get(data, i);
            ck_assert_str_eq(jstr(pi, "id"), ids[4 - seen]);
            ck_assert_int_eq(jint(pi, "amount"), 100 + 4 - seen);
            snprintf(attempt, sizeof(attempt), "a-list%d", 4 - seen);
            ck_assert_str_eq(meta(pi, "payment_attempt_id"), attempt);
        }
        snprintf(last, sizeof(last), "%s",
                 jstr(json_array_get(data, json_array_size(data) - 1), "id"));
        after = last;
        answer_free(&a);
    }
    ck_assert_int_eq(seen, 5);

    /* created bounds, in unix seconds: all now, so an earlier window has
     * none and [created, created + 1) has all of them. */
    struct http_answer one = retrieve_on(&sim, ids[0]);
    long long created = jint(one.json, "created");
    answer_free(&one);
    snprintf(q, sizeof(q), "created%%5Blt%%5D=%lld", created - 1);
    struct http_answer early = list_page(q);
    ck_assert_uint_eq(json_array_size(json_object_get(early.json, "data")), 0);
    ck_assert(json_is_false(json_object_get(early.json, "has_more")));
    snprintf(q, sizeof(q), "created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld&limit=100",
             created - 5, created + 5);
    struct http_answer all = list_page(q);
    ck_assert_uint_eq(json_array_size(json_object_get(all.json, "data")), 5);
    snprintf(q, sizeof(q), "created%%5Bgt%%5D=%lld", created + 5);
    struct http_answer later = list_page(q);
    ck_assert_uint_eq(json_array_size(json_object_get(later.json, "data")), 0);
    struct http_answer dflt = list_page("");
    ck_assert_uint_eq(json_array_size(json_object_get(dflt.json, "data")), 5);

    /* What Stripe refuses. */
    struct http_answer bad_limit = list_page("limit=101");
    ck_assert_int_eq(bad_limit.status, 400);
    struct http_answer unknown = list_page("colour=red");
    ck_assert_int_eq(unknown.status, 400);
    ck_assert_str_eq(err_field(unknown.json, "type"), "invalid_request_error");
    struct http_answer cursor = list_page("starting_after=pi_nope");
    ck_assert_int_eq(cursor.status, 400);
    ck_assert_str_eq(err_field(cursor.json, "code"), "resource_missing");
    struct http_answer noauth =
        request("GET", "/v1/payment_intents", NULL, NULL, "sk_wrong", 5000);
    ck_assert_int_eq(noauth.status, 401);
    answer_free(&early);
    answer_free(&all);
    answer_free(&later);
    answer_free(&dflt);
    answer_free(&bad_limit);
    answer_free(&unknown);
    answer_free(&cursor);
    answer_free(&noauth);
}
END_TEST

/* Stripe's 402 card_error for a PaymentIntent carries the intent whole:
 * whose it is (amount, currency, metadata) and why it failed. */
START_TEST(decline_402_carries_the_whole_intent)
{
    struct http_answer a =
        charge("k-decl-pi", "a-decl-pi", 4321, "pm_card_chargeDeclined");
    ck_assert_int_eq(a.status, 402);
    json_t *pi = json_object_get(json_object_get(a.json, "error"), "payment_intent");
    ck_assert(json_is_object(pi));
    ck_assert_str_eq(jstr(pi, "object"), "payment_intent");
    ck_assert_int_eq(jint(pi, "amount"), 4321);
    ck_assert_str_eq(jstr(pi, "currency"), "eur");
    ck_assert_str_eq(jstr(pi, "status"), "requires_payment_method");
    ck_assert_str_eq(meta(pi, "payment_attempt_id"), "a-decl-pi");
    json_t *lpe = json_object_get(pi, "last_payment_error");
    ck_assert_str_eq(jstr(lpe, "code"), "card_declined");
    ck_assert_str_eq(jstr(lpe, "decline_code"), "generic_decline");
    /* The replay says the same. */
    struct http_answer b =
        charge("k-decl-pi", "a-decl-pi", 4321, "pm_card_chargeDeclined");
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_str_eq(b.body, a.body);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(unknown_intent_is_404_resource_missing)
{
    struct http_answer a = retrieve_on(&sim, "pi_nope");
    ck_assert_int_eq(a.status, 404);
    ck_assert_str_eq(err_field(a.json, "type"), "invalid_request_error");
    ck_assert_str_eq(err_field(a.json, "code"), "resource_missing");
    ck_assert_str_eq(err_field(a.json, "param"), "intent");
    ck_assert_str_eq(err_field(a.json, "message"), "No such payment_intent: 'pi_nope'");
    /* The id comes from the URL: bytes that are no printable ASCII are shown
     * as '?', so the answer stays JSON. */
    struct http_answer b = retrieve_on(&sim, "pi_%FF%22x");
    ck_assert_int_eq(b.status, 404);
    ck_assert_ptr_nonnull(b.json);
    ck_assert_str_eq(err_field(b.json, "message"), "No such payment_intent: 'pi_?\"x'");
    answer_free(&a);
    answer_free(&b);
}
END_TEST

START_TEST(port_zero_binds_free_ports_it_prints)
{
    /* The fixture ran psp-sim with --port 0 --admin-port 0 and read the
     * ports from its first stdout line; a second one gets other ports. */
    struct psp_sim_process other = {0};
    psp_sim_start(&other, NULL);
    ck_assert_int_gt(sim.port, 0);
    ck_assert_int_gt(sim.admin_port, 0);
    ck_assert_int_ne(sim.port, sim.admin_port);
    ck_assert_int_ne(other.port, sim.port);
    ck_assert_int_ne(other.admin_port, sim.admin_port);
    struct http_answer a = charge("k-port0", "a1", 100, "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    struct http_answer b = request_to(other.base_url, "POST", "/v1/payment_intents",
                                      "k-port0", FORM_BASE, NULL, NULL, 5000);
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    ck_assert_uint_eq(psp_sim_charges(&other), 1);
    psp_sim_stop(&other);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

/* POST /v1/payment_intents/<id>/cancel with this form body ("" for none). */
static struct http_answer cancel_for(const char *key, const char *id, const char *body,
                                     long timeout_ms)
{
    char path[160];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s/cancel", id);
    return request("POST", path, key, body, NULL, timeout_ms);
}

static struct http_answer cancel(const char *key, const char *id, const char *body)
{
    return cancel_for(key, id, body, 5000);
}

/* The ledger's executed cancels: how many, and how many with this key. */
static size_t ledger_cancels(const char *key)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL), *c;
    size_t i, n = 0;
    json_array_foreach(json_object_get(l, "cancels"), i, c)
    {
        if (!key || !strcmp(jstr(c, "idempotency_key"), key))
            n++;
    }
    json_decref(l);
    return n;
}

/* A processing intent's id, charged with this key. */
static void processing_intent(const char *key, char *id, size_t len)
{
    struct http_answer a = charge(key, key, 900, "pm_card_processing");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "status"), "processing");
    snprintf(id, len, "%s", jstr(a.json, "id"));
    answer_free(&a);
}

START_TEST(cancel_processing_intent_replays_with_one_ledger_cancel)
{
    char id[64];
    processing_intent("k-c-charge", id, sizeof(id));
    const char *reason = "cancellation_reason=requested_by_customer";
    struct http_answer a = cancel("k-c-ok", id, reason);
    ck_assert_int_eq(a.status, 200);
    ck_assert_int_eq(a.replayed, 0);
    ck_assert_str_eq(jstr(a.json, "id"), id);
    ck_assert_str_eq(jstr(a.json, "status"), "canceled");
    ck_assert_str_eq(jstr(a.json, "cancellation_reason"), "requested_by_customer");
    ck_assert(json_is_integer(json_object_get(a.json, "canceled_at")));
    struct http_answer r = retrieve_on(&sim, id);
    ck_assert_str_eq(jstr(r.json, "status"), "canceled");

    /* The same key and parameters: the first answer, replayed. */
    struct http_answer b = cancel("k-c-ok", id, reason);
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_str_eq(b.body, a.body);

    /* One cancel in the ledger; the charge keeps its one row, now canceled,
     * and the charges' counters still count charges only. */
    ck_assert_uint_eq(ledger_cancels(NULL), 1);
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_t *c = json_array_get(json_object_get(l, "cancels"), 0);
    ck_assert_str_eq(jstr(c, "idempotency_key"), "k-c-ok");
    ck_assert_str_eq(jstr(c, "payment_intent_id"), id);
    ck_assert_str_eq(jstr(c, "cancellation_reason"), "requested_by_customer");
    ck_assert_str_eq(jstr(c, "previous_status"), "processing");
    ck_assert_int_eq(jint(c, "http_status"), 200);
    json_decref(l);
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    json_t *row = ledger_row(&sim, id);
    ck_assert_str_eq(jstr(row, "outcome"), "canceled");
    ck_assert(json_is_integer(json_object_get(row, "settled_at_ms")));
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&sim, "cancels"), 1);
    ck_assert_int_eq(ledger_counter(&sim, "executed"), 1);
    ck_assert_int_eq(ledger_counter(&sim, "canceled"), 1);
    ck_assert_int_eq(ledger_counter(&sim, "processing"), 0);
    ck_assert_int_eq(ledger_counter(&sim, "replayed"), 1);
    answer_free(&a);
    answer_free(&r);
    answer_free(&b);
}
END_TEST

START_TEST(cancel_declined_intent_without_reason)
{
    struct http_answer d =
        charge("k-c-decl", "a-c-decl", 100, "pm_card_chargeDeclined");
    ck_assert_int_eq(d.status, 402);
    char id[64];
    snprintf(id, sizeof(id), "%s",
             jstr(json_object_get(json_object_get(d.json, "error"), "payment_intent"),
                  "id"));
    struct http_answer a = cancel("k-c-decl-cancel", id, "");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "status"), "canceled");
    ck_assert(json_is_null(json_object_get(a.json, "cancellation_reason")));
    json_t *row = ledger_row(&sim, id);
    ck_assert_str_eq(jstr(row, "outcome"), "canceled");
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&sim, "declined"), 0);
    ck_assert_int_eq(ledger_counter(&sim, "canceled"), 1);
    ck_assert_uint_eq(ledger_cancels("k-c-decl-cancel"), 1);
    answer_free(&d);
    answer_free(&a);
}
END_TEST

START_TEST(cancel_refusals_execute_nothing_and_are_not_stored)
{
    /* Succeeded: Stripe's 400 payment_intent_unexpected_state, with the
     * intent. */
    struct http_answer v = charge("k-c-visa", "a-c-visa", 100, "pm_card_visa");
    struct http_answer a = cancel("k-c-succeeded", jstr(v.json, "id"), "");
    ck_assert_int_eq(a.status, 400);
    ck_assert_str_eq(err_field(a.json, "type"), "invalid_request_error");
    ck_assert_str_eq(err_field(a.json, "code"), "payment_intent_unexpected_state");
    json_t *pi = json_object_get(json_object_get(a.json, "error"), "payment_intent");
    ck_assert_str_eq(jstr(pi, "status"), "succeeded");

    /* Canceled already: the same. */
    char id[64];
    processing_intent("k-c-twice-charge", id, sizeof(id));
    struct http_answer first = cancel("k-c-twice-1", id, "");
    ck_assert_int_eq(first.status, 200);
    struct http_answer again = cancel("k-c-twice-2", id, "");
    ck_assert_int_eq(again.status, 400);
    ck_assert_str_eq(err_field(again.json, "code"), "payment_intent_unexpected_state");

    /* Unknown intent: 404 resource_missing. */
    struct http_answer m = cancel("k-c-missing", "pi_nope", "");
    ck_assert_int_eq(m.status, 404);
    ck_assert_str_eq(err_field(m.json, "code"), "resource_missing");
    ck_assert_str_eq(err_field(m.json, "message"), "No such payment_intent: 'pi_nope'");

    /* Parameters Stripe refuses. */
    char other[64];
    processing_intent("k-c-params-charge", other, sizeof(other));
    struct http_answer bad = cancel("k-c-params", other, "cancellation_reason=bored");
    ck_assert_int_eq(bad.status, 400);
    ck_assert_str_eq(err_field(bad.json, "param"), "cancellation_reason");
    struct http_answer unknown = cancel("k-c-params", other, "amount=1");
    ck_assert_int_eq(unknown.status, 400);
    ck_assert_str_eq(err_field(unknown.json, "code"), "parameter_unknown");
    ck_assert_str_eq(err_field(unknown.json, "param"), "amount");

    ck_assert_uint_eq(ledger_cancels(NULL), 1);
    struct http_answer still = retrieve_on(&sim, other);
    ck_assert_str_eq(jstr(still.json, "status"), "processing");
    /* None was stored under its key: each key executes now. */
    struct http_answer ok =
        cancel("k-c-params", other, "cancellation_reason=abandoned");
    ck_assert_int_eq(ok.status, 200);
    ck_assert_int_eq(ok.replayed, 0);
    char third[64];
    processing_intent("k-c-after-404-charge", third, sizeof(third));
    struct http_answer ok404 = cancel("k-c-missing", third, "");
    ck_assert_int_eq(ok404.status, 200);
    ck_assert_int_eq(ok404.replayed, 0);
    ck_assert_uint_eq(ledger_cancels(NULL), 3);
    answer_free(&v);
    answer_free(&a);
    answer_free(&first);
    answer_free(&again);
    answer_free(&m);
    answer_free(&bad);
    answer_free(&unknown);
    answer_free(&still);
    answer_free(&ok);
    answer_free(&ok404);
}
END_TEST

/* A key belongs to the endpoint it was first used on: a charge's key on a
 * cancel, a cancel's on a charge or on another intent's cancel is 400
 * idempotency_error and executes nothing. */
START_TEST(cancel_and_charge_never_share_a_key)
{
    char id[64], id2[64];
    processing_intent("k-shared", id, sizeof(id));
    processing_intent("k-shared-2", id2, sizeof(id2));
    struct http_answer a = cancel("k-shared", id, "");
    ck_assert_int_eq(a.status, 400);
    ck_assert_str_eq(err_field(a.json, "type"), "idempotency_error");
    struct http_answer still = retrieve_on(&sim, id);
    ck_assert_str_eq(jstr(still.json, "status"), "processing");

    struct http_answer c = cancel("k-c-key", id, "");
    ck_assert_int_eq(c.status, 200);
    struct http_answer ch = charge("k-c-key", "a-c-key", 100, "pm_card_visa");
    ck_assert_int_eq(ch.status, 400);
    ck_assert_str_eq(err_field(ch.json, "type"), "idempotency_error");
    struct http_answer other = cancel("k-c-key", id2, "");
    ck_assert_int_eq(other.status, 400);
    ck_assert_str_eq(err_field(other.json, "type"), "idempotency_error");
    struct http_answer params = cancel("k-c-key", id, "cancellation_reason=duplicate");
    ck_assert_int_eq(params.status, 400);
    ck_assert_str_eq(err_field(params.json, "type"), "idempotency_error");

    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-c-key"), 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 2);
    ck_assert_uint_eq(ledger_cancels(NULL), 1);
    struct http_answer still2 = retrieve_on(&sim, id2);
    ck_assert_str_eq(jstr(still2.json, "status"), "processing");
    ck_assert_int_eq(ledger_counter(&sim, "idempotency_error"), 4);
    answer_free(&a);
    answer_free(&still);
    answer_free(&c);
    answer_free(&ch);
    answer_free(&other);
    answer_free(&params);
    answer_free(&still2);
}
END_TEST

/* While the first cancel with a key executes, another with it is 409. The
 * first is held for a day (latency), after the client gave up on it, so the
 * key is in use for certain when the second comes. */
START_TEST(cancel_in_flight_is_409)
{
    char id[64];
    processing_intent("k-c-409-charge", id, sizeof(id));
    long long before = ledger_counter(&sim, "requests");
    set_faults("{\"latency_ms\": 86400000}");
    struct http_answer a = cancel_for("k-c-409", id, "", 300);
    ck_assert_int_eq(a.cc, CURLE_OPERATION_TIMEDOUT);
    /* psp-sim counts the request where it reserves the key. */
    long long deadline = test_env_now_ms() + 10000;
    while (ledger_counter(&sim, "requests") == before) {
        ck_assert_msg(test_env_now_ms() < deadline, "the first cancel never arrived");
        pause_ms(10);
    }
    struct http_answer b = cancel("k-c-409", id, "");
    ck_assert_int_eq(b.status, 409);
    ck_assert_str_eq(err_field(b.json, "code"), "idempotency_key_in_use");
    ck_assert_uint_eq(ledger_cancels(NULL), 0);
    struct http_answer still = retrieve_on(&sim, id);
    ck_assert_str_eq(jstr(still.json, "status"), "processing");
    answer_free(&a);
    answer_free(&b);
    answer_free(&still);
}
END_TEST

/* The faults of charges: a lost answer after executing, and a 500 before. */
START_TEST(cancel_faults_lose_the_answer_or_execute_nothing)
{
    char id[64], id2[64];
    processing_intent("k-c-drop-charge", id, sizeof(id));
    processing_intent("k-c-eb-charge", id2, sizeof(id2));
    set_faults("{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"k-c-drop\",\"times\":1},"
               "{\"kind\":\"error_before\",\"key\":\"k-c-eb\",\"times\":1}]}");
    struct http_answer a = cancel("k-c-drop", id, "");
    ck_assert_int_eq(a.status, 0);
    ck_assert_int_eq(a.cc, CURLE_GOT_NOTHING);
    ck_assert_uint_eq(ledger_cancels("k-c-drop"), 1);
    struct http_answer b = cancel("k-c-drop", id, "");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_str_eq(jstr(b.json, "status"), "canceled");
    ck_assert_uint_eq(ledger_cancels("k-c-drop"), 1);

    struct http_answer c = cancel("k-c-eb", id2, "");
    ck_assert_int_eq(c.status, 500);
    ck_assert_uint_eq(ledger_cancels("k-c-eb"), 0);
    struct http_answer d = cancel("k-c-eb", id2, "");
    ck_assert_int_eq(d.status, 200);
    ck_assert_int_eq(d.replayed, 0);
    ck_assert_uint_eq(ledger_cancels(NULL), 2);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
    answer_free(&d);
}
END_TEST

/* Runs psp-sim with args (NULL-terminated) until it exits, within 5 s.
 * env_key: PSP_SIM_API_KEY for it (NULL: unset). Returns the exit status;
 * err gets its stderr. */
static int run_psp_sim(const char *const *args, const char *env_key, char *err,
                       size_t errlen)
{
    const char *argv[16];
    int n = 0, fds[2], st;
    size_t len = 0;

    argv[n++] = PSP_SIM_PATH;
    for (int i = 0; args[i] && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    ck_assert_int_eq(pipe(fds), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, STDOUT_FILENO);
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        close(fds[1]);
        unsetenv("PSP_SIM_WEBHOOK_SECRET"); /* only what args say */
        if (env_key)
            setenv("PSP_SIM_API_KEY", env_key, 1);
        else
            unsetenv("PSP_SIM_API_KEY");
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    long long deadline = test_env_now_ms() + 5000;
    while (len < errlen - 1) {
        long long left = deadline - test_env_now_ms();
        struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
        int pr = left > 0 ? poll(&pfd, 1, (int)left) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            close(fds[0]);
            ck_abort_msg("psp-sim %s %s did not exit in 5 s", args[0],
                         args[1] ? args[1] : "");
        }
        ssize_t got = read(fds[0], err + len, errlen - 1 - len);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        len += (size_t)got;
    }
    err[len] = '\0';
    close(fds[0]);
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Exit 2 and one line on stderr, "psp-sim: <name>" then ':' or ' '. */
static void expect_refused(const char *const *args, const char *env_key,
                           const char *name)
{
    char err[1024], want[64];
    int rc = run_psp_sim(args, env_key, err, sizeof(err));
    size_t n = strlen(err);
    snprintf(want, sizeof(want), "psp-sim: %s", name);
    ck_assert_msg(rc == 2, "psp-sim %s %s: exit %d, want 2 (%s)", args[0],
                  args[1] ? args[1] : "", rc, err);
    ck_assert_msg(n > 0 && err[n - 1] == '\n' && !memchr(err, '\n', n - 1),
                  "psp-sim %s: want one line on stderr, got '%s'", args[0], err);
    ck_assert_msg(!strncmp(err, want, strlen(want)) &&
                      (err[strlen(want)] == ':' || err[strlen(want)] == ' '),
                  "psp-sim %s %s: '%s' does not start with '%s'", args[0],
                  args[1] ? args[1] : "", err, want);
}

START_TEST(each_bad_flag_value_is_reported_under_its_own_name)
{
    static const char *const bad[][2] = {
        {"--port", "65536"},
        {"--port", "-1"},
        {"--admin-port", "x"},
        {"--admin-port", "70000"},
        {"--key-retention-ms", "-1"},
        {"--threads", "0"},
        {"--threads", "many"},
        {"--max-connections", "0"},
        {"--max-connections", "10000001"},
        {"--seed", "-3"},
        {"--seed", "1x"},
        {"--latency-ms", "-1"},
        {"--latency-jitter-ms", ""},
        {"--stall-ms", "86400001"},
        {"--search-lag-ms", "-1"},
        {"--processing-settle-ms", "86400001"},
        {"--host", "example.com"},
        {"--fault", "explode=1"},
        {"--fault", "drop_after=1.5"},
        {"--api-key", ""},
        {"--webhook-url", "http://127.0.0.1:9/no-secret"},
        {"--webhook-secret", ""},
        {"--webhook-duplicate-rate", "1.5"},
        {"--webhook-duplicate-rate", "x"},
        {"--webhook-reorder-rate", "-0.1"},
        {"--webhook-reorder-rate", "nan"},
        {"--webhook-retry-ms", "0"},
        {"--webhook-retry-max-ms", "86400001"},
        {"--webhook-timeout-ms", "0"},
        {"--webhook-queue-max", "0"},
    };
    static const char *const need_values[] = {
        "--host",
        "--port",
        "--admin-port",
        "--api-key",
        "--key-retention-ms",
        "--threads",
        "--max-connections",
        "--seed",
        "--latency-ms",
        "--latency-jitter-ms",
        "--stall-ms",
        "--search-lag-ms",
        "--processing-settle-ms",
        "--fault",
        "--webhook-url",
        "--webhook-secret",
        "--webhook-duplicate-rate",
        "--webhook-reorder-rate",
        "--webhook-retry-ms",
        "--webhook-retry-max-ms",
        "--webhook-timeout-ms",
        "--webhook-queue-max",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        const char *args[] = {bad[i][0], bad[i][1], NULL};
        expect_refused(args, NULL, bad[i][0]);
    }
    /* A flag at the end without its value names itself too. */
    for (size_t i = 0; i < sizeof(need_values) / sizeof(need_values[0]); i++) {
        const char *args[] = {need_values[i], NULL};
        expect_refused(args, NULL, need_values[i]);
    }
    const char *bogus[] = {"--bogus", NULL};
    expect_refused(bogus, NULL, "bad option '--bogus'");
    const char *none[] = {NULL};
    expect_refused(none, "", "PSP_SIM_API_KEY");
    /* With a secret, the URL itself is checked. */
    const char *ftp[] = {"--webhook-secret", "s", "--webhook-url", "ftp://x", NULL};
    expect_refused(ftp, NULL, "--webhook-url");
}
END_TEST

/* ---- refunds ---- */

static struct http_answer refund_req(const char *key, const char *pi, long amount,
                                     const char *refund_id)
{
    char body[512], am[48] = "";
    if (amount > 0)
        snprintf(am, sizeof(am), "&amount=%ld", amount);
    snprintf(body, sizeof(body),
             "payment_intent=%s%s&reason=requested_by_customer"
             "&metadata%%5Brefund_id%%5D=%s&metadata%%5Bpayment_attempt_id%%5D=a-%s",
             pi, am, refund_id, refund_id);
    return request("POST", "/v1/refunds", key, body, NULL, 5000);
}

/* A succeeded intent of amount charged with pm; its id in id. */
static void charged_intent(const char *key, long amount, const char *pm, char *id,
                           size_t len)
{
    struct http_answer c = charge(key, key, amount, pm);
    ck_assert_int_eq(c.status, 200);
    snprintf(id, len, "%s", jstr(c.json, "id"));
    answer_free(&c);
}

static long long refund_executions(const char *key)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    long long n = json_integer_value(
        json_object_get(json_object_get(l, "refund_executions"), key));
    json_decref(l);
    return n;
}

START_TEST(refund_replays_refuses_mismatch_and_over_refunds)
{
    char pi[64], re[64];
    charged_intent("k-rf-c", 1000, "pm_card_visa", pi, sizeof(pi));
    struct http_answer a = refund_req("k-rf-1", pi, 300, "r1");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "object"), "refund");
    ck_assert_str_eq(jstr(a.json, "status"), "succeeded");
    ck_assert_str_eq(jstr(a.json, "payment_intent"), pi);
    ck_assert_str_eq(jstr(json_object_get(a.json, "metadata"), "refund_id"), "r1");
    ck_assert_int_eq(jint(a.json, "amount"), 300);
    snprintf(re, sizeof(re), "%s", jstr(a.json, "id"));
    ck_assert(!strncmp(re, "re_", 3));
    struct http_answer b = refund_req("k-rf-1", pi, 300, "r1");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_str_eq(jstr(b.json, "id"), re);
    struct http_answer m = refund_req("k-rf-1", pi, 301, "r1");
    ck_assert_int_eq(m.status, 400);
    ck_assert_str_eq(err_field(m.json, "type"), "idempotency_error");
    ck_assert_int_eq(refund_executions("k-rf-1"), 1);
    /* 700 left: 701 is too much, nothing executed; the rest (no amount) is
     * 700; then nothing is left. */
    struct http_answer big = refund_req("k-rf-2", pi, 701, "r2");
    ck_assert_int_eq(big.status, 400);
    ck_assert_str_eq(err_field(big.json, "type"), "invalid_request_error");
    ck_assert_str_eq(err_field(big.json, "code"), "amount_too_large");
    ck_assert_int_eq(refund_executions("k-rf-2"), 0);
    struct http_answer rest = refund_req("k-rf-3", pi, 0, "r3");
    ck_assert_int_eq(rest.status, 200);
    ck_assert_int_eq(jint(rest.json, "amount"), 700);
    struct http_answer done = refund_req("k-rf-4", pi, 1, "r4");
    ck_assert_int_eq(done.status, 400);
    ck_assert_str_eq(err_field(done.json, "code"), "charge_already_refunded");
    /* A refusal is not stored under its key: the same key may refund once
     * there is something to refund. */
    struct http_answer unknown = refund_req("k-rf-5", "pi_nosuch", 1, "r5");
    ck_assert_int_eq(unknown.status, 404);
    ck_assert_str_eq(err_field(unknown.json, "code"), "resource_missing");
    char pp[64];
    charged_intent("k-rf-proc", 100, "pm_card_processing", pp, sizeof(pp));
    struct http_answer np = refund_req("k-rf-6", pp, 10, "r6");
    ck_assert_int_eq(np.status, 400);
    ck_assert_str_eq(err_field(np.json, "code"), "charge_not_refundable");
    struct http_answer *all[] = {&a, &b, &m, &big, &rest, &done, &unknown, &np};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        answer_free(all[i]);
}
END_TEST

START_TEST(refunds_are_retrieved_and_listed_by_intent_and_window)
{
    char pi[64], other[64], ids[3][64], q[256];
    charged_intent("k-rl-c", 1000, "pm_card_visa", pi, sizeof(pi));
    charged_intent("k-rl-o", 1000, "pm_card_visa", other, sizeof(other));
    for (int i = 0; i < 3; i++) {
        char key[32], rid[32];
        snprintf(key, sizeof(key), "k-rl-%d", i);
        snprintf(rid, sizeof(rid), "rl-%d", i);
        struct http_answer a = refund_req(key, pi, 10 + i, rid);
        ck_assert_int_eq(a.status, 200);
        snprintf(ids[i], sizeof(ids[i]), "%s", jstr(a.json, "id"));
        answer_free(&a);
    }
    struct http_answer o = refund_req("k-rl-other", other, 5, "rl-other");
    ck_assert_int_eq(o.status, 200);
    struct http_answer g;
    char path[128];
    snprintf(path, sizeof(path), "/v1/refunds/%s", ids[1]);
    g = request("GET", path, NULL, NULL, NULL, 5000);
    ck_assert_int_eq(g.status, 200);
    ck_assert_int_eq(jint(g.json, "amount"), 11);
    answer_free(&g);
    g = request("GET", "/v1/refunds/re_nosuch", NULL, NULL, NULL, 5000);
    ck_assert_int_eq(g.status, 404);
    ck_assert_str_eq(err_field(g.json, "code"), "resource_missing");
    answer_free(&g);
    /* By intent, newest first, two a page. */
    snprintf(q, sizeof(q), "/v1/refunds?payment_intent=%s&limit=2", pi);
    g = request("GET", q, NULL, NULL, NULL, 5000);
    ck_assert_int_eq(g.status, 200);
    json_t *data = json_object_get(g.json, "data");
    ck_assert_uint_eq(json_array_size(data), 2);
    ck_assert_str_eq(jstr(json_array_get(data, 0), "id"), ids[2]);
    ck_assert_str_eq(jstr(json_array_get(data, 1), "id"), ids[1]);
    ck_assert(json_is_true(json_object_get(g.json, "has_more")));
    answer_free(&g);
    snprintf(q, sizeof(q), "/v1/refunds?payment_intent=%s&limit=2&starting_after=%s",
             pi, ids[1]);
    g = request("GET", q, NULL, NULL, NULL, 5000);
    data = json_object_get(g.json, "data");
    ck_assert_uint_eq(json_array_size(data), 1);
    ck_assert_str_eq(jstr(json_array_get(data, 0), "id"), ids[0]);
    ck_assert(json_is_false(json_object_get(g.json, "has_more")));
    answer_free(&g);
    /* By created window: all four now, none in a window before them. */
    long long created = jint(o.json, "created");
    snprintf(q, sizeof(q), "/v1/refunds?created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld",
             created - 60, created + 60);
    g = request("GET", q, NULL, NULL, NULL, 5000);
    ck_assert_uint_eq(json_array_size(json_object_get(g.json, "data")), 4);
    answer_free(&g);
    snprintf(q, sizeof(q), "/v1/refunds?created%%5Bgte%%5D=%lld&created%%5Blt%%5D=%lld",
             created - 120, created - 60);
    g = request("GET", q, NULL, NULL, NULL, 5000);
    ck_assert_int_eq(g.status, 200);
    ck_assert_uint_eq(json_array_size(json_object_get(g.json, "data")), 0);
    answer_free(&g);
    answer_free(&o);
}
END_TEST

START_TEST(refund_after_execute_fault_executes_once)
{
    char pi[64];
    charged_intent("k-rfa-c", 1000, "pm_card_visa", pi, sizeof(pi));
    set_faults("{\"rules\":[{\"kind\":\"error_after\",\"probability\":1,"
               "\"key\":\"k-rfa\",\"times\":1},{\"kind\":\"drop_after\","
               "\"probability\":1,\"key\":\"k-rfd\",\"times\":1},"
               "{\"kind\":\"error_before\",\"probability\":1,\"key\":\"k-rfb\","
               "\"times\":1}]}");
    struct http_answer a = refund_req("k-rfa", pi, 100, "rfa");
    ck_assert_int_eq(a.status, 500);
    ck_assert_int_eq(refund_executions("k-rfa"), 1);
    struct http_answer b = refund_req("k-rfa", pi, 100, "rfa");
    ck_assert_int_eq(b.status, 200);
    ck_assert_int_eq(b.replayed, 1);
    ck_assert_int_eq(refund_executions("k-rfa"), 1);
    struct http_answer d = refund_req("k-rfd", pi, 100, "rfd");
    ck_assert_int_ne(d.cc, CURLE_OK);
    ck_assert_int_eq(refund_executions("k-rfd"), 1);
    struct http_answer e = refund_req("k-rfb", pi, 100, "rfb");
    ck_assert_int_eq(e.status, 500);
    ck_assert_int_eq(refund_executions("k-rfb"), 0);
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    ck_assert_uint_eq(json_array_size(json_object_get(l, "refunds")), 2);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(l, "counters"), "refunds")),
        2);
    json_decref(l);
    struct http_answer *all[] = {&a, &b, &d, &e};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        answer_free(all[i]);
}
END_TEST

START_TEST(refunds_end_pending_or_failed_by_payment_method)
{
    char pi[64], pf[64], ff[64], path[160];
    charged_intent("k-rp-c", 500, "pm_card_refundPending", pi, sizeof(pi));
    charged_intent("k-rpf-c", 500, "pm_card_refundPendingFail", pf, sizeof(pf));
    charged_intent("k-rff-c", 500, "pm_card_refundFail", ff, sizeof(ff));
    struct http_answer p = refund_req("k-rp", pi, 500, "rp");
    ck_assert_str_eq(jstr(p.json, "status"), "pending");
    /* Pending counts against what is left. */
    struct http_answer p2 = refund_req("k-rp2", pi, 1, "rp2");
    ck_assert_str_eq(err_field(p2.json, "code"), "charge_already_refunded");
    struct http_answer f = refund_req("k-rff", ff, 500, "rff");
    ck_assert_str_eq(jstr(f.json, "status"), "failed");
    ck_assert_str_eq(jstr(f.json, "failure_reason"), "lost_or_stolen_card");
    /* A failed one does not. */
    struct http_answer f2 = refund_req("k-rff2", ff, 500, "rff2");
    ck_assert_int_eq(f2.status, 200);
    /* The admin settles a pending one; --refund-settle-ms does it by itself,
     * to the end its payment method says. */
    snprintf(path, sizeof(path), "/refunds/%s/settle", jstr(p.json, "id"));
    json_t *s1 = psp_sim_admin(&sim, "POST", path, "{\"status\":\"succeeded\"}");
    ck_assert_str_eq(jstr(s1, "status"), "succeeded");
    json_decref(s1);
    json_decref(
        psp_sim_admin(&sim, "PUT", "/refund-settle", "{\"refund_settle_ms\": 50}"));
    struct http_answer q = refund_req("k-rpf", pf, 500, "rpf");
    ck_assert_str_eq(jstr(q.json, "status"), "pending");
    snprintf(path, sizeof(path), "/v1/refunds/%s", jstr(q.json, "id"));
    long long deadline = test_env_now_ms() + 5000;
    for (;;) {
        struct http_answer g = request("GET", path, NULL, NULL, NULL, 5000);
        int settled = !strcmp(jstr(g.json, "status"), "failed");
        if (settled)
            ck_assert_str_eq(jstr(g.json, "failure_reason"),
                             "expired_or_canceled_card");
        answer_free(&g);
        if (settled)
            break;
        ck_assert_msg(test_env_now_ms() < deadline, "the pending refund never failed");
        pause_ms(20);
    }
    struct http_answer *all[] = {&p, &p2, &f, &f2, &q};
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        answer_free(all[i]);
}
END_TEST

/* ---- the admin API's injections: states an auditor must catch ---- */

/* One admin request to the suite's psp-sim, whatever it answers. */
static struct http_answer admin_req(const char *method, const char *path,
                                    const char *body, long timeout_ms)
{
    char base[64];
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", sim.admin_port);
    return request_to(base, method, path, NULL, body, NULL, NULL, timeout_ms);
}

static struct http_answer inject(const char *body)
{
    return admin_req("POST", "/inject/intents", body, 5000);
}

static struct http_answer inject_refund(const char *body)
{
    return admin_req("POST", "/inject/refunds", body, 5000);
}

static struct http_answer amend(const char *id, const char *body)
{
    char path[160];
    snprintf(path, sizeof(path), "/intents/%s/amend", id);
    return admin_req("POST", path, body, 5000);
}

static struct http_answer delete_intent(const char *id)
{
    char path[160];
    snprintf(path, sizeof(path), "/intents/%s", id);
    return admin_req("DELETE", path, NULL, 5000);
}

/* The one ledger refund row of this refund (a new reference). */
static json_t *ledger_refund_row(const char *id)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL), *c, *found = NULL;
    size_t i, n = 0;
    json_array_foreach(json_object_get(l, "refunds"), i, c)
    {
        if (!strcmp(jstr(c, "provider_refund_id"), id)) {
            found = c;
            n++;
        }
    }
    ck_assert_msg(n == 1, "refund %s has %zu ledger rows", id, n);
    json_incref(found);
    json_decref(l);
    return found;
}

/* A 4xx of the admin API: its status and, when given, its error's param. */
static void expect_refusal(struct http_answer a, long status, const char *param)
{
    ck_assert_msg(a.status == status, "answered %ld, not %ld: %s", a.status, status,
                  a.body ? a.body : "");
    ck_assert_str_eq(err_field(a.json, "type"), "invalid_request_error");
    ck_assert_msg(*err_field(a.json, "message"), "no message: %s", a.body);
    if (param)
        ck_assert_str_eq(err_field(a.json, "param"), param);
    answer_free(&a);
}

/* The ids of a list page, newest first, and whether more follow. */
static size_t page_ids(const char *path, char ids[][64], size_t max, int *has_more)
{
    struct http_answer a = request("GET", path, NULL, NULL, NULL, 5000);
    ck_assert_msg(a.status == 200, "%s answered %ld: %s", path, a.status, a.body);
    json_t *data = json_object_get(a.json, "data");
    size_t n = json_array_size(data);
    ck_assert_uint_le(n, max);
    for (size_t i = 0; i < n; i++)
        snprintf(ids[i], 64, "%s", jstr(json_array_get(data, i), "id"));
    *has_more = json_is_true(json_object_get(a.json, "has_more"));
    answer_free(&a);
    return n;
}

START_TEST(inject_intents_expands_n_in_id_and_metadata)
{
    struct http_answer a =
        inject("{\"count\":3,\"start\":7,\"id\":\"pi_bulk{n}\",\"amount\":2500,"
               "\"currency\":\"eur\",\"metadata\":{\"payment_attempt_id\":"
               "\"00000000-0000-4000-8000-{n}\",\"order_id\":\"o-{n}-{n}\"}}");
    ck_assert_int_eq(a.status, 201);
    ck_assert_int_eq(jint(a.json, "count"), 3);
    json_t *ids = json_object_get(a.json, "ids");
    ck_assert_uint_eq(json_array_size(ids), 3);
    ck_assert_str_eq(json_string_value(json_array_get(ids, 0)), "pi_bulk000000000007");
    ck_assert_str_eq(json_string_value(json_array_get(ids, 2)), "pi_bulk000000000009");
    answer_free(&a);

    /* A whole intent: retrieve, search and the ledger know it. */
    struct http_answer r = retrieve_on(&sim, "pi_bulk000000000008");
    ck_assert_int_eq(r.status, 200);
    ck_assert_str_eq(jstr(r.json, "object"), "payment_intent");
    ck_assert_str_eq(jstr(r.json, "status"), "succeeded");
    ck_assert_int_eq(jint(r.json, "amount"), 2500);
    ck_assert_str_eq(jstr(r.json, "currency"), "eur");
    ck_assert_str_eq(meta(r.json, "payment_attempt_id"),
                     "00000000-0000-4000-8000-000000000008");
    ck_assert_str_eq(meta(r.json, "order_id"), "o-000000000008-000000000008");
    ck_assert(json_is_null(json_object_get(r.json, "last_payment_error")));
    answer_free(&r);
    struct http_answer s = search_on(&sim, "00000000-0000-4000-8000-000000000009");
    json_t *found = json_object_get(s.json, "data");
    ck_assert_uint_eq(json_array_size(found), 1);
    ck_assert_str_eq(jstr(json_array_get(found, 0), "id"), "pi_bulk000000000009");
    answer_free(&s);
    json_t *row = ledger_row(&sim, "pi_bulk000000000007");
    ck_assert_str_eq(jstr(row, "idempotency_key"), "inject_pi_bulk000000000007");
    ck_assert(json_is_true(json_object_get(row, "injected")));
    ck_assert(json_is_false(json_object_get(row, "amended")));
    ck_assert(json_is_false(json_object_get(row, "deleted")));
    ck_assert_str_eq(jstr(row, "payment_attempt_id"),
                     "00000000-0000-4000-8000-000000000007");
    ck_assert_str_eq(jstr(row, "outcome"), "succeeded");
    ck_assert_int_eq(jint(row, "amount"), 2500);
    json_decref(row);

    /* Its refunds work as any intent's; an ordinary charge says it was not
     * injected. */
    struct http_answer rf = refund_req("k-inj-rf", "pi_bulk000000000007", 500, "inj");
    ck_assert_int_eq(rf.status, 200);
    ck_assert_str_eq(jstr(rf.json, "charge"), "ch_bulk000000000007");
    answer_free(&rf);
    char pi[64];
    charged_intent("k-inj-plain", 100, "pm_card_visa", pi, sizeof(pi));
    row = ledger_row(&sim, pi);
    ck_assert(json_is_false(json_object_get(row, "injected")));
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 4);
    ck_assert_int_eq(ledger_counter(&sim, "executed"), 1);

    /* Every member may be left out: one fresh pi_ id, 1000 usd, succeeded,
     * now. */
    struct http_answer d = inject("{}");
    ck_assert_int_eq(d.status, 201);
    ck_assert_int_eq(jint(d.json, "count"), 1);
    const char *fresh =
        json_string_value(json_array_get(json_object_get(d.json, "ids"), 0));
    ck_assert(fresh && !strncmp(fresh, "pi_", 3));
    r = retrieve_on(&sim, fresh);
    ck_assert_int_eq(r.status, 200);
    ck_assert_int_eq(jint(r.json, "amount"), 1000);
    ck_assert_str_eq(jstr(r.json, "currency"), "usd");
    ck_assert_str_eq(jstr(r.json, "payment_method"), "pm_card_visa");
    ck_assert_int_le(llabs(jint(r.json, "created") - (long long)time(NULL)), 5);
    answer_free(&r);
    answer_free(&d);
}
END_TEST

START_TEST(inject_intents_like_copies_and_members_override)
{
    struct http_answer c =
        create("k-like", "amount=4321&currency=gbp&payment_method=pm_card_mastercard"
                         "&confirm=true&customer=cus_Like1"
                         "&metadata%5Bpayment_attempt_id%5D=a-like"
                         "&metadata%5Border_id%5D=o-like");
    ck_assert_int_eq(c.status, 200);
    char like[64], body[512];
    snprintf(like, sizeof(like), "%s", jstr(c.json, "id"));
    answer_free(&c);

    snprintf(body, sizeof(body), "{\"like\":\"%s\",\"id\":\"pi_copy\"}", like);
    struct http_answer a = inject(body);
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    struct http_answer r = retrieve_on(&sim, "pi_copy");
    ck_assert_int_eq(jint(r.json, "amount"), 4321);
    ck_assert_str_eq(jstr(r.json, "currency"), "gbp");
    ck_assert_str_eq(jstr(r.json, "customer"), "cus_Like1");
    ck_assert_str_eq(jstr(r.json, "payment_method"), "pm_card_mastercard");
    ck_assert_str_eq(meta(r.json, "payment_attempt_id"), "a-like");
    ck_assert_str_eq(meta(r.json, "order_id"), "o-like");
    answer_free(&r);

    /* Given members win; metadata given replaces the copied one whole. */
    snprintf(body, sizeof(body),
             "{\"like\":\"%s\",\"id\":\"pi_declined\",\"amount\":7,"
             "\"currency\":\"eur\",\"status\":\"requires_payment_method\","
             "\"metadata\":{\"payment_attempt_id\":\"a-other\"}}",
             like);
    a = inject(body);
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    r = retrieve_on(&sim, "pi_declined");
    ck_assert_int_eq(jint(r.json, "amount"), 7);
    ck_assert_str_eq(jstr(r.json, "currency"), "eur");
    ck_assert_str_eq(jstr(r.json, "customer"), "cus_Like1");
    ck_assert_str_eq(jstr(r.json, "status"), "requires_payment_method");
    ck_assert_str_eq(
        jstr(json_object_get(r.json, "last_payment_error"), "decline_code"),
        "generic_decline");
    ck_assert_str_eq(meta(r.json, "payment_attempt_id"), "a-other");
    ck_assert(!json_object_get(json_object_get(r.json, "metadata"), "order_id"));
    answer_free(&r);
    json_t *row = ledger_row(&sim, "pi_declined");
    ck_assert_str_eq(jstr(row, "outcome"), "declined");
    ck_assert_str_eq(jstr(row, "customer"), "cus_Like1");
    json_decref(row);

    /* The other statuses: processing settles as any, canceled is done. */
    a = inject("{\"id\":\"pi_inj_proc\",\"status\":\"processing\"}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    a = settle_on(&sim, "pi_inj_proc", "{\"status\":\"succeeded\"}");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "status"), "succeeded");
    answer_free(&a);
    a = inject(
        "{\"id\":\"pi_inj_cancel\",\"status\":\"canceled\",\"created\":1700000000}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    r = retrieve_on(&sim, "pi_inj_cancel");
    ck_assert_str_eq(jstr(r.json, "status"), "canceled");
    ck_assert_int_eq(jint(r.json, "created"), 1700000000);
    ck_assert_int_eq(jint(r.json, "canceled_at"), 1700000000);
    answer_free(&r);
    row = ledger_row(&sim, "pi_inj_cancel");
    ck_assert_str_eq(jstr(row, "outcome"), "canceled");
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 5);
}
END_TEST

START_TEST(inject_intents_refuses_bad_input_and_taken_ids)
{
    expect_refusal(inject("not json"), 400, NULL);
    expect_refusal(inject("[1]"), 400, NULL);
    expect_refusal(inject("{\"colour\":\"red\"}"), 400, NULL);
    expect_refusal(inject("{\"count\":0}"), 400, "count");
    expect_refusal(inject("{\"count\":200001,\"id\":\"pi_x{n}\"}"), 400, "count");
    expect_refusal(inject("{\"count\":\"3\"}"), 400, "count");
    expect_refusal(inject("{\"amount\":0}"), 400, "amount");
    expect_refusal(inject("{\"amount\":1.5}"), 400, "amount");
    expect_refusal(inject("{\"currency\":\"EUR\"}"), 400, "currency");
    expect_refusal(inject("{\"currency\":\"euro\"}"), 400, "currency");
    expect_refusal(inject("{\"metadata\":[\"a\"]}"), 400, "metadata");
    expect_refusal(inject("{\"metadata\":{\"a\":1}}"), 400, "metadata");
    expect_refusal(inject("{\"metadata\":{\"a[b]\":\"c\"}}"), 400, "metadata");
    expect_refusal(inject("{\"status\":\"paid\"}"), 400, "status");
    expect_refusal(inject("{\"id\":\"pi bad\"}"), 400, "id");
    expect_refusal(inject("{\"id\":\"\"}"), 400, "id");
    expect_refusal(inject("{\"id\":\"pi_same\",\"count\":2}"), 400, "id");
    expect_refusal(inject("{\"start\":-1}"), 400, "start");
    expect_refusal(inject("{\"start\":999999999999,\"count\":2,\"id\":\"pi_s{n}\"}"),
                   400, "start");
    expect_refusal(inject("{\"created\":-1}"), 400, "created");
    expect_refusal(inject("{\"like\":7}"), 400, "like");
    expect_refusal(inject("{\"like\":\"pi_nosuch\"}"), 404, "like");
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 0);

    /* A taken id is 409, and nothing of the batch is made. */
    struct http_answer a = inject("{\"count\":2,\"id\":\"pi_dup{n}\"}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    a = inject("{\"count\":3,\"start\":1,\"id\":\"pi_dup{n}\"}");
    ck_assert_int_eq(a.status, 409);
    ck_assert_str_eq(err_field(a.json, "code"), "resource_already_exists");
    ck_assert_str_eq(err_field(a.json, "param"), "id");
    answer_free(&a);
    struct http_answer r = retrieve_on(&sim, "pi_dup000000000002");
    ck_assert_int_eq(r.status, 404);
    answer_free(&r);
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 2);
    ck_assert_uint_eq(psp_sim_charges(&sim), 2);
}
END_TEST

START_TEST(amend_changes_intent_list_and_ledger)
{
    struct http_answer a = inject("{\"id\":\"pi_amend\",\"amount\":1000}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    a = amend("pi_amend", "{\"amount\":1234}");
    ck_assert_int_eq(a.status, 200);
    ck_assert_str_eq(jstr(a.json, "id"), "pi_amend");
    ck_assert_int_eq(jint(a.json, "amount"), 1234);
    ck_assert_str_eq(jstr(a.json, "currency"), "usd");
    answer_free(&a);
    a = amend("pi_amend", "{\"currency\":\"eur\"}");
    ck_assert_int_eq(a.status, 200);
    ck_assert_int_eq(jint(a.json, "amount"), 1234);
    ck_assert_str_eq(jstr(a.json, "currency"), "eur");
    answer_free(&a);

    struct http_answer r = retrieve_on(&sim, "pi_amend");
    ck_assert_int_eq(jint(r.json, "amount"), 1234);
    ck_assert_str_eq(jstr(r.json, "currency"), "eur");
    answer_free(&r);
    r = list_page("limit=1");
    json_t *pi = json_array_get(json_object_get(r.json, "data"), 0);
    ck_assert_str_eq(jstr(pi, "id"), "pi_amend");
    ck_assert_int_eq(jint(pi, "amount"), 1234);
    ck_assert_str_eq(jstr(pi, "currency"), "eur");
    answer_free(&r);
    json_t *row = ledger_row(&sim, "pi_amend");
    ck_assert_int_eq(jint(row, "amount"), 1234);
    ck_assert_str_eq(jstr(row, "currency"), "eur");
    ck_assert(json_is_true(json_object_get(row, "amended")));
    json_decref(row);

    /* An ordinary charge can be amended too; what is left to refund follows
     * the new amount. */
    char plain[64];
    charged_intent("k-amend-plain", 500, "pm_card_visa", plain, sizeof(plain));
    a = amend(plain, "{\"amount\":50,\"currency\":\"usd\"}");
    ck_assert_int_eq(a.status, 200);
    answer_free(&a);
    struct http_answer big = refund_req("k-amend-rf", plain, 51, "amend");
    ck_assert_int_eq(big.status, 400);
    ck_assert_str_eq(err_field(big.json, "code"), "amount_too_large");
    answer_free(&big);

    expect_refusal(amend("pi_nosuch", "{\"amount\":1}"), 404, NULL);
    expect_refusal(amend("pi_amend", "{}"), 400, NULL);
    expect_refusal(amend("pi_amend", "nope"), 400, NULL);
    expect_refusal(amend("pi_amend", "{\"amount\":0}"), 400, "amount");
    expect_refusal(amend("pi_amend", "{\"currency\":\"EUR\"}"), 400, "currency");
    expect_refusal(amend("pi_amend", "{\"status\":\"canceled\"}"), 400, NULL);
    r = retrieve_on(&sim, "pi_amend");
    ck_assert_int_eq(jint(r.json, "amount"), 1234);
    answer_free(&r);
}
END_TEST

START_TEST(deleted_intent_is_gone_but_its_cursor_keeps_its_place)
{
    char ids[8][64], path[256];
    int more;
    /* Same created: newest first is the last made first. */
    struct http_answer a = inject("{\"count\":5,\"id\":\"pi_del{n}\",\"metadata\":{"
                                  "\"payment_attempt_id\":\"a-del{n}\"}}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    ck_assert_uint_eq(page_ids("/v1/payment_intents?limit=2", ids, 8, &more), 2);
    ck_assert_str_eq(ids[0], "pi_del000000000004");
    ck_assert_str_eq(ids[1], "pi_del000000000003");
    ck_assert(more);

    /* The client holds pi_del...3 as its cursor; the provider drops it. */
    a = delete_intent("pi_del000000000003");
    ck_assert_int_eq(a.status, 200);
    ck_assert(json_is_true(json_object_get(a.json, "deleted")));
    ck_assert_str_eq(jstr(a.json, "id"), "pi_del000000000003");
    answer_free(&a);
    snprintf(path, sizeof(path),
             "/v1/payment_intents?limit=2&starting_after=pi_del000000000003");
    ck_assert_uint_eq(page_ids(path, ids, 8, &more), 2);
    ck_assert_str_eq(ids[0], "pi_del000000000002");
    ck_assert_str_eq(ids[1], "pi_del000000000001");
    ck_assert(more);
    a = delete_intent("pi_del000000000001");
    answer_free(&a);
    snprintf(path, sizeof(path),
             "/v1/payment_intents?limit=2&starting_after=pi_del000000000001");
    ck_assert_uint_eq(page_ids(path, ids, 8, &more), 1);
    ck_assert_str_eq(ids[0], "pi_del000000000000");
    ck_assert(!more);
    ck_assert_uint_eq(page_ids("/v1/payment_intents?limit=100", ids, 8, &more), 3);
    ck_assert_str_eq(ids[0], "pi_del000000000004");
    ck_assert_str_eq(ids[1], "pi_del000000000002");
    ck_assert_str_eq(ids[2], "pi_del000000000000");

    /* Retrieve, search, refunds and the admin calls: as an unknown id. */
    struct http_answer r = retrieve_on(&sim, "pi_del000000000003");
    ck_assert_int_eq(r.status, 404);
    ck_assert_str_eq(err_field(r.json, "code"), "resource_missing");
    answer_free(&r);
    r = search_on(&sim, "a-del000000000003");
    ck_assert_uint_eq(json_array_size(json_object_get(r.json, "data")), 0);
    answer_free(&r);
    r = refund_req("k-del-rf", "pi_del000000000003", 10, "del");
    ck_assert_int_eq(r.status, 404);
    answer_free(&r);
    /* Its refunds' list is no list at all, as a never-made intent's. */
    const char *gone[] = {"pi_del000000000003", "pi_nosuch"};
    for (size_t i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "/v1/refunds?payment_intent=%s&limit=10", gone[i]);
        r = request("GET", path, NULL, NULL, NULL, 5000);
        ck_assert_int_eq(r.status, 404);
        ck_assert_str_eq(err_field(r.json, "code"), "resource_missing");
        ck_assert_str_eq(err_field(r.json, "param"), "payment_intent");
        answer_free(&r);
    }
    expect_refusal(inject_refund("{\"payment_intent\":\"pi_del000000000003\"}"), 404,
                   "payment_intent");
    expect_refusal(amend("pi_del000000000003", "{\"amount\":1}"), 404, NULL);
    expect_refusal(delete_intent("pi_del000000000003"), 404, NULL);
    expect_refusal(delete_intent("pi_nosuch"), 404, NULL);
    /* Its id stays taken. */
    expect_refusal(inject("{\"id\":\"pi_del000000000003\"}"), 409, "id");

    /* The ledger keeps its row, marked. */
    json_t *row = ledger_row(&sim, "pi_del000000000003");
    ck_assert(json_is_true(json_object_get(row, "deleted")));
    json_decref(row);
    row = ledger_row(&sim, "pi_del000000000002");
    ck_assert(json_is_false(json_object_get(row, "deleted")));
    json_decref(row);
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 3);
    ck_assert_uint_eq(psp_sim_charges(&sim), 5);
}
END_TEST

START_TEST(inject_refund_over_the_amount_is_listed_and_booked)
{
    char pi[64], path[256], ids[8][64], re[64], old[64];
    int more;
    charged_intent("k-injrf", 1000, "pm_card_visa", pi, sizeof(pi));
    struct http_answer plain = refund_req("k-injrf-plain", pi, 1000, "plain");
    ck_assert_int_eq(plain.status, 200);

    /* Fully refunded already: out of band, 1500 more. */
    char body[512];
    snprintf(body, sizeof(body),
             "{\"payment_intent\":\"%s\",\"amount\":1500,"
             "\"metadata\":{\"why\":\"dashboard\"}}",
             pi);
    struct http_answer a = inject_refund(body);
    ck_assert_int_eq(a.status, 201);
    ck_assert_str_eq(jstr(a.json, "object"), "refund");
    ck_assert_str_eq(jstr(a.json, "status"), "succeeded");
    ck_assert_str_eq(jstr(a.json, "payment_intent"), pi);
    ck_assert_str_eq(jstr(a.json, "currency"), "eur");
    ck_assert_int_eq(jint(a.json, "amount"), 1500);
    ck_assert_str_eq(jstr(json_object_get(a.json, "metadata"), "why"), "dashboard");
    snprintf(re, sizeof(re), "%s", jstr(a.json, "id"));
    ck_assert(!strncmp(re, "re_", 3));
    answer_free(&a);

    snprintf(path, sizeof(path), "/v1/refunds/%s", re);
    struct http_answer g = request("GET", path, NULL, NULL, NULL, 5000);
    ck_assert_int_eq(g.status, 200);
    ck_assert_int_eq(jint(g.json, "amount"), 1500);
    answer_free(&g);
    snprintf(path, sizeof(path), "/v1/refunds?payment_intent=%s&limit=10", pi);
    ck_assert_uint_eq(page_ids(path, ids, 8, &more), 2);
    ck_assert_str_eq(ids[0], re);
    ck_assert_str_eq(ids[1], jstr(plain.json, "id"));
    json_t *row = ledger_refund_row(re);
    ck_assert(json_is_true(json_object_get(row, "injected")));
    ck_assert_int_eq(jint(row, "amount"), 1500);
    ck_assert_str_eq(jstr(row, "payment_intent_id"), pi);
    ck_assert_str_eq(jstr(row, "status"), "succeeded");
    json_decref(row);
    row = ledger_refund_row(jstr(plain.json, "id"));
    ck_assert(json_is_false(json_object_get(row, "injected")));
    json_decref(row);

    /* Pending and failed ones, and one created long ago, which the list of
     * all refunds (no payment_intent) shows last. */
    snprintf(body, sizeof(body), "{\"payment_intent\":\"%s\",\"status\":\"pending\"}",
             pi);
    a = inject_refund(body);
    ck_assert_int_eq(a.status, 201);
    ck_assert_str_eq(jstr(a.json, "status"), "pending");
    ck_assert_int_eq(jint(a.json, "amount"), 1000);
    snprintf(path, sizeof(path), "/refunds/%s/settle", jstr(a.json, "id"));
    json_t *s = psp_sim_admin(&sim, "POST", path, "{\"status\":\"succeeded\"}");
    ck_assert_str_eq(jstr(s, "status"), "succeeded");
    json_decref(s);
    answer_free(&a);
    snprintf(body, sizeof(body),
             "{\"payment_intent\":\"%s\",\"status\":\"failed\",\"amount\":5,"
             "\"created\":1600000000}",
             pi);
    a = inject_refund(body);
    ck_assert_int_eq(a.status, 201);
    ck_assert_str_eq(jstr(a.json, "status"), "failed");
    ck_assert(*jstr(a.json, "failure_reason"));
    snprintf(old, sizeof(old), "%s", jstr(a.json, "id"));
    answer_free(&a);
    ck_assert_uint_eq(page_ids("/v1/refunds?limit=100", ids, 8, &more), 4);
    ck_assert_str_eq(ids[3], old);
    ck_assert(!more);
    ck_assert_uint_eq(page_ids("/v1/refunds?created%5Blt%5D=1600000001", ids, 8, &more),
                      1);
    ck_assert_str_eq(ids[0], old);
    ck_assert_int_eq(ledger_counter(&sim, "refund_objects"), 4);
    ck_assert_int_eq(ledger_counter(&sim, "refunds"), 1);

    expect_refusal(inject_refund("{}"), 400, "payment_intent");
    expect_refusal(inject_refund("nope"), 400, NULL);
    expect_refusal(inject_refund("{\"payment_intent\":\"pi_nosuch\"}"), 404,
                   "payment_intent");
    snprintf(body, sizeof(body), "{\"payment_intent\":\"%s\",\"amount\":0}", pi);
    expect_refusal(inject_refund(body), 400, "amount");
    snprintf(body, sizeof(body), "{\"payment_intent\":\"%s\",\"status\":\"lost\"}", pi);
    expect_refusal(inject_refund(body), 400, "status");
    snprintf(body, sizeof(body), "{\"payment_intent\":\"%s\",\"metadata\":{\"a\":2}}",
             pi);
    expect_refusal(inject_refund(body), 400, "metadata");
    snprintf(body, sizeof(body), "{\"payment_intent\":\"%s\",\"reason\":\"x\"}", pi);
    expect_refusal(inject_refund(body), 400, NULL);
    ck_assert_int_eq(ledger_counter(&sim, "refund_objects"), 4);
    answer_free(&plain);
}
END_TEST

START_TEST(intents_listed_by_created_then_creation)
{
    char ids[8][64];
    int more;
    /* Made after the others but created earlier: listed after them, and in
     * a window of its own. */
    struct http_answer a = inject("{\"count\":2,\"id\":\"pi_now{n}\"}");
    answer_free(&a);
    a = inject("{\"id\":\"pi_old\",\"created\":1600000000}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    a = inject("{\"count\":2,\"id\":\"pi_later{n}\"}");
    answer_free(&a);
    ck_assert_uint_eq(page_ids("/v1/payment_intents?limit=100", ids, 8, &more), 5);
    ck_assert_str_eq(ids[0], "pi_later000000000001");
    ck_assert_str_eq(ids[1], "pi_later000000000000");
    ck_assert_str_eq(ids[2], "pi_now000000000001");
    ck_assert_str_eq(ids[3], "pi_now000000000000");
    ck_assert_str_eq(ids[4], "pi_old");
    ck_assert_uint_eq(page_ids("/v1/payment_intents?created%5Bgte%5D=1600000000"
                               "&created%5Blt%5D=1600000001",
                               ids, 8, &more),
                      1);
    ck_assert_str_eq(ids[0], "pi_old");
    ck_assert_uint_eq(
        page_ids("/v1/payment_intents?limit=1&starting_after=pi_now000000000000", ids,
                 8, &more),
        1);
    ck_assert_str_eq(ids[0], "pi_old");
    ck_assert(!more);
}
END_TEST

START_TEST(reset_forgets_injected_amended_and_deleted)
{
    struct http_answer a = inject("{\"count\":3,\"id\":\"pi_rs{n}\"}");
    answer_free(&a);
    a = amend("pi_rs000000000000", "{\"amount\":5}");
    answer_free(&a);
    a = delete_intent("pi_rs000000000001");
    answer_free(&a);
    a = inject_refund("{\"payment_intent\":\"pi_rs000000000002\"}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    json_decref(psp_sim_admin(&sim, "POST", "/reset", NULL));
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 0);
    ck_assert_int_eq(ledger_counter(&sim, "refund_objects"), 0);
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    struct http_answer r = retrieve_on(&sim, "pi_rs000000000000");
    ck_assert_int_eq(r.status, 404);
    answer_free(&r);
    r = list_page("starting_after=pi_rs000000000001");
    ck_assert_int_eq(r.status, 400);
    answer_free(&r);
    /* The deleted one's id is free again. */
    a = inject("{\"count\":3,\"id\":\"pi_rs{n}\"}");
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    ck_assert_int_eq(ledger_counter(&sim, "intents"), 3);
}
END_TEST

/* Made behind the API's back: no event tells of an injection, an amendment
 * or a deletion; a charge still queues its own. */
START_TEST(injections_queue_no_webhook)
{
    struct psp_sim_process other = {0};
    char url[64], base[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d/hook", psp_sim_free_port());
    const char *args[] = {"--webhook-url", url, "--webhook-secret", "whsec_inject",
                          NULL};
    psp_sim_start(&other, args);
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", other.admin_port);
    struct http_answer a =
        request_to(base, "POST", "/inject/intents", NULL,
                   "{\"count\":3,\"id\":\"pi_quiet{n}\"}", NULL, NULL, 5000);
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    a = request_to(base, "POST", "/intents/pi_quiet000000000000/amend", NULL,
                   "{\"amount\":5}", NULL, NULL, 5000);
    ck_assert_int_eq(a.status, 200);
    answer_free(&a);
    a = request_to(base, "DELETE", "/intents/pi_quiet000000000001", NULL, NULL, NULL,
                   NULL, 5000);
    ck_assert_int_eq(a.status, 200);
    answer_free(&a);
    a = request_to(base, "POST", "/inject/refunds", NULL,
                   "{\"payment_intent\":\"pi_quiet000000000002\"}", NULL, NULL, 5000);
    ck_assert_int_eq(a.status, 201);
    answer_free(&a);
    json_t *w = psp_sim_admin(&other, "GET", "/webhooks", NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(w, "events")), 0);
    json_decref(w);
    a = request_to(other.base_url, "POST", "/v1/payment_intents", "k-loud", FORM_BASE,
                   NULL, NULL, 5000);
    ck_assert_int_eq(a.status, 200);
    answer_free(&a);
    w = psp_sim_admin(&other, "GET", "/webhooks", NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(w, "events")), 1);
    json_decref(w);
    psp_sim_stop(&other);
}
END_TEST

/* The auditor's walk: 100,000 intents paged 100 at a time, newest first,
 * each seen once, as many as the ledger says psp-sim holds. Under the
 * sanitizers 20,000: the same pages and cursors, checked for memory errors,
 * without a minute of instrumented JSON; the plain build walks all 100,000. */
#ifdef __SANITIZE_ADDRESS__
enum { BULK_INTENTS = 20000 };
#else
enum { BULK_INTENTS = 100000 };
#endif
START_TEST(hundred_thousand_intents_page_completely)
{
    enum { N = BULK_INTENTS };
    char path[256], after[64] = "", inject[256];
    static unsigned char seen[N];
    long long prev = N, pages = 0, total = 0;

    memset(seen, 0, sizeof(seen));
    snprintf(inject, sizeof(inject),
             "{\"count\":%d,\"id\":\"pi_bulk{n}\",\"metadata\":{\"payment_attempt_id\":"
             "\"00000000-0000-4000-8000-{n}\"}}",
             N);
    struct http_answer a = admin_req("POST", "/inject/intents", inject, 120000);
    ck_assert_int_eq(a.status, 201);
    ck_assert_int_eq(jint(a.json, "count"), N);
    ck_assert_uint_eq(json_array_size(json_object_get(a.json, "ids")), 100);
    answer_free(&a);

    long long t0 = test_env_now_ms();
    for (int more = 1; more; pages++) {
        snprintf(
            path, sizeof(path),
            "/v1/payment_intents?created%%5Bgte%%5D=0&created%%5Blt%%5D=99999999999"
            "&limit=100%s%s",
            *after ? "&starting_after=" : "", after);
        struct http_answer p = request("GET", path, NULL, NULL, NULL, 30000);
        ck_assert_int_eq(p.status, 200);
        json_t *data = json_object_get(p.json, "data"), *pi;
        size_t i;
        more = json_is_true(json_object_get(p.json, "has_more"));
        ck_assert(more ? json_array_size(data) == 100 : json_array_size(data) <= 100);
        json_array_foreach(data, i, pi)
        {
            const char *id = jstr(pi, "id");
            ck_assert_msg(!strncmp(id, "pi_bulk", 7) && strlen(id) == 19, "id %s", id);
            long long n = atoll(id + 7);
            ck_assert_msg(n >= 0 && n < N && !seen[n], "%s seen twice", id);
            /* One created second: newest first is the highest index first. */
            ck_assert_int_lt(n, prev);
            seen[n] = 1;
            prev = n;
            total++;
        }
        if (json_array_size(data))
            snprintf(after, sizeof(after), "%s",
                     jstr(json_array_get(data, json_array_size(data) - 1), "id"));
        answer_free(&p);
    }
    long long walk_ms = test_env_now_ms() - t0;
    fprintf(stderr, "psp-sim: %d intents in %lld pages of 100 walked in %lld ms\n", N,
            pages, walk_ms);
    ck_assert_int_eq(total, N);
    ck_assert_int_eq(pages, N / 100);

    a = admin_req("GET", "/ledger", NULL, 120000);
    ck_assert_int_eq(a.status, 200);
    ck_assert_int_eq(jint(json_object_get(a.json, "counters"), "intents"), total);
    ck_assert_uint_eq(json_array_size(json_object_get(a.json, "charges")), N);
    answer_free(&a);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("psp_sim");
    TCase *tc = tcase_create("psp_sim");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, same_key_same_parameters_replays_with_header);
    tcase_add_test(tc, refund_replays_refuses_mismatch_and_over_refunds);
    tcase_add_test(tc, refunds_are_retrieved_and_listed_by_intent_and_window);
    tcase_add_test(tc, refund_after_execute_fault_executes_once);
    tcase_add_test(tc, refunds_end_pending_or_failed_by_payment_method);
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
    tcase_add_test(tc, form_names_and_values_are_decoded);
    tcase_add_test(tc, customer_and_automatic_payment_methods_are_accepted);
    tcase_add_test(tc, automatic_payment_methods_values_are_checked);
    tcase_add_test(tc, customer_that_is_no_customer_id_is_400_resource_missing);
    tcase_add_test(tc, customer_is_part_of_the_idempotency_fingerprint);
    tcase_add_test(tc, processing_intent_is_settled_by_admin);
    tcase_add_test(tc, processing_intent_is_declined_or_canceled_by_admin);
    tcase_add_test(tc, processing_intent_settles_by_itself_after_n_ms);
    tcase_add_test(tc, search_lags_behind_creation);
    tcase_add_test(tc, unknown_intent_is_404_resource_missing);
    tcase_add_test(tc, list_pages_newest_first_without_search_lag);
    tcase_add_test(tc, decline_402_carries_the_whole_intent);
    tcase_add_test(tc, cancel_processing_intent_replays_with_one_ledger_cancel);
    tcase_add_test(tc, cancel_declined_intent_without_reason);
    tcase_add_test(tc, cancel_refusals_execute_nothing_and_are_not_stored);
    tcase_add_test(tc, cancel_and_charge_never_share_a_key);
    tcase_add_test(tc, cancel_in_flight_is_409);
    tcase_add_test(tc, cancel_faults_lose_the_answer_or_execute_nothing);
    tcase_add_test(tc, port_zero_binds_free_ports_it_prints);
    tcase_add_test(tc, each_bad_flag_value_is_reported_under_its_own_name);
    tcase_add_test(tc, inject_intents_expands_n_in_id_and_metadata);
    tcase_add_test(tc, inject_intents_like_copies_and_members_override);
    tcase_add_test(tc, inject_intents_refuses_bad_input_and_taken_ids);
    tcase_add_test(tc, amend_changes_intent_list_and_ledger);
    tcase_add_test(tc, deleted_intent_is_gone_but_its_cursor_keeps_its_place);
    tcase_add_test(tc, inject_refund_over_the_amount_is_listed_and_booked);
    tcase_add_test(tc, intents_listed_by_created_then_creation);
    tcase_add_test(tc, reset_forgets_injected_amended_and_deleted);
    tcase_add_test(tc, injections_queue_no_webhook);
    suite_add_tcase(s, tc);
    /* 100,000 intents: longer than the others, sanitizers included. */
    TCase *bulk = tcase_create("psp_sim_bulk");
    tcase_set_timeout(bulk, 600);
    tcase_add_checked_fixture(bulk, setup, teardown);
    tcase_add_test(bulk, hundred_thousand_intents_page_completely);
    suite_add_tcase(s, bulk);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
