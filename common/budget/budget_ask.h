/* budget_ask: one request as it waits for a process's share of the fleet's
 * provider budget (budget_member_ask), pure: the gate's ticket, and when it
 * was first asked for (the demand counts it once; the wait is measured
 * from it). The worker keeps one in each job (job.h). */
#ifndef CHARGED_BUDGET_ASK_H
#define CHARGED_BUDGET_ASK_H

#include "budget_gate.h"

/* Set cls and prio with budget_member_ask_init (zero: create, capture);
 * keep it across the asks of one request. */
struct budget_ask {
    struct budget_ticket t;
    long long first_ms; /* its first ask (for the demand and the wait) */
    int asked;          /* counted in the demand already */
};

#endif
