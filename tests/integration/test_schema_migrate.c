/* Migrations and schema against the real PostgreSQL of the local stack:
 * idempotent and concurrent migrate, refusal of a changed file, and the
 * constraints that carry the idempotency guarantees. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attempt_status.h"
#include "db.h"
#include "migrate.h"
#include "test_env.h"

static struct charged_error err;
static struct charged_error db_err;

static int count_rows(PGconn *c, const char *sql)
{
    PGresult *r = db_exec(c, sql, 0, NULL, &db_err);
    ck_assert_msg(r != NULL, "%s", db_err.message);
    int n = atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

START_TEST(second_migrate_is_a_noop)
{
    char url[1024];
    int applied = -1;
    test_env_fresh_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    migrate_set_t *set = migrate_set_new(NULL, &err);
    ck_assert_msg(set != NULL, "%s", err.message);

    ck_assert_msg(migrate_run(c, set, NULL, &applied, &err) == 0, "%s", err.message);
    ck_assert_int_eq(applied, (int)migrate_embedded_count);
    int rows = count_rows(c, "SELECT count(*) FROM schema_migrations");
    ck_assert_int_eq(rows, (int)migrate_embedded_count);

    ck_assert_msg(migrate_run(c, set, NULL, &applied, &err) == 0, "%s", err.message);
    ck_assert_int_eq(applied, 0);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM schema_migrations"), rows);
    migrate_set_free(set);
    PQfinish(c);
}
END_TEST

struct runner {
    const char *url;
    pthread_barrier_t *start;
    enum charged_rc rc;
    int applied;
    struct charged_error err;
};

static void *run_migrate(void *arg)
{
    struct runner *r = arg;
    struct charged_error e;
    PGconn *c = db_connect(r->url, &e);
    migrate_set_t *set = migrate_set_new(NULL, &r->err);
    r->rc = CHARGED_RETRY;
    if (!c || !set) {
        if (!c)
            r->err = e;
        goto out;
    }
    pthread_barrier_wait(r->start);
    r->rc = migrate_run(c, set, NULL, &r->applied, &r->err);
out:
    migrate_set_free(set);
    PQfinish(c);
    return NULL;
}

START_TEST(concurrent_migrates_apply_each_file_once)
{
    enum { N = 4 };
    char url[1024];
    pthread_t t[N];
    struct runner r[N];
    pthread_barrier_t start;
    int total = 0;

    test_env_fresh_database(url, sizeof(url));
    pthread_barrier_init(&start, NULL, N);
    for (int i = 0; i < N; i++) {
        r[i] = (struct runner){.url = url, .start = &start};
        pthread_create(&t[i], NULL, run_migrate, &r[i]);
    }
    for (int i = 0; i < N; i++) {
        pthread_join(t[i], NULL);
        ck_assert_msg(r[i].rc == CHARGED_OK, "runner %d: %s", i, r[i].err.message);
        total += r[i].applied;
    }
    pthread_barrier_destroy(&start);
    ck_assert_int_eq(total, (int)migrate_embedded_count);
    PGconn *c = test_env_connect(url);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM schema_migrations"),
                     (int)migrate_embedded_count);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM pg_tables WHERE tablename = "
                                   "'payment_attempts'"),
                     1);
    PQfinish(c);
}
END_TEST

/* Writes the embedded migrations before `stop` (a name) into dir. */
static void write_migrations_before(const char *dir, const char *stop)
{
    char path[512];
    for (size_t i = 0; i < migrate_embedded_count; i++) {
        if (strcmp(migrate_embedded[i].name, stop) >= 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, migrate_embedded[i].name);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fwrite(migrate_embedded[i].sql, 1, migrate_embedded[i].len, f);
        fclose(f);
    }
}

/* 0011 over a database where a charge and a refund already share a key
 * (the race it closes): it applies, the key stays with the one recorded
 * first, both rows stay, and from then on the key is refused to anyone. */
