/* common/store/console_store against the real PostgreSQL of the local
 * stack, each test in a database of its own: a token made signs in and its
 * session is found; a wrong or malformed secret or session is NOT_FOUND; a
 * revocation refuses the token's session at once and every later sign-in;
 * an expired session is NOT_FOUND and removed by the next sign-in; a name
 * is unique among live tokens only; no table holds a secret or a session
 * id; the action log round-trips, newest first; the overview's counts. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "console_store.h"
#include "db.h"
#include "test_env.h"

static struct charged_error err;
static char url[1024];
static PGconn *admin;
static console_store_t *st;

static void setup(void)
{
    test_env_migrated_database(url, sizeof(url));
    admin = test_env_connect(url);
    st = console_store_new(url, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
}

static void teardown(void)
{
    console_store_free(st);
    PQfinish(admin);
}

static int count(const char *q, const char *arg)
{
    const char *p[1] = {arg};
    PGresult *r = PQexecParams(admin, q, arg ? 1 : 0, NULL, p, NULL, NULL, 0);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQerrorMessage(admin));
    int n = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

static void add(const char *name, enum console_role role,
                char secret[CONSOLE_SECRET_SIZE])
{
    ck_assert_msg(console_store_token_add(st, name, role, "tester", secret, &err) ==
                      CHARGED_OK,
                  "%s", err.message);
}

static void login(const char *secret, char session[CONSOLE_SECRET_SIZE],
                  struct console_who *who)
{
    ck_assert_msg(console_store_login(st, secret, 3600, session, who, &err) ==
                      CHARGED_OK,
                  "%s", err.message);
}

START_TEST(token_signs_in_and_its_session_is_found)
{
    char secret[CONSOLE_SECRET_SIZE], session[CONSOLE_SECRET_SIZE];
    struct console_who who, again;
    add("alice", CONSOLE_ROLE_OPERATOR, secret);
    ck_assert_int_eq(strlen(secret), 47);
    ck_assert(!strncmp(secret, "cct_", 4));
    ck_assert_int_eq(strspn(secret + 4,
                            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                            "0123456789-_"),
                     43);
    ck_assert_int_eq(
        count("SELECT count(*) FROM console_tokens WHERE last_used_at IS NULL", NULL),
        1);

    login(secret, session, &who);
    ck_assert_str_eq(who.name, "alice");
    ck_assert_int_eq(who.role, CONSOLE_ROLE_OPERATOR);
    ck_assert_int_eq(strlen(who.csrf), 43);
    ck_assert_int_eq(strlen(session), 47);
    ck_assert_int_eq(
        count("SELECT count(*) FROM console_tokens WHERE last_used_at IS NULL", NULL),
        0);

    ck_assert_msg(console_store_session(st, session, &again, &err) == CHARGED_OK, "%s",
                  err.message);
    ck_assert_str_eq(again.name, "alice");
    ck_assert_int_eq(again.role, CONSOLE_ROLE_OPERATOR);
    ck_assert_str_eq(again.csrf, who.csrf);

    /* Each sign-in is a session of its own, with its own CSRF token. */
    char second[CONSOLE_SECRET_SIZE];
    struct console_who who2;
    login(secret, second, &who2);
    ck_assert_str_ne(second, session);
    ck_assert_str_ne(who2.csrf, who.csrf);

    /* Signing out ends that session only; twice is fine. */
    ck_assert_int_eq(console_store_logout(st, session, &err), CHARGED_OK);
    ck_assert_int_eq(console_store_logout(st, session, &err), CHARGED_OK);
    ck_assert_int_eq(console_store_session(st, session, &again, &err),
                     CHARGED_NOT_FOUND);
    ck_assert_int_eq(console_store_session(st, second, &again, &err), CHARGED_OK);
    ck_assert_int_eq(console_store_logout(st, "junk", &err), CHARGED_OK);

    char viewer[CONSOLE_SECRET_SIZE];
    add("bob", CONSOLE_ROLE_VIEWER, viewer);
    login(viewer, session, &who);
    ck_assert_str_eq(who.name, "bob");
    ck_assert_int_eq(who.role, CONSOLE_ROLE_VIEWER);
}
END_TEST

