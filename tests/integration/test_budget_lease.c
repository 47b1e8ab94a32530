/* common/budget/budget_lease against the real PostgreSQL of the local
 * stack, each test in a database of its own. After every step the live
 * members' shares, read from the table, sum within every limit: two and
 * three members (one raising its demand while another must lower first);
 * a member that stops refreshing is dropped after its lease, one that
 * leaves at once; a change of the settings is followed on the next
 * refresh, and recorded with its actor; a refresh waits no longer than
 * its lock_timeout behind a held lock; refreshes from several threads
 * colliding at a barrier never pass the limit; the default is no limit;
 * a row no member writes (a lease of an hour, holds and demands out of
 * range) is bounded, not trusted. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "budget_lease.h"
#include "db.h"
#include "test_env.h"

#define R(x) ((x)*1000LL)

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

static budget_lease_t *member(long long lease_ms)
{
    struct charged_error err;
    budget_lease_t *l =
        budget_lease_new(url, BUDGET_ACCOUNT_DEFAULT, "test", lease_ms, &err);
    ck_assert_msg(l != NULL, "%s", err.message);
    return l;
}

static void set_limits(long long global, long long create, long long floor)
{
    struct charged_error err;
    struct budget_change c = {.global = 1, .audit_floor = 1};
    json_t *after = NULL;
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    c.to.global_rps = global;
    c.to.audit_floor_rps = floor;
    c.cls[BUDGET_CLASS_CREATE] = 1;
    c.to.class_rps[BUDGET_CLASS_CREATE] = create;
    ck_assert_msg(budget_lease_set(l, &c, "tester", &after, &err) == CHARGED_OK, "%s",
                  err.message);
    json_decref(after);
    budget_lease_free(l);
}

/* A demand of charges on create, and of look-ups on retrieve (rps). */
static struct budget_demand demand(long long charge, long long lookup)
{
    struct budget_demand d;
    memset(&d, 0, sizeof(d));
    d.mrps[BUDGET_PRIO_CHARGE][BUDGET_CLASS_CREATE] = R(charge);
    d.mrps[BUDGET_PRIO_LOOKUP][BUDGET_CLASS_RETRIEVE] = R(lookup);
    return d;
}

static struct budget_refresh refresh(budget_lease_t *l, struct budget_demand d)
{
    struct charged_error err;
    struct budget_refresh out;
    ck_assert_msg(budget_lease_refresh(l, &d, &out, &err) == CHARGED_OK, "%s",
                  err.message);
    return out;
}

/* The live members' held sum of element i (1 global, 2.. the classes) in
 * mrps, -1 when one holds no limit. */
static long long held_sum(PGconn *c, int i)
{
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT CASE WHEN bool_or(held_mrps[%d] = -1) THEN -1"
             " ELSE coalesce(sum(held_mrps[%d]), 0) END FROM provider_budget_members"
             " WHERE expires_at > now()",
             i, i);
    return atoll(test_env_value(c, q));
}

/* Every live member's share sums within global and create's limits. */
static void check_fleet(long long global, long long create)
{
    long long g = held_sum(admin, 1), cr = held_sum(admin, 2 + BUDGET_CLASS_CREATE);
    ck_assert_msg(g >= 0 && g <= R(global), "global held %lld > %lld", g, R(global));
    if (create > 0)
        ck_assert_msg(cr >= 0 && cr <= R(create), "create held %lld", cr);
}

START_TEST(two_members_never_hold_more_than_the_limit)
{
    budget_lease_t *a = member(BUDGET_LEASE_MS), *b = member(BUDGET_LEASE_MS);
    set_limits(100, 0, 0);
    ck_assert_int_eq(refresh(a, demand(100, 0)).held.global_mrps, R(100));
    check_fleet(100, 0);
    /* B's target is half, but A still holds it all: B takes nothing yet. */
    struct budget_refresh rb = refresh(b, demand(100, 0));
    ck_assert_int_eq(rb.target.global_mrps, R(50));
    ck_assert_int_eq(rb.held.global_mrps, 0);
    ck_assert_int_eq(rb.members, 2);
    check_fleet(100, 0);
    ck_assert_int_eq(refresh(a, demand(100, 0)).held.global_mrps, R(50)); /* lowers */
    check_fleet(100, 0);
    ck_assert_int_eq(refresh(b, demand(100, 0)).held.global_mrps, R(50)); /* takes */
    check_fleet(100, 0);
    /* B raises its demand, A lowers it: B gets its target only once A gave
     * the room back. */
    rb = refresh(b, demand(300, 0));
    ck_assert_int_eq(rb.held.global_mrps, R(50));
    check_fleet(100, 0);
    ck_assert_int_eq(refresh(a, demand(10, 0)).held.global_mrps, R(10));
    check_fleet(100, 0);
    rb = refresh(b, demand(300, 0));
    ck_assert_int_eq(rb.target.global_mrps, R(90));
    ck_assert_int_eq(rb.held.global_mrps, R(90));
    check_fleet(100, 0);
    budget_lease_free(a);
    budget_lease_free(b);
}
END_TEST

