/* Unit tests of common/core/webhook_event: the event's shape is checked, and the
 * decision table does what docs/api.md promises, row by row. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "test_env.h"
#include "stripe.h"
#include "webhook_attempts.h"
#include "webhook_event.h"

#define ATT "6960b56e-87d0-4fdf-8c2c-5b56b0e1f2cf"

static enum charged_rc parse(const char *body, struct webhook_event *ev,
                             struct charged_error *err)
{
    return stripe_webhook_parse(body, strlen(body), ev, NULL, err);
}

START_TEST(parses_a_success)
{
    struct webhook_event ev;
    struct charged_error err;
    const char *body =
        "{\"id\":\"evt_123\",\"object\":\"event\",\"type\":\"payment_intent."
        "succeeded\","
        "\"created\":1700000000,\"data\":{\"object\":{\"id\":\"pi_9\",\"object\":"
        "\"payment_intent\",\"status\":\"succeeded\",\"amount\":1999,\"currency\":"
        "\"eur\","
        "\"metadata\":{\"payment_attempt_id\":\"6960B56E-87D0-4FDF-8C2C-5B56B0E1F2CF\"}"
        "}}}";
    ck_assert_int_eq(parse(body, &ev, &err), 0);
    ck_assert_str_eq(ev.id, "evt_123");
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_SUCCEEDED);
    ck_assert_int_eq(ev.created, 1700000000);
    ck_assert_str_eq(ev.intent_id, "pi_9");
    ck_assert_int_eq(ev.amount, 1999);
    ck_assert_str_eq(ev.currency, "EUR");
    ck_assert_str_eq(ev.attempt_id, ATT); /* canonical, lower case */
}
END_TEST

START_TEST(parses_a_failure_with_its_code)
{
    struct webhook_event ev;
    struct charged_error err;
    const char *body =
        "{\"id\":\"evt_f\",\"type\":\"payment_intent.payment_failed\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_f\",\"status\":\"requires_payment_method\","
        "\"last_payment_error\":{\"code\":\"card_declined\",\"decline_code\":"
        "\"insufficient_funds\"},\"metadata\":{\"payment_attempt_id\":\"not-a-uuid\"}}}"
        "}";
    ck_assert_int_eq(parse(body, &ev, &err), 0);
    ck_assert_int_eq(ev.evidence, WEBHOOK_EVIDENCE_FAILED);
    ck_assert_str_eq(ev.decline_code, "insufficient_funds");
    ck_assert_str_eq(ev.attempt_id, ""); /* not a uuid: matched by intent */
    ck_assert_int_eq(ev.amount, -1);
}
END_TEST

/* Found by fuzz_webhook_event: an amount of card digits, masked in the
 * stored copy's text, made it no JSON. It is stored as a masked string. */
START_TEST(a_card_shaped_number_is_stored_masked_as_a_string)
{
    struct webhook_event ev;
    struct charged_error err;
    char *normalized = NULL;
    const char *body =
        "{\"id\":\"evt_1\",\"type\":\"refund.failed\",\"created\":1,\"data\":{"
        "\"object\":{\"id\":\"re_1\",\"object\":\"refund\",\"status\":\"failed\","
        "\"amount\":58888888888888800,\"currency\":\"eur\",\"x\":[4242424242424242]}}"
        "}";
    ck_assert_int_eq(stripe_webhook_parse(body, strlen(body), &ev, &normalized, &err),
                     0);
    json_error_t jerr;
    json_t *again = json_loads(normalized, 0, &jerr);
    ck_assert_msg(again != NULL, "not JSON: %s", normalized);
    json_t *o = json_object_get(json_object_get(again, "data"), "object");
    ck_assert_str_eq(json_string_value(json_object_get(o, "amount")),
                     "*************8800");
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(o, "x"), 0)),
                     "************4242");
    json_decref(again);
    free(normalized);
}
END_TEST

