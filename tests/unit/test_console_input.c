/* Unit tests of common/core/console_input: what the console takes from a
 * request before it acts on it. */
#include <check.h>
#include <string.h>

#include "console_input.h"
#include "test_env.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"

static enum charged_rc resolve(const char *body, struct console_resolve_input *in,
                               struct charged_error *why)
{
    return console_input_resolve(body, strlen(body), ATTEMPT, in, why);
}

/* The kinds the operations' reviews name (the table's, in the console). */
static const char *const kinds[] = {"capture", "void", "authorization", NULL};

START_TEST(routes_name_their_ids)
{
    struct console_route_match m;
    ck_assert_int_eq(console_input_route("/console/", kinds, &m), CONSOLE_R_ASSET);
    ck_assert_str_eq(m.id, "index.html");
    ck_assert_int_eq(
        console_input_route(
            "/console/api/attempts/5D1C2C1E-1A9B-4B1E-8E55-000000000001/resolve", kinds,
            &m),
        CONSOLE_R_RESOLVE);
    ck_assert_str_eq(m.id, ATTEMPT); /* canonical: lower case */
    ck_assert_str_eq(m.method, "POST");
    ck_assert_int_eq(console_input_route("/console/api/attempts/" ATTEMPT, kinds, &m),
                     CONSOLE_R_ATTEMPT);
    ck_assert_str_eq(m.method, "GET");
    ck_assert_int_eq(console_input_route("/console/api/dead-letters/2:41", kinds, &m),
                     CONSOLE_R_LETTER);
    ck_assert_str_eq(m.id, "2:41");
    ck_assert_int_eq(console_input_route("/console/api/dead-letters/replay", kinds, &m),
                     CONSOLE_R_REPLAY);
    ck_assert_int_eq(
        console_input_route(
            "/console/api/steps/void/5D1C2C1E-1A9B-4B1E-8E55-000000000001/resolve",
            kinds, &m),
        CONSOLE_R_STEP_RESOLVE);
    ck_assert_str_eq(m.id, ATTEMPT);
    ck_assert_str_eq(m.kind, "void");
    ck_assert_str_eq(m.method, "POST");
    ck_assert_int_eq(console_input_route("/console/api/steps/authorization/" ATTEMPT
                                         "/resolve",
                                         kinds, &m),
                     CONSOLE_R_STEP_RESOLVE);
    ck_assert_str_eq(m.kind, "authorization");
    ck_assert_int_eq(console_input_route("/console/api/provider-limits", kinds, &m),
                     CONSOLE_R_LIMITS);
    ck_assert_str_eq(m.method, "GET");
    ck_assert_int_eq(console_input_route("/console/api/provider-limits/set", kinds, &m),
                     CONSOLE_R_LIMITS_SET);
    ck_assert_str_eq(m.method, "POST");
}
END_TEST