START_TEST(keys_shared_before_0011_migrate_to_the_first)
{
    char url[1024], dir[] = "/tmp/charged-mig-XXXXXX";
    int applied;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    write_migrations_before(dir, "0011");
    test_env_fresh_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    migrate_set_t *set = migrate_set_new(dir, &err);
    ck_assert_msg(set != NULL, "%s", err.message);
    ck_assert_msg(migrate_run(c, set, NULL, &applied, &err) == 0, "%s", err.message);
    migrate_set_free(set);
    test_env_sql(c,
                 "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
                 " request_fingerprint, amount, currency, payment_method, status,"
                 " created_at) VALUES ('00000000-0000-4000-8000-000000000001',"
                 " '00000000-0000-4000-8000-000000000002', 'shared', 'fp', 100, 'EUR',"
                 " 'pm_card_visa', 'PENDING', now() - interval '1 minute'),"
                 " ('00000000-0000-4000-8000-000000000003',"
                 " '00000000-0000-4000-8000-000000000004', 'charge-only', 'fp', 100,"
                 " 'EUR', 'pm_card_visa', 'PENDING', now())",
                 0, NULL);
    test_env_sql(c,
                 "INSERT INTO refund_attempts (id, payment_attempt_id, idempotency_key,"
                 " request_fingerprint, amount, refund_reason, status) VALUES"
                 " ('00000000-0000-4000-8000-000000000005',"
                 " '00000000-0000-4000-8000-000000000001', 'shared', 'fp', 10,"
                 " 'requested_by_customer', 'PENDING')",
                 0, NULL);
    set = migrate_set_new(NULL, &err);
    ck_assert_msg(set != NULL, "%s", err.message);
    ck_assert_msg(migrate_run(c, set, NULL, &applied, &err) == 0, "%s", err.message);
    migrate_set_free(set);
    ck_assert_int_ge(applied, 1);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM idempotency_keys"), 2);
    ck_assert_int_eq(
        count_rows(c, "SELECT count(*) FROM idempotency_keys"
                      " WHERE idempotency_key = 'shared' AND kind = 'charge'"
                      " AND owner_id = '00000000-0000-4000-8000-000000000001'"),
        1);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM refund_attempts"), 1);
    PGresult *r = PQexec(c, "INSERT INTO refund_attempts (id, payment_attempt_id,"
                            " idempotency_key, request_fingerprint, amount,"
                            " refund_reason, status) VALUES"
                            " ('00000000-0000-4000-8000-000000000006',"
                            " '00000000-0000-4000-8000-000000000001', 'charge-only',"
                            " 'fp', 10, 'requested_by_customer', 'PENDING')");
    ck_assert_str_eq(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23505");
    PQclear(r);
    PQfinish(c);
    for (size_t i = 0; i < migrate_embedded_count; i++) {
        char path[512];
        snprintf(path, sizeof(path), "%s/%s", dir, migrate_embedded[i].name);
        unlink(path);
    }
    rmdir(dir);
}
END_TEST

START_TEST(changed_applied_file_is_refused)
{
    char url[1024], dir[] = "/tmp/charged-mig-XXXXXX", path[512];
    int applied;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/0001_first.sql", dir);
    FILE *f = fopen(path, "w");
    fputs("CREATE TABLE first (id int);\n", f);
    fclose(f);

    test_env_fresh_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    migrate_set_t *set = migrate_set_new(dir, &err);
    ck_assert_msg(set != NULL, "%s", err.message);
    ck_assert_msg(migrate_run(c, set, NULL, &applied, &err) == 0, "%s", err.message);
    migrate_set_free(set);

    f = fopen(path, "w");
    fputs("CREATE TABLE first (id bigint);\n", f);
    fclose(f);
    set = migrate_set_new(dir, &err);
    ck_assert_msg(set != NULL, "%s", err.message);
    ck_assert_int_eq(migrate_run(c, set, NULL, &applied, &err), CHARGED_GIVE_UP);
    ck_assert_msg(
        strstr(err.message, "'0001_first.sql' was changed after it was applied"), "%s",
        err.message);
    migrate_set_free(set);
    PQfinish(c);
    unlink(path);
    rmdir(dir);
}
END_TEST

START_TEST(failed_migration_leaves_nothing_behind)
{
    char url[1024], dir[] = "/tmp/charged-mig-XXXXXX", path[512];
    int applied;
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/0001_broken.sql", dir);
    FILE *f = fopen(path, "w");
    fputs("CREATE TABLE half (id int);\nTHIS IS NOT SQL;\n", f);
    fclose(f);
    test_env_fresh_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    migrate_set_t *set = migrate_set_new(dir, &err);
    ck_assert_int_eq(migrate_run(c, set, NULL, &applied, &err), CHARGED_GIVE_UP);
    ck_assert_msg(strstr(err.message, "migration '0001_broken.sql' failed"), "%s",
                  err.message);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM pg_tables WHERE tablename = "
                                   "'half'"),
                     0);
    ck_assert_int_eq(count_rows(c, "SELECT count(*) FROM schema_migrations"), 0);
    migrate_set_free(set);
    PQfinish(c);
    unlink(path);
    rmdir(dir);
}
END_TEST

