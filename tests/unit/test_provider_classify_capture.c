/* Unit tests of manual capture's answers, without a socket: an
 * authorization's (a charge with capture_method manual), a capture's and a
 * void's, as provider_client_classify places them; the look-ups' and
 * webhooks' manual capture fields; and what the charge's table does with a
 * hold where it asked for a charge. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "charge_policy.h"
#include "provider.h"
#include "provider_client.h"
#include "test_env.h"
#include "webhook_event.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"

/* An intent as psp-sim and Stripe answer it: `status`, capture_method
 * `how`, its amounts, its cancellation_reason (NULL: null). */
static const char *intent(const char *id, const char *status, const char *how,
                          long long capturable, long long received, const char *why)
{
    static char buf[4][768];
    static int next;
    char *b = buf[next++ % 4];
    char reason[64];
    snprintf(reason, sizeof(reason), why ? "\"%s\"" : "null", why);
    snprintf(b, sizeof(buf[0]),
             "{\"id\":\"%s\",\"object\":\"payment_intent\",\"status\":\"%s\","
             "\"amount\":1999,\"currency\":\"eur\",\"capture_method\":\"%s\","
             "\"amount_capturable\":%lld,\"amount_received\":%lld,"
             "\"cancellation_reason\":%s,"
             "\"metadata\":{\"payment_attempt_id\":\"" ATTEMPT "\"}}",
             id, status, how, capturable, received, reason);
    return b;
}

/* A 400 of Stripe's error shape carrying the intent. */
static const char *refusal(const char *code, const char *param, const char *pi)
{
    static char b[1024];
    snprintf(b, sizeof(b),
             "{\"error\":{\"type\":\"invalid_request_error\",\"code\":\"%s\","
             "\"param\":\"%s\",\"message\":\"refused\",\"payment_intent\":%s}}",
             code, param, pi);
    return b;
}

static struct provider_result classify(const struct provider_call *call, int http,
                                       const char *body)
{
    struct provider_result res;
    memset(&res, 0, sizeof(res));
    provider_client_classify(call, http, NULL, body, body ? strlen(body) : 0, &res);
    return res;
}

static struct provider_result charge(int manual, int http, const char *body)
{
    struct provider_call call = {.amount = 1999, .manual = manual};
    snprintf(call.currency, sizeof(call.currency), "eur");
    snprintf(call.attempt_id, sizeof(call.attempt_id), ATTEMPT);
    return classify(&call, http, body);
}

/* A capture (amount <= 0: all) or a void of pi_1, for ATTEMPT. */
static struct provider_result action(enum provider_operation op, long long amount,
                                     int http, const char *body)
{
    struct provider_call call = {.operation = op, .amount = amount};
    snprintf(call.attempt_id, sizeof(call.attempt_id), ATTEMPT);
    snprintf(call.payment_intent, sizeof(call.payment_intent), "pi_1");
    return classify(&call, http, body);
}

static struct provider_result capture(long long amount, int http, const char *body)
{
    return action(PROVIDER_OPERATION_CAPTURE, amount, http, body);
}

static struct provider_result void_(int http, const char *body)
{
    return action(PROVIDER_OPERATION_VOID, 0, http, body);
}

