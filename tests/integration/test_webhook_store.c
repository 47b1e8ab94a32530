/* common/store/webhook_store against the real PostgreSQL of the local stack, each
 * test in a database of its own: a webhook event settles its attempt once
 * (status, ledger, result event, the event recorded), a redelivery is a
 * duplicate, an event for no attempt is unmatched, one we do not act on is
 * ignored; the status views; a session the server ended is replaced and
 * the call asked once more; and how every failure is classified, with the
 * SQLSTATE in the struct charged_error: an event the database refuses is
 * CHARGED_BAD_ITEM, a refusal after the event was taken CHARGED_RETRY (the
 * delivery is asked again), the attempt held by another session past the
 * lock_timeout CHARGED_WAIT, an unreachable database CHARGED_RETRY. A
 * refund's events, duplicated and reordered, move it once each way (one
 * transition, one result event, the money by the trigger), a failure of a
 * SUCCEEDED refund is needs_review and never applied, one for no refund we
 * know is unmatched; the refund view and the attempt's refunded_amount. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attempt_store.h"
#include "db.h"
#include "op.h"
#include "test_env.h"
#include "webhook_store.h"

#define PROVIDER "psp"

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

static void sql(const char *q)
{
    test_env_sql(admin, q, 0, NULL);
}

static char *value(const char *q)
{
    return test_env_value(admin, q);
}

/* A PROCESSING attempt of 1000 EUR, claimed by a worker whose call is in
 * flight, as a webhook finds it. Its id in `id`. */
static void processing_attempt(char id[37])
{
    struct charge_command c = {0};
    seq++;
    snprintf(c.payment_attempt_id, sizeof(c.payment_attempt_id),
             "00000000-0000-4000-8000-%012d", seq);
    snprintf(c.order_id, sizeof(c.order_id), "10000000-0000-4000-8000-%012d", seq);
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "attempt:%s",
             c.payment_attempt_id);
    c.amount = 1000;
    snprintf(c.currency, sizeof(c.currency), "EUR");
    snprintf(c.payment_method, sizeof(c.payment_method), "pm_card_visa");
    snprintf(c.fingerprint, sizeof(c.fingerprint), "fp");
    attempt_store_t *w = attempt_store_new(url, "w1", &err);
    ck_assert_msg(w != NULL, "%s", err.message);
    struct attempt_record_item it = {.cmd = &c};
    ck_assert_msg(attempt_store_record(w, &it, 1, 0, &err) == CHARGED_OK, "%s",
                  err.message);
    struct attempt_claim_item ci = {.attempt_id = c.payment_attempt_id};
    ck_assert_msg(attempt_store_claim(w, &ci, 1, 60000, &err) == CHARGED_OK, "%s",
                  err.message);
    ck_assert_int_eq(ci.result, ATTEMPT_CLAIMED);
    attempt_store_free(w);
    snprintf(id, 37, "%s", c.payment_attempt_id);
}

/* The intent our own call's answer recorded on the attempt: only events
 * about it move the attempt (an event that only names it never does). */
static void own_intent(const char *attempt, const char *intent)
{
    char q[256];
    snprintf(q, sizeof(q),
             "UPDATE payment_attempts SET provider_payment_id = '%s' WHERE id = '%s'",
             intent, attempt);
    sql(q);
}

/* A success (or, with WEBHOOK_EVIDENCE_NONE, an event we do not act on)
 * of 1000 EUR for `attempt_id` under intent `intent`. */