START_TEST(three_members_shifting_demand_stay_within_and_converge)
{
    budget_lease_t *m[3] = {member(BUDGET_LEASE_MS), member(BUDGET_LEASE_MS),
                            member(BUDGET_LEASE_MS)};
    struct budget_demand d[3];
    struct budget_refresh r[3];
    srandom(38);
    set_limits(60, 25, 0);
    for (int round = 0; round < 12; round++) {
        for (int i = 0; i < 3; i++)
            d[i] = demand(random() % 50, random() % 30);
        /* Three passes under the same demands: the first publishes them
         * (targets computed from some old ones), in the second each lowers
         * to its final target, and a member left below it (another had not
         * lowered yet) reaches it in the third. */
        for (int pass = 0; pass < 3; pass++) {
            for (int i = 0; i < 3; i++) {
                r[i] = refresh(m[i], d[i]);
                check_fleet(60, 25);
            }
        }
        for (int i = 0; i < 3; i++) {
            ck_assert_int_eq(r[i].held.global_mrps, r[i].target.global_mrps);
            ck_assert_int_eq(r[i].held.class_mrps[BUDGET_CLASS_CREATE],
                             r[i].target.class_mrps[BUDGET_CLASS_CREATE]);
        }
    }
    for (int i = 0; i < 3; i++)
        budget_lease_free(m[i]);
}
END_TEST

