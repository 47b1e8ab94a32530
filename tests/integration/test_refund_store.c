/* worker/operations/refund/refund_store against the real PostgreSQL of the local stack:
 * record (conflicts, a charge's key), the claim's atomic reservation
 * (exceeds_charge, not_refundable, one refund of a charge per statement),
 * the money of each outcome (a failure gives back, a success books once),
 * fencing, and two refunds of one charge claimed at once from two sessions,
 * 200 times: never an over-refund. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "attempt_store.h"
#include "refund_store.h"
#include "test_env.h"

static struct charged_error err;
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

static refund_store_t *store(const char *actor)
{
    refund_store_t *st = refund_store_new(url, actor, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    return st;
}

static char *value(const char *q)
{
    return test_env_value(admin, q);
}

static long long number(const char *q)
{
    return strtoll(value(q), NULL, 10);
}

/* A payment attempt in `status` for `amount`; its id in out. */
static void charge(const char *status, long long amount, char out[37])
{
    char order[37], key[64], amt[24], pi[64];
    test_env_uuid(out);
    test_env_uuid(order);
    snprintf(key, sizeof(key), "charge:%s", out);
    snprintf(amt, sizeof(amt), "%lld", amount);
    snprintf(pi, sizeof(pi), "pi_%.8s", out);
    const char *p[] = {out, order, key, amt, status, pi};
    test_env_sql(admin,
                 "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
                 " request_fingerprint, amount, currency, payment_method, status,"
                 " provider_payment_id) VALUES ($1, $2, $3, 'fp', $4, 'EUR',"
                 " 'pm_card_visa', $5, CASE WHEN $5 = 'SUCCEEDED' THEN $6 END)",
                 6, p);
}

static struct refund_command refund(const char *attempt, long long amount)
{
    struct refund_command c = {0};
    test_env_uuid(c.refund_id);
    snprintf(c.payment_attempt_id, sizeof(c.payment_attempt_id), "%s", attempt);
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "refund:%s", c.refund_id);
    c.amount = amount;
    snprintf(c.reason, sizeof(c.reason), "requested_by_customer");
    snprintf(c.fingerprint, sizeof(c.fingerprint), "fp-%lld", amount);
    return c;
}

static enum refund_record_result
record1(refund_store_t *st, const struct refund_command *c, char *reason, size_t size)
{
    struct refund_record_item it = {.cmd = c};
    ck_assert_msg(refund_store_record(st, &it, 1, &err) == CHARGED_OK, "%s",
                  err.message);
    if (reason)
        snprintf(reason, size, "%s", it.reason);
    return it.result;
}

static struct refund_claim_item claim1(refund_store_t *st, const char *refund_id)
{
    struct refund_claim_item it = {.refund_id = refund_id};
    ck_assert_msg(refund_store_claim(st, &it, 1, 30000, &err) == CHARGED_OK, "%s",
                  err.message);
    return it;
}

static char q[512];

static long long reserved_of(const char *attempt)
{
    snprintf(q, sizeof(q),
             "SELECT refund_reserved FROM payment_attempts WHERE id = '%s'", attempt);
    return number(q);
}

static const char *status_of(const char *refund_id)
{
    snprintf(q, sizeof(q), "SELECT status FROM refund_attempts WHERE id = '%s'",
             refund_id);
    return value(q);
}