/* Inserts an attempt; returns the SQLSTATE ("" on success). */
static const char *insert_attempt(PGconn *c, const char *id, const char *order,
                                  const char *key, const char *status)
{
    const char *p[4] = {id, order, key, status};
    static char state[sizeof(db_err.code)];
    int rc = db_run(c,
                    "INSERT INTO payment_attempts (id, order_id, idempotency_key, "
                    " request_fingerprint, amount, currency, payment_method, status, "
                    " provider_payment_id) "
                    "VALUES ($1, $2, $3, 'fp', 1000, 'EUR', 'pm_card_visa', $4, "
                    " CASE WHEN $4 = 'SUCCEEDED' THEN 'pi_1' END)",
                    4, p, &db_err);
    snprintf(state, sizeof(state), "%s", rc == 0 ? "" : db_err.code);
    return state;
}

#define ORDER "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0001"
#define A1    "5d1c2c1e-1a9b-4b1e-8e55-000000000001"
#define A2    "5d1c2c1e-1a9b-4b1e-8e55-000000000002"
#define A3    "5d1c2c1e-1a9b-4b1e-8e55-000000000003"

START_TEST(two_live_attempts_of_one_order_fail)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    ck_assert_str_eq(insert_attempt(c, A1, ORDER, "key-1", "PROCESSING"), "");
    ck_assert_str_eq(insert_attempt(c, A2, ORDER, "key-2", "PENDING"), "23505");
    ck_assert_msg(strstr(db_err.message, "payment_attempts_one_live_per_order"), "%s",
                  db_err.message);
    /* A refused or failed attempt of the same order is not live. */
    ck_assert_str_eq(insert_attempt(c, A2, ORDER, "key-2", "REJECTED"), "");
    ck_assert_str_eq(insert_attempt(c, A3, ORDER, "key-3", "FAILED"), "");
    PQfinish(c);
}
END_TEST

START_TEST(succeeded_and_live_attempt_of_one_order_fail)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    ck_assert_str_eq(insert_attempt(c, A1, ORDER, "key-1", "SUCCEEDED"), "");
    ck_assert_str_eq(insert_attempt(c, A2, ORDER, "key-2", "SUCCEEDED"), "23505");
    ck_assert_str_eq(insert_attempt(c, A3, ORDER, "key-3", "UNKNOWN"), "23505");
    PQfinish(c);
}
END_TEST

START_TEST(two_rows_with_one_idempotency_key_fail)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    ck_assert_str_eq(insert_attempt(c, A1, ORDER, "same-key", "REJECTED"), "");
    ck_assert_str_eq(insert_attempt(c, A2, "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0002",
                                    "same-key", "PENDING"),
                     "23505");
    ck_assert_msg(strstr(db_err.message, "idempotency_key"), "%s", db_err.message);
    PQfinish(c);
}
END_TEST

START_TEST(bad_status_fails_the_check)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    ck_assert_str_eq(insert_attempt(c, A1, ORDER, "key-1", "CHARGED"), "23514");
    ck_assert_str_eq(insert_attempt(c, A1, ORDER, "key-1", "pending"), "23514");
    PQfinish(c);
}
END_TEST

/* The quoted status names in a constraint or index definition, as a set of
 * bits over enum attempt_status; fails on a name the enum does not know. */
static unsigned quoted_statuses(const char *def)
{
    unsigned set = 0;
    for (const char *p = strchr(def, '\''); p; p = strchr(p + 1, '\'')) {
        const char *e = strchr(p + 1, '\'');
        char name[64];
        ck_assert_msg(e != NULL, "unbalanced quote in %s", def);
        snprintf(name, sizeof(name), "%.*s", (int)(e - p - 1), p + 1);
        int s = attempt_status_parse(name);
        ck_assert_msg(s >= 0, "the schema names a status the code does not: '%s'",
                      name);
        set |= 1u << s;
        p = e;
    }
    return set;
}

/* The migration's CHECK list is exactly the enum, and the one-live-attempt
 * index counts exactly the live set: one vocabulary in code and schema. */
