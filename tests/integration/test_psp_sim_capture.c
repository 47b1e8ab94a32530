/* psp-sim's manual capture, run for real on loopback and judged from its
 * answers, its ledger and the webhooks a receiver inside the test gets:
 * authorize then capture all or part (the rest released), a capture beyond
 * what is capturable, a second capture, a capture's key replayed, a void,
 * an authorization that expires, and faults on a capture. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>

#include "psp_sim_process.h"
#include "test_env.h"

static struct psp_sim_process sim;

/* ---- one request at a time to the provider API ---- */

struct reply {
    long status;
    int replayed;
    CURLcode cc;
    char *text;
    size_t n;
    json_t *json;
};

static size_t take_body(char *p, size_t size, size_t nmemb, void *u)
{
    struct reply *r = u;
    size_t add = size * nmemb;
    char *t = realloc(r->text, r->n + add + 1);
    ck_assert_ptr_nonnull(t);
    memcpy(t + r->n, p, add);
    r->text = t;
    r->n += add;
    r->text[r->n] = '\0';
    return add;
}

static size_t take_header(char *line, size_t size, size_t n, void *u)
{
    struct reply *r = u;
    if (!strncasecmp(line, "Idempotent-Replayed: true", 25))
        r->replayed = 1;
    return size * n;
}

/* POST path with this form body and Idempotency-Key key. */
static struct reply post(const char *path, const char *key, const char *form)
{
    struct reply r = {0};
    char url[256], auth[128], idem[300];
    struct curl_slist *hdrs = NULL;
    CURL *c = curl_easy_init();

    snprintf(url, sizeof(url), "%s%s", sim.base_url, path);
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", PSP_SIM_TEST_KEY);
    snprintf(idem, sizeof(idem), "Idempotency-Key: %s", key);
    hdrs = curl_slist_append(curl_slist_append(hdrs, auth), idem);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, form);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, take_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, take_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    r.cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_easy_cleanup(c);
    curl_slist_free_all(hdrs);
    r.json = r.text ? json_loads(r.text, 0, NULL) : NULL;
    return r;
}

static void reply_free(struct reply *r)
{
    free(r->text);
    json_decref(r->json);
    memset(r, 0, sizeof(*r));
}

static const char *str(json_t *o, const char *k)
{
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "";
}

static json_int_t num(json_t *o, const char *k)
{
    ck_assert_msg(json_is_integer(json_object_get(o, k)), "%s is no integer", k);
    return json_integer_value(json_object_get(o, k));
}

static json_t *error_of(const struct reply *r)
{
    return json_object_get(r->json, "error");
}

/* An intent with capture_method=manual (or automatic), confirmed as charged
 * sends it; its id into id. */
static struct reply create(const char *key, const char *attempt, long amount,
                           const char *how, char id[64])
{
    char form[400];
    snprintf(form, sizeof(form),
             "amount=%ld&currency=eur&payment_method=pm_card_visa&confirm=true"
             "&capture_method=%s&metadata%%5Bpayment_attempt_id%%5D=%s"
             "&metadata%%5Border_id%%5D=o-%s",
             amount, how, attempt, attempt);
    struct reply r = post("/v1/payment_intents", key, form);
    snprintf(id, 64, "%s", str(r.json, "id"));
    return r;
}

static struct reply authorize(const char *key, const char *attempt, long amount,
                              char id[64])
{
    struct reply r = create(key, attempt, amount, "manual", id);
    ck_assert_int_eq(r.status, 200);
    return r;
}

/* POST /v1/payment_intents/<id>/<op> with this form body. */
static struct reply on_intent(const char *id, const char *op, const char *key,
                              const char *form)
{
    char path[160];
    snprintf(path, sizeof(path), "/v1/payment_intents/%s/%s", id, op);
    return post(path, key, form);
}

/* The ledger's rows in `table` about this intent (new reference). */
static json_t *rows(const char *table, const char *intent)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL), *row, *out = json_array();
    size_t i;
    json_array_foreach(json_object_get(l, table), i, row)
    {
        if (!strcmp(str(row, "payment_intent_id"), intent))
            json_array_append(out, row);
    }
    json_decref(l);
    return out;
}

