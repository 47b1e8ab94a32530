/* The provider client's authorize, capture and void against a real psp-sim
 * (manual capture, docs/provider.md): an authorization is AUTHORIZED with
 * what it holds; a capture, all or part, is SUCCEEDED with what it took and
 * replays under its key; a void is SUCCEEDED canceled; what the intent's
 * state refuses (captured, voided, expired, beyond what it holds) is
 * INVALID with the state; a lost answer is UNKNOWN and the look-up shows
 * what executed; nothing sent is NOT_EXECUTED. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "provider_client.h"
#include "psp_sim_process.h"
#include "test_env.h"

#define ORDER "0b6f1a52-8f5e-4c36-9a39-0f4a7f5a0037"

static struct psp_sim_process sim;
static provider_client_t *pc;
static struct charged_error err;

static void setup(void)
{
    psp_sim_start(&sim, NULL);
    pc = provider_client_new(sim.base_url, PSP_SIM_TEST_KEY, "2024-06-20", 1000, &err);
    ck_assert_msg(pc != NULL, "%s", err.message);
}

static void teardown(void)
{
    provider_client_free(pc);
    pc = NULL;
    psp_sim_stop(&sim);
}

static void set_faults(const char *json)
{
    json_decref(psp_sim_admin(&sim, "PUT", "/faults", json));
}

/* A charge of `amount` under `key` (also its attempt), blocking. */
static struct provider_result pay(const char *key, long long amount, const char *pm,
                                  enum provider_capture_method how)
{
    struct provider_result r;
    struct provider_charge c = {.idempotency_key = key,
                                .amount = amount,
                                .currency = "EUR",
                                .payment_method = pm,
                                .payment_attempt_id = key,
                                .order_id = ORDER,
                                .capture_method = how};
    provider_client_charge(pc, &c, &r);
    ck_assert_ptr_null(strstr(r.error, PSP_SIM_TEST_KEY));
    return r;
}

static struct provider_result authorize(const char *key, long long amount)
{
    return pay(key, amount, "pm_card_visa", PROVIDER_CAPTURE_MANUAL);
}

/* The one transfer started on c, driven to its end within 10 s; the
 * opaque comes back. */
static struct provider_result finish(provider_client_t *c, void *marker)
{
    struct provider_result r;
    void *op = NULL;
    ck_assert_uint_eq(provider_client_in_flight(c), 1);
    long long deadline = test_env_now_ms() + 10000;
    while (!provider_client_next_done(c, &r, &op)) {
        ck_assert_msg(test_env_now_ms() < deadline, "the post never finished");
        provider_client_perform(c, 100);
    }
    ck_assert_ptr_eq(op, marker);
    ck_assert_uint_eq(provider_client_in_flight(c), 0);
    ck_assert_ptr_null(strstr(r.error, PSP_SIM_TEST_KEY));
    return r;
}

static struct provider_result capture_on(provider_client_t *c, const char *key,
                                         const char *pi, long long amount,
                                         const char *attempt)
{
    int marker = 0;
    const struct provider_capture cap = {.idempotency_key = key,
                                         .payment_intent = pi,
                                         .amount = amount,
                                         .payment_attempt_id = attempt};
    ck_assert_int_eq(provider_client_start_capture(c, &cap, &marker, &err), CHARGED_OK);
    return finish(c, &marker);
}

static struct provider_result capture(const char *key, const char *pi, long long amount,
                                      const char *attempt)
{
    return capture_on(pc, key, pi, amount, attempt);
}

static struct provider_result void_on(provider_client_t *c, const char *key,
                                      const char *pi, const char *reason)
{
    int marker = 0;
    const struct provider_void v = {
        .idempotency_key = key, .payment_intent = pi, .reason = reason};
    ck_assert_int_eq(provider_client_start_void(c, &v, &marker, &err), CHARGED_OK);
    return finish(c, &marker);
}

static struct provider_result void_(const char *key, const char *pi, const char *reason)
{
    return void_on(pc, key, pi, reason);
}

static struct provider_result retrieve(const char *pi)
{
    struct provider_result r;
    provider_client_retrieve(pc, pi, &r);
    return r;
}

