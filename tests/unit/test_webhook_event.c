/* Unit tests of common/webhook_event: the event's shape is checked, and the
 * decision table does what docs/api.md promises, row by row. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "test_env.h"
#include "webhook_event.h"

#define ATT "6960b56e-87d0-4fdf-8c2c-5b56b0e1f2cf"

static int parse(const char *body, struct webhook_event *ev, char *err)
{
    return webhook_event_parse(body, strlen(body), ev, err, 256);
}

START_TEST(parses_a_success)
{
    struct webhook_event ev;
    char err[256];
    const char *body =
        "{\"id\":\"evt_123\",\"object\":\"event\",\"type\":\"payment_intent."
        "succeeded\","
        "\"created\":1700000000,\"data\":{\"object\":{\"id\":\"pi_9\",\"object\":"
        "\"payment_intent\",\"status\":\"succeeded\",\"amount\":1999,\"currency\":"
        "\"eur\","
        "\"metadata\":{\"payment_attempt_id\":\"6960B56E-87D0-4FDF-8C2C-5B56B0E1F2CF\"}"
        "}}}";
    ck_assert_int_eq(parse(body, &ev, err), 0);
    ck_assert_str_eq(ev.id, "evt_123");
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_SUCCEEDED);
    ck_assert_int_eq(ev.created, 1700000000);
    ck_assert_str_eq(ev.intent_id, "pi_9");
    ck_assert_int_eq(ev.amount, 1999);
    ck_assert_str_eq(ev.currency, "EUR");
    ck_assert_str_eq(ev.attempt_id, ATT); /* canonical, lower case */
}
END_TEST

START_TEST(parses_a_failure_with_its_code)
{
    struct webhook_event ev;
    char err[256];
    const char *body =
        "{\"id\":\"evt_f\",\"type\":\"payment_intent.payment_failed\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_f\",\"status\":\"requires_payment_method\","
        "\"last_payment_error\":{\"code\":\"card_declined\",\"decline_code\":"
        "\"insufficient_funds\"},\"metadata\":{\"payment_attempt_id\":\"not-a-uuid\"}}}"
        "}";
    ck_assert_int_eq(parse(body, &ev, err), 0);
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_FAILED);
    ck_assert_str_eq(ev.decline_code, "insufficient_funds");
    ck_assert_str_eq(ev.attempt_id, ""); /* not a uuid: matched by intent */
    ck_assert_int_eq(ev.amount, -1);
}
END_TEST

START_TEST(refuses_bad_shapes)
{
    struct webhook_event ev;
    char err[256];
    const char *bad[] = {
        "",
        "null",
        "[1]",
        "{\"id\":\"evt_1\"}",
        "{\"id\":\"evt 1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{}}}",
        "{\"id\":\"evt_1\",\"id\":\"evt_2\",\"type\":\"x\",\"created\":1,\"data\":{"
        "\"object\":{}}}",
        "{\"id\":\"evt_1\",\"type\":\"x\",\"created\":-1,\"data\":{\"object\":{}}}",
        "{\"id\":\"evt_1\",\"type\":\"x\",\"created\":\"1\",\"data\":{\"object\":{}}}",
        "{\"id\":\"evt_1\",\"type\":\"x\",\"created\":1,\"data\":{}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"processing\"}}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"succeeded\",\"amount\":"
        "\"5\"}}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"succeeded\",\"currency\":"
        "\"e\"}}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"object\":\"charge\",\"status\":"
        "\"succeeded\"}}}",
        "{\"id\":\"evt_\\u0000\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{}}"
        "}",
        "{\"id\":\"evt_\xc3\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{}}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        ck_assert_msg(parse(bad[i], &ev, err) == -1, "accepted bad body %zu", i);
        ck_assert_msg(err[0] != '\0', "no reason for bad body %zu", i);
    }
    /* An id longer than we keep is refused, never cut. */
    char body[1200] = "{\"id\":\"evt_";
    memset(body + strlen(body), 'a', 600);
    strcpy(body + 11 + 600,
           "\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{}}}");
    ck_assert_int_eq(parse(body, &ev, err), -1);
}
END_TEST

/* One row of the table: evidence x status x (another charge?) x (event
 * newer than the attempt's last change?) -> action and new status. */
struct row {
    enum webhook_evidence e;
    enum attempt_status from;
    int other, newer;
    enum webhook_action action;
    enum attempt_status to;
};

#define S_(x)  ATTEMPT_STATUS_##x
#define EV(x)  WEBHOOK_EVIDENCE_##x
#define ACT(x) WEBHOOK_##x

