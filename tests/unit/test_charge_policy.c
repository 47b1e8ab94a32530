/* Unit tests of common/charge_policy: every provider outcome, with and
 * without retries left, inside and outside the key's retention window. The
 * expectations are written out here, row by row, from the contract's table
 * of provider answers, not computed from the module. */
#include <check.h>

#include "charge_policy.h"
#include "test_env.h"

static const struct charge_policy policy = {.unknown_retries = 2,
                                            .retry_base_ms = 100,
                                            .retry_max_ms = 1000,
                                            .first_look_ms = 777};

#define RETRY  1
#define SETTLE 0
#define NONE   NULL

static const struct {
    enum provider_outcome outcome;
    int retries_left; /* tries = 1 (left) or unknown_retries + 1 (none left) */
    int window_open;
    int retry;
    enum attempt_status status;
    const char *event;
    const char *reason;
    int checked; /* the reconciler looks at it later */
} cases[] = {
    {PROVIDER_SUCCEEDED, 1, 1, SETTLE, ATTEMPT_STATUS_SUCCEEDED, "charge.succeeded",
     NONE, 0},
    {PROVIDER_SUCCEEDED, 1, 0, SETTLE, ATTEMPT_STATUS_SUCCEEDED, "charge.succeeded",
     NONE, 0},
    {PROVIDER_SUCCEEDED, 0, 1, SETTLE, ATTEMPT_STATUS_SUCCEEDED, "charge.succeeded",
     NONE, 0},
    {PROVIDER_SUCCEEDED, 0, 0, SETTLE, ATTEMPT_STATUS_SUCCEEDED, "charge.succeeded",
     NONE, 0},
    {PROVIDER_PROCESSING, 1, 1, SETTLE, ATTEMPT_STATUS_PROCESSING, NONE,
     "provider_processing", 1},
    {PROVIDER_PROCESSING, 1, 0, SETTLE, ATTEMPT_STATUS_PROCESSING, NONE,
     "provider_processing", 1},
    {PROVIDER_PROCESSING, 0, 1, SETTLE, ATTEMPT_STATUS_PROCESSING, NONE,
     "provider_processing", 1},
    {PROVIDER_PROCESSING, 0, 0, SETTLE, ATTEMPT_STATUS_PROCESSING, NONE,
     "provider_processing", 1},
    {PROVIDER_DECLINED, 1, 1, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "declined", 0},
    {PROVIDER_DECLINED, 1, 0, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "declined", 0},
    {PROVIDER_DECLINED, 0, 1, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "declined", 0},
    {PROVIDER_DECLINED, 0, 0, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "declined", 0},
    /* Not executed: again for as long as the key is kept, whatever the count. */
    {PROVIDER_NOT_EXECUTED, 1, 1, RETRY, 0, NONE, NONE, 0},
    {PROVIDER_NOT_EXECUTED, 0, 1, RETRY, 0, NONE, NONE, 0},
    {PROVIDER_NOT_EXECUTED, 1, 0, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_NOT_EXECUTED, 0, 0, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    /* Unknown: again while retries are left and the key is kept; never FAILED. */
    {PROVIDER_UNKNOWN, 1, 1, RETRY, 0, NONE, NONE, 0},
    {PROVIDER_UNKNOWN, 0, 1, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_UNKNOWN, 1, 0, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_UNKNOWN, 0, 0, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_REQUIRES_REVIEW, 1, 1, SETTLE, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "charge.requires_review", "requires_review", 0},
    {PROVIDER_REQUIRES_REVIEW, 1, 0, SETTLE, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "charge.requires_review", "requires_review", 0},
    {PROVIDER_REQUIRES_REVIEW, 0, 1, SETTLE, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "charge.requires_review", "requires_review", 0},
    {PROVIDER_REQUIRES_REVIEW, 0, 0, SETTLE, ATTEMPT_STATUS_REQUIRES_REVIEW,
     "charge.requires_review", "requires_review", 0},
    {PROVIDER_INVALID, 1, 1, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "invalid_request", 0},
    {PROVIDER_INVALID, 1, 0, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "invalid_request", 0},
    {PROVIDER_INVALID, 0, 1, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "invalid_request", 0},
    {PROVIDER_INVALID, 0, 0, SETTLE, ATTEMPT_STATUS_FAILED, "charge.failed",
     "invalid_request", 0},
    {PROVIDER_NOT_FOUND, 1, 1, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_NOT_FOUND, 1, 0, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_NOT_FOUND, 0, 1, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
    {PROVIDER_NOT_FOUND, 0, 0, SETTLE, ATTEMPT_STATUS_UNKNOWN, "charge.unknown",
     "outcome_unknown", 1},
};

START_TEST(each_outcome_retries_left_and_key_window)
{
    const int i = _i;
    int tries = cases[i].retries_left ? 1 : policy.unknown_retries + 1;
    struct charge_decision d = charge_policy_decide(&policy, cases[i].outcome, tries,
                                                    cases[i].window_open, 7u);
    const char *what = provider_outcome_name(cases[i].outcome);
    ck_assert_msg(d.next == (cases[i].retry ? CHARGE_NEXT_RETRY : CHARGE_NEXT_SETTLE),
                  "%s retries_left=%d window=%d: wrong next", what,
                  cases[i].retries_left, cases[i].window_open);
    if (cases[i].retry) {
        ck_assert_int_ge(d.retry_in_ms, policy.retry_base_ms / 2);
        ck_assert_int_le(d.retry_in_ms, policy.retry_max_ms);
        return;
    }
    ck_assert_int_eq(d.status, cases[i].status);
    if (cases[i].event)
        ck_assert_pstr_eq(d.event_type, cases[i].event);
    else
        ck_assert_ptr_null(d.event_type);
    if (cases[i].reason)
        ck_assert_pstr_eq(d.reason_code, cases[i].reason);
    else
        ck_assert_ptr_null(d.reason_code);
    ck_assert_msg(d.next_check_ms == (cases[i].checked ? 777 : -1),
                  "%s: next check %lld", what, d.next_check_ms);
    /* Whatever happens, the table never makes a move the vocabulary forbids. */
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_PROCESSING, d.status));
}
END_TEST