static json_int_t counter(const char *name)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    json_int_t v = num(json_object_get(l, "counters"), name);
    json_decref(l);
    return v;
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

START_TEST(authorize_then_capture_all)
{
    char id[64], auto_id[64];
    struct reply a = authorize("auth-all", "att-all", 1500, id);
    ck_assert_str_eq(str(a.json, "status"), "requires_capture");
    ck_assert_str_eq(str(a.json, "capture_method"), "manual");
    ck_assert_int_eq(num(a.json, "amount_capturable"), 1500);
    ck_assert_int_eq(num(a.json, "amount_received"), 0);
    /* Authorized is no charge that succeeded: money moves at capture. */
    json_t *charge = rows("charges", id);
    ck_assert_uint_eq(json_array_size(charge), 1);
    ck_assert_str_eq(str(json_array_get(charge, 0), "kind"), "authorization");
    ck_assert_str_eq(str(json_array_get(charge, 0), "outcome"), "requires_capture");
    ck_assert_int_eq(counter("requires_capture"), 1);
    ck_assert_int_eq(counter("succeeded"), 0);
    json_decref(charge);

    struct reply c = on_intent(id, "capture", "cap-all", "");
    ck_assert_int_eq(c.status, 200);
    ck_assert_str_eq(str(c.json, "status"), "succeeded");
    ck_assert_int_eq(num(c.json, "amount_received"), 1500);
    ck_assert_int_eq(num(c.json, "amount_capturable"), 0);
    charge = rows("charges", id);
    json_t *row = json_array_get(charge, 0);
    ck_assert_str_eq(str(row, "outcome"), "succeeded");
    ck_assert_int_eq(num(row, "amount"), 1500);
    ck_assert_str_eq(str(row, "payment_attempt_id"), "att-all");
    json_t *cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 1);
    row = json_array_get(cap, 0);
    ck_assert_str_eq(str(row, "kind"), "capture");
    ck_assert_str_eq(str(row, "idempotency_key"), "cap-all");
    ck_assert_str_eq(str(row, "payment_attempt_id"), "att-all");
    ck_assert_int_eq(num(row, "amount"), 1500);
    ck_assert_int_eq(num(row, "amount_released"), 0);
    ck_assert(json_is_null(json_object_get(row, "amount_to_capture")));
    ck_assert_int_eq(counter("requires_capture"), 0);
    ck_assert_int_eq(counter("succeeded"), 1);

    /* An automatic intent says so, and received all of it at once. */
    struct reply at = create("auto-1", "att-auto", 700, "automatic", auto_id);
    ck_assert_int_eq(at.status, 200);
    ck_assert_str_eq(str(at.json, "status"), "succeeded");
    ck_assert_str_eq(str(at.json, "capture_method"), "automatic");
    ck_assert_int_eq(num(at.json, "amount_capturable"), 0);
    ck_assert_int_eq(num(at.json, "amount_received"), 700);
    json_t *auto_row = rows("charges", auto_id);
    ck_assert_str_eq(str(json_array_get(auto_row, 0), "kind"), "charge");
    json_decref(auto_row);
    json_decref(charge);
    json_decref(cap);
    reply_free(&a);
    reply_free(&c);
    reply_free(&at);
}
END_TEST

START_TEST(partial_capture_releases_the_rest)
{
    char id[64], form[128];
    struct reply a = authorize("auth-part", "att-part", 1000, id);
    struct reply c = on_intent(id, "capture", "cap-part", "amount_to_capture=600");
    ck_assert_int_eq(c.status, 200);
    ck_assert_str_eq(str(c.json, "status"), "succeeded");
    ck_assert_int_eq(num(c.json, "amount"), 1000);
    ck_assert_int_eq(num(c.json, "amount_received"), 600);
    ck_assert_int_eq(num(c.json, "amount_capturable"), 0);
    json_t *cap = rows("captures", id), *charge = rows("charges", id);
    ck_assert_int_eq(num(json_array_get(cap, 0), "amount"), 600);
    ck_assert_int_eq(num(json_array_get(cap, 0), "amount_to_capture"), 600);
    ck_assert_int_eq(num(json_array_get(cap, 0), "amount_released"), 400);
    ck_assert_int_eq(num(json_array_get(charge, 0), "amount"), 600);
    ck_assert_int_eq(num(json_array_get(charge, 0), "amount_authorized"), 1000);

    /* Refunds are bound by what was captured. */
    snprintf(form, sizeof(form), "payment_intent=%s&amount=601", id);
    struct reply over = post("/v1/refunds", "ref-over", form);
    ck_assert_int_eq(over.status, 400);
    ck_assert_str_eq(str(error_of(&over), "code"), "amount_too_large");
    snprintf(form, sizeof(form), "payment_intent=%s", id);
    struct reply all = post("/v1/refunds", "ref-all", form);
    ck_assert_int_eq(all.status, 200);
    ck_assert_int_eq(num(all.json, "amount"), 600);
    json_decref(cap);
    json_decref(charge);
    reply_free(&a);
    reply_free(&c);
    reply_free(&over);
    reply_free(&all);
}
END_TEST

