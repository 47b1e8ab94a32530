/* Fuzz target: the classification of a provider's answer
 * (common/provider/provider_client: provider_client_classify and
 * provider_client_parse_page), over status, Idempotent-Replayed header and
 * body. The input is a call byte (which request was asked), a status byte
 * pair, the header value, a newline, then the body.
 *
 * Properties: the outcome is one of the table's; every text the result
 * keeps (what is stored and logged) is terminated valid UTF-8 without
 * control characters; a kept id is one we can look up again; a 5xx is never
 * final and a 409 or 429 never executed for a POST; only a 2xx succeeds a
 * POST; NOT_FOUND only answers a look-up; AUTHORIZED only an authorization
 * (a manual charge) or a look-up; a capture or void succeeds only on the
 * intent asked for, a partial capture only for what it asked; a list page
 * is printable ASCII, and empty unless it was read whole; a look-up's
 * evidence names its object by an id we can use. */
#include "fuzz_check.h"
#include "provider_client.h"
#include "utf8_text.h"

#define ATTEMPT "5d1c2c1e-1a9b-4b1e-8e55-000000000001"

static const int statuses[] = {200, 201, 400, 402, 404, 409, 429, 500,
                               502, 503, 401, 403, 0,   100, 302, 418};

#define CHECK_TEXT(field)                                                              \
    do {                                                                               \
        FUZZ_CHECK(memchr((field), '\0', sizeof(field)));                              \
        FUZZ_CHECK(utf8_text_valid((field), strlen(field)));                           \
        for (const char *p_ = (field); *p_; p_++)                                      \
            FUZZ_CHECK((unsigned char)*p_ >= 0x20 && *p_ != 0x7f);                     \
    } while (0)

#define CHECK_ASCII(field)                                                             \
    do {                                                                               \
        FUZZ_CHECK(memchr((field), '\0', sizeof(field)));                              \
        for (const char *p_ = (field); *p_; p_++)                                      \
            FUZZ_CHECK((unsigned char)*p_ >= 0x20 && (unsigned char)*p_ < 0x7f);       \
    } while (0)

