/* Allocation failures, one at a time (SQLite's faultsim, curl's
 * `runtests -t`): each operation runs once to count its allocations, then
 * again with allocation 1, 2, ... N failing (alone, then with every one
 * after it), and must come back with its documented error, or with the
 * same complete result, never a half-built one, and leave nothing
 * allocated. The modules are linked into this binary with the allocator
 * wrapped (tests/CMakeLists.txt); jansson and OpenSSL are routed to the
 * same counter. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "card_data.h"
#include "charge_command.h"
#include "charge_policy.h"
#include "dead_letter.h"
#include "fault_alloc.h"
#include "log.h"
#include "metrics.h"
#include "test_env.h"
#include "test_message.h"
#include "traceparent.h"
#include "utf8_text.h"
#include "stripe.h"
#include "webhook_event.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"
#define ORDER   "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001"

/* What one run of an operation came to. Operations never assert while
 * armed (Check allocates to report), they say what went wrong here. */
enum outcome { OUTCOME_OK, OUTCOME_ERROR, OUTCOME_BROKEN };
static char broken[512];

static enum outcome broken_because(const char *why)
{
    snprintf(broken, sizeof(broken), "%s", why);
    return OUTCOME_BROKEN;
}

typedef enum outcome (*operation_fn)(void);

/* Runs op warm (caches filled), counts its allocations, then fails each in
 * turn. Returns the count. */
static long fail_each_allocation(const char *name, operation_fn op)
{
    struct fault_alloc_result r;
    enum outcome o;

    broken[0] = '\0';
    o = op();
    ck_assert_msg(o == OUTCOME_OK, "%s: unarmed run: %d %s", name, o, broken);
    fault_alloc_arm(0, 0);
    o = op();
    r = fault_alloc_disarm();
    ck_assert_msg(o == OUTCOME_OK, "%s: counting run: %d %s", name, o, broken);
    ck_assert_msg(r.live == 0 && !r.overflow, "%s: %ld allocations kept", name, r.live);
    for (long n = 1; n <= r.allocations; n++) {
        for (int persistent = 0; persistent <= 1; persistent++) {
            struct fault_alloc_result f;
            fault_alloc_arm(n, persistent);
            o = op();
            f = fault_alloc_disarm();
            ck_assert_msg(f.failed >= 1, "%s: allocation %ld of %ld never came", name,
                          n, r.allocations);
            ck_assert_msg(o != OUTCOME_BROKEN, "%s: allocation %ld%s failed: %s", name,
                          n, persistent ? " and on" : "", broken);
            ck_assert_msg(f.live == 0 && !f.overflow,
                          "%s: allocation %ld%s failed: %ld allocations leaked", name,
                          n, persistent ? " and on" : "", f.live);
            /* Nothing stays poisoned: the next run works. */
            ck_assert_msg(op() == OUTCOME_OK, "%s: run after allocation %ld failed: %s",
                          name, n, broken);
        }
    }
    printf("%s: %ld allocations, each failed in turn\n", name, r.allocations);
    return r.allocations;
}

/* ---- charge_command ---- */

static const struct charge_command_limits limits = {
    .max_bytes = 65536, .max_amount = 100000000000LL, .allowed_currencies = "EUR,USD"};

static const char valid_command[] =
    "{\"type\":\"charge.requested\",\"version\":1,"
    "\"payment_attempt_id\":\"" ATTEMPT "\",\"order_id\":\"" ORDER "\","
    "\"idempotency_key\":\"attempt:" ATTEMPT "\",\"amount\":1999,"
    "\"currency\":\"EUR\",\"payment_method\":\"pm_card_visa\","
    "\"customer_id\":\"cus_42\",\"metadata\":{\"cart\":\"42\",\"b\":\"\\u00e9\"},"
    "\"unknown\":[1,{\"x\":null}]}";

static struct charge_command reference_command;

static enum outcome parse_valid_command(void)
{
    struct charge_command c;
    struct charged_error err = {0};
    enum dead_letter_reason r = charge_command_parse(
        ATTEMPT, 36, valid_command, strlen(valid_command), &limits, &c, &err);
    enum outcome o = OUTCOME_OK;
    if (r == DEAD_LETTER_NONE) {
        /* Whole, or not at all: the same command the unfaulted run read. */
        if (!c.metadata_json ||
            strcmp(c.metadata_json, reference_command.metadata_json) ||
            strcmp(c.fingerprint, reference_command.fingerprint) ||
            strcmp(c.payment_attempt_id, ATTEMPT) || c.amount != 1999 ||
            strcmp(c.customer_id, "cus_42"))
            o = broken_because("a valid command came back incomplete");
        charge_command_release(&c);
        return o;
    }
    if (c.metadata_json)
        return broken_because("a refused command kept its metadata");
    if (!err.message[0])
        return broken_because("a refused command without a line of why");
    return OUTCOME_ERROR;
}

