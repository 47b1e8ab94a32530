/* refund: the refund's parts, for its line of the table (refund.c). */
#ifndef CHARGED_REFUND_H
#define CHARGED_REFUND_H

#include "op.h"

/* The reconciler's look at a refund (refund_reconcile.c). */
extern const struct op_reconcile refund_reconcile;
/* The api's webhook events about refunds (refund_webhook.c). */
extern const struct op_webhook refund_webhook;

#endif
