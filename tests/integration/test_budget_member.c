/* common/budget/budget_member against the real PostgreSQL of the local
 * stack, each test in a database of its own: a member that is off lets
 * everything through and touches no database; with the default settings
 * (no limit) an ask never waits; under a limit a member's thread of
 * refreshes keeps every second of its sends within it; a one-shot member
 * (no thread) refreshes while it waits and gets its share from a fleet
 * that held it all; a member that leaves deletes its row; a bounded wait
 * for a share that never comes ends with why; a refresh that fails keeps
 * the share until its lease ends, then nothing goes until one succeeds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "budget_member.h"
#include "clock.h"
#include "db.h"
#include "test_env.h"

static char url[1024];
static PGconn *admin;

static void setup(void)
{
    test_env_migrated_database(url, sizeof(url));
    admin = test_env_connect(url);
}

static void teardown(void)
{
    PQfinish(admin);
}

static budget_member_t *member(int enabled, const char *role)
{
    struct charged_error err;
    budget_member_t *m =
        budget_member_new(url, BUDGET_ACCOUNT_DEFAULT, role, enabled, &err);
    ck_assert_msg(m != NULL, "%s", err.message);
    return m;
}

static void set_limits(long long global, long long create)
{
    struct charged_error err;
    struct budget_change c = {.global = 1};
    json_t *after = NULL;
    budget_lease_t *l =
        budget_lease_new(url, BUDGET_ACCOUNT_DEFAULT, "test", BUDGET_LEASE_MS, &err);
    ck_assert_msg(l != NULL, "%s", err.message);
    c.to.global_rps = global;
    c.cls[BUDGET_CLASS_CREATE] = 1;
    c.to.class_rps[BUDGET_CLASS_CREATE] = create;
    ck_assert_msg(budget_lease_set(l, &c, "tester", &after, &err) == CHARGED_OK, "%s",
                  err.message);
    json_decref(after);
    budget_lease_free(l);
}

static long long members(void)
{
    PGresult *r = PQexec(admin, "SELECT count(*) FROM provider_budget_members");
    ck_assert_int_eq(PQresultStatus(r), PGRES_TUPLES_OK);
    long long n = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return n;
}

START_TEST(test_off_lets_all_through)
{
    struct charged_error err;
    budget_member_t *m = budget_member_new("postgresql://nobody@127.0.0.1:1/none",
                                           "default", "t", 0, &err);
    ck_assert_ptr_nonnull(m);
    ck_assert_int_eq(budget_member_enabled(m), 0);
    ck_assert_int_eq(budget_member_refresh(m, &err), CHARGED_OK);
    struct budget_ask a;
    budget_member_ask_init(&a, BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    for (int i = 0; i < 1000; i++)
        ck_assert_int_eq(budget_member_ask(m, &a, clock_now_ms()), 0);
    budget_member_leave(m);
    budget_member_free(m);
    budget_member_free(NULL);
}
END_TEST

START_TEST(test_no_limit_never_waits)
{
    struct charged_error err;
    budget_member_t *m = member(1, "worker");
    ck_assert_int_eq(budget_member_refresh(m, &err), CHARGED_OK);
    ck_assert_int_eq(budget_member_start(m, &err), CHARGED_OK);
    struct budget_ask a;
    budget_member_ask_init(&a, BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    /* 100,000 asks in a row, none told to wait (how long they take is
     * bench/'s to say, not a pass/fail test's: under ASan beside the other
     * sets 100,000 took 1.3 s). */
    for (int i = 0; i < 100000; i++)
        ck_assert_int_eq(budget_member_ask(m, &a, clock_now_ms()), 0);
    ck_assert_int_eq(members(), 1);
    budget_member_leave(m);
    ck_assert_int_eq(members(), 0);
    budget_member_free(m);
}
END_TEST

/* Sends of one member asking as fast as it may for ~2.5 s under a limit
 * of 20/s: no sliding second holds more than 20 and its bucket (20 x
 * BUDGET_GATE_BURST_MS), and it reaches most of them once its demand is
 * known. */
START_TEST(test_limit_holds_every_second)
{
    struct charged_error err;
    long long at[400];
    int n = 0;
    set_limits(20, 0);
    budget_member_t *m = member(1, "worker");
    ck_assert_int_eq(budget_member_refresh(m, &err), CHARGED_OK);
    ck_assert_int_eq(budget_member_start(m, &err), CHARGED_OK);
    long long end = clock_now_ms() + 2500;
    while (clock_now_ms() < end && n < 400)
        if (budget_member_wait(m, BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE, 300, NULL) ==
            0)
            at[n++] = clock_now_ms();
    for (int i = 0; i < n; i++) {
        int in = 0;
        for (int k = i; k < n && at[k] < at[i] + 1000; k++)
            in++;
        ck_assert_msg(in <= 20 + 20 * BUDGET_GATE_BURST_MS / 1000,
                      "%d sends within 1 s of send %d", in, i);
    }
    ck_assert_msg(n >= 30, "only %d sends in 2.5 s under 20/s", n);
    budget_member_leave(m);
    budget_member_free(m);
}
END_TEST

/* A worker holds the whole create limit; a one-shot caller at a higher
 * priority (capture over charge) joins, waits, and gets a share within a
 * bounded wait: its own refreshes report its demand, the worker lowers
 * at its next refresh, the one-shot takes at its next. */