static enum outcome parse_invalid_command(void)
{
    /* Breaks one rule late (the amount) after every string was read. */
    static const char invalid[] =
        "{\"type\":\"charge.requested\",\"version\":1,"
        "\"payment_attempt_id\":\"" ATTEMPT "\",\"order_id\":\"" ORDER "\","
        "\"idempotency_key\":\"k\",\"amount\":0,\"currency\":\"EUR\","
        "\"payment_method\":\"pm_card_visa\",\"metadata\":{\"a\":\"b\"}}";
    struct charge_command c;
    struct charged_error err = {0};
    enum dead_letter_reason r =
        charge_command_parse(ATTEMPT, 36, invalid, strlen(invalid), &limits, &c, &err);
    if (r == DEAD_LETTER_NONE) {
        charge_command_release(&c);
        return broken_because("an invalid command was accepted");
    }
    if (c.metadata_json)
        return broken_because("a refused command kept its metadata");
    if (!err.message[0])
        return broken_because("a refused command without a line of why");
    /* An allocation failure may turn up as another reason; only the
     * unfaulted run must name the rule. */
    return r == DEAD_LETTER_SCHEMA_VIOLATION && strstr(err.message, "'amount'")
               ? OUTCOME_OK
               : OUTCOME_ERROR;
}

START_TEST(charge_command_survives_every_allocation_failure)
{
    struct charged_error err;
    ck_assert_int_eq(charge_command_parse(ATTEMPT, 36, valid_command,
                                          strlen(valid_command), &limits,
                                          &reference_command, &err),
                     DEAD_LETTER_NONE);
    ck_assert_uint_eq(strlen(reference_command.fingerprint), 64);
    ck_assert_int_gt(fail_each_allocation("valid command", parse_valid_command), 0);
    ck_assert_int_gt(fail_each_allocation("invalid command", parse_invalid_command), 0);
    charge_command_release(&reference_command);
}
END_TEST

/* ---- webhook_event ---- */

static const char webhook_body[] =
    "{\"id\":\"evt_1\",\"type\":\"payment_intent.payment_failed\",\"created\":"
    "1700000000,"
    "\"data\":{\"object\":{\"id\":\"pi_1\",\"object\":\"payment_intent\","
    "\"status\":\"requires_payment_method\",\"amount\":1999,\"currency\":\"eur\","
    "\"metadata\":{\"payment_attempt_id\":\"" ATTEMPT "\"},"
    "\"last_payment_error\":{\"decline_code\":\"insufficient_funds\","
    "\"message\":\"card 4242 4242 4242 4242 \\u00e9\"}}}}";

static char *reference_normalized;

static enum outcome parse_webhook(void)
{
    struct webhook_event ev;
    char *normalized = (char *)"untouched";
    struct charged_error err = {0};
    enum charged_rc rc = stripe_webhook_parse(webhook_body, strlen(webhook_body), &ev,
                                              &normalized, &err);
    enum outcome o = OUTCOME_OK;
    if (rc == 0) {
        if (!normalized || strcmp(normalized, reference_normalized) ||
            strcmp(ev.id, "evt_1") || strcmp(ev.intent_id, "pi_1") ||
            ev.evidence != WEBHOOK_EVIDENCE_FAILED || ev.amount != 1999 ||
            strcmp(ev.currency, "EUR") || strcmp(ev.attempt_id, ATTEMPT) ||
            strcmp(ev.decline_code, "insufficient_funds"))
            o = broken_because("a parsed event came back incomplete");
        free(normalized);
        return o;
    }
    /* The body is valid: only memory can have failed it, and that must
     * not read as a bad body (400, never delivered again). */
    if (rc != CHARGED_RETRY)
        return broken_because("a valid body refused as bad, not as out of memory");
    if (normalized)
        return broken_because("a refused event handed out its normalized text");
    if (!err.message[0])
        return broken_because("a refused event without a line of why");
    return OUTCOME_ERROR;
}

