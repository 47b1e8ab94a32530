/* worker/operations/capture's webhook half against the real PostgreSQL of
 * the local stack, each test in a database of its own: the provider's
 * payment_intent.succeeded of our recorded intent settles the capture that
 * holds the authorization, as the worker's answer would (the
 * authorization SUCCEEDED with captured_amount, one ledger 'charge' row,
 * the capture SUCCEEDED with one capture.succeeded), once: the event again
 * is a no-op; an intent we did not record settles nothing. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "capture.h"
#include "db.h"
#include "store_conn.h"
#include "test_env.h"
#include "webhook_event.h"

#define ATTEMPT "00000000-0000-4000-8000-000000000001"
#define CAPTURE "20000000-0000-4000-8000-000000000001"

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

static char *value(const char *q)
{
    return test_env_value(admin, q);
}

/* An authorization of 1000 EUR under intent pi_cap1, held by an UNKNOWN
 * capture of all of it (its answer lost), as the claim leaves them. */
static void held_in_doubt(void)
{
    test_env_sql(admin,
                 "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
                 " request_fingerprint, amount, currency, payment_method, status,"
                 " provider_payment_id, capture_method) VALUES ('" ATTEMPT "',"
                 " '10000000-0000-4000-8000-000000000001', 'auth-1', 'fp', 1000, 'EUR',"
                 " 'pm_card_visa', 'AUTHORIZED', 'pi_cap1', 'manual')",
                 0, NULL);
    test_env_sql(
        admin,
        "INSERT INTO capture_attempts (id, payment_attempt_id, order_id,"
        " idempotency_key, request_fingerprint, currency, status) VALUES ('" CAPTURE
        "', '" ATTEMPT "', '10000000-0000-4000-8000-000000000001', 'cap-1', 'fp',"
        " 'EUR', 'PENDING')",
        0, NULL);
    test_env_sql(
        admin,
        "UPDATE payment_attempts SET held_by = 'capture', held_by_id = '" CAPTURE
        "' WHERE id = '" ATTEMPT "'",
        0, NULL);
    test_env_sql(
        admin,
        "UPDATE capture_attempts SET status = 'UNKNOWN', holds = true,"
        " payment_intent = 'pi_cap1', first_sent_at = now() WHERE id = '" CAPTURE "'",
        0, NULL);
}

static struct webhook_event succeeded(const char *event_id, const char *intent)
{
    struct webhook_event ev;
    memset(&ev, 0, sizeof(ev));
    snprintf(ev.id, sizeof(ev.id), "%s", event_id);
    snprintf(ev.type, sizeof(ev.type), "payment_intent.succeeded");
    snprintf(ev.intent_id, sizeof(ev.intent_id), "%s", intent);
    snprintf(ev.intent_status, sizeof(ev.intent_status), "succeeded");
    snprintf(ev.capture_method, sizeof(ev.capture_method), "manual");
    ev.amount = 1000;
    ev.amount_received = 1000;
    ev.amount_capturable = 0;
    snprintf(ev.currency, sizeof(ev.currency), "EUR");
    return ev;
}

/* capture_webhook.apply in a transaction of its own, left open: the caller
 * commits it (finish). */
static store_conn_t *apply_open(const struct webhook_event *ev,
                                struct webhook_store_result *out)
{
    struct charged_error err = {0};
    memset(out, 0, sizeof(*out));
    store_conn_t *db = store_conn_new(url, "5s", &err);
    ck_assert_msg(db != NULL, "%s", err.message);
    ck_assert_int_eq(store_conn_open(db, NULL, &err), CHARGED_OK);
    ck_assert_int_eq(store_conn_exec(db, "BEGIN", 0, NULL, NULL, &err), CHARGED_OK);
    ck_assert(capture_webhook.takes(ev));
    enum charged_rc rc = capture_webhook.apply(db, ev, out, &err);
    ck_assert_msg(rc == CHARGED_OK, "apply: %s", err.message);
    return db;
}

static void finish(store_conn_t *db)
{
    struct charged_error err = {0};
    ck_assert_int_eq(store_conn_exec(db, "COMMIT", 0, NULL, NULL, &err), CHARGED_OK);
    store_conn_free(db);
}

/* capture_webhook.apply in a transaction of its own, committed when OK. */
static struct webhook_store_result apply(const struct webhook_event *ev)
{
    struct webhook_store_result out;
    finish(apply_open(ev, &out));
    return out;
}

struct racer {
    struct webhook_event ev;
    struct webhook_store_result out;
};

static void *apply_thread(void *arg)
{
    struct racer *r = arg;
    r->out = apply(&r->ev);
    return NULL;
}

START_TEST(our_intents_success_settles_the_capture_once)
{
    held_in_doubt();
    struct webhook_event ev = succeeded("evt_1", "pi_cap1");
    struct webhook_store_result out = apply(&ev);
    ck_assert_str_eq(out.outcome, "applied");
    ck_assert_str_eq(out.attempt_id, ATTEMPT);
    ck_assert_str_eq(value("SELECT status || ' ' || captured_amount || ' ' ||"
                           " coalesce(held_by, '-') FROM payment_attempts"),
                     "SUCCEEDED 1000 -");
    ck_assert_str_eq(value("SELECT status || ' ' || captured_amount FROM"
                           " capture_attempts"),
                     "SUCCEEDED 1000");
    ck_assert_str_eq(value("SELECT string_agg(kind || ' ' || amount || ' ' ||"
                           " provider_payment_id, ',') FROM ledger_entries"),
                     "charge 1000 pi_cap1");
    ck_assert_str_eq(value("SELECT string_agg(event_type, ',') FROM outbox"),
                     "capture.succeeded");
    ck_assert_str_eq(value("SELECT payload->>'capture_id' || ' ' ||"
                           " (payload->>'amount') FROM outbox"),
                     CAPTURE " 1000");
    /* Again, under another delivery: nothing moves. */
    ev = succeeded("evt_2", "pi_cap1");
    out = apply(&ev);
    ck_assert_str_eq(out.outcome, "ignored");
    ck_assert_str_eq(value("SELECT count(*) FROM outbox"), "1");
    ck_assert_str_eq(value("SELECT count(*) FROM ledger_entries"), "1");
    ck_assert_str_eq(value("SELECT count(*) FROM capture_transitions"), "1");
}
END_TEST

