/* worker/operations/void's webhook half (void_webhook) against the real
 * PostgreSQL of the local stack, inside a transaction as webhook_store runs
 * it: payment_intent.canceled of our recorded intent settles the UNKNOWN
 * void that holds the authorization (void SUCCEEDED with released_amount,
 * attempt VOIDED with the void's reason, one void.succeeded); delivered
 * again it is a no-op; an intent that merely names an attempt of ours in
 * its metadata settles nothing (flagged foreign_intent); and which events
 * the half takes. (The api reaches this half once the charge's half
 * leaves manual intents alone: common37's routing.) */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include <libpq-fe.h>

#include "store_conn.h"
#include "test_env.h"
#include "void.h"

static char url[1024];
static PGconn *admin;

/* An AUTHORIZED attempt of intent `intent`, held by an UNKNOWN void;
 * their ids into attempt and vid. */
static void held_authorization(const char *intent, char attempt[37], char vid[37])
{
    char order[37];
    test_env_uuid(attempt);
    test_env_uuid(vid);
    test_env_uuid(order);
    const char *a[] = {attempt, order, intent};
    test_env_sql(admin,
                 "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
                 " request_fingerprint, amount, currency, payment_method, status,"
                 " provider_payment_id, capture_method) VALUES ($1::uuid, $2::uuid, "
                 "'k-' || $1::text, 'fp',"
                 " 1500, 'EUR', 'pm_card_visa', 'AUTHORIZED', $3, 'manual')",
                 3, a);
    const char *v[] = {vid, attempt, intent};
    test_env_sql(admin,
                 "INSERT INTO void_attempts (id, payment_attempt_id, idempotency_key,"
                 " request_fingerprint, void_reason, status, payment_intent)"
                 " VALUES ($1::uuid, $2::uuid, 'v-' || $1::text, 'fp', 'duplicate', "
                 "'PENDING', $3)",
                 3, v);
    test_env_sql(
        admin,
        "UPDATE payment_attempts SET held_by = 'void', held_by_id = $1 WHERE id = $2",
        2, v);
    test_env_sql(
        admin,
        "UPDATE void_attempts SET status = 'UNKNOWN', holds = true WHERE id = $1", 1,
        v);
}

static struct webhook_event canceled(const char *intent, const char *named)
{
    struct webhook_event ev;
    memset(&ev, 0, sizeof(ev));
    snprintf(ev.id, sizeof(ev.id), "evt_%s", intent);
    snprintf(ev.type, sizeof(ev.type), "%s", "payment_intent.canceled");
    snprintf(ev.intent_id, sizeof(ev.intent_id), "%s", intent);
    snprintf(ev.intent_status, sizeof(ev.intent_status), "%s", "canceled");
    snprintf(ev.capture_method, sizeof(ev.capture_method), "%s", "manual");
    snprintf(ev.cancellation_reason, sizeof(ev.cancellation_reason), "%s", "duplicate");
    snprintf(ev.attempt_id, sizeof(ev.attempt_id), "%s", named);
    ev.amount = 1500;
    return ev;
}

/* The half applied in a transaction of its own, committed: the outcome. */
static const char *apply(const struct webhook_event *ev)
{
    struct charged_error err = {0};
    struct webhook_store_result out;
    store_conn_t *db = store_conn_new(url, "5s", &err);
    ck_assert_ptr_nonnull(db);
    ck_assert_int_eq(store_conn_open(db, NULL, &err), CHARGED_OK);
    ck_assert_int_eq(store_conn_exec(db, "BEGIN", 0, NULL, NULL, &err), CHARGED_OK);
    memset(&out, 0, sizeof(out));
    ck_assert(void_webhook.takes(ev));
    enum charged_rc rc = void_webhook.apply(db, ev, &out, &err);
    ck_assert_msg(rc == CHARGED_OK, "apply: %s", err.message);
    ck_assert_int_eq(store_conn_exec(db, "COMMIT", 0, NULL, NULL, &err), CHARGED_OK);
    store_conn_free(db);
    return out.outcome;
}

static char *value(const char *fmt, const char *id)
{
    char q[512];
    snprintf(q, sizeof(q), fmt, id);
    return test_env_value(admin, q);
}

