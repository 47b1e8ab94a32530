/* The charge in every role (op.h): its line of the table. */
#include "charge.h"

#include "attempt_store.h"
#include "charge_command.h"
#include "charge_op.h"

_Static_assert(sizeof(struct charge_command) <= PAYMENT_OP_COMMAND_MAX,
               "a charge command fits the worker's command buffer");
_Static_assert(sizeof(struct attempt_params) <= PAYMENT_OP_PARAMS_MAX,
               "an attempt's params fit the worker's params buffer");

const struct payment_op charge_payment_op = {
    .name = "charge",
    .command_type = "charge.requested",
    .engine = &charge_op,
    .reconcile = &charge_reconcile,
    .webhook = &charge_webhook,
};
