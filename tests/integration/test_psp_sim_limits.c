/* psp-sim's rate limiter, run for real on loopback and judged from its
 * answers and its ledger: a concurrent burst over a class's limit gets
 * exactly the excess as Stripe's 429 and executes nothing of it, other
 * classes and other keys unaffected, the global bucket binds across
 * classes, PUT /rate-limits at once and refused whole when bad, the flags,
 * Retry-After when asked for, and the random rate_limit fault apart.
 * Limits of 1 request/s with small bursts: a burst of a few dozen requests
 * on loopback ends long before a token comes back. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "psp_sim_process.h"
#include "test_env.h"

#define OTHER_KEY "sk_test_psp_sim_other"

static struct psp_sim_process sim;

/* ---- requests ---- */

struct reply {
    long status;
    long retry_after; /* -1: no Retry-After */
    FILE *body;       /* curl writes the body here, into text */
    char *text;
    size_t n;
    json_t *json;
};

static size_t take_header(char *line, size_t size, size_t n, void *u)
{
    struct reply *r = u;
    if (!strncasecmp(line, "Retry-After:", 12))
        r->retry_after = strtol(line + 12, NULL, 10);
    return size * n;
}

/* A request not yet sent: to the provider API with key (NULL: the admin
 * API), a form or JSON body for POST and PUT. */
static CURL *prepare(struct reply *r, struct curl_slist **hdrs, const char *method,
                     const char *path, const char *key, const char *idem,
                     const char *body)
{
    char url[256], h[300];
    CURL *c = curl_easy_init();

    *r = (struct reply){.retry_after = -1};
    r->body = open_memstream(&r->text, &r->n);
    ck_assert_ptr_nonnull(r->body);
    *hdrs = NULL;
    if (key)
        snprintf(url, sizeof(url), "%s%s", sim.base_url, path);
    else
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", sim.admin_port, path);
    if (key) {
        snprintf(h, sizeof(h), "Authorization: Bearer %s", key);
        *hdrs = curl_slist_append(*hdrs, h);
    }
    if (idem) {
        snprintf(h, sizeof(h), "Idempotency-Key: %s", idem);
        *hdrs = curl_slist_append(*hdrs, h);
    }
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, *hdrs);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r->body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, take_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);
    return c;
}

static void finish(struct reply *r, CURL *c, struct curl_slist *hdrs)
{
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    fclose(r->body);
    r->body = NULL;
    r->json = json_loads(r->text, 0, NULL);
}

static struct reply request(const char *method, const char *path, const char *key,
                            const char *idem, const char *body)
{
    struct reply r;
    struct curl_slist *hdrs;
    CURL *c = prepare(&r, &hdrs, method, path, key, idem, body);
    ck_assert_int_eq(curl_easy_perform(c), CURLE_OK);
    finish(&r, c, hdrs);
    return r;
}

static void reply_free(struct reply *r)
{
    free(r->text);
    json_decref(r->json);
    memset(r, 0, sizeof(*r));
}

static const char *charge_form = "amount=1000&currency=eur&payment_method=pm_card_visa"
                                 "&confirm=true";

static struct reply create(const char *key, const char *idem)
{
    return request("POST", "/v1/payment_intents", key, idem, charge_form);
}

/* The status of one request, its answer dropped. */
static long status_of(const char *method, const char *path, const char *key,
                      const char *idem, const char *body)
{
    struct reply r = request(method, path, key, idem, body);
    long st = r.status;
    reply_free(&r);
    return st;
}

/* Stripe's 429 for a rate limit. */
static void assert_stripe_429(const struct reply *r)
{
    json_t *e = json_object_get(r->json, "error");
    ck_assert_int_eq(r->status, 429);
    ck_assert_str_eq(json_string_value(json_object_get(e, "type")),
                     "invalid_request_error");
    ck_assert_str_eq(json_string_value(json_object_get(e, "code")), "rate_limit");
    ck_assert_ptr_nonnull(json_string_value(json_object_get(e, "message")));
}

/* n creates at once with keys <prefix>-0..n-1: how many passed, each
 * throttled one checked. */
