/* Conformance of the provider client to Stripe's own API schema.
 *
 * psp-sim accepts what we taught it; stripe-mock, Stripe's official mock,
 * validates each request against Stripe's OpenAPI schema. The real client's
 * create-and-confirm (its full request shape), retrieve and search must each
 * be answered 200. A negative control shows that stripe-mock does refuse
 * what the schema does not allow, so that a 200 here means something.
 *
 * Limits: stripe-mock checks the body and the query against the schema it
 * bundles (the newest API version), not the version we pin; it accepts any
 * Stripe-Version and ignores Idempotency-Key (the client's headers are
 * checked against psp-sim in test_provider_client). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include <curl/curl.h>

#include "provider_client.h"
#include "stripe_mock_process.h"
#include "test_env.h"

#define API_VERSION "2024-06-20"
#define ATTEMPT_ID  "5d1c2c1e-7a3b-4c1d-9e2f-3a4b5c6d7e8f"
#define ORDER_ID    "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001"
#define CUSTOMER_ID "cus_conformance"
#define REFUND_ID   "7e2d3c4b-5a6f-4b1c-8d9e-0f1a2b3c4d5e"

static struct stripe_mock_process mock;
static provider_client_t *pc;

static void setup(void)
{
    struct charged_error err;
    stripe_mock_start(&mock);
    pc = provider_client_new(mock.base_url, STRIPE_MOCK_TEST_KEY, API_VERSION, 5000,
                             &err);
    ck_assert_msg(pc != NULL, "%s", err.message);
}

static void teardown(void)
{
    provider_client_free(pc);
    pc = NULL;
    stripe_mock_stop(&mock);
}

/* The attempt a worker would charge: every optional field present
 * (customer included), so every field the client can send is validated. */
static struct provider_charge full_charge(const char *payment_method)
{
    return (struct provider_charge){
        .idempotency_key = "conformance-" ATTEMPT_ID,
        .amount = 1999,
        .currency = "EUR",
        .payment_method = payment_method,
        .customer_id = CUSTOMER_ID,
        .payment_attempt_id = ATTEMPT_ID,
        .order_id = ORDER_ID,
    };
}

/* The end of stripe-mock's log, for failure messages: its error messages do
 * not name the refused field, its "Request data" line shows what came. */
static const char *log_tail(void)
{
    static char tail[1536];
    char *log = stripe_mock_log(&mock);
    size_t n = strlen(log);
    snprintf(tail, sizeof(tail), "%s",
             n > sizeof(tail) - 1 ? log + n + 1 - sizeof(tail) : log);
    free(log);
    return tail;
}

/* stripe-mock answers fixture data, not a payment: its intents say
 * requires_payment_method (the client reads that as declined), and look-ups
 * carry the fixture's amount and currency, which the client's amount check
 * may send to review. What conformance needs is that the request was
 * accepted (200) and the answer read as a PaymentIntent: any outcome taken
 * from an intent's status will do, an error outcome will not. */
static void assert_accepted(const char *what, const struct provider_result *r)
{
    int from_intent =
        r->outcome == PROVIDER_SUCCEEDED || r->outcome == PROVIDER_PROCESSING ||
        r->outcome == PROVIDER_DECLINED || r->outcome == PROVIDER_REQUIRES_REVIEW;
    ck_assert_msg(r->http_status == 200 && from_intent && r->intent_status[0] &&
                      !strncmp(r->provider_payment_id, "pi_", 3),
                  "%s: stripe-mock answered %d, outcome %s (%s), intent '%s' '%s'; "
                  "stripe-mock logged: %s",
                  what, r->http_status, provider_outcome_name(r->outcome), r->error,
                  r->provider_payment_id, r->intent_status, log_tail());
}

/* stripe-mock's "Request data" line of the last request: the parameters as
 * it parsed them, i.e. what its schema validated. */
static char *last_request_data(void)
{
    char *log = stripe_mock_log(&mock), *line = NULL;
    for (char *p = log; (p = strstr(p, "Request data = ")); p++)
        line = p;
    ck_assert_msg(line != NULL, "stripe-mock logged no request data: %s", log);
    char *end = strchr(line, '\n');
    char *out = strndup(line, end ? (size_t)(end - line) : strlen(line));
    free(log);
    ck_assert_ptr_nonnull(out);
    return out;
}