static struct webhook_event event(const char *event_id, enum webhook_evidence evidence,
                                  const char *attempt_id, const char *intent)
{
    struct webhook_event ev;
    memset(&ev, 0, sizeof(ev));
    snprintf(ev.id, sizeof(ev.id), "%s", event_id);
    snprintf(ev.type, sizeof(ev.type), "%s",
             evidence == WEBHOOK_EVIDENCE_SUCCEEDED ? "payment_intent.succeeded"
                                                    : "payment_intent.created");
    ev.created = (int64_t)time(NULL);
    ev.evidence = evidence;
    snprintf(ev.intent_id, sizeof(ev.intent_id), "%s", intent);
    snprintf(ev.intent_status, sizeof(ev.intent_status), "succeeded");
    ev.amount = 1000;
    snprintf(ev.currency, sizeof(ev.currency), "EUR");
    snprintf(ev.attempt_id, sizeof(ev.attempt_id), "%s", attempt_id);
    return ev;
}

static webhook_store_t *store(void)
{
    webhook_store_t *st = webhook_store_new(url, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    return st;
}

static char *attempt_row(const char *id)
{
    char q[512];
    snprintf(
        q, sizeof(q),
        "SELECT status || ' ' || coalesce(provider_payment_id, '-') || ' ' ||"
        " (lease_owner IS NULL) || ' ' ||"
        " (SELECT count(*) FROM ledger_entries l WHERE l.payment_attempt_id = p.id)"
        " || ' ' || (SELECT count(*) FROM outbox o WHERE o.payment_attempt_id ="
        " p.id AND o.event_type = 'charge.succeeded')"
        " FROM payment_attempts p WHERE id = '%s'",
        id);
    return value(q);
}

static char *recorded(const char *event_id)
{
    char q[256];
    snprintf(q, sizeof(q),
             "SELECT coalesce(max(outcome), 'none') FROM processed_webhook_events"
             " WHERE event_id = '%s'",
             event_id);
    return value(q);
}

START_TEST(an_event_settles_its_attempt_once)
{
    char id[37];
    processing_attempt(id);
    webhook_store_t *st = store();
    struct webhook_store_result res;
    own_intent(id, "pi_ok");
    struct webhook_event ev = event("evt_ok", WEBHOOK_EVIDENCE_SUCCEEDED, id, "pi_ok");

    ck_assert_msg(webhook_store_apply(st, PROVIDER, &ev, "{}", &res, &err) ==
                      CHARGED_OK,
                  "%s", err.message);
    ck_assert_str_eq(res.outcome, "applied");
    ck_assert_str_eq(res.attempt_id, id);
    ck_assert_str_eq(res.old_status, "PROCESSING");
    ck_assert_str_eq(res.new_status, "SUCCEEDED");
    ck_assert_str_eq(attempt_row(id), "SUCCEEDED pi_ok true 1 1");
    ck_assert_str_eq(recorded("evt_ok"), "applied");

    /* Delivered again: nothing changes. */
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &ev, "{}", &res, &err),
                     CHARGED_OK);
    ck_assert_str_eq(res.outcome, "duplicate");
    ck_assert_str_eq(attempt_row(id), "SUCCEEDED pi_ok true 1 1");

    /* An event for no attempt we know, and one we do not act on. */
    struct webhook_event stray = event("evt_stray", WEBHOOK_EVIDENCE_SUCCEEDED,
                                       "00000000-0000-4000-8000-999999999999", "pi_x");
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &stray, "{}", &res, &err),
                     CHARGED_OK);
    ck_assert_str_eq(res.outcome, "unmatched");
    ck_assert_str_eq(recorded("evt_stray"), "unmatched");
    struct webhook_event created = event("evt_new", WEBHOOK_EVIDENCE_NONE, id, "pi_ok");
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &created, "{}", &res, &err),
                     CHARGED_OK);
    ck_assert_str_eq(res.outcome, "ignored");
    ck_assert_str_eq(recorded("evt_new"), "ignored");
    webhook_store_free(st);
    webhook_store_free(NULL);
}
END_TEST

