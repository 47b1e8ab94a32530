/* The settings of our statements live in their transactions, never on the
 * session (db.h): what makes charged safe behind PgBouncer in transaction
 * mode, where a server session serves another client after each
 * transaction. Against the real PostgreSQL of the local stack; the
 * session is read with PQexec (the simple protocol, which db.c does not
 * touch), as another client of that server session would see it. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "test_env.h"

static struct charged_error err;

/* What a plain client would find on the session: SHOW, sent alone. */
static char *shown(PGconn *c, const char *setting)
{
    char sql[128];
    snprintf(sql, sizeof(sql), "SHOW %s", setting);
    PGresult *r = PQexec(c, sql);
    ck_assert_msg(PQresultStatus(r) == PGRES_TUPLES_OK, "%s", PQresultErrorMessage(r));
    char *v = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static void ck_value(PGconn *c, const char *sql, const char *want)
{
    PGresult *r = db_exec(c, sql, 0, NULL, &err);
    ck_assert_msg(r != NULL, "%s", err.message);
    ck_assert_str_eq(PQgetvalue(r, 0, 0), want);
    PQclear(r);
}

#define SETTINGS                                                                       \
    "SELECT current_setting('statement_timeout') || ' ' ||"                            \
    " current_setting('lock_timeout') || ' ' ||"                                       \
    " current_setting('idle_in_transaction_session_timeout') || ' ' ||"                \
    " current_setting('TimeZone')"

START_TEST(autocommit_statement_has_them_and_the_session_not)
{
    PGconn *c = test_env_connect(test_env_database_url());
    char *before[3] = {shown(c, "statement_timeout"), shown(c, "lock_timeout"),
                       shown(c, "idle_in_transaction_session_timeout")};
    db_set_timeouts(c, "1500ms", "150ms");
    ck_value(c, SETTINGS, "1500ms 150ms 5s UTC");
    ck_assert_int_eq(PQtransactionStatus(c), PQTRANS_IDLE);
    /* Nothing left for the next client of this server session. */
    char *after[3] = {shown(c, "statement_timeout"), shown(c, "lock_timeout"),
                      shown(c, "idle_in_transaction_session_timeout")};
    for (int i = 0; i < 3; i++) {
        ck_assert_str_eq(after[i], before[i]);
        free(before[i]);
        free(after[i]);
    }
    PQfinish(c);
}
END_TEST

START_TEST(explicit_transaction_has_them_until_it_ends)
{
    PGconn *c = test_env_connect(test_env_database_url());
    char *before = shown(c, "lock_timeout");
    db_set_timeouts(c, "1500ms", "150ms");
    ck_assert_int_eq(db_run(c, "BEGIN ISOLATION LEVEL REPEATABLE READ", 0, NULL, &err),
                     CHARGED_OK);
    ck_value(c, "SELECT current_setting('transaction_isolation')", "repeatable read");
    ck_value(c, SETTINGS, "1500ms 150ms 5s UTC");
    ck_assert_int_eq(db_run(c, "COMMIT", 0, NULL, &err), CHARGED_OK);
    char *after = shown(c, "lock_timeout");
    ck_assert_str_eq(after, before);
    free(before);
    free(after);
    PQfinish(c);
}
END_TEST

/* The server's own values stay where charged sets none (chargectl's
 * sessions): an operator's ALTER ROLE ... SET is not undone. */
START_TEST(unset_timeouts_keep_the_server_s)
{
    PGconn *c = test_env_connect(test_env_database_url());
    PQclear(PQexec(c, "SET lock_timeout = '4321ms'"));
    ck_value(
        c,
        "SELECT current_setting('lock_timeout') || ' ' || current_setting('TimeZone')",
        "4321ms UTC");
    PQfinish(c);
}
END_TEST

START_TEST(statement_timeout_ends_an_autocommit_statement)
{
    PGconn *c = test_env_connect(test_env_database_url());
    db_set_timeouts(c, "200ms", NULL);
    long long t0 = test_env_now_ms();
    PGresult *r = db_exec(c, "SELECT pg_sleep(3)", 0, NULL, &err);
    ck_assert_ptr_null(r);
    ck_assert_str_eq(err.code, "57014"); /* query_canceled */
    ck_assert_int_lt(test_env_now_ms() - t0, 2000);
    /* The session is fine and idle afterwards. */
    ck_assert_int_eq(PQtransactionStatus(c), PQTRANS_IDLE);
    ck_value(c, "SELECT 'ok'", "ok");
    PQfinish(c);
}
END_TEST

START_TEST(failed_statement_reports_its_own_error)
{
    PGconn *c = test_env_connect(test_env_database_url());
    db_set_timeouts(c, "1s", "100ms");
    ck_assert_ptr_null(db_exec(c, "SELECT 1/0", 0, NULL, &err));
    ck_assert_str_eq(err.code, "22012"); /* division_by_zero */
    ck_assert_int_eq(PQtransactionStatus(c), PQTRANS_IDLE);
    ck_assert_int_eq(db_run(c, "BEGIN", 0, NULL, &err), CHARGED_OK);
    ck_assert_ptr_null(db_exec(c, "SELECT 1/0", 0, NULL, &err));
    ck_assert_int_eq(PQtransactionStatus(c), PQTRANS_INERROR);
    ck_assert_int_eq(db_run(c, "ROLLBACK", 0, NULL, &err), CHARGED_OK);
    ck_value(c, "SELECT 'ok'", "ok");
    PQfinish(c);
}
END_TEST

/* A setting the server refuses fails the statement it came with, and
 * leaves no transaction open behind a BEGIN. */
START_TEST(refused_setting_fails_the_statement_and_leaves_no_transaction)
{
    PGconn *c = test_env_connect(test_env_database_url());
    db_set_timeouts(c, "soon", NULL);
    ck_assert_int_eq(db_run(c, "BEGIN", 0, NULL, &err), CHARGED_RETRY);
    ck_assert_str_eq(err.code, "22023"); /* invalid_parameter_value */
    ck_assert_int_eq(PQtransactionStatus(c), PQTRANS_IDLE);
    ck_assert_ptr_null(db_exec(c, "SELECT 1", 0, NULL, &err));
    ck_assert_int_eq(PQtransactionStatus(c), PQTRANS_IDLE);
    db_set_timeouts(c, "1s", NULL);
    ck_value(c, "SELECT 'ok'", "ok");
    PQfinish(c);
}
END_TEST

/* db_lock_timeout_override: the transactions started while it is set
 * carry its lock_timeout whatever the session's, and the session's again
 * once it is cleared; nothing is left on the session. */
START_TEST(a_lock_timeout_override_lasts_until_cleared)
{
    PGconn *c = test_env_connect(test_env_database_url());
    db_set_timeouts(c, "1500ms", "150ms");
    db_lock_timeout_override("5ms");
    ck_value(c, SETTINGS, "1500ms 5ms 5s UTC");
    db_lock_timeout_override(NULL);
    ck_value(c, SETTINGS, "1500ms 150ms 5s UTC");
    char *lock = shown(c, "lock_timeout");
    ck_assert_str_ne(lock, "5ms");
    free(lock);
    PQfinish(c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("db_settings");
    TCase *tc = tcase_create("postgresql");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, autocommit_statement_has_them_and_the_session_not);
    tcase_add_test(tc, explicit_transaction_has_them_until_it_ends);
    tcase_add_test(tc, unset_timeouts_keep_the_server_s);
    tcase_add_test(tc, statement_timeout_ends_an_autocommit_statement);
    tcase_add_test(tc, failed_statement_reports_its_own_error);
    tcase_add_test(tc, refused_setting_fails_the_statement_and_leaves_no_transaction);
    tcase_add_test(tc, a_lock_timeout_override_lasts_until_cleared);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
