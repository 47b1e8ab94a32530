#include "charge_command.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "charged_assert.h"
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
    return command_fields_is_uuid(s);
}

static int currency_allowed(const char *cur, const char *list)
{
    CHARGED_ASSERT(cur);
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
    const char *fields[] = {c->payment_attempt_id, c->order_id,    amount,  c->currency,
                            c->payment_method,     c->customer_id, "manual"};
    /* Only a valid command is fingerprinted: what it charges is positive. */
    CHARGED_ASSERT(c->amount >= 1);
    snprintf(amount, sizeof(amount), "%lld", c->amount);
    /* A charge's six fields, as stored before authorizations existed; an
     * authorization's a seventh. */
    size_t n = sizeof(fields) / sizeof(fields[0]) - (c->manual ? 0 : 1);
    return command_fields_fingerprint(fields, n, c->fingerprint);
}

/* The currency: an active ISO 4217 code in upper case. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
static enum charged_rc currency_read(json_t *doc, char cur[4],
                                     struct charged_error *err)
{
    if (command_fields_string(doc, "currency", 1, 3, 3, cur, 4, err))
        return CHARGED_BAD_ITEM;
    if (!isupper((unsigned char)cur[0]) || !isupper((unsigned char)cur[1]) ||
        !isupper((unsigned char)cur[2]) || !strstr(iso4217, cur)) {
        charged_error_set(
            err, "'currency' must be an ISO 4217 code in upper case, not '%s'", cur);
        return CHARGED_BAD_ITEM;
    }
    return CHARGED_OK;
}

/* The contract's members, in the order their faults are said. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
static enum charged_rc fields_read(json_t *doc, const char *type,
                                   struct charge_command *out,
                                   struct charged_error *err)
{
    if (command_fields_header(doc, type, err) ||
        command_fields_uuids(doc, "payment_attempt_id", out->payment_attempt_id,
                             "order_id", out->order_id, err) ||
        command_fields_idempotency_key(doc, out->idempotency_key, err) ||
        command_fields_amount(doc, &out->amount, err) ||
        currency_read(doc, out->currency, err))
        return CHARGED_BAD_ITEM;
    if (command_fields_string(doc, "payment_method", 1, 1, CHARGE_COMMAND_TEXT_CHARS,
                              out->payment_method, sizeof(out->payment_method), err) ||
        command_fields_string(doc, "customer_id", 0, 1, CHARGE_COMMAND_TEXT_CHARS,
                              out->customer_id, sizeof(out->customer_id), err))
        return CHARGED_BAD_ITEM;
    return command_fields_metadata(json_object_get(doc, "metadata"), err);
}

/* This deployment's own limits on a valid command: DEAD_LETTER_NONE, or
 * why it is refused. */
static enum dead_letter_reason deployment_allows(const struct charge_command *c,
                                                 const struct charge_command_limits *l,
                                                 struct charged_error *err)
{
    if (c->amount > l->max_amount) {
        charged_error_set(err, "'amount' %lld is above this deployment's limit %lld",
                          c->amount, l->max_amount);
        return DEAD_LETTER_AMOUNT_OVER_LIMIT;
    }
    if (!currency_allowed(c->currency, l->allowed_currencies)) {
        charged_error_set(err, "'currency' %s is not allowed by this deployment",
                          c->currency);
        return DEAD_LETTER_CURRENCY_NOT_ALLOWED;
    }
    return DEAD_LETTER_NONE;
}

enum dead_letter_reason charge_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             const struct charge_command_limits *limits,
                                             struct charge_command *out,
                                             struct charged_error *err)
{
    return charge_command_parse_as("charge.requested", 0, key, key_len, value,
                                   value_len, limits, out, err);
}

enum dead_letter_reason
charge_command_parse_as(const char *type, int manual, const void *key, size_t key_len,
                        const void *value, size_t value_len,
                        const struct charge_command_limits *limits,
                        struct charge_command *out, struct charged_error *err)
{
    enum dead_letter_reason r;
    json_t *doc = NULL;

    CHARGED_ASSERT(type && limits && out && err);
    memset(out, 0, sizeof(*out));
    out->manual = manual != 0;
    if ((r = command_fields_open(key, key_len, value, value_len, limits->max_bytes,
                                 &doc, err)) != DEAD_LETTER_NONE)
        return r;
    r = DEAD_LETTER_SCHEMA_VIOLATION;
    if (fields_read(doc, type, out, err))
        goto out;
    if ((r = command_fields_key_is(key, key_len, out->payment_attempt_id, err)) !=
        DEAD_LETTER_NONE)
        goto out;
    command_fields_lower(out->payment_attempt_id);
    command_fields_lower(out->order_id);
    if ((r = deployment_allows(out, limits, err)) != DEAD_LETTER_NONE)
        goto out;
    out->metadata_json = command_fields_metadata_json(json_object_get(doc, "metadata"));
    if (!out->metadata_json || fingerprint(out)) {
        r = DEAD_LETTER_SCHEMA_VIOLATION;
        charged_error_set(err, "out of memory");
        charge_command_release(out);
        goto out;
    }
    /* A valid command is whole: the amount in the contract's range. */
    CHARGED_ASSERT(out->amount >= 1 && out->amount <= limits->max_amount);
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