START_TEST(refuses_bad_shapes)
{
    struct webhook_event ev;
    struct charged_error err;
    const char *bad[] = {
        "",
        "null",
        "[1]",
        "{\"id\":\"evt_1\"}",
        "{\"id\":\"evt 1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{}}}",
        "{\"id\":\"evt_1\",\"id\":\"evt_2\",\"type\":\"x\",\"created\":1,\"data\":{"
        "\"object\":{}}}",
        "{\"id\":\"evt_1\",\"type\":\"x\",\"created\":-1,\"data\":{\"object\":{}}}",
        "{\"id\":\"evt_1\",\"type\":\"x\",\"created\":\"1\",\"data\":{\"object\":{}}}",
        "{\"id\":\"evt_1\",\"type\":\"x\",\"created\":1,\"data\":{}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"processing\"}}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"succeeded\",\"amount\":"
        "\"5\"}}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"succeeded\",\"currency\":"
        "\"e\"}}}",
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"object\":\"charge\",\"status\":"
        "\"succeeded\"}}}",
        "{\"id\":\"evt_\\u0000\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{}}"
        "}",
        "{\"id\":\"evt_\xc3\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{}}}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err.message[0] = '\0';
        ck_assert_msg(parse(bad[i], &ev, &err) == CHARGED_BAD_ITEM,
                      "accepted bad body %zu", i);
        ck_assert_msg(err.message[0] != '\0', "no reason for bad body %zu", i);
    }
    /* An id longer than we keep is refused, never cut. */
    char body[1200] = "{\"id\":\"evt_";
    memset(body + strlen(body), 'a', 600);
    strcpy(body + 11 + 600,
           "\",\"type\":\"x\",\"created\":1,\"data\":{\"object\":{}}}");
    ck_assert_int_eq(parse(body, &ev, &err), CHARGED_BAD_ITEM);
}
END_TEST

/* One row of the table: evidence x status x whose intent x (event newer
 * than the attempt's last change?) -> action, new status, and whether the
 * attempt is made due for the reconciler now. */
struct row {
    enum webhook_evidence e;
    enum attempt_status from;
    enum owner owner;
    int newer;
    enum webhook_action action;
    enum attempt_status to;
    int check_now;
};

