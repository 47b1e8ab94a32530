/* common/store/outbox_store against the real PostgreSQL of the local stack, each
 * test in a database of its own: leadership (one holder, gone with its
 * session, taken again on a new one), fetch in seq order with an attempt's
 * later events held behind a failed one, mark published / failed, purge
 * and backlog; and how every failure is classified, with the SQLSTATE in
 * the struct charged_error: a refused value is CHARGED_BAD_ITEM, a row another
 * session holds past the lock_timeout CHARGED_WAIT, an unreachable
 * database CHARGED_RETRY. */
#include <check.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "db.h"
#include "outbox_store.h"
#include "test_env.h"

#define ATTEMPT_A "00000000-0000-4000-8000-00000000000a"
#define ATTEMPT_B "00000000-0000-4000-8000-00000000000b"
#define EVENT_1   "e0000000-0000-4000-8000-000000000001"
#define EVENT_2   "e0000000-0000-4000-8000-000000000002"
#define EVENT_3   "e0000000-0000-4000-8000-000000000003"

static struct charged_error err;
static char url[1024];
static PGconn *admin;

static void sql(const char *q, int n, const char *const *p)
{
    test_env_sql(admin, q, n, p);
}

static char *value(const char *q)
{
    return test_env_value(admin, q);
}

static void add_attempt(const char *id)
{
    char key[64];
    snprintf(key, sizeof(key), "key-%s", id);
    const char *p[2] = {id, key};
    sql("INSERT INTO payment_attempts (id, order_id, idempotency_key,"
        " request_fingerprint, amount, currency, payment_method, status)"
        " VALUES ($1, gen_random_uuid(), $2, 'fp', 1000, 'EUR', 'pm_card_visa',"
        " 'REJECTED')",
        2, p);
}

/* Appended in call order: seq is drawn by the insert. */
static void add_event(const char *event_id, const char *attempt_id)
{
    const char *p[4] = {event_id, attempt_id, attempt_id, event_id};
    sql("INSERT INTO outbox (event_id, payment_attempt_id, event_type, event_key,"
        " payload) VALUES ($1, $2, 'charge.rejected', $3,"
        " jsonb_build_object('event_id', $4::text))",
        4, p);
}

/* Two events of A around one of B: A1, B, A2 in seq order. */
static void setup(void)
{
    test_env_migrated_database(url, sizeof(url));
    admin = test_env_connect(url);
    add_attempt(ATTEMPT_A);
    add_attempt(ATTEMPT_B);
    add_event(EVENT_1, ATTEMPT_A);
    add_event(EVENT_2, ATTEMPT_B);
    add_event(EVENT_3, ATTEMPT_A);
}

static void teardown(void)
{
    PQfinish(admin);
}

