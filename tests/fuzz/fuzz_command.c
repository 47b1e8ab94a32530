/* Fuzz target: the command parsers and validators (common/core/
 * charge_command, refund_command, command_fields). The input is the
 * message key, a newline, then the value.
 *
 * Properties: a command that is taken has every field within the
 * contract's rules (canonical UUIDs, keys of the allowed characters,
 * bounded valid UTF-8 text, a positive amount within the limit, metadata an
 * object, a hex fingerprint) and neither key nor value carries a card
 * number; a command refused says why in a line that quotes no card number;
 * of a command taken, a deployment's currency list takes exactly those in
 * it. */
#include <jansson.h>

#include "card_data.h"
#include "charge_command.h"
#include "command_fields.h"
#include "fuzz_check.h"
#include "refund_command.h"
#include "utf8_text.h"

#define MAX_AMOUNT 100000000000LL

static void check_uuid(const char *s)
{
    FUZZ_CHECK(charge_command_is_uuid(s));
    for (const char *p = s; *p; p++)
        FUZZ_CHECK(!(*p >= 'A' && *p <= 'Z'));
}

static void check_text(const char *s, size_t max_chars)
{
    size_t n = strlen(s);
    FUZZ_CHECK(utf8_text_valid(s, n));
    FUZZ_CHECK(utf8_text_chars(s, n) <= max_chars);
}

static void check_hex64(const char *s)
{
    FUZZ_CHECK(strlen(s) == 64);
    for (const char *p = s; *p; p++)
        FUZZ_CHECK((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f'));
}

static void check_metadata(const char *json)
{
    json_error_t jerr;
    json_t *md = json_loads(json, 0, &jerr);
    FUZZ_CHECK(json_is_object(md) && json_object_size(md) <= 20);
    const char *k;
    json_t *v;
    json_object_foreach(md, k, v)
    {
        FUZZ_CHECK(json_is_string(v));
        check_text(k, 40);
        check_text(json_string_value(v), 500);
    }
    json_decref(md);
}

static void check_refused(enum dead_letter_reason r, const char *err)
{
    FUZZ_CHECK(r != DEAD_LETTER_NONE);
    FUZZ_CHECK(memchr(err, '\0', 512) && err[0]);
    FUZZ_CHECK(!card_data_found(err, strlen(err)));
}

static void fuzz_charge(const uint8_t *key, size_t key_len, const uint8_t *value,
                        size_t value_len)
{
    struct charge_command_limits open = {65536, MAX_AMOUNT, NULL};
    struct charge_command_limits narrow = {65536, MAX_AMOUNT, "EUR,USD"};
    struct charge_command c;
    struct charged_error err;

    enum dead_letter_reason r =
        charge_command_parse(key, key_len, value, value_len, &open, &c, &err);
    if (r != DEAD_LETTER_NONE) {
        check_refused(r, err.message);
        charge_command_release(&c);
        return;
    }
    check_uuid(c.payment_attempt_id);
    check_uuid(c.order_id);
    FUZZ_CHECK(command_fields_key_ok(c.idempotency_key));
    FUZZ_CHECK(c.amount > 0 && c.amount <= MAX_AMOUNT);
    FUZZ_CHECK(strlen(c.currency) == 3);
    for (int i = 0; i < 3; i++)
        FUZZ_CHECK(c.currency[i] >= 'A' && c.currency[i] <= 'Z');
    check_text(c.payment_method, CHARGE_COMMAND_TEXT_CHARS);
    FUZZ_CHECK(c.payment_method[0]);
    check_text(c.customer_id, CHARGE_COMMAND_TEXT_CHARS);
    check_metadata(c.metadata_json);
    check_hex64(c.fingerprint);
    FUZZ_CHECK(!card_data_found((const char *)key, key_len));
    FUZZ_CHECK(!card_data_found((const char *)value, value_len));
    FUZZ_CHECK(command_fields_type_is(value, value_len, "charge.requested"));
    char currency[4];
    memcpy(currency, c.currency, sizeof(currency));
    charge_command_release(&c);

    r = charge_command_parse(key, key_len, value, value_len, &narrow, &c, &err);
    int allowed = !strcmp(currency, "EUR") || !strcmp(currency, "USD");
    FUZZ_CHECK(allowed ? r == DEAD_LETTER_NONE : r != DEAD_LETTER_NONE);
    charge_command_release(&c);
}

static void fuzz_refund(const uint8_t *key, size_t key_len, const uint8_t *value,
                        size_t value_len)
{
    struct refund_command rc;
    struct charged_error err;
    enum dead_letter_reason r =
        refund_command_parse(key, key_len, value, value_len, 65536, &rc, &err);
    if (r != DEAD_LETTER_NONE) {
        check_refused(r, err.message);
        refund_command_release(&rc);
        return;
    }
    check_uuid(rc.refund_id);
    check_uuid(rc.payment_attempt_id);
    FUZZ_CHECK(command_fields_key_ok(rc.idempotency_key));
    FUZZ_CHECK(rc.amount > 0);
    FUZZ_CHECK(!strcmp(rc.reason, "requested_by_customer") ||
               !strcmp(rc.reason, "duplicate") || !strcmp(rc.reason, "fraudulent"));
    check_metadata(rc.metadata_json);
    check_hex64(rc.fingerprint);
    FUZZ_CHECK(!card_data_found((const char *)key, key_len));
    FUZZ_CHECK(!card_data_found((const char *)value, value_len));
    FUZZ_CHECK(command_fields_type_is(value, value_len, REFUND_COMMAND_TYPE));
    refund_command_release(&rc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t key_len;
    const uint8_t *key = fuzz_next_line(&data, &size, &key_len);
    /* Copies, so that a read past either end is ASan's to see. */
    uint8_t *k = fuzz_memdup(key, key_len), *v = fuzz_memdup(data, size);
    fuzz_charge(k, key_len, v, size);
    fuzz_refund(k, key_len, v, size);
    free(k);
    free(v);
    return 0;
}
