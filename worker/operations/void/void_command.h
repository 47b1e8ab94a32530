/* void_command: a void.requested (version 1) as the contract's
 * "Authorizations, captures and voids" says it, parsed and validated, and
 * what it asks fingerprinted; and the pure decisions of the void (what a
 * provider's answer to a cancel means, the reconciler's order of
 * evidence), so that tests can feed them anything.
 *
 * A command that breaks a rule comes back as a dead-letter reason with one
 * line of why (schema_violation for a bad field or an unknown reason,
 * key_mismatch when the message key is not its payment_attempt_id, the
 * envelope's reasons as for every command). Whether the authorization may
 * be voided is not a rule of the message: the database decides it when
 * the void is claimed (void_store.h). */
#ifndef CHARGED_VOID_COMMAND_H
#define CHARGED_VOID_COMMAND_H

#include <stddef.h>

#include "charged_error.h"
#include "dead_letter_reason.h"
#include "provider_outcome.h"
#include "reconcile_look.h"

#define VOID_COMMAND_TYPE "void.requested"

struct void_command {
    char void_id[37];            /* lower-case canonical UUID */
    char payment_attempt_id[37]; /* the authorization voided; the message key */
    char idempotency_key[129];
    char reason[24];      /* requested_by_customer, duplicate, fraudulent, abandoned */
    char *metadata_json;  /* the metadata object as JSON, "{}" when absent */
    char fingerprint[65]; /* SHA-256 hex of what is voided */
};

/* Validates key and value (max_bytes as a charge command's; 0 no limit).
 * DEAD_LETTER_NONE and *out filled (release with void_command_release), or
 * a reason and one line in err. */
enum dead_letter_reason void_command_parse(const void *key, size_t key_len,
                                           const void *value, size_t value_len,
                                           size_t max_bytes, struct void_command *out,
                                           struct charged_error *err);
void void_command_release(struct void_command *cmd);

/* ---- what the provider's answer to our cancel means ---- */

/* The reason code of a cancel the provider refused in the intent's state
 * (an INVALID answer): "void_after_capture" when the intent was captured
 * (succeeded: money moved that no capture of ours recorded),
 * "authorization_expired" when the provider canceled it itself
 * (automatic), "authorization_voided" when it was canceled otherwise,
 * "invalid_request" for any other refusal. */
const char *void_refusal_code(const struct provider_result *res);

/* The reconciler's order of evidence for a void (reconcile_look.h's
 * reconcile_order): while the provider keeps the void's key, the cancel
 * again under it (its answer or replay is ours: canceled SUCCEEDED, a
 * refusal FAILED with void_refusal_code, no answer: look again); past the
 * window, the intent by OUR recorded id (a->provider_payment_id):
 * canceled (not automatic) SUCCEEDED; requires_capture the cancel never
 * executed (FAILED never_executed: consistent, nothing of ours can still
 * execute); succeeded FAILED void_after_capture; canceled automatic
 * FAILED authorization_expired; unknown id REQUIRES_REVIEW. */
extern const struct reconcile_order void_look_order;

#endif