START_TEST(a_step_s_decision_needs_a_reason_and_a_confirmed_force)
{
    struct console_step_resolve_input in;
    struct charged_error why;
#define STEP(body) console_input_step_resolve(body, strlen(body), ATTEMPT, &in, &why)
    ck_assert_int_eq(STEP("{\"decision\": \"voided\", \"reason\": \"canceled\"}"),
                     CHARGED_OK);
    ck_assert_str_eq(in.decision, "VOIDED");
    ck_assert_int_eq(STEP("{\"decision\": \"failed\"}"), CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(why.message, "reason"), "%s", why.message);
    ck_assert_int_eq(STEP("{\"decision\": \"REFUNDED\", \"reason\": \"x\"}"),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(
        STEP("{\"decision\": \"failed\", \"reason\": \"x\", \"force\": true}"),
        CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(why.message, "confirm"), "%s", why.message);
    ck_assert_int_eq(
        STEP("{\"decision\": \"failed\", \"reason\": \"x\", \"force\": true,"
             " \"confirm\": \"" ATTEMPT "\"}"),
        CHARGED_OK);
    ck_assert_int_eq(in.force, 1);
    ck_assert_int_eq(
        STEP("{\"decision\": \"failed\", \"reason\": \"x\", \"intent\": 1}"),
        CHARGED_BAD_ITEM);
#undef STEP
}
END_TEST

static const char *const no_route[] = {
    "/",
    "/console/api/attempts/not-a-uuid",
    "/console/api/attempts/" ATTEMPT "/resolvex",
    "/console/api/dead-letters/-1:0",
    "/console/api/dead-letters/1:",
    "/console/../x",
    "/console/.hidden",
    "/console/a/b",
    "/console/api/unknown",
    "/consolex",
    "/console/api/dead-letters/2147483648:0",
    "/console/api/steps/refund/" ATTEMPT "/resolve",
    "/console/api/steps/void/" ATTEMPT,
    "/console/api/steps/void/not-a-uuid/resolve",
    "/console/api/steps/voids/" ATTEMPT "/resolve",
};

START_TEST(malformed_paths_have_no_route)
{
    struct console_route_match m;
    ck_assert_int_eq(console_input_route(no_route[_i], kinds, &m), CONSOLE_R_NONE);
}
END_TEST

START_TEST(a_decision_says_what_it_needs)
{
    struct console_resolve_input in;
    struct charged_error why;
    ck_assert_int_eq(
        resolve("{\"decision\":\"succeeded\",\"payment_intent_id\":\"pi_1\"}", &in,
                &why),
        0);
    ck_assert(!in.failed && !strcmp(in.intent_id, "pi_1") && !in.force);
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"no money moved\"}", &in, &why),
        0);
    ck_assert(in.failed && !strcmp(in.reason, "no money moved"));
    /* a succeeded decision names its intent; a failed one gives a reason */
    ck_assert_int_eq(resolve("{\"decision\":\"succeeded\"}", &in, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_ptr_nonnull(strstr(why.message, "payment_intent_id"));
    ck_assert_int_eq(resolve("{\"decision\":\"failed\"}", &in, &why), CHARGED_BAD_ITEM);
    ck_assert_ptr_nonnull(strstr(why.message, "reason"));
    ck_assert_int_eq(
        resolve(
            "{\"decision\":\"failed\",\"reason\":\"x\",\"payment_intent_id\":\"pi_1\"}",
            &in, &why),
        CHARGED_BAD_ITEM);
}
END_TEST

START_TEST(force_needs_the_attempt_id_confirmed)
{
    struct console_resolve_input in;
    struct charged_error why;
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"x\",\"force\":true}", &in, &why),
        CHARGED_BAD_ITEM);
    ck_assert_int_eq(resolve("{\"decision\":\"failed\",\"reason\":\"x\",\"force\":true,"
                             "\"confirm\":\"5d1c2c1e-1a9b-4b1e-8e55-000000000002\"}",
                             &in, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(resolve("{\"decision\":\"failed\",\"reason\":\"x\",\"force\":true,"
                             "\"confirm\":\"" ATTEMPT "\"}",
                             &in, &why),
                     0);
    ck_assert(in.force);
    /* not a boolean, misspelt, or given twice: refused, never ignored */
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"x\",\"force\":\"true\"}", &in,
                &why),
        CHARGED_BAD_ITEM);
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"x\",\"forse\":true}", &in, &why),
        CHARGED_BAD_ITEM);
    ck_assert_ptr_nonnull(strstr(why.message, "forse"));
    ck_assert_int_eq(resolve("{\"decision\":\"failed\",\"decision\":\"succeeded\","
                             "\"reason\":\"x\"}",
                             &in, &why),
                     CHARGED_BAD_ITEM);
}
END_TEST

