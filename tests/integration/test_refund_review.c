/* worker/operations/refund/refund_review against the stack's PostgreSQL: an operator's
 * decision on a refund, as `chargectl refund resolve` takes it once the
 * provider has answered (the decision carries the provider's refund as the
 * provider showed it). A SUCCEEDED decision books only a refund proven the
 * refund's own: one that only names it is refused unless forced (issue 34).
 * Either decision waits, unless forced, while a call under the refund's key
 * may still execute (a live lease, a young key), the key's age on the
 * database's clock whatever a host's clock wrote as a call's started_at. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libpq-fe.h>

#include "refund_review.h"
#include "test_env.h"

/* WORKER_KEY_RETENTION_MS's default: how long after the last call under a
 * key the provider may still execute it. */
#define KEY_KEPT_MS 86400000LL

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

static char q[512];

/* A SUCCEEDED charge of 1000 as intent pi_<its id>; its id in out. */
static void charge(char out[37], char pi[64])
{
    char order[37], key[64];
    test_env_uuid(out);
    test_env_uuid(order);
    snprintf(key, sizeof(key), "charge:%s", out);
    snprintf(pi, 64, "pi_%.8s", out);
    const char *p[] = {out, order, key, pi};
    test_env_sql(admin,
                 "INSERT INTO payment_attempts (id, order_id, idempotency_key,"
                 " request_fingerprint, amount, currency, payment_method, status,"
                 " provider_payment_id, first_sent_at) VALUES ($1, $2, $3, 'fp', 1000,"
                 " 'EUR', 'pm_card_visa', 'SUCCEEDED', $4, now() - interval '3 days')",
                 4, p);
}

/* A refund of 300 of the charge, in `status`, reserved on it as a worker
 * leaves one, first sent `sent_ago` (an interval) ago, with the provider
 * refund id `recorded` (NULL: none); its id in out. */
static void refund(const char *attempt, const char *pi, const char *status,
                   const char *recorded, const char *sent_ago, char out[37])
{
    char key[64];
    test_env_uuid(out);
    snprintf(key, sizeof(key), "refund:%s", out);
    const char *p[] = {out, attempt, key, status, pi, recorded, sent_ago};
    test_env_sql(admin,
                 "UPDATE payment_attempts SET refund_reserved = refund_reserved + 300"
                 " WHERE id = $1::uuid",
                 1, (const char *const[]){attempt});
    test_env_sql(
        admin,
        "INSERT INTO refund_attempts (id, payment_attempt_id, order_id,"
        " idempotency_key, request_fingerprint, amount, currency, refund_reason,"
        " status, payment_intent, provider_refund_id, reserved, first_sent_at)"
        " SELECT $1, $2, p.order_id, $3, 'fp', 300, 'EUR',"
        " 'requested_by_customer', $4, $5, $6, true, now() - $7::interval"
        " FROM payment_attempts p WHERE p.id = $2::uuid",
        7, p);
}

/* The refund's call under its key as its writer records it: started_at
 * from the calling host's clock (`started`, relative to the database's
 * now()), recorded_at the database's own (`recorded`; NULL: now(), the
 * column's default), the answer `answered` (NULL: none came). */
static void call(const char *refund_id, const char *attempt, const char *started,
                 const char *recorded, const char *answered)
{
    const char *p[] = {refund_id, attempt, started, answered, recorded};
    test_env_sql(admin,
                 "INSERT INTO provider_calls (refund_id, payment_attempt_id, operation,"
                 " started_at, latency_ms, outcome, provider_payment_id, recorded_at)"
                 " VALUES ($1::uuid, $2::uuid, 'refund', now() + $3::interval, 100,"
                 " CASE WHEN $4::text IS NULL THEN 'unknown' ELSE 'succeeded' END, $4,"
                 " CASE WHEN $5::text IS NULL THEN now()"
                 "      ELSE now() + $5::interval END)",
                 5, p);
}

static const char *status_of(const char *refund_id)
{
    snprintf(q, sizeof(q),
             "SELECT status || ':' || coalesce(provider_refund_id, '-')"
             " FROM refund_attempts WHERE id = '%s'",
             refund_id);
    return test_env_value(admin, q);
}

