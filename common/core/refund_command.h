/* refund_command: parses and validates a refund command message
 * (refund.requested, version 1) against the contract, and fingerprints what
 * it asks to refund.
 *
 * Anything that breaks a rule comes back as a dead-letter reason with one
 * line of why. Whether the amount is still refundable is not a rule of the
 * message: the database decides it when the refund is claimed. */
#ifndef CHARGED_REFUND_COMMAND_H
#define CHARGED_REFUND_COMMAND_H

#include <stddef.h>

#include "charged_error.h"
#include "dead_letter_reason.h"

#define REFUND_COMMAND_TYPE "refund.requested"

struct refund_command {
    char refund_id[37];          /* lower-case canonical UUID */
    char payment_attempt_id[37]; /* the charge refunded; the message key */
    char idempotency_key[129];
    long long amount;
    char reason[24];      /* requested_by_customer, duplicate, fraudulent */
    char *metadata_json;  /* the metadata object as JSON, "{}" when absent */
    char fingerprint[65]; /* SHA-256 hex of the refunded parameters */
};

/* Validates key and value (max_bytes as a charge command's; 0 no limit).
 * Returns DEAD_LETTER_NONE and fills *out (release with
 * refund_command_release), or a reason and one line in err. */
enum dead_letter_reason refund_command_parse(const void *key, size_t key_len,
                                             const void *value, size_t value_len,
                                             size_t max_bytes,
                                             struct refund_command *out,
                                             struct charged_error *err);

void refund_command_release(struct refund_command *cmd);

#endif