/* How many rows the ledger's `what` holds. */
static size_t ledger_rows(const char *what)
{
    json_t *l = psp_sim_admin(&sim, "GET", "/ledger", NULL);
    size_t n = json_array_size(json_object_get(l, what));
    json_decref(l);
    return n;
}

/* A client of its own: over a pooled connection curl would itself send a
 * request whose answer was dropped again (resent). */
static provider_client_t *fresh_client(void)
{
    provider_client_t *c =
        provider_client_new(sim.base_url, PSP_SIM_TEST_KEY, NULL, 1000, &err);
    ck_assert_ptr_nonnull(c);
    return c;
}

START_TEST(an_authorization_holds_and_a_charge_does_not)
{
    struct provider_result a = authorize("pcc-auth", 1500);
    ck_assert_int_eq(a.outcome, PROVIDER_AUTHORIZED);
    ck_assert_int_eq(a.http_status, 200);
    ck_assert(!strncmp(a.provider_payment_id, "pi_", 3));
    ck_assert_str_eq(a.intent_status, "requires_capture");
    ck_assert_str_eq(a.capture_method, "manual");
    ck_assert_int_eq(a.amount, 1500);
    ck_assert_int_eq(a.amount_capturable, 1500);
    ck_assert_int_eq(a.amount_received, 0);
    ck_assert_str_eq(a.cancellation_reason, "");
    struct provider_result again = authorize("pcc-auth", 1500);
    ck_assert_int_eq(again.outcome, PROVIDER_AUTHORIZED);
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_str_eq(again.provider_payment_id, a.provider_payment_id);
    ck_assert_uint_eq(psp_sim_charges_for_key(&sim, "pcc-auth"), 1);

    /* The look-ups say so too, with the evidence a reconciler settles on. */
    struct provider_result look = retrieve(a.provider_payment_id);
    ck_assert_int_eq(look.outcome, PROVIDER_AUTHORIZED);
    ck_assert_str_eq(look.capture_method, "manual");
    ck_assert_int_eq(look.amount_capturable, 1500);
    ck_assert_int_eq(look.amount_received, 0);
    struct provider_result found;
    provider_client_list(pc, "pcc-auth", 0, 4102444800LL, NULL, &found);
    ck_assert_int_eq(found.outcome, PROVIDER_AUTHORIZED);
    ck_assert_int_eq(found.matches, 1);
    ck_assert_int_eq(found.amount_capturable, 1500);

    /* An automatic charge is what it was: succeeded, all received. */
    struct provider_result c = pay("pcc-charge", 700, "pm_card_visa", 0);
    ck_assert_int_eq(c.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(c.capture_method, "automatic");
    ck_assert_int_eq(c.amount_capturable, 0);
    ck_assert_int_eq(c.amount_received, 700);

    /* A declined authorization is declined. */
    struct provider_result d =
        pay("pcc-auth-decl", 100, "pm_card_chargeDeclined", PROVIDER_CAPTURE_MANUAL);
    ck_assert_int_eq(d.outcome, PROVIDER_DECLINED);
    ck_assert_str_eq(d.code, "card_declined");
}
END_TEST

START_TEST(a_capture_takes_all_once_and_replays)
{
    struct provider_result a = authorize("pcc-all", 1200);
    ck_assert_int_eq(a.outcome, PROVIDER_AUTHORIZED);
    struct provider_result c =
        capture("pcc-all-cap", a.provider_payment_id, 0, "pcc-all");
    ck_assert_int_eq(c.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(c.http_status, 200);
    ck_assert_int_eq(c.replayed, 0);
    ck_assert_int_eq(c.sent, 1);
    ck_assert_str_eq(c.provider_payment_id, a.provider_payment_id);
    ck_assert_str_eq(c.intent_status, "succeeded");
    ck_assert_int_eq(c.amount_received, 1200);
    ck_assert_int_eq(c.amount_capturable, 0);
    ck_assert_str_eq(c.intent_attempt_id, "pcc-all");

    /* The same key: the provider's replay, nothing executed again. */
    struct provider_result r =
        capture("pcc-all-cap", a.provider_payment_id, 0, "pcc-all");
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.replayed, 1);
    ck_assert_int_eq(r.amount_received, 1200);
    ck_assert_uint_eq(ledger_rows("captures"), 1);

    /* A second capture (another key): refused in the intent's state. */
    struct provider_result twice =
        capture("pcc-all-cap-2", a.provider_payment_id, 0, "pcc-all");
    ck_assert_int_eq(twice.outcome, PROVIDER_INVALID);
    ck_assert_int_eq(twice.http_status, 400);
    ck_assert_str_eq(twice.code, "payment_intent_unexpected_state");
    ck_assert_str_eq(twice.intent_status, "succeeded");
    ck_assert_int_eq(twice.amount_received, 1200);
    ck_assert_uint_eq(ledger_rows("captures"), 1);

    /* The key on another request: a review, as a charge's. */
    struct provider_result other =
        capture("pcc-all-cap", a.provider_payment_id, 5, "pcc-all");
    ck_assert_int_eq(other.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(other.http_status, 400);
}
END_TEST

START_TEST(a_partial_capture_releases_the_rest)
{
    struct provider_result a = authorize("pcc-part", 1000);
    struct provider_result c =
        capture("pcc-part-cap", a.provider_payment_id, 600, "pcc-part");
    ck_assert_int_eq(c.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(c.amount_received, 600);
    ck_assert_int_eq(c.amount_capturable, 0);
    ck_assert_int_eq(c.amount, 1000);
    struct provider_result look = retrieve(a.provider_payment_id);
    ck_assert_int_eq(look.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(look.amount_received, 600);

    /* More than it holds: amount_too_large, INVALID, nothing executed. */
    struct provider_result b = authorize("pcc-big", 500);
    struct provider_result big =
        capture("pcc-big-cap", b.provider_payment_id, 900, NULL);
    ck_assert_int_eq(big.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(big.code, "amount_too_large");
    ck_assert_str_eq(big.param, "amount_to_capture");
    ck_assert_str_eq(big.intent_status, "requires_capture");
    ck_assert_int_eq(big.amount_capturable, 500);
    ck_assert_uint_eq(ledger_rows("captures"), 1);
}
END_TEST

START_TEST(a_void_releases_and_a_capture_after_it_is_refused)
{
    struct provider_result a = authorize("pcc-void", 800);
    struct provider_result v =
        void_("pcc-void-v", a.provider_payment_id, "requested_by_customer");
    ck_assert_int_eq(v.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(v.intent_status, "canceled");
    ck_assert_str_eq(v.cancellation_reason, "requested_by_customer");
    ck_assert_int_eq(v.amount_capturable, 0);
    ck_assert_int_eq(v.amount_received, 0);
    struct provider_result again =
        void_("pcc-void-v", a.provider_payment_id, "requested_by_customer");
    ck_assert_int_eq(again.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_uint_eq(ledger_rows("cancels"), 1);

    struct provider_result c = capture("pcc-void-c", a.provider_payment_id, 0, NULL);
    ck_assert_int_eq(c.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(c.code, "payment_intent_unexpected_state");
    ck_assert_str_eq(c.intent_status, "canceled");
    ck_assert_str_eq(c.cancellation_reason, "requested_by_customer");
    ck_assert_uint_eq(ledger_rows("captures"), 0);

    /* A void after a capture is refused with the captured state. */
    struct provider_result b = authorize("pcc-void-late", 300);
    capture("pcc-void-late-c", b.provider_payment_id, 0, NULL);
    struct provider_result late = void_("pcc-void-late-v", b.provider_payment_id, NULL);
    ck_assert_int_eq(late.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(late.intent_status, "succeeded");
    ck_assert_int_eq(late.amount_received, 300);
}
END_TEST

/* A void of any intent the provider will cancel (a processing charge's):
 * replayed under its key; refused when the intent cannot be canceled or
 * does not exist; the key on another request a review; a lost answer
 * UNKNOWN, its retry the original; nothing sent NOT_EXECUTED. */
START_TEST(a_void_is_classified_as_a_charge_where_it_is_no_success)
{
    struct provider_result proc = pay("pcc-v-proc", 500, "pm_card_processing", 0);
    ck_assert_int_eq(proc.outcome, PROVIDER_PROCESSING);
    struct provider_result r = void_("pcc-v", proc.provider_payment_id, "abandoned");
    ck_assert_int_eq(r.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(r.sent, 1);
    ck_assert_str_eq(r.cancellation_reason, "abandoned");
    ck_assert_int_eq(r.amount, 500);
    ck_assert_str_eq(r.code, "");

    struct provider_result twice = void_("pcc-v-2", proc.provider_payment_id, NULL);
    ck_assert_int_eq(twice.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(twice.intent_status, "canceled");

    /* No such intent: the provider's own 404, final; its message masked. */
    struct provider_result m = void_("pcc-v-missing", "pi_nope", NULL);
    ck_assert_int_eq(m.outcome, PROVIDER_INVALID);
    ck_assert_int_eq(m.http_status, 404);
    ck_assert_str_eq(m.code, "resource_missing");
    ck_assert_str_eq(m.error, "No such payment_intent: '***'");

    /* A charge's key on a void: idempotency_error, a review. */
    struct provider_result open = pay("pcc-v-open", 100, "pm_card_processing", 0);
    struct provider_result k = void_("pcc-v-open", open.provider_payment_id, NULL);
    ck_assert_int_eq(k.outcome, PROVIDER_REQUIRES_REVIEW);
    ck_assert_int_eq(k.http_status, 400);

    /* The answer lost after the void executed: UNKNOWN, and the retry with
     * the key answers what it did. */
    provider_client_t *fresh = fresh_client();
    set_faults(
        "{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"pcc-v-drop\",\"times\":1}]}");
    struct provider_result lost =
        void_on(fresh, "pcc-v-drop", open.provider_payment_id, NULL);
    ck_assert_int_eq(lost.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(lost.sent, 1);
    ck_assert_int_eq(lost.resent, 0);
    ck_assert_int_eq(lost.http_status, 0);
    struct provider_result found =
        void_on(fresh, "pcc-v-drop", open.provider_payment_id, NULL);
    ck_assert_int_eq(found.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(found.replayed, 1);
    ck_assert_uint_eq(ledger_rows("cancels"), 2);
    provider_client_free(fresh);
}
END_TEST

START_TEST(what_cannot_be_sent_is_not_started_and_a_dead_provider_not_executed)
{
    int marker = 0;
    struct provider_capture c = {.idempotency_key = "k", .payment_intent = "pi_x"};
    struct provider_void v = {.idempotency_key = "k", .payment_intent = "pi_x"};
    c.payment_intent = v.payment_intent = "pi x";
    ck_assert_int_eq(provider_client_start_capture(pc, &c, NULL, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(provider_client_start_void(pc, &v, NULL, &err), CHARGED_BAD_ITEM);
    c.payment_intent = v.payment_intent = NULL;
    ck_assert_int_eq(provider_client_start_capture(pc, &c, NULL, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(provider_client_start_void(pc, &v, NULL, &err), CHARGED_BAD_ITEM);
    c.payment_intent = v.payment_intent = "pi_x";
    c.idempotency_key = v.idempotency_key = NULL;
    ck_assert_int_eq(provider_client_start_capture(pc, &c, NULL, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(provider_client_start_void(pc, &v, NULL, &err), CHARGED_BAD_ITEM);
    c.idempotency_key = v.idempotency_key = "k\r\nX: y";
    ck_assert_int_eq(provider_client_start_capture(pc, &c, NULL, &err),
                     CHARGED_BAD_ITEM);
    ck_assert_int_eq(provider_client_start_void(pc, &v, NULL, &err), CHARGED_BAD_ITEM);
    ck_assert_uint_eq(provider_client_in_flight(pc), 0);

    /* Nothing reached a provider that is not there: NOT_EXECUTED. */
    char url[64];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d", psp_sim_free_port());
    provider_client_t *dead =
        provider_client_new(url, PSP_SIM_TEST_KEY, NULL, 1000, &err);
    c.idempotency_key = "pcc-dead-c";
    ck_assert_int_eq(provider_client_start_capture(dead, &c, &marker, &err),
                     CHARGED_OK);
    struct provider_result rc = finish(dead, &marker);
    ck_assert_int_eq(rc.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(rc.sent, 0);
    struct provider_result rv = void_on(dead, "pcc-dead-v", "pi_x", NULL);
    ck_assert_int_eq(rv.outcome, PROVIDER_NOT_EXECUTED);
    ck_assert_int_eq(rv.sent, 0);
    provider_client_free(dead);
}
END_TEST

/* A capture whose answer is lost executed: UNKNOWN, never FAILED; the
 * look-up shows it captured, and the retry under its key is the replay. */
START_TEST(a_lost_capture_answer_is_unknown_and_the_intent_shows_it)
{
    struct provider_result a = authorize("pcc-drop", 900);
    provider_client_t *fresh = fresh_client();
    set_faults(
        "{\"rules\":[{\"kind\":\"drop_after\",\"key\":\"pcc-drop-c\",\"times\":1}]}");
    struct provider_result lost =
        capture_on(fresh, "pcc-drop-c", a.provider_payment_id, 400, "pcc-drop");
    ck_assert_int_eq(lost.outcome, PROVIDER_UNKNOWN);
    ck_assert_int_eq(lost.sent, 1);
    ck_assert_int_eq(lost.http_status, 0);
    ck_assert_uint_eq(ledger_rows("captures"), 1);

    struct provider_result look = retrieve(a.provider_payment_id);
    ck_assert_int_eq(look.outcome, PROVIDER_SUCCEEDED);
    ck_assert_str_eq(look.intent_status, "succeeded");
    ck_assert_int_eq(look.amount_received, 400);
    ck_assert_int_eq(look.amount_capturable, 0);

    struct provider_result again =
        capture_on(fresh, "pcc-drop-c", a.provider_payment_id, 400, "pcc-drop");
    ck_assert_int_eq(again.outcome, PROVIDER_SUCCEEDED);
    ck_assert_int_eq(again.replayed, 1);
    ck_assert_int_eq(again.amount_received, 400);
    ck_assert_uint_eq(ledger_rows("captures"), 1);
    provider_client_free(fresh);
}
END_TEST

/* An authorization left alone lapses: the provider cancels it
 * (cancellation_reason automatic), and a capture is refused with that. */
START_TEST(a_capture_after_expiry_is_refused_as_expired)
{
    json_t *ok = psp_sim_admin(&sim, "PUT", "/authorization-expiry",
                               "{\"authorization_expiry_ms\":200}");
    ck_assert(json_is_true(json_object_get(ok, "ok")));
    json_decref(ok);
    struct provider_result a = authorize("pcc-exp", 1000);
    ck_assert_int_eq(a.outcome, PROVIDER_AUTHORIZED);
    struct provider_result look;
    long long deadline = test_env_deadline(10000);
    do {
        ck_assert_msg(test_env_now_ms() < deadline, "the authorization never expired");
        nanosleep(&(struct timespec){.tv_nsec = 50 * 1000 * 1000}, NULL);
        look = retrieve(a.provider_payment_id);
    } while (strcmp(look.intent_status, "canceled") != 0);
    ck_assert_int_eq(look.outcome, PROVIDER_DECLINED);
    ck_assert_str_eq(look.cancellation_reason, "automatic");
    ck_assert_int_eq(look.amount_capturable, 0);

    struct provider_result c =
        capture("pcc-exp-c", a.provider_payment_id, 0, "pcc-exp");
    ck_assert_int_eq(c.outcome, PROVIDER_INVALID);
    ck_assert_str_eq(c.code, "payment_intent_unexpected_state");
    ck_assert_str_eq(c.intent_status, "canceled");
    ck_assert_str_eq(c.cancellation_reason, "automatic");
    ck_assert_str_eq(c.capture_method, "manual");
    ck_assert_uint_eq(ledger_rows("captures"), 0);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("provider_client_capture");
    TCase *tc = tcase_create("capture");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, an_authorization_holds_and_a_charge_does_not);
    tcase_add_test(tc, a_capture_takes_all_once_and_replays);
    tcase_add_test(tc, a_partial_capture_releases_the_rest);
    tcase_add_test(tc, a_void_releases_and_a_capture_after_it_is_refused);
    tcase_add_test(tc, a_void_is_classified_as_a_charge_where_it_is_no_success);
    tcase_add_test(tc,
                   what_cannot_be_sent_is_not_started_and_a_dead_provider_not_executed);
    tcase_add_test(tc, a_lost_capture_answer_is_unknown_and_the_intent_shows_it);
    tcase_add_test(tc, a_capture_after_expiry_is_refused_as_expired);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return test_env_run_suite(suite());
}
