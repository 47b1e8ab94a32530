#include "command_fields.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>
#include <uuid/uuid.h>

#include "charged_assert.h"
#include "card_data.h"
#include "utf8_text.h"

int command_fields_key_ok(const char *s)
{
    CHARGED_ASSERT(s);
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

/* Reads a required or optional string member into dst (size dst_size),
 * min..max characters long: code points, as JSON Schema counts them, so
 * that what the published schema accepts the worker accepts too. jansson
 * has checked the text is valid UTF-8. */
enum charged_rc command_fields_string(json_t *obj, const char *name, int required,
                                      size_t min, size_t max, char *dst,
                                      size_t dst_size, struct charged_error *err)
{
    CHARGED_ASSERT(name && dst && dst_size > 0 && min <= max);
    json_t *v = json_object_get(obj, name);
    if (!v || json_is_null(v)) {
        if (required) {
            charged_error_set(err, "'%s' is missing", name);
            return CHARGED_BAD_ITEM;
        }
        dst[0] = '\0';
        return CHARGED_OK;
    }
    if (!json_is_string(v)) {
        charged_error_set(err, "'%s' must be a string", name);
        return CHARGED_BAD_ITEM;
    }
    size_t n = json_string_length(v);
    size_t chars = utf8_text_chars(json_string_value(v), n);
    if (chars < min || chars > max || n >= dst_size ||
        memchr(json_string_value(v), 0, n)) {
        charged_error_set(err, "'%s' must be %zu..%zu characters", name, min, max);
        return CHARGED_BAD_ITEM;
    }
    memcpy(dst, json_string_value(v), n + 1);
    return CHARGED_OK;
}

enum charged_rc command_fields_metadata(json_t *md, struct charged_error *err)
{
    const char *k;
    json_t *v;
    CHARGED_ASSERT(err);
    if (!md || json_is_null(md))
        return CHARGED_OK;
    if (!json_is_object(md)) {
        charged_error_set(err, "'metadata' must be an object");
        return CHARGED_BAD_ITEM;
    }
    if (json_object_size(md) > 20) {
        charged_error_set(err, "'metadata' has more than 20 pairs");
        return CHARGED_BAD_ITEM;
    }
    json_object_foreach(md, k, v)
    {
        if (!json_is_string(v)) {
            charged_error_set(err, "'metadata' values must be strings");
            return CHARGED_BAD_ITEM;
        }
        size_t kc = utf8_text_chars(k, strlen(k));
        if (kc < 1 || kc > 40 ||
            utf8_text_chars(json_string_value(v), json_string_length(v)) > 500) {
            charged_error_set(
                err, "'metadata' keys must be 1..40 and values at most 500 characters");
            return CHARGED_BAD_ITEM;
        }
    }
    return CHARGED_OK;
}

enum dead_letter_reason command_fields_open(const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            size_t max_bytes, json_t **doc,
                                            struct charged_error *err)
{
    json_error_t jerr;
    CHARGED_ASSERT(doc && err);
    *doc = NULL;
    if (!value || value_len == 0) {
        charged_error_set(err, "the message has no value");
        return DEAD_LETTER_EMPTY_VALUE;
    }
    if (max_bytes && value_len > max_bytes) {
        charged_error_set(err, "the value is %zu bytes, more than the %zu allowed",
                          value_len, max_bytes);
        return DEAD_LETTER_OVERSIZED;
    }
    if (card_data_found(value, value_len) || card_data_found(key, key ? key_len : 0)) {
        charged_error_set(
            err, "the command holds what looks like a card number; commands carry "
                 "provider tokens only");
        return DEAD_LETTER_CARD_DATA;
    }
    json_t *d = json_loadb(value, value_len, JSON_REJECT_DUPLICATES, &jerr);
    if (!d && json_error_code(&jerr) == json_error_invalid_utf8) {
        /* jansson reads the whole value strictly: no overlongs, no
         * surrogates, nothing above U+10FFFF. */
        charged_error_set(err, "the value is not valid UTF-8");
        return DEAD_LETTER_INVALID_UTF8;
    }
    if (!d) {
        charged_error_set(err, "not JSON: %s at line %d column %d", jerr.text,
                          jerr.line, jerr.column);
        card_data_mask(err->message, strlen(err->message));
        return DEAD_LETTER_MALFORMED_JSON;
    }
    if (!json_is_object(d)) {
        json_decref(d);
        charged_error_set(err, "the value must be a JSON object");
        return DEAD_LETTER_SCHEMA_VIOLATION;
    }
    *doc = d;
    return DEAD_LETTER_NONE;
}

int command_fields_type_is(const void *value, size_t value_len, const char *type)
{
    CHARGED_ASSERT(type);
    json_t *d =
        value ? json_loadb(value, value_len, JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *t = json_object_get(d, "type");
    int is = json_is_string(t) && !strcmp(json_string_value(t), type);
    json_decref(d);
    return is;
}

int command_fields_fingerprint(const char *const *fields, size_t n, char out[65])
{
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned mdlen = 0;
    int rc = -1;
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();

    CHARGED_ASSERT(fields && n > 0 && out);
    out[0] = '\0';
    if (!ctx || !EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) ||
        !EVP_DigestUpdate(ctx, "v2", 2))
        goto out;
    for (size_t i = 0; i < n; i++) {
        char len[24];
        int k = snprintf(len, sizeof(len), ";%zu:", strlen(fields[i]));
        if (!EVP_DigestUpdate(ctx, len, (size_t)k) ||
            !EVP_DigestUpdate(ctx, fields[i], strlen(fields[i])))
            goto out;
    }
    if (!EVP_DigestFinal_ex(ctx, md, &mdlen) || mdlen != 32)
        goto out;
    for (unsigned i = 0; i < mdlen; i++)
        snprintf(out + 2 * i, 3, "%02x", md[i]);
    CHARGED_ASSERT(strlen(out) == 64); /* never an empty or a cut fingerprint */
    rc = 0;
out:
    EVP_MD_CTX_free(ctx);
    return rc;
}

enum charged_rc command_fields_header(json_t *doc, const char *type,
                                      struct charged_error *err)
{
    CHARGED_ASSERT(doc && type);
    json_t *v = json_object_get(doc, "type");
    if (!json_is_string(v) || strcmp(json_string_value(v), type) != 0) {
        charged_error_set(err, "'type' must be \"%s\"", type);
        return CHARGED_BAD_ITEM;
    }
    v = json_object_get(doc, "version");
    if (!json_is_integer(v) || json_integer_value(v) != 1) {
        charged_error_set(err, "'version' must be the integer 1");
        return CHARGED_BAD_ITEM;
    }
    return CHARGED_OK;
}

int command_fields_is_uuid(const char *s)
{
    uuid_t u;
    /* uuid_parse reads the 36-character form and nothing else. */
    return s && strlen(s) == 36 && uuid_parse(s, u) == 0;
}

enum charged_rc command_fields_uuids(json_t *doc, const char *name_a, char a[37],
                                     const char *name_b, char b[37],
                                     struct charged_error *err)
{
    CHARGED_ASSERT(name_a && name_b && a && b);
    if (command_fields_string(doc, name_a, 1, 36, 36, a, 37, err) ||
        command_fields_string(doc, name_b, 1, 36, 36, b, 37, err))
        return CHARGED_BAD_ITEM;
    const char *bad = !command_fields_is_uuid(a)   ? name_a
                      : !command_fields_is_uuid(b) ? name_b
                                                   : NULL;
    if (bad) {
        charged_error_set(err, "'%s' must be a UUID", bad);
        return CHARGED_BAD_ITEM;
    }
    return CHARGED_OK;
}

enum charged_rc command_fields_idempotency_key(json_t *doc, char key[129],
                                               struct charged_error *err)
{
    if (command_fields_string(doc, "idempotency_key", 1, 1, 128, key, 129, err))
        return CHARGED_BAD_ITEM;
    if (!command_fields_key_ok(key)) {
        charged_error_set(
            err, "'idempotency_key' must be 1..128 characters of [A-Za-z0-9._:-]");
        return CHARGED_BAD_ITEM;
    }
    return CHARGED_OK;
}

enum charged_rc command_fields_amount(json_t *doc, long long *amount,
                                      struct charged_error *err)
{
    CHARGED_ASSERT(amount);
    json_t *v = json_object_get(doc, "amount");
    if (!json_is_integer(v)) {
        charged_error_set(err, "'amount' must be an integer (minor units)");
        return CHARGED_BAD_ITEM;
    }
    *amount = json_integer_value(v);
    if (*amount < 1 || *amount > 100000000000LL) {
        charged_error_set(err, "'amount' %lld is outside 1..100000000000", *amount);
        return CHARGED_BAD_ITEM;
    }
    return CHARGED_OK;
}

enum dead_letter_reason command_fields_key_is(const void *key, size_t key_len,
                                              const char *payment_attempt_id,
                                              struct charged_error *err)
{
    CHARGED_ASSERT(payment_attempt_id && err);
    if (!key) {
        charged_error_set(err,
                          "the message has no key; it must be the payment_attempt_id");
        return DEAD_LETTER_KEY_MISMATCH;
    }
    if (key_len != 36 || memcmp(key, payment_attempt_id, 36) != 0) {
        charged_error_set(err, "the message key is not the payment_attempt_id");
        return DEAD_LETTER_KEY_MISMATCH;
    }
    return DEAD_LETTER_NONE;
}

void command_fields_lower(char *s)
{
    CHARGED_ASSERT(s);
    for (; *s; s++)
        *s = (char)tolower((unsigned char)*s);
}

char *command_fields_metadata_json(json_t *md)
{
    return json_is_object(md) ? json_dumps(md, JSON_COMPACT | JSON_SORT_KEYS)
                              : strdup("{}");
}
