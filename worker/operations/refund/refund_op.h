/* refund_op: the refund as an operation of the engine (engine.h), and what
 * a refund sends under its key for every role that sends one (the worker's
 * call and its retries, the reconciler's refund again). */
#ifndef CHARGED_REFUND_OP_H
#define CHARGED_REFUND_OP_H

#include "engine.h"
#include "provider_client.h"
#include "refund_store.h"

/* Refund commands (refund_command.h) recorded, claimed with their
 * reservation and settled as refund attempts (refund_store.h). */
extern const struct engine_op refund_op;

/* The request for the stored refund p (never the message's copy). The
 * strings point into p and refund_id, which must outlive the call. */
struct provider_refund refund_op_request(const struct refund_params *p,
                                         const char *refund_id);

#endif