START_TEST(test_one_shot_gets_its_share)
{
    struct charged_error err;
    set_limits(10, 0);
    budget_member_t *w = member(1, "worker");
    ck_assert_int_eq(budget_member_refresh(w, &err), CHARGED_OK);
    ck_assert_int_eq(budget_member_start(w, &err), CHARGED_OK);
    struct budget_ask a;
    budget_member_ask_init(&a, BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    long long end = clock_now_ms() + 600;
    while (clock_now_ms() < end) /* the worker wants it all */
        if (budget_member_ask(w, &a, clock_now_ms()) > 0) {
            struct timespec ts = {0, 2000000};
            nanosleep(&ts, NULL);
        }
    budget_member_t *c = member(1, "chargectl");
    long long t0 = clock_now_ms();
    ck_assert_int_eq(
        budget_member_wait(c, BUDGET_CLASS_CAPTURE, BUDGET_PRIO_CAPTURE, 3000, NULL),
        0);
    ck_assert_int_lt(clock_now_ms() - t0, 1500);
    budget_member_leave(c);
    budget_member_free(c);
    budget_member_forget(w, &a);
    budget_member_leave(w);
    budget_member_free(w);
}
END_TEST

/* The whole limit taken by a higher priority: a bounded wait ends, and the
 * gate says why. */
START_TEST(test_bounded_wait_says_why)
{
    char why[256];
    set_limits(1, 0);
    budget_member_t *w = member(1, "worker");
    struct charged_error err;
    ck_assert_int_eq(budget_member_refresh(w, &err), CHARGED_OK);
    ck_assert_int_eq(budget_member_start(w, &err), CHARGED_OK);
    /* The worker's capture demand takes the one request/s; the look-up waits. */
    struct budget_ask a;
    budget_member_ask_init(&a, BUDGET_CLASS_CAPTURE, BUDGET_PRIO_CAPTURE);
    for (int i = 0; i < 50; i++) {
        budget_member_ask(w, &a, clock_now_ms());
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    budget_member_t *c = member(1, "chargectl");
    struct budget_caller caller = {c, BUDGET_PRIO_LOOKUP, 700, NULL};
    long long t0 = clock_now_ms();
    int rc = budget_member_gate(&caller, BUDGET_CLASS_RETRIEVE, why, sizeof(why));
    ck_assert_int_eq(rc, -1);
    ck_assert_msg(strstr(why, "no share for a lookup request (retrieve)"), "%s", why);
    ck_assert_int_lt(clock_now_ms() - t0, 1200);
    budget_member_leave(c);
    budget_member_free(c);
    budget_member_forget(w, &a);
    budget_member_leave(w);
    budget_member_free(w);
}
END_TEST

/* A refresh that fails (another session holds the settings row past the
 * lock_timeout) keeps the share until the lease of the last good refresh
 * ends, and then nothing goes until a refresh succeeds again. */
START_TEST(test_failed_refresh_keeps_share_until_lease_ends)
{
    struct charged_error err;
    struct budget_ask a;
    set_limits(100, 0);
    budget_member_t *m = member(1, "worker");
    long long before, span;
    PGresult *r;
    /* What is left of the lease after the refresh waited its lock_timeout
     * out is the window measured below. A machine loaded enough to stretch
     * that wait past most of the lease leaves too short a window (183 ms
     * once, in the test command beside three other sets): the setup, not
     * the behaviour, is tried again then. */
    for (int setups = 1;; setups++) {
        before = clock_now_ms();
        ck_assert_int_eq(budget_member_refresh(m, &err), CHARGED_OK);
        r = PQexec(admin, "BEGIN");
        PQclear(r);
        r = PQexec(admin, "SELECT 1 FROM provider_budget FOR UPDATE");
        ck_assert_int_eq(PQresultStatus(r), PGRES_TUPLES_OK);
        PQclear(r);
        ck_assert_int_ne(budget_member_refresh(m, &err), CHARGED_OK);
        span = before + BUDGET_LEASE_MS - 50 - clock_now_ms();
        if (span >= 200 || setups == 5)
            break;
        r = PQexec(admin, "ROLLBACK");
        PQclear(r);
    }
    ck_assert_msg(span >= 200, "the failed refresh took the lease (%lld ms left)",
                  span);
    budget_member_ask_init(&a, BUDGET_CLASS_CREATE, BUDGET_PRIO_CHARGE);
    int sent = 0;
    /* In what is left of the lease, at least half of its 100/s is sent. */
    while (clock_now_ms() < before + BUDGET_LEASE_MS - 50) {
        sent += budget_member_ask(m, &a, clock_now_ms()) == 0;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(sent >= span / 20, "only %d sent in the %lld ms left of the lease",
                  sent, span);
    while (clock_now_ms() < before + BUDGET_LEASE_MS + 50) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
    }
    for (int i = 0; i < 20; i++) {
        ck_assert_int_gt(budget_member_ask(m, &a, clock_now_ms()), 0);
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    r = PQexec(admin, "ROLLBACK");
    PQclear(r);
    ck_assert_int_eq(budget_member_refresh(m, &err), CHARGED_OK);
    long long t0 = clock_now_ms();
    while (budget_member_ask(m, &a, clock_now_ms()) > 0)
        ck_assert_int_lt(clock_now_ms() - t0, 200);
    budget_member_leave(m);
    budget_member_free(m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("budget_member");
    TCase *tc = tcase_create("member");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, test_off_lets_all_through);
    tcase_add_test(tc, test_no_limit_never_waits);
    tcase_add_test(tc, test_limit_holds_every_second);
    tcase_add_test(tc, test_one_shot_gets_its_share);
    tcase_add_test(tc, test_bounded_wait_says_why);
    tcase_add_test(tc, test_failed_refresh_keeps_share_until_lease_ends);
    suite_add_tcase(s, tc);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
