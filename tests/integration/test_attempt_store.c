/* worker/operations/charge/attempt_store against the real PostgreSQL of the local
 * stack: record (conflicts whatever batch they arrive in, the same-order guard, a new
 * attempt claimed by its record), claim (stored parameters, the key's age on the
 * database clock), takeover and fencing, release, how failures are classified, and a
 * row another session holds. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_store.h"
#include "db.h"
#include "test_env.h"

static struct charged_error err;
static char url[1024];
static PGconn *admin;
static int seq;

static void setup(void)
{
    test_env_migrated_database(url, sizeof(url));
    admin = test_env_connect(url);
}

static void teardown(void)
{
    PQfinish(admin);
}

static attempt_store_t *store(const char *actor)
{
    attempt_store_t *st = attempt_store_new(url, actor, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    return st;
}

/* A valid command with fresh ids; the fingerprint stands for its amount. */
static struct charge_command cmd(const char *order, long long amount)
{
    struct charge_command c = {0};
    seq++;
    snprintf(c.payment_attempt_id, sizeof(c.payment_attempt_id),
             "00000000-0000-4000-8000-%012d", seq);
    snprintf(c.order_id, sizeof(c.order_id), "%s",
             order ? order : "10000000-0000-4000-8000-000000000000");
    if (!order)
        snprintf(c.order_id + 24, 13, "%012d", seq);
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "attempt:%s",
             c.payment_attempt_id);
    c.amount = amount;
    snprintf(c.currency, sizeof(c.currency), "EUR");
    snprintf(c.payment_method, sizeof(c.payment_method), "pm_card_visa");
    snprintf(c.fingerprint, sizeof(c.fingerprint), "fp-%lld", amount);
    return c;
}

static void record(attempt_store_t *st, struct charge_command **cs, size_t n,
                   struct attempt_record_item *items)
{
    memset(items, 0, n * sizeof(*items));
    for (size_t i = 0; i < n; i++)
        items[i].cmd = cs[i];
    ck_assert_msg(attempt_store_record(st, items, n, 0, &err) == 0, "%s", err.message);
}

static void sql(const char *q)
{
    test_env_sql(admin, q, 0, NULL);
}

static char *value(const char *q)
{
    return test_env_value(admin, q);
}

START_TEST(record_compares_every_message_with_the_stored_attempt)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 1000), again = a, other_key = a,
                          other_amount = a, key_thief = cmd(NULL, 1000);
    struct attempt_record_item it[4];
    strcat(other_key.idempotency_key, ":other");
    snprintf(other_amount.fingerprint, sizeof(other_amount.fingerprint), "fp-2000");
    snprintf(key_thief.idempotency_key, sizeof(key_thief.idempotency_key), "%s",
             a.idempotency_key);

    struct charge_command *first[] = {&a};
    record(st, first, 1, it);
    ck_assert_int_eq(it[0].result, ATTEMPT_RECORDED);
    struct charge_command *later[] = {&again, &other_key, &other_amount, &key_thief};
    record(st, later, 4, it);
    ck_assert_int_eq(it[0].result, ATTEMPT_RECORDED);
    ck_assert_int_eq(it[1].result, ATTEMPT_CONFLICT);
    ck_assert_int_eq(it[2].result, ATTEMPT_CONFLICT);
    ck_assert_int_eq(it[3].result, ATTEMPT_CONFLICT);
    ck_assert_str_eq(value("SELECT count(*) FROM payment_attempts"), "1");
    attempt_store_free(st);
}
END_TEST

/* The defect: a resend that shares a batch with its original escaped the
 * comparison, because the batch had just inserted the attempt. */
START_TEST(conflicting_resend_in_the_same_batch_is_a_conflict)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 1000), resend = a, dup = a;
    struct attempt_record_item it[3];
    strcat(resend.idempotency_key, ":other");
    snprintf(resend.fingerprint, sizeof(resend.fingerprint), "fp-2000");
    struct charge_command *batch[] = {&a, &resend, &dup};
    record(st, batch, 3, it);
    ck_assert_int_eq(it[0].result, ATTEMPT_RECORDED);
    ck_assert_int_eq(it[1].result, ATTEMPT_CONFLICT);
    ck_assert_int_eq(it[2].result, ATTEMPT_RECORDED);
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT idempotency_key FROM payment_attempts WHERE id = '%s'",
             a.payment_attempt_id);
    ck_assert_str_eq(value(q), a.idempotency_key);
    attempt_store_free(st);
}
END_TEST

