/* capture_command: parses and validates a capture command message
 * (capture.requested, version 1) against the contract ("Authorizations,
 * captures and voids"), and fingerprints what it asks to capture.
 *
 * Anything that breaks a rule comes back as a dead-letter reason with one
 * line of why, as a refund command's. Whether the amount is still
 * capturable is not a rule of the message: the database decides it when
 * the capture is claimed (capture_store.h). Pure: no I/O. */
#ifndef CHARGED_CAPTURE_COMMAND_H
#define CHARGED_CAPTURE_COMMAND_H

#include <stddef.h>

#include "charged_error.h"
#include "dead_letter_reason.h"

#define CAPTURE_COMMAND_TYPE "capture.requested"

struct capture_command {
    char capture_id[37];         /* lower-case canonical UUID */
    char payment_attempt_id[37]; /* the authorization captured; the message key */
    char idempotency_key[129];
    long long amount;     /* 1..100000000000; 0: absent, all that is held */
    char *metadata_json;  /* the metadata object as JSON, "{}" when absent */
    char fingerprint[65]; /* SHA-256 hex of the captured parameters */
};

/* Validates key and value (max_bytes as a charge command's; 0 no limit).
 * Returns DEAD_LETTER_NONE and fills *out (release with
 * capture_command_release), or a reason and one line in err. */
enum dead_letter_reason capture_command_parse(const void *key, size_t key_len,
                                              const void *value, size_t value_len,
                                              size_t max_bytes,
                                              struct capture_command *out,
                                              struct charged_error *err);

void capture_command_release(struct capture_command *cmd);

#endif