static const struct row table[] = {
    /* Our own intent: settles or moves the attempt. */
    {EV(SUCCEEDED), S_(PROCESSING), OURS, 1, ACT(APPLY), S_(SUCCEEDED), 0},
    {EV(SUCCEEDED), S_(UNKNOWN), OURS, 1, ACT(APPLY), S_(SUCCEEDED), 0},
    {EV(SUCCEEDED), S_(SUCCEEDED), OURS, 1, ACT(IGNORE), S_(SUCCEEDED), 0},
    {EV(SUCCEEDED), S_(FAILED), OURS, 0, ACT(REVIEW), S_(REQUIRES_REVIEW), 0},
    {EV(SUCCEEDED), S_(FAILED), OURS, 1, ACT(REVIEW), S_(REQUIRES_REVIEW), 0},
    {EV(SUCCEEDED), S_(REQUIRES_REVIEW), OURS, 1, ACT(IGNORE), S_(REQUIRES_REVIEW), 0},
    {EV(FAILED), S_(PROCESSING), OURS, 1, ACT(APPLY), S_(FAILED), 0},
    {EV(FAILED), S_(UNKNOWN), OURS, 1, ACT(APPLY), S_(FAILED), 0},
    {EV(FAILED), S_(SUCCEEDED), OURS, 1, ACT(REVIEW), S_(REQUIRES_REVIEW), 0},
    {EV(FAILED), S_(SUCCEEDED), OURS, 0, ACT(IGNORE), S_(SUCCEEDED), 0},
    {EV(FAILED), S_(FAILED), OURS, 1, ACT(IGNORE), S_(FAILED), 0},
    {EV(PROCESSING), S_(UNKNOWN), OURS, 1, ACT(APPLY), S_(PROCESSING), 0},
    {EV(PROCESSING), S_(PROCESSING), OURS, 1, ACT(IGNORE), S_(PROCESSING), 0},
    {EV(PROCESSING), S_(SUCCEEDED), OURS, 0, ACT(IGNORE), S_(SUCCEEDED), 0},
    {EV(PROCESSING), S_(FAILED), OURS, 0, ACT(IGNORE), S_(FAILED), 0},
    /* An intent that only names the attempt (no answer of ours recorded
     * yet): never moves it. A success could be money: flagged loudly,
     * unless the attempt's own call is in flight or unknown (the webhook
     * outran our answer: unproven, no page); an UNKNOWN attempt is due for
     * the reconciler's replay at once. Before this rule a failure here
     * settled the attempt FAILED while its own call still executed (issue
     * 34, break 1). */
    {EV(SUCCEEDED), S_(PROCESSING), UNPROVEN, 1, ACT(UNPROVEN), S_(PROCESSING), 0},
    {EV(SUCCEEDED), S_(UNKNOWN), UNPROVEN, 1, ACT(UNPROVEN), S_(UNKNOWN), 1},
    {EV(SUCCEEDED), S_(PENDING), UNPROVEN, 1, ACT(FLAG), S_(PENDING), 0},
    {EV(SUCCEEDED), S_(REJECTED), UNPROVEN, 1, ACT(FLAG), S_(REJECTED), 0},
    {EV(SUCCEEDED), S_(REQUIRES_REVIEW), UNPROVEN, 1, ACT(FLAG), S_(REQUIRES_REVIEW),
     0},
    {EV(FAILED), S_(PROCESSING), UNPROVEN, 1, ACT(IGNORE), S_(PROCESSING), 0},
    {EV(FAILED), S_(UNKNOWN), UNPROVEN, 1, ACT(IGNORE), S_(UNKNOWN), 1},
    {EV(FAILED), S_(PENDING), UNPROVEN, 1, ACT(IGNORE), S_(PENDING), 0},
    {EV(PROCESSING), S_(UNKNOWN), UNPROVEN, 1, ACT(IGNORE), S_(UNKNOWN), 1},
    /* Another's intent: we recorded another, or it is another attempt's.
     * Never our attempt's review: flagged (a success) or ignored. */
    {EV(SUCCEEDED), S_(PROCESSING), OTHER, 1, ACT(FLAG), S_(PROCESSING), 0},
    {EV(SUCCEEDED), S_(UNKNOWN), OTHER, 1, ACT(FLAG), S_(UNKNOWN), 1},
    {EV(SUCCEEDED), S_(SUCCEEDED), OTHER, 1, ACT(FLAG), S_(SUCCEEDED), 0},
    {EV(SUCCEEDED), S_(FAILED), OTHER, 1, ACT(FLAG), S_(FAILED), 0},
    {EV(SUCCEEDED), S_(REQUIRES_REVIEW), OTHER, 1, ACT(FLAG), S_(REQUIRES_REVIEW), 0},
    {EV(SUCCEEDED), S_(PENDING), ELSE, 1, ACT(FLAG), S_(PENDING), 0},
    {EV(SUCCEEDED), S_(UNKNOWN), ELSE, 1, ACT(FLAG), S_(UNKNOWN), 1},
    {EV(FAILED), S_(UNKNOWN), OTHER, 1, ACT(IGNORE), S_(UNKNOWN), 1},
    {EV(FAILED), S_(UNKNOWN), ELSE, 1, ACT(IGNORE), S_(UNKNOWN), 1},
    {EV(FAILED), S_(SUCCEEDED), OTHER, 1, ACT(IGNORE), S_(SUCCEEDED), 0},
    {EV(PROCESSING), S_(UNKNOWN), OTHER, 1, ACT(IGNORE), S_(UNKNOWN), 1},
    {EV(NONE), S_(UNKNOWN), OURS, 1, ACT(IGNORE), S_(UNKNOWN), 0},
    {EV(NONE), S_(UNKNOWN), UNPROVEN, 1, ACT(IGNORE), S_(UNKNOWN), 0},
};

START_TEST(decision_table)
{
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        const struct row *r = &table[i];
        struct webhook_event ev = {.evidence = r->e,
                                   .amount = 1999,
                                   .currency = "EUR",
                                   .created = r->newer ? 2000 : 1000};
        strcpy(ev.intent_id, "pi_event");
        struct webhook_attempt a = attempt_for(r->from, r->owner);
        struct webhook_decision d;
        webhook_event_decide(&ev, &a, &d);
        ck_assert_msg(d.action == r->action, "row %zu: action %s, want %s", i,
                      webhook_action_name(d.action), webhook_action_name(r->action));
        if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW) {
            ck_assert_msg(d.status == r->to, "row %zu: status %s, want %s", i,
                          attempt_status_name(d.status), attempt_status_name(r->to));
            ck_assert_msg(attempt_status_transition_allowed((int)r->from, d.status),
                          "row %zu: the decision is not an allowed transition", i);
        }
        ck_assert_msg(d.check_now == r->check_now, "row %zu: check_now %d, want %d", i,
                      d.check_now, r->check_now);
        ck_assert_msg(d.reason && *d.reason, "row %zu: no reason", i);
    }
}
END_TEST