START_TEST(second_attempt_of_a_busy_or_paid_order_is_rejected)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 1000), b = cmd(a.order_id, 1000),
                          c = cmd(a.order_id, 1000);
    struct attempt_record_item it[2];
    struct charge_command *both[] = {&a, &b};
    record(st, both, 2, it);
    ck_assert_int_eq(it[0].result, ATTEMPT_RECORDED);
    ck_assert_int_eq(it[1].result, ATTEMPT_REJECTED);
    ck_assert_msg(strstr(it[1].reason, "order_has_live_attempt") != NULL, "%s",
                  it[1].reason);
    ck_assert_str_eq(value("SELECT count(*) FROM outbox WHERE event_type = "
                           "'charge.rejected'"),
                     "1");

    struct attempt_claim_item ci = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(st, &ci, 1, 60000, &err), 0);
    struct attempt_outcome o = {.attempt_id = a.payment_attempt_id,
                                .lease_epoch = ci.lease_epoch,
                                .status = "SUCCEEDED",
                                .provider_payment_id = "pi_1",
                                .event_type = "charge.succeeded",
                                .calls = 1,
                                .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_persist(st, &o, 1, &err), 0);
    ck_assert(o.persisted);
    struct charge_command *late[] = {&c};
    record(st, late, 1, it);
    ck_assert_int_eq(it[0].result, ATTEMPT_REJECTED);
    ck_assert_msg(strstr(it[0].reason, "order_already_paid") != NULL, "%s",
                  it[0].reason);

    /* Copies of one rejected attempt in one batch, two of them conflicting:
     * only the first is stored; the others are compared with it. */
    struct charge_command x = cmd(a.order_id, 1000), x_amount = x, x_key = x, x_dup = x;
    snprintf(x_amount.fingerprint, sizeof(x_amount.fingerprint), "fp-2000");
    strcat(x_key.idempotency_key, ":other");
    struct charge_command *copies[] = {&x, &x_amount, &x_key, &x_dup};
    struct attempt_record_item ci4[4];
    record(st, copies, 4, ci4);
    ck_assert_int_eq(ci4[0].result, ATTEMPT_REJECTED);
    for (int i = 1; i < 4; i++)
        ck_assert_int_eq(ci4[i].result, ATTEMPT_RETRY);
    struct charge_command *again[] = {&x_amount, &x_key, &x_dup};
    record(st, again, 3, ci4);
    ck_assert_int_eq(ci4[0].result, ATTEMPT_CONFLICT);
    ck_assert_int_eq(ci4[1].result, ATTEMPT_CONFLICT);
    ck_assert_int_eq(ci4[2].result, ATTEMPT_RECORDED); /* then SETTLED at claim */
    attempt_store_free(st);
}
END_TEST

START_TEST(record_with_a_lease_claims_what_it_creates_once)
{
    attempt_store_t *st = store("w1"), *peer = store("w2");
    struct charge_command a = cmd(NULL, 4242), copy = a, resend = a, b = cmd(NULL, 99),
                          same_order = cmd(b.order_id, 99);
    strcat(resend.idempotency_key, ":other");
    struct attempt_record_item it[5] = {0};
    struct charge_command *batch[] = {&a, &copy, &resend, &b, &same_order};
    for (size_t i = 0; i < 5; i++)
        it[i].cmd = batch[i];
    ck_assert_msg(attempt_store_record(st, it, 5, 60000, &err) == CHARGED_OK, "%s",
                  err.message);
    /* The first message of a new attempt takes the claim, with the stored
     * parameters; its copy is recorded like a redelivery (and is busy at its
     * claim), the conflicting resend is a conflict, the second attempt of
     * b's order is rejected: b is live from the start. */
    ck_assert_int_eq(it[0].result, ATTEMPT_RECORDED_CLAIMED);
    ck_assert_int_eq(it[0].lease_epoch, 1);
    ck_assert_str_eq(it[0].params.idempotency_key, a.idempotency_key);
    ck_assert_str_eq(it[0].params.order_id, a.order_id);
    ck_assert_int_eq(it[0].params.amount, 4242);
    ck_assert_str_eq(it[0].params.payment_method, "pm_card_visa");
    ck_assert_int_eq(it[1].result, ATTEMPT_RECORDED);
    ck_assert_int_eq(it[2].result, ATTEMPT_CONFLICT);
    ck_assert_int_eq(it[3].result, ATTEMPT_RECORDED_CLAIMED);
    ck_assert_int_eq(it[4].result, ATTEMPT_REJECTED);
    ck_assert_msg(strstr(it[4].reason, "is PROCESSING") != NULL, "%s", it[4].reason);

    char q[512];
    snprintf(q, sizeof(q),
             "SELECT status || ' ' || lease_owner || ' ' || lease_epoch || ' '"
             " || (first_sent_at IS NOT NULL) || ' ' || (lease_expires_at > now())"
             " FROM payment_attempts WHERE id = '%s'",
             a.payment_attempt_id);
    ck_assert_str_eq(value(q), "PROCESSING w1 1 true true");
    snprintf(
        q, sizeof(q),
        "SELECT string_agg(coalesce(old_status, '-') || '>' || new_status || ' ' ||"
        " reason, ',' ORDER BY id) FROM attempt_transitions"
        " WHERE payment_attempt_id = '%s'",
        a.payment_attempt_id);
    ck_assert_str_eq(value(q), "->PROCESSING recorded and claimed");

    /* A redelivery, here or at a peer, is recorded and never claimed while
     * the lease holds. */
    struct attempt_record_item again = {.cmd = &a};
    ck_assert_int_eq(attempt_store_record(peer, &again, 1, 60000, &err), CHARGED_OK);
    ck_assert_int_eq(again.result, ATTEMPT_RECORDED);
    struct attempt_claim_item ci = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(peer, &ci, 1, 60000, &err), CHARGED_OK);
    ck_assert_int_eq(ci.result, ATTEMPT_BUSY);

    /* The claim is a claim like any: its outcome is persisted under it. */
    struct attempt_outcome o = {.attempt_id = a.payment_attempt_id,
                                .lease_epoch = it[0].lease_epoch,
                                .status = "SUCCEEDED",
                                .provider_payment_id = "pi_rc",
                                .event_type = "charge.succeeded",
                                .calls = 1,
                                .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_persist(st, &o, 1, &err), CHARGED_OK);
    ck_assert(o.persisted);
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM ledger_entries WHERE payment_attempt_id = '%s'",
             a.payment_attempt_id);
    ck_assert_str_eq(value(q), "1");

    /* A claim whose answer its worker lost (the statement given up, then
     * committed) is the worker's to take again at once, under a new epoch;
     * a peer still waits for the lease. */
    struct charge_command lost = cmd(NULL, 5);
    struct attempt_record_item rl = {.cmd = &lost};
    ck_assert_int_eq(attempt_store_record(st, &rl, 1, 60000, &err), CHARGED_OK);
    ck_assert_int_eq(rl.result, ATTEMPT_RECORDED_CLAIMED);
    struct attempt_claim_item by_peer = {.attempt_id = lost.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(peer, &by_peer, 1, 60000, &err), CHARGED_OK);
    ck_assert_int_eq(by_peer.result, ATTEMPT_BUSY);
    struct attempt_claim_item again_ours = {.attempt_id = lost.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(st, &again_ours, 1, 60000, &err), CHARGED_OK);
    ck_assert_int_eq(again_ours.result, ATTEMPT_CLAIMED);
    ck_assert_int_eq(again_ours.lease_epoch, 2);
    ck_assert_int_eq(again_ours.key_age_ms < 5000, 1);
    snprintf(q, sizeof(q),
             "SELECT reason FROM attempt_transitions WHERE payment_attempt_id = '%s'"
             " ORDER BY id DESC LIMIT 1",
             lost.payment_attempt_id);
    ck_assert_str_eq(value(q), "our lost claim taken again");
    attempt_store_free(st);
    attempt_store_free(peer);
}
END_TEST

