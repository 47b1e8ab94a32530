/* charge: the charge's parts, for its line of the table (charge.c). */
#ifndef CHARGED_CHARGE_H
#define CHARGED_CHARGE_H

#include "op.h"

/* The reconciler's look at an attempt (charge_reconcile.c). */
extern const struct op_reconcile charge_reconcile;
/* The api's webhook events about a charge (charge_webhook.c). */
extern const struct op_webhook charge_webhook;

#endif