START_TEST(capture_over_capturable_is_refused)
{
    char id[64];
    struct reply a = authorize("auth-over", "att-over", 1000, id);
    struct reply c = on_intent(id, "capture", "cap-over", "amount_to_capture=1001");
    ck_assert_int_eq(c.status, 400);
    ck_assert_str_eq(str(error_of(&c), "type"), "invalid_request_error");
    ck_assert_str_eq(str(error_of(&c), "code"), "amount_too_large");
    ck_assert_str_eq(str(error_of(&c), "param"), "amount_to_capture");
    json_t *pi = json_object_get(error_of(&c), "payment_intent");
    ck_assert_str_eq(str(pi, "status"), "requires_capture");
    ck_assert_int_eq(num(pi, "amount_capturable"), 1000);
    json_t *cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 0);

    /* A refusal is not stored under the key: the key then captures. */
    struct reply ok = on_intent(id, "capture", "cap-over", "amount_to_capture=1000");
    ck_assert_int_eq(ok.status, 200);
    ck_assert(!ok.replayed);
    json_decref(cap);
    reply_free(&a);
    reply_free(&c);
    reply_free(&ok);
}
END_TEST

START_TEST(second_capture_is_refused)
{
    char id[64];
    struct reply a = authorize("auth-twice", "att-twice", 1000, id);
    struct reply first = on_intent(id, "capture", "cap-1", "amount_to_capture=300");
    ck_assert_int_eq(first.status, 200);
    struct reply second = on_intent(id, "capture", "cap-2", "amount_to_capture=300");
    ck_assert_int_eq(second.status, 400);
    ck_assert_str_eq(str(error_of(&second), "code"), "payment_intent_unexpected_state");
    json_t *pi = json_object_get(error_of(&second), "payment_intent");
    ck_assert_str_eq(str(pi, "id"), id);
    ck_assert_str_eq(str(pi, "status"), "succeeded");
    ck_assert_int_eq(num(pi, "amount_received"), 300);
    json_t *cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 1);
    /* Nor may a captured intent be voided. */
    struct reply v = on_intent(id, "cancel", "void-late", "");
    ck_assert_int_eq(v.status, 400);
    ck_assert_str_eq(str(error_of(&v), "code"), "payment_intent_unexpected_state");
    json_decref(cap);
    reply_free(&a);
    reply_free(&first);
    reply_free(&second);
    reply_free(&v);
}
END_TEST

START_TEST(capture_replay_with_the_same_key)
{
    char id[64];
    struct reply a = authorize("auth-replay", "att-replay", 900, id);
    struct reply c = on_intent(id, "capture", "cap-replay", "amount_to_capture=500");
    struct reply again =
        on_intent(id, "capture", "cap-replay", "amount_to_capture=500");
    ck_assert_int_eq(c.status, 200);
    ck_assert(!c.replayed);
    ck_assert_int_eq(again.status, 200);
    ck_assert(again.replayed);
    ck_assert_str_eq(again.text, c.text);
    json_t *cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 1);
    ck_assert_int_eq(counter("captures"), 1);

    /* The same key with other parameters, or on another endpoint. */
    struct reply other =
        on_intent(id, "capture", "cap-replay", "amount_to_capture=400");
    ck_assert_int_eq(other.status, 400);
    ck_assert_str_eq(str(error_of(&other), "type"), "idempotency_error");
    struct reply elsewhere = on_intent(id, "cancel", "cap-replay", "");
    ck_assert_int_eq(elsewhere.status, 400);
    ck_assert_str_eq(str(error_of(&elsewhere), "type"), "idempotency_error");
    json_decref(cap);
    reply_free(&a);
    reply_free(&c);
    reply_free(&again);
    reply_free(&other);
    reply_free(&elsewhere);
}
END_TEST