static const struct row table[] = {
    {EV(SUCCEEDED), S_(PROCESSING), 0, 1, ACT(APPLY), S_(SUCCEEDED)},
    {EV(SUCCEEDED), S_(UNKNOWN), 0, 1, ACT(APPLY), S_(SUCCEEDED)},
    {EV(SUCCEEDED), S_(SUCCEEDED), 0, 1, ACT(IGNORE), S_(SUCCEEDED)},
    {EV(SUCCEEDED), S_(FAILED), 0, 0, ACT(REVIEW), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(FAILED), 0, 1, ACT(REVIEW), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(REQUIRES_REVIEW), 0, 1, ACT(IGNORE), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(PENDING), 0, 1, ACT(IGNORE), S_(PENDING)},
    {EV(SUCCEEDED), S_(REJECTED), 0, 1, ACT(FLAG), S_(REJECTED)},
    {EV(SUCCEEDED), S_(PROCESSING), 1, 1, ACT(REVIEW), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(UNKNOWN), 1, 1, ACT(REVIEW), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(SUCCEEDED), 1, 1, ACT(REVIEW), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(REQUIRES_REVIEW), 1, 1, ACT(IGNORE), S_(REQUIRES_REVIEW)},
    {EV(SUCCEEDED), S_(PENDING), 1, 1, ACT(FLAG), S_(PENDING)},
    {EV(FAILED), S_(PROCESSING), 0, 1, ACT(APPLY), S_(FAILED)},
    {EV(FAILED), S_(UNKNOWN), 0, 1, ACT(APPLY), S_(FAILED)},
    {EV(FAILED), S_(SUCCEEDED), 0, 1, ACT(REVIEW), S_(REQUIRES_REVIEW)},
    {EV(FAILED), S_(SUCCEEDED), 0, 0, ACT(IGNORE), S_(SUCCEEDED)},
    {EV(FAILED), S_(FAILED), 0, 1, ACT(IGNORE), S_(FAILED)},
    {EV(FAILED), S_(UNKNOWN), 1, 1, ACT(IGNORE), S_(UNKNOWN)},
    {EV(FAILED), S_(PENDING), 0, 1, ACT(IGNORE), S_(PENDING)},
    {EV(PROCESSING), S_(UNKNOWN), 0, 1, ACT(APPLY), S_(PROCESSING)},
    {EV(PROCESSING), S_(PROCESSING), 0, 1, ACT(IGNORE), S_(PROCESSING)},
    {EV(PROCESSING), S_(SUCCEEDED), 0, 0, ACT(IGNORE), S_(SUCCEEDED)},
    {EV(PROCESSING), S_(FAILED), 0, 0, ACT(IGNORE), S_(FAILED)},
    {EV(PROCESSING), S_(UNKNOWN), 1, 1, ACT(IGNORE), S_(UNKNOWN)},
    {EV(NONE), S_(UNKNOWN), 0, 1, ACT(IGNORE), S_(UNKNOWN)},
};

START_TEST(decision_table)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        const struct row *r = &table[i];
        struct webhook_event ev = {.evidence = r->e,
                                   .amount = 1999,
                                   .currency = "EUR",
                                   .created = r->newer ? 2000 : 1000};
        strcpy(ev.intent_id, r->other ? "pi_other" : "pi_ours");
        struct webhook_attempt a = {
            .status = r->from, .amount = 1999, .currency = "EUR", .updated_at = 1500};
        strcpy(a.provider_payment_id, r->from == S_(PENDING) ? "" : "pi_ours");
        if (r->from == S_(PENDING) && r->other)
            a.intent_booked_elsewhere = 1;
        struct webhook_decision d;
        webhook_event_decide(&ev, &a, &d);
        ck_assert_msg(d.action == r->action, "row %zu: action %s, want %s", i,
                      webhook_action_name(d.action), webhook_action_name(r->action));
        if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW) {
            ck_assert_msg(d.status == r->to, "row %zu: status %s, want %s", i,
                          attempt_status_name(d.status), attempt_status_name(r->to));
            ck_assert_msg(attempt_status_transition_allowed((int)r->from, d.status),
                          "row %zu: the decision is not an allowed transition", i);
        }
        ck_assert_msg(d.reason && *d.reason, "row %zu: no reason", i);
    }
}
END_TEST

START_TEST(another_amount_or_currency_is_another_charge)
{
    struct webhook_event ev = {
        .evidence = WEBHOOK_EVIDENCE_SUCCEEDED, .amount = 2000, .currency = "EUR"};
    strcpy(ev.intent_id, "pi_ours");
    struct webhook_attempt a = {
        .status = ATTEMPT_STATUS_UNKNOWN, .amount = 1999, .currency = "EUR"};
    strcpy(a.provider_payment_id, "pi_ours");
    struct webhook_decision d;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
    ev.amount = 1999;
    strcpy(ev.currency, "USD");
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
    /* No intent known yet (the call's answer was lost): ours, by metadata. */
    strcpy(ev.currency, "EUR");
    a.provider_payment_id[0] = '\0';
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_APPLY);
    /* Booked already for another attempt: never booked twice. */
    a.intent_booked_elsewhere = 1;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("webhook_event");
    TCase *tc = tcase_create("webhook_event");
    tcase_add_test(tc, parses_a_success);
    tcase_add_test(tc, parses_a_failure_with_its_code);
    tcase_add_test(tc, refuses_bad_shapes);
    tcase_add_test(tc, decision_table);
    tcase_add_test(tc, another_amount_or_currency_is_another_charge);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