START_TEST(webhook_event_survives_every_allocation_failure)
{
    struct webhook_event ev;
    struct charged_error err;
    ck_assert_int_eq(stripe_webhook_parse(webhook_body, strlen(webhook_body), &ev,
                                          &reference_normalized, &err),
                     0);
    ck_assert_ptr_null(strstr(reference_normalized, "4242 4242 4242 4242"));
    ck_assert_int_gt(fail_each_allocation("webhook event", parse_webhook), 0);
    free(reference_normalized);
}
END_TEST

/* ---- dead_letter ---- */

static test_message_t *letter_message;
static int letter_cut;

static const char *header_of(rd_kafka_headers_t *h, const char *name)
{
    const void *v;
    size_t sz;
    if (rd_kafka_header_get_last(h, name, &v, &sz) != RD_KAFKA_RESP_ERR_NO_ERROR)
        return NULL;
    return v;
}

static enum outcome build_letter(void)
{
    const struct dead_letter_origin origin = {
        "payments.charge.commands", 3, 41, 1700000000000LL, "charged-worker", "w1"};
    struct dead_letter dl;
    const rd_kafka_message_t *msg = test_message_get(letter_message);
    enum outcome o = OUTCOME_OK;
    int rc = dead_letter_build(msg, DEAD_LETTER_MALFORMED_JSON, "not JSON", &origin,
                               letter_cut, &dl);
    if (rc == 0) {
        const char *id = header_of(dl.headers, "dlq.id");
        if (!dl.key || !dl.value || dl.value_len == 0 || !id ||
            strcmp(id, "payments.charge.commands:3:41") ||
            (letter_cut && !header_of(dl.headers, "dlq.value.sha256")))
            o = broken_because("a built letter came back incomplete");
        dead_letter_release(&dl);
        return o;
    }
    if (rc != -1)
        return broken_because("neither 0 nor -1");
    if (dl.key || dl.value || dl.headers)
        return broken_because("a failed build handed out part of a letter");
    return OUTCOME_ERROR;
}

START_TEST(dead_letter_survives_every_allocation_failure)
{
    static char value[DEAD_LETTER_CUT_VALUE + 100];
    const struct test_message_header headers[] = {
        {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", 55},
        {"empty", NULL, 0}};
    memset(value, 'x', sizeof(value));
    memcpy(value, "card 4242424242424242", 21);
    const struct test_message_spec spec = {ATTEMPT,       36,      value,
                                           sizeof(value), headers, 2};
    letter_message = test_message_new(&spec);
    letter_cut = 0;
    ck_assert_int_gt(fail_each_allocation("dead letter", build_letter), 0);
    letter_cut = 1;
    ck_assert_int_gt(fail_each_allocation("cut dead letter", build_letter), 0);
    test_message_free(letter_message);
}
END_TEST

/* ---- metrics ---- */

static enum outcome change_and_render(void)
{
    char *text = NULL;
    size_t len = 0;
    metrics_add(METRIC_MESSAGES, 1, "settled");
    metrics_observe(METRIC_PROVIDER_DURATION, 0.042, "charge");
    metrics_set(METRIC_CONSUMER_LAG, 7, "payments.charge.commands", "3");
    int rc = metrics_render(&text, &len);
    /* The registry owns its series: forget them, so that what is left
     * allocated is a leak. */
    metrics_reset();
    if (rc == 0) {
        enum outcome o = OUTCOME_OK;
        if (!text || len != strlen(text) ||
            !strstr(text, "# TYPE charged_messages_total counter"))
            o = broken_because("a rendered registry came back incomplete");
        free(text);
        return o;
    }
    if (rc != -1 || text || len)
        return broken_because("a failed render handed out text");
    return OUTCOME_ERROR;
}

START_TEST(metrics_survive_every_allocation_failure)
{
    ck_assert_int_gt(fail_each_allocation("metrics", change_and_render), 0);
}
END_TEST

/* ---- log ---- */

#define SECRET "sk_live_0123456789abcdef"

static enum outcome write_log_line(void)
{
    log_error("provider call failed with key " SECRET, "error", "bad \xff byte", "url",
              "https://psp/?k=" SECRET, "attempt", ATTEMPT, NULL);
    return OUTCOME_OK;
}

/* A line is written whole or not at all, and never with the secret; what
 * jansson could not allocate may leave a field out. */
START_TEST(log_survives_every_allocation_failure)
{
    FILE *lines = tmpfile();
    int saved = dup(STDERR_FILENO);
    char text[4096];
    long n = 0;
    ck_assert_ptr_nonnull(lines);
    log_init("worker", LOG_INFO);
    log_add_secret(SECRET);
    fflush(stderr);
    ck_assert_int_ge(dup2(fileno(lines), STDERR_FILENO), 0);
    long allocations = fail_each_allocation("log line", write_log_line);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ck_assert_int_gt(allocations, 0);
    rewind(lines);
    while (fgets(text, sizeof(text), lines)) {
        json_error_t jerr;
        size_t len = strlen(text);
        ck_assert_msg(len > 0 && text[len - 1] == '\n', "a cut line: %s", text);
        json_t *j = json_loadb(text, len - 1, 0, &jerr);
        ck_assert_msg(json_is_object(j), "not a JSON object (%s): %s", jerr.text, text);
        ck_assert_ptr_null(strstr(text, "sk_live"));
        json_decref(j);
        n++;
    }
    fclose(lines);
    /* Every run that could dump its line wrote one. */
    ck_assert_int_ge(n, 2 + 2 * allocations);
    log_clear_secrets();
}
END_TEST

/* ---- the pure modules: nothing to fail, and it stays so ---- */

static enum outcome pure_calls(void)
{
    char text[64], tp[TRACEPARENT_LEN + 1], card[] = "pay 4242-4242-4242-4242 now";
    const struct charge_policy policy = {3, 200, 5000, 60000};
    struct answer_decision d;

    utf8_text_copy(text, sizeof(text), "caf\xc3\xa9\x01\xff");
    if (!utf8_text_valid(text, strlen(text)))
        return broken_because("utf8_text_copy wrote invalid UTF-8");
    if (!traceparent_parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                           TRACEPARENT_LEN, tp))
        return broken_because("traceparent refused");
    if (!card_data_found(card, strlen(card)) || card_data_mask(card, strlen(card)) != 1)
        return broken_because("card number not found");
    d = charge_policy_decide(&policy, PROVIDER_UNKNOWN, 1, 1, 7);
    if (d.next != ANSWER_NEXT_RETRY)
        return broken_because("an unknown outcome was not retried");
    return OUTCOME_OK;
}