START_TEST(record_is_idempotent_and_refuses_reused_ids_and_keys)
{
    refund_store_t *st = store("w1");
    char attempt[37], why[160];
    charge("SUCCEEDED", 1000, attempt);
    struct refund_command a = refund(attempt, 400), again = a, other = a, same_key,
                          charge_key;
    ck_assert_int_eq(record1(st, &a, NULL, 0), REFUND_RECORDED);
    ck_assert_int_eq(record1(st, &again, NULL, 0), REFUND_RECORDED);
    other.amount = 500;
    snprintf(other.fingerprint, sizeof(other.fingerprint), "fp-500");
    ck_assert_int_eq(record1(st, &other, why, sizeof(why)), REFUND_CONFLICT);
    ck_assert_msg(strstr(why, a.refund_id), "%s", why);
    same_key = refund(attempt, 400);
    snprintf(same_key.idempotency_key, sizeof(same_key.idempotency_key), "%s",
             a.idempotency_key);
    ck_assert_int_eq(record1(st, &same_key, why, sizeof(why)), REFUND_CONFLICT);
    ck_assert_msg(strstr(why, "belongs to refund"), "%s", why);
    charge_key = refund(attempt, 100);
    snprintf(charge_key.idempotency_key, sizeof(charge_key.idempotency_key),
             "charge:%s", attempt);
    ck_assert_int_eq(record1(st, &charge_key, why, sizeof(why)), REFUND_CONFLICT);
    ck_assert_msg(strstr(why, "payment attempt"), "%s", why);
    /* The first refund is untouched: one row, its own amount. */
    snprintf(q, sizeof(q),
             "SELECT count(*) || ':' || max(amount) FROM refund_attempts"
             " WHERE payment_attempt_id = '%s'",
             attempt);
    ck_assert_str_eq(value(q), "1:400");
    refund_store_free(st);
}
END_TEST

/* The provider keeps one namespace of keys: a charge never takes a key a
 * refund already has. */
START_TEST(a_charge_with_a_refunds_key_is_a_conflict)
{
    refund_store_t *st = store("w1");
    struct charged_error e;
    attempt_store_t *charges = attempt_store_new(url, "w1", &e);
    ck_assert_msg(charges != NULL, "%s", e.message);
    char attempt[37];
    charge("SUCCEEDED", 1000, attempt);
    struct refund_command r = refund(attempt, 100);
    ck_assert_int_eq(record1(st, &r, NULL, 0), REFUND_RECORDED);
    struct charge_command c = {0};
    test_env_uuid(c.payment_attempt_id);
    test_env_uuid(c.order_id);
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "%s", r.idempotency_key);
    c.amount = 100;
    snprintf(c.currency, sizeof(c.currency), "EUR");
    snprintf(c.payment_method, sizeof(c.payment_method), "pm_card_visa");
    snprintf(c.fingerprint, sizeof(c.fingerprint), "fp");
    struct attempt_record_item it = {.cmd = &c};
    ck_assert_msg(attempt_store_record(charges, &it, 1, 0, &e) == CHARGED_OK, "%s",
                  e.message);
    ck_assert_int_eq(it.result, ATTEMPT_CONFLICT);
    ck_assert_msg(strstr(it.reason, "belongs to refund"), "%s", it.reason);
    snprintf(q, sizeof(q), "SELECT count(*) FROM payment_attempts WHERE id = '%s'",
             c.payment_attempt_id);
    ck_assert_int_eq(number(q), 0);
    attempt_store_free(charges);
    refund_store_free(st);
}
END_TEST

/* The statements that take a key, as the stores write them: each checks
 * the other table first, which sees only what its snapshot holds. */
static const char *const TAKE_AS_REFUND =
    "INSERT INTO refund_attempts (id, payment_attempt_id, idempotency_key,"
    " request_fingerprint, amount, refund_reason, status)"
    " SELECT $1, $2, $3, 'fp', 100, 'requested_by_customer', 'PENDING'"
    " WHERE NOT EXISTS (SELECT 1 FROM payment_attempts WHERE idempotency_key = $3)"
    " ON CONFLICT DO NOTHING";
static const char *const TAKE_AS_CHARGE =
    "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
    " request_fingerprint, amount, currency, payment_method, status)"
    " SELECT $1, $2, $3, 'fp', 100, 'EUR', 'pm_card_visa', 'PENDING'"
    " WHERE NOT EXISTS (SELECT 1 FROM refund_attempts WHERE idempotency_key = $3)"
    " ON CONFLICT DO NOTHING";

/* Session `first` takes key as one kind and holds its transaction open;
 * session `second` takes it as the other kind meanwhile. The second
 * waits on the key (its backend is seen waiting on a lock) and, once the
 * first commits, is refused: only one row ever holds the key. */
