/* budget_gate: one process's spending of the share it holds of the fleet's
 * provider budget, pure (the clock is passed in, in ms of a monotonic
 * clock; no I/O, no lock: one thread calls it).
 *
 * A token bucket per endpoint class and one for the global share, each
 * filled at its share's rate and holding at most BUDGET_GATE_BURST_MS of
 * it (at least one request: with 0, one); buckets start empty, and a share
 * lowered caps the tokens at once. A caller asks "may I send a request of this class,
 * for this priority, now?" and gets 0 (yes: the tokens are taken) or how
 * long to wait before asking again. Waiters are served by priority: a
 * refused caller is counted as waiting (its ticket) until it is let
 * through or forgets, and a request of a lower priority goes only when the
 * tokens cover every waiter above it whose class has a token. The audit
 * floor (the floor part of the share) is a bucket of the audit's own,
 * filled at the floor's rate while the global bucket fills at the rest:
 * with a floor token an audit request goes ahead of every waiter, and an
 * audit request without one competes in the global bucket as the lowest
 * priority. A request that arrived twice (re-sent by the HTTP client) is
 * charged its extra tokens after the fact (budget_gate_charge): a bucket
 * may then hold less than nothing, and the next asks wait until it has
 * filled back. Past the
 * lease (valid_until_ms) nothing goes: a process that stopped renewing its
 * share stops spending it before the fleet gives it to another. */
#ifndef CHARGED_BUDGET_GATE_H
#define CHARGED_BUDGET_GATE_H

#include "budget_alloc.h"

/* A bucket holds this much of its share's rate, and at least one
 * request: a gate of rate R sends at most R + R/5 in any second (one
 * request more below 5/s), which the provider's bucket of R takes. An
 * engine asks for a turn's calls at one now, and a turn under load takes
 * tens of ms: with a bucket of one request (0 here, before adversary 38f)
 * a worker sent one a turn, 70-142/s under a share of 500, and never more
 * than one a ms; at 50 ms, 640/s under 2,000. A caller that asks late
 * still loses the time beyond the burst (the engine parks a job for
 * exactly the wait it was given). */
#define BUDGET_GATE_BURST_MS 200
/* The longest wait the gate answers: with no share (0, or past the lease)
 * the caller asks again after it, when a refresh may have given one. */
#define BUDGET_GATE_WAIT_MAX_MS 250
/* The most requests one budget_gate_charge takes (it bounds the debt's
 * arithmetic; a caller counting more charges in steps). */
#define BUDGET_GATE_CHARGE_MAX 1000

/* Rates in mrps (BUDGET_UNLIMITED: always a token); tokens in millionths
 * of a request, so that 1 mrps fills 1 per ms. */
struct budget_bucket {
    long long rate_mrps;
    long long tokens;
    long long cap;
};

struct budget_gate {
    struct budget_bucket cls[BUDGET_CLASS_COUNT], global, floor;
    int waiting[BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT];
    long long last_ms;
    long long valid_until_ms;
};

/* One caller's place among the waiters: set class and priority, waiting 0,
 * and keep it across its asks of one request. */
struct budget_ticket {
    enum budget_class cls;
    enum budget_priority prio;
    int waiting;
};

/* A gate with no share (every ask waits) at now_ms. */
void budget_gate_init(struct budget_gate *g, long long now_ms);

/* The share held from now until valid_until_ms (the lease, on this
 * process's clock). A rate lowered caps its bucket's tokens at once;
 * raised, the bucket fills from now. */
void budget_gate_set_share(struct budget_gate *g, const struct budget_share *share,
                           long long valid_until_ms, long long now_ms);

/* 0: send now (a token of the class and of the global bucket taken, or
 * for audit of the floor bucket; the ticket no longer waits). Else the wait in ms (1 ..
 * BUDGET_GATE_WAIT_MAX_MS) before asking again with the same ticket. */
long long budget_gate_ask(struct budget_gate *g, struct budget_ticket *t,
                          long long now_ms);

/* n more requests of class cls reached the provider without an ask (the
 * HTTP client re-sent one after a pooled connection closed unanswered):
 * their tokens are taken after the fact from the class's and the global
 * bucket, below zero if need be, so that the next asks wait them out.
 * Every arrival is paid for; an unlimited bucket takes nothing. */
void budget_gate_charge(struct budget_gate *g, enum budget_class cls, int n,
                        long long now_ms);

/* The caller gives up the request (a job cancelled): its ticket stops
 * counting as a waiter. */
void budget_gate_forget(struct budget_gate *g, struct budget_ticket *t);

#endif