START_TEST(claim_returns_the_stored_parameters_and_the_key_age)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 4242);
    struct attempt_record_item it[1];
    struct charge_command *one[] = {&a};
    record(st, one, 1, it);
    struct attempt_claim_item ci = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(st, &ci, 1, 60000, &err), 0);
    ck_assert_int_eq(ci.result, ATTEMPT_CLAIMED);
    ck_assert_str_eq(ci.params.idempotency_key, a.idempotency_key);
    ck_assert_str_eq(ci.params.order_id, a.order_id);
    ck_assert_int_eq(ci.params.amount, 4242);
    ck_assert_str_eq(ci.params.currency, "EUR");
    ck_assert_str_eq(ci.params.payment_method, "pm_card_visa");
    ck_assert_str_eq(ci.params.customer_id, "");
    ck_assert_int_ge(ci.key_age_ms, 0);
    ck_assert_int_lt(ci.key_age_ms, 5000);

    /* A takeover long after the first send sees the age on the database's
     * clock, whatever the worker's clock says. */
    char q[256];
    snprintf(q, sizeof(q),
             "UPDATE payment_attempts SET first_sent_at = now() - interval '1 hour',"
             " lease_expires_at = now() - interval '1 second' WHERE id = '%s'",
             a.payment_attempt_id);
    sql(q);
    attempt_store_t *st2 = store("w2");
    struct attempt_claim_item c2 = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(st2, &c2, 1, 60000, &err), 0);
    ck_assert_int_eq(c2.result, ATTEMPT_CLAIMED);
    ck_assert_int_ge(c2.key_age_ms, 3600000);
    ck_assert_int_lt(c2.key_age_ms, 3605000);
    ck_assert_int_gt(c2.lease_epoch, ci.lease_epoch);
    attempt_store_free(st);
    attempt_store_free(st2);
}
END_TEST

START_TEST(takeover_fences_the_old_owner)
{
    attempt_store_t *w1 = store("w1"), *w2 = store("w2");
    struct charge_command a = cmd(NULL, 1000);
    struct attempt_record_item it[1];
    struct charge_command *one[] = {&a};
    record(w1, one, 1, it);
    struct attempt_claim_item c1 = {.attempt_id = a.payment_attempt_id},
                              c2 = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(w1, &c1, 1, 60000, &err), 0);
    ck_assert_int_eq(c1.result, ATTEMPT_CLAIMED);
    ck_assert_int_eq(attempt_store_claim(w2, &c2, 1, 60000, &err), 0);
    ck_assert_int_eq(c2.result, ATTEMPT_BUSY);

    /* Released: a peer takes it over at once. */
    const char *id = a.payment_attempt_id;
    ck_assert_int_eq(attempt_store_release(w1, &id, &c1.lease_epoch, 1, &err), 0);
    ck_assert_int_eq(attempt_store_claim(w2, &c2, 1, 60000, &err), 0);
    ck_assert_int_eq(c2.result, ATTEMPT_CLAIMED);

    /* The old owner can neither renew nor persist. */
    int ours = 1;
    ck_assert_int_eq(
        attempt_store_renew(w1, &id, &c1.lease_epoch, 1, 60000, &ours, &err), 0);
    ck_assert_int_eq(ours, 0);
    struct attempt_outcome o = {.attempt_id = id,
                                .lease_epoch = c1.lease_epoch,
                                .status = "FAILED",
                                .reason = "declined",
                                .event_type = "charge.failed",
                                .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_persist(w1, &o, 1, &err), 0);
    ck_assert(!o.persisted);
    o.lease_epoch = c2.lease_epoch;
    ck_assert_int_eq(attempt_store_persist(w1, &o, 1, &err), 0);
    ck_assert(!o.persisted); /* right epoch, wrong owner */
    ck_assert_int_eq(attempt_store_persist(w2, &o, 1, &err), 0);
    ck_assert(o.persisted);
    ck_assert_int_eq(attempt_store_claim(w1, &c1, 1, 60000, &err), 0);
    ck_assert_int_eq(c1.result, ATTEMPT_SETTLED);
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM attempt_transitions WHERE payment_attempt_id = '%s'",
             id);
    ck_assert_str_eq(value(q), "4"); /* recorded, claimed, taken over, failed */
    attempt_store_free(w1);
    attempt_store_free(w2);
}
END_TEST

/* Issue 38: a claim's wait said on its record (one statement, fenced on
 * the lease: another's claim is left as it is), ended by the worker, and
 * ended by the trigger with the claim whoever ends it (a takeover, a
 * settlement). */
