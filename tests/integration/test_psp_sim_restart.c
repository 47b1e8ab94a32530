/* psp-sim --state-file: SIGKILLed and started again on the same file and
 * ports, it reports the same ledger, replays a used key with the same intent
 * and no new charge, still charges a new key, forgets a key by the time of
 * its first use, frees the key of a request the kill cut short, and
 * tolerates a last line torn by the kill. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
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
static char dir[64], state_file[128];

struct http_answer {
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

/* POST path of the provider API with this key and form body. */
static struct http_answer post(const char *path, const char *key, const char *body)
{
    struct http_answer a = {0};
    struct curl_slist *h = NULL;
    char url[256], hdr[320];
    CURL *e = curl_easy_init();

    snprintf(url, sizeof(url), "%s%s", sim.base_url, path);
    h = curl_slist_append(h, "Authorization: Bearer " PSP_SIM_TEST_KEY);
    snprintf(hdr, sizeof(hdr), "Idempotency-Key: %s", key);
    h = curl_slist_append(h, hdr);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(e, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(e, CURLOPT_HEADERDATA, &a);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    ck_assert_int_eq(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &a.status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    a.json = a.body ? json_loads(a.body, 0, NULL) : NULL;
    ck_assert_msg(a.json != NULL, "answer is no JSON: %s", a.body ? a.body : "");
    return a;
}

static struct http_answer charge(const char *key, const char *pm)
{
    char body[256];
    snprintf(body, sizeof(body),
             "amount=1500&currency=eur&payment_method=%s&confirm=true"
             "&metadata%%5Bpayment_attempt_id%%5D=att-%s&metadata%%5Border_id%%5D=o-%s",
             pm, key, key);
    return post("/v1/payment_intents", key, body);
}

/* The intent's id of a charge's answer, a decline's (402) included. */
static const char *intent_id(const struct http_answer *a)
{
    json_t *pi = a->status == 402 ? json_object_get(json_object_get(a->json, "error"),
                                                    "payment_intent")
                                  : a->json;
    return json_string_value(json_object_get(pi, "id"));
}

/* GET /ledger without what belongs to one process only (requests in
 * flight now, and the most that were at once). */
static json_t *books(void)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_t *counters = json_object_get(l, "counters");
    json_object_del(counters, "charges_in_flight");
    json_object_del(counters, "max_charges_in_flight");
    return l;
}

static void start(const char *retention_ms)
{
    const char *args[] = {"--state-file", state_file, "--key-retention-ms",
                          retention_ms, NULL};
    psp_sim_start(&sim, args);
}

/* SIGKILL, then a new psp-sim on the same ports and state file. */
static void kill_and_restart(const char *retention_ms)
{
    char port[16], admin_port[16];
    int st;
    snprintf(port, sizeof(port), "%d", sim.port);
    snprintf(admin_port, sizeof(admin_port), "%d", sim.admin_port);
    ck_assert_int_eq(kill(sim.pid, SIGKILL), 0);
    ck_assert_int_eq(waitpid(sim.pid, &st, 0), sim.pid);
    ck_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    sim.pid = 0;
    const char *args[] = {
        "--state-file", state_file,           "--port",     port, "--admin-port",
        admin_port,     "--key-retention-ms", retention_ms, NULL};
    psp_sim_start(&sim, args);
    ck_assert_int_eq(sim.port, atoi(port));
    ck_assert_int_eq(sim.admin_port, atoi(admin_port));
}

static void setup(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
    snprintf(dir, sizeof(dir), "/tmp/psp_sim_restart_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(state_file, sizeof(state_file), "%s/books.jsonl", dir);
}

static void teardown(void)
{
    psp_sim_stop(&sim);
    unlink(state_file);
    rmdir(dir);
}

START_TEST(books_survive_sigkill)
{
    start("86400000");
    struct http_answer ok = charge("k-ok", "pm_card_visa");
    struct http_answer dec = charge("k-dec", "pm_card_chargeDeclined");
    struct http_answer paid = charge("k-paid", "pm_card_visa");
    ck_assert_int_eq(ok.status, 200);
    ck_assert_int_eq(dec.status, 402);
    ck_assert_int_eq(paid.status, 200);
    char body[128];
    snprintf(body, sizeof(body), "payment_intent=%s&amount=500", intent_id(&paid));
    struct http_answer refund = post("/v1/refunds", "r-paid", body);
    ck_assert_int_eq(refund.status, 200);
    struct http_answer again = charge("k-ok", "pm_card_visa");
    ck_assert(again.replayed);
    ck_assert_str_eq(intent_id(&again), intent_id(&ok));
    answer_free(&again);
    json_t *before = books();
    ck_assert_uint_eq(psp_sim_charges(&sim), 3);

    kill_and_restart("86400000");
    json_t *after = books();
    ck_assert_msg(json_equal(before, after), "ledger before: %s\nafter: %s",
                  json_dumps(before, JSON_COMPACT), json_dumps(after, JSON_COMPACT));

    /* Replays answer as before the kill, and charge nothing. */
    struct http_answer r_ok = charge("k-ok", "pm_card_visa");
    struct http_answer r_dec = charge("k-dec", "pm_card_chargeDeclined");
    struct http_answer r_refund = post("/v1/refunds", "r-paid", body);
    ck_assert(r_ok.replayed && r_dec.replayed && r_refund.replayed);
    ck_assert_int_eq(r_ok.status, 200);
    ck_assert_int_eq(r_dec.status, 402);
    ck_assert_str_eq(r_ok.body, ok.body);
    ck_assert_str_eq(r_dec.body, dec.body);
    ck_assert_str_eq(r_refund.body, refund.body);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-ok"), 1);
    ck_assert_uint_eq(psp_sim_charges(&sim), 3);
    /* What is left to refund survived too: 1000 of 1500. */
    snprintf(body, sizeof(body), "payment_intent=%s&amount=1001", intent_id(&paid));
    struct http_answer too_much = post("/v1/refunds", "r-more", body);
    ck_assert_int_eq(too_much.status, 400);

    /* A new key charges, with an intent id of its own. */
    struct http_answer fresh = charge("k-new", "pm_card_visa");
    ck_assert_int_eq(fresh.status, 200);
    ck_assert(!fresh.replayed);
    ck_assert_str_ne(intent_id(&fresh), intent_id(&ok));
    ck_assert_str_ne(intent_id(&fresh), intent_id(&dec));
    ck_assert_str_ne(intent_id(&fresh), intent_id(&paid));
    ck_assert_uint_eq(psp_sim_charges(&sim), 4);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-new"), 1);

    struct http_answer *all[] = {&ok,    &dec,   &paid,     &refund,   &r_ok,
                                 &r_dec, &fresh, &r_refund, &too_much, NULL};
    for (int i = 0; all[i]; i++)
        answer_free(all[i]);
    json_decref(before);
    json_decref(after);
}
END_TEST

/* Manual capture's books: an authorization captured in part, one still
 * authorized and one voided, each with its rows, survive a SIGKILL; the
 * capture's key replays, the authorization left can still be captured, the
 * captured one cannot be captured again. */
START_TEST(manual_capture_survives_sigkill)
{
    const char *form = "amount=1000&currency=eur&payment_method=pm_card_visa"
                       "&confirm=true&capture_method=manual";
    char path[3][160], part[32] = "amount_to_capture=600";
    struct http_answer auth[3], cap, held, voided;

    start("86400000");
    for (int i = 0; i < 3; i++) {
        char key[16];
        snprintf(key, sizeof(key), "auth-%d", i);
        auth[i] = post("/v1/payment_intents", key, form);
        ck_assert_int_eq(auth[i].status, 200);
        snprintf(path[i], sizeof(path[i]), "/v1/payment_intents/%s/%s",
                 intent_id(&auth[i]), i == 2 ? "cancel" : "capture");
    }
    cap = post(path[0], "cap-0", part);
    voided = post(path[2], "void-2", "");
    ck_assert_int_eq(cap.status, 200);
    ck_assert_int_eq(voided.status, 200);
    json_t *before = books();

    kill_and_restart("86400000");
    json_t *after = books();
    ck_assert_msg(json_equal(before, after), "ledger before: %s\nafter: %s",
                  json_dumps(before, JSON_COMPACT), json_dumps(after, JSON_COMPACT));
    struct http_answer replay = post(path[0], "cap-0", part);
    ck_assert(replay.replayed);
    ck_assert_str_eq(replay.body, cap.body);
    struct http_answer twice = post(path[0], "cap-0b", "");
    ck_assert_int_eq(twice.status, 400);
    held = post(path[1], "cap-1", "");
    ck_assert_int_eq(held.status, 200);
    ck_assert_int_eq(json_integer_value(json_object_get(held.json, "amount_received")),
                     1000);

    struct http_answer *all[] = {&auth[0], &auth[1], &auth[2], &cap, &voided,
                                 &replay,  &twice,   &held,    NULL};
    for (int i = 0; all[i]; i++)
        answer_free(all[i]);
    json_decref(before);
    json_decref(after);
}
END_TEST

/* Retention 3 s: killed at once, started again 1.5 s after the key's first
 * use. The key must be forgotten 3 s after that use, not 3 s after the
 * restart. */
START_TEST(retention_counts_from_the_first_use_across_a_restart)
{
    start("3000");
    long long used = test_env_now_ms();
    struct http_answer first = charge("k-keep", "pm_card_visa");
    ck_assert_int_eq(first.status, 200);
    /* Not a sleep for a result: the restart must come this late for the two
     * clocks (first use, restart) to be told apart. */
    while (test_env_now_ms() < used + 1500) {
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
    long long restarted = test_env_now_ms();
    kill_and_restart("3000");

    struct http_answer kept = charge("k-keep", "pm_card_visa");
    ck_assert_msg(kept.replayed || test_env_now_ms() >= used + 3000,
                  "the key was forgotten before its retention ran out");
    if (kept.replayed)
        ck_assert_str_eq(intent_id(&kept), intent_id(&first));
    long long deadline = test_env_deadline(10000);
    for (;;) {
        long long sent = test_env_now_ms();
        struct http_answer b = charge("k-keep", "pm_card_visa");
        ck_assert_int_eq(b.status, 200);
        if (!b.replayed) {
            long long answered = test_env_now_ms();
            ck_assert_int_ge(answered, used + 3000);
            ck_assert_msg(sent < restarted + 3000,
                          "forgotten %lld ms after the first use, %lld after the "
                          "restart: retention counted from the restart",
                          sent - used, sent - restarted);
            answer_free(&b);
            break;
        }
        answer_free(&b);
        ck_assert_msg(test_env_now_ms() < deadline, "the key was never forgotten");
        struct timespec ts = {0, 25 * 1000000};
        nanosleep(&ts, NULL);
    }
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-keep"), 2);
    answer_free(&first);
    answer_free(&kept);
}
END_TEST

/* A charge that never gets its answer: psp-sim holds it in --latency-ms,
 * its key reserved, when it is killed. In a child process, which exits once
 * its connection is gone. */
static pid_t charge_in_background_with(const char *key, const char *form)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        struct http_answer a = {0};
        struct curl_slist *h = NULL;
        char url[256], hdr[320];
        CURL *e = curl_easy_init();
        snprintf(url, sizeof(url), "%s/v1/payment_intents", sim.base_url);
        h = curl_slist_append(h, "Authorization: Bearer " PSP_SIM_TEST_KEY);
        snprintf(hdr, sizeof(hdr), "Idempotency-Key: %s", key);
        h = curl_slist_append(h, hdr);
        curl_easy_setopt(e, CURLOPT_URL, url);
        curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 20000L);
        curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, form);
        curl_easy_perform(e);
        _exit(0);
    }
    return pid;
}