START_TEST(status_views)
{
    char id[37], order[37];
    processing_attempt(id);
    char q[256];
    snprintf(q, sizeof(q), "SELECT order_id FROM payment_attempts WHERE id = '%s'", id);
    snprintf(order, sizeof(order), "%s", value(q));
    webhook_store_t *st = store();
    json_t *doc = NULL;

    ck_assert_int_eq(webhook_store_ping(st, &err), CHARGED_OK);
    ck_assert_msg(webhook_store_attempt(st, id, &doc, &err) == CHARGED_OK, "%s",
                  err.message);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "payment_attempt_id")), id);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "status")), "PROCESSING");
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "amount")), 1000);
    ck_assert(json_is_null(json_object_get(doc, "provider_payment_id")));
    ck_assert_ptr_null(json_object_get(doc, "payment_method"));
    json_decref(doc);
    ck_assert_int_eq(webhook_store_order(st, order, &doc, &err), CHARGED_OK);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "order_id")), order);
    ck_assert_uint_eq(json_array_size(json_object_get(doc, "payment_attempts")), 1);
    json_decref(doc);

    const char *none = "00000000-0000-4000-8000-999999999999";
    doc = (json_t *)&doc; /* anything: the call sets it */
    ck_assert_int_eq(webhook_store_attempt(st, none, &doc, &err), CHARGED_NOT_FOUND);
    ck_assert_ptr_null(doc);
    ck_assert_int_eq(webhook_store_order(st, none, &doc, &err), CHARGED_NOT_FOUND);
    ck_assert_ptr_null(doc);
    webhook_store_free(st);
}
END_TEST

/* Ends the one client session of the test's database other than admin's
 * (the store's), and waits until the server has let it go. */
static void end_store_session(void)
{
    char pid[32];
    /* The store's session is the only other one, once a session this test
     * ended before has gone: an ending backend stays listed for a moment
     * (two rows once, under the sanitizers beside three other sets). */
    long long settled = test_env_now_ms() + 10000;
    struct timespec tick = {0, 10 * 1000000L};
    while (strcmp(value("SELECT count(*) FROM pg_stat_activity WHERE datname ="
                        " current_database() AND backend_type = 'client backend'"
                        " AND pid <> pg_backend_pid()"),
                  "1") != 0 &&
           test_env_now_ms() < settled)
        nanosleep(&tick, NULL);
    snprintf(pid, sizeof(pid), "%s",
             value("SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                   " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"));
    const char *p[1] = {pid};
    ck_assert_msg(db_run(admin, "SELECT pg_terminate_backend($1::int)", 1, p, &err) ==
                      0,
                  "%s", err.message);
    long long deadline = test_env_now_ms() + 10000;
    struct timespec pause = {0, 10 * 1000000L};
    char q[128];
    snprintf(q, sizeof(q), "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", pid);
    while (strcmp(value(q), "0") != 0 && test_env_now_ms() < deadline)
        nanosleep(&pause, NULL);
    ck_assert_str_eq(value(q), "0");
}

/* A session the server ended while idle (a restart, a pooler) costs the
 * caller nothing: the call is asked once more on a new one. */
START_TEST(a_session_ended_by_the_server_is_replaced)
{
    char id[37];
    processing_attempt(id);
    webhook_store_t *st = store();
    json_t *doc = NULL;
    ck_assert_int_eq(webhook_store_ping(st, &err), CHARGED_OK);
    end_store_session();
    ck_assert_msg(webhook_store_attempt(st, id, &doc, &err) == CHARGED_OK, "%s",
                  err.message);
    json_decref(doc);
    end_store_session();
    struct webhook_store_result res;
    own_intent(id, "pi_1");
    struct webhook_event ev =
        event("evt_again", WEBHOOK_EVIDENCE_SUCCEEDED, id, "pi_1");
    ck_assert_msg(webhook_store_apply(st, PROVIDER, &ev, "{}", &res, &err) ==
                      CHARGED_OK,
                  "%s", err.message);
    ck_assert_str_eq(res.outcome, "applied");
    webhook_store_free(st);
}
END_TEST

START_TEST(refusals_are_classified_with_their_sqlstate)
{
    char id[37];
    processing_attempt(id);
    webhook_store_t *st = store();
    struct webhook_store_result res;

    /* The event itself refused: DATA, and no delivery of it will do. */
    struct webhook_event ev = event("evt_bad", WEBHOOK_EVIDENCE_SUCCEEDED, id, "pi_1");
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &ev, "{not json", &res, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_str_eq(err.code, "22P02");
    ck_assert_msg(strstr(err.message, "json") != NULL, "%s", err.message);
    ck_assert_str_eq(recorded("evt_bad"), "none");

    /* Refused once the event was taken (here by a trigger standing for a
     * constraint the decision missed): not the event's fault, so RETRY,
     * and the whole transaction is undone. */
    own_intent(id, "pi_1");
    sql("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS"
        " $$BEGIN RAISE EXCEPTION 'refused' USING ERRCODE = 'check_violation'; END$$");
    sql("CREATE TRIGGER refuse BEFORE UPDATE ON payment_attempts"
        " FOR EACH ROW EXECUTE FUNCTION refuse()");
    struct webhook_event ok =
        event("evt_later", WEBHOOK_EVIDENCE_SUCCEEDED, id, "pi_1");
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &ok, "{}", &res, &err),
                     CHARGED_RETRY);
    ck_assert_str_eq(err.code, "23514");
    ck_assert_str_eq(recorded("evt_later"), "none");
    ck_assert_str_eq(attempt_row(id), "PROCESSING pi_1 false 0 0");
    sql("DROP TRIGGER refuse ON payment_attempts");
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &ok, "{}", &res, &err),
                     CHARGED_OK);
    ck_assert_str_eq(res.outcome, "applied");
    ck_assert_str_eq(err.code, "");
    webhook_store_free(st);
}
END_TEST