START_TEST(a_member_that_stops_refreshing_is_dropped_after_its_lease)
{
    budget_lease_t *dead = member(400), *live = member(400);
    struct charged_error err;
    set_limits(100, 0, 0);
    /* Read before its refresh: its lease ends at least 400 ms after this. */
    long long died = test_env_now_ms();
    ck_assert_int_eq(refresh(dead, demand(100, 0)).held.global_mrps, R(100));
    struct budget_refresh first = refresh(live, demand(100, 0));
    ck_assert_int_eq(first.held.global_mrps, 0);
    /* It is told when the other's lease ends, to refresh just after. */
    ck_assert_msg(first.others_end_in_ms > 0 && first.others_end_in_ms <= 400,
                  "others_end_in_ms %lld", first.others_end_in_ms);
    /* The dead one never refreshes again: the live one takes its share
     * once the lease has ended, and not before. */
    long long deadline = test_env_deadline(5000), took = -1;
    while (test_env_now_ms() < deadline) {
        struct budget_refresh r = refresh(live, demand(100, 0));
        check_fleet(100, 0);
        if (r.held.global_mrps == R(100)) {
            took = test_env_now_ms() - died;
            break;
        }
        ck_assert_int_eq(r.held.global_mrps, 0);
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    long long slack = test_env_deadline(1000) - test_env_now_ms();
    ck_assert_msg(took >= 400 && took < 400 + slack, "took %lld ms", took);
    ck_assert_int_eq(atoi(test_env_value(admin, "SELECT count(*) FROM"
                                                " provider_budget_members")),
                     1); /* the dead one's row was deleted */
    ck_assert_int_eq(refresh(live, demand(100, 0)).others_end_in_ms, -1); /* alone */
    /* A member that leaves frees its share at once. */
    budget_lease_t *next = member(400);
    ck_assert_int_eq(refresh(next, demand(100, 0)).held.global_mrps, 0);
    ck_assert_int_eq(budget_lease_leave(live, &err), CHARGED_OK);
    ck_assert_int_eq(refresh(next, demand(100, 0)).held.global_mrps, R(100));
    budget_lease_free(dead);
    budget_lease_free(live);
    budget_lease_free(next);
}
END_TEST

START_TEST(a_settings_change_is_followed_on_the_next_refresh)
{
    budget_lease_t *a = member(BUDGET_LEASE_MS), *b = member(BUDGET_LEASE_MS);
    set_limits(100, 0, 0);
    refresh(a, demand(100, 0));
    refresh(b, demand(100, 0));
    refresh(a, demand(100, 0));
    refresh(b, demand(100, 0));
    check_fleet(100, 0);
    set_limits(40, 0, 0);
    /* A sees the new limit at once: B still holds 50, so A holds nothing. */
    struct budget_refresh ra = refresh(a, demand(100, 0));
    ck_assert_int_eq(ra.settings.global_rps, 40);
    ck_assert_int_eq(ra.version, 3);
    ck_assert_int_eq(ra.held.global_mrps, 0);
    ck_assert_int_eq(refresh(b, demand(100, 0)).held.global_mrps, R(20));
    check_fleet(40, 0); /* within the new limit after one refresh each */
    ck_assert_int_eq(refresh(a, demand(100, 0)).held.global_mrps, R(20));
    check_fleet(40, 0);
    /* Back up: both grow within one refresh each. */
    set_limits(100, 0, 0);
    ck_assert_int_eq(refresh(a, demand(100, 0)).held.global_mrps, R(50));
    ck_assert_int_eq(refresh(b, demand(100, 0)).held.global_mrps, R(50));
    check_fleet(100, 0);
    /* Every change recorded with its actor, before and after. */
    ck_assert_str_eq(test_env_value(admin, "SELECT count(*) || ' ' || min(actor) || ' '"
                                           " || max(id) FILTER (WHERE (before->>"
                                           "'global_rps')::int = 40 AND (after->>"
                                           "'global_rps')::int = 100)"
                                           " FROM provider_budget_changes"),
                     "3 tester 3");
    ck_assert_str_eq(test_env_value(admin, "SELECT updated_by || ' ' || version"
                                           " FROM provider_budget"),
                     "tester 4");
    budget_lease_free(a);
    budget_lease_free(b);
}
END_TEST

START_TEST(bad_settings_and_demands_are_refused_and_change_nothing)
{
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    struct charged_error err;
    struct budget_change c = {.global = 1, .audit_floor = 1};
    struct budget_refresh out;
    json_t *after = NULL;
    c.to.global_rps = 10;
    c.to.audit_floor_rps = 11;
    ck_assert_int_eq(budget_lease_set(l, &c, "tester", &after, &err), CHARGED_BAD_ITEM);
    ck_assert_ptr_nonnull(strstr(err.message, "floor"));
    c.to.audit_floor_rps = 1;
    c.to.global_rps = -5;
    ck_assert_int_eq(budget_lease_set(l, &c, "tester", &after, &err), CHARGED_BAD_ITEM);
    c.to.global_rps = 10;
    ck_assert_int_eq(budget_lease_set(l, &c, "", &after, &err), CHARGED_BAD_ITEM);
    ck_assert_str_eq(test_env_value(admin,
                                    "SELECT version || ' ' || global_rps || ' '"
                                    " || (SELECT count(*) FROM"
                                    " provider_budget_changes) FROM provider_budget"),
                     "1 0 0");
    struct budget_demand d = demand(1, 0);
    d.mrps[BUDGET_PRIO_AUDIT][BUDGET_CLASS_LIST] = -1;
    ck_assert_int_eq(budget_lease_refresh(l, &d, &out, &err), CHARGED_BAD_ITEM);
    ck_assert_str_eq(
        test_env_value(admin, "SELECT count(*) FROM provider_budget_members"), "0");
    budget_lease_free(l);
}
END_TEST

START_TEST(the_default_is_no_limit)
{
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    struct budget_refresh r = refresh(l, demand(5000, 0));
    ck_assert_int_eq(r.settings.global_rps, 0);
    ck_assert_int_eq(r.held.global_mrps, BUDGET_UNLIMITED);
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        ck_assert_int_eq(r.held.class_mrps[c], BUDGET_UNLIMITED);
    /* A limit set later: the unlimited holder keeps others out until it
     * refreshed under it (the two-phase rule across the change). */
    budget_lease_t *b = member(BUDGET_LEASE_MS);
    set_limits(30, 0, 0);
    ck_assert_int_eq(refresh(b, demand(5000, 0)).held.global_mrps, 0);
    ck_assert_int_eq(refresh(l, demand(5000, 0)).held.global_mrps, R(15));
    ck_assert_int_eq(refresh(b, demand(5000, 0)).held.global_mrps, R(15));
    check_fleet(30, 0);
    budget_lease_free(l);
    budget_lease_free(b);
}
END_TEST

START_TEST(a_refresh_waits_no_longer_than_its_lock_timeout)
{
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    struct charged_error err;
    struct budget_refresh out;
    struct budget_demand d = demand(1, 0);
    PGconn *holder = test_env_connect(url);
    test_env_sql(holder, "BEGIN", 0, NULL);
    test_env_sql(holder, "SELECT * FROM provider_budget FOR UPDATE", 0, NULL);
    long long t0 = test_env_now_ms();
    ck_assert_int_eq(budget_lease_refresh(l, &d, &out, &err), CHARGED_WAIT);
    ck_assert_int_lt(test_env_now_ms() - t0,
                     test_env_deadline(2000) - test_env_now_ms());
    ck_assert_str_eq(err.code, "55P03");
    test_env_sql(holder, "COMMIT", 0, NULL);
    PQfinish(holder);
    ck_assert_str_eq(
        test_env_value(admin, "SELECT count(*) FROM provider_budget_members"), "0");
    refresh(l, d);
    budget_lease_free(l);
}
END_TEST

/* Adversary 38, finding 6: rows no member writes (a hand-written or
 * forged row of provider_budget_members). */

/* Inserts a member row of role 'forged' with every held value `held`,
 * every demand `demand`, expiring `expires_ms` from now; the statement's
 * status. */
static ExecStatusType forge(const char *held, const char *demand,
                            const char *expires_ms)
{
    const char *p[3] = {held, demand, expires_ms};
    PGresult *r = PQexecParams(
        admin,
        "INSERT INTO provider_budget_members (account, member_id, role, pid, host,"
        " demand_mrps, held_mrps, settings_version, expires_at)"
        " VALUES ('default', gen_random_uuid(), 'forged', 1, 'h',"
        " array_fill($2::bigint, ARRAY[30]), array_fill($1::bigint, ARRAY[8]), 1,"
        " now() + $3::bigint * interval '1 millisecond')",
        3, NULL, p, NULL, NULL, 0);
    ExecStatusType st = PQresultStatus(r);
    PQclear(r);
    return st;
}

/* A "no limit" row that says it lives an hour holds the fleet at 0 for at
 * most the longest lease a member may take (the refresh bounds its
 * expires_at), not for the hour. */
START_TEST(a_forged_lease_counts_no_longer_than_the_longest_lease)
{
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    set_limits(100, 0, 0);
    ck_assert_int_eq(forge("-1", "0", "3600000"), PGRES_COMMAND_OK);
    long long t0 = test_env_now_ms();
    ck_assert_int_eq(refresh(l, demand(100, 0)).held.global_mrps, 0);
    ck_assert_str_eq(test_env_value(admin,
                                    "SELECT expires_at <= clock_timestamp() +"
                                    " interval '2 seconds' FROM"
                                    " provider_budget_members WHERE role = 'forged'"),
                     "t");
    long long deadline = test_env_deadline(6000), took = -1;
    while (took < 0 && test_env_now_ms() < deadline) {
        if (refresh(l, demand(100, 0)).held.global_mrps == R(100))
            took = test_env_now_ms() - t0;
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    long long slack = test_env_deadline(1000) - test_env_now_ms();
    ck_assert_msg(took >= 0 && took < BUDGET_LEASE_MAX_MS + slack, "took %lld ms",
                  took);
    /* Migration 0022 refuses held values and demands out of range. */
    ck_assert_int_eq(forge("-5", "0", "0"), PGRES_FATAL_ERROR);
    ck_assert_int_eq(forge("0", "-5", "0"), PGRES_FATAL_ERROR);
    budget_lease_free(l);
}
END_TEST

/* Held values and demands out of range (a row written past 0022's checks)
 * neither refuse the allocation nor skew it: a negative hold counts as 0, a
 * negative demand as 0, a hold above the limit as the whole limit. */
START_TEST(absurd_held_values_and_demands_are_bounded)
{
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    set_limits(100, 0, 0);
    test_env_sql(admin,
                 "ALTER TABLE provider_budget_members DROP CONSTRAINT"
                 " provider_budget_members_held, DROP CONSTRAINT"
                 " provider_budget_members_demand",
                 0, NULL);
    ck_assert_int_eq(forge("-100000", "-5", "2000"), PGRES_COMMAND_OK);
    struct budget_refresh r = refresh(l, demand(100, 0));
    ck_assert_int_eq(r.held.global_mrps, R(100)); /* not 200: -100 is 0 */
    ck_assert_int_eq(r.members, 2);
    test_env_sql(admin, "DELETE FROM provider_budget_members WHERE role = 'forged'", 0,
                 NULL);
    ck_assert_int_eq(forge("1000000000000", "0", "1000"), PGRES_COMMAND_OK);
    r = refresh(l, demand(100, 0));
    ck_assert_int_eq(r.held.global_mrps, 0); /* the whole limit is taken */
    budget_lease_free(l);
}
END_TEST

/* Rows no member wrote whose content used to fail every refresh (adversary
 * 38f), so that the statement bounding their leases never ran and the
 * fleet stopped for good: each is tolerated, reported, and bounded. */
START_TEST(rows_that_cannot_fail_a_refresh)
{
    budget_lease_t *l = member(BUDGET_LEASE_MS);
    set_limits(100, 0, 0);
    /* An 'infinity' lease and held values with a lower bound of 0, all 0:
     * read as 8 numbers, holding nothing; the lease bounded to 2 s. */
    test_env_sql(admin,
                 "INSERT INTO provider_budget_members (account, member_id, role, pid,"
                 " host, demand_mrps, held_mrps, settings_version, expires_at)"
                 " VALUES ('default', gen_random_uuid(), 'forged', 1, 'h',"
                 " array_fill(0::bigint, ARRAY[30]), '[0:7]={0,0,0,0,0,0,0,0}',"
                 " 1, 'infinity')",
                 0, NULL);
    struct budget_refresh r = refresh(l, demand(100, 0));
    ck_assert_int_eq(r.held.global_mrps, R(100));
    ck_assert_int_eq(r.members, 2);
    ck_assert_int_eq(r.rows_unreadable, 0);
    ck_assert_int_eq(r.leases_bounded, 1);
    ck_assert(r.others_end_in_ms <= BUDGET_LEASE_MAX_MS);
    ck_assert_str_eq(test_env_value(admin,
                                    "SELECT expires_at <= clock_timestamp() +"
                                    " interval '2 seconds' FROM"
                                    " provider_budget_members WHERE role = 'forged'"),
                     "t");
    test_env_sql(admin, "DELETE FROM provider_budget_members WHERE role = 'forged'", 0,
                 NULL);
    /* One more row than an allocation divides among, each with an hour's
     * lease: the refresh reads BUDGET_MEMBERS_MAX - 1, counts the rest as
     * the whole limit (takes nothing), bounds every lease. */
    char rows[16];
    const char *p[1] = {rows};
    snprintf(rows, sizeof(rows), "%d", BUDGET_MEMBERS_MAX);
    test_env_sql(admin,
                 "INSERT INTO provider_budget_members (account, member_id, role, pid,"
                 " host, demand_mrps, held_mrps, settings_version, expires_at)"
                 " SELECT 'default', gen_random_uuid(), 'forged', 1, 'h',"
                 " array_fill(0::bigint, ARRAY[30]), array_fill(0::bigint, ARRAY[8]),"
                 " 1, now() + interval '1 hour' FROM generate_series(1, $1::int)",
                 1, p);
    long long t0 = test_env_now_ms();
    r = refresh(l, demand(100, 0));
    ck_assert_int_eq(r.held.global_mrps, 0);
    ck_assert_int_eq(r.members, BUDGET_MEMBERS_MAX);
    ck_assert_int_eq(r.rows_unread, 1);
    ck_assert_int_eq(r.leases_bounded, BUDGET_MEMBERS_MAX);
    /* They end with their bounded leases: the whole limit again then. */
    long long deadline = test_env_deadline(6000), took = -1;
    while (took < 0 && test_env_now_ms() < deadline) {
        if (refresh(l, demand(100, 0)).held.global_mrps == R(100))
            took = test_env_now_ms() - t0;
        nanosleep(&(struct timespec){0, 50 * 1000000L}, NULL);
    }
    long long slack = test_env_deadline(1000) - test_env_now_ms();
    ck_assert_msg(took >= 0 && took < BUDGET_LEASE_MAX_MS + slack, "took %lld ms",
                  took);
    /* An array that is not 8 numbers (past 0020's checks): counted as the
     * whole limit, asking nothing, not a failed refresh. */
    test_env_sql(admin,
                 "ALTER TABLE provider_budget_members DROP CONSTRAINT"
                 " provider_budget_members_held_mrps_check",
                 0, NULL);
    test_env_sql(admin,
                 "INSERT INTO provider_budget_members (account, member_id, role, pid,"
                 " host, demand_mrps, held_mrps, settings_version, expires_at)"
                 " VALUES ('default', gen_random_uuid(), 'forged', 1, 'h',"
                 " array_fill(0::bigint, ARRAY[30]), '{0,0}', 1,"
                 " now() + interval '1 second')",
                 0, NULL);
    r = refresh(l, demand(100, 0));
    ck_assert_int_eq(r.rows_unreadable, 1);
    ck_assert_int_eq(r.held.global_mrps, 0);
    budget_lease_free(l);
}
END_TEST

#define THREADS 4
#define ROUNDS  25

static pthread_barrier_t go;
static atomic_int stop, over, waited, done_ok;

/* One member: ROUNDS refreshes, each begun with the others at a barrier,
 * under demands that shift every round. */
static void *member_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    struct charged_error err;
    budget_lease_t *l =
        budget_lease_new(url, BUDGET_ACCOUNT_DEFAULT, "thread", 2000, &err);
    for (int i = 0; i < ROUNDS; i++) {
        struct budget_demand d = demand(rand_r(&seed) % 80, rand_r(&seed) % 40);
        struct budget_refresh out;
        pthread_barrier_wait(&go); /* every round, or the others would hang */
        enum charged_rc rc =
            l ? budget_lease_refresh(l, &d, &out, &err) : CHARGED_RETRY;
        if (rc == CHARGED_WAIT)
            atomic_fetch_add(&waited, 1);
        else if (rc == CHARGED_OK)
            atomic_fetch_add(&done_ok, 1);
    }
    budget_lease_free(l);
    return NULL;
}

/* Reads the live members' sum over and over while they refresh. */
static void *checker_thread(void *arg)
{
    PGconn *c = PQconnectdb(url);
    (void)arg;
    while (!atomic_load(&stop) && PQstatus(c) == CONNECTION_OK) {
        PGresult *r =
            PQexec(c, "SELECT coalesce(sum(held_mrps[1]), 0),"
                      " coalesce(sum(held_mrps[2]), 0)"
                      " FROM provider_budget_members WHERE expires_at > now()");
        if (PQresultStatus(r) == PGRES_TUPLES_OK &&
            (atoll(PQgetvalue(r, 0, 0)) > R(50) || atoll(PQgetvalue(r, 0, 1)) > R(20)))
            atomic_fetch_add(&over, 1);
        PQclear(r);
    }
    PQfinish(c);
    return NULL;
}

START_TEST(concurrent_refreshes_never_pass_the_limit)
{
    pthread_t t[THREADS], checker;
    set_limits(50, 20, 0);
    pthread_barrier_init(&go, NULL, THREADS);
    pthread_create(&checker, NULL, checker_thread, NULL);
    for (int i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, member_thread, (void *)(uintptr_t)(i + 1));
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    atomic_store(&stop, 1);
    pthread_join(checker, NULL);
    pthread_barrier_destroy(&go);
    ck_assert_int_eq(atomic_load(&over), 0);
    ck_assert_int_eq(atomic_load(&done_ok) + atomic_load(&waited), THREADS * ROUNDS);
    ck_assert_int_gt(atomic_load(&done_ok), THREADS * ROUNDS / 2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("budget_lease");
    TCase *tc = tcase_create("budget_lease");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, two_members_never_hold_more_than_the_limit);
    tcase_add_test(tc, three_members_shifting_demand_stay_within_and_converge);
    tcase_add_test(tc, a_member_that_stops_refreshing_is_dropped_after_its_lease);
    tcase_add_test(tc, a_settings_change_is_followed_on_the_next_refresh);
    tcase_add_test(tc, bad_settings_and_demands_are_refused_and_change_nothing);
    tcase_add_test(tc, the_default_is_no_limit);
    tcase_add_test(tc, a_refresh_waits_no_longer_than_its_lock_timeout);
    tcase_add_test(tc, concurrent_refreshes_never_pass_the_limit);
    tcase_add_test(tc, a_forged_lease_counts_no_longer_than_the_longest_lease);
    tcase_add_test(tc, absurd_held_values_and_demands_are_bounded);
    tcase_add_test(tc, rows_that_cannot_fail_a_refresh);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
