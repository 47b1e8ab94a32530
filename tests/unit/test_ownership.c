/* Unit tests of common/core/ownership: metadata never proves an object
 * ours; our recorded id or our own answer does; a refund on another
 * intent, or an object recorded for another of ours, is foreign. */
#include <check.h>
#include <string.h>

#include "ownership.h"
#include "test_env.h"

static enum ownership_verdict judge(struct ownership_claim c)
{
    char why[160];
    enum ownership_verdict v = ownership_judge(&c, why, sizeof(why));
    if (v == OWNERSHIP_OURS)
        ck_assert_str_eq(why, "");
    else
        ck_assert_int_gt((int)strlen(why), 0);
    return v;
}

START_TEST(an_object_that_only_names_us_is_unproven)
{
    struct ownership_claim c = {.object_id = "pi_theirs"};
    ck_assert_int_eq(judge(c), OWNERSHIP_UNPROVEN);
    c.recorded_id = "";
    ck_assert_int_eq(judge(c), OWNERSHIP_UNPROVEN);
}
END_TEST

START_TEST(our_recorded_id_proves_it_and_nothing_else_does)
{
    struct ownership_claim c = {.recorded_id = "pi_ours", .object_id = "pi_ours"};
    ck_assert_int_eq(judge(c), OWNERSHIP_OURS);
    /* Someone edited our own intent's metadata afterwards: still ours. */
    c.names_another = 1;
    ck_assert_int_eq(judge(c), OWNERSHIP_OURS);
    c.names_another = 0;
    c.object_id = "pi_theirs";
    ck_assert_int_eq(judge(c), OWNERSHIP_FOREIGN);
    /* An answer under our key cannot be another object than the one we
     * recorded from it: the recorded id decides. */
    c.own_answer = 1;
    ck_assert_int_eq(judge(c), OWNERSHIP_FOREIGN);
}
END_TEST

START_TEST(the_answer_under_our_key_proves_it)
{
    struct ownership_claim c = {.object_id = "pi_1", .own_answer = 1};
    ck_assert_int_eq(judge(c), OWNERSHIP_OURS);
    c.names_another = 1; /* metadata edited later: the key decides */
    ck_assert_int_eq(judge(c), OWNERSHIP_OURS);
}
END_TEST

START_TEST(recorded_for_another_of_ours_is_foreign)
{
    struct ownership_claim c = {.object_id = "pi_1", .recorded_elsewhere = 1};
    ck_assert_int_eq(judge(c), OWNERSHIP_FOREIGN);
    c.own_answer = 1;
    ck_assert_int_eq(judge(c), OWNERSHIP_FOREIGN);
}
END_TEST

START_TEST(metadata_naming_another_of_ours_is_foreign)
{
    struct ownership_claim c = {.object_id = "pi_1", .names_another = 1};
    ck_assert_int_eq(judge(c), OWNERSHIP_FOREIGN);
}
END_TEST

START_TEST(a_refund_on_another_intent_is_foreign)
{
    struct ownership_claim c = {.recorded_id = "re_1",
                                .object_id = "re_1",
                                .parent_id = "pi_ours",
                                .object_parent_id = "pi_other"};
    ck_assert_int_eq(judge(c), OWNERSHIP_FOREIGN);
    c.object_parent_id = "pi_ours";
    ck_assert_int_eq(judge(c), OWNERSHIP_OURS);
    /* Not recorded, not our answer, on our intent: it only names us. */
    c.recorded_id = NULL;
    ck_assert_int_eq(judge(c), OWNERSHIP_UNPROVEN);
    c.own_answer = 1;
    ck_assert_int_eq(judge(c), OWNERSHIP_OURS);
}
END_TEST

START_TEST(verdicts_have_names)
{
    ck_assert_str_eq(ownership_verdict_name(OWNERSHIP_OURS), "ours");
    ck_assert_str_eq(ownership_verdict_name(OWNERSHIP_UNPROVEN), "unproven");
    ck_assert_str_eq(ownership_verdict_name(OWNERSHIP_FOREIGN), "foreign");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ownership");
    TCase *tc = tcase_create("judge");
    tcase_add_test(tc, an_object_that_only_names_us_is_unproven);
    tcase_add_test(tc, our_recorded_id_proves_it_and_nothing_else_does);
    tcase_add_test(tc, the_answer_under_our_key_proves_it);
    tcase_add_test(tc, recorded_for_another_of_ours_is_foreign);
    tcase_add_test(tc, metadata_naming_another_of_ours_is_foreign);
    tcase_add_test(tc, a_refund_on_another_intent_is_foreign);
    tcase_add_test(tc, verdicts_have_names);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