START_TEST(schema_statuses_match_the_code)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    PGresult *r =
        db_exec(c,
                "SELECT pg_get_constraintdef(oid) FROM pg_constraint"
                " WHERE conrelid = 'payment_attempts'::regclass AND contype = 'c'"
                "   AND pg_get_constraintdef(oid) LIKE '%status = ANY%'"
                "   AND pg_get_constraintdef(oid) NOT LIKE '%provider_payment_id%'",
                0, NULL, &db_err);
    ck_assert_msg(r && PQntuples(r) == 1, "one status CHECK expected: %s",
                  db_err.message);
    unsigned all = quoted_statuses(PQgetvalue(r, 0, 0)), want = 0, live = 0;
    PQclear(r);
    for (int i = 0; i < ATTEMPT_STATUS__COUNT; i++) {
        want |= 1u << i;
        if (attempt_status_is_live(i))
            live |= 1u << i;
    }
    ck_assert_uint_eq(all, want);
    r = db_exec(
        c, "SELECT pg_get_indexdef('payment_attempts_one_live_per_order'::regclass)", 0,
        NULL, &db_err);
    ck_assert_msg(r != NULL, "%s", db_err.message);
    ck_assert_uint_eq(quoted_statuses(PQgetvalue(r, 0, 0)), live);
    PQclear(r);
    PQfinish(c);
}
END_TEST

START_TEST(ledger_books_an_attempt_once)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    ck_assert_str_eq(insert_attempt(c, A1, ORDER, "key-1", "SUCCEEDED"), "");
    const char *p[2] = {A1, ORDER};
    const char *sql = "INSERT INTO ledger_entries (payment_attempt_id, order_id, kind, "
                      "amount, currency, provider_payment_id) "
                      "VALUES ($1, $2, 'charge', 1000, 'EUR', 'pi_1')";
    ck_assert_msg(db_run(c, sql, 2, p, &db_err) == 0, "%s", db_err.message);
    ck_assert_int_eq(db_run(c, sql, 2, p, &db_err), CHARGED_RETRY);
    ck_assert_str_eq(db_err.code, "23505");
    PQfinish(c);
}
END_TEST

/* The ledger has no foreign key on the attempt (migration 0009): a refund's
 * row is booked by the trigger only for a charge that exists. */
START_TEST(refund_of_no_attempt_is_never_booked)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    const char *p[1] = {A1};
    ck_assert_msg(
        db_run(c,
               "INSERT INTO refund_attempts (id, payment_attempt_id,"
               " idempotency_key, request_fingerprint, amount, refund_reason,"
               " status, reserved) VALUES (gen_random_uuid(), $1, 'rk-1', 'fp',"
               " 100, 'duplicate', 'PROCESSING', true)",
               1, p, &db_err) == 0,
        "%s", db_err.message);
    ck_assert_int_eq(
        db_run(c,
               "UPDATE refund_attempts SET status = 'SUCCEEDED',"
               " provider_refund_id = 're_1' WHERE payment_attempt_id = $1",
               1, p, &db_err),
        CHARGED_RETRY);
    ck_assert_str_eq(db_err.code, "23503");
    PGresult *r = db_exec(c, "SELECT count(*) FROM ledger_entries", 0, NULL, &db_err);
    ck_assert_msg(r != NULL, "%s", db_err.message);
    ck_assert_str_eq(PQgetvalue(r, 0, 0), "0");
    PQclear(r);
    PQfinish(c);
}
END_TEST

START_TEST(webhook_event_is_processed_once)
{
    char url[1024];
    test_env_migrated_database(url, sizeof(url));
    PGconn *c = test_env_connect(url);
    const char *sql = "INSERT INTO processed_webhook_events (provider, event_id, "
                      "event_type, outcome, payload) VALUES ('psp', 'evt_1', "
                      "'payment_intent.succeeded', 'applied', '{}')";
    ck_assert_msg(db_run(c, sql, 0, NULL, &db_err) == 0, "%s", db_err.message);
    ck_assert_int_eq(db_run(c, sql, 0, NULL, &db_err), CHARGED_RETRY);
    ck_assert_str_eq(db_err.code, "23505");
    PQfinish(c);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("schema_migrate");
    TCase *tc = tcase_create("postgresql");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, second_migrate_is_a_noop);
    tcase_add_test(tc, concurrent_migrates_apply_each_file_once);
    tcase_add_test(tc, changed_applied_file_is_refused);
    tcase_add_test(tc, keys_shared_before_0011_migrate_to_the_first);
    tcase_add_test(tc, failed_migration_leaves_nothing_behind);
    tcase_add_test(tc, two_live_attempts_of_one_order_fail);
    tcase_add_test(tc, succeeded_and_live_attempt_of_one_order_fail);
    tcase_add_test(tc, two_rows_with_one_idempotency_key_fail);
    tcase_add_test(tc, bad_status_fails_the_check);
    tcase_add_test(tc, schema_statuses_match_the_code);
    tcase_add_test(tc, ledger_books_an_attempt_once);
    tcase_add_test(tc, refund_of_no_attempt_is_never_booked);
    tcase_add_test(tc, webhook_event_is_processed_once);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