/* The provider's refund `re` on intent `pi`, its metadata naming refund
 * `refund_meta` and attempt `attempt_meta`, as the decision of refund `id`
 * from `expected` to `status` (re NULL for FAILED). why: the outcome's line. */
static enum refund_review_outcome decide(const char *id, enum attempt_status expected,
                                         enum attempt_status status, const char *re,
                                         const char *pi, const char *refund_meta,
                                         const char *attempt_meta, int force, char *why,
                                         size_t why_size)
{
    PGconn *conn = test_env_connect(url);
    struct refund_review_decision d = {
        .refund_id = id,
        .expected = expected,
        .status = status,
        .actor = "erin",
        .reason = "seen at the provider's dashboard",
        .provider_refund_id = re,
        .evidence_json = "{}",
        .object_payment_intent = pi,
        .object_refund_meta = refund_meta,
        .object_attempt_meta = attempt_meta,
        .key_kept_ms = KEY_KEPT_MS,
        .force = force,
    };
    enum refund_review_outcome o;
    struct charged_error err;
    ck_assert_msg(refund_review_resolve(conn, &d, &o, why, why_size, &err) ==
                      CHARGED_OK,
                  "%s", err.message);
    ck_assert_int_eq(PQtransactionStatus(conn), PQTRANS_IDLE);
    PQfinish(conn);
    return o;
}

static enum refund_review_outcome failed(const char *id, enum attempt_status expected)
{
    char why[256];
    return decide(id, expected, ATTEMPT_STATUS_FAILED, NULL, NULL, NULL, NULL, 0, why,
                  sizeof(why));
}

/* Refund R's own call under its key executed, its answer lost: R is
 * UNKNOWN, nothing recorded. Another client's refund on the same intent
 * names R and its charge. It is not proven R's: refused unless forced, and
 * nothing written; the answer to R's own call is R's without force. */
START_TEST(a_refund_that_only_names_it_is_booked_only_forced)
{
    char a[37], pi[64], r[37], why[256];
    charge(a, pi);
    refund(a, pi, "UNKNOWN", NULL, "2 days", r);
    enum refund_review_outcome o =
        decide(r, ATTEMPT_STATUS_UNKNOWN, ATTEMPT_STATUS_SUCCEEDED, "re_other", pi, r,
               a, 0, why, sizeof(why));
    ck_assert_int_eq(o, REFUND_REVIEW_UNPROVEN);
    ck_assert_msg(strstr(why, "re_other is not proven") && strstr(why, "only names") &&
                      !strchr(why, '\n'),
                  "%s", why);
    ck_assert_str_eq(status_of(r), "UNKNOWN:-");

    /* Forced: the operator's word, booked. */
    o = decide(r, ATTEMPT_STATUS_UNKNOWN, ATTEMPT_STATUS_SUCCEEDED, "re_other", pi, r,
               a, 1, why, sizeof(why));
    ck_assert_int_eq(o, REFUND_REVIEW_RESOLVED);
    ck_assert_str_eq(status_of(r), "SUCCEEDED:re_other");

    /* The answer to R2's own call under its key (recorded two days ago):
     * R2's whatever its metadata says, booked without force. */
    char r2[37];
    refund(a, pi, "UNKNOWN", NULL, "2 days", r2);
    call(r2, a, "-2 days", "-2 days", "re_own");
    o = decide(r2, ATTEMPT_STATUS_UNKNOWN, ATTEMPT_STATUS_SUCCEEDED, "re_own", pi, r2,
               a, 0, why, sizeof(why));
    ck_assert_msg(o == REFUND_REVIEW_RESOLVED, "%d: %s", o, why);
    ck_assert_str_eq(status_of(r2), "SUCCEEDED:re_own");
}
END_TEST

/* SUCCEEDED, with the refund proven R's (its recorded id), waits as FAILED
 * does while a call under R's key may still execute: its key young, then
 * its lease live; force overrides both. */