START_TEST(create_and_confirm_with_the_full_shape_is_accepted)
{
    struct provider_charge c = full_charge("pm_card_visa");
    struct provider_result r;
    provider_client_charge(pc, &c, &r);
    assert_accepted("create-and-confirm", &r);
    /* A 200 for a request that silently lost a field would prove nothing
     * about that field: every one must have reached the validator. (Go
     * prints map keys sorted; the version of stripe-mock is pinned.) */
    static const char *const fields[] = {
        "amount:1999",
        "currency:eur",
        "payment_method:pm_card_visa",
        "confirm:true",
        "off_session:true",
        "automatic_payment_methods:map[allow_redirects:never enabled:true]",
        "customer:" CUSTOMER_ID,
        "metadata:map[order_id:" ORDER_ID " payment_attempt_id:" ATTEMPT_ID "]",
    };
    char *data = last_request_data();
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        ck_assert_msg(strstr(data, fields[i]), "stripe-mock did not see %s in: %s",
                      fields[i], data);
    free(data);
}
END_TEST

START_TEST(retrieve_is_accepted)
{
    struct provider_charge c = full_charge("pm_card_visa");
    struct provider_result created, r;
    provider_client_charge(pc, &c, &created);
    assert_accepted("create-and-confirm", &created);
    provider_client_retrieve(pc, created.provider_payment_id, &r);
    assert_accepted("retrieve", &r);
    /* stripe-mock answers with the id from the path: the client put it there. */
    ck_assert_str_eq(r.provider_payment_id, created.provider_payment_id);
}
END_TEST

START_TEST(search_is_accepted)
{
    struct provider_result r;
    provider_client_search(pc, ATTEMPT_ID, &r);
    assert_accepted("search", &r);
    ck_assert_int_ge(r.matches, 1);
    char *data = last_request_data();
    ck_assert_msg(strstr(data, "query:metadata['payment_attempt_id']:'" ATTEMPT_ID "'"),
                  "stripe-mock parsed another query: %s", data);
    free(data);
}
END_TEST

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *u)
{
    char **b = u;
    size_t have = *b ? strlen(*b) : 0, n = size * nmemb;
    char *q = realloc(*b, have + n + 1);
    if (!q)
        return 0;
    memcpy(q + have, ptr, n);
    q[have + n] = '\0';
    *b = q;
    return n;
}

/* A request by hand, with the client's headers; a form body makes it a POST.
 * Returns the HTTP status (0: no answer) and the answer in *answer. */
static long raw_request(const char *path, const char *form, char **answer)
{
    char url[512];
    long status = 0;
    struct curl_slist *h = NULL;
    CURL *e = curl_easy_init();
    ck_assert_ptr_nonnull(e);
    *answer = NULL;
    snprintf(url, sizeof(url), "%s%s", mock.base_url, path);
    h = curl_slist_append(h, "Authorization: Bearer " STRIPE_MOCK_TEST_KEY);
    h = curl_slist_append(h, "Stripe-Version: " API_VERSION);
    h = curl_slist_append(h, "Idempotency-Key: conformance-raw");
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, answer);
    if (form)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, form);
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    curl_slist_free_all(h);
    return status;
}

/* The client's body, as docs/provider.md shows it, written out by hand;
 * the controls vary confirm and allow_redirects and append a field.
 * stripe-mock checks names, types and enumerations, not lengths, formats
 * or minimums. */
static void full_form(char *out, size_t size, const char *confirm,
                      const char *allow_redirects, const char *extra)
{
    snprintf(out, size,
             "amount=1999&currency=eur&payment_method=pm_card_visa&confirm=%s"
             "&off_session=true&automatic_payment_methods%%5Benabled%%5D=true"
             "&automatic_payment_methods%%5Ballow_redirects%%5D=%s"
             "&customer=" CUSTOMER_ID "&metadata%%5Bpayment_attempt_id%%5D=" ATTEMPT_ID
             "&metadata%%5Border_id%%5D=" ORDER_ID "%s",
             confirm, allow_redirects, extra);
}