/* A timeout or a lost answer never becomes FAILED, in any combination. */
START_TEST(unknown_is_never_failed)
{
    for (int tries = 1; tries <= 10; tries++)
        for (int w = 0; w <= 1; w++) {
            struct charge_decision d = charge_policy_decide(&policy, PROVIDER_UNKNOWN,
                                                            tries, w, (unsigned)tries);
            ck_assert(d.next == CHARGE_NEXT_RETRY ||
                      d.status == ATTEMPT_STATUS_UNKNOWN);
        }
}
END_TEST

START_TEST(backoff_doubles_to_the_cap_with_jitter)
{
    for (unsigned j = 0; j < 50; j++) {
        ck_assert_int_ge(charge_policy_backoff_ms(&policy, 1, j), 50);
        ck_assert_int_le(charge_policy_backoff_ms(&policy, 1, j), 100);
        ck_assert_int_ge(charge_policy_backoff_ms(&policy, 3, j), 200);
        ck_assert_int_le(charge_policy_backoff_ms(&policy, 3, j), 400);
        ck_assert_int_ge(charge_policy_backoff_ms(&policy, 30, j), 500);
        ck_assert_int_le(charge_policy_backoff_ms(&policy, 30, j), 1000);
    }
    /* Jitter spreads attempts apart. */
    ck_assert_int_ne(charge_policy_backoff_ms(&policy, 5, 1),
                     charge_policy_backoff_ms(&policy, 5, 2));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("charge_policy");
    TCase *tc = tcase_create("charge_policy");
    tcase_add_loop_test(tc, each_outcome_retries_left_and_key_window, 0,
                        sizeof(cases) / sizeof(cases[0]));
    tcase_add_test(tc, unknown_is_never_failed);
    tcase_add_test(tc, backoff_doubles_to_the_cap_with_jitter);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