START_TEST(our_intent_canceled_settles_the_void_once)
{
    char attempt[37], vid[37];
    held_authorization("pi_ours1", attempt, vid);
    struct webhook_event ev = canceled("pi_ours1", attempt);
    ck_assert_str_eq(apply(&ev), "applied");
    ck_assert_str_eq(value("SELECT status || ' ' || released_amount || ' ' || holds"
                           " FROM void_attempts WHERE id = '%s'",
                           vid),
                     "SUCCEEDED 1500 true");
    ck_assert_str_eq(
        value("SELECT status || ' ' || reason || ' ' ||"
              " coalesce(held_by, '-') FROM payment_attempts WHERE id = '%s'",
              attempt),
        "VOIDED duplicate -");
    ck_assert_str_eq(value("SELECT string_agg(event_type, ',') FROM outbox"
                           " WHERE payload->>'void_id' = '%s'",
                           vid),
                     "void.succeeded");
    /* Delivered again: nothing moves, nothing more is published. */
    ck_assert_str_eq(apply(&ev), "ignored");
    ck_assert_str_eq(
        value("SELECT count(*) FROM outbox WHERE payload->>'void_id' = '%s'", vid),
        "1");
    ck_assert_str_eq(value("SELECT count(*) FROM void_transitions WHERE void_id = '%s'"
                           " AND cause = 'webhook'",
                           vid),
                     "1");
}
END_TEST

START_TEST(a_foreign_intent_settles_nothing)
{
    char attempt[37], vid[37];
    held_authorization("pi_ours2", attempt, vid);
    /* Another intent, naming our attempt in its metadata. */
    struct webhook_event ev = canceled("pi_other2", attempt);
    ck_assert_str_eq(apply(&ev), "flagged");
    ck_assert_str_eq(value("SELECT status FROM void_attempts WHERE id = '%s'", vid),
                     "UNKNOWN");
    ck_assert_str_eq(value("SELECT status || ' ' || held_by FROM payment_attempts"
                           " WHERE id = '%s'",
                           attempt),
                     "AUTHORIZED void");
    ck_assert_str_eq(
        value("SELECT count(*) FROM outbox WHERE payment_attempt_id = '%s'", attempt),
        "0");
    /* Naming nothing of ours: unmatched. */
    char none[37];
    test_env_uuid(none);
    ev = canceled("pi_other3", none);
    ck_assert_str_eq(apply(&ev), "unmatched");
}
END_TEST

/* The worker moves the authorization for its void (void_store_move_sql:
 * the void locked, then the authorization) while a delivery holds the
 * authorization's lock: the delivery must not wait for the void (the
 * worker waits for it: a deadlock), but answer lock_not_available at once
 * (CHARGED_WAIT: not stored, delivered again); then it applies. */
START_TEST(a_delivery_meeting_the_void_locked_comes_again)
{
    char attempt[37], vid[37];
    held_authorization("pi_ours4", attempt, vid);
    const char *v[] = {vid};
    test_env_sql(admin, "BEGIN", 0, NULL);
    test_env_sql(admin, "SELECT 1 FROM void_attempts WHERE id = $1 FOR NO KEY UPDATE",
                 1, v);
    struct webhook_event ev = canceled("pi_ours4", attempt);
    struct charged_error err = {0};
    struct webhook_store_result out;
    memset(&out, 0, sizeof(out));
    store_conn_t *db = store_conn_new(url, "5s", &err);
    ck_assert_ptr_nonnull(db);
    ck_assert_int_eq(store_conn_open(db, NULL, &err), CHARGED_OK);
    ck_assert_int_eq(store_conn_exec(db, "BEGIN", 0, NULL, NULL, &err), CHARGED_OK);
    enum charged_rc rc = void_webhook.apply(db, &ev, &out, &err);
    ck_assert_msg(rc == CHARGED_WAIT, "rc %d (%s), outcome %s", (int)rc, err.message,
                  out.outcome ? out.outcome : "-");
    ck_assert_int_eq(store_conn_exec(db, "ROLLBACK", 0, NULL, NULL, &err), CHARGED_OK);
    store_conn_free(db);
    test_env_sql(admin, "ROLLBACK", 0, NULL);
    ck_assert_str_eq(apply(&ev), "applied");
}
END_TEST

START_TEST(it_takes_a_manual_intents_cancel_but_its_expiry)
{
    struct webhook_event ev = canceled("pi_x", "");
    ck_assert(void_webhook.takes(&ev));
    snprintf(ev.cancellation_reason, sizeof(ev.cancellation_reason), "%s", "automatic");
    ck_assert(!void_webhook.takes(&ev));
    ev = canceled("pi_x", "");
    snprintf(ev.capture_method, sizeof(ev.capture_method), "%s", "automatic");
    ck_assert(!void_webhook.takes(&ev));
    ev = canceled("pi_x", "");
    snprintf(ev.type, sizeof(ev.type), "%s", "payment_intent.succeeded");
    ck_assert(!void_webhook.takes(&ev));
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
    Suite *s = suite_create("void_webhook");
    TCase *tc = tcase_create("void_webhook");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, our_intent_canceled_settles_the_void_once);
    tcase_add_test(tc, a_foreign_intent_settles_nothing);
    tcase_add_test(tc, it_takes_a_manual_intents_cancel_but_its_expiry);
    tcase_add_test(tc, a_delivery_meeting_the_void_locked_comes_again);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