START_TEST(an_authorization_is_authorized_with_what_it_holds)
{
    struct provider_result r =
        charge(1, 200, intent("pi_1", "requires_capture", "manual", 1999, 0, NULL));
    ck_assert_int_eq(r.outcome, PROVIDER_AUTHORIZED);
    ck_assert_str_eq(r.provider_payment_id, "pi_1");
    ck_assert_str_eq(r.intent_status, "requires_capture");
    ck_assert_str_eq(r.capture_method, "manual");
    ck_assert_int_eq(r.amount_capturable, 1999);
    ck_assert_int_eq(r.amount_received, 0);
    ck_assert_str_eq(r.cancellation_reason, "");
    ck_assert_str_eq(provider_outcome_name(r.outcome), "authorized");

    /* Money taken where a hold was asked, a hold of the other method, or
     * another amount: a person looks. */
    ck_assert_int_eq(
        charge(1, 200, intent("pi_1", "succeeded", "manual", 0, 1999, NULL)).outcome,
        PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(
        charge(1, 200, intent("pi_1", "requires_capture", "automatic", 1999, 0, NULL))
            .outcome,
        PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(charge(1, 200,
                            "{\"id\":\"pi_1\",\"status\":\"requires_capture\","
                            "\"capture_method\":\"manual\",\"amount\":5}")
                         .outcome,
                     PROVIDER_REQUIRES_REVIEW);
    /* The rest as a charge's. */
    ck_assert_int_eq(
        charge(1, 200, intent("pi_1", "processing", "manual", 0, 0, NULL)).outcome,
        PROVIDER_PROCESSING);
    ck_assert_int_eq(
        charge(1, 402,
               "{\"error\":{\"type\":\"card_error\",\"code\":\"card_declined\"}}")
            .outcome,
        PROVIDER_DECLINED);
    ck_assert_int_eq(charge(1, 503, NULL).outcome, PROVIDER_UNKNOWN);
}
END_TEST

/* A hold answered to an automatic charge is anomalous: never SUCCEEDED,
 * never FAILED; the charge's table sends it to review. */
START_TEST(a_hold_answered_to_a_charge_goes_to_review)
{
    struct provider_result r =
        charge(0, 200, intent("pi_1", "requires_capture", "manual", 1999, 0, NULL));
    ck_assert_int_eq(r.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_str_eq(r.error, "intent status 'requires_capture'");
    ck_assert_int_eq(r.amount_capturable, 1999);
    const struct charge_policy p = {.unknown_retries = 3,
                                    .retry_base_ms = 100,
                                    .retry_max_ms = 1000,
                                    .first_look_ms = 5000};
    for (int o = PROVIDER_REQUIRES_REVIEW; o <= PROVIDER_AUTHORIZED;
         o += PROVIDER_AUTHORIZED - PROVIDER_REQUIRES_REVIEW) {
        struct answer_decision d = charge_policy_decide(&p, o, 1, 1, 7);
        ck_assert_int_eq(d.next, ANSWER_NEXT_SETTLE);
        ck_assert_int_eq(d.status, ATTEMPT_STATUS_REQUIRES_REVIEW);
        ck_assert_str_eq(d.reason_code, "requires_review");
    }
}
END_TEST

START_TEST(a_capture_succeeds_with_what_it_took)
{
    struct provider_result all =
        capture(0, 200, intent("pi_1", "succeeded", "manual", 0, 1999, NULL));
    ck_assert_int_eq(all.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(all.amount_received, 1999);
    ck_assert_int_eq(all.amount_capturable, 0);
    ck_assert_str_eq(all.provider_payment_id, "pi_1");
    struct provider_result part =
        capture(600, 200, intent("pi_1", "succeeded", "manual", 0, 600, NULL));
    ck_assert_int_eq(part.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(part.amount_received, 600);
    ck_assert_int_eq(
        capture(600, 200, intent("pi_1", "processing", "manual", 0, 0, NULL)).outcome,
        PROVIDER_PROCESSING);

    /* Not what was asked: another amount taken, another intent, another
     * attempt's, a status a capture never leaves: a person looks. */
    ck_assert_int_eq(
        capture(600, 200, intent("pi_1", "succeeded", "manual", 0, 1999, NULL)).outcome,
        PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(
        capture(0, 200, intent("pi_2", "succeeded", "manual", 0, 1999, NULL)).outcome,
        PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(capture(0, 200,
                             "{\"id\":\"pi_1\",\"status\":\"succeeded\",\"metadata\":"
                             "{\"payment_attempt_id\":\"someone-else\"}}")
                         .outcome,
                     PROVIDER_REQUIRES_REVIEW);
    struct provider_result held =
        capture(0, 200, intent("pi_1", "requires_capture", "manual", 1999, 0, NULL));
    ck_assert_int_eq(held.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_str_eq(held.error, "intent status 'requires_capture' after a capture");
    /* It may have executed, but on what? */
    ck_assert_int_eq(capture(0, 200, "{\"status\":\"succeeded\"}").outcome,
                     PROVIDER_UNKNOWN);
    ck_assert_int_eq(capture(0, 200, NULL).outcome, PROVIDER_UNKNOWN);
}
END_TEST

START_TEST(a_refused_capture_is_invalid_with_the_state_that_refused_it)
{
    struct provider_result expired =
        capture(0, 400,
                refusal("payment_intent_unexpected_state", "",
                        intent("pi_1", "canceled", "manual", 0, 0, "automatic")));
    ck_assert_int_eq(expired.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(expired.code, "payment_intent_unexpected_state");
    ck_assert_str_eq(expired.intent_status, "canceled");
    ck_assert_str_eq(expired.cancellation_reason, "automatic");
    ck_assert_str_eq(expired.capture_method, "manual");
    struct provider_result captured =
        capture(0, 400,
                refusal("payment_intent_unexpected_state", "",
                        intent("pi_1", "succeeded", "manual", 0, 1999, NULL)));
    ck_assert_int_eq(captured.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(captured.intent_status, "succeeded");
    ck_assert_int_eq(captured.amount_received, 1999);
    struct provider_result big =
        capture(5000, 400,
                refusal("amount_too_large", "amount_to_capture",
                        intent("pi_1", "requires_capture", "manual", 1999, 0, NULL)));
    ck_assert_int_eq(big.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(big.code, "amount_too_large");
    ck_assert_str_eq(big.param, "amount_to_capture");
    ck_assert_int_eq(big.amount_capturable, 1999);

    /* The wire's rules, as a charge's. */
    const char *missing = "{\"error\":{\"type\":\"invalid_request_error\","
                          "\"code\":\"resource_missing\",\"message\":\"No such "
                          "payment_intent: 'pi_x'\"}}";
    struct provider_result m = capture(0, 404, missing);
    ck_assert_int_eq(m.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(m.error, "No such payment_intent: '***'");
    ck_assert_int_eq(capture(0, 404, NULL).outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(capture(0, 409, NULL).outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(capture(0, 429, NULL).outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(capture(0, 500, NULL).outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(capture(0, 502, "<html>").outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(
        capture(0, 400, "{\"error\":{\"type\":\"idempotency_error\"}}").outcome,
        PROVIDER_REQUIRES_REVIEW);
}
END_TEST

START_TEST(a_void_succeeds_canceled_and_is_refused_once_captured)
{
    struct provider_result v =
        void_(200, intent("pi_1", "canceled", "manual", 0, 0, "requested_by_customer"));
    ck_assert_int_eq(v.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(v.intent_status, "canceled");
    ck_assert_str_eq(v.cancellation_reason, "requested_by_customer");
    ck_assert_int_eq(v.amount_capturable, 0);
    struct provider_result odd =
        void_(200, intent("pi_1", "succeeded", "manual", 0, 1999, NULL));
    ck_assert_int_eq(odd.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_str_eq(odd.error, "intent status 'succeeded' after a void");
    ck_assert_int_eq(
        void_(200, intent("pi_9", "canceled", "manual", 0, 0, "duplicate")).outcome,
        PROVIDER_REQUIRES_REVIEW);
    struct provider_result late =
        void_(400, refusal("payment_intent_unexpected_state", "",
                           intent("pi_1", "succeeded", "manual", 0, 1999, NULL)));
    ck_assert_int_eq(late.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(late.intent_status, "succeeded");
    ck_assert_int_eq(void_(503, NULL).outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(void_(429, NULL).outcome, PROVIDER_NOT_EXECUTED);
}
END_TEST

static struct provider_result retrieve(const char *body)
{
    struct provider_call call = {.lookup = 1, .kind = PROVIDER_LOOKUP_RETRIEVE};
    return classify(&call, 200, body);
}

START_TEST(a_lookup_carries_the_evidence_of_each_step)
{
    struct provider_result held =
        retrieve(intent("pi_1", "requires_capture", "manual", 1999, 0, NULL));
    ck_assert_int_eq(held.outcome, PROVIDER_AUTHORIZED);
    ck_assert_int_eq(held.amount_capturable, 1999);
    /* A hold on an automatic intent is no authorization: as before. */
    ck_assert_int_eq(
        retrieve(intent("pi_1", "requires_capture", "automatic", 1999, 0, NULL))
            .outcome,
        PROVIDER_REQUIRES_REVIEW);
    struct provider_result taken =
        retrieve(intent("pi_1", "succeeded", "manual", 0, 700, NULL));
    ck_assert_int_eq(taken.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(taken.amount_received, 700);
    struct provider_result lapsed =
        retrieve(intent("pi_1", "canceled", "manual", 0, 0, "automatic"));
    ck_assert_int_eq(lapsed.outcome, PROVIDER_DECLINED);
    ck_assert_str_eq(lapsed.cancellation_reason, "automatic");
    /* Fields the intent does not carry are absent, not 0. */
    struct provider_result bare =
        retrieve("{\"id\":\"pi_1\",\"object\":\"payment_intent\",\"status\":"
                 "\"succeeded\"}");
    ck_assert_int_eq(bare.amount_capturable, -1);
    ck_assert_int_eq(bare.amount_received, -1);
    ck_assert_str_eq(bare.capture_method, "");

    /* A list page's intents carry them too. */
    static struct provider_page page;
    struct provider_result res;
    char body[2048];
    snprintf(body, sizeof(body),
             "{\"object\":\"list\",\"has_more\":false,\"data\":[%s]}",
             intent("pi_1", "canceled", "manual", 0, 0, "automatic"));
    provider_client_parse_page(PROVIDER_LIST_INTENTS, 200, body, strlen(body), &page,
                               &res);
    ck_assert_int_eq(res.outcome, PROVIDER_SUCCEEDED);
    ck_assert_uint_eq(page.n, 1);
    ck_assert_str_eq(page.items[0].capture_method, "manual");
    ck_assert_str_eq(page.items[0].cancellation_reason, "automatic");
    ck_assert_int_eq(page.items[0].amount_capturable, 0);
    ck_assert_int_eq(page.items[0].amount_received, 0);
}
END_TEST

static enum charged_rc parse_event(const char *type, const char *object,
                                   struct webhook_event *ev)
{
    char body[2048];
    struct charged_error err;
    snprintf(body, sizeof(body),
             "{\"id\":\"evt_1\",\"type\":\"%s\",\"created\":1700000000,"
             "\"data\":{\"object\":%s}}",
             type, object);
    return provider_webhook_parse(provider_backend_default(), body, strlen(body), ev,
                                  NULL, &err);
}

START_TEST(webhooks_of_a_hold_and_a_release_are_recognised)
{
    struct webhook_event ev;
    ck_assert_int_eq(
        parse_event("payment_intent.amount_capturable_updated",
                    intent("pi_1", "requires_capture", "manual", 1999, 0, NULL), &ev),
        CHARGED_OK);
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_AUTHORIZED);
    ck_assert_str_eq(ev.intent_id, "pi_1");
    ck_assert_str_eq(ev.attempt_id, ATTEMPT);
    ck_assert_str_eq(ev.capture_method, "manual");
    ck_assert_int_eq(ev.amount_capturable, 1999);
    ck_assert_int_eq(ev.amount_received, 0);
    /* The type and the status must agree; a hold says what it holds. */
    ck_assert_int_eq(parse_event("payment_intent.amount_capturable_updated",
                                 intent("pi_1", "succeeded", "manual", 0, 1999, NULL),
                                 &ev),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(parse_event("payment_intent.amount_capturable_updated",
                                 "{\"id\":\"pi_1\",\"status\":\"requires_capture\","
                                 "\"amount\":1999,\"currency\":\"eur\"}",
                                 &ev),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(parse_event("payment_intent.succeeded",
                                 "{\"id\":\"pi_1\",\"status\":\"succeeded\","
                                 "\"amount\":1999,\"currency\":\"eur\","
                                 "\"amount_received\":-5}",
                                 &ev),
                     CHARGED_BAD_ITEM);

    /* A release: a charge's failure evidence as before, now saying why. */
    ck_assert_int_eq(
        parse_event("payment_intent.canceled",
                    intent("pi_1", "canceled", "manual", 0, 0, "automatic"), &ev),
        CHARGED_OK);
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_FAILED);
    ck_assert_str_eq(ev.cancellation_reason, "automatic");
    ck_assert_int_eq(ev.amount_capturable, 0);
    /* A capture's success: amount_received what was taken. */
    ck_assert_int_eq(parse_event("payment_intent.succeeded",
                                 intent("pi_1", "succeeded", "manual", 0, 600, NULL),
                                 &ev),
                     CHARGED_OK);
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_SUCCEEDED);
    ck_assert_int_eq(ev.amount_received, 600);
    ck_assert_str_eq(ev.cancellation_reason, "");

    /* A hold moves no charge attempt. */
    ck_assert_int_eq(
        parse_event("payment_intent.amount_capturable_updated",
                    intent("pi_1", "requires_capture", "manual", 1999, 0, NULL), &ev),
        CHARGED_OK);
    struct webhook_attempt a = {.status = ATTEMPT_STATUS_PROCESSING,
                                .amount = 1999,
                                .currency = "EUR",
                                .intent_recorded = 1};
    struct webhook_decision d;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_IGNORE);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_PROCESSING);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("provider_classify_capture");
    TCase *tc = tcase_create("capture");
    tcase_add_test(tc, an_authorization_is_authorized_with_what_it_holds);
    tcase_add_test(tc, a_hold_answered_to_a_charge_goes_to_review);
    tcase_add_test(tc, a_capture_succeeds_with_what_it_took);
    tcase_add_test(tc, a_refused_capture_is_invalid_with_the_state_that_refused_it);
    tcase_add_test(tc, a_void_succeeds_canceled_and_is_refused_once_captured);
    tcase_add_test(tc, a_lookup_carries_the_evidence_of_each_step);
    tcase_add_test(tc, webhooks_of_a_hold_and_a_release_are_recognised);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
