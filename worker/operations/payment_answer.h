/* payment_answer: what a payment provider's answer means for a record, as
 * the engine's operations decide it (engine_op's decide and outcome).
 *
 * Pure: no clock, no I/O. Charges and refunds are decided by the same
 * table today (charge_policy: send again while nothing executed and the
 * key is kept, a bounded number of times when the outcome is unknown,
 * otherwise settle), and their outcomes say the same things: the reason
 * with the provider's own words, and the answer summarised as evidence. An
 * operation with rules of its own sets its own callbacks instead. The
 * simulation (tests/sim) links this library with the engine's core. */
#ifndef CHARGED_PAYMENT_ANSWER_H
#define CHARGED_PAYMENT_ANSWER_H

#include <stddef.h>

#include "engine_core.h"
#include "job.h"
#include "provider_outcome.h"

/* engine_decide_fn: charge_policy's table. */
struct answer_decision payment_answer_decide(int kind, const struct engine_policy *p,
                                             enum provider_outcome outcome,
                                             int may_replay, int tries,
                                             int key_window_open, unsigned jitter);

/* The outcome of a settled answer: its reason into reason ("" for none:
 * the decision's reason code with the provider's words, card digits
 * masked), *provider_id (the provider's object, "" none), and the
 * evidence, a compact JSON object the caller frees (NULL: out of memory).
 * calls: provider calls under the claim. */
char *payment_answer_outcome(int kind, const struct provider_result *res,
                             const struct answer_decision *d, int calls, char *reason,
                             size_t reason_size, const char **provider_id);

#endif
