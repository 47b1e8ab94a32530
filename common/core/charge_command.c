#include "charge_command.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uuid/uuid.h>

#include "command_fields.h"

/* Active ISO 4217 codes. */
static const char iso4217[] =
    "AED AFN ALL AMD ANG AOA ARS AUD AWG AZN BAM BBD BDT BGN BHD BIF BMD BND BOB BRL "
    "BSD BTN BWP BYN BZD CAD CDF CHF CLP CNY COP CRC CUP CVE CZK DJF DKK DOP DZD EGP "
    "ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF GTQ GYD HKD HNL HTG HUF IDR ILS INR "
    "IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR LRD LSL "
    "LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MYR MZN NAD NGN NIO NOK NPR "
    "NZD OMR PAB PEN PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD "
    "SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS TMT TND TOP TRY TTD TWD TZS UAH UGX "
    "USD UYU UZS VES VND VUV WST XAF XCD XCG XOF XPF YER ZAR ZMW ZWG";

int charge_command_is_uuid(const char *s)
{
    uuid_t u;
    /* uuid_parse reads the 36-character form and nothing else. */
    return s && strlen(s) == 36 && uuid_parse(s, u) == 0;
}

static int currency_allowed(const char *cur, const char *list)
{
    size_t n = strlen(cur);
    if (!list || !*list)
        return 1;
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ')
            p++;
        const char *e = p;
        while (*e && *e != ',' && *e != ' ')
            e++;
        if ((size_t)(e - p) == n && !strncmp(p, cur, n))
            return 1;
        p = e;
    }
    return 0;
}

/* The charged parameters' fingerprint (command_fields_fingerprint). */
static int fingerprint(struct charge_command *c)
{
    char amount[32];
    const char *fields[] = {c->payment_attempt_id, c->order_id,       amount,
                            c->currency,           c->payment_method, c->customer_id};
    snprintf(amount, sizeof(amount), "%lld", c->amount);
    return command_fields_fingerprint(fields, sizeof(fields) / sizeof(fields[0]),
                                      c->fingerprint);
}

enum dead_letter_reason charge_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             const struct charge_command_limits *limits,
                                             struct charge_command *out, char *errbuf,
                                             size_t errbuf_size)
{
    enum dead_letter_reason r;
    json_t *doc = NULL, *v;

    memset(out, 0, sizeof(*out));
    if ((r = command_fields_open(key, key_len, value, value_len, limits->max_bytes,
                                 &doc, errbuf, errbuf_size)) != DEAD_LETTER_NONE)
        return r;
    r = DEAD_LETTER_SCHEMA_VIOLATION;
    v = json_object_get(doc, "type");
    if (!json_is_string(v) || strcmp(json_string_value(v), "charge.requested") != 0) {
        snprintf(errbuf, errbuf_size, "'type' must be \"charge.requested\"");
        goto out;
    }
    v = json_object_get(doc, "version");
    if (!json_is_integer(v) || json_integer_value(v) != 1) {
        snprintf(errbuf, errbuf_size, "'version' must be the integer 1");
        goto out;
    }
    if (command_fields_string(doc, "payment_attempt_id", 1, 36, 36,
                              out->payment_attempt_id, sizeof(out->payment_attempt_id),
                              errbuf, errbuf_size) ||
        command_fields_string(doc, "order_id", 1, 36, 36, out->order_id,
                              sizeof(out->order_id), errbuf, errbuf_size))
        goto out;
    if (!charge_command_is_uuid(out->payment_attempt_id)) {
        snprintf(errbuf, errbuf_size, "'payment_attempt_id' must be a UUID");
        goto out;
    }
    if (!charge_command_is_uuid(out->order_id)) {
        snprintf(errbuf, errbuf_size, "'order_id' must be a UUID");
        goto out;
    }
    if (command_fields_string(doc, "idempotency_key", 1, 1, 128, out->idempotency_key,
                              sizeof(out->idempotency_key), errbuf, errbuf_size))
        goto out;
    if (!command_fields_key_ok(out->idempotency_key)) {
        snprintf(errbuf, errbuf_size,
                 "'idempotency_key' must be 1..128 characters of [A-Za-z0-9._:-]");
        goto out;
    }
    v = json_object_get(doc, "amount");
    if (!json_is_integer(v)) {
        snprintf(errbuf, errbuf_size, "'amount' must be an integer (minor units)");
        goto out;
    }
    out->amount = json_integer_value(v);
    if (out->amount < 1 || out->amount > 100000000000LL) {
        snprintf(errbuf, errbuf_size, "'amount' %lld is outside 1..100000000000",
                 out->amount);
        goto out;
    }
    if (command_fields_string(doc, "currency", 1, 3, 3, out->currency,
                              sizeof(out->currency), errbuf, errbuf_size))
        goto out;
    if (!isupper((unsigned char)out->currency[0]) ||
        !isupper((unsigned char)out->currency[1]) ||
        !isupper((unsigned char)out->currency[2]) || !strstr(iso4217, out->currency)) {
        snprintf(errbuf, errbuf_size,
                 "'currency' must be an ISO 4217 code in upper case, not '%s'",
                 out->currency);
        goto out;
    }
    if (command_fields_string(doc, "payment_method", 1, 1, CHARGE_COMMAND_TEXT_CHARS,
                              out->payment_method, sizeof(out->payment_method), errbuf,
                              errbuf_size) ||
        command_fields_string(doc, "customer_id", 0, 1, CHARGE_COMMAND_TEXT_CHARS,
                              out->customer_id, sizeof(out->customer_id), errbuf,
                              errbuf_size))
        goto out;
    v = json_object_get(doc, "metadata");
    if (command_fields_metadata(v, errbuf, errbuf_size))
        goto out;
    if (!key) {
        r = DEAD_LETTER_KEY_MISMATCH;
        snprintf(errbuf, errbuf_size,
                 "the message has no key; it must be the "
                 "payment_attempt_id");
        goto out;
    }
    if (key_len != 36 || memcmp(key, out->payment_attempt_id, 36) != 0) {
        r = DEAD_LETTER_KEY_MISMATCH;
        snprintf(errbuf, errbuf_size, "the message key is not the payment_attempt_id");
        goto out;
    }
    for (char *p = out->payment_attempt_id; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    for (char *p = out->order_id; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    if (out->amount > limits->max_amount) {
        r = DEAD_LETTER_AMOUNT_OVER_LIMIT;
        snprintf(errbuf, errbuf_size,
                 "'amount' %lld is above this deployment's limit %lld", out->amount,
                 limits->max_amount);
        goto out;
    }
    if (!currency_allowed(out->currency, limits->allowed_currencies)) {
        r = DEAD_LETTER_CURRENCY_NOT_ALLOWED;
        snprintf(errbuf, errbuf_size, "'currency' %s is not allowed by this deployment",
                 out->currency);
        goto out;
    }
    out->metadata_json =
        json_is_object(v) ? json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS) : strdup("{}");
    if (!out->metadata_json) {
        snprintf(errbuf, errbuf_size, "out of memory");
        goto out;
    }
    if (fingerprint(out)) {
        snprintf(errbuf, errbuf_size, "out of memory");
        charge_command_release(out);
        goto out;
    }
    r = DEAD_LETTER_NONE;
out:
    json_decref(doc);
    return r;
}

void charge_command_release(struct charge_command *cmd)
{
    free(cmd->metadata_json);
    cmd->metadata_json = NULL;
}