static int burst(int n, const char *prefix)
{
    struct reply r[64];
    struct curl_slist *hdrs[64];
    CURL *c[64];
    CURLM *m = curl_multi_init();
    int running = 0, ok = 0;
    char idem[64];

    ck_assert_int_le(n, 64);
    for (int i = 0; i < n; i++) {
        snprintf(idem, sizeof(idem), "%s-%d", prefix, i);
        c[i] = prepare(&r[i], &hdrs[i], "POST", "/v1/payment_intents", PSP_SIM_TEST_KEY,
                       idem, charge_form);
        curl_multi_add_handle(m, c[i]);
    }
    do {
        ck_assert_int_eq(curl_multi_perform(m, &running), CURLM_OK);
        if (running)
            curl_multi_poll(m, NULL, 0, 1000, NULL);
    } while (running);
    for (int i = 0; i < n; i++) {
        curl_multi_remove_handle(m, c[i]);
        finish(&r[i], c[i], hdrs[i]);
        if (r[i].status == 200)
            ok++;
        else
            assert_stripe_429(&r[i]);
        ck_assert_int_eq(r[i].retry_after, -1); /* off unless asked for */
        reply_free(&r[i]);
    }
    curl_multi_cleanup(m);
    return ok;
}

/* ---- the admin API ---- */

static json_int_t counter(const char *name)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_t *v = json_object_get(json_object_get(l, "counters"), name);
    ck_assert_msg(json_is_integer(v), "counters.%s is no integer", name);
    json_int_t n = json_integer_value(v);
    json_decref(l);
    return n;
}

static json_int_t throttled(const char *cls)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_t *t = json_object_get(json_object_get(l, "counters"), "throttled");
    json_int_t n = json_integer_value(json_object_get(t, cls));
    json_decref(l);
    return n;
}

static void put_limits(const char *body)
{
    json_decref(psp_sim_admin(&sim, "PUT", "/rate-limits", body));
}

/* GET /rate-limits' rate of class cls ("global": the global one). */
static json_int_t rate_of(const char *cls)
{
    json_t *j = psp_sim_admin(&sim, "GET", "/rate-limits", NULL);
    json_t *lim = !strcmp(cls, "global")
                      ? json_object_get(j, "global")
                      : json_object_get(json_object_get(j, "classes"), cls);
    json_int_t n = json_integer_value(json_object_get(lim, "rate"));
    json_decref(j);
    return n;
}

static void setup(void)
{
    static const char *const args[] = {"--api-key", OTHER_KEY, NULL};
    curl_global_init(CURL_GLOBAL_ALL);
    psp_sim_start(&sim, args);
}

static void teardown(void)
{
    psp_sim_stop(&sim);
}

START_TEST(burst_over_a_class_gets_exactly_the_excess)
{
    /* An intent made before the limit, to read back while it binds. */
    struct reply first = create(PSP_SIM_TEST_KEY, "before");
    char path[128];
    ck_assert_int_eq(first.status, 200);
    snprintf(path, sizeof(path), "/v1/payment_intents/%s",
             json_string_value(json_object_get(first.json, "id")));

    put_limits("{\"classes\": {\"create\": {\"rate\": 1, \"burst\": 5}}}");
    ck_assert_int_eq(burst(20, "b"), 5);
    /* Nothing of the 15 executed: no intent, no charge, no request booked. */
    ck_assert_int_eq(counter("requests"), 6);
    ck_assert_int_eq(psp_sim_charges(&sim), 6);
    ck_assert_int_eq(counter("intents"), 6);
    ck_assert_int_eq(throttled("create"), 15);
    ck_assert_int_eq(throttled("retrieve"), 0);

    /* Other classes, and the other key's creates, go on. */
    ck_assert_int_eq(status_of("GET", path, PSP_SIM_TEST_KEY, NULL, NULL), 200);
    ck_assert_int_eq(
        status_of("GET", "/v1/payment_intents", PSP_SIM_TEST_KEY, NULL, NULL), 200);
    struct reply other = create(OTHER_KEY, "other-key");
    ck_assert_int_eq(other.status, 200);

    /* No key was reserved for a throttled request: once the limit is gone,
     * its key executes afresh. */
    put_limits("{}");
    int throttled_key = -1;
    char idem[32];
    for (int i = 0; i < 20 && throttled_key < 0; i++) {
        snprintf(idem, sizeof(idem), "b-%d", i);
        if (psp_sim_charges_for_key(&sim, idem) == 0)
            throttled_key = i;
    }
    ck_assert_int_ge(throttled_key, 0);
    struct reply again = create(PSP_SIM_TEST_KEY, idem);
    ck_assert_int_eq(again.status, 200);
    ck_assert_int_eq(psp_sim_charges_for_key(&sim, idem), 1);
    ck_assert_int_eq(counter("replayed"), 0);
    reply_free(&first);
    reply_free(&other);
    reply_free(&again);
}
END_TEST

