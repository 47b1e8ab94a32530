#include "charge_command.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>
#include <uuid/uuid.h>

#include "card_data.h"
#include "utf8_text.h"

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

static int valid_key_chars(const char *s)
{
    size_t n = strlen(s);
    if (n < 1 || n > 128)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '.' && c != '_' && c != ':' && c != '-')
            return 0;
    }
    return 1;
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

/* SHA-256 over the charged parameters, each prefixed with its length, so
 * that no two different commands share one ("a|b" + "" against "a" + "b|"
 * could under a separator). 0, or -1 when OpenSSL could not (out of
 * memory): an empty fingerprint would be recorded as the attempt's. */
static int fingerprint(struct charge_command *c)
{
    char amount[32];
    const char *fields[] = {c->payment_attempt_id, c->order_id,       amount,
                            c->currency,           c->payment_method, c->customer_id};
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    int rc = -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();

    snprintf(amount, sizeof(amount), "%lld", c->amount);
    c->fingerprint[0] = '\0';
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ||
        !EVP_DigestUpdate(ctx, "v2", 2))
        goto out;
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        char len[24];
        int n = snprintf(len, sizeof(len), ";%zu:", strlen(fields[i]));
        if (!EVP_DigestUpdate(ctx, len, (size_t)n) ||
            !EVP_DigestUpdate(ctx, fields[i], strlen(fields[i])))
            goto out;
    }
    if (!EVP_DigestFinal_ex(ctx, md, &mdlen) || mdlen != 32)
        goto out;
    for (unsigned i = 0; i < mdlen; i++)
        snprintf(c->fingerprint + 2 * i, 3, "%02x", md[i]);
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    return rc;
}

/* Reads a required or optional string member into dst (size dst_size),
 * min..max characters long: code points, as JSON Schema counts them, so
 * that what the published schema accepts the worker accepts too. jansson
 * has checked the text is valid UTF-8. */
static int get_string(json_t *obj, const char *name, int required, size_t min,
                      size_t max, char *dst, size_t dst_size, char *errbuf,
                      size_t errbuf_size)
{
    json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v)) {
        if (required) {
            snprintf(errbuf, errbuf_size, "'%s' is missing", name);
            return -1;
        }
        dst[0] = '\0';
        return 0;
    }
    if (!json_is_string(v)) {
        snprintf(errbuf, errbuf_size, "'%s' must be a string", name);
        return -1;
    }
    size_t n = json_string_length(v);
    size_t chars = utf8_text_chars(json_string_value(v), n);
    if (chars < min || chars > max || n >= dst_size ||
        memchr(json_string_value(v), 0, n)) {
        snprintf(errbuf, errbuf_size, "'%s' must be %zu..%zu characters", name, min,
                 max);
        return -1;
    }
    memcpy(dst, json_string_value(v), n + 1);
    return 0;
}

static int check_metadata(json_t *md, char *errbuf, size_t errbuf_size)
{
    const char *k;
    json_t *v;
    if (!md || json_is_null(md))
        return 0;
    if (!json_is_object(md)) {
        snprintf(errbuf, errbuf_size, "'metadata' must be an object");
        return -1;
    }
    if (json_object_size(md) > 20) {
        snprintf(errbuf, errbuf_size, "'metadata' has more than 20 pairs");
        return -1;
    }
    json_object_foreach(md, k, v)
    {
        if (!json_is_string(v)) {
            snprintf(errbuf, errbuf_size, "'metadata' values must be strings");
            return -1;
        }
        size_t kc = utf8_text_chars(k, strlen(k));
        if (kc < 1 || kc > 40 ||
            utf8_text_chars(json_string_value(v), json_string_length(v)) > 500) {
            snprintf(errbuf, errbuf_size,
                     "'metadata' keys must be 1..40 and values at most 500 characters");
            return -1;
        }
    }
    return 0;
}

