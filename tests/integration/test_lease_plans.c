/* The lease statements (internal/lease_sql.h) at the size the worker runs
 * them: thousands of leases over a table of many settled attempts. The
 * planner knows the size of no CTE; a join of two of them that it guessed
 * small was a nested loop that rescanned one CTE for every row of the other
 * (5,000 leases: 25 million rows read, 11 s). Counted here, not timed: the
 * rows the plan's CTE scans read, from EXPLAIN ANALYZE, must grow with the
 * number of leases, not with its square. */
#include <check.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "lease_sql.h"
#include "test_env.h"

#define SETTLED 50000
#define LEASES  2000

static char url[1024];
static PGconn *c;

/* Rows read by every CTE Scan under `plan`: actual rows x loops. */
static double cte_rows(json_t *plan)
{
    double n = 0;
    const char *type = json_string_value(json_object_get(plan, "Node Type"));
    if (type && !strcmp(type, "CTE Scan"))
        n += json_number_value(json_object_get(plan, "Actual Rows")) *
             json_number_value(json_object_get(plan, "Actual Loops"));
    size_t i;
    json_t *child;
    json_array_foreach(json_object_get(plan, "Plans"), i, child) n += cte_rows(child);
    return n;
}

/* The one column of query q's rows as an array literal in *out (freed by
 * the caller). */
static void array_of(PGconn *conn, const char *q, char **out)
{
    struct charged_error err;
    PGresult *r = db_exec(conn, q, 0, NULL, &err);
    ck_assert_msg(r != NULL, "%s", err.message);
    size_t cap = 2 + (size_t)PQntuples(r) * 40, len = 0;
    char *s = malloc(cap);
    ck_assert_ptr_nonnull(s);
    s[len++] = '{';
    for (int i = 0; i < PQntuples(r); i++)
        len += (size_t)snprintf(s + len, cap - len, "%s%s", i ? "," : "",
                                PQgetvalue(r, i, 0));
    snprintf(s + len, cap - len, "}");
    PQclear(r);
    *out = s;
}

/* The rows that statement `sql` read in CTE scans, run on our leases with
 * EXPLAIN ANALYZE (in a transaction rolled back: the table stays as it is). */
static double cte_rows_of(const char *sql, int with_lease_ms)
{
    char *explain = NULL;
    ck_assert_int_ge(asprintf(&explain, "EXPLAIN (ANALYZE, FORMAT JSON) %s", sql), 0);
    struct charged_error err;
    char *sorted = NULL, *epochs = NULL;
    array_of(c, "SELECT id FROM payment_attempts WHERE lease_owner = 'w1' ORDER BY id",
             &sorted);
    array_of(
        c,
        "SELECT lease_epoch FROM payment_attempts WHERE lease_owner = 'w1' ORDER BY id",
        &epochs);
    const char *p4[] = {sorted, epochs, "60000", "w1"};
    const char *p3[] = {sorted, epochs, "w1"};
    test_env_sql(c, "BEGIN", 0, NULL);
    PGresult *r =
        db_exec(c, explain, with_lease_ms ? 4 : 3, with_lease_ms ? p4 : p3, &err);
    ck_assert_msg(r != NULL, "%s", err.message);
    json_error_t jerr;
    json_t *doc = json_loads(PQgetvalue(r, 0, 0), 0, &jerr);
    ck_assert_msg(doc != NULL, "%s", jerr.text);
    double n = cte_rows(json_object_get(json_array_get(doc, 0), "Plan"));
    json_decref(doc);
    PQclear(r);
    test_env_sql(c, "ROLLBACK", 0, NULL);
    free(explain);
    free(sorted);
    free(epochs);
    return n;
}

static void setup(void)
{
    test_env_migrated_database(url, sizeof(url));
    c = test_env_connect(url);
    char q[1024];
    /* Settled history, and our leases: lease_owner looks rare to the
     * planner, as on any real table. */
    snprintf(q, sizeof(q),
             "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
             " request_fingerprint, amount, currency, payment_method, status, reason,"
             " lease_owner, lease_expires_at, lease_epoch)"
             " SELECT gen_random_uuid(), gen_random_uuid(), 'k' || g, 'fp', 100, 'EUR',"
             " 'pm_card_visa', CASE WHEN g <= %d THEN 'PROCESSING' ELSE 'FAILED' END,"
             " 'declined', CASE WHEN g <= %d THEN 'w1' END,"
             " CASE WHEN g <= %d THEN now() + interval '1 minute' END, 1"
             " FROM generate_series(1, %d) g",
             LEASES, LEASES, LEASES, SETTLED + LEASES);
    test_env_sql(c, q, 0, NULL);
    test_env_sql(c, "ANALYZE payment_attempts", 0, NULL);
}

static void teardown(void)
{
    PQfinish(c);
}

START_TEST(renewing_leases_reads_each_lease_a_few_times)
{
    double n = cte_rows_of(SQL_LEASE_RENEW("payment_attempts"), 1);
    ck_assert_msg(n <= 8.0 * LEASES, "renew read %.0f rows in CTE scans for %d leases",
                  n, LEASES);
}
END_TEST

START_TEST(ending_leases_reads_each_lease_a_few_times)
{
    double n = cte_rows_of(SQL_LEASE_END("payment_attempts",
                                         "lease_owner = NULL, lease_expires_at = NULL"),
                           0);
    ck_assert_msg(n <= 8.0 * LEASES,
                  "hand back read %.0f rows in CTE scans for %d leases", n, LEASES);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("lease_plans");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, renewing_leases_reads_each_lease_a_few_times);
    tcase_add_test(tc, ending_leases_reads_each_lease_a_few_times);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
