/* Unit tests of worker/operations/capture: capture.requested parsed against
 * the contract (a bad one is a dead letter with its reason), a capture's
 * request is the stored capture's, the reason code of a refusal, and the
 * capture's order of evidence (capture_look_decide), pure, and which
 * provider events its webhook half takes. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "capture.h"
#include "capture_command.h"
#include "capture_op.h"
#include "test_env.h"

#define ATTEMPT "5d0e6a3c-0000-4000-8000-00000000000b"
#define CAPTURE "7c9e6679-7425-40de-944b-e07fc1f90ae7"

static enum dead_letter_reason parse(const char *json, struct capture_command *c)
{
    struct charged_error err = {0};
    return capture_command_parse(ATTEMPT, strlen(ATTEMPT), json, strlen(json), 0, c,
                                 &err);
}

START_TEST(a_capture_of_all_and_of_part)
{
    struct capture_command all, part, again;
    ck_assert_int_eq(parse("{\"type\":\"capture.requested\",\"version\":1,"
                           "\"capture_id\":\"" CAPTURE
                           "\",\"payment_attempt_id\":\"" ATTEMPT
                           "\",\"idempotency_key\":\"cap-1\"}",
                           &all),
                     DEAD_LETTER_NONE);
    ck_assert_int_eq(all.amount, 0); /* absent: all that is held */
    ck_assert_str_eq(all.capture_id, CAPTURE);
    ck_assert_str_eq(all.idempotency_key, "cap-1");
    ck_assert_str_eq(all.metadata_json, "{}");
    ck_assert_int_eq(parse("{\"type\":\"capture.requested\",\"version\":1,"
                           "\"capture_id\":\"7C9E6679-7425-40DE-944B-E07FC1F90AE7\","
                           "\"payment_attempt_id\":\"" ATTEMPT "\","
                           "\"idempotency_key\":\"cap-1\",\"amount\":600,"
                           "\"metadata\":{\"shipment\":\"s-1\"}}",
                           &part),
                     DEAD_LETTER_NONE);
    ck_assert_int_eq(part.amount, 600);
    ck_assert_str_eq(part.capture_id, CAPTURE); /* canonical, lower case */
    /* Another amount is another capture: a conflict under one key. */
    ck_assert_str_ne(all.fingerprint, part.fingerprint);
    ck_assert_int_eq(parse("{\"type\":\"capture.requested\",\"version\":1,"
                           "\"capture_id\":\"" CAPTURE
                           "\",\"payment_attempt_id\":\"" ATTEMPT
                           "\",\"idempotency_key\":\"cap-1\",\"amount\":600}",
                           &again),
                     DEAD_LETTER_NONE);
    /* Metadata is not what is captured: a redelivery is the same capture. */
    ck_assert_str_eq(again.fingerprint, part.fingerprint);
    capture_command_release(&all);
    capture_command_release(&part);
    capture_command_release(&again);
}
END_TEST