START_TEST(cancel_of_an_authorization_is_a_void)
{
    char id[64];
    struct reply a = authorize("auth-void", "att-void", 800, id);
    struct reply v = on_intent(id, "cancel", "void-1", "cancellation_reason=abandoned");
    ck_assert_int_eq(v.status, 200);
    ck_assert_str_eq(str(v.json, "status"), "canceled");
    ck_assert_str_eq(str(v.json, "cancellation_reason"), "abandoned");
    ck_assert_int_eq(num(v.json, "amount_capturable"), 0);
    ck_assert_int_eq(num(v.json, "amount_received"), 0);
    json_t *cancels = rows("cancels", id), *charge = rows("charges", id);
    json_t *row = json_array_get(cancels, 0);
    ck_assert_str_eq(str(row, "kind"), "void");
    ck_assert_str_eq(str(row, "payment_attempt_id"), "att-void");
    ck_assert_str_eq(str(row, "previous_status"), "requires_capture");
    ck_assert_int_eq(num(row, "amount_released"), 800);
    ck_assert_str_eq(str(json_array_get(charge, 0), "outcome"), "canceled");
    ck_assert_int_eq(counter("voids"), 1);
    ck_assert_int_eq(counter("requires_capture"), 0);

    struct reply c = on_intent(id, "capture", "cap-after-void", "");
    ck_assert_int_eq(c.status, 400);
    ck_assert_str_eq(str(error_of(&c), "code"), "payment_intent_unexpected_state");
    ck_assert_str_eq(str(json_object_get(error_of(&c), "payment_intent"), "status"),
                     "canceled");
    json_decref(cancels);
    json_decref(charge);
    reply_free(&a);
    reply_free(&v);
    reply_free(&c);
}
END_TEST

/* ---- faults ---- */

START_TEST(drop_after_on_a_capture_executes_and_loses_the_answer)
{
    char id[64];
    struct reply a = authorize("auth-drop", "att-drop", 1200, id);
    json_decref(psp_sim_admin(&sim, "PUT", "/faults",
                              "{\"rules\":[{\"kind\":\"drop_after\",\"probability\":1,"
                              "\"key\":\"cap-drop\"}]}"));
    struct reply lost = on_intent(id, "capture", "cap-drop", "amount_to_capture=1000");
    ck_assert_int_ne(lost.cc, CURLE_OK); /* no answer */
    json_t *cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 1);
    ck_assert_str_eq(str(json_array_get(cap, 0), "idempotency_key"), "cap-drop");
    ck_assert_int_eq(num(json_array_get(cap, 0), "amount"), 1000);

    /* The retry under the key gets what was executed, and executes nothing. */
    struct reply retry = on_intent(id, "capture", "cap-drop", "amount_to_capture=1000");
    ck_assert_int_eq(retry.status, 200);
    ck_assert(retry.replayed);
    ck_assert_int_eq(num(retry.json, "amount_received"), 1000);
    json_decref(cap);
    cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 1);
    json_decref(cap);
    reply_free(&a);
    reply_free(&lost);
    reply_free(&retry);
}
END_TEST

