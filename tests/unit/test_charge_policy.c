/* Unit tests of common/core/charge_policy: every provider outcome, with and
 * without retries left, inside and outside the key's retention window, and
 * what each answer counts against an attempt's tries in an outage. The
 * expectations are written out here, row by row, from the contract's table
 * of provider answers, not computed from the module. */
#include <check.h>

#include "charge_policy.h"
#include "retry_tries.h"
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
    struct answer_decision d = charge_policy_decide(&policy, cases[i].outcome, tries,
                                                    cases[i].window_open, 7u);
    const char *what = provider_outcome_name(cases[i].outcome);
    ck_assert_msg(d.next == (cases[i].retry ? ANSWER_NEXT_RETRY : ANSWER_NEXT_SETTLE),
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
            struct answer_decision d = charge_policy_decide(&policy, PROVIDER_UNKNOWN,
                                                            tries, w, (unsigned)tries);
            ck_assert(d.next == ANSWER_NEXT_RETRY ||
                      d.status == ATTEMPT_STATUS_UNKNOWN);
        }
}
END_TEST

START_TEST(backoff_doubles_to_the_cap_with_jitter)
{
    for (unsigned j = 0; j < 50; j++) {
        ck_assert_int_ge(
            retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 1, j), 50);
        ck_assert_int_le(
            retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 1, j), 100);
        ck_assert_int_ge(
            retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 3, j), 200);
        ck_assert_int_le(
            retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 3, j), 400);
        ck_assert_int_ge(
            retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 30, j), 500);
        ck_assert_int_le(
            retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 30, j), 1000);
    }
    /* Jitter spreads attempts apart. */
    ck_assert_int_ne(retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 5, 1),
                     retry_backoff_ms(policy.retry_base_ms, policy.retry_max_ms, 5, 2));
}
END_TEST

/* What one answer counts against an attempt's tries, and when a failure is
 * the outage's (the one that opened the breaker, once per attempt). Each
 * row: the counts before, the answer, the tries it returns, whether it was
 * spared, and the counts after. */
static const struct {
    struct retry_tries before;
    enum provider_outcome outcome;
    int failure, opened_breaker; /* as the breaker saw the answer */
    int tries, outage;
    struct retry_tries after;
} count_cases[] = {
    /* Answers that settle count one try, and touch no count. */
    {{0, 0, 0}, PROVIDER_SUCCEEDED, 0, 0, 1, 0, {0, 0, 0}},
    {{2, 1, 1}, PROVIDER_DECLINED, 0, 0, 1, 0, {2, 1, 1}},
    {{0, 3, 0}, PROVIDER_PROCESSING, 0, 0, 1, 0, {0, 3, 0}},
    /* Each kind counts on its own. */
    {{0, 0, 0}, PROVIDER_NOT_EXECUTED, 1, 0, 1, 0, {1, 0, 0}},
    {{1, 2, 0}, PROVIDER_NOT_EXECUTED, 1, 0, 2, 0, {2, 2, 0}},
    {{0, 0, 0}, PROVIDER_UNKNOWN, 1, 0, 1, 0, {0, 1, 0}},
    {{4, 1, 0}, PROVIDER_UNKNOWN, 1, 0, 2, 0, {4, 2, 0}},
    /* A send never made (not sent: the key window, or a start failure)
     * counts like an answer that was not executed. */
    {{0, 0, 0}, PROVIDER_NOT_EXECUTED, 0, 0, 1, 0, {1, 0, 0}},
    /* The failure that opened the breaker counts no try... */
    {{0, 0, 0}, PROVIDER_UNKNOWN, 1, 1, 0, 1, {0, 0, 1}},
    {{1, 2, 0}, PROVIDER_UNKNOWN, 1, 1, 2, 1, {1, 2, 1}},
    {{2, 0, 0}, PROVIDER_NOT_EXECUTED, 1, 1, 2, 1, {2, 0, 1}},
    /* ...once: an attempt that opens it again counts the try. */
    {{0, 0, 1}, PROVIDER_UNKNOWN, 1, 1, 1, 0, {0, 1, 1}},
    {{3, 0, 1}, PROVIDER_NOT_EXECUTED, 1, 1, 4, 0, {4, 0, 1}},
    /* An answer that opened nothing is never spared, outage or not. */
    {{0, 0, 0}, PROVIDER_UNKNOWN, 1, 0, 1, 0, {0, 1, 0}},
    /* Opening without a failure (not the answer's doing) spares nothing. */
    {{0, 0, 0}, PROVIDER_UNKNOWN, 0, 1, 1, 0, {0, 1, 0}},
};

START_TEST(each_answer_counts_its_try)
{
    struct retry_tries t = count_cases[_i].before;
    int outage = -1;
    int tries = retry_tries_count(&t, count_cases[_i].outcome, count_cases[_i].failure,
                                  count_cases[_i].opened_breaker, &outage);
    ck_assert_int_eq(tries, count_cases[_i].tries);
    ck_assert_int_eq(outage, count_cases[_i].outage);
    ck_assert_int_eq(t.not_executed, count_cases[_i].after.not_executed);
    ck_assert_int_eq(t.unknown, count_cases[_i].after.unknown);
    ck_assert_int_eq(t.rode_outage, count_cases[_i].after.rode_outage);
}
END_TEST

/* An outage's answers, in a row, for one attempt: the first failure (it
 * opened the breaker) is spared, the calls already out count, so that the
 * attempt still settles UNKNOWN once its retries are used up. */
START_TEST(an_outage_spares_one_failure_only)
{
    struct retry_tries t = {0, 0, 0};
    int outage;
    ck_assert_int_eq(retry_tries_count(&t, PROVIDER_UNKNOWN, 1, 1, &outage), 0);
    ck_assert_int_eq(outage, 1);
    struct answer_decision d = charge_policy_decide(&policy, PROVIDER_UNKNOWN, 0, 1, 7);
    ck_assert_int_eq(d.next, ANSWER_NEXT_RETRY);
    int tries = 0;
    for (int i = 0; i < policy.unknown_retries + 1; i++) {
        tries = retry_tries_count(&t, PROVIDER_UNKNOWN, 1, 1, &outage);
        ck_assert_int_eq(outage, 0);
    }
    ck_assert_int_eq(tries, policy.unknown_retries + 1);
    d = charge_policy_decide(&policy, PROVIDER_UNKNOWN, tries, 1, 7);
    ck_assert_int_eq(d.next, ANSWER_NEXT_SETTLE);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    /* NULL for outage is allowed. */
    ck_assert_int_eq(retry_tries_count(&t, PROVIDER_SUCCEEDED, 0, 0, NULL), 1);
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
    tcase_add_loop_test(tc, each_answer_counts_its_try, 0,
                        sizeof(count_cases) / sizeof(count_cases[0]));
    tcase_add_test(tc, an_outage_spares_one_failure_only);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