static void race_for_key(const char *first_sql, const char *second_sql, const char *key)
{
    char attempt[37], a_id[37], b_id[37], order[37];
    charge("SUCCEEDED", 1000, attempt);
    test_env_uuid(a_id);
    test_env_uuid(b_id);
    test_env_uuid(order);
    PGconn *first = test_env_connect(url), *second = test_env_connect(url);
    const char *pf[] = {a_id, first_sql == TAKE_AS_REFUND ? attempt : order, key};
    const char *ps[] = {b_id, second_sql == TAKE_AS_REFUND ? attempt : order, key};
    test_env_sql(first, "BEGIN", 0, NULL);
    test_env_sql(first, first_sql, 3, pf);
    ck_assert_int_eq(PQsendQueryParams(second, second_sql, 3, NULL, ps, NULL, NULL, 0),
                     1);
    /* Until the second is blocked on the first's key, or done. */
    char pid[16], wq[256];
    snprintf(pid, sizeof(pid), "%d", PQbackendPID(second));
    snprintf(wq, sizeof(wq),
             "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
             " AND wait_event_type = 'Lock'",
             pid);
    long long deadline = test_env_deadline(10000);
    int waiting = 0;
    while (!waiting && test_env_now_ms() < deadline) {
        ck_assert_int_eq(PQconsumeInput(second), 1);
        if (!PQisBusy(second))
            break;
        waiting = number(wq) == 1;
    }
    ck_assert_msg(waiting, "the second session took the key without waiting");
    test_env_sql(first, "COMMIT", 0, NULL);
    PGresult *r = PQgetResult(second);
    ck_assert_msg(PQresultStatus(r) == PGRES_FATAL_ERROR, "the second took it too");
    ck_assert_str_eq(PQresultErrorField(r, PG_DIAG_SQLSTATE), "23505");
    PQclear(r);
    while ((r = PQgetResult(second)))
        PQclear(r);
    const char *pk[] = {key};
    PGresult *n = PQexecParams(
        admin,
        "SELECT (SELECT count(*) FROM payment_attempts WHERE idempotency_key = $1) +"
        " (SELECT count(*) FROM refund_attempts WHERE idempotency_key = $1)",
        1, NULL, pk, NULL, NULL, 0);
    ck_assert_str_eq(PQgetvalue(n, 0, 0), "1");
    PQclear(n);
    PQfinish(first);
    PQfinish(second);
}

START_TEST(a_charge_and_a_refund_never_both_take_one_key)
{
    char key[64], uuid[37];
    test_env_uuid(uuid);
    snprintf(key, sizeof(key), "race:%s", uuid);
    race_for_key(TAKE_AS_REFUND, TAKE_AS_CHARGE, key);
    /* The worker's record of the losing charge ends as any reused key. */
    struct charged_error e;
    attempt_store_t *charges = attempt_store_new(url, "w1", &e);
    ck_assert_msg(charges != NULL, "%s", e.message);
    struct charge_command c = {0};
    test_env_uuid(c.payment_attempt_id);
    test_env_uuid(c.order_id);
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "%s", key);
    c.amount = 100;
    snprintf(c.currency, sizeof(c.currency), "EUR");
    snprintf(c.payment_method, sizeof(c.payment_method), "pm_card_visa");
    snprintf(c.fingerprint, sizeof(c.fingerprint), "fp");
    struct attempt_record_item it = {.cmd = &c};
    ck_assert_msg(attempt_store_record(charges, &it, 1, 0, &e) == CHARGED_OK, "%s",
                  e.message);
    ck_assert_int_eq(it.result, ATTEMPT_CONFLICT);
    attempt_store_free(charges);

    test_env_uuid(uuid);
    snprintf(key, sizeof(key), "race:%s", uuid);
    race_for_key(TAKE_AS_CHARGE, TAKE_AS_REFUND, key);
}
END_TEST

