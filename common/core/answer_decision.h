/* answer_decision: what follows a provider's answer to a record, as a value.
 *
 * One type for every payment operation: charge_policy_decide makes it from
 * its table, an operation's decide (engine_op) hands it to the worker's
 * engine, and a job carries it from its answer to its persist. Pure data:
 * no function of its own. */
#ifndef CHARGED_ANSWER_DECISION_H
#define CHARGED_ANSWER_DECISION_H

#include "attempt_status.h"

enum answer_next {
    ANSWER_NEXT_SETTLE = 0, /* persist status (and event) */
    ANSWER_NEXT_RETRY,      /* send again with the same key after retry_in_ms */
};

struct answer_decision {
    enum answer_next next;
    long long retry_in_ms;      /* RETRY: capped exponential back-off, jittered */
    enum attempt_status status; /* SETTLE */
    const char *event_type;     /* SETTLE: "charge.succeeded", ...; the engine
                                   sets the operation's own; NULL: none */
    long long next_check_ms;    /* SETTLE: reconciler's first look; -1: none */
    const char *reason_code;    /* SETTLE: "declined", "invalid_request",
                                   "outcome_unknown", "provider_processing",
                                   "requires_review"; NULL when succeeded */
};

#endif