START_TEST(a_wait_is_said_by_its_claim_and_ends_with_it)
{
    attempt_store_t *w1 = store("w1"), *w2 = store("w2");
    struct charge_command a = cmd(NULL, 1000);
    struct attempt_record_item it[1];
    struct charge_command *one[] = {&a};
    record(w1, one, 1, it);
    struct attempt_claim_item c1 = {.attempt_id = a.payment_attempt_id},
                              c2 = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(w1, &c1, 1, 60000, &err), 0);
    const char *id = a.payment_attempt_id;
    char q[320];
    snprintf(q, sizeof(q),
             "SELECT coalesce(waiting_reason, '-') || ' ' ||"
             " coalesce((extract(epoch FROM waiting_since) * 1000)::bigint::text, '-')"
             " FROM payment_attempts WHERE id = '%s'",
             id);
    struct store_wait w = {id, 0, c1.lease_epoch, "provider_budget", 1700000000123};
    ck_assert_int_eq(attempt_store_wait(w2, &w, 1, &err), 0); /* not w2's claim */
    ck_assert_str_eq(value(q), "- -");
    ck_assert_int_eq(attempt_store_wait(w1, &w, 1, &err), 0);
    ck_assert_str_eq(value(q), "provider_budget 1700000000123");
    w.reason = NULL; /* its call starts */
    ck_assert_int_eq(attempt_store_wait(w1, &w, 1, &err), 0);
    ck_assert_str_eq(value(q), "- -");
    w.reason = "provider_throttled";
    ck_assert_int_eq(attempt_store_wait(w1, &w, 1, &err), 0);
    ck_assert_str_eq(value(q), "provider_throttled 1700000000123");
    /* Taken over (a new epoch): the old claim's wait is gone. */
    ck_assert_int_eq(attempt_store_release(w1, &id, &c1.lease_epoch, 1, &err), 0);
    ck_assert_int_eq(attempt_store_claim(w2, &c2, 1, 60000, &err), 0);
    ck_assert_int_eq(c2.result, ATTEMPT_CLAIMED);
    ck_assert_str_eq(value(q), "- -");
    /* Said again under it, then settled: gone with the claim. */
    w.lease_epoch = c2.lease_epoch;
    ck_assert_int_eq(attempt_store_wait(w2, &w, 1, &err), 0);
    ck_assert_str_eq(value(q), "provider_throttled 1700000000123");
    struct attempt_outcome o = {.attempt_id = id,
                                .lease_epoch = c2.lease_epoch,
                                .status = "FAILED",
                                .reason = "declined",
                                .event_type = "charge.failed",
                                .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_persist(w2, &o, 1, &err), 0);
    ck_assert(o.persisted);
    ck_assert_str_eq(value(q), "- -");
    attempt_store_free(w1);
    attempt_store_free(w2);
}
END_TEST

/* A value the database refuses is DATA (isolate it), an unreachable
 * database is RETRY, and neither crashes nor blocks for long. */
START_TEST(failures_are_classified)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 1000);
    struct attempt_record_item it[1];
    struct charge_command *one[] = {&a};
    record(st, one, 1, it);
    struct attempt_claim_item ci = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(st, &ci, 1, 60000, &err), 0);
    struct attempt_outcome o = {.attempt_id = a.payment_attempt_id,
                                .lease_epoch = ci.lease_epoch,
                                .status = "FAILED",
                                .reason = "cut mid-character \xc3",
                                .event_type = "charge.failed",
                                .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_persist(st, &o, 1, &err), CHARGED_BAD_ITEM);
    o.reason = "declined";
    o.status = "SUCCEEDED"; /* without a provider id: the CHECK refuses it */
    ck_assert_int_eq(attempt_store_persist(st, &o, 1, &err), CHARGED_BAD_ITEM);
    /* A move the status vocabulary forbids never reaches the database. */
    o.status = "PENDING";
    ck_assert_int_eq(attempt_store_persist(st, &o, 1, &err), CHARGED_BAD_ITEM);
    ck_assert_msg(strstr(err.message, "may not follow") != NULL, "%s", err.message);
    attempt_store_free(st);

    ck_assert_ptr_null(attempt_store_new("postgresql://x:y@/db?nonsense=1", "w", &err));
    attempt_store_t *down =
        attempt_store_new("postgresql://charged@127.0.0.1:1/charged", "w", &err);
    ck_assert_msg(down != NULL, "a store is made without connecting: %s", err.message);
    long long t0 = test_env_now_ms();
    ck_assert_int_eq(attempt_store_record(down, it, 1, 0, &err), CHARGED_RETRY);
    ck_assert_int_lt(test_env_now_ms() - t0, 10000);
    attempt_store_free(down);
    attempt_store_free(NULL);
}
END_TEST

/* Puts an attempt where the worker leaves an unknown outcome: UNKNOWN, no
 * lease, its next look due now. */
static struct charge_command unknown_attempt_of(attempt_store_t *st, int manual);

static struct charge_command unknown_attempt(attempt_store_t *st)
{
    return unknown_attempt_of(st, 0);
}

/* An UNKNOWN attempt: a charge's, or (manual) an authorization's. */
static struct charge_command unknown_attempt_of(attempt_store_t *st, int manual)
{
    struct charge_command a = cmd(NULL, 1000);
    a.manual = manual;
    struct attempt_record_item it[1];
    struct charge_command *one[] = {&a};
    record(st, one, 1, it);
    struct attempt_claim_item ci = {.attempt_id = a.payment_attempt_id};
    ck_assert_int_eq(attempt_store_claim(st, &ci, 1, 60000, &err), 0);
    struct attempt_outcome o = {.attempt_id = a.payment_attempt_id,
                                .lease_epoch = ci.lease_epoch,
                                .status = "UNKNOWN",
                                .reason = "outcome_unknown: timeout",
                                .event_type =
                                    manual ? "authorization.unknown" : "charge.unknown",
                                .calls = 1,
                                .next_check_ms = 0};
    ck_assert_int_eq(attempt_store_persist(st, &o, 1, &err), 0);
    ck_assert(o.persisted);
    return a;
}