START_TEST(claim_reserves_within_the_charge_and_rejects_the_rest)
{
    refund_store_t *st = store("w1");
    char attempt[37], pending[37], unknown[37];
    charge("SUCCEEDED", 1000, attempt);
    charge("PROCESSING", 1000, pending);
    test_env_uuid(unknown);
    struct refund_command r1 = refund(attempt, 700), r2 = refund(attempt, 301),
                          r3 = refund(attempt, 300), r4 = refund(pending, 10),
                          r5 = refund(unknown, 10);
    const struct refund_command *all[] = {&r1, &r2, &r3, &r4, &r5};
    for (size_t i = 0; i < 5; i++)
        ck_assert_int_eq(record1(st, all[i], NULL, 0), REFUND_RECORDED);

    struct refund_claim_item c1 = claim1(st, r1.refund_id);
    ck_assert_int_eq(c1.result, REFUND_CLAIMED);
    ck_assert_str_eq(c1.status, "PENDING");
    ck_assert_int_eq(c1.params.amount, 700);
    ck_assert_str_eq(c1.params.payment_attempt_id, attempt);
    ck_assert_msg(!strncmp(c1.params.payment_intent, "pi_", 3), "%s",
                  c1.params.payment_intent);
    ck_assert_int_eq(reserved_of(attempt), 700);

    struct refund_claim_item c2 = claim1(st, r2.refund_id);
    ck_assert_int_eq(c2.result, REFUND_SETTLED);
    ck_assert_msg(!strncmp(c2.rejected, "exceeds_charge", 14), "%s", c2.rejected);
    ck_assert_str_eq(status_of(r2.refund_id), "REJECTED");
    ck_assert_int_eq(reserved_of(attempt), 700);

    ck_assert_int_eq(claim1(st, r3.refund_id).result, REFUND_CLAIMED);
    ck_assert_int_eq(reserved_of(attempt), 1000);

    /* A refund of a charge still in flight waits for it; once the charge
     * ends other than SUCCEEDED, the refund is not refundable. */
    ck_assert_int_eq(claim1(st, r4.refund_id).result, REFUND_BUSY);
    snprintf(q, sizeof(q),
             "UPDATE payment_attempts SET status = 'FAILED' WHERE id = '%s'", pending);
    test_env_sql(admin, q, 0, NULL);
    struct refund_claim_item c4 = claim1(st, r4.refund_id);
    ck_assert_int_eq(c4.result, REFUND_SETTLED);
    ck_assert_msg(!strncmp(c4.rejected, "not_refundable", 14), "%s", c4.rejected);
    struct refund_claim_item c5 = claim1(st, r5.refund_id);
    ck_assert_msg(!strncmp(c5.rejected, "not_refundable", 14), "%s", c5.rejected);

    /* Each rejection has its event, keyed by the charge's attempt. */
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM outbox WHERE event_type = 'refund.rejected'"
             " AND refund_id IN ('%s', '%s', '%s')"
             " AND payload->>'reason' LIKE '%%_%%:%%'",
             r2.refund_id, r4.refund_id, r5.refund_id);
    ck_assert_int_eq(number(q), 3);
    /* A claimed refund claimed again is busy; a rejected one is settled. */
    ck_assert_int_eq(claim1(st, r1.refund_id).result, REFUND_BUSY);
    ck_assert_int_eq(claim1(st, r2.refund_id).result, REFUND_SETTLED);
    refund_store_free(st);
}
END_TEST

START_TEST(one_refund_of_a_charge_per_claim_statement)
{
    refund_store_t *st = store("w1");
    char attempt[37];
    charge("SUCCEEDED", 1000, attempt);
    struct refund_command a = refund(attempt, 600), b = refund(attempt, 600);
    ck_assert_int_eq(record1(st, &a, NULL, 0), REFUND_RECORDED);
    ck_assert_int_eq(record1(st, &b, NULL, 0), REFUND_RECORDED);
    struct refund_claim_item items[2] = {{.refund_id = a.refund_id},
                                         {.refund_id = b.refund_id}};
    ck_assert(refund_store_claim(st, items, 2, 30000, &err) == CHARGED_OK);
    int claimed =
        (items[0].result == REFUND_CLAIMED) + (items[1].result == REFUND_CLAIMED);
    int busy = (items[0].result == REFUND_BUSY) + (items[1].result == REFUND_BUSY);
    ck_assert_int_eq(claimed, 1);
    ck_assert_int_eq(busy, 1);
    const char *later = items[0].result == REFUND_BUSY ? a.refund_id : b.refund_id;
    struct refund_claim_item again = claim1(st, later);
    ck_assert_int_eq(again.result, REFUND_SETTLED);
    ck_assert_msg(!strncmp(again.rejected, "exceeds_charge", 14), "%s", again.rejected);
    ck_assert_int_eq(reserved_of(attempt), 600);
    refund_store_free(st);
}
END_TEST