START_TEST(wrong_or_malformed_secrets_are_not_found)
{
    char secret[CONSOLE_SECRET_SIZE], session[CONSOLE_SECRET_SIZE], bad[64];
    struct console_who who;
    add("alice", CONSOLE_ROLE_VIEWER, secret);

    /* Well formed, but no token's. */
    snprintf(bad, sizeof(bad), "%s", secret);
    bad[10] = bad[10] == 'A' ? 'B' : 'A';
    const char *wrong[] = {bad,
                           "",
                           "cct_",
                           "cct_short",
                           "xyz_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                           "cct_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA'",
                           "cct_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                           "cct_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
                           "cct_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA\xc3",
                           "' OR 1=1 --"};
    for (size_t i = 0; i < sizeof(wrong) / sizeof(wrong[0]); i++) {
        ck_assert_msg(console_store_login(st, wrong[i], 60, session, &who, &err) ==
                          CHARGED_NOT_FOUND,
                      "login with case %zu: %s", i, err.message);
        ck_assert_str_eq(err.code, "");
        ck_assert_str_eq(session, "");
    }
    ck_assert_int_eq(console_store_login(st, NULL, 60, session, &who, &err),
                     CHARGED_NOT_FOUND);
    ck_assert_int_eq(console_store_session(st, NULL, &who, &err), CHARGED_NOT_FOUND);
    ck_assert_int_eq(console_store_session(st, "", &who, &err), CHARGED_NOT_FOUND);
    /* A token's secret is no session id. */
    ck_assert_int_eq(console_store_session(st, secret, &who, &err), CHARGED_NOT_FOUND);
    ck_assert_int_eq(
        console_store_session(st, "ccs_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                              &who, &err),
        CHARGED_NOT_FOUND);
    ck_assert_int_eq(count("SELECT count(*) FROM console_sessions", NULL), 0);
}
END_TEST

START_TEST(revocation_ends_sessions_at_once)
{
    char secret[CONSOLE_SECRET_SIZE], session[CONSOLE_SECRET_SIZE],
        other[CONSOLE_SECRET_SIZE], other_session[CONSOLE_SECRET_SIZE];
    struct console_who who;
    add("alice", CONSOLE_ROLE_OPERATOR, secret);
    add("bob", CONSOLE_ROLE_OPERATOR, other);
    login(secret, session, &who);
    login(other, other_session, &who);

    ck_assert_msg(console_store_token_revoke(st, "alice", "admin", &err) == CHARGED_OK,
                  "%s", err.message);
    ck_assert_int_eq(console_store_session(st, session, &who, &err), CHARGED_NOT_FOUND);
    ck_assert_int_eq(console_store_login(st, secret, 60, session, &who, &err),
                     CHARGED_NOT_FOUND);
    ck_assert_int_eq(
        count("SELECT count(*) FROM console_sessions s JOIN console_tokens t"
              " ON t.id = s.token_id WHERE t.name = 'alice'",
              NULL),
        0);
    /* The other token's session stays. */
    ck_assert_int_eq(console_store_session(st, other_session, &who, &err), CHARGED_OK);
    ck_assert_str_eq(who.name, "bob");

    /* Revoked already, and never made: nothing live by that name. */
    ck_assert_int_eq(console_store_token_revoke(st, "alice", "admin", &err),
                     CHARGED_NOT_FOUND);
    ck_assert_int_eq(console_store_token_revoke(st, "nobody", "admin", &err),
                     CHARGED_NOT_FOUND);
    ck_assert_int_eq(count("SELECT count(*) FROM console_actions WHERE action ="
                           " 'token_revoke' AND actor = 'admin' AND target = 'alice'"
                           " AND outcome = 'ok' AND detail->>'sessions_ended' = '1'",
                           NULL),
                     1);
    ck_assert_int_eq(count("SELECT count(*) FROM console_actions WHERE action ="
                           " 'token_revoke' AND outcome = 'not_found'",
                           NULL),
                     2);
}
END_TEST

/* A session whose time ran out is refused, and the next sign-in removes it. */
START_TEST(expired_session_is_not_found)
{
    char secret[CONSOLE_SECRET_SIZE], session[CONSOLE_SECRET_SIZE],
        fresh[CONSOLE_SECRET_SIZE];
    struct console_who who;
    add("alice", CONSOLE_ROLE_VIEWER, secret);
    ck_assert_int_eq(console_store_login(st, secret, 0, session, &who, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_store_login(st, secret, 1, session, &who, &err),
                     CHARGED_OK);

    /* ttl 1 s: wait for the database's clock to pass it. */
    long long deadline = test_env_deadline(10000);
    enum charged_rc rc;
    while ((rc = console_store_session(st, session, &who, &err)) == CHARGED_OK &&
           test_env_now_ms() < deadline)
        test_env_sql(admin, "SELECT pg_sleep(0.1)", 0, NULL);
    ck_assert_int_eq(rc, CHARGED_NOT_FOUND);

    /* The next sign-in removed it; one expired by hand goes likewise. */
    login(secret, fresh, &who);
    ck_assert_int_eq(count("SELECT count(*) FROM console_sessions", NULL), 1);
    test_env_sql(admin,
                 "UPDATE console_sessions SET expires_at = now() - interval '1 s'", 0,
                 NULL);
    ck_assert_int_eq(console_store_session(st, fresh, &who, &err), CHARGED_NOT_FOUND);
    login(secret, session, &who);
    ck_assert_int_eq(count("SELECT count(*) FROM console_sessions", NULL), 1);
    ck_assert_int_eq(
        count("SELECT count(*) FROM console_sessions WHERE expires_at <= now()", NULL),
        0);
    ck_assert_int_eq(console_store_session(st, session, &who, &err), CHARGED_OK);
}
END_TEST

START_TEST(name_is_unique_among_live_tokens)
{
    char a[CONSOLE_SECRET_SIZE], b[CONSOLE_SECRET_SIZE], session[CONSOLE_SECRET_SIZE];
    struct console_who who;
    add("alice", CONSOLE_ROLE_VIEWER, a);
    ck_assert_int_eq(
        console_store_token_add(st, "alice", CONSOLE_ROLE_OPERATOR, "tester", b, &err),
        CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(err.message, "alice") != NULL, "%s", err.message);
    ck_assert_str_eq(b, "");
    ck_assert_int_eq(count("SELECT count(*) FROM console_tokens", NULL), 1);
    ck_assert_int_eq(count("SELECT count(*) FROM console_actions WHERE action = "
                           "'token_add' AND outcome = 'refused'",
                           NULL),
                     1);

    ck_assert_int_eq(console_store_token_revoke(st, "alice", "tester", &err),
                     CHARGED_OK);
    add("alice", CONSOLE_ROLE_OPERATOR, b);
    ck_assert_int_eq(console_store_login(st, a, 60, session, &who, &err),
                     CHARGED_NOT_FOUND);
    login(b, session, &who);
    ck_assert_int_eq(who.role, CONSOLE_ROLE_OPERATOR);

    /* Bad names: none is written. */
    char long_name[CONSOLE_TOKEN_MAX_NAME + 2];
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[sizeof(long_name) - 1] = '\0';
    const char *bad[] = {"", "two\nlines", "tab\there", "\xff\xfe", long_name};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_int_eq(
            console_store_token_add(st, bad[i], CONSOLE_ROLE_VIEWER, "tester", b, &err),
            CHARGED_BAD_ITEM);
    ck_assert_int_eq(
        console_store_token_add(st, NULL, CONSOLE_ROLE_VIEWER, "tester", b, &err),
        CHARGED_BAD_ITEM);
    ck_assert_int_eq(
        console_store_token_add(st, "carol", (enum console_role)7, "tester", b, &err),
        CHARGED_BAD_ITEM);
    long_name[CONSOLE_TOKEN_MAX_NAME] = '\0';
    add(long_name, CONSOLE_ROLE_VIEWER, b);
    ck_assert_int_eq(count("SELECT count(*) FROM console_tokens", NULL), 3);

    json_t *list = NULL;
    ck_assert_int_eq(console_store_token_list(st, &list, &err), CHARGED_OK);
    ck_assert_int_eq(json_array_size(list), 3);
    /* Newest first; the revoked one last, with its time. */
    json_t *old = json_array_get(list, 2);
    ck_assert_str_eq(json_string_value(json_object_get(old, "name")), "alice");
    ck_assert_str_eq(json_string_value(json_object_get(old, "role")), "viewer");
    ck_assert_str_eq(json_string_value(json_object_get(old, "created_by")), "tester");
    ck_assert(json_is_string(json_object_get(old, "revoked_at")));
    ck_assert(json_is_string(json_object_get(old, "last_used_at")) == 0);
    json_t *live = json_array_get(list, 1);
    ck_assert_str_eq(json_string_value(json_object_get(live, "role")), "operator");
    ck_assert(json_is_null(json_object_get(live, "revoked_at")));
    ck_assert(json_is_string(json_object_get(live, "last_used_at")));
    const char *at = json_string_value(json_object_get(live, "created_at"));
    ck_assert_msg(at && strlen(at) == 24 && at[10] == 'T' && at[23] == 'Z', "%s", at);
    ck_assert(json_object_get(live, "token_sha256") == NULL);
    json_decref(list);
}
END_TEST

/* Neither a token's secret nor a session id is in any table, as text or
 * as part of one; what is kept is their SHA-256. */
START_TEST(no_table_holds_a_secret)
{
    char secret[CONSOLE_SECRET_SIZE], session[CONSOLE_SECRET_SIZE];
    struct console_who who;
    add("alice", CONSOLE_ROLE_OPERATOR, secret);
    login(secret, session, &who);
    ck_assert_int_eq(console_store_record(st, "alice", "login", NULL, "ok", NULL, &err),
                     CHARGED_OK);
    const char *tables[] = {"console_tokens", "console_sessions", "console_actions"};
    char q[256];
    for (size_t i = 0; i < 3; i++) {
        snprintf(q, sizeof(q),
                 "SELECT count(*) FROM %s x WHERE strpos(x::text, $1) > 0", tables[i]);
        ck_assert_msg(count(q, secret) == 0, "%s holds the secret", tables[i]);
        ck_assert_msg(count(q, secret + 4) == 0, "%s holds the secret", tables[i]);
        ck_assert_msg(count(q, session) == 0, "%s holds the session id", tables[i]);
        ck_assert_msg(count(q, session + 4) == 0, "%s holds the session id", tables[i]);
    }
    ck_assert_int_eq(count("SELECT count(*) FROM console_tokens WHERE token_sha256 ="
                           " encode(sha256(convert_to($1, 'UTF8')), 'hex')",
                           secret),
                     1);
    ck_assert_int_eq(
        count("SELECT count(*) FROM console_sessions WHERE session_sha256 ="
              " encode(sha256(convert_to($1, 'UTF8')), 'hex')",
              session),
        1);
}
END_TEST

START_TEST(actions_round_trip_newest_first)
{
    json_t *list = NULL;
    ck_assert_int_eq(console_store_actions(st, 10, &list, &err), CHARGED_OK);
    ck_assert_int_eq(json_array_size(list), 0);
    json_decref(list);

    ck_assert_msg(console_store_record(st, "alice", "resolve", "attempt-1", "ok",
                                       "{\"status\": \"SUCCEEDED\"}",
                                       &err) == CHARGED_OK,
                  "%s", err.message);
    ck_assert_int_eq(
        console_store_record(st, "bob", "replay", NULL, "refused", NULL, &err),
        CHARGED_OK);
    ck_assert_int_eq(console_store_record(st, "carol", "login", NULL, "ok", "{}", &err),
                     CHARGED_OK);
    /* Not JSON, not an object, and missing what every action has. */
    ck_assert_int_eq(console_store_record(st, "x", "y", NULL, "ok", "{nope", &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_store_record(st, "x", "y", NULL, "ok", "[1]", &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_store_record(st, NULL, "y", NULL, "ok", NULL, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_store_record(st, "x", "y", NULL, NULL, NULL, &err),
                     CHARGED_BAD_ITEM);

    ck_assert_int_eq(console_store_actions(st, 0, &list, &err), CHARGED_BAD_ITEM);
    ck_assert_int_eq(console_store_actions(st, 2, &list, &err), CHARGED_OK);
    ck_assert_int_eq(json_array_size(list), 2);
    json_t *a = json_array_get(list, 0), *b = json_array_get(list, 1);
    ck_assert_str_eq(json_string_value(json_object_get(a, "actor")), "carol");
    ck_assert_str_eq(json_string_value(json_object_get(b, "actor")), "bob");
    ck_assert_str_eq(json_string_value(json_object_get(b, "action")), "replay");
    ck_assert_str_eq(json_string_value(json_object_get(b, "outcome")), "refused");
    ck_assert(json_is_null(json_object_get(b, "target")));
    ck_assert(json_is_object(json_object_get(b, "detail")));
    ck_assert_int_eq(json_object_size(json_object_get(b, "detail")), 0);
    ck_assert(json_is_string(json_object_get(b, "at")));
    json_decref(list);

    ck_assert_int_eq(console_store_actions(st, 100, &list, &err), CHARGED_OK);
    ck_assert_int_eq(json_array_size(list), 3);
    json_t *c = json_array_get(list, 2);
    ck_assert_str_eq(json_string_value(json_object_get(c, "target")), "attempt-1");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(c, "detail"), "status")),
        "SUCCEEDED");
    json_decref(list);

    /* A token's making is logged with who made it, and its role. */
    char secret[CONSOLE_SECRET_SIZE];
    add("dave", CONSOLE_ROLE_VIEWER, secret);
    ck_assert_int_eq(console_store_actions(st, 1, &list, &err), CHARGED_OK);
    a = json_array_get(list, 0);
    ck_assert_str_eq(json_string_value(json_object_get(a, "action")), "token_add");
    ck_assert_str_eq(json_string_value(json_object_get(a, "actor")), "tester");
    ck_assert_str_eq(json_string_value(json_object_get(a, "target")), "dave");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(a, "detail"), "role")),
        "viewer");
    json_decref(list);
}
END_TEST