START_TEST(a_bad_capture_is_a_dead_letter)
{
    static const struct {
        const char *json;
        enum dead_letter_reason want;
    } cases[] = {
        {"{\"type\":\"refund.requested\",\"version\":1,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" ATTEMPT "\",\"idempotency_key\":\"k\"}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        {"{\"type\":\"capture.requested\",\"version\":2,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" ATTEMPT "\",\"idempotency_key\":\"k\"}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        {"{\"type\":\"capture.requested\",\"version\":1,\"capture_id\":\"nope\","
         "\"payment_attempt_id\":\"" ATTEMPT "\",\"idempotency_key\":\"k\"}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        {"{\"type\":\"capture.requested\",\"version\":1,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" ATTEMPT "\"}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        {"{\"type\":\"capture.requested\",\"version\":1,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" ATTEMPT "\",\"idempotency_key\":\"k\","
         "\"amount\":0}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        {"{\"type\":\"capture.requested\",\"version\":1,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" ATTEMPT "\",\"idempotency_key\":\"k\","
         "\"amount\":\"600\"}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        {"{\"type\":\"capture.requested\",\"version\":1,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" ATTEMPT "\",\"idempotency_key\":\"k\","
         "\"metadata\":[]}",
         DEAD_LETTER_SCHEMA_VIOLATION},
        /* The key is another attempt's. */
        {"{\"type\":\"capture.requested\",\"version\":1,\"capture_id\":\"" CAPTURE
         "\",\"payment_attempt_id\":\"" CAPTURE "\",\"idempotency_key\":\"k\"}",
         DEAD_LETTER_KEY_MISMATCH},
        {"not json", DEAD_LETTER_MALFORMED_JSON},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct capture_command c;
        ck_assert_msg(parse(cases[i].json, &c) == cases[i].want, "case %zu", i);
    }
}
END_TEST

START_TEST(the_request_is_the_stored_captures)
{
    struct capture_params p = {.amount = 0};
    snprintf(p.idempotency_key, sizeof(p.idempotency_key), "%s", "cap-1");
    snprintf(p.payment_intent, sizeof(p.payment_intent), "%s", "pi_1");
    snprintf(p.payment_attempt_id, sizeof(p.payment_attempt_id), "%s", ATTEMPT);
    struct provider_capture c = capture_op_request(&p);
    ck_assert_ptr_eq(c.idempotency_key, p.idempotency_key);
    ck_assert_ptr_eq(c.payment_intent, p.payment_intent);
    ck_assert_int_eq(c.amount, 0);
    ck_assert_str_eq(c.payment_attempt_id, ATTEMPT);
}
END_TEST

START_TEST(a_refusal_says_why)
{
    struct provider_result r = {.outcome = PROVIDER_INVALID};
    snprintf(r.intent_status, sizeof(r.intent_status), "canceled");
    snprintf(r.cancellation_reason, sizeof(r.cancellation_reason), "automatic");
    ck_assert_str_eq(capture_refusal_code(&r), "authorization_expired");
    snprintf(r.cancellation_reason, sizeof(r.cancellation_reason), "abandoned");
    ck_assert_str_eq(capture_refusal_code(&r), "voided");
    snprintf(r.intent_status, sizeof(r.intent_status), "succeeded");
    ck_assert_str_eq(capture_refusal_code(&r), "already_captured");
    r.intent_status[0] = '\0';
    ck_assert_str_eq(capture_refusal_code(&r), "invalid_request");
}
END_TEST

/* ---- the look ---- */

static const struct reconcile_limits lim = {
    .key_retention_ms = 24 * 3600 * 1000LL,
    .provider_timeout_ms = 10000,
    .search_lag_ms = 5000,
    .max_age_ms = 3600 * 1000LL,
};

static struct reconcile_attempt due(long long key_age_ms, long long amount)
{
    return (struct reconcile_attempt){.id = CAPTURE,
                                      .status = ATTEMPT_STATUS_UNKNOWN,
                                      .provider_payment_id = "pi_1",
                                      .amount = amount,
                                      .key_age_ms = key_age_ms,
                                      .first_sent_ms = -1,
                                      .age_ms = key_age_ms};
}

static struct provider_result intent(enum provider_outcome o, const char *status,
                                     long long received)
{
    struct provider_result r = {
        .outcome = o, .amount_received = received, .amount_capturable = -1};
    snprintf(r.intent_status, sizeof(r.intent_status), "%s", status);
    snprintf(r.provider_payment_id, sizeof(r.provider_payment_id), "pi_1");
    return r;
}

START_TEST(the_capture_again_first_and_its_replay_settles)
{
    struct reconcile_attempt a = due(30000, 0);
    struct reconcile_evidence e = {0};
    struct reconcile_decision d;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.next, RECONCILE_CHARGE);
    struct provider_result replay = intent(PROVIDER_SUCCEEDED, "succeeded", 1000);
    e.charge = &replay;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.next, RECONCILE_SETTLE);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_int_eq(d.amount, 1000);
    ck_assert_str_eq(d.provider_payment_id, "pi_1");
    /* Unanswered: the intent by our id. */
    struct provider_result lost = {.outcome = PROVIDER_UNKNOWN};
    e.charge = &lost;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.next, RECONCILE_RETRIEVE);
    struct provider_result held = intent(PROVIDER_AUTHORIZED, "requires_capture", 0);
    e.lookup = &held;
    capture_look_decide(&lim, &a, &e, &d);
    /* Our capture may still execute: looked at again, never FAILED. */
    ck_assert_int_eq(d.next, RECONCILE_SETTLE);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    struct provider_result captured = intent(PROVIDER_SUCCEEDED, "succeeded", 1000);
    e.lookup = &captured;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_SUCCEEDED);
    ck_assert_int_eq(d.amount, 1000);
}
END_TEST

START_TEST(canceled_is_expired_and_refused_is_failed)
{
    struct reconcile_attempt a = due(30000, 600);
    struct reconcile_evidence e = {0};
    struct reconcile_decision d;
    struct provider_result refused = intent(PROVIDER_INVALID, "canceled", 0);
    snprintf(refused.code, sizeof(refused.code), "payment_intent_unexpected_state");
    snprintf(refused.cancellation_reason, sizeof(refused.cancellation_reason),
             "automatic");
    e.charge = &refused;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert_msg(!strncmp(d.reason, "authorization_expired: ", 23), "%s", d.reason);
    /* Captured already, not under our key: a person looks. */
    struct provider_result other = intent(PROVIDER_INVALID, "succeeded", 1000);
    e.charge = &other;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
    /* Captured another amount than asked: a person looks. */
    struct provider_result more = intent(PROVIDER_SUCCEEDED, "succeeded", 1000);
    e.charge = &more;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
}
END_TEST

START_TEST(past_the_window_held_is_never_executed)
{
    struct reconcile_attempt a = due(lim.key_retention_ms + 60000, 0);
    struct reconcile_evidence e = {0};
    struct reconcile_decision d;
    capture_look_decide(&lim, &a, &e, &d);
    /* No call again once the key may be forgotten: the intent by our id. */
    ck_assert_int_eq(d.next, RECONCILE_RETRIEVE);
    struct provider_result held = intent(PROVIDER_AUTHORIZED, "requires_capture", 0);
    e.lookup = &held;
    a.age_ms = 1000; /* not too old */
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    ck_assert_msg(!strncmp(d.reason, "never_executed: ", 16), "%s", d.reason);
    struct provider_result gone = {.outcome = PROVIDER_NOT_FOUND};
    e.lookup = &gone;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
    /* No answer: looked at again; too old: a person. */
    struct provider_result failed = {.outcome = PROVIDER_UNKNOWN};
    e.lookup = &failed;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    a.age_ms = lim.max_age_ms + 1;
    capture_look_decide(&lim, &a, &e, &d);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
}
END_TEST

START_TEST(the_webhook_takes_a_manual_intents_success_only)
{
    struct webhook_event ev;
    memset(&ev, 0, sizeof(ev));
    snprintf(ev.type, sizeof(ev.type), "payment_intent.succeeded");
    snprintf(ev.capture_method, sizeof(ev.capture_method), "manual");
    ck_assert(capture_webhook.takes(&ev));
    /* A charge's success is the charge's; a hold's news the authorization's. */
    snprintf(ev.capture_method, sizeof(ev.capture_method), "automatic");
    ck_assert(!capture_webhook.takes(&ev));
    snprintf(ev.capture_method, sizeof(ev.capture_method), "manual");
    snprintf(ev.type, sizeof(ev.type), "payment_intent.amount_capturable_updated");
    ck_assert(!capture_webhook.takes(&ev));
    snprintf(ev.type, sizeof(ev.type), "payment_intent.canceled");
    ck_assert(!capture_webhook.takes(&ev));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("capture_op");
    TCase *tc = tcase_create("capture_op");
    tcase_add_test(tc, a_capture_of_all_and_of_part);
    tcase_add_test(tc, a_bad_capture_is_a_dead_letter);
    tcase_add_test(tc, the_request_is_the_stored_captures);
    tcase_add_test(tc, a_refusal_says_why);
    tcase_add_test(tc, the_capture_again_first_and_its_replay_settles);
    tcase_add_test(tc, canceled_is_expired_and_refused_is_failed);
    tcase_add_test(tc, past_the_window_held_is_never_executed);
    tcase_add_test(tc, the_webhook_takes_a_manual_intents_success_only);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