START_TEST(global_binds_across_classes)
{
    struct reply pi = create(PSP_SIM_TEST_KEY, "g-0");
    char refund[160];
    snprintf(refund, sizeof(refund), "payment_intent=%s&amount=100",
             json_string_value(json_object_get(pi.json, "id")));

    put_limits(
        "{\"global\": {\"rate\": 1, \"burst\": 3}, \"classes\": {\"create\": 10}}");
    ck_assert_int_eq(rate_of("global"), 1);
    ck_assert_int_eq(rate_of("create"), 10);
    ck_assert_int_eq(
        status_of("GET", "/v1/payment_intents", PSP_SIM_TEST_KEY, NULL, NULL), 200);
    ck_assert_int_eq(status_of("POST", "/v1/refunds", PSP_SIM_TEST_KEY, "g-r1", refund),
                     200);
    ck_assert_int_eq(status_of("GET", "/v1/refunds", PSP_SIM_TEST_KEY, NULL, NULL),
                     200);
    /* Three taken: every class is refused now, create's own bucket full. */
    struct reply c = create(PSP_SIM_TEST_KEY, "g-1");
    assert_stripe_429(&c);
    ck_assert_int_eq(status_of("POST", "/v1/refunds", PSP_SIM_TEST_KEY, "g-r2", refund),
                     429);
    ck_assert_int_eq(status_of("GET",
                               "/v1/payment_intents/search?query=metadata%5B%27payment_"
                               "attempt_id%27%5D%3A%27x%27",
                               PSP_SIM_TEST_KEY, NULL, NULL),
                     429);
    ck_assert_int_eq(throttled("create"), 1);
    ck_assert_int_eq(throttled("refund"), 1);
    ck_assert_int_eq(throttled("search"), 1);
    ck_assert_int_eq(counter("refunds"), 1);
    /* The other key has a global bucket of its own. */
    ck_assert_int_eq(status_of("GET", "/v1/refunds", OTHER_KEY, NULL, NULL), 200);
    /* A wrong key is refused before any limit: 401, nothing counted. */
    ck_assert_int_eq(status_of("GET", "/v1/refunds", "sk_wrong", NULL, NULL), 401);
    ck_assert_int_eq(throttled("list"), 0);

    /* The series tells what was served and throttled. */
    json_t *j = psp_sim_admin(&sim, "GET", "/rate-limits", NULL), *s;
    json_int_t served = 0, refused = 0;
    size_t i;
    json_array_foreach(json_object_get(j, "per_second"), i, s)
    {
        served += json_integer_value(json_object_get(s, "served"));
        refused += json_integer_value(json_object_get(s, "throttled"));
    }
    ck_assert_int_eq(served, 5); /* g-0 and the other key's list included */
    ck_assert_int_eq(refused, 3);
    json_decref(j);
    reply_free(&pi);
    reply_free(&c);
}
END_TEST

static const char *bad_puts[] = {
    "not json",
    "[]",
    "{\"global\": -1}",
    "{\"global\": \"fast\"}",
    "{\"global\": {\"rate\": 1, \"brust\": 2}}",
    "{\"classes\": {\"create\": 3, \"charge\": 1}}",
    "{\"classes\": {\"create\": 3, \"list\": 1.5}}",
    "{\"global\": 5, \"retry_after\": \"yes\"}",
    "{\"global\": 5, \"limits\": {}}",
};

START_TEST(puts_at_once_and_bad_ones_refused_whole)
{
    json_t *j = psp_sim_admin(&sim, "GET", "/rate-limits", NULL);
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "global"), "rate")), 0);
    ck_assert(json_is_false(json_object_get(j, "retry_after")));
    json_decref(j);

    put_limits("{\"classes\": {\"create\": {\"rate\": 1, \"burst\": 1}}}");
    ck_assert_int_eq(
        status_of("POST", "/v1/payment_intents", PSP_SIM_TEST_KEY, "p-1", charge_form),
        200);
    ck_assert_int_eq(
        status_of("POST", "/v1/payment_intents", PSP_SIM_TEST_KEY, "p-2", charge_form),
        429);
    for (size_t i = 0; i < sizeof(bad_puts) / sizeof(bad_puts[0]); i++) {
        struct reply r = request("PUT", "/rate-limits", NULL, NULL, bad_puts[i]);
        ck_assert_msg(r.status == 400, "%s answered %ld", bad_puts[i], r.status);
        ck_assert_ptr_nonnull(json_string_value(
            json_object_get(json_object_get(r.json, "error"), "message")));
        reply_free(&r);
        ck_assert_int_eq(rate_of("create"), 1);
        ck_assert_int_eq(rate_of("global"), 0);
        ck_assert_int_eq(rate_of("list"), 0);
    }
    /* Lifted: at once. */
    put_limits("{\"classes\": {\"create\": 0}}");
    ck_assert_int_eq(
        status_of("POST", "/v1/payment_intents", PSP_SIM_TEST_KEY, "p-2", charge_form),
        200);
    ck_assert_int_eq(throttled("create"), 1);
}
END_TEST

