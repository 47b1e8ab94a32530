/* worker/operations/void's store against the real PostgreSQL of the local
 * stack: the claim takes the authorization's hold or rejects with its code
 * before any call; of two voids of one authorization claimed at once from
 * two sessions exactly one holds it (100 rounds); a void's outcome moves
 * its authorization in the same transaction (SUCCEEDED: VOIDED, FAILED
 * void_after_capture: REQUIRES_REVIEW, the hold back) and only under its
 * own lease; a key another operation holds is a conflict. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "test_env.h"
#include "void.h"
#include "void_command.h"

static char url[1024];
static PGconn *admin;
static struct charged_error e0;

/* An attempt of capture_method `method` in `status`; its id in out. */
static void attempt_in(const char *status, const char *method, char out[37])
{
    char order[37];
    test_env_uuid(out);
    test_env_uuid(order);
    const char *p[] = {out, order, status, method};
    test_env_sql(admin,
                 "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
                 " request_fingerprint, amount, currency, payment_method, status,"
                 " provider_payment_id, capture_method) VALUES ($1::uuid, $2::uuid,"
                 " 'k-' || $1::text, 'fp', 900, 'EUR', 'pm_card_visa', $3,"
                 " 'pi_' || left($1::text, 8), $4)",
                 4, p);
}

/* A parsed void of attempt (key: "v-" and its void_id). */
static struct void_command void_of(const char *attempt)
{
    struct void_command c;
    struct charged_error err = {0};
    char id[37], json[512];
    test_env_uuid(id);
    snprintf(json, sizeof(json),
             "{\"type\":\"void.requested\",\"version\":1,\"void_id\":\"%s\","
             "\"payment_attempt_id\":\"%s\",\"idempotency_key\":\"v-%s\","
             "\"reason\":\"abandoned\"}",
             id, attempt, id);
    ck_assert_int_eq(void_command_parse(attempt, 36, json, strlen(json), 0, &c, &err),
                     DEAD_LETTER_NONE);
    return c;
}

static enum engine_record_result record(void_store_t *st, struct void_command *c)
{
    struct charged_error err = {0};
    struct engine_record it = {.command = c};
    ck_assert_int_eq(void_store_record(st, &it, 1, &err), CHARGED_OK);
    void_command_release(c);
    return it.result;
}

static struct engine_claim claim(void_store_t *st, const char *id,
                                 struct void_params *p)
{
    struct charged_error err = {0};
    struct engine_claim it = {.id = id, .params = p};
    ck_assert_int_eq(void_store_claim(st, &it, 1, 30000, &err), CHARGED_OK);
    return it;
}

static char *value(const char *fmt, const char *id)
{
    char q[512];
    snprintf(q, sizeof(q), fmt, id);
    return test_env_value(admin, q);
}

START_TEST(a_claim_takes_the_hold_or_says_why_not)
{
    void_store_t *st = void_store_new(url, "w1", &e0);
    struct void_params p;
    char held[37], charge[37], captured[37], voided[37];
    attempt_in("AUTHORIZED", "manual", held);
    attempt_in("SUCCEEDED", "automatic", charge);
    attempt_in("AUTHORIZED", "manual", captured);
    test_env_sql(admin,
                 "UPDATE payment_attempts SET status = 'SUCCEEDED',"
                 " captured_amount = 900 WHERE id = $1",
                 1, (const char *const[]){captured});
    attempt_in("VOIDED", "manual", voided);
    const char *ids[4] = {held, charge, captured, voided};
    const char *codes[4] = {"", "not_authorized", "void_after_capture",
                            "authorization_voided"};
    for (int i = 0; i < 4; i++) {
        struct void_command c = void_of(ids[i]);
        char vid[37];
        snprintf(vid, sizeof(vid), "%s", c.void_id);
        ck_assert_int_eq(record(st, &c), ENGINE_RECORDED);
        struct engine_claim it = claim(st, vid, &p);
        if (i == 0) {
            ck_assert_int_eq(it.result, ENGINE_CLAIMED);
            ck_assert_str_eq(p.payment_intent,
                             value("SELECT provider_payment_id FROM"
                                   " payment_attempts WHERE id = '%s'",
                                   held));
            ck_assert_int_eq(p.amount, 900);
            char want[64];
            snprintf(want, sizeof(want), "void %s", vid);
            ck_assert_str_eq(value("SELECT held_by || ' ' || held_by_id"
                                   " FROM payment_attempts WHERE id = '%s'",
                                   held),
                             want);
        } else {
            ck_assert_int_eq(it.result, ENGINE_SETTLED);
            ck_assert_msg(!strncmp(it.rejected, codes[i], strlen(codes[i])), "%d: %s",
                          i, it.rejected);
        }
    }
    /* The held one again, by another void: held. */
    struct void_command c = void_of(held);
    char vid[37];
    snprintf(vid, sizeof(vid), "%s", c.void_id);
    ck_assert_int_eq(record(st, &c), ENGINE_RECORDED);
    struct engine_claim it = claim(st, vid, &p);
    ck_assert_int_eq(it.result, ENGINE_SETTLED);
    ck_assert(!strncmp(it.rejected, "authorization_held", 18));
    ck_assert_str_eq(
        value("SELECT count(*) FROM outbox WHERE event_type = 'void.rejected'"
              " AND '%s' <> ''",
              vid),
        "4");
    void_store_free(st);
}
END_TEST

/* The outcome of a claimed void, persisted under `epoch`: persisted? */
static int persist(void_store_t *st, const char *id, int64_t epoch, const char *status,
                   const char *reason)
{
    struct charged_error err = {0};
    struct engine_outcome o = {.id = id,
                               .lease_epoch = epoch,
                               .status = status,
                               .reason = reason,
                               .provider_id = "pi_x",
                               .event_type = NULL,
                               .evidence_json = "{}",
                               .calls = 1,
                               .next_check_ms = -1};
    ck_assert_msg(void_store_persist(st, &o, 1, &err) == CHARGED_OK, "%s", err.message);
    return o.persisted;
}