/* Two deliveries at once (the worker's settlement races one the same way:
 * it changes the authorization and the capture in one transaction): the
 * second waits on the authorization's lock while the first settles, and
 * then must see the capture as the first committed it, SUCCEEDED, not as
 * its snapshot had it before the wait (UNKNOWN, and the hold already
 * released): ignored, never "review" (a false page for a person). */
START_TEST(a_delivery_that_waited_on_the_lock_sees_the_capture_settled)
{
    held_in_doubt();
    struct webhook_event first = succeeded("evt_4", "pi_cap1");
    struct webhook_store_result out;
    store_conn_t *db = apply_open(&first, &out);
    ck_assert_str_eq(out.outcome, "applied");
    struct racer r = {.ev = succeeded("evt_5", "pi_cap1")};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, apply_thread, &r), 0);
    /* Until the second waits on the lock the first holds. */
    for (int i = 0;
         i < 500 &&
         strcmp(value("SELECT count(*) FROM pg_stat_activity WHERE"
                      " wait_event_type = 'Lock' AND datname = current_database()"),
                "1") != 0;
         i++)
        usleep(10000);
    ck_assert_str_eq(
        value("SELECT count(*) FROM pg_stat_activity WHERE"
              " wait_event_type = 'Lock' AND datname = current_database()"),
        "1");
    finish(db);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
    ck_assert_str_eq(r.out.outcome, "ignored");
    ck_assert_str_eq(value("SELECT count(*) FROM ledger_entries"), "1");
    ck_assert_str_eq(value("SELECT count(*) FROM capture_transitions"), "1");
}
END_TEST

/* The worker books the authorization as its capture's (capture_store_book:
 * the capture locked, then the authorization) while a delivery holds the
 * authorization's lock and would book it too: the delivery must neither
 * wait for the capture (the worker waits for it: a deadlock) nor call it
 * "review" (a page for a capture that is fine). It is not stored, so the
 * provider delivers it again, and then it applies. */
START_TEST(a_delivery_meeting_the_capture_locked_comes_again)
{
    held_in_doubt();
    test_env_sql(admin, "BEGIN", 0, NULL);
    test_env_sql(admin,
                 "SELECT 1 FROM capture_attempts WHERE id = '" CAPTURE "'"
                 " FOR NO KEY UPDATE",
                 0, NULL);
    struct webhook_event ev = succeeded("evt_6", "pi_cap1");
    struct charged_error err = {0};
    struct webhook_store_result out;
    memset(&out, 0, sizeof(out));
    store_conn_t *db = store_conn_new(url, "5s", &err);
    ck_assert_ptr_nonnull(db);
    ck_assert_int_eq(store_conn_open(db, NULL, &err), CHARGED_OK);
    ck_assert_int_eq(store_conn_exec(db, "BEGIN", 0, NULL, NULL, &err), CHARGED_OK);
    enum charged_rc rc = capture_webhook.apply(db, &ev, &out, &err);
    ck_assert_msg(rc == CHARGED_WAIT, "rc %d: %s (%s) beside the worker", (int)rc,
                  out.outcome ? out.outcome : "-", out.reason ? out.reason : "-");
    ck_assert_int_eq(store_conn_exec(db, "ROLLBACK", 0, NULL, NULL, &err), CHARGED_OK);
    store_conn_free(db);
    test_env_sql(admin, "ROLLBACK", 0, NULL);
    out = apply(&ev);
    ck_assert_str_eq(out.outcome, "applied");
}
END_TEST

START_TEST(a_foreign_intent_settles_nothing)
{
    held_in_doubt();
    struct webhook_event ev = succeeded("evt_3", "pi_someone_elses");
    /* It names our attempt in its metadata: anyone may write that. */
    snprintf(ev.attempt_id, sizeof(ev.attempt_id), "%s", ATTEMPT);
    struct webhook_store_result out = apply(&ev);
    ck_assert_str_eq(out.outcome, "unmatched");
    ck_assert_str_eq(value("SELECT status FROM capture_attempts"), "UNKNOWN");
    ck_assert_str_eq(value("SELECT status || ' ' || held_by FROM payment_attempts"),
                     "AUTHORIZED capture");
    ck_assert_str_eq(value("SELECT count(*) FROM ledger_entries"), "0");
    ck_assert_str_eq(value("SELECT count(*) FROM outbox"), "0");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("capture_webhook");
    TCase *tc = tcase_create("capture_webhook");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, our_intents_success_settles_the_capture_once);
    tcase_add_test(tc, a_foreign_intent_settles_nothing);
    tcase_add_test(tc, a_delivery_that_waited_on_the_lock_sees_the_capture_settled);
    tcase_add_test(tc, a_delivery_meeting_the_capture_locked_comes_again);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