START_TEST(another_amount_or_currency_is_another_charge)
{
    struct webhook_event ev = {
        .evidence = WEBHOOK_EVIDENCE_SUCCEEDED, .amount = 2000, .currency = "EUR"};
    strcpy(ev.intent_id, "pi_ours");
    struct webhook_attempt a = attempt_for(ATTEMPT_STATUS_UNKNOWN, OURS);
    struct webhook_decision d;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
    ev.amount = 1999;
    strcpy(ev.currency, "USD");
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
    /* Same intent, amount and currency: ours. */
    strcpy(ev.currency, "EUR");
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_APPLY);
    /* The same, but we recorded no intent yet: it only names us. */
    a = attempt_for(ATTEMPT_STATUS_UNKNOWN, UNPROVEN);
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_UNPROVEN);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_UNKNOWN);
    /* ... and a failure of it says nothing about this attempt. */
    ev.evidence = WEBHOOK_EVIDENCE_FAILED;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_IGNORE);
}
END_TEST

START_TEST(a_failed_attempt_whose_order_moved_on_is_flagged)
{
    struct webhook_event ev = {
        .evidence = WEBHOOK_EVIDENCE_SUCCEEDED, .amount = 1999, .currency = "EUR"};
    strcpy(ev.intent_id, "pi_ours");
    struct webhook_attempt a = attempt_for(ATTEMPT_STATUS_FAILED, OURS);
    struct webhook_decision d;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
    /* Another attempt of the order is live: REQUIRES_REVIEW (live) would
     * break one-live-attempt-per-order; the evidence is flagged instead. */
    a.order_has_other_live = 1;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_FLAG);
    ck_assert_int_eq(d.status, ATTEMPT_STATUS_FAILED);
    /* A live attempt becomes REQUIRES_REVIEW whatever its order holds. */
    a.status = ATTEMPT_STATUS_UNKNOWN;
    ev.amount = 2000;
    webhook_event_decide(&ev, &a, &d);
    ck_assert_int_eq(d.action, WEBHOOK_REVIEW);
}
END_TEST

/* Whose refund, as the database tells it: recorded for R, recorded none,
 * recorded another, on another intent than R's charge's. */
enum refund_owner { R_OURS, R_UNPROVEN, R_OTHER, R_ELSEWHERE, R_OTHER_INTENT };

struct refund_row_case {
    const char *status; /* the provider's */
    enum attempt_status from;
    enum refund_owner owner;
    enum webhook_refund_action action;
    enum attempt_status to;
    int check_now;
};

#define RA(x) WEBHOOK_REFUND_##x