static outbox_store_t *store(void)
{
    outbox_store_t *st = outbox_store_new(url, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    return st;
}

static outbox_batch_t *fetch(outbox_store_t *st, size_t max)
{
    outbox_batch_t *b = NULL;
    ck_assert_msg(outbox_store_fetch(st, max, &b, &err) == CHARGED_OK, "%s",
                  err.message);
    ck_assert_ptr_nonnull(b);
    return b;
}

START_TEST(fetch_mark_purge_and_backlog)
{
    outbox_store_t *st = store();
    outbox_batch_t *b = fetch(st, 10);
    ck_assert_uint_eq(outbox_batch_count(b), 3);
    ck_assert_str_eq(outbox_batch_get(b, 0)->event_id, EVENT_1);
    ck_assert_str_eq(outbox_batch_get(b, 0)->key, ATTEMPT_A);
    ck_assert_str_eq(outbox_batch_get(b, 1)->event_id, EVENT_2);
    ck_assert_str_eq(outbox_batch_get(b, 2)->event_id, EVENT_3);
    ck_assert_msg(strstr(outbox_batch_get(b, 2)->payload, EVENT_3), "%s",
                  outbox_batch_get(b, 2)->payload);
    ck_assert_ptr_null(outbox_batch_get(b, 3));
    outbox_batch_free(b);
    b = fetch(st, 1);
    ck_assert_uint_eq(outbox_batch_count(b), 1);
    outbox_batch_free(b);

    /* A1 failed: it waits, and A2 with it; B does not. */
    const char *first[1] = {EVENT_1}, *why[1] = {"broker said no"};
    ck_assert_int_eq(outbox_store_mark_failed(st, first, why, 1, &err), CHARGED_OK);
    ck_assert_str_eq(value("SELECT publish_failures || ' ' || last_error ||"
                           " (retry_at > now()) FROM outbox WHERE event_id = '" EVENT_1
                           "'"),
                     "1 broker said notrue");
    b = fetch(st, 10);
    ck_assert_uint_eq(outbox_batch_count(b), 1);
    ck_assert_str_eq(outbox_batch_get(b, 0)->event_id, EVENT_2);
    outbox_batch_free(b);

    const char *second[1] = {EVENT_2};
    ck_assert_int_eq(outbox_store_mark_published(st, second, 1, &err), CHARGED_OK);
    b = fetch(st, 10);
    ck_assert_uint_eq(outbox_batch_count(b), 0); /* empty, not a failure */
    outbox_batch_free(b);

    long long count = -1, oldest = -1, deleted = -1;
    ck_assert_int_eq(outbox_store_backlog(st, &count, &oldest, &err), CHARGED_OK);
    ck_assert_int_eq(count, 2);
    ck_assert_int_ge(oldest, 0);

    /* Only rows published longer ago than the retention go. */
    ck_assert_int_eq(outbox_store_purge(st, 60000, &deleted, &err), CHARGED_OK);
    ck_assert_int_eq(deleted, 0);
    sql("UPDATE outbox SET published_at = now() - interval '2 minutes'"
        " WHERE event_id = '" EVENT_2 "'",
        0, NULL);
    ck_assert_int_eq(outbox_store_purge(st, 60000, &deleted, &err), CHARGED_OK);
    ck_assert_int_eq(deleted, 1);
    ck_assert_str_eq(value("SELECT count(*) FROM outbox"), "2");
    outbox_store_free(st);
    outbox_store_free(NULL);
}
END_TEST

/* The pid of the session that holds the relay's advisory lock, "" when
 * none does. */
static const char *lock_holder(void)
{
    PGresult *r = db_exec(admin,
                          "SELECT coalesce(max(pid)::text, '') FROM pg_locks"
                          " WHERE locktype = 'advisory' AND granted AND database ="
                          "  (SELECT oid FROM pg_database WHERE datname = "
                          "current_database())",
                          0, NULL, &err);
    static char pid[32];
    ck_assert_msg(r != NULL, "%s", err.message);
    snprintf(pid, sizeof(pid), "%s", PQgetvalue(r, 0, 0));
    PQclear(r);
    return pid;
}

/* Asks for the lead until `want` comes back, for at most 10 s: the server
 * lets a session's lock go when the session has ended, a moment after the
 * client's side is closed. */
static void lead_becomes(outbox_store_t *st, enum charged_rc want)
{
    long long deadline = test_env_now_ms() + 10000;
    struct timespec pause = {0, 10 * 1000000L};
    enum charged_rc rc;
    while ((rc = outbox_store_lead(st, &err)) != want && test_env_now_ms() < deadline)
        nanosleep(&pause, NULL);
    ck_assert_msg(rc == want, "lead: %d, wanted %d (%s)", rc, want, err.message);
}

START_TEST(one_leader_until_its_session_ends)
{
    outbox_store_t *a = store(), *b = store();
    ck_assert_int_eq(outbox_store_lead(a, &err), CHARGED_OK);
    ck_assert_int_eq(outbox_store_lead(b, &err), CHARGED_NOT_LEADER);
    ck_assert_int_eq(outbox_store_lead(a, &err), CHARGED_OK);

    /* The leader's session ends (a restart, a partition): its lock goes
     * with it, and the standby takes the lead. */
    char pid[32];
    snprintf(pid, sizeof(pid), "%s", lock_holder());
    ck_assert_str_ne(pid, "");
    const char *p[1] = {pid};
    sql("SELECT pg_terminate_backend($1::int)", 1, p);
    lead_becomes(b, CHARGED_OK);
    /* The old leader finds its session gone, then leads no more on the
     * new one it opens. */
    outbox_batch_t *none = NULL;
    ck_assert_int_eq(outbox_store_fetch(a, 10, &none, &err), CHARGED_RETRY);
    ck_assert_ptr_null(none);
    ck_assert_int_eq(outbox_store_lead(a, &err), CHARGED_NOT_LEADER);
    outbox_store_free(b);
    lead_becomes(a, CHARGED_OK);
    outbox_store_free(a);
}
END_TEST

START_TEST(refused_values_are_data_with_their_sqlstate)
{
    outbox_store_t *st = store();
    outbox_batch_t *b = (outbox_batch_t *)&b; /* anything: a failure sets NULL */
    const char *bad[1] = {"not-a-uuid"}, *why[1] = {"x"};
    ck_assert_int_eq(outbox_store_mark_published(st, bad, 1, &err), CHARGED_BAD_ITEM);
    ck_assert_str_eq(err.code, "22P02");
    ck_assert_msg(strstr(err.message, "uuid") != NULL, "%s", err.message);
    ck_assert_int_eq(outbox_store_mark_failed(st, bad, why, 1, &err), CHARGED_BAD_ITEM);
    ck_assert_str_eq(err.code, "22P02");
    ck_assert_int_eq(outbox_store_fetch(st, (size_t)INT_MAX + 1, &b, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_str_eq(err.code, "22003");
    ck_assert_ptr_null(b);
    long long deleted = -1;
    sql("UPDATE outbox SET published_at = now() WHERE event_id = '" EVENT_2 "'", 0,
        NULL);
    ck_assert_int_eq(outbox_store_purge(st, LLONG_MAX, &deleted, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_str_eq(err.code, "22008");
    ck_assert_int_eq(deleted, 0);
    /* The store goes on: a refusal is the call's, not the session's. */
    long long count = 0, oldest = 0;
    ck_assert_int_eq(outbox_store_backlog(st, &count, &oldest, &err), CHARGED_OK);
    ck_assert_str_eq(err.code, "");
    ck_assert_int_eq(count, 2);
    outbox_store_free(st);
}
END_TEST

/* One store call in a thread of its own, so that the calls wait side by
 * side, one lock_timeout in all. Each waits for a row of its own: a second
 * waiter for the same row would queue behind the first one's wait, then
 * wait again. */
struct held_call {
    pthread_t thread;
    int what; /* 0 mark A1 published, 1 mark A2 failed, 2 purge (B) */
    enum charged_rc rc;
    struct charged_error err;
};

static void *call_held(void *arg)
{
    struct held_call *c = arg;
    outbox_store_t *st = outbox_store_new(url, &c->err);
    const char *a1[1] = {EVENT_1}, *a2[1] = {EVENT_3}, *why[1] = {"x"};
    long long deleted;
    if (!st)
        return NULL;
    c->rc = c->what == 0   ? outbox_store_mark_published(st, a1, 1, &c->err)
            : c->what == 1 ? outbox_store_mark_failed(st, a2, why, 1, &c->err)
                           : outbox_store_purge(st, 0, &deleted, &c->err);
    outbox_store_free(st);
    return NULL;
}

/* Another session holding rows past the store's lock_timeout (5 s): each
 * write that needs one is LOCKED, 55P03, and nothing is written. A1 and A2
 * wait to be published, B was published long ago (a purge deletes it). */
START_TEST(a_row_held_by_another_session_is_locked)
{
    sql("UPDATE outbox SET published_at = now() - interval '1 hour'"
        " WHERE event_id = '" EVENT_2 "'",
        0, NULL);
    PGconn *peer = test_env_connect(url);
    /* Held for longer than our sessions may idle in a transaction. */
    ck_assert_int_eq(db_run(peer, "BEGIN", 0, NULL, &err), 0);
    /* In the transaction: db_run's BEGIN carries our DB_IDLE_IN_TX (db.h). */
    ck_assert_int_eq(db_run(peer, "SET LOCAL idle_in_transaction_session_timeout = 0",
                            0, NULL, &err),
                     0);
    ck_assert_msg(
        db_run(peer, "SELECT event_id FROM outbox FOR UPDATE", 0, NULL, &err) == 0,
        "%s", err.message);
    struct held_call calls[3];
    memset(calls, 0, sizeof(calls));
    for (int i = 0; i < 3; i++) {
        calls[i].what = i;
        calls[i].rc = CHARGED_OK;
        ck_assert_int_eq(pthread_create(&calls[i].thread, NULL, call_held, &calls[i]),
                         0);
    }
    for (int i = 0; i < 3; i++) {
        pthread_join(calls[i].thread, NULL);
        ck_assert_msg(calls[i].rc == CHARGED_WAIT, "call %d: %d (%s)", i, calls[i].rc,
                      calls[i].err.message);
        ck_assert_str_eq(calls[i].err.code, "55P03");
    }
    ck_assert_int_eq(db_run(peer, "ROLLBACK", 0, NULL, &err), 0);
    PQfinish(peer);
    ck_assert_str_eq(value("SELECT count(*) || ' ' || sum(publish_failures) || ' ' ||"
                           " count(published_at) FROM outbox"),
                     "3 0 1");
}
END_TEST

/* An unreachable database is RETRY for every call, without an SQLSTATE,
 * and nothing blocks for long. */
START_TEST(an_unreachable_database_is_retry)
{
    ck_assert_ptr_null(outbox_store_new("postgresql://x:y@/db?nonsense=1", &err));
    ck_assert_msg(strstr(err.message, "bad database url") != NULL, "%s", err.message);
    outbox_store_t *down =
        outbox_store_new("postgresql://charged@127.0.0.1:1/charged", &err);
    ck_assert_msg(down != NULL, "a store is made without connecting: %s", err.message);
    const char *ids[1] = {EVENT_1}, *why[1] = {"x"};
    long long n, oldest;
    outbox_batch_t *b = (outbox_batch_t *)&b;
    long long t0 = test_env_now_ms();
    ck_assert_int_eq(outbox_store_lead(down, &err), CHARGED_RETRY);
    ck_assert_str_eq(err.code, "");
    ck_assert_msg(strstr(err.message, "database unreachable") != NULL, "%s",
                  err.message);
    ck_assert_int_eq(outbox_store_fetch(down, 10, &b, &err), CHARGED_RETRY);
    ck_assert_ptr_null(b);
    ck_assert_int_eq(outbox_store_mark_published(down, ids, 1, &err), CHARGED_RETRY);
    ck_assert_int_eq(outbox_store_mark_failed(down, ids, why, 1, &err), CHARGED_RETRY);
    ck_assert_int_eq(outbox_store_purge(down, 0, &n, &err), CHARGED_RETRY);
    ck_assert_int_eq(outbox_store_backlog(down, &n, &oldest, &err), CHARGED_RETRY);
    ck_assert_str_eq(err.code, "");
    ck_assert_int_lt(test_env_now_ms() - t0, 20000);
    outbox_store_free(down);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("outbox_store");
    TCase *tc = tcase_create("outbox_store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fetch_mark_purge_and_backlog);
    tcase_add_test(tc, one_leader_until_its_session_ends);
    tcase_add_test(tc, refused_values_are_data_with_their_sqlstate);
    tcase_add_test(tc, a_row_held_by_another_session_is_locked);
    tcase_add_test(tc, an_unreachable_database_is_retry);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