enum dead_letter_reason charge_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             const struct charge_command_limits *limits,
                                             struct charge_command *out, char *errbuf,
                                             size_t errbuf_size)
{
    enum dead_letter_reason r = DEAD_LETTER_SCHEMA_VIOLATION;
    json_error_t jerr;
    json_t *doc = NULL, *v;

    memset(out, 0, sizeof(*out));
    if (!value || value_len == 0) {
        snprintf(errbuf, errbuf_size, "the message has no value");
        return DEAD_LETTER_EMPTY_VALUE;
    }
    if (limits->max_bytes && value_len > limits->max_bytes) {
        snprintf(errbuf, errbuf_size,
                 "the value is %zu bytes, more than the %zu allowed", value_len,
                 limits->max_bytes);
        return DEAD_LETTER_OVERSIZED;
    }
    if (card_data_found(value, value_len) || card_data_found(key, key ? key_len : 0)) {
        snprintf(errbuf, errbuf_size,
                 "the command holds what looks like a card number; commands carry "
                 "provider tokens only");
        return DEAD_LETTER_CARD_DATA;
    }
    doc = json_loadb(value, value_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc && json_error_code(&jerr) == json_error_invalid_utf8) {
        /* jansson reads the whole value strictly: no overlongs, no
         * surrogates, nothing above U+10FFFF. */
        snprintf(errbuf, errbuf_size, "the value is not valid UTF-8");
        return DEAD_LETTER_INVALID_UTF8;
    }
    if (!doc) {
        snprintf(errbuf, errbuf_size, "not JSON: %s at line %d column %d", jerr.text,
                 jerr.line, jerr.column);
        card_data_mask(errbuf, strlen(errbuf));
        return DEAD_LETTER_MALFORMED_JSON;
    }
    if (!json_is_object(doc)) {
        snprintf(errbuf, errbuf_size, "the value must be a JSON object");
        goto out;
    }
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
    if (get_string(doc, "payment_attempt_id", 1, 36, 36, out->payment_attempt_id,
                   sizeof(out->payment_attempt_id), errbuf, errbuf_size) ||
        get_string(doc, "order_id", 1, 36, 36, out->order_id, sizeof(out->order_id),
                   errbuf, errbuf_size))
        goto out;
    if (!charge_command_is_uuid(out->payment_attempt_id)) {
        snprintf(errbuf, errbuf_size, "'payment_attempt_id' must be a UUID");
        goto out;
    }
    if (!charge_command_is_uuid(out->order_id)) {
        snprintf(errbuf, errbuf_size, "'order_id' must be a UUID");
        goto out;
    }
    if (get_string(doc, "idempotency_key", 1, 1, 128, out->idempotency_key,
                   sizeof(out->idempotency_key), errbuf, errbuf_size))
        goto out;
    if (!valid_key_chars(out->idempotency_key)) {
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
    if (get_string(doc, "currency", 1, 3, 3, out->currency, sizeof(out->currency),
                   errbuf, errbuf_size))
        goto out;
    if (!isupper((unsigned char)out->currency[0]) ||
        !isupper((unsigned char)out->currency[1]) ||
        !isupper((unsigned char)out->currency[2]) || !strstr(iso4217, out->currency)) {
        snprintf(errbuf, errbuf_size,
                 "'currency' must be an ISO 4217 code in upper case, not '%s'",
                 out->currency);
        goto out;
    }
    if (get_string(doc, "payment_method", 1, 1, CHARGE_COMMAND_TEXT_CHARS,
                   out->payment_method, sizeof(out->payment_method), errbuf,
                   errbuf_size) ||
        get_string(doc, "customer_id", 0, 1, CHARGE_COMMAND_TEXT_CHARS,
                   out->customer_id, sizeof(out->customer_id), errbuf, errbuf_size))
        goto out;
    v = json_object_get(doc, "metadata");
    if (check_metadata(v, errbuf, errbuf_size))
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