static const struct refund_row_case refund_table[] = {
    {"succeeded", S_(UNKNOWN), R_OURS, RA(APPLY), S_(SUCCEEDED), 0},
    {"failed", S_(UNKNOWN), R_OURS, RA(APPLY), S_(FAILED), 0},
    {"pending", S_(UNKNOWN), R_OURS, RA(APPLY), S_(PROCESSING), 0},
    {"failed", S_(SUCCEEDED), R_OURS, RA(NEEDS_REVIEW), S_(SUCCEEDED), 0},
    /* Issue 34, break 3: a failure of a refund that only names R gave R's
     * reservation back while R's own refund executed. Never again. */
    {"failed", S_(UNKNOWN), R_UNPROVEN, RA(IGNORE), S_(UNKNOWN), 1},
    {"failed", S_(PROCESSING), R_UNPROVEN, RA(IGNORE), S_(PROCESSING), 0},
    {"canceled", S_(UNKNOWN), R_OTHER, RA(IGNORE), S_(UNKNOWN), 1},
    {"failed", S_(UNKNOWN), R_ELSEWHERE, RA(IGNORE), S_(UNKNOWN), 1},
    {"failed", S_(UNKNOWN), R_OTHER_INTENT, RA(IGNORE), S_(UNKNOWN), 1},
    {"pending", S_(UNKNOWN), R_UNPROVEN, RA(IGNORE), S_(UNKNOWN), 1},
    /* Our own refund's success webhook outrunning our answer (the demo
     * ticketed 36 of them): unproven, no one told; its own call or the
     * reconciler settles it. Not a refund that cannot be in flight. */
    {"succeeded", S_(UNKNOWN), R_UNPROVEN, RA(UNPROVEN), S_(UNKNOWN), 1},
    {"succeeded", S_(PROCESSING), R_UNPROVEN, RA(UNPROVEN), S_(PROCESSING), 0},
    {"succeeded", S_(PENDING), R_UNPROVEN, RA(NEEDS_REVIEW), S_(PENDING), 0},
    {"succeeded", S_(FAILED), R_UNPROVEN, RA(NEEDS_REVIEW), S_(FAILED), 0},
    {"succeeded", S_(PROCESSING), R_ELSEWHERE, RA(NEEDS_REVIEW), S_(PROCESSING), 0},
    {"succeeded", S_(FAILED), R_OTHER, RA(NEEDS_REVIEW), S_(FAILED), 0},
    {"succeeded", S_(UNKNOWN), R_OTHER_INTENT, RA(NEEDS_REVIEW), S_(UNKNOWN), 1},
};

START_TEST(refund_decision_table)
{
    for (size_t i = 0; i < sizeof(refund_table) / sizeof(refund_table[0]); i++) {
        const struct refund_row_case *c = &refund_table[i];
        struct webhook_refund r = {.amount = 500, .currency = "EUR"};
        struct webhook_refund_row row = {
            .status = c->from, .amount = 500, .currency = "EUR"};
        struct webhook_refund_decision d;
        strcpy(r.id, "re_event");
        strcpy(r.status, c->status);
        strcpy(r.payment_intent, "pi_charge");
        row.provider_id_recorded = c->owner == R_OURS || c->owner == R_OTHER;
        row.provider_id_differs = c->owner == R_OTHER;
        row.provider_id_elsewhere = c->owner == R_ELSEWHERE;
        row.intent_differs = c->owner == R_OTHER_INTENT;
        if (c->owner == R_OTHER_INTENT)
            row.provider_id_recorded = 1; /* even our own re_ id on another intent */
        webhook_refund_decide(&r, &row, &d);
        ck_assert_msg(d.action == c->action, "row %zu: action %d, want %d", i, d.action,
                      c->action);
        if (d.action == WEBHOOK_REFUND_APPLY)
            ck_assert_msg(d.status == c->to, "row %zu: status %s, want %s", i,
                          attempt_status_name(d.status), attempt_status_name(c->to));
        ck_assert_msg(d.check_now == c->check_now, "row %zu: check_now %d, want %d", i,
                      d.check_now, c->check_now);
        ck_assert_msg(d.reason && *d.reason, "row %zu: no reason", i);
    }
}
END_TEST

START_TEST(normalized_payload_is_storable_and_masked)
{
    struct webhook_event ev;
    struct charged_error err;
    char *norm = NULL;
    const char *body =
        "{\"id\":\"evt_n\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"risk\":1e-20000,\"note\":\"card 4242424242424242 \\u00e9\","
        "\"data\":{\"object\":{\"id\":\"pi_n\",\"status\":\"succeeded\","
        "\"amount\":5,\"currency\":\"eur\"}}}";
    ck_assert_int_eq(stripe_webhook_parse(body, strlen(body), &ev, &norm, &err), 0);
    ck_assert_ptr_nonnull(norm);
    ck_assert_msg(strstr(norm, "1e-20000") == NULL, "%s", norm);
    ck_assert_msg(strstr(norm, "4242424242424242") == NULL, "%s", norm);
    ck_assert_msg(strstr(norm, "************4242") != NULL, "%s", norm);
    ck_assert_msg(strcasestr(norm, "\\u00e9") != NULL, "not ASCII: %s", norm);
    free(norm);
}
END_TEST