START_TEST(refunds_of_a_charge_reserve_in_the_order_recorded)
{
    refund_store_t *st = store("w1");
    char attempt[37];
    charge("SUCCEEDED", 1000, attempt);
    struct refund_command first = refund(attempt, 600), second = refund(attempt, 600);
    struct refund_record_item rec[2] = {{.cmd = &first}, {.cmd = &second}};
    ck_assert(refund_store_record(st, rec, 2, &err) == CHARGED_OK);
    /* The later one asks first: it waits for the earlier one. */
    ck_assert_int_eq(claim1(st, second.refund_id).result, REFUND_BUSY);
    ck_assert_int_eq(claim1(st, first.refund_id).result, REFUND_CLAIMED);
    struct refund_claim_item later = claim1(st, second.refund_id);
    ck_assert_int_eq(later.result, REFUND_SETTLED);
    ck_assert_msg(!strncmp(later.rejected, "exceeds_charge", 14), "%s", later.rejected);
    refund_store_free(st);
}
END_TEST

/* As above with the ids against the batch's order: the earlier message's
 * refund id sorts last. Order is the messages', never the ids'. */
START_TEST(batch_order_not_id_order_decides_which_refund_reserves)
{
    refund_store_t *st = store("w1");
    char attempt[37];
    charge("SUCCEEDED", 1000, attempt);
    struct refund_command first = refund(attempt, 600), second = refund(attempt, 600);
    memcpy(first.refund_id, "ffffffff", 8);
    memcpy(second.refund_id, "00000000", 8);
    snprintf(first.idempotency_key, sizeof(first.idempotency_key), "refund:%s",
             first.refund_id);
    snprintf(second.idempotency_key, sizeof(second.idempotency_key), "refund:%s",
             second.refund_id);
    struct refund_record_item rec[2] = {{.cmd = &first}, {.cmd = &second}};
    ck_assert(refund_store_record(st, rec, 2, &err) == CHARGED_OK);
    ck_assert_int_eq(claim1(st, second.refund_id).result, REFUND_BUSY);
    ck_assert_int_eq(claim1(st, first.refund_id).result, REFUND_CLAIMED);
    ck_assert_int_eq(claim1(st, second.refund_id).result, REFUND_SETTLED);
    refund_store_free(st);
}
END_TEST

static void persist1(refund_store_t *st, const char *id, int64_t epoch,
                     const char *status, const char *prid, int expect_persisted)
{
    struct refund_outcome o = {
        .refund_id = id,
        .lease_epoch = epoch,
        .status = status,
        .reason = strcmp(status, "SUCCEEDED") ? "provider said so" : NULL,
        .provider_refund_id = prid,
        .event_type = attempt_status_refund_event_type(attempt_status_parse(status)),
        .next_check_ms = -1,
        .calls = 1,
    };
    ck_assert_msg(refund_store_persist(st, &o, 1, &err) == CHARGED_OK, "%s",
                  err.message);
    ck_assert_int_eq(o.persisted, expect_persisted);
}

