/* command_fields: the rules every command message shares (the contract's
 * charge and refund commands): the value's envelope, bounded strings,
 * idempotency keys and metadata. Each check that fails writes one line of
 * why to errbuf, never quoting the value (it may hold card digits). */
#ifndef CHARGED_COMMAND_FIELDS_H
#define CHARGED_COMMAND_FIELDS_H

#include <stddef.h>

#include <jansson.h>

#include "dead_letter_reason.h"

/* The value as a JSON object in *doc (the caller json_decref()s it), or a
 * reason: empty, oversized (past max_bytes; 0 is no limit), card data in
 * key or value, invalid UTF-8, malformed JSON, not an object. */
enum dead_letter_reason command_fields_open(const void *key, size_t key_len,
                                            const void *value, size_t value_len,
                                            size_t max_bytes, json_t **doc,
                                            char *errbuf, size_t errbuf_size);
/* 1 if the value is a JSON object whose "type" is `type`: which command a
 * message is, for the operation that parses it. */
int command_fields_type_is(const void *value, size_t value_len, const char *type);

/* A required or optional string member into dst (size dst_size), min..max
 * characters (code points, as JSON Schema counts them). 0, or -1. An
 * absent optional member is "". */
int command_fields_string(json_t *obj, const char *name, int required, size_t min,
                          size_t max, char *dst, size_t dst_size, char *errbuf,
                          size_t errbuf_size);
/* 1 if s is 1..128 characters of [A-Za-z0-9._:-]. */
int command_fields_key_ok(const char *s);
/* An optional metadata object: at most 20 string pairs, keys 1..40 and
 * values at most 500 characters. 0, or -1. */
int command_fields_metadata(json_t *md, char *errbuf, size_t errbuf_size);
/* SHA-256 hex over the fields, each prefixed with its length, so that no
 * two different commands share one ("a|b" + "" against "a" + "b|" could
 * under a separator). 0, or -1 when OpenSSL could not (out of memory): an
 * empty fingerprint must never be recorded as a command's. */
int command_fields_fingerprint(const char *const *fields, size_t n, char out[65]);

#endif
