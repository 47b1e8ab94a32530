/* Unit tests of worker/operations/authorize/authorize_policy's decision on
 * the provider's events about an authorization's intent: the table
 * docs/api.md ("What an authorization's event does") promises, row by
 * row. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "attempt_status.h"
#include "authorize_policy.h"
#include "test_env.h"
#include "webhook_attempts.h"
#include "webhook_event.h"

/* Issue 37: an authorization's events (authorize_event_decide).
 * Rows: evidence (HOLD: amount_capturable_updated; EXPIRY: canceled by the
 * provider, cancellation_reason automatic) x status x whose intent ->
 * action, new status, check_now. */
enum auth_evidence { HOLD, EXPIRY, DECLINE };

static const struct auth_row {
    enum auth_evidence e;
    enum attempt_status from;
    enum owner owner;
    enum webhook_action action;
    enum attempt_status to;
    int check_now;
} auth_table[] = {
    {HOLD, S_(UNKNOWN), OURS, ACT(APPLY), S_(AUTHORIZED), 0},
    {HOLD, S_(PROCESSING), OURS, ACT(APPLY), S_(AUTHORIZED), 0},
    {HOLD, S_(AUTHORIZED), OURS, ACT(IGNORE), S_(AUTHORIZED), 0}, /* a duplicate */
    {HOLD, S_(FAILED), OURS, ACT(REVIEW), S_(REQUIRES_REVIEW), 0},
    {HOLD, S_(SUCCEEDED), OURS, ACT(IGNORE), S_(SUCCEEDED), 0},
    {HOLD, S_(VOIDED), OURS, ACT(IGNORE), S_(VOIDED), 0},
    {HOLD, S_(PENDING), OURS, ACT(IGNORE), S_(PENDING), 0},
    /* Only naming the attempt: never moves it; the look's create again
     * under our key proves it, at once. */
    {HOLD, S_(UNKNOWN), UNPROVEN, ACT(IGNORE), S_(UNKNOWN), 1},
    {HOLD, S_(PROCESSING), UNPROVEN, ACT(IGNORE), S_(PROCESSING), 0},
    {HOLD, S_(UNKNOWN), ELSE, ACT(IGNORE), S_(UNKNOWN), 1},
    {HOLD, S_(AUTHORIZED), OTHER, ACT(IGNORE), S_(AUTHORIZED), 0},
    {EXPIRY, S_(AUTHORIZED), OURS, ACT(APPLY), S_(VOIDED), 0},
    {EXPIRY, S_(UNKNOWN), OURS, ACT(APPLY), S_(FAILED), 0},
    {EXPIRY, S_(VOIDED), OURS, ACT(IGNORE), S_(VOIDED), 0},
    {EXPIRY, S_(SUCCEEDED), OURS, ACT(REVIEW), S_(REQUIRES_REVIEW), 0},
    {EXPIRY, S_(AUTHORIZED), OTHER, ACT(IGNORE), S_(AUTHORIZED), 0},
    {EXPIRY, S_(AUTHORIZED), UNPROVEN, ACT(IGNORE), S_(AUTHORIZED), 0},
    /* A manual intent's decline: as a charge's. */
    {DECLINE, S_(UNKNOWN), OURS, ACT(APPLY), S_(FAILED), 0},
    {DECLINE, S_(UNKNOWN), UNPROVEN, ACT(IGNORE), S_(UNKNOWN), 1},
};

START_TEST(authorization_decision_table)
{
    for (size_t i = 0; i < sizeof(auth_table) / sizeof(auth_table[0]); i++) {
        const struct auth_row *r = &auth_table[i];
        struct webhook_event ev = {.evidence =
                                       r->e == HOLD ? EV(AUTHORIZED) : EV(FAILED),
                                   .amount = 1999,
                                   .currency = "EUR",
                                   .created = 2000,
                                   .capture_method = "manual"};
        strcpy(ev.intent_id, "pi_event");
        strcpy(ev.intent_status, r->e == HOLD     ? "requires_capture"
                                 : r->e == EXPIRY ? "canceled"
                                                  : "requires_payment_method");
        if (r->e == EXPIRY)
            strcpy(ev.cancellation_reason, "automatic");
        ck_assert_int_eq(webhook_event_is_expiry(&ev), r->e == EXPIRY);
        struct webhook_attempt a = attempt_for(r->from, r->owner);
        struct webhook_decision d;
        authorize_event_decide(&ev, &a, &d);
        ck_assert_msg(d.action == r->action, "row %zu: action %s, want %s", i,
                      webhook_action_name(d.action), webhook_action_name(r->action));
        ck_assert_msg(d.status == r->to, "row %zu: status %s, want %s", i,
                      attempt_status_name(d.status), attempt_status_name(r->to));
        ck_assert_msg(d.status == r->from ||
                          attempt_status_transition_allowed((int)r->from, d.status),
                      "row %zu: not an allowed transition", i);
        ck_assert_msg(d.check_now == r->check_now, "row %zu: check_now %d", i,
                      d.check_now);
        ck_assert_msg(d.reason && *d.reason, "row %zu: no reason", i);
    }
    /* A void's cancel (another reason) is no expiry. */
    struct webhook_event v = {.evidence = EV(FAILED), .capture_method = "manual"};
    strcpy(v.intent_status, "canceled");
    strcpy(v.cancellation_reason, "requested_by_customer");
    ck_assert(!webhook_event_is_expiry(&v));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("authorize_webhook");
    TCase *tc = tcase_create("authorize_webhook");
    tcase_add_test(tc, authorization_decision_table);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
