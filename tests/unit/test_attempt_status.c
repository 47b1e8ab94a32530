/* Unit tests of common/core/attempt_status: names, the live set and the allowed
 * transitions. (test_schema_migrate checks the migration against it.) */
#include <check.h>
#include <string.h>

#include "attempt_status.h"
#include "test_env.h"

START_TEST(names_round_trip)
{
    for (int i = 0; i < ATTEMPT_STATUS__COUNT; i++)
        ck_assert_int_eq(attempt_status_parse(attempt_status_name(i)), i);
    ck_assert_int_eq(attempt_status_parse("pending"), -1);
    ck_assert_int_eq(attempt_status_parse(NULL), -1);
    ck_assert_ptr_null(attempt_status_name(ATTEMPT_STATUS__COUNT));
    ck_assert_str_eq(ATTEMPT_SQL(REQUIRES_REVIEW), "'REQUIRES_REVIEW'");
}
END_TEST

START_TEST(live_set)
{
    ck_assert_str_eq(attempt_status_live_array(),
                     "{PENDING,PROCESSING,UNKNOWN,SUCCEEDED,REQUIRES_REVIEW}");
    ck_assert(!attempt_status_is_live(ATTEMPT_STATUS_FAILED));
    ck_assert(!attempt_status_is_live(ATTEMPT_STATUS_REJECTED));
}
END_TEST

START_TEST(transitions)
{
    /* A new attempt is recorded or refused before any call. */
    ck_assert(attempt_status_transition_allowed(-1, ATTEMPT_STATUS_PENDING));
    ck_assert(attempt_status_transition_allowed(-1, ATTEMPT_STATUS_REJECTED));
    ck_assert(attempt_status_transition_allowed(-1, ATTEMPT_STATUS_PROCESSING));
    ck_assert(!attempt_status_transition_allowed(-1, ATTEMPT_STATUS_SUCCEEDED));
    /* Only a claim leads to the provider. */
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_PENDING,
                                                ATTEMPT_STATUS_PROCESSING));
    ck_assert(!attempt_status_transition_allowed(ATTEMPT_STATUS_PENDING,
                                                 ATTEMPT_STATUS_SUCCEEDED));
    /* A refund's claim refuses one whose charge is not refundable. */
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_PENDING,
                                                ATTEMPT_STATUS_REJECTED));
    /* Settled states move only to review, and review only to a decision. */
    for (int to = 0; to < ATTEMPT_STATUS__COUNT; to++) {
        ck_assert_int_eq(
            attempt_status_transition_allowed(ATTEMPT_STATUS_SUCCEEDED, to),
            to == ATTEMPT_STATUS_REQUIRES_REVIEW);
        ck_assert_int_eq(attempt_status_transition_allowed(ATTEMPT_STATUS_FAILED, to),
                         to == ATTEMPT_STATUS_REQUIRES_REVIEW);
        ck_assert(!attempt_status_transition_allowed(ATTEMPT_STATUS_REJECTED, to));
        ck_assert_int_eq(
            attempt_status_transition_allowed(ATTEMPT_STATUS_REQUIRES_REVIEW, to),
            to == ATTEMPT_STATUS_SUCCEEDED || to == ATTEMPT_STATUS_FAILED);
    }
    /* An unknown outcome is settled by evidence, never left for FAILED by
     * default: UNKNOWN may become FAILED only on the provider's word. */
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_UNKNOWN,
                                                ATTEMPT_STATUS_SUCCEEDED));
    ck_assert(!attempt_status_transition_allowed(ATTEMPT_STATUS_UNKNOWN,
                                                 ATTEMPT_STATUS_PENDING));
    ck_assert(!attempt_status_transition_allowed(7, ATTEMPT_STATUS_PENDING));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attempt_status");
    TCase *tc = tcase_create("attempt_status");
    tcase_add_test(tc, names_round_trip);
    tcase_add_test(tc, live_set);
    tcase_add_test(tc, transitions);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
