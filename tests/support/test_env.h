/* test_env: what tests need from the real local stack.
 *
 * Integration tests reach PostgreSQL and Kafka through CHARGED_TEST_DATABASE_URL
 * and CHARGED_TEST_KAFKA, set by tools/run-all-tests.sh after it started the
 * stack. Each test gets a database of its own, so tests never see each
 * other's rows. */
#ifndef CHARGED_TEST_ENV_H
#define CHARGED_TEST_ENV_H

#include <stddef.h>
#include <check.h>

/* libpq's own declaration, so that the unit tests of the core, which use no
 * database, compile without its headers (test_env_db.c holds the rest). */
typedef struct pg_conn PGconn;

/* The base connection string; aborts the test with a clear message if the
 * stack's variables are not set. */
const char *test_env_database_url(void);
const char *test_env_kafka(void);

/* Creates an empty database and writes a connection string for it to out.
 * Returns 0, or aborts the test. */
int test_env_fresh_database(char *out, size_t out_size);

/* Creates a fresh database with every migration applied. */
int test_env_migrated_database(char *out, size_t out_size);

/* Connects, or fails the test. */
PGconn *test_env_connect(const char *url);

/* Runs q with parameters p[0..n) on conn, or fails the test. */
void test_env_sql(PGconn *conn, const char *q, int n, const char *const *p);

/* The one value q returns on conn (one row asserted), or fails the test;
 * valid until the next call. */
char *test_env_value(PGconn *conn, const char *q);

/* Runs the suite (each test in its own process unless CK_FORK=no), frees
 * it, and returns the exit status: 0 when every test passed. */
int test_env_run_suite(Suite *suite);

/* Milliseconds of a monotonic clock, for deadlines. */
long long test_env_now_ms(void);

/* now + ms, stretched by CHARGED_TEST_TIMEOUT_SCALE (3 for the sanitizer
 * build): a deadline bounds a wait, it never decides what passes. */
long long test_env_deadline(long long ms);

/* A random (version 4) UUID in canonical lower-case form, or fails. */
void test_env_uuid(char out[37]);

#endif
