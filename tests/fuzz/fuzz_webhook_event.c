/* Fuzz target: the webhook event parser (common/core/webhook_event), and
 * the decisions it feeds, over the raw body.
 *
 * Properties: a parsed event's text fields are terminated valid UTF-8 of
 * their buffers, its attempt and refund ids empty or canonical UUIDs, its
 * currencies empty or three upper-case letters; a success names amount and
 * currency, a hold (amount_capturable_updated) what it holds; the normalized copy is
 * ASCII JSON without card numbers; a refusal says why; every decision is a known action
 * with a reason, and moves only to a status. */
#include <jansson.h>

#include "card_data.h"
#include "charge_command.h"
#include "fuzz_check.h"
#include "utf8_text.h"
#include "stripe.h"
#include "webhook_event.h"

#define CHECK_TEXT(field)                                                              \
    do {                                                                               \
        FUZZ_CHECK(memchr((field), '\0', sizeof(field)));                              \
        FUZZ_CHECK(utf8_text_valid((field), strlen(field)));                           \
    } while (0)

static void check_uuid_or_empty(const char *s)
{
    if (!s[0])
        return;
    FUZZ_CHECK(charge_command_is_uuid(s));
    for (const char *p = s; *p; p++)
        FUZZ_CHECK(!(*p >= 'A' && *p <= 'Z'));
}

static void check_currency(const char *c)
{
    size_t n = strlen(c);
    FUZZ_CHECK(n == 0 || n == 3);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(c[i] >= 'A' && c[i] <= 'Z');
}

static void check_decisions(const struct webhook_event *ev)
{
    for (int st = 0; st < ATTEMPT_STATUS__COUNT; st++) {
        struct webhook_attempt a = {.status = (enum attempt_status)st,
                                    .amount = 1999,
                                    .currency = "EUR",
                                    .updated_at = 1700000000,
                                    .intent_differs = st & 1,
                                    .intent_elsewhere = st == 4,
                                    .order_has_other_live = st == 5};
        struct webhook_decision d;
        webhook_event_decide(ev, &a, &d);
        FUZZ_CHECK(d.reason && d.reason[0]);
        FUZZ_CHECK(d.action >= WEBHOOK_IGNORE && d.action < WEBHOOK_ACTION__COUNT);
        if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW)
            FUZZ_CHECK(d.status >= 0 && d.status < ATTEMPT_STATUS__COUNT);
        if (d.action == WEBHOOK_REVIEW)
            FUZZ_CHECK(d.status == ATTEMPT_STATUS_REQUIRES_REVIEW);
        FUZZ_CHECK(webhook_action_name(d.action)[0]);
    }
    for (size_t i = 0; i < ev->nrefunds; i++) {
        for (int st = 0; st < ATTEMPT_STATUS__COUNT; st++) {
            struct webhook_refund_row row = {.status = (enum attempt_status)st,
                                             .amount = 500,
                                             .currency = "EUR",
                                             .intent_differs = st & 1};
            struct webhook_refund_decision d;
            webhook_refund_decide(&ev->refunds[i], &row, &d);
            FUZZ_CHECK(d.reason && d.reason[0]);
            FUZZ_CHECK(d.action >= WEBHOOK_REFUND_IGNORE &&
                       d.action <= WEBHOOK_REFUND_UNPROVEN);
            if (d.action == WEBHOOK_REFUND_APPLY)
                FUZZ_CHECK(d.status >= 0 && d.status < ATTEMPT_STATUS__COUNT);
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *body = fuzz_memdup(data, size);
    struct webhook_event ev;
    struct charged_error err;
    char *normalized = NULL;
    enum charged_rc rc = stripe_webhook_parse(body, size, &ev, &normalized, &err);
    if (rc != CHARGED_OK) {
        FUZZ_CHECK(rc == CHARGED_BAD_ITEM &&
                   memchr(err.message, '\0', sizeof(err.message)) && err.message[0]);
        free(normalized);
        free(body);
        return 0;
    }
    CHECK_TEXT(ev.id);
    CHECK_TEXT(ev.type);
    CHECK_TEXT(ev.intent_id);
    CHECK_TEXT(ev.intent_status);
    CHECK_TEXT(ev.decline_code);
    check_currency(ev.currency);
    check_uuid_or_empty(ev.attempt_id);
    CHECK_TEXT(ev.capture_method);
    CHECK_TEXT(ev.cancellation_reason);
    FUZZ_CHECK(ev.amount_capturable >= -1 && ev.amount_received >= -1);
    FUZZ_CHECK((unsigned)ev.evidence < WEBHOOK_EVIDENCE__COUNT);
    if (ev.evidence == WEBHOOK_EVIDENCE_SUCCEEDED)
        FUZZ_CHECK(ev.amount >= 0 && ev.currency[0]);
    /* A hold names what it holds, in the status that holds it. */
    if (ev.evidence == WEBHOOK_EVIDENCE_AUTHORIZED)
        FUZZ_CHECK(ev.amount >= 0 && ev.currency[0] && ev.amount_capturable >= 0 &&
                   !strcmp(ev.intent_status, "requires_capture"));
    FUZZ_CHECK(ev.nrefunds <= WEBHOOK_REFUNDS_MAX);
    for (size_t i = 0; i < ev.nrefunds; i++) {
        const struct webhook_refund *r = &ev.refunds[i];
        CHECK_TEXT(r->id);
        CHECK_TEXT(r->status);
        CHECK_TEXT(r->payment_intent);
        CHECK_TEXT(r->failure_reason);
        check_currency(r->currency);
        check_uuid_or_empty(r->refund_id);
        check_uuid_or_empty(r->attempt_id);
    }
    if (normalized) {
        for (const char *p = normalized; *p; p++)
            FUZZ_CHECK((unsigned char)*p < 0x80);
        json_error_t jerr;
        json_t *again = json_loads(normalized, 0, &jerr);
        FUZZ_CHECK(again);
        json_decref(again);
        FUZZ_CHECK(!card_data_found(normalized, strlen(normalized)));
    }
    check_decisions(&ev);
    free(normalized);
    free(body);
    return 0;
}