START_TEST(faults_before_a_capture_execute_nothing)
{
    char id[64];
    struct reply a = authorize("auth-before", "att-before", 1000, id);
    json_decref(psp_sim_admin(
        &sim, "PUT", "/faults",
        "{\"rules\":[{\"kind\":\"error_before\",\"probability\":1,\"key\":\"cap-e\"},"
        "{\"kind\":\"rate_limit\",\"probability\":1,\"key\":\"cap-r\"},"
        "{\"kind\":\"error_after\",\"probability\":1,\"key\":\"cap-a\"}]}"));
    struct reply e = on_intent(id, "capture", "cap-e", "");
    struct reply r = on_intent(id, "capture", "cap-r", "");
    ck_assert_int_eq(e.status, 500);
    ck_assert_int_eq(r.status, 429);
    json_t *cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 0);
    json_decref(cap);
    /* error_after: executed, answered 500. */
    struct reply after = on_intent(id, "capture", "cap-a", "");
    ck_assert_int_eq(after.status, 500);
    cap = rows("captures", id);
    ck_assert_uint_eq(json_array_size(cap), 1);
    json_decref(cap);
    reply_free(&a);
    reply_free(&e);
    reply_free(&r);
    reply_free(&after);
}
END_TEST

/* ---- a webhook receiver: the events' types and their intents' status ---- */

#define MAX_EVENTS 64

static struct {
    pthread_mutex_t lock;
    size_t n;
    json_t *events[MAX_EVENTS];
} got = {.lock = PTHREAD_MUTEX_INITIALIZER};

struct upload {
    char *p;
    size_t n;
};

static enum MHD_Result on_event(void *cls, struct MHD_Connection *conn, const char *url,
                                const char *method, const char *version,
                                const char *data, size_t *size, void **state)
{
    struct upload *u = *state;
    (void)cls, (void)url, (void)method, (void)version;
    if (!u) {
        *state = calloc(1, sizeof(*u));
        return *state ? MHD_YES : MHD_NO;
    }
    if (*size) {
        u->p = realloc(u->p, u->n + *size + 1);
        memcpy(u->p + u->n, data, *size);
        u->n += *size;
        u->p[u->n] = '\0';
        *size = 0;
        return MHD_YES;
    }
    pthread_mutex_lock(&got.lock);
    if (got.n < MAX_EVENTS && u->p)
        got.events[got.n++] = json_loads(u->p, 0, NULL);
    pthread_mutex_unlock(&got.lock);
    free(u->p);
    free(u);
    *state = NULL;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
    enum MHD_Result rc = MHD_queue_response(conn, 200, resp);
    MHD_destroy_response(resp);
    return rc;
}

/* Waits until an event of this type about the intent came (5 s at most);
 * returns its data.object (borrowed until the test ends), or NULL. */
static json_t *wait_event(const char *type, const char *intent)
{
    long long deadline = test_env_now_ms() + 5000;
    do {
        pthread_mutex_lock(&got.lock);
        for (size_t i = 0; i < got.n; i++) {
            json_t *pi =
                json_object_get(json_object_get(got.events[i], "data"), "object");
            if (!strcmp(str(got.events[i], "type"), type) &&
                !strcmp(str(pi, "id"), intent)) {
                pthread_mutex_unlock(&got.lock);
                return pi;
            }
        }
        pthread_mutex_unlock(&got.lock);
        usleep(20000);
    } while (test_env_now_ms() < deadline);
    return NULL;
}

static struct MHD_Daemon *receiver;

/* psp-sim with webhooks to the receiver and this authorization expiry. */
static void start_with_webhooks(const char *expiry_ms)
{
    char url[64];
    receiver = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL,
                                on_event, NULL, MHD_OPTION_END);
    ck_assert_ptr_nonnull(receiver);
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(receiver, MHD_DAEMON_INFO_BIND_PORT);
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/hook", (unsigned)info->port);
    const char *args[] = {"--webhook-url",
                          url,
                          "--webhook-secret",
                          "whsec_capture",
                          "--authorization-expiry-ms",
                          expiry_ms,
                          NULL};
    psp_sim_start(&sim, args);
}

static void setup_webhooks(void)
{
    curl_global_init(CURL_GLOBAL_ALL);
}

static void teardown_webhooks(void)
{
    psp_sim_stop(&sim);
    if (receiver)
        MHD_stop_daemon(receiver);
    receiver = NULL;
    for (size_t i = 0; i < got.n; i++)
        json_decref(got.events[i]);
    got.n = 0;
}