/* The provider's object ids are not text (a flake of
 * test_ownership_webhook_charge): psp-sim's "pi_18ee99fce2095510000001"
 * holds a Luhn-valid 13-digit run starting with 2, which the shown-text
 * mask took for a card, so the stored copy named an intent that does not
 * exist. Ids stay as the provider wrote them, where the provider writes
 * them; the same string in metadata or a description is anyone's text and
 * is masked. */
START_TEST(provider_ids_are_stored_as_they_are)
{
    struct webhook_event ev;
    struct charged_error err;
    char *norm = NULL;
    const char *body =
        "{\"id\":\"evt_52cedde2095510000001\",\"type\":\"payment_intent.payment_"
        "failed\","
        "\"created\":1,\"data\":{\"object\":{\"id\":\"pi_18ee99fce2095510000001\","
        "\"object\":\"payment_intent\",\"status\":\"requires_payment_method\","
        "\"latest_charge\":\"ch_3ee99fce2095510000001\",\"payment_method\":\"pm_"
        "4ee99fce2095510000001\","
        "\"description\":\"pi_4242424242424242\","
        "\"charges\":{\"data\":[{\"id\":\"ch_3ee99fce2095510000001\","
        "\"payment_intent\":\"pi_18ee99fce2095510000001\"}]},"
        "\"metadata\":{\"id\":\"pi_4242424242424242\"}}}}";
    ck_assert_int_eq(stripe_webhook_parse(body, strlen(body), &ev, &norm, &err), 0);
    ck_assert_str_eq(ev.intent_id, "pi_18ee99fce2095510000001");
    ck_assert_ptr_nonnull(norm);
    ck_assert_msg(strstr(norm, "\"id\":\"evt_52cedde2095510000001\"") != NULL, "%s",
                  norm);
    ck_assert_msg(strstr(norm, "\"id\":\"pi_18ee99fce2095510000001\"") != NULL, "%s",
                  norm);
    ck_assert_msg(strstr(norm, "\"latest_charge\":\"ch_3ee99fce2095510000001\"") !=
                      NULL,
                  "%s", norm);
    ck_assert_msg(strstr(norm, "\"payment_method\":\"pm_4ee99fce2095510000001\"") !=
                      NULL,
                  "%s", norm);
    ck_assert_msg(strstr(norm, "\"id\":\"ch_3ee99fce2095510000001\"") != NULL, "%s",
                  norm);
    ck_assert_msg(strstr(norm, "\"payment_intent\":\"pi_18ee99fce2095510000001\"") !=
                      NULL,
                  "%s", norm);
    ck_assert_msg(strstr(norm, "4242424242424242") == NULL, "%s", norm);
    free(norm);
}
END_TEST

/* Provider text split by a TAB, NBSP or zero-width space (issue 34): the
 * decline code, the refund's failure reason and the stored copy show the
 * last four digits only, not "4242 4242 4242 4242" nor an escape-split
 * "4242\\t4242\\t4242\\t4242" the text's mask cannot read through. */
START_TEST(card_split_by_control_characters_is_masked)
{
    struct webhook_event ev;
    struct charged_error err;
    char *norm = NULL;
    const char *body =
        "{\"id\":\"evt_s\",\"type\":\"payment_intent.payment_failed\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_s\",\"status\":\"requires_payment_method\","
        "\"last_payment_error\":{\"code\":\"card_declined\",\"decline_code\":"
        "\"4242\\t4242\\t4242\\t4242\"},"
        "\"metadata\":{\"order_id\":\"4242\\u00a04242\\u200b4242\\u200b4242\"}}}}";
    ck_assert_int_eq(stripe_webhook_parse(body, strlen(body), &ev, &norm, &err), 0);
    ck_assert_str_eq(ev.decline_code, "**** **** **** 4242");
    ck_assert_ptr_nonnull(norm);
    ck_assert_msg(strstr(norm, "\"****\\t****\\t****\\t4242\"") != NULL, "%s", norm);
    ck_assert_msg(strcasestr(norm, "\"****\\u00a0****\\u200b****\\u200b4242\"") != NULL,
                  "%s", norm);
    free(norm);
    const char *refund =
        "{\"id\":\"evt_r\",\"type\":\"refund.failed\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"re_s\",\"object\":\"refund\","
        "\"status\":\"failed\",\"payment_intent\":\"pi_s\",\"amount\":5,"
        "\"currency\":\"eur\",\"failure_reason\":\"4242/4242/4242/4242\"}}}";
    ck_assert_int_eq(parse(refund, &ev, &err), 0);
    ck_assert_uint_eq(ev.nrefunds, 1);
    ck_assert_str_eq(ev.refunds[0].failure_reason, "****/****/****/4242");
}
END_TEST

