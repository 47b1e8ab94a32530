/* charge_op: what a charge sends and records under an attempt's key, for
 * every role that sends one (the worker's call and its retries, the
 * reconciler's charge again). One place, so that two roles can never send
 * different parameters under one key. */
#ifndef CHARGED_CHARGE_OP_H
#define CHARGED_CHARGE_OP_H

#include "attempt_store.h"
#include "provider_client.h"

/* The request for the stored attempt p (never the message's copy). The
 * strings point into p and attempt_id, which must outlive the call. */
struct provider_charge charge_op_request(const struct attempt_params *p,
                                         const char *attempt_id);

/* The answer a pooled connection lost when the HTTP client sent the
 * request again itself, with the same key: the first try may have
 * executed, so it is recorded as a call of its own, outcome unknown. */
struct provider_result charge_op_lost_answer(void);

#endif