START_TEST(webhooks_of_an_authorization_a_capture_and_a_void)
{
    char id[64], void_id[64];
    start_with_webhooks("604800000");
    struct reply a = authorize("wh-auth", "att-wh", 1000, id);
    json_t *pi = wait_event("payment_intent.amount_capturable_updated", id);
    ck_assert_ptr_nonnull(pi);
    ck_assert_int_eq(num(pi, "amount_capturable"), 1000);
    struct reply c = on_intent(id, "capture", "wh-cap", "amount_to_capture=250");
    ck_assert_int_eq(c.status, 200);
    pi = wait_event("payment_intent.succeeded", id);
    ck_assert_ptr_nonnull(pi);
    ck_assert_int_eq(num(pi, "amount_received"), 250);

    struct reply b = authorize("wh-auth-2", "att-wh-2", 400, void_id);
    struct reply v = on_intent(void_id, "cancel", "wh-void", "");
    ck_assert_int_eq(v.status, 200);
    pi = wait_event("payment_intent.canceled", void_id);
    ck_assert_ptr_nonnull(pi);
    ck_assert_int_eq(num(pi, "amount_capturable"), 0);
    reply_free(&a);
    reply_free(&c);
    reply_free(&b);
    reply_free(&v);
}
END_TEST

/* Expiry 300 ms: nobody reads the intent, yet its canceled event comes
 * (the sweep); then a capture is refused and the ledger has the expiry. */
START_TEST(expired_authorization_is_canceled_automatically)
{
    char id[64];
    start_with_webhooks("300");
    struct reply a = authorize("exp-auth", "att-exp", 1000, id);
    json_t *pi = wait_event("payment_intent.canceled", id);
    ck_assert_ptr_nonnull(pi);
    ck_assert_str_eq(str(pi, "cancellation_reason"), "automatic");
    ck_assert_int_eq(num(pi, "amount_capturable"), 0);

    struct reply c = on_intent(id, "capture", "exp-cap", "");
    ck_assert_int_eq(c.status, 400);
    ck_assert_str_eq(str(error_of(&c), "code"), "payment_intent_unexpected_state");
    json_t *exp = rows("expiries", id), *charge = rows("charges", id);
    ck_assert_uint_eq(json_array_size(exp), 1);
    json_t *row = json_array_get(exp, 0);
    ck_assert_str_eq(str(row, "kind"), "expiry");
    ck_assert_str_eq(str(row, "cancellation_reason"), "automatic");
    ck_assert_str_eq(str(row, "payment_attempt_id"), "att-exp");
    ck_assert_int_eq(num(row, "amount_released"), 1000);
    ck_assert_str_eq(str(json_array_get(charge, 0), "outcome"), "canceled");
    ck_assert_int_eq(counter("authorizations_expired"), 1);

    /* The expiry is a setting at run time too. */
    json_t *ok = psp_sim_admin(&sim, "PUT", "/authorization-expiry",
                               "{\"authorization_expiry_ms\":604800000}");
    ck_assert(json_is_true(json_object_get(ok, "ok")));
    json_decref(ok);
    struct reply b = authorize("exp-auth-2", "att-exp-2", 500, id);
    struct reply c2 = on_intent(id, "capture", "exp-cap-2", "");
    ck_assert_int_eq(c2.status, 200);
    json_decref(exp);
    json_decref(charge);
    reply_free(&a);
    reply_free(&c);
    reply_free(&b);
    reply_free(&c2);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("psp_sim_capture");
    TCase *tc = tcase_create("capture");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, authorize_then_capture_all);
    tcase_add_test(tc, partial_capture_releases_the_rest);
    tcase_add_test(tc, capture_over_capturable_is_refused);
    tcase_add_test(tc, second_capture_is_refused);
    tcase_add_test(tc, capture_replay_with_the_same_key);
    tcase_add_test(tc, cancel_of_an_authorization_is_a_void);
    tcase_add_test(tc, drop_after_on_a_capture_executes_and_loses_the_answer);
    tcase_add_test(tc, faults_before_a_capture_execute_nothing);
    suite_add_tcase(s, tc);
    TCase *wh = tcase_create("webhooks");
    tcase_add_checked_fixture(wh, setup_webhooks, teardown_webhooks);
    tcase_set_timeout(wh, 60);
    tcase_add_test(wh, webhooks_of_an_authorization_a_capture_and_a_void);
    tcase_add_test(wh, expired_authorization_is_canceled_automatically);
    suite_add_tcase(s, wh);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