START_TEST(outcomes_move_the_money_once)
{
    refund_store_t *st = store("w1"), *late = store("w2");
    char attempt[37];
    charge("SUCCEEDED", 1000, attempt);
    struct refund_command ok = refund(attempt, 300), failed = refund(attempt, 300),
                          unknown = refund(attempt, 300);
    const struct refund_command *all[] = {&ok, &failed, &unknown};
    struct refund_claim_item c[3];
    for (size_t i = 0; i < 3; i++) {
        ck_assert_int_eq(record1(st, all[i], NULL, 0), REFUND_RECORDED);
        c[i] = claim1(st, all[i]->refund_id);
        ck_assert_int_eq(c[i].result, REFUND_CLAIMED);
    }
    ck_assert_int_eq(reserved_of(attempt), 900);
    /* A stale epoch is fenced out. */
    persist1(st, ok.refund_id, c[0].lease_epoch + 1, "SUCCEEDED", "re_1", 0);
    persist1(late, ok.refund_id, c[0].lease_epoch, "SUCCEEDED", "re_1", 0);
    persist1(st, ok.refund_id, c[0].lease_epoch, "SUCCEEDED", "re_1", 1);
    persist1(st, failed.refund_id, c[1].lease_epoch, "FAILED", NULL, 1);
    persist1(st, unknown.refund_id, c[2].lease_epoch, "UNKNOWN", NULL, 1);
    /* The failure gave its 300 back; the unknown keeps its own. */
    ck_assert_int_eq(reserved_of(attempt), 600);
    snprintf(q, sizeof(q),
             "SELECT refunded_amount FROM payment_attempts WHERE id = '%s'", attempt);
    ck_assert_int_eq(number(q), 300);
    snprintf(q, sizeof(q),
             "SELECT count(*) || ':' || sum(amount) || ':' || min(provider_refund_id)"
             " FROM ledger_entries WHERE kind = 'refund' AND payment_attempt_id = '%s'",
             attempt);
    ck_assert_str_eq(value(q), "1:300:re_1");
    /* The same success again changes nothing. */
    persist1(st, ok.refund_id, c[0].lease_epoch, "SUCCEEDED", "re_1", 0);
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM ledger_entries WHERE kind = 'refund'"
             " AND payment_attempt_id = '%s'",
             attempt);
    ck_assert_int_eq(number(q), 1);
    /* A SUCCEEDED refund never leaves SUCCEEDED, whoever writes. */
    snprintf(q, sizeof(q),
             "UPDATE refund_attempts SET status = 'FAILED' WHERE id = '%s'",
             ok.refund_id);
    PGresult *r = PQexec(admin, q);
    ck_assert_int_eq(PQresultStatus(r), PGRES_FATAL_ERROR);
    PQclear(r);
    refund_store_free(st);
    refund_store_free(late);
}
END_TEST

/* ---- two sessions, one charge ---- */

struct racer {
    refund_store_t *st;
    const char *refund_id;
    pthread_barrier_t *start;
    struct refund_claim_item item;
    enum charged_rc rc;
};

static void *race(void *arg)
{
    struct racer *r = arg;
    struct charged_error e;
    r->item = (struct refund_claim_item){.refund_id = r->refund_id};
    pthread_barrier_wait(r->start);
    r->rc = refund_store_claim(r->st, &r->item, 1, 30000, &e);
    long long deadline = test_env_deadline(10000);
    /* Locked by the other's reservation for past lock_timeout: the engine
     * waits and claims again, as here. */
    while ((r->rc == CHARGED_WAIT ||
            (r->rc == CHARGED_OK && r->item.result == REFUND_BUSY)) &&
           test_env_now_ms() < deadline) {
        r->item = (struct refund_claim_item){.refund_id = r->refund_id};
        r->rc = refund_store_claim(r->st, &r->item, 1, 30000, &e);
    }
    return NULL;
}

/* A refund recorded before its charge (published out of order, or held
 * while the charge came in) and claimed once the charge SUCCEEDED: it
 * takes the charge's order and currency then, so that its success books
 * like any other. */
