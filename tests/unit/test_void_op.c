/* Unit tests of worker/operations/void's pure parts: the void.requested
 * parser (void_command_parse: what is taken, what is dead-lettered and
 * why, what is fingerprinted), the meaning of a refused cancel
 * (void_refusal_code), the request a void sends (void_op_request) and the
 * reconciler's order of evidence for a void (void_look_order, through
 * reconcile_look). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "reconcile_look.h"
#include "test_env.h"
#include "void.h"
#include "void_command.h"

#define VOID_ID    "6F1C2B3A-0000-4000-8000-00000000000A"
#define ATTEMPT_ID "5d0e6a3c-0000-4000-8000-00000000000b"

static enum dead_letter_reason parse(const char *key, const char *value,
                                     struct void_command *c)
{
    struct charged_error err = {0};
    return void_command_parse(key, key ? strlen(key) : 0, value, strlen(value), 0, c,
                              &err);
}

static char *command(char *buf, size_t size, const char *reason, const char *extra)
{
    snprintf(buf, size,
             "{\"type\":\"void.requested\",\"version\":1,\"void_id\":\"" VOID_ID "\","
             "\"payment_attempt_id\":\"" ATTEMPT_ID
             "\",\"idempotency_key\":\"void-k1\","
             "\"reason\":\"%s\"%s}",
             reason, extra);
    return buf;
}

START_TEST(a_void_is_parsed_and_fingerprinted)
{
    char v[1024];
    struct void_command c, d;
    ck_assert_int_eq(parse(ATTEMPT_ID,
                           command(v, sizeof(v), "abandoned",
                                   ",\"metadata\":{\"b\":\"2\",\"a\":\"1\"}"),
                           &c),
                     DEAD_LETTER_NONE);
    /* The ids canonical (lower case), the metadata recorded sorted. */
    ck_assert_str_eq(c.void_id, "6f1c2b3a-0000-4000-8000-00000000000a");
    ck_assert_str_eq(c.payment_attempt_id, ATTEMPT_ID);
    ck_assert_str_eq(c.idempotency_key, "void-k1");
    ck_assert_str_eq(c.reason, "abandoned");
    ck_assert_str_eq(c.metadata_json, "{\"a\":\"1\",\"b\":\"2\"}");
    ck_assert_int_eq(strlen(c.fingerprint), 64);
    /* Another reason is another void; other metadata is the same void. */
    ck_assert_int_eq(parse(ATTEMPT_ID, command(v, sizeof(v), "duplicate", ""), &d),
                     DEAD_LETTER_NONE);
    ck_assert_str_ne(c.fingerprint, d.fingerprint);
    void_command_release(&d);
    ck_assert_int_eq(parse(ATTEMPT_ID, command(v, sizeof(v), "abandoned", ""), &d),
                     DEAD_LETTER_NONE);
    ck_assert_str_eq(c.fingerprint, d.fingerprint);
    ck_assert_str_eq(d.metadata_json, "{}");
    void_command_release(&d);
    void_command_release(&c);
}
END_TEST

START_TEST(a_bad_void_is_a_dead_letter)
{
    char v[1024];
    struct void_command c;
    /* The contract's four reasons only. */
    ck_assert_int_eq(parse(ATTEMPT_ID, command(v, sizeof(v), "changed_mind", ""), &c),
                     DEAD_LETTER_SCHEMA_VIOLATION);
    ck_assert_int_eq(parse(ATTEMPT_ID, command(v, sizeof(v), "", ""), &c),
                     DEAD_LETTER_SCHEMA_VIOLATION);
    /* Keyed by its authorization's attempt. */
    ck_assert_int_eq(parse(VOID_ID, command(v, sizeof(v), "fraudulent", ""), &c),
                     DEAD_LETTER_KEY_MISMATCH);
    ck_assert_int_eq(parse(ATTEMPT_ID,
                           "{\"type\":\"void.requested\",\"version\":1,"
                           "\"void_id\":\"x\",\"payment_attempt_id\":\"" ATTEMPT_ID
                           "\",\"idempotency_key\":\"k\",\"reason\":\"duplicate\"}",
                           &c),
                     DEAD_LETTER_SCHEMA_VIOLATION);
    ck_assert_int_eq(
        parse(ATTEMPT_ID, "{\"type\":\"void.requested\",\"version\":2}", &c),
        DEAD_LETTER_SCHEMA_VIOLATION);
    ck_assert_int_eq(parse(ATTEMPT_ID, "[1]", &c), DEAD_LETTER_SCHEMA_VIOLATION);
    ck_assert_int_eq(parse(ATTEMPT_ID, "{", &c), DEAD_LETTER_MALFORMED_JSON);
    ck_assert_int_eq(
        parse(ATTEMPT_ID, command(v, sizeof(v), "duplicate", ",\"metadata\":{\"a\":1}"),
              &c),
        DEAD_LETTER_SCHEMA_VIOLATION);
}
END_TEST

static struct provider_result refusal(const char *status, const char *why)
{
    struct provider_result r;
    memset(&r, 0, sizeof(r));
    r.outcome = PROVIDER_INVALID;
    r.http_status = 400;
    snprintf(r.code, sizeof(r.code), "%s", "payment_intent_unexpected_state");
    snprintf(r.intent_status, sizeof(r.intent_status), "%s", status);
    snprintf(r.cancellation_reason, sizeof(r.cancellation_reason), "%s", why);
    return r;
}