START_TEST(reasons_are_one_line_of_utf8)
{
    struct console_resolve_input in;
    struct charged_error why;
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"a\\nb\"}", &in, &why),
        CHARGED_BAD_ITEM);
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"a\\u0000b\"}", &in, &why),
        CHARGED_BAD_ITEM);
    ck_assert_int_eq(
        resolve("{\"decision\":\"failed\",\"reason\":\"caf\\u00e9\"}", &in, &why), 0);
}
END_TEST

START_TEST(a_replay_lists_distinct_positions_and_says_whether_it_sends)
{
    struct console_replay_input in;
    struct charged_error why;
    const char *ok = "{\"positions\":[\"0:1\",\"2:41\"],\"dry_run\":true}";
    ck_assert_int_eq(console_input_replay(ok, strlen(ok), &in, &why), 0);
    ck_assert(in.n == 2 && in.dry_run && in.partition[1] == 2 && in.offset[1] == 41);
    const char *bad[] = {
        "{\"positions\":[\"0:1\",\"0:1\"],\"dry_run\":true}", /* a repeat */
        "{\"positions\":[\"0:1\"]}",                          /* dry_run left out */
        "{\"positions\":[],\"dry_run\":false}",
        "{\"positions\":[\"0:x\"],\"dry_run\":false}",
        "{\"positions\":\"0:1\",\"dry_run\":false}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_int_eq(console_input_replay(bad[i], strlen(bad[i]), &in, &why),
                         CHARGED_BAD_ITEM);
        ck_assert_uint_eq(in.n, 0);
    }
}
END_TEST

START_TEST(the_cookie_is_found_among_others)
{
    char sid[CONSOLE_SECRET_MAX];
    ck_assert_int_eq(
        console_input_cookie("a=b; charged_console=abcDEF_123-xyz; c=d", sid), 0);
    ck_assert_str_eq(sid, "abcDEF_123-xyz");
    ck_assert_int_eq(console_input_cookie("charged_consolex=abcdefghij", sid), -1);
    ck_assert_int_eq(console_input_cookie("charged_console=abc def ghij", sid), -1);
    ck_assert_int_eq(console_input_cookie("charged_console=", sid), -1);
    ck_assert_int_eq(console_input_cookie(NULL, sid), -1);
}
END_TEST

START_TEST(letter_filters_are_checked_as_chargectl_checks_them)
{
    struct console_letter_query q;
    struct charged_error why;
    memset(&q, 0, sizeof(q));
    ck_assert_int_eq(console_input_letter_param("reason", "malformed_json", &q, &why),
                     0);
    ck_assert_int_eq(console_input_letter_param("reason", "no_such", &q, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_input_letter_param("limit", "1000", &q, &why), 0);
    ck_assert_int_eq(q.limit, 1000);
    ck_assert_int_eq(console_input_letter_param("limit", "1001", &q, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_input_letter_param("limit", "0", &q, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_input_letter_param("attempt", "x", &q, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_input_letter_param("since", "2h", &q, &why), 0);
    ck_assert_int_eq(console_input_letter_param("since", "<script>", &q, &why),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_input_letter_param("other", "1", &q, &why),
                     CHARGED_BAD_ITEM);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("console_input");
    TCase *tc = tcase_create("console_input");
    tcase_add_test(tc, routes_name_their_ids);
    tcase_add_loop_test(tc, malformed_paths_have_no_route, 0,
                        sizeof(no_route) / sizeof(no_route[0]));
    tcase_add_test(tc, a_decision_says_what_it_needs);
    tcase_add_test(tc, force_needs_the_attempt_id_confirmed);
    tcase_add_test(tc, a_step_s_decision_needs_a_reason_and_a_confirmed_force);
    tcase_add_test(tc, reasons_are_one_line_of_utf8);
    tcase_add_test(tc, a_replay_lists_distinct_positions_and_says_whether_it_sends);
    tcase_add_test(tc, the_cookie_is_found_among_others);
    tcase_add_test(tc, letter_filters_are_checked_as_chargectl_checks_them);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