START_TEST(a_refund_recorded_before_its_charge_books_with_the_charges_currency)
{
    refund_store_t *st = store("w1");
    char attempt[37];
    test_env_uuid(attempt);
    struct refund_command r = refund(attempt, 300);
    ck_assert_int_eq(record1(st, &r, NULL, 0), REFUND_RECORDED);
    charge("SUCCEEDED", 1000, attempt);
    /* charge() names a fresh attempt: give it the refund's id. */
    const char *p[] = {attempt, r.payment_attempt_id};
    test_env_sql(admin, "UPDATE payment_attempts SET id = $2 WHERE id = $1", 2, p);
    struct refund_claim_item c = claim1(st, r.refund_id);
    ck_assert_int_eq(c.result, REFUND_CLAIMED);
    persist1(st, r.refund_id, c.lease_epoch, "SUCCEEDED", "re_early", 1);
    snprintf(q, sizeof(q),
             "SELECT l.currency || ':' || (l.order_id = p.order_id) || ':' ||"
             " p.refunded_amount FROM ledger_entries l JOIN payment_attempts p"
             " ON p.id = l.payment_attempt_id WHERE l.refund_id = '%s'",
             r.refund_id);
    ck_assert_str_eq(value(q), "EUR:true:300");
    snprintf(q, sizeof(q),
             "SELECT payload->>'currency' FROM outbox WHERE refund_id = '%s'"
             " AND event_type = 'refund.succeeded'",
             r.refund_id);
    ck_assert_str_eq(value(q), "EUR");
    refund_store_free(st);
}
END_TEST

START_TEST(two_sessions_racing_never_refund_past_the_charge)
{
    refund_store_t *a = store("w1"), *b = store("w2");
    pthread_barrier_t start;
    int rounds = 200, rejected = 0;
    for (int round = 0; round < rounds; round++) {
        char attempt[37];
        charge("SUCCEEDED", 1000, attempt);
        struct refund_command x = refund(attempt, 600), y = refund(attempt, 600);
        ck_assert_int_eq(record1(a, &x, NULL, 0), REFUND_RECORDED);
        ck_assert_int_eq(record1(b, &y, NULL, 0), REFUND_RECORDED);
        pthread_barrier_init(&start, NULL, 2);
        struct racer rx = {.st = a, .refund_id = x.refund_id, .start = &start},
                     ry = {.st = b, .refund_id = y.refund_id, .start = &start};
        pthread_t tx, ty;
        pthread_create(&tx, NULL, race, &rx);
        pthread_create(&ty, NULL, race, &ry);
        pthread_join(tx, NULL);
        pthread_join(ty, NULL);
        pthread_barrier_destroy(&start);
        ck_assert_int_eq(rx.rc, CHARGED_OK);
        ck_assert_int_eq(ry.rc, CHARGED_OK);
        int claimed =
            (rx.item.result == REFUND_CLAIMED) + (ry.item.result == REFUND_CLAIMED);
        ck_assert_msg(claimed == 1, "round %d: %d of the two refunds claimed", round,
                      claimed);
        struct refund_claim_item *lost =
            rx.item.result == REFUND_CLAIMED ? &ry.item : &rx.item;
        ck_assert_msg(!strncmp(lost->rejected, "exceeds_charge", 14), "round %d: %s",
                      round, lost->rejected);
        ck_assert_int_eq(reserved_of(attempt), 600);
        rejected++;
    }
    ck_assert_int_eq(rejected, rounds);
    ck_assert_int_eq(number("SELECT count(*) FROM payment_attempts"
                            " WHERE refund_reserved > amount"),
                     0);
    refund_store_free(a);
    refund_store_free(b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("refund_store");
    TCase *tc = tcase_create("postgres");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, record_is_idempotent_and_refuses_reused_ids_and_keys);
    tcase_add_test(tc, a_charge_with_a_refunds_key_is_a_conflict);
    tcase_add_test(tc, a_charge_and_a_refund_never_both_take_one_key);
    tcase_add_test(tc, claim_reserves_within_the_charge_and_rejects_the_rest);
    tcase_add_test(tc, one_refund_of_a_charge_per_claim_statement);
    tcase_add_test(tc, refunds_of_a_charge_reserve_in_the_order_recorded);
    tcase_add_test(tc, batch_order_not_id_order_decides_which_refund_reserves);
    tcase_add_test(tc, outcomes_move_the_money_once);
    tcase_add_test(tc,
                   a_refund_recorded_before_its_charge_books_with_the_charges_currency);
    tcase_add_test(tc, two_sessions_racing_never_refund_past_the_charge);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