START_TEST(pure_modules_never_allocate)
{
    ck_assert_int_eq(fail_each_allocation("pure modules", pure_calls), 0);
}
END_TEST

/* ---- the allocator itself ---- */

START_TEST(the_nth_allocation_fails_and_leaks_are_seen)
{
    struct fault_alloc_result r;
    fault_alloc_arm(2, 0);
    char *a = malloc(8), *b = strdup("x"), *c = calloc(1, 8);
    r = fault_alloc_disarm();
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_null(b);
    ck_assert_ptr_nonnull(c);
    ck_assert_int_eq(r.allocations, 3);
    ck_assert_int_eq(r.failed, 1);
    ck_assert_int_eq(r.live, 2);
    free(a);
    free(c);

    fault_alloc_arm(1, 1);
    a = malloc(8);
    json_t *j = json_string("counted");
    r = fault_alloc_disarm();
    ck_assert_ptr_null(a);
    ck_assert_ptr_null(j);
    ck_assert_int_ge(r.failed, 2);

    fault_alloc_arm(0, 0);
    a = malloc(8);
    a = realloc(a, 4096);
    j = json_string("counted");
    json_decref(j);
    free(a);
    r = fault_alloc_disarm();
    ck_assert_int_ge(r.allocations, 3);
    ck_assert_int_eq(r.failed, 0);
    ck_assert_int_eq(r.live, 0);
}
END_TEST

int main(void)
{
    /* Before anything allocates through OpenSSL. */
    if (fault_alloc_install() != 0) {
        fprintf(stderr, "OpenSSL allocated before main: its allocations cannot be "
                        "counted\n");
        return 1;
    }
    Suite *s = suite_create("alloc_faults");
    TCase *tc = tcase_create("alloc_faults");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, the_nth_allocation_fails_and_leaks_are_seen);
    tcase_add_test(tc, charge_command_survives_every_allocation_failure);
    tcase_add_test(tc, webhook_event_survives_every_allocation_failure);
    tcase_add_test(tc, dead_letter_survives_every_allocation_failure);
    tcase_add_test(tc, metrics_survive_every_allocation_failure);
    tcase_add_test(tc, log_survives_every_allocation_failure);
    tcase_add_test(tc, pure_modules_never_allocate);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
