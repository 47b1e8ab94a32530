/* batch_gate: when a database stage of the worker's loop runs its
 * statement. Without I/O: the engine and the simulation ask it alike.
 *
 * Nagle's rule, for statements: a stage runs at most one statement per
 * hold_ms, unless a full batch waits. When items come further apart than
 * hold_ms (low load) each goes at once, as soon as the loop wakes for it;
 * under load they gather for at most hold_ms, so statements per charge fall
 * as the rate rises, and no item waits longer than hold_ms for the gate.
 * A statement's fixed cost is most of a small batch's (docs/scaling.md):
 * without the gate a loop that wakes per answer pays it per charge. */
#ifndef CHARGED_BATCH_GATE_H
#define CHARGED_BATCH_GATE_H

#include <stddef.h>
#include <stdint.h>

struct batch_gate {
    int64_t hold_ms; /* 0: every item at once */
    size_t full;     /* this many waiting go at once */
    int64_t last_ms; /* when the stage last ran a statement */
    int ran;         /* it has run one */
};

void batch_gate_init(struct batch_gate *g, int64_t hold_ms, size_t full);
/* When the stage may run with `waiting` items ready: at or before now, at
 * once; INT64_MAX with none waiting. */
int64_t batch_gate_due_at(const struct batch_gate *g, size_t waiting, int64_t now);
/* The stage ran a statement at now. */
void batch_gate_ran(struct batch_gate *g, int64_t now);
/* Until when the gate holds whatever comes (it ran a statement within a
 * hold): a loop whose every gate holds may read nothing before the first
 * ends, since nothing read could be written sooner. now when it holds
 * nothing. */
int64_t batch_gate_holds_until(const struct batch_gate *g, int64_t now);

#endif