START_TEST(flags_and_retry_after)
{
    static const char *const args[] = {
        "--api-key",    OTHER_KEY, "--rate-limit-class",       "search=1",
        "--rate-limit", "100:50",  "--rate-limit-retry-after", NULL,
    };
    psp_sim_stop(&sim);
    psp_sim_start(&sim, args);
    ck_assert_int_eq(rate_of("search"), 1);
    ck_assert_int_eq(rate_of("global"), 100);
    json_t *j = psp_sim_admin(&sim, "GET", "/rate-limits", NULL);
    ck_assert(json_is_true(json_object_get(j, "retry_after")));
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(j, "global"), "burst")), 50);
    json_decref(j);

    const char *search = "/v1/payment_intents/search?query=metadata%5B%27payment_"
                         "attempt_id%27%5D%3A%27x%27";
    ck_assert_int_eq(status_of("GET", search, PSP_SIM_TEST_KEY, NULL, NULL), 200);
    struct reply r = request("GET", search, PSP_SIM_TEST_KEY, NULL, NULL);
    assert_stripe_429(&r);
    ck_assert_int_eq(r.retry_after, 1);
    reply_free(&r);
    /* PUT turns it off with the rest. */
    put_limits("{\"classes\": {\"search\": 1}}");
    r = request("GET", search, OTHER_KEY, NULL, NULL);
    ck_assert_int_eq(r.status, 200);
    reply_free(&r);
    r = request("GET", search, OTHER_KEY, NULL, NULL);
    assert_stripe_429(&r);
    ck_assert_int_eq(r.retry_after, -1);
    reply_free(&r);
}
END_TEST

/* psp-sim with these flags: its exit status (its stderr dropped). */
static int exit_status(const char *const *flags)
{
    const char *argv[16] = {PSP_SIM_PATH, "--port", "0", "--admin-port", "0"};
    int n = 5, st;
    for (int i = 0; flags[i]; i++)
        argv[n++] = flags[i];
    argv[n] = NULL;
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

START_TEST(bad_flags_are_refused)
{
    const char *const bad[][3] = {
        {"--rate-limit", "fast", NULL},
        {"--rate-limit", "-5", NULL},
        {"--rate-limit", "0:10", NULL},
        {"--rate-limit-class", "charge=10", NULL},
        {"--rate-limit-class", "create", NULL},
        {"--rate-limit-class", "create=x", NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(exit_status(bad[i]) == 2, "%s %s taken", bad[i][0], bad[i][1]);
}
END_TEST

START_TEST(the_random_fault_is_apart_with_the_same_body)
{
    json_decref(psp_sim_admin(&sim, "PUT", "/faults",
                              "{\"rules\": [{\"kind\": \"rate_limit\", "
                              "\"probability\": 1, \"times\": 1}]}"));
    struct reply r = create(PSP_SIM_TEST_KEY, "f-1");
    assert_stripe_429(&r);
    ck_assert_int_eq(r.retry_after, -1);
    ck_assert_int_eq(psp_sim_charges(&sim), 0);
    ck_assert_int_eq(throttled("create"), 0);
    reply_free(&r);
    r = create(PSP_SIM_TEST_KEY, "f-1");
    ck_assert_int_eq(r.status, 200);
    reply_free(&r);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("psp_sim_limits");
    TCase *tc = tcase_create("limits");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, burst_over_a_class_gets_exactly_the_excess);
    tcase_add_test(tc, global_binds_across_classes);
    tcase_add_test(tc, puts_at_once_and_bad_ones_refused_whole);
    tcase_add_test(tc, flags_and_retry_after);
    tcase_add_test(tc, bad_flags_are_refused);
    tcase_add_test(tc, the_random_fault_is_apart_with_the_same_body);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