static void expect_status(const char *path, const char *form, long want,
                          const char *want_in_answer)
{
    char *answer = NULL;
    long got = raw_request(path, form, &answer);
    ck_assert_msg(got == want &&
                      (!want_in_answer || (answer && strstr(answer, want_in_answer))),
                  "%s %s: want %ld%s%s, got %ld: %s", form ? "POST" : "GET", path, want,
                  want_in_answer ? " with " : "", want_in_answer ? want_in_answer : "",
                  got, answer ? answer : "(no answer)");
    free(answer);
}

START_TEST(negative_control_the_schema_refuses_what_it_does_not_know)
{
    char form[1024];

    /* The twin of the refusals below is accepted, so each refusal is the
     * change's doing. */
    full_form(form, sizeof(form), "true", "never", "");
    expect_status("/v1/payment_intents", form, 200, "\"object\":\"payment_intent\"");
    /* A field the schema does not know. */
    full_form(form, sizeof(form), "true", "never", "&charged_unknown_field=1");
    expect_status("/v1/payment_intents", form, 400,
                  "additional properties are not allowed");
    /* A known field with a value outside its enumeration. */
    full_form(form, sizeof(form), "true", "sometimes", "");
    expect_status("/v1/payment_intents", form, 400, "value is not in enumeration");
    /* A value of the wrong type. */
    full_form(form, sizeof(form), "maybe", "never", "");
    expect_status("/v1/payment_intents", form, 400, "invalid_request_error");
    /* Refunds are validated too: the client's shape passes, a field the
     * schema does not know does not. */
    const char *refund_form =
        "payment_intent=pi_conformance&amount=1999&reason=requested_by_customer"
        "&metadata%5Brefund_id%5D=" REFUND_ID
        "&metadata%5Bpayment_attempt_id%5D=" ATTEMPT_ID;
    expect_status("/v1/refunds", refund_form, 200, "\"object\":\"refund\"");
    snprintf(form, sizeof(form), "%s&charged_unknown_field=1", refund_form);
    expect_status("/v1/refunds", form, 400, "additional properties are not allowed");
    /* Look-ups are validated too: an unknown query parameter. */
    expect_status("/v1/payment_intents/search?query=x&charged_unknown_field=1", NULL,
                  400, "additional properties are not allowed");
}
END_TEST

/* A refund through the client's asynchronous path, as the worker sends it,
 * every field present. */
static struct provider_result run_refund(void)
{
    struct charged_error err;
    struct provider_refund rf = {
        .idempotency_key = "conformance-refund-" REFUND_ID,
        .payment_intent = "pi_conformance",
        .amount = 1999,
        .reason = "requested_by_customer",
        .refund_id = REFUND_ID,
        .payment_attempt_id = ATTEMPT_ID,
    };
    struct provider_result r;
    void *op = NULL;
    ck_assert_int_eq(provider_client_start_refund(pc, &rf, NULL, &err), 0);
    long long deadline = test_env_now_ms() + 10000;
    while (!provider_client_next_done(pc, &r, &op)) {
        ck_assert_msg(test_env_now_ms() < deadline, "the refund never finished");
        provider_client_perform(pc, 100);
    }
    return r;
}

/* A refund answer read as a Refund: stripe-mock's fixture has its own
 * amount and metadata, which the client's check may send to review. */
static void assert_refund_accepted(const char *what, const struct provider_result *r)
{
    ck_assert_msg(
        r->http_status == 200 && r->intent_status[0] &&
            !strncmp(r->provider_payment_id, "re_", 3) &&
            (r->outcome == PROVIDER_SUCCEEDED || r->outcome == PROVIDER_PROCESSING ||
             r->outcome == PROVIDER_DECLINED || r->outcome == PROVIDER_REQUIRES_REVIEW),
        "%s: stripe-mock answered %d, outcome %s (%s), refund '%s' '%s'; "
        "stripe-mock logged: %s",
        what, r->http_status, provider_outcome_name(r->outcome), r->error,
        r->provider_payment_id, r->intent_status, log_tail());
}

