/* charge_op: the charge as an operation of the engine (engine.h), and what
 * a charge sends under an attempt's key for every role that sends one (the
 * worker's call and its retries, the reconciler's charge again). One place,
 * so that two roles can never send different parameters under one key. */
#ifndef CHARGED_CHARGE_OP_H
#define CHARGED_CHARGE_OP_H

#include "attempt_store.h"
#include "engine.h"
#include "provider_client.h"

/* The charge's descriptor: charge commands (charge_command.h) recorded,
 * claimed and settled as payment attempts (attempt_store.h). */
extern const struct engine_op charge_op;

/* The request for the stored attempt p (never the message's copy):
 * op_attempts_request (op_shared.h), which an authorization's attempt
 * sends as one. The strings point into p and attempt_id, which must
 * outlive the call. */
struct provider_charge charge_op_request(const struct attempt_params *p,
                                         const char *attempt_id);

#endif