/* Another session holds the attempt's row (a worker's statement, or one
 * hung in its transaction) past the store's lock_timeout (5 s): LOCKED,
 * 55P03, nothing recorded, and the delivery taken once the row is free. */
START_TEST(an_attempt_held_by_another_session_is_locked)
{
    char id[37];
    processing_attempt(id);
    own_intent(id, "pi_1");
    webhook_store_t *st = store();
    struct webhook_store_result res;
    PGconn *peer = test_env_connect(url);
    const char *held[1] = {id};
    /* Held for longer than our sessions may idle in a transaction. */
    ck_assert_int_eq(db_run(peer, "BEGIN", 0, NULL, &err), 0);
    /* In the transaction: db_run's BEGIN carries our DB_IDLE_IN_TX (db.h). */
    ck_assert_int_eq(db_run(peer, "SET LOCAL idle_in_transaction_session_timeout = 0",
                            0, NULL, &err),
                     0);
    ck_assert_msg(db_run(peer,
                         "SELECT id FROM payment_attempts WHERE id = $1::uuid"
                         " FOR NO KEY UPDATE",
                         1, held, &err) == 0,
                  "%s", err.message);
    struct webhook_event ev = event("evt_held", WEBHOOK_EVIDENCE_SUCCEEDED, id, "pi_1");
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &ev, "{}", &res, &err),
                     CHARGED_WAIT);
    ck_assert_str_eq(err.code, "55P03");
    ck_assert_str_eq(recorded("evt_held"), "none");
    /* The status views read without waiting for it. */
    json_t *doc = NULL;
    ck_assert_int_eq(webhook_store_attempt(st, id, &doc, &err), CHARGED_OK);
    json_decref(doc);
    ck_assert_int_eq(db_run(peer, "ROLLBACK", 0, NULL, &err), 0);
    PQfinish(peer);
    ck_assert_int_eq(webhook_store_apply(st, PROVIDER, &ev, "{}", &res, &err),
                     CHARGED_OK);
    ck_assert_str_eq(res.outcome, "applied");
    webhook_store_free(st);
}
END_TEST