START_TEST(an_outcome_moves_its_authorization_under_its_lease)
{
    void_store_t *st = void_store_new(url, "w1", &e0);
    struct void_params p;
    const char *ends[2][3] = {{"SUCCEEDED", NULL, "VOIDED abandoned"},
                              {"FAILED", "void_after_capture: intent succeeded",
                               "REQUIRES_REVIEW void_after_capture: intent succeeded"}};
    for (int i = 0; i < 2; i++) {
        char a[37], vid[37];
        attempt_in("AUTHORIZED", "manual", a);
        struct void_command c = void_of(a);
        snprintf(vid, sizeof(vid), "%s", c.void_id);
        record(st, &c);
        struct engine_claim it = claim(st, vid, &p);
        ck_assert_int_eq(it.result, ENGINE_CLAIMED);
        /* Not under its lease: nothing moves. */
        ck_assert_int_eq(persist(st, vid, it.lease_epoch + 1, ends[i][0], ends[i][1]),
                         0);
        ck_assert_str_eq(
            value("SELECT status FROM payment_attempts WHERE id = '%s'", a),
            "AUTHORIZED");
        ck_assert_int_eq(persist(st, vid, it.lease_epoch, ends[i][0], ends[i][1]), 1);
        ck_assert_str_eq(value("SELECT status || ' ' || reason || coalesce(held_by, '')"
                               " FROM payment_attempts WHERE id = '%s'",
                               a),
                         ends[i][2]);
        ck_assert_str_eq(value("SELECT count(*) FROM attempt_transitions"
                               " WHERE payment_attempt_id = '%s'",
                               a),
                         "1");
    }
    void_store_free(st);
}
END_TEST

START_TEST(a_key_another_operation_holds_is_a_conflict)
{
    void_store_t *st = void_store_new(url, "w1", &e0);
    char a[37];
    attempt_in("AUTHORIZED", "manual", a);
    struct void_command c = void_of(a);
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "k-%s", a);
    ck_assert_int_eq(record(st, &c), ENGINE_CONFLICT);
    ck_assert_str_eq(value("SELECT count(*) FROM void_attempts WHERE payment_attempt_id"
                           " = '%s'",
                           a),
                     "0");
    void_store_free(st);
}
END_TEST

struct side {
    void_store_t *st;
    char id[37];
    pthread_barrier_t *go;
    struct engine_claim it;
    struct void_params p;
};

/* Claims its void once the other side is ready too; a claim held past
 * lock_timeout by the other's (CHARGED_WAIT), or busy, is tried again, as
 * the engine does. */
static void *claim_side(void *arg)
{
    struct side *s = arg;
    struct charged_error err;
    enum charged_rc rc;
    long long until = test_env_deadline(10000);
    pthread_barrier_wait(s->go);
    do {
        s->it = (struct engine_claim){.id = s->id, .params = &s->p};
        rc = void_store_claim(s->st, &s->it, 1, 30000, &err);
    } while (
        (rc == CHARGED_WAIT || (rc == CHARGED_OK && s->it.result == ENGINE_BUSY)) &&
        test_env_now_ms() < until);
    return NULL;
}

START_TEST(two_sessions_one_hold)
{
    struct side x = {.st = void_store_new(url, "w1", &e0)},
                y = {.st = void_store_new(url, "w2", &e0)};
    for (int round = 0; round < 100; round++) {
        pthread_barrier_t go;
        pthread_t tx, ty;
        char a[37];
        attempt_in("AUTHORIZED", "manual", a);
        struct void_command cx = void_of(a), cy = void_of(a);
        snprintf(x.id, sizeof(x.id), "%s", cx.void_id);
        snprintf(y.id, sizeof(y.id), "%s", cy.void_id);
        record(x.st, &cx);
        record(y.st, &cy);
        pthread_barrier_init(&go, NULL, 2);
        x.go = y.go = &go;
        pthread_create(&tx, NULL, claim_side, &x);
        pthread_create(&ty, NULL, claim_side, &y);
        pthread_join(tx, NULL);
        pthread_join(ty, NULL);
        pthread_barrier_destroy(&go);
        int claimed = (x.it.result == ENGINE_CLAIMED) + (y.it.result == ENGINE_CLAIMED);
        ck_assert_msg(claimed == 1, "round %d: %d voids hold one authorization", round,
                      claimed);
        const struct side *lost = x.it.result == ENGINE_CLAIMED ? &y : &x;
        const struct side *won = lost == &x ? &y : &x;
        ck_assert_msg(!strncmp(lost->it.rejected, "authorization_held", 18),
                      "round %d: %s", round, lost->it.rejected);
        ck_assert_str_eq(
            value("SELECT held_by_id FROM payment_attempts WHERE id = '%s'", a),
            won->id);
    }
    void_store_free(x.st);
    void_store_free(y.st);
}
END_TEST

static void setup(void)
{
    test_env_migrated_database(url, sizeof(url));
    admin = test_env_connect(url);
}

static void teardown(void)
{
    PQfinish(admin);
}

int main(void)
{
    Suite *s = suite_create("void_store");
    TCase *tc = tcase_create("void_store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, a_claim_takes_the_hold_or_says_why_not);
    tcase_add_test(tc, an_outcome_moves_its_authorization_under_its_lease);
    tcase_add_test(tc, a_key_another_operation_holds_is_a_conflict);
    tcase_add_test(tc, two_sessions_one_hold);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
