/* charge_command: parses and validates a charge command message against the
 * contract, and fingerprints what it asks to charge.
 *
 * Anything that breaks a rule comes back as a dead-letter reason with one
 * line of why; that line never quotes the value (it may hold card digits). */
#ifndef CHARGED_CHARGE_COMMAND_H
#define CHARGED_CHARGE_COMMAND_H

#include <stddef.h>

#include "charged_error.h"
#include "dead_letter_reason.h"

/* The contract bounds text in characters; a character of UTF-8 is at most
 * 4 bytes, so that is how large the buffers are. */
#define CHARGE_COMMAND_TEXT_CHARS 255
#define CHARGE_COMMAND_TEXT_SIZE  (CHARGE_COMMAND_TEXT_CHARS * 4 + 1)

struct charge_command {
    char payment_attempt_id[37]; /* lower-case canonical UUID */
    char order_id[37];
    char idempotency_key[129];
    long long amount;
    char currency[4];
    char payment_method[CHARGE_COMMAND_TEXT_SIZE];
    char customer_id[CHARGE_COMMAND_TEXT_SIZE]; /* "" when absent */
    char *metadata_json;  /* the metadata object as JSON, "{}" when absent */
    char fingerprint[65]; /* SHA-256 hex of the charged parameters */
    int manual; /* an authorization (capture_method manual): the money is held,
                   not taken; part of the fingerprint */
};

/* Limits a deployment sets on top of the contract's rules. */
struct charge_command_limits {
    size_t max_bytes;               /* larger values are "oversized" */
    long long max_amount;           /* above it: "amount_over_limit" */
    const char *allowed_currencies; /* "EUR,USD"; NULL or "" allows all */
};

/* Validates key and value. Returns DEAD_LETTER_NONE and fills *out (release
 * with charge_command_release), or a reason and one line in err. */
enum dead_letter_reason charge_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             const struct charge_command_limits *limits,
                                             struct charge_command *out,
                                             struct charged_error *err);

/* The same for a command of a charge's fields under another type: an
 * authorization.requested (manual 1: out->manual set, and its fingerprint
 * tells it from a charge of the same parameters, so that one attempt is
 * never both). charge_command_parse is this with "charge.requested", 0. */
enum dead_letter_reason
charge_command_parse_as(const char *type, int manual, const void *key, size_t key_len,
                        const void *value, size_t value_len,
                        const struct charge_command_limits *limits,
                        struct charge_command *out, struct charged_error *err);

void charge_command_release(struct charge_command *cmd);

/* 1 if s is a UUID (8-4-4-4-12 hex digits). */
int charge_command_is_uuid(const char *s);

#endif