START_TEST(an_unreachable_database_is_retry)
{
    ck_assert_ptr_null(webhook_store_new("postgresql://x:y@/db?nonsense=1", &err));
    ck_assert_msg(strstr(err.message, "bad database url") != NULL, "%s", err.message);
    webhook_store_t *down =
        webhook_store_new("postgresql://charged@127.0.0.1:1/charged", &err);
    ck_assert_msg(down != NULL, "a store is made without connecting: %s", err.message);
    struct webhook_store_result res;
    struct webhook_event ev = event("evt_down", WEBHOOK_EVIDENCE_SUCCEEDED,
                                    "00000000-0000-4000-8000-000000000001", "pi_1");
    json_t *doc = NULL;
    long long t0 = test_env_now_ms();
    ck_assert_int_eq(webhook_store_apply(down, PROVIDER, &ev, "{}", &res, &err),
                     CHARGED_RETRY);
    ck_assert_str_eq(err.code, "");
    ck_assert_msg(strstr(err.message, "database unreachable") != NULL, "%s",
                  err.message);
    ck_assert_int_eq(webhook_store_attempt(down, ev.attempt_id, &doc, &err),
                     CHARGED_RETRY);
    ck_assert_int_eq(webhook_store_order(down, ev.attempt_id, &doc, &err),
                     CHARGED_RETRY);
    ck_assert_ptr_null(doc);
    ck_assert_int_eq(webhook_store_ping(down, &err), CHARGED_RETRY);
    ck_assert_str_eq(err.code, "");
    ck_assert_int_lt(test_env_now_ms() - t0, 20000);
    webhook_store_free(down);
}
END_TEST

/* A refund of `amount` of attempt `attempt` (succeeded under pi_ok) in
 * `status`, reserved on the charge as a worker leaves it after its call. */
static void refund_row(const char *attempt, const char *refund, long long amount,
                       const char *status)
{
    char q[1024];
    snprintf(q, sizeof(q),
             "UPDATE payment_attempts SET refund_reserved = refund_reserved + %lld"
             " WHERE id = '%s'",
             amount, attempt);
    sql(q);
    snprintf(q, sizeof(q),
             "INSERT INTO refund_attempts (id, payment_attempt_id, order_id,"
             " idempotency_key, request_fingerprint, amount, currency, refund_reason,"
             " status, payment_intent, reserved)"
             " SELECT '%s', id, order_id, 'refund:%s', 'fp', %lld, currency,"
             " 'requested_by_customer', '%s', provider_payment_id, true"
             " FROM payment_attempts WHERE id = '%s'",
             refund, refund, amount, status, attempt);
    sql(q);
}

/* The refund id our own call's answer recorded on the refund. */
static void own_refund(const char *refund, const char *re)
{
    char q[256];
    snprintf(q, sizeof(q),
             "UPDATE refund_attempts SET provider_refund_id = '%s' WHERE id = '%s'", re,
             refund);
    sql(q);
}

/* A refund's event: `status` of refund `re` (metadata refund_id `refund`
 * unless NULL) of 300 EUR under pi_ok. */
static struct webhook_event refund_event(const char *event_id, const char *type,
                                         const char *refund, const char *re,
                                         const char *status)
{
    struct webhook_event ev;
    memset(&ev, 0, sizeof(ev));
    snprintf(ev.id, sizeof(ev.id), "%s", event_id);
    snprintf(ev.type, sizeof(ev.type), "%s", type);
    ev.created = (int64_t)time(NULL);
    ev.evidence = WEBHOOK_EVIDENCE_REFUND;
    snprintf(ev.intent_id, sizeof(ev.intent_id), "pi_ok");
    ev.nrefunds = 1;
    struct webhook_refund *r = &ev.refunds[0];
    snprintf(r->id, sizeof(r->id), "%s", re);
    snprintf(r->status, sizeof(r->status), "%s", status);
    r->amount = 300;
    snprintf(r->currency, sizeof(r->currency), "EUR");
    snprintf(r->payment_intent, sizeof(r->payment_intent), "pi_ok");
    snprintf(r->refund_id, sizeof(r->refund_id), "%s", refund ? refund : "");
    return ev;
}

