/* payment_ops: the operations of the payment commands topic, as one
 * engine descriptor. Charges and their refunds share one topic, keyed by
 * the payment attempt, so that a refund follows its charge in one
 * partition; each message is parsed by the operation its `type` names,
 * and every batch the engine hands over is routed, item by item, to that
 * operation's own descriptor. The operations are the table's (op.h,
 * operations.c): no kind is named here. */
#ifndef CHARGED_PAYMENT_OPS_H
#define CHARGED_PAYMENT_OPS_H

#include "engine.h"

extern const struct engine_op payment_ops;

#endif
