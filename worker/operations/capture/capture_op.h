/* capture_op: the capture as an operation of the engine (engine.h), what a
 * capture sends under its key for every role that sends one (the worker's
 * call and its retries, the reconciler's capture again), and what the
 * provider's refusal of a capture means. */
#ifndef CHARGED_CAPTURE_OP_H
#define CHARGED_CAPTURE_OP_H

#include "capture_store.h"
#include "engine.h"
#include "provider_client.h"

/* capture.requested recorded, claimed with the hold and settled as capture
 * attempts (capture_store.h). */
extern const struct engine_op capture_op;

/* The request for the stored capture p (never the message's copy). The
 * strings point into p, which must outlive the call. */
struct provider_capture capture_op_request(const struct capture_params *p);

/* The reason code of a capture the provider refused (INVALID): the intent
 * canceled by the provider's own expiry (cancellation_reason "automatic",
 * or none said) is "authorization_expired", canceled otherwise "voided",
 * captured already "already_captured"; anything else "invalid_request".
 * Pure (capture_look.c: the simulation links it with the look). */
const char *capture_refusal_code(const struct provider_result *res);

#endif