static const char plain_form[] =
    "amount=1500&currency=eur&payment_method=pm_card_visa&confirm=true";

static pid_t charge_in_background(const char *key)
{
    return charge_in_background_with(key, plain_form);
}

/* Waits until n charges are held in psp-sim's latency. */
static void wait_in_flight(json_int_t n)
{
    long long deadline = test_env_deadline(10000);
    for (;;) {
        json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
        json_int_t got = json_integer_value(
            json_object_get(json_object_get(l, "counters"), "charges_in_flight"));
        json_decref(l);
        if (got == n)
            return;
        ck_assert_msg(test_env_now_ms() < deadline, "the charges never came");
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
}

START_TEST(key_in_flight_at_the_kill_is_free_after_the_restart)
{
    const char *args[] = {"--state-file", state_file, "--latency-ms", "20000", NULL};
    psp_sim_start(&sim, args);
    pid_t child = charge_in_background("k-flight");
    /* In flight first (so that our probe cannot take the key before it),
     * then its key is seen reserved: another request with it is 409. */
    long long deadline = test_env_deadline(10000);
    for (;;) {
        json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
        json_int_t n = json_integer_value(
            json_object_get(json_object_get(l, "counters"), "charges_in_flight"));
        json_decref(l);
        if (n == 1)
            break;
        ck_assert_msg(test_env_now_ms() < deadline, "the charge never came");
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    struct http_answer a = charge("k-flight", "pm_card_visa");
    ck_assert_int_eq(a.status, 409);
    answer_free(&a);
    kill_and_restart("86400000");
    int st;
    ck_assert_int_eq(waitpid(child, &st, 0), child);
    /* Never executed: the retry charges once, and is no replay nor 409. */
    ck_assert_uint_eq(psp_sim_charges(&sim), 0);
    struct http_answer b = charge("k-flight", "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    ck_assert(!b.replayed);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-flight"), 1);
    answer_free(&b);
}
END_TEST

static void append_to_state_file(const char *text)
{
    int fd = open(state_file, O_WRONLY | O_APPEND | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
}

START_TEST(torn_last_line_is_dropped_and_appends_go_on)
{
    start("86400000");
    struct http_answer a = charge("k-torn", "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    /* As a write cut short by the kill would leave it. */
    append_to_state_file("{\"idempotency_key\":\"k-half\",\"amount\":\"15");
    kill_and_restart("86400000");
    ck_assert_uint_eq(psp_sim_charges(&sim), 1);
    struct http_answer b = charge("k-torn", "pm_card_visa");
    ck_assert(b.replayed);
    ck_assert_str_eq(intent_id(&b), intent_id(&a));
    struct http_answer c = charge("k-after", "pm_card_visa");
    ck_assert_int_eq(c.status, 200);
    /* The torn line was cut off: what came after it replays too. */
    kill_and_restart("86400000");
    ck_assert_uint_eq(psp_sim_charges(&sim), 2);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-after"), 1);
    answer_free(&a);
    answer_free(&b);
    answer_free(&c);
}
END_TEST

/* Only the last line may be torn: a bad one before it is a damaged file,
 * and psp-sim refuses it (exit 1) rather than start with half its books. */
START_TEST(bad_line_before_the_last_refuses_to_start)
{
    append_to_state_file("not json\n{\"op\":\"reset\",\"now\":0}\n");
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, STDOUT_FILENO);
        dup2(null, STDERR_FILENO);
        execl(PSP_SIM_PATH, PSP_SIM_PATH, "--port", "0", "--admin-port", "0",
              "--state-file", state_file, (char *)NULL);
        _exit(127);
    }
    int st = 0;
    long long deadline = test_env_deadline(10000);
    pid_t got;
    while ((got = waitpid(pid, &st, WNOHANG)) == 0 && test_env_now_ms() < deadline) {
        struct timespec ts = {0, 10 * 1000000};
        nanosleep(&ts, NULL);
    }
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        ck_abort_msg("psp-sim started on a damaged state file");
    }
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 1);
}
END_TEST