START_TEST(refund_create_with_the_full_shape_is_accepted)
{
    struct provider_result r = run_refund();
    assert_refund_accepted("refund create", &r);
    static const char *const fields[] = {
        "amount:1999",
        "payment_intent:pi_conformance",
        "reason:requested_by_customer",
        "metadata:map[payment_attempt_id:" ATTEMPT_ID " refund_id:" REFUND_ID "]",
    };
    char *data = last_request_data();
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++)
        ck_assert_msg(strstr(data, fields[i]), "stripe-mock did not see %s in: %s",
                      fields[i], data);
    free(data);
}
END_TEST

START_TEST(refund_retrieve_and_list_are_accepted)
{
    struct provider_result created = run_refund(), r;
    assert_refund_accepted("refund create", &created);
    provider_client_retrieve_refund(pc, created.provider_payment_id, &r);
    assert_refund_accepted("refund retrieve", &r);
    ck_assert_str_eq(r.provider_payment_id, created.provider_payment_id);
    /* The fixture's refunds are no refund attempt of ours: a list read as a
     * list finds none of them. */
    provider_client_list_refunds(pc, "pi_conformance", REFUND_ID, "re_conformance", &r);
    ck_assert_msg(r.http_status == 200 && r.outcome == PROVIDER_NOT_FOUND,
                  "refund list: stripe-mock answered %d, outcome %s (%s); logged: %s",
                  r.http_status, provider_outcome_name(r.outcome), r.error, log_tail());
    char *data = last_request_data();
    ck_assert_msg(strstr(data, "payment_intent:pi_conformance") &&
                      strstr(data, "limit:100") &&
                      strstr(data, "starting_after:re_conformance"),
                  "stripe-mock parsed another query: %s", data);
    free(data);
}
END_TEST

/* The auditor's walk: a page of intents and one of refunds created in a
 * window, after a cursor, as Stripe's list API takes them. */
START_TEST(audit_list_pages_are_accepted)
{
    struct provider_page *page = malloc(sizeof(*page));
    struct provider_result r;
    ck_assert_ptr_nonnull(page);
    provider_client_list_page(pc, PROVIDER_LIST_INTENTS, 1700000000, 1700003600,
                              "pi_conformance", page, &r);
    ck_assert_msg(
        r.http_status == 200 && r.outcome == PROVIDER_SUCCEEDED && page->n >= 1,
        "intent list page: stripe-mock answered %d, outcome %s (%s), %zu items; "
        "logged: %s",
        r.http_status, provider_outcome_name(r.outcome), r.error, page->n, log_tail());
    ck_assert(page->items[0].id[0] != '\0');
    char *data = last_request_data();
    ck_assert_msg(strstr(data, "created:") && strstr(data, "gte:1700000000") &&
                      strstr(data, "lt:1700003600") && strstr(data, "limit:100") &&
                      strstr(data, "starting_after:pi_conformance"),
                  "stripe-mock parsed another query: %s", data);
    free(data);
    provider_client_list_page(pc, PROVIDER_LIST_REFUNDS, 1700000000, 1700003600,
                              "re_conformance", page, &r);
    ck_assert_msg(
        r.http_status == 200 && r.outcome == PROVIDER_SUCCEEDED && page->n >= 1,
        "refund list page: stripe-mock answered %d, outcome %s (%s), %zu items",
        r.http_status, provider_outcome_name(r.outcome), r.error, page->n);
    ck_assert(page->items[0].id[0] != '\0');
    data = last_request_data();
    ck_assert_msg(strstr(data, "gte:1700000000") && strstr(data, "lt:1700003600") &&
                      strstr(data, "starting_after:re_conformance"),
                  "stripe-mock parsed another query: %s", data);
    free(data);
    free(page);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("provider_conformance");
    TCase *tc = tcase_create("provider_conformance");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, create_and_confirm_with_the_full_shape_is_accepted);
    tcase_add_test(tc, retrieve_is_accepted);
    tcase_add_test(tc, search_is_accepted);
    tcase_add_test(tc, negative_control_the_schema_refuses_what_it_does_not_know);
    tcase_add_test(tc, refund_create_with_the_full_shape_is_accepted);
    tcase_add_test(tc, refund_retrieve_and_list_are_accepted);
    tcase_add_test(tc, audit_list_pages_are_accepted);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