START_TEST(reconciler_claims_due_attempts_and_settles_them_fenced)
{
    attempt_store_t *w = store("w1"), *r1 = store("r1"), *r2 = store("r2");
    struct charge_command a = unknown_attempt(w);
    struct attempt_due due[4];
    size_t n = 0;
    ck_assert_int_eq(attempt_store_claim_due(r1, due, 4, &n, 60000, 300000, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(due[0].id, a.payment_attempt_id);
    ck_assert_int_eq(due[0].status, ATTEMPT_STATUS_UNKNOWN);
    ck_assert_str_eq(due[0].params.idempotency_key, a.idempotency_key);
    ck_assert_int_ge(due[0].key_age_ms, 0);
    ck_assert_int_eq(due[0].checks, 0);
    /* Leased: a second reconciler finds nothing to do. */
    size_t n2 = 9;
    ck_assert_int_eq(attempt_store_claim_due(r2, due + 1, 3, &n2, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n2, 0);

    /* Look again later: no transition, no event, the count goes up. */
    struct provider_result look = {.outcome = PROVIDER_UNKNOWN, .http_status = 503};
    struct attempt_call call = {.attempt_id = a.payment_attempt_id,
                                .operation = "search",
                                .started_ms = 1,
                                .res = &look};
    struct attempt_settlement later = {.attempt_id = a.payment_attempt_id,
                                       .lease_epoch = due[0].lease_epoch,
                                       .expected = ATTEMPT_STATUS_UNKNOWN,
                                       .status = ATTEMPT_STATUS_UNKNOWN,
                                       .cause = "reconciler",
                                       .reason = "provider unavailable",
                                       .next_check_ms = 0,
                                       .calls = &call,
                                       .ncalls = 1};
    ck_assert_int_eq(attempt_store_settle(r1, &later, 1, &err), 0);
    ck_assert(later.settled);
    char q[512];
    snprintf(q, sizeof(q),
             "SELECT status || reconcile_checks || (lease_owner IS NULL)"
             " || (SELECT count(*) FROM attempt_transitions t WHERE"
             " t.payment_attempt_id = p.id) || (SELECT count(*) FROM provider_calls c"
             " WHERE c.payment_attempt_id = p.id AND operation = 'search')"
             " FROM payment_attempts p WHERE id = '%s'",
             a.payment_attempt_id);
    ck_assert_str_eq(value(q), "UNKNOWN1true31");

    /* Evidence: succeeded. Status, transition (cause reconciler), ledger,
     * event, and the call, in one statement; fenced on the new claim. */
    ck_assert_int_eq(attempt_store_claim_due(r2, due, 4, &n, 60000, 300000, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(due[0].checks, 1);
    struct provider_result found = {.outcome = PROVIDER_SUCCEEDED, .http_status = 200};
    snprintf(found.provider_payment_id, sizeof(found.provider_payment_id), "pi_found");
    struct attempt_call call2 = {.attempt_id = a.payment_attempt_id,
                                 .operation = "search",
                                 .started_ms = 2,
                                 .res = &found};
    struct attempt_settlement done = {.attempt_id = a.payment_attempt_id,
                                      .lease_epoch = due[0].lease_epoch - 1, /* stale */
                                      .expected = ATTEMPT_STATUS_UNKNOWN,
                                      .status = ATTEMPT_STATUS_SUCCEEDED,
                                      .cause = "reconciler",
                                      .provider_payment_id = "pi_found",
                                      .evidence_json = "{\"lookup\":\"search\"}",
                                      .next_check_ms = -1,
                                      .calls = &call2,
                                      .ncalls = 1};
    ck_assert_int_eq(attempt_store_settle(r2, &done, 1, &err), 0);
    ck_assert(!done.settled); /* an old epoch changes nothing (its calls are kept) */
    done.lease_epoch = due[0].lease_epoch;
    ck_assert_int_eq(attempt_store_settle(r1, &done, 1, &err), 0);
    ck_assert(!done.settled); /* right epoch, wrong owner */
    ck_assert_int_eq(attempt_store_settle(r2, &done, 1, &err), 0);
    ck_assert(done.settled);
    snprintf(
        q, sizeof(q),
        "SELECT status || provider_payment_id"
        " || (SELECT count(*) FROM ledger_entries l WHERE l.payment_attempt_id = p.id)"
        " || (SELECT count(*) FROM outbox o WHERE o.payment_attempt_id = p.id AND"
        "     o.event_type = 'charge.succeeded')"
        " || (SELECT cause FROM attempt_transitions t WHERE t.payment_attempt_id = p.id"
        "     ORDER BY id DESC LIMIT 1)"
        " || (SELECT count(*) FROM provider_calls c WHERE c.payment_attempt_id = p.id)"
        " FROM payment_attempts p WHERE id = '%s'",
        a.payment_attempt_id);
    /* Four calls: the look-again's, and this decision's three times: the
     * two refused settlements still record the calls they made. */
    ck_assert_str_eq(value(q), "SUCCEEDEDpi_found11reconciler4");
    /* Settled: nothing is due any more. */
    ck_assert_int_eq(attempt_store_claim_due(r1, due, 4, &n, 60000, 300000, &err), 0);
    ck_assert_uint_eq(n, 0);
    attempt_store_free(w);
    attempt_store_free(r1);
    attempt_store_free(r2);
}
END_TEST

START_TEST(operator_settles_review_without_a_lease)
{
    attempt_store_t *w = store("w1"), *op = store("chargectl");
    struct charge_command a = unknown_attempt(w);
    char q[256];
    snprintf(q, sizeof(q),
             "UPDATE payment_attempts SET status = 'REQUIRES_REVIEW' WHERE id = '%s'",
             a.payment_attempt_id);
    sql(q);
    struct attempt_settlement s = {.attempt_id = a.payment_attempt_id,
                                   .lease_epoch = -1,
                                   .expected = ATTEMPT_STATUS_REQUIRES_REVIEW,
                                   .status = ATTEMPT_STATUS_FAILED,
                                   .cause = "operator",
                                   .actor = "alice",
                                   .reason = "operator: refunded by hand",
                                   .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_settle(op, &s, 1, &err), 0);
    ck_assert(s.settled);
    snprintf(q, sizeof(q),
             "SELECT cause || actor || new_status FROM attempt_transitions"
             " WHERE payment_attempt_id = '%s' ORDER BY id DESC LIMIT 1",
             a.payment_attempt_id);
    ck_assert_str_eq(value(q), "operatoraliceFAILED");
    /* Again: it is not REQUIRES_REVIEW any more. */
    ck_assert_int_eq(attempt_store_settle(op, &s, 1, &err), 0);
    ck_assert(!s.settled);
    /* A move the vocabulary forbids never reaches the database. */
    s.expected = ATTEMPT_STATUS_FAILED;
    s.status = ATTEMPT_STATUS_PENDING;
    ck_assert_int_eq(attempt_store_settle(op, &s, 1, &err), CHARGED_BAD_ITEM);
    attempt_store_free(w);
    attempt_store_free(op);
}
END_TEST

/* Another session holding one attempt's row (an api applying a webhook, or
 * one hung in its transaction) costs that attempt only: persist, renew and
 * settle come back at once, the held one `busy`, nothing written for it,
 * everything else done. Had any of them waited, it would have failed on its
 * lock_timeout instead of returning 0. */
/* A call whose first write may have committed after all (given up at its
 * deadline) is written again only if its row is not there; a call that is
 * not marked so is always written, equal rows of one batch included. */
START_TEST(a_call_written_again_after_a_failure_is_one_row)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 1500);
    struct attempt_record_item it[1];
    struct charge_command *one[] = {&a};
    record(st, one, 1, it);
    struct provider_result res = {.outcome = PROVIDER_UNKNOWN, .latency_ms = 7};
    struct attempt_call lost[2] = {
        {.attempt_id = a.payment_attempt_id, .started_ms = 1000, .res = &res},
        {.attempt_id = a.payment_attempt_id, .started_ms = 1000, .res = &res},
    };
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT count(*) FROM provider_calls WHERE payment_attempt_id = '%s'",
             a.payment_attempt_id);
    ck_assert_int_eq(attempt_store_log_calls(st, lost, 2, &err), CHARGED_OK);
    ck_assert_str_eq(test_env_value(admin, q), "2");
    lost[0].written_maybe = lost[1].written_maybe = 1;
    ck_assert_int_eq(attempt_store_log_calls(st, lost, 2, &err), CHARGED_OK);
    ck_assert_str_eq(test_env_value(admin, q), "2");
    /* Not there yet: written, both of the batch. */
    lost[0].started_ms = lost[1].started_ms = 2000;
    ck_assert_int_eq(attempt_store_log_calls(st, lost, 2, &err), CHARGED_OK);
    ck_assert_str_eq(test_env_value(admin, q), "4");
    attempt_store_free(st);
}
END_TEST

START_TEST(a_row_held_by_another_session_is_busy_and_holds_nothing_else)
{
    attempt_store_t *st = store("w1");
    struct charge_command a = cmd(NULL, 1000), b = cmd(NULL, 2000);
    struct attempt_record_item it[2];
    struct charge_command *both[] = {&a, &b};
    record(st, both, 2, it);
    struct attempt_claim_item c[2] = {{.attempt_id = a.payment_attempt_id},
                                      {.attempt_id = b.payment_attempt_id}};
    ck_assert_int_eq(attempt_store_claim(st, c, 2, 60000, &err), 0);
    ck_assert_int_eq(c[0].result, ATTEMPT_CLAIMED);
    ck_assert_int_eq(c[1].result, ATTEMPT_CLAIMED);

    PGconn *peer = test_env_connect(url);
    const char *held[1] = {a.payment_attempt_id};
    ck_assert_int_eq(db_run(peer, "BEGIN", 0, NULL, &err), 0);
    ck_assert_msg(
        db_run(peer,
               "SELECT id FROM payment_attempts WHERE id = $1::uuid FOR NO KEY "
               "UPDATE",
               1, held, &err) == 0,
        "%s", err.message);

    struct attempt_outcome o[2] = {{.attempt_id = a.payment_attempt_id,
                                    .lease_epoch = c[0].lease_epoch,
                                    .status = "SUCCEEDED",
                                    .provider_payment_id = "pi_held",
                                    .event_type = "charge.succeeded",
                                    .next_check_ms = -1},
                                   {.attempt_id = b.payment_attempt_id,
                                    .lease_epoch = c[1].lease_epoch,
                                    .status = "SUCCEEDED",
                                    .provider_payment_id = "pi_free",
                                    .event_type = "charge.succeeded",
                                    .next_check_ms = -1}};
    ck_assert_msg(attempt_store_persist(st, o, 2, &err) == 0, "%s", err.message);
    ck_assert(!o[0].persisted && o[0].busy);
    ck_assert(o[1].persisted && !o[1].busy);
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT status || ' ' || (SELECT count(*) FROM outbox o WHERE "
             "o.payment_attempt_id = p.id) FROM payment_attempts p WHERE id = '%s'",
             a.payment_attempt_id);
    ck_assert_str_eq(value(q), "PROCESSING 0");

    /* The held lease is not extended now, and is still ours. */
    const char *ids[2] = {a.payment_attempt_id, b.payment_attempt_id};
    int64_t epochs[2] = {c[0].lease_epoch, c[1].lease_epoch};
    int ours[2] = {0, 1};
    ck_assert_msg(attempt_store_renew(st, ids, epochs, 1, 60000, ours, &err) == 0, "%s",
                  err.message);
    ck_assert_int_eq(ours[0], 1);
    /* Released while held: nothing waits; the lease simply runs on. */
    ck_assert_int_eq(attempt_store_release(st, ids, epochs, 1, &err), 0);

    /* An operator's settlement of the free one goes through; of a held one
     * it is busy. */
    struct attempt_settlement op = {.attempt_id = b.payment_attempt_id,
                                    .lease_epoch = -1,
                                    .expected = ATTEMPT_STATUS_SUCCEEDED,
                                    .status = ATTEMPT_STATUS_REQUIRES_REVIEW,
                                    .cause = "operator",
                                    .actor = "ops",
                                    .reason = "requires_review: test",
                                    .next_check_ms = -1};
    const char *heldb[1] = {b.payment_attempt_id};
    PGconn *peer2 = test_env_connect(url);
    ck_assert_int_eq(db_run(peer2, "BEGIN", 0, NULL, &err), 0);
    ck_assert_int_eq(
        db_run(peer2,
               "SELECT id FROM payment_attempts WHERE id = $1::uuid FOR NO "
               "KEY UPDATE",
               1, heldb, &err),
        0);
    ck_assert_msg(attempt_store_settle(st, &op, 1, &err) == 0, "%s", err.message);
    ck_assert(!op.settled && op.busy);
    /* ROLLBACK returns once the lock is gone; a bare PQfinish would race
     * the server's clean-up of the session. */
    ck_assert_int_eq(db_run(peer2, "ROLLBACK", 0, NULL, &err), 0);
    PQfinish(peer2);
    ck_assert_msg(attempt_store_settle(st, &op, 1, &err) == 0, "%s", err.message);
    ck_assert(op.settled && !op.busy);

    /* Let go: the held attempt is persisted like any other. */
    ck_assert_int_eq(db_run(peer, "ROLLBACK", 0, NULL, &err), 0);
    PQfinish(peer);
    ck_assert_msg(attempt_store_persist(st, o, 1, &err) == 0, "%s", err.message);
    ck_assert(o[0].persisted && !o[0].busy);
    attempt_store_free(st);
}
END_TEST

/* A look's settlement busy (another session held the row: an api applying
 * a webhook) writes nothing and keeps the reconciler's lease; the next
 * claim of that reconciler takes the row again at once, under a new epoch
 * that fences the old one. Before, it waited out its lease (120 s, and
 * 300 s more for a PROCESSING one: chaos seed 5's 85 s stall); others
 * still wait for it. */
START_TEST(a_look_left_busy_is_claimed_again_by_its_reconciler)
{
    attempt_store_t *w = store("w1"), *r1 = store("r1"), *r2 = store("r2");
    struct charge_command a = unknown_attempt(w);
    struct attempt_due due[4];
    size_t n = 0;
    ck_assert_int_eq(attempt_store_claim_due(r1, due, 4, &n, 120000, 300000, &err), 0);
    ck_assert_uint_eq(n, 1);
    int64_t first = due[0].lease_epoch;

    PGconn *peer = test_env_connect(url);
    const char *held[1] = {a.payment_attempt_id};
    ck_assert_int_eq(db_run(peer, "BEGIN", 0, NULL, &err), 0);
    ck_assert_int_eq(db_run(peer,
                            "SELECT id FROM payment_attempts WHERE id = $1::uuid FOR "
                            "NO KEY UPDATE",
                            1, held, &err),
                     0);
    struct attempt_settlement s = {.attempt_id = a.payment_attempt_id,
                                   .lease_epoch = first,
                                   .expected = ATTEMPT_STATUS_UNKNOWN,
                                   .status = ATTEMPT_STATUS_FAILED,
                                   .cause = "reconciler",
                                   .reason = "declined: test",
                                   .next_check_ms = -1};
    ck_assert_int_eq(attempt_store_settle(r1, &s, 1, &err), 0);
    ck_assert(!s.settled && s.busy);
    ck_assert_int_eq(db_run(peer, "ROLLBACK", 0, NULL, &err), 0);
    PQfinish(peer);

    /* Another reconciler waits for the lease; its own takes it again. */
    ck_assert_int_eq(attempt_store_claim_due(r2, due, 4, &n, 120000, 300000, &err), 0);
    ck_assert_uint_eq(n, 0);
    ck_assert_int_eq(attempt_store_claim_due(r1, due, 4, &n, 120000, 300000, &err), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(due[0].id, a.payment_attempt_id);
    ck_assert_int_eq(due[0].lease_epoch, first + 1);
    /* The busy look's epoch is fenced; the new one settles. */
    ck_assert_int_eq(attempt_store_settle(r1, &s, 1, &err), 0);
    ck_assert(!s.settled && !s.busy);
    s.lease_epoch = due[0].lease_epoch;
    ck_assert_int_eq(attempt_store_settle(r1, &s, 1, &err), 0);
    ck_assert(s.settled);
    attempt_store_free(w);
    attempt_store_free(r1);
    attempt_store_free(r2);
}
END_TEST

/* Issue 37: each look claims its own operation's attempts. The charge's
 * (capture method automatic) never claims an authorization, whose intent
 * holds the money where a charge's takes it; the authorization's claims
 * its UNKNOWN ones, and the holds older than its lapse for the provider's
 * expiry, which settle VOIDED with the event they are given. */
START_TEST(each_look_claims_its_own_capture_method)
{
    attempt_store_t *w = store("w1");
    attempt_store_t *charges = attempt_store_new_of(url, "rc", "automatic", -1, &err);
    attempt_store_t *auths = attempt_store_new_of(url, "ra", "manual", 600000, &err);
    ck_assert(charges && auths);
    struct charge_command c = unknown_attempt_of(w, 0), h = unknown_attempt_of(w, 1);
    struct attempt_due due[4];
    size_t n = 0;
    ck_assert_int_eq(attempt_store_claim_due(charges, due, 4, &n, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(due[0].id, c.payment_attempt_id);
    ck_assert(!due[0].params.manual);
    ck_assert_int_eq(attempt_store_claim_due(auths, due, 4, &n, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(due[0].id, h.payment_attempt_id);
    ck_assert(due[0].params.manual);

    /* Held: AUTHORIZED, its intent recorded, authorization.succeeded. */
    struct attempt_settlement held = {.attempt_id = h.payment_attempt_id,
                                      .lease_epoch = due[0].lease_epoch,
                                      .expected = ATTEMPT_STATUS_UNKNOWN,
                                      .status = ATTEMPT_STATUS_AUTHORIZED,
                                      .cause = "reconciler",
                                      .provider_payment_id = "pi_held",
                                      .next_check_ms = -1};
    ck_assert_msg(attempt_store_settle(auths, &held, 1, &err) == 0, "%s", err.message);
    ck_assert(held.settled);
    /* A hold younger than the lapse (10 minutes) is nobody's to look at. */
    ck_assert_int_eq(attempt_store_claim_due(auths, due, 4, &n, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n, 0);
    char q[768];
    snprintf(q, sizeof(q),
             "UPDATE payment_attempts SET first_sent_at = now() - interval '11 minutes'"
             " WHERE id = '%s'",
             h.payment_attempt_id);
    sql(q);
    /* The charge's look takes its own unsettled claim again, never the hold. */
    ck_assert_int_eq(attempt_store_claim_due(charges, due, 4, &n, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n, 1);
    ck_assert_str_eq(due[0].id, c.payment_attempt_id);
    ck_assert_int_eq(attempt_store_claim_due(auths, due, 4, &n, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(due[0].status, ATTEMPT_STATUS_AUTHORIZED);
    ck_assert_str_eq(due[0].provider_payment_id, "pi_held");

    /* Expired at the provider: VOIDED, published as the event given. */
    struct attempt_settlement gone = {.attempt_id = h.payment_attempt_id,
                                      .lease_epoch = due[0].lease_epoch,
                                      .expected = ATTEMPT_STATUS_AUTHORIZED,
                                      .status = ATTEMPT_STATUS_VOIDED,
                                      .cause = "reconciler",
                                      .reason = "expired",
                                      .next_check_ms = -1,
                                      .event_type = "authorization.failed"};
    ck_assert_msg(attempt_store_settle(auths, &gone, 1, &err) == 0, "%s", err.message);
    ck_assert(gone.settled);
    snprintf(
        q, sizeof(q),
        "SELECT status || ' ' || reason || ' ' || (lease_owner IS NULL) || ' ' ||"
        " (SELECT string_agg(event_type || ':' || coalesce(payload->>'reason', '-'),"
        "  ',' ORDER BY created_at, event_type) FROM outbox o"
        "  WHERE o.payment_attempt_id = p.id)"
        " || ' ' || (SELECT count(*) FROM ledger_entries l"
        "  WHERE l.payment_attempt_id = p.id)"
        " FROM payment_attempts p WHERE id = '%s'",
        h.payment_attempt_id);
    ck_assert_str_eq(value(q),
                     "VOIDED expired true authorization.unknown:outcome_unknown:"
                     " timeout,authorization.succeeded:-,authorization.failed:"
                     "expired 0");
    ck_assert_int_eq(attempt_store_claim_due(auths, due, 4, &n, 60000, 300000, &err),
                     0);
    ck_assert_uint_eq(n, 0);
    attempt_store_free(w);
    attempt_store_free(charges);
    attempt_store_free(auths);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("attempt_store");
    TCase *tc = tcase_create("attempt_store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, record_compares_every_message_with_the_stored_attempt);
    tcase_add_test(tc, conflicting_resend_in_the_same_batch_is_a_conflict);
    tcase_add_test(tc, second_attempt_of_a_busy_or_paid_order_is_rejected);
    tcase_add_test(tc, record_with_a_lease_claims_what_it_creates_once);
    tcase_add_test(tc, claim_returns_the_stored_parameters_and_the_key_age);
    tcase_add_test(tc, takeover_fences_the_old_owner);
    tcase_add_test(tc, a_wait_is_said_by_its_claim_and_ends_with_it);
    tcase_add_test(tc, failures_are_classified);
    tcase_add_test(tc, reconciler_claims_due_attempts_and_settles_them_fenced);
    tcase_add_test(tc, operator_settles_review_without_a_lease);
    tcase_add_test(tc, a_row_held_by_another_session_is_busy_and_holds_nothing_else);
    tcase_add_test(tc, a_look_left_busy_is_claimed_again_by_its_reconciler);
    tcase_add_test(tc, a_call_written_again_after_a_failure_is_one_row);
    tcase_add_test(tc, each_look_claims_its_own_capture_method);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