/* A key the first restart freed (its request was in flight at the kill) is
 * charged by its retry; a second restart must keep that retry's books and
 * answer: the freeing is part of the history replayed, else the replay sees
 * the key still reserved by the killed request (a 409 counted, the key's
 * parameters and first use those of the request that never ran). */
START_TEST(retry_of_a_freed_key_survives_a_second_restart)
{
    const char *args[] = {"--state-file", state_file, "--latency-ms", "20000", NULL};
    psp_sim_start(&sim, args);
    pid_t same = charge_in_background("k-same");
    pid_t other = charge_in_background("k-other");
    wait_in_flight(2);
    kill_and_restart("86400000");
    int st;
    ck_assert_int_eq(waitpid(same, &st, 0), same);
    ck_assert_int_eq(waitpid(other, &st, 0), other);

    /* k-same retried as it was sent, k-other with other parameters (it was
     * never executed, so it is a new request). */
    struct http_answer a = post("/v1/payment_intents", "k-same", plain_form);
    struct http_answer b = charge("k-other", "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    ck_assert_int_eq(b.status, 200);
    ck_assert(!a.replayed && !b.replayed);
    json_t *before = books();

    kill_and_restart("86400000");
    json_t *after = books();
    ck_assert_msg(json_equal(before, after), "ledger before: %s\nafter: %s",
                  json_dumps(before, JSON_COMPACT), json_dumps(after, JSON_COMPACT));
    struct http_answer ra = post("/v1/payment_intents", "k-same", plain_form);
    struct http_answer rb = charge("k-other", "pm_card_visa");
    ck_assert_int_eq(ra.status, 200);
    ck_assert_msg(rb.status == 200, "the retry's replay is %ld: %s", rb.status,
                  rb.body);
    ck_assert(ra.replayed && rb.replayed);
    ck_assert_str_eq(ra.body, a.body);
    ck_assert_str_eq(rb.body, b.body);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-same"), 1);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "k-other"), 1);
    struct http_answer *all[] = {&a, &b, &ra, &rb, NULL};
    for (int i = 0; all[i]; i++)
        answer_free(all[i]);
    json_decref(before);
    json_decref(after);
}
END_TEST

/* An id in the URL that is not UTF-8 cannot go into the state file: it is
 * refused (404), and psp-sim, which stops rather than answer what it could
 * not keep, stays up. */
START_TEST(url_not_utf8_is_refused_and_psp_sim_stays_up)
{
    start("86400000");
    struct http_answer a = post("/v1/payment_intents/pi_%FF/cancel", "k-url", "");
    ck_assert_int_eq(a.status, 404);
    ck_assert_int_eq(kill(sim.pid, 0), 0);
    struct http_answer b = charge("k-after-url", "pm_card_visa");
    ck_assert_int_eq(b.status, 200);
    answer_free(&a);
    answer_free(&b);
}
END_TEST

/* POST body to the admin API; the status (the answer is dropped). */
static long admin_post_status(const char *path, const char *body)
{
    char url[256];
    long status = 0;
    CURL *e = curl_easy_init();
    struct http_answer a = {0};

    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", sim.admin_port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &a);
    curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    ck_assert_int_eq(curl_easy_perform(e), CURLE_OK);
    curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    answer_free(&a);
    return status;
}

/* An admin body as deep as JSON parsing allows (2048 levels) is kept in a
 * record one level deeper: the next start must still read it, not refuse
 * the whole file. Refused here (400) or not, it is journaled. */
START_TEST(deepest_admin_body_does_not_damage_the_state_file)
{
    enum { DEPTH = 2048 };
    static char body[2 * DEPTH + 64];
    size_t n = (size_t)snprintf(body, sizeof(body), "{\"count\":1,\"x\":");
    for (int i = 0; i < DEPTH - 1; i++)
        body[n++] = '[';
    for (int i = 0; i < DEPTH - 1; i++)
        body[n++] = ']';
    body[n++] = '}';
    body[n] = '\0';
    start("86400000");
    ck_assert_int_eq(admin_post_status("/inject/intents", body), 400);
    struct http_answer a = charge("k-deep", "pm_card_visa");
    ck_assert_int_eq(a.status, 200);
    json_t *before = books();
    kill_and_restart("86400000");
    json_t *after = books();
    ck_assert(json_equal(before, after));
    answer_free(&a);
    json_decref(before);
    json_decref(after);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("psp_sim_restart");
    TCase *tc = tcase_create("psp_sim_restart");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, books_survive_sigkill);
    tcase_add_test(tc, manual_capture_survives_sigkill);
    tcase_add_test(tc, retention_counts_from_the_first_use_across_a_restart);
    tcase_add_test(tc, torn_last_line_is_dropped_and_appends_go_on);
    tcase_add_test(tc, bad_line_before_the_last_refuses_to_start);
    tcase_add_test(tc, key_in_flight_at_the_kill_is_free_after_the_restart);
    tcase_add_test(tc, retry_of_a_freed_key_survives_a_second_restart);
    tcase_add_test(tc, url_not_utf8_is_refused_and_psp_sim_stays_up);
    tcase_add_test(tc, deepest_admin_body_does_not_damage_the_state_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