static void check_id(const char *id)
{
    for (const char *p = id; *p; p++)
        FUZZ_CHECK((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
                   (*p >= '0' && *p <= '9') || *p == '_');
}

static void fuzz_classify(int which, int http, const char *replayed, const char *body,
                          size_t len)
{
    struct provider_call call = {.amount = 1999};
    snprintf(call.currency, sizeof(call.currency), "eur");
    snprintf(call.attempt_id, sizeof(call.attempt_id), ATTEMPT);
    snprintf(call.payment_intent, sizeof(call.payment_intent), "pi_1");
    switch (which) {
    case 0: /* a charge */
        break;
    case 1: /* a void */
        call.operation = PROVIDER_OPERATION_VOID;
        break;
    case 11: /* a capture of part */
    case 13: /* a capture of all */
        call.operation = PROVIDER_OPERATION_CAPTURE;
        call.amount = which == 11 ? 600 : 0;
        break;
    case 12: /* an authorization */
        call.manual = 1;
        break;
    case 2: /* a refund */
        call.refund = 1;
        call.amount = 500;
        break;
    default: /* the look-ups: retrieve, search, list; of intents or refunds */
        call.lookup = 1;
        call.kind = (enum provider_lookup)((which - 3) % 3);
        call.refund = which >= 6;
        break;
    }
    struct provider_result res;
    memset(&res, 0, sizeof(res));
    provider_client_classify(&call, http, replayed, body, len, &res);

    FUZZ_CHECK(res.outcome >= PROVIDER_SUCCEEDED &&
               res.outcome < PROVIDER_OUTCOME__COUNT);
    FUZZ_CHECK(provider_outcome_name(res.outcome)[0]);
    FUZZ_CHECK(res.http_status == http);
    FUZZ_CHECK(res.replayed == (replayed && !strcasecmp(replayed, "true")));
    CHECK_TEXT(res.error);
    CHECK_TEXT(res.code);
    CHECK_TEXT(res.decline_code);
    CHECK_TEXT(res.param);
    CHECK_TEXT(res.intent_status);
    CHECK_TEXT(res.currency);
    CHECK_TEXT(res.intent_attempt_id);
    CHECK_TEXT(res.provider_payment_id);
    CHECK_TEXT(res.list_last_id);
    CHECK_TEXT(res.capture_method);
    CHECK_TEXT(res.cancellation_reason);
    FUZZ_CHECK(res.amount_capturable >= -1 && res.amount_received >= -1);
    if (res.outcome == PROVIDER_AUTHORIZED)
        FUZZ_CHECK((call.lookup || call.manual) && res.provider_payment_id[0]);
    if (call.operation != PROVIDER_OPERATION_NONE &&
        res.outcome == PROVIDER_SUCCEEDED) {
        FUZZ_CHECK(!strcmp(res.provider_payment_id, "pi_1"));
        FUZZ_CHECK(call.operation == PROVIDER_OPERATION_CAPTURE
                       ? !strcmp(res.intent_status, "succeeded")
                       : !strcmp(res.intent_status, "canceled"));
        FUZZ_CHECK(!call.amount || res.amount_received == -1 ||
                   res.amount_received == call.amount);
    }
    check_id(res.list_last_id);
    check_id(res.provider_payment_id);
    if (!call.lookup) {
        if (http >= 500)
            FUZZ_CHECK(res.outcome == PROVIDER_UNKNOWN);
        if (http == 409 || http == 429)
            FUZZ_CHECK(res.outcome == PROVIDER_NOT_EXECUTED);
        if (res.outcome == PROVIDER_SUCCEEDED)
            FUZZ_CHECK(http >= 200 && http < 300 && res.provider_payment_id[0]);
        FUZZ_CHECK(res.outcome != PROVIDER_NOT_FOUND);
    } else {
        /* Evidence either way comes only from the provider's own answer,
         * and names the object it is about. */
        if (res.outcome == PROVIDER_SUCCEEDED || res.outcome == PROVIDER_NOT_FOUND)
            FUZZ_CHECK(http == 200 || http == 404);
        if (res.outcome != PROVIDER_NOT_FOUND && res.outcome != PROVIDER_UNKNOWN &&
            res.outcome != PROVIDER_INVALID)
            FUZZ_CHECK(res.provider_payment_id[0]);
    }
    char detail[512];
    provider_outcome_detail(&res, detail, sizeof(detail));
    FUZZ_CHECK(memchr(detail, '\0', sizeof(detail)));
}

static void fuzz_page(int which, int http, const char *body, size_t len)
{
    static struct provider_page page; /* 100 objects: too large for a stack */
    struct provider_result res;
    enum provider_list_of what = which ? PROVIDER_LIST_REFUNDS : PROVIDER_LIST_INTENTS;
    provider_client_parse_page(what, http, body, len, &page, &res);
    FUZZ_CHECK(res.outcome >= PROVIDER_SUCCEEDED &&
               res.outcome < PROVIDER_OUTCOME__COUNT);
    CHECK_TEXT(res.error);
    FUZZ_CHECK(page.n <= PROVIDER_PAGE_MAX);
    if (res.outcome != PROVIDER_SUCCEEDED) {
        FUZZ_CHECK(page.n == 0 && !page.has_more);
        return;
    }
    FUZZ_CHECK(http == 200);
    FUZZ_CHECK(!page.has_more || page.n > 0);
    for (size_t i = 0; i < page.n; i++) {
        const struct provider_listed *o = &page.items[i];
        FUZZ_CHECK(o->id[0]);
        CHECK_ASCII(o->id);
        CHECK_ASCII(o->status);
        CHECK_ASCII(o->currency);
        CHECK_ASCII(o->payment_attempt_id);
        CHECK_ASCII(o->order_id);
        CHECK_ASCII(o->refund_id);
        CHECK_ASCII(o->payment_intent);
        CHECK_ASCII(o->capture_method);
        CHECK_ASCII(o->cancellation_reason);
        FUZZ_CHECK(o->amount_capturable >= -1 && o->amount_received >= -1);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    /* 0..8 and 11..13 a call's answer, 9 and 10 a list page. */
    int which = data[0] % 14;
    /* Mostly the statuses that mean something; the high bit any other. */
    int http = data[1] & 0x80 ? ((data[1] & 0x7f) << 8 | data[2]) % 600
                              : statuses[data[1] % 16];
    data += 3;
    size -= 3;
    size_t replayed_len;
    const uint8_t *replayed_at = fuzz_next_line(&data, &size, &replayed_len);
    char *replayed = replayed_len ? fuzz_strndup(replayed_at, replayed_len) : NULL;
    char *body = size ? fuzz_memdup(data, size) : NULL;
    if (which == 9 || which == 10)
        fuzz_page(which - 9, http, body, size);
    else
        fuzz_classify(which, http, replayed, body, size);
    free(replayed);
    free(body);
    return 0;
}