START_TEST(a_refused_cancel_says_why)
{
    struct provider_result r = refusal("succeeded", "");
    ck_assert_str_eq(void_refusal_code(&r), "void_after_capture");
    r = refusal("canceled", "automatic");
    ck_assert_str_eq(void_refusal_code(&r), "authorization_expired");
    r = refusal("canceled", "duplicate");
    ck_assert_str_eq(void_refusal_code(&r), "authorization_voided");
    r = refusal("", "");
    ck_assert_str_eq(void_refusal_code(&r), "invalid_request");
}
END_TEST

START_TEST(the_request_is_the_stored_voids)
{
    struct void_params p = {.amount = 500};
    snprintf(p.idempotency_key, sizeof(p.idempotency_key), "%s", "void-k1");
    snprintf(p.payment_intent, sizeof(p.payment_intent), "%s", "pi_1");
    snprintf(p.reason, sizeof(p.reason), "%s", "fraudulent");
    struct provider_void v = void_op_request(&p);
    ck_assert_ptr_eq(v.idempotency_key, p.idempotency_key);
    ck_assert_ptr_eq(v.payment_intent, p.payment_intent);
    ck_assert_str_eq(v.reason, "fraudulent");
}
END_TEST

static const struct reconcile_limits lim = {.key_retention_ms = 86400000,
                                            .provider_timeout_ms = 10000,
                                            .search_lag_ms = 60000,
                                            .max_age_ms = 7 * 86400000LL};

/* One look at an UNKNOWN void whose key is key_age_ms old, with `answer`
 * to the one call it asks for: that call's name, and the decision. */
static struct reconcile_decision
look(long long key_age_ms, const struct provider_result *answer, const char **op)
{
    struct reconcile_look l;
    struct reconcile_step st;
    const struct reconcile_attempt a = {.id = VOID_ID,
                                        .status = ATTEMPT_STATUS_UNKNOWN,
                                        .provider_payment_id = "pi_ours",
                                        .amount = 500,
                                        .key_age_ms = key_age_ms,
                                        .first_sent_ms = -1,
                                        .age_ms = key_age_ms,
                                        .payment_intent = "pi_ours",
                                        .object = "intent"};
    reconcile_look_begin_order(&l, &void_look_order, &lim, &a, 0);
    reconcile_look_step(&l, 0, &st);
    ck_assert_int_ne(st.next, RECONCILE_SETTLE);
    *op = st.operation;
    *st.answer = *answer;
    reconcile_look_step(&l, 0, &st);
    ck_assert_int_eq(st.next, RECONCILE_SETTLE);
    return st.dec;
}

static struct provider_result intent(enum provider_outcome o, const char *status,
                                     const char *why)
{
    struct provider_result r = refusal(status, why);
    r.outcome = o;
    r.http_status = 200;
    r.code[0] = '\0';
    snprintf(r.provider_payment_id, sizeof(r.provider_payment_id), "%s", "pi_ours");
    return r;
}

START_TEST(the_look_replays_its_cancel_in_the_window)
{
    const char *op;
    struct provider_result r = intent(PROVIDER_SUCCEEDED, "canceled", "abandoned");
    struct reconcile_decision d = look(60000, &r, &op);
    ck_assert_str_eq(op, "void");
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_str_eq(d.provider_payment_id, "pi_ours");
    r = refusal("succeeded", "");
    d = look(60000, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert(!strncmp(d.reason, "void_after_capture", 18));
    /* No answer again: still in doubt, never FAILED. */
    memset(&r, 0, sizeof(r));
    r.outcome = PROVIDER_UNKNOWN;
    d = look(60000, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    r.outcome = PROVIDER_NOT_EXECUTED;
    d = look(60000, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
}
END_TEST

START_TEST(past_the_window_the_intent_by_our_id_decides)
{
    const char *op;
    const long long past = lim.key_retention_ms + 1;
    struct provider_result r = intent(PROVIDER_DECLINED, "canceled", "abandoned");
    struct reconcile_decision d = look(past, &r, &op);
    ck_assert_str_eq(op, "retrieve");
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_SUCCEEDED);
    r = intent(PROVIDER_AUTHORIZED, "requires_capture", "");
    d = look(past, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert(!strncmp(d.reason, "never_executed", 14));
    r = intent(PROVIDER_SUCCEEDED, "succeeded", "");
    d = look(past, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert(!strncmp(d.reason, "void_after_capture", 18));
    r = intent(PROVIDER_DECLINED, "canceled", "automatic");
    d = look(past, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert(!strncmp(d.reason, "authorization_expired", 21));
    /* A look-up that failed is no evidence; one that says the provider
     * does not know our id is for a person. */
    memset(&r, 0, sizeof(r));
    r.outcome = PROVIDER_UNKNOWN;
    d = look(past, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    r.outcome = PROVIDER_NOT_FOUND;
    d = look(past, &r, &op);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("void_op");
    TCase *tc = tcase_create("void_op");
    tcase_add_test(tc, a_void_is_parsed_and_fingerprinted);
    tcase_add_test(tc, a_bad_void_is_a_dead_letter);
    tcase_add_test(tc, a_refused_cancel_says_why);
    tcase_add_test(tc, the_request_is_the_stored_voids);
    tcase_add_test(tc, the_look_replays_its_cancel_in_the_window);
    tcase_add_test(tc, past_the_window_the_intent_by_our_id_decides);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