/* status provider_refund_id transitions events, of a refund. */
static char *refund_state(const char *refund)
{
    char q[1024];
    snprintf(q, sizeof(q),
             "SELECT status || ' ' || coalesce(provider_refund_id, '-') || ' ' ||"
             " (SELECT count(*) FROM refund_transitions t WHERE t.refund_id = r.id)"
             " || ' ' || (SELECT count(*) FROM outbox o WHERE o.refund_id = r.id)"
             " FROM refund_attempts r WHERE id = '%s'",
             refund);
    return value(q);
}

/* refund_reserved refunded_amount refund-ledger-rows, of an attempt. */
static char *charge_money(const char *attempt)
{
    char q[512];
    snprintf(q, sizeof(q),
             "SELECT refund_reserved || ' ' || refunded_amount || ' ' ||"
             " (SELECT count(*) FROM ledger_entries l WHERE l.payment_attempt_id = p.id"
             "  AND l.kind = 'refund') FROM payment_attempts p WHERE id = '%s'",
             attempt);
    return value(q);
}

static const char *apply_refund(webhook_store_t *st, struct webhook_event *ev)
{
    static struct webhook_store_result res;
    ck_assert_msg(webhook_store_apply(st, PROVIDER, ev, "{}", &res, &err) == CHARGED_OK,
                  "%s", err.message);
    return res.outcome;
}

/* A refund's status query as the api reads it: the refund operation's
 * own (op.h, struct op_status). */
static enum charged_rc refund_view(webhook_store_t *st, const char *id, json_t **doc,
                                   struct charged_error *err)
{
    const struct op_status *v = NULL;
    for (size_t k = 0; k < payment_operations_count && !v; k++)
        if (!strcmp(payment_op_of(k)->name, "refund"))
            v = payment_op_of(k)->status;
    ck_assert_ptr_nonnull(v);
    return webhook_store_one(st, v->sql, id, v->fields, v->nfields, doc, err);
}

