/* command_fields: the rules every command message shares (the contract's
 * charge and refund commands): the value's envelope, bounded strings,
 * idempotency keys and metadata. Each check that fails writes one line of
 * why to err, never quoting the value (it may hold card digits). A check
 * refuses with CHARGED_BAD_ITEM: the message is dead-lettered. */
#ifndef CHARGED_COMMAND_FIELDS_H
#define CHARGED_COMMAND_FIELDS_H

#include <stddef.h>

#include <jansson.h>

#include "charged_error.h"
#include "dead_letter_reason.h"

/* The value as a JSON object in *doc (the caller json_decref()s it), or a
 * reason: empty, oversized (past max_bytes; 0 is no limit), card data in
 * key or value, invalid UTF-8, malformed JSON, not an object. */
enum dead_letter_reason command_fields_open(const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            size_t max_bytes, json_t **doc,
                                            struct charged_error *err);
/* 1 if the value is a JSON object whose "type" is `type`: which command a
 * message is, for the operation that parses it. */
int command_fields_type_is(const void *value, size_t value_len, const char *type);

/* A required or optional string member into dst (size dst_size), min..max
 * characters (code points, as JSON Schema counts them). CHARGED_OK, or
 * CHARGED_BAD_ITEM. An
 * absent optional member is "". */
enum charged_rc command_fields_string(json_t *obj, const char *name, int required,
                                      size_t min, size_t max, char *dst,
                                      size_t dst_size, struct charged_error *err);
/* 1 if s is 1..128 characters of [A-Za-z0-9._:-]. */
int command_fields_key_ok(const char *s);
/* An optional metadata object: at most 20 string pairs, keys 1..40 and
 * values at most 500 characters. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
enum charged_rc command_fields_metadata(json_t *md, struct charged_error *err);
/* The members every command opens with: "type" is `type` and "version"
 * the integer 1. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
enum charged_rc command_fields_header(json_t *doc, const char *type,
                                      struct charged_error *err);
/* 1 if s is a UUID in its 36-character form. */
int command_fields_is_uuid(const char *s);
/* Two required UUID members, name_a into a and name_b into b: both are read
 * before either is checked, so that the first fault said is the same for
 * every command. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
enum charged_rc command_fields_uuids(json_t *doc, const char *name_a, char a[37],
                                     const char *name_b, char b[37],
                                     struct charged_error *err);
/* The required "idempotency_key" (command_fields_key_ok) into key. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
enum charged_rc command_fields_idempotency_key(json_t *doc, char key[129],
                                               struct charged_error *err);
/* The required "amount": an integer of minor units, 1..100000000000, into
 * *amount. CHARGED_OK, or
 * CHARGED_BAD_ITEM. */
enum charged_rc command_fields_amount(json_t *doc, long long *amount,
                                      struct charged_error *err);
/* The message's key is the command's payment_attempt_id (36 bytes, as the
 * command writes it): DEAD_LETTER_NONE, or DEAD_LETTER_KEY_MISMATCH. */
enum dead_letter_reason command_fields_key_is(const void *key, size_t key_len,
                                              const char *payment_attempt_id,
                                              struct charged_error *err);
/* A UUID made canonical: lower case, in place. */
void command_fields_lower(char *s);
/* The metadata (checked by command_fields_metadata) as the compact JSON
 * recorded, keys sorted; "{}" when there is none. NULL when out of
 * memory; the caller frees it. */
char *command_fields_metadata_json(json_t *md);
/* SHA-256 hex over the fields, each prefixed with its length, so that no
 * two different commands share one ("a|b" + "" against "a" + "b|" could
 * under a separator). 0, or -1 when OpenSSL could not (out of memory): an
 * empty fingerprint must never be recorded as a command's. */
int command_fields_fingerprint(const char *const *fields, size_t n, char out[65]);

#endif