START_TEST(status_counts_by_status)
{
    json_t *o = NULL;
    ck_assert_int_eq(console_store_status_counts(st, &o, &err), CHARGED_OK);
    ck_assert(json_is_object(json_object_get(o, "attempts_by_status")));
    ck_assert_int_eq(json_object_size(json_object_get(o, "attempts_by_status")), 0);
    json_decref(o);

    /* Rows as the stores leave them: the counts read status only. */
    const char *insert =
        "INSERT INTO payment_attempts (id, order_id, idempotency_key, "
        "request_fingerprint,"
        "  amount, currency, payment_method, status, provider_payment_id)"
        " SELECT gen_random_uuid(), gen_random_uuid(), 'k' || g || $1, 'fp', 100, "
        "'EUR',"
        "  'pm_card_visa', $1, CASE WHEN $1 = 'SUCCEEDED' THEN 'pi_' || g || 'x' END"
        " FROM generate_series(1, CASE $1 WHEN 'SUCCEEDED' THEN 3 ELSE 1 END) g";
    const char *statuses[] = {"SUCCEEDED", "FAILED", "REQUIRES_REVIEW"};
    for (size_t i = 0; i < 3; i++)
        test_env_sql(admin, insert, 1, &statuses[i]);

    ck_assert_msg(console_store_status_counts(st, &o, &err) == CHARGED_OK, "%s",
                  err.message);
    json_t *by = json_object_get(o, "attempts_by_status");
    ck_assert_int_eq(json_object_size(by), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(by, "SUCCEEDED")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(by, "FAILED")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(by, "REQUIRES_REVIEW")), 1);
    json_decref(o);
}
END_TEST