START_TEST(succeeded_waits_while_a_call_under_its_key_may_execute)
{
    char a[37], pi[64], r[37], why[256];
    charge(a, pi);
    refund(a, pi, "REQUIRES_REVIEW", "re_r", "1 minute", r);
    ck_assert_int_eq(decide(r, ATTEMPT_STATUS_REQUIRES_REVIEW, ATTEMPT_STATUS_SUCCEEDED,
                            "re_r", pi, r, a, 0, why, sizeof(why)),
                     REFUND_REVIEW_MAY_EXECUTE);
    ck_assert_int_eq(failed(r, ATTEMPT_STATUS_REQUIRES_REVIEW),
                     REFUND_REVIEW_MAY_EXECUTE);
    ck_assert_str_eq(status_of(r), "REQUIRES_REVIEW:re_r");

    /* The key is old, but the reconciler holds the refund now. */
    test_env_sql(admin,
                 "UPDATE refund_attempts SET first_sent_at = now() - interval '2 days',"
                 " lease_owner = 'reconciler-1', lease_expires_at = now() + interval"
                 " '1 minute' WHERE id = $1::uuid",
                 1, (const char *const[]){r});
    ck_assert_int_eq(decide(r, ATTEMPT_STATUS_REQUIRES_REVIEW, ATTEMPT_STATUS_SUCCEEDED,
                            "re_r", pi, r, a, 0, why, sizeof(why)),
                     REFUND_REVIEW_LEASED);
    ck_assert_int_eq(failed(r, ATTEMPT_STATUS_REQUIRES_REVIEW), REFUND_REVIEW_LEASED);
    ck_assert_str_eq(status_of(r), "REQUIRES_REVIEW:re_r");

    /* Its lease lapsed: booked. */
    test_env_sql(admin,
                 "UPDATE refund_attempts SET lease_expires_at = now() - interval"
                 " '1 second' WHERE id = $1::uuid",
                 1, (const char *const[]){r});
    ck_assert_int_eq(decide(r, ATTEMPT_STATUS_REQUIRES_REVIEW, ATTEMPT_STATUS_SUCCEEDED,
                            "re_r", pi, r, a, 0, why, sizeof(why)),
                     REFUND_REVIEW_RESOLVED);
    ck_assert_str_eq(status_of(r), "SUCCEEDED:re_r");

    /* Forced, a young key does not stop it. */
    char r2[37];
    refund(a, pi, "REQUIRES_REVIEW", "re_r2", "1 minute", r2);
    ck_assert_int_eq(decide(r2, ATTEMPT_STATUS_REQUIRES_REVIEW,
                            ATTEMPT_STATUS_SUCCEEDED, "re_r2", pi, r2, a, 1, why,
                            sizeof(why)),
                     REFUND_REVIEW_RESOLVED);
    ck_assert_str_eq(status_of(r2), "SUCCEEDED:re_r2");
}
END_TEST

/* The key's age counts from when the database recorded the last call, not
 * from the started_at its host wrote: a call just recorded keeps the key
 * young whether that host's clock ran an hour ahead (a call "in the
 * future") or two days behind; a call the database recorded two days ago
 * does not. */
START_TEST(the_key_s_age_is_on_the_database_s_clock)
{
    char a[37], pi[64], ahead[37], behind[37], old[37];
    charge(a, pi);
    refund(a, pi, "UNKNOWN", NULL, "2 days", ahead);
    call(ahead, a, "1 hour", NULL, NULL);
    ck_assert_int_eq(failed(ahead, ATTEMPT_STATUS_UNKNOWN), REFUND_REVIEW_MAY_EXECUTE);
    ck_assert_str_eq(status_of(ahead), "UNKNOWN:-");

    refund(a, pi, "UNKNOWN", NULL, "2 days", behind);
    call(behind, a, "-2 days", NULL, NULL);
    ck_assert_int_eq(failed(behind, ATTEMPT_STATUS_UNKNOWN), REFUND_REVIEW_MAY_EXECUTE);
    ck_assert_str_eq(status_of(behind), "UNKNOWN:-");

    refund(a, pi, "UNKNOWN", NULL, "2 days", old);
    call(old, a, "1 hour", "-2 days", NULL);
    ck_assert_int_eq(failed(old, ATTEMPT_STATUS_UNKNOWN), REFUND_REVIEW_RESOLVED);
    ck_assert_str_eq(status_of(old), "FAILED:-");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("refund_review");
    TCase *tc = tcase_create("review");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_refund_that_only_names_it_is_booked_only_forced);
    tcase_add_test(tc, succeeded_waits_while_a_call_under_its_key_may_execute);
    tcase_add_test(tc, the_key_s_age_is_on_the_database_s_clock);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