START_TEST(a_success_names_its_amount)
{
    struct webhook_event ev;
    struct charged_error err;
    const char *neg =
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"succeeded\","
        "\"amount\":-1,\"currency\":\"eur\"}}}";
    const char *none =
        "{\"id\":\"evt_1\",\"type\":\"payment_intent.succeeded\",\"created\":1,"
        "\"data\":{\"object\":{\"id\":\"pi_1\",\"status\":\"succeeded\","
        "\"currency\":\"eur\"}}}";
    ck_assert_int_eq(parse(neg, &ev, &err), CHARGED_BAD_ITEM);
    ck_assert_int_eq(parse(none, &ev, &err), CHARGED_BAD_ITEM);
}
END_TEST

/* A charge.refunded body listing n refunds of 1 EUR each. */
static char *refunded_body(int n)
{
    size_t size = 256 + (size_t)n * 128, len;
    char *b = malloc(size);
    ck_assert_ptr_nonnull(b);
    len = (size_t)snprintf(
        b, size,
        "{\"id\":\"evt_r\",\"type\":\"charge.refunded\",\"created\":1,"
        "\"data\":{\"object\":{\"object\":\"charge\",\"payment_"
        "intent\":\"pi_r\",\"refunds\":{\"has_more\":false,\"data\":[");
    for (int i = 0; i < n; i++)
        len +=
            (size_t)snprintf(b + len, size - len,
                             "%s{\"id\":\"re_%03d\",\"object\":\"refund\",\"status\":"
                             "\"succeeded\",\"amount\":100,\"currency\":\"eur\"}",
                             i ? "," : "", i);
    snprintf(b + len, size - len, "]}}}}");
    return b;
}

/* A charge refunded more often than 16 times is a valid event: the
 * provider lists up to a page of 100; only more is refused. */
START_TEST(a_charge_refunded_many_times_is_accepted)
{
    struct webhook_event ev;
    struct charged_error err;
    char *body = refunded_body(40);
    ck_assert_msg(parse(body, &ev, &err) == 0, "%s", err.message);
    ck_assert_uint_eq(ev.nrefunds, 40);
    ck_assert_str_eq(ev.refunds[39].id, "re_039");
    free(body);
    body = refunded_body(100);
    ck_assert_msg(parse(body, &ev, &err) == 0, "%s", err.message);
    ck_assert_uint_eq(ev.nrefunds, 100);
    free(body);
    body = refunded_body(101);
    ck_assert_int_eq(parse(body, &ev, &err), CHARGED_BAD_ITEM);
    free(body);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("webhook_event");
    TCase *tc = tcase_create("webhook_event");
    tcase_add_test(tc, parses_a_success);
    tcase_add_test(tc, a_card_shaped_number_is_stored_masked_as_a_string);
    tcase_add_test(tc, card_split_by_control_characters_is_masked);
    tcase_add_test(tc, provider_ids_are_stored_as_they_are);
    tcase_add_test(tc, parses_a_failure_with_its_code);
    tcase_add_test(tc, refuses_bad_shapes);
    tcase_add_test(tc, decision_table);
    tcase_add_test(tc, refund_decision_table);
    tcase_add_test(tc, another_amount_or_currency_is_another_charge);
    tcase_add_test(tc, a_failed_attempt_whose_order_moved_on_is_flagged);
    tcase_add_test(tc, normalized_payload_is_storable_and_masked);
    tcase_add_test(tc, a_success_names_its_amount);
    tcase_add_test(tc, a_charge_refunded_many_times_is_accepted);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