START_TEST(refund_events_move_a_refund_once)
{
    char id[37];
    const char *r1 = "20000000-0000-4000-8000-000000000001";
    const char *r2 = "20000000-0000-4000-8000-000000000002";
    processing_attempt(id);
    webhook_store_t *st = store();
    own_intent(id, "pi_ok");
    struct webhook_event paid =
        event("evt_paid", WEBHOOK_EVIDENCE_SUCCEEDED, id, "pi_ok");
    ck_assert_str_eq(apply_refund(st, &paid), "applied");
    refund_row(id, r1, 300, "PROCESSING");
    own_refund(r1, "re_1");

    /* Pending for a PROCESSING refund: nothing to change. */
    struct webhook_event ev =
        refund_event("evt_r_pending", "refund.created", r1, "re_1", "pending");
    ck_assert_str_eq(apply_refund(st, &ev), "ignored");
    ck_assert_str_eq(refund_state(r1), "PROCESSING re_1 0 0");

    ev = refund_event("evt_r_ok", "refund.updated", r1, "re_1", "succeeded");
    ck_assert_str_eq(apply_refund(st, &ev), "applied");
    ck_assert_str_eq(refund_state(r1), "SUCCEEDED re_1 1 1");
    ck_assert_str_eq(charge_money(id), "300 300 1");
    ck_assert_str_eq(recorded("evt_r_ok"), "applied");
    ck_assert_str_eq(apply_refund(st, &ev), "duplicate");

    /* The same success under a new event id, found by the provider's id;
     * then the pending delivered late: one transition, one event. */
    ev = refund_event("evt_r_ok_again", "refund.updated", NULL, "re_1", "succeeded");
    ck_assert_str_eq(apply_refund(st, &ev), "ignored");
    ev = refund_event("evt_r_pending_late", "refund.updated", r1, "re_1", "pending");
    ck_assert_str_eq(apply_refund(st, &ev), "ignored");
    ck_assert_str_eq(refund_state(r1), "SUCCEEDED re_1 1 1");

    /* The provider fails a SUCCEEDED refund: for a person, never applied. */
    ev = refund_event("evt_r_failed", "refund.failed", r1, "re_1", "failed");
    ck_assert_str_eq(apply_refund(st, &ev), "needs_review");
    ck_assert_str_eq(recorded("evt_r_failed"), "needs_review");
    ck_assert_str_eq(refund_state(r1), "SUCCEEDED re_1 1 1");
    ck_assert_str_eq(charge_money(id), "300 300 1");

    /* A refund we do not know: stored for review. */
    ev = refund_event("evt_r_stray", "refund.updated", NULL, "re_stray", "succeeded");
    ck_assert_str_eq(apply_refund(st, &ev), "unmatched");
    ck_assert_str_eq(recorded("evt_r_stray"), "unmatched");

    /* charge.refunded lists both: the UNKNOWN one fails (its reservation
     * comes back), the succeeded one is already so. */
    refund_row(id, r2, 200, "UNKNOWN");
    own_refund(r2, "re_2");
    ck_assert_str_eq(charge_money(id), "500 300 1");
    ev = refund_event("evt_ch_refunded", "charge.refunded", r1, "re_1", "succeeded");
    ev.nrefunds = 2;
    struct webhook_refund *b = &ev.refunds[1];
    *b = ev.refunds[0];
    snprintf(b->id, sizeof(b->id), "re_2");
    snprintf(b->status, sizeof(b->status), "failed");
    snprintf(b->refund_id, sizeof(b->refund_id), "%s", r2);
    snprintf(b->failure_reason, sizeof(b->failure_reason), "lost_or_stolen_card");
    b->amount = 200;
    ck_assert_str_eq(apply_refund(st, &ev), "applied");
    ck_assert_str_eq(refund_state(r2), "FAILED re_2 1 1");
    ck_assert_str_eq(charge_money(id), "300 300 1");
    char q[256];
    snprintf(q, sizeof(q), "SELECT reason FROM refund_attempts WHERE id = '%s'", r2);
    ck_assert_str_eq(value(q), "refund failed: lost_or_stolen_card");

    json_t *doc = NULL;
    ck_assert_int_eq(refund_view(st, r1, &doc, &err), CHARGED_OK);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "status")), "SUCCEEDED");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "provider_refund_id")),
                     "re_1");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "payment_attempt_id")), id);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "refund_reason")),
                     "requested_by_customer");
    ck_assert(json_is_null(json_object_get(doc, "reason")));
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "amount")), 300);
    json_decref(doc);
    ck_assert_int_eq(webhook_store_attempt(st, id, &doc, &err), CHARGED_OK);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "refunded_amount")), 300);
    json_decref(doc);
    ck_assert_int_eq(
        refund_view(st, "00000000-0000-4000-8000-999999999999", &doc, &err),
        CHARGED_NOT_FOUND);
    ck_assert_ptr_null(doc);
    webhook_store_free(st);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("webhook_store");
    TCase *tc = tcase_create("webhook_store");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, an_event_settles_its_attempt_once);
    tcase_add_test(tc, status_views);
    tcase_add_test(tc, a_session_ended_by_the_server_is_replaced);
    tcase_add_test(tc, refusals_are_classified_with_their_sqlstate);
    tcase_add_test(tc, an_attempt_held_by_another_session_is_locked);
    tcase_add_test(tc, an_unreachable_database_is_retry);
    tcase_add_test(tc, refund_events_move_a_refund_once);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
