/* void_op: a second operation of the engine, for tests only: the void of a
 * payment intent (POST /v1/payment_intents/<id>/cancel) under a stable
 * idempotency key, recorded in tables of its own.
 *
 * It exists to show that an operation is a descriptor and nothing more:
 * the engine (worker/pipeline/engine.c) runs it unchanged, with its
 * batches, leases, fencing, hand-back, key window, breaker and dead
 * letters. It is what the refund's descriptor will look like, over a store
 * written for the test.
 *
 * A void command is a JSON object keyed by its void_id:
 *   {"void_id": uuid, "payment_intent_id": "pi_...", "idempotency_key": str}
 * The store is void_op_schema's three tables in DATABASE_URL's database. */
#ifndef CHARGED_VOID_OP_H
#define CHARGED_VOID_OP_H

#include "engine.h"

extern const struct engine_op void_op;

/* The statements (NULL-terminated) that create the tables the
 * descriptor's store uses: voids (one row a void, its status and lease),
 * void_calls (every provider call) and void_events (one row a
 * settlement's event). */
extern const char *const void_op_schema[];

#endif
