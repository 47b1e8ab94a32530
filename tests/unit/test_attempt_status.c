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
    ck_assert_str_eq(
        attempt_status_live_array(),
        "{PENDING,PROCESSING,UNKNOWN,SUCCEEDED,REQUIRES_REVIEW,AUTHORIZED}");
    ck_assert(!attempt_status_is_live(ATTEMPT_STATUS_FAILED));
    ck_assert(!attempt_status_is_live(ATTEMPT_STATUS_REJECTED));
    /* Money held is the order's; money released is not. */
    ck_assert(attempt_status_is_live(ATTEMPT_STATUS_AUTHORIZED));
    ck_assert(!attempt_status_is_live(ATTEMPT_STATUS_VOIDED));
    /* Neither is sent again by the worker. */
    ck_assert(attempt_status_is_settled(ATTEMPT_STATUS_AUTHORIZED));
    ck_assert(attempt_status_is_settled(ATTEMPT_STATUS_VOIDED));
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
            to == ATTEMPT_STATUS_SUCCEEDED || to == ATTEMPT_STATUS_FAILED ||
                to == ATTEMPT_STATUS_AUTHORIZED || to == ATTEMPT_STATUS_VOIDED);
        /* An authorization is captured, voided or reviewed; a void is final
         * but for contradicting evidence. */
        ck_assert_int_eq(
            attempt_status_transition_allowed(ATTEMPT_STATUS_AUTHORIZED, to),
            to == ATTEMPT_STATUS_SUCCEEDED || to == ATTEMPT_STATUS_VOIDED ||
                to == ATTEMPT_STATUS_REQUIRES_REVIEW);
        ck_assert_int_eq(attempt_status_transition_allowed(ATTEMPT_STATUS_VOIDED, to),
                         to == ATTEMPT_STATUS_REQUIRES_REVIEW);
    }
    /* The worker settles an authorization from PROCESSING, the reconciler
     * from UNKNOWN; a new attempt is never AUTHORIZED at once. */
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_PROCESSING,
                                                ATTEMPT_STATUS_AUTHORIZED));
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_UNKNOWN,
                                                ATTEMPT_STATUS_AUTHORIZED));
    ck_assert(!attempt_status_transition_allowed(-1, ATTEMPT_STATUS_AUTHORIZED));
    /* An unknown outcome is settled by evidence, never left for FAILED by
     * default: UNKNOWN may become FAILED only on the provider's word. */
    ck_assert(attempt_status_transition_allowed(ATTEMPT_STATUS_UNKNOWN,
                                                ATTEMPT_STATUS_SUCCEEDED));
    ck_assert(!attempt_status_transition_allowed(ATTEMPT_STATUS_UNKNOWN,
                                                 ATTEMPT_STATUS_PENDING));
    ck_assert(!attempt_status_transition_allowed(ATTEMPT_STATUS__COUNT,
                                                 ATTEMPT_STATUS_PENDING));
}
END_TEST

/* An authorization publishes its own outcomes as authorization.*; what a
 * capture or a void does to it is their steps' to publish. */
START_TEST(authorization_events)
{
    ck_assert_str_eq(attempt_status_authorization_event_type(ATTEMPT_STATUS_AUTHORIZED),
                     "authorization.succeeded");
    ck_assert_str_eq(attempt_status_authorization_event_type(ATTEMPT_STATUS_FAILED),
                     "authorization.failed");
    ck_assert_str_eq(attempt_status_authorization_event_type(ATTEMPT_STATUS_UNKNOWN),
                     "authorization.unknown");
    ck_assert_str_eq(attempt_status_authorization_event_type(ATTEMPT_STATUS_REJECTED),
                     "authorization.rejected");
    ck_assert_str_eq(
        attempt_status_authorization_event_type(ATTEMPT_STATUS_REQUIRES_REVIEW),
        "authorization.requires_review");
    ck_assert_ptr_null(
        attempt_status_authorization_event_type(ATTEMPT_STATUS_SUCCEEDED));
    ck_assert_ptr_null(attempt_status_authorization_event_type(ATTEMPT_STATUS_VOIDED));
    ck_assert_ptr_null(
        attempt_status_authorization_event_type(ATTEMPT_STATUS_PROCESSING));
    /* A charge never enters the authorization's states. */
    ck_assert_ptr_null(attempt_status_event_type(ATTEMPT_STATUS_AUTHORIZED));
    ck_assert_ptr_null(attempt_status_event_type(ATTEMPT_STATUS_VOIDED));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attempt_status");
    TCase *tc = tcase_create("attempt_status");
    tcase_add_test(tc, names_round_trip);
    tcase_add_test(tc, live_set);
    tcase_add_test(tc, transitions);
    tcase_add_test(tc, authorization_events);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