START_TEST(roles_by_name)
{
    ck_assert_str_eq(console_role_name(CONSOLE_ROLE_VIEWER), "viewer");
    ck_assert_str_eq(console_role_name(CONSOLE_ROLE_OPERATOR), "operator");
    ck_assert_ptr_null(console_role_name((enum console_role)9));
    ck_assert_int_eq(console_role_parse("viewer"), CONSOLE_ROLE_VIEWER);
    ck_assert_int_eq(console_role_parse("operator"), CONSOLE_ROLE_OPERATOR);
    ck_assert_int_eq(console_role_parse("admin"), -1);
    ck_assert_int_eq(console_role_parse(""), -1);
    ck_assert_int_eq(console_role_parse(NULL), -1);
    console_store_free(NULL);
}
END_TEST

/* An unreachable database is CHARGED_RETRY, and its url is not quoted. */
START_TEST(unreachable_database_is_retry)
{
    char secret[CONSOLE_SECRET_SIZE];
    console_store_t *down =
        console_store_new("postgresql://charged:pw@127.0.0.1:1/charged", &err);
    ck_assert_ptr_nonnull(down);
    ck_assert_int_eq(console_store_token_add(down, "alice", CONSOLE_ROLE_VIEWER,
                                             "tester", secret, &err),
                     CHARGED_RETRY);
    ck_assert_str_eq(secret, "");
    ck_assert(strstr(err.message, "pw") == NULL);
    json_t *o = NULL;
    ck_assert_int_eq(console_store_status_counts(down, &o, &err), CHARGED_RETRY);
    ck_assert_ptr_null(o);
    console_store_free(down);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("console_store");
    TCase *tc = tcase_create("console_store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, token_signs_in_and_its_session_is_found);
    tcase_add_test(tc, wrong_or_malformed_secrets_are_not_found);
    tcase_add_test(tc, revocation_ends_sessions_at_once);
    tcase_add_test(tc, expired_session_is_not_found);
    tcase_add_test(tc, name_is_unique_among_live_tokens);
    tcase_add_test(tc, no_table_holds_a_secret);
    tcase_add_test(tc, actions_round_trip_newest_first);
    tcase_add_test(tc, status_counts_by_status);
    tcase_add_test(tc, roles_by_name);
    tcase_add_test(tc, unreachable_database_is_retry);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
