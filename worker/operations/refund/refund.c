/* The refund in every role (op.h): its line of the table. */
#include "refund.h"

#include "refund_command.h"
#include "refund_op.h"
#include "refund_store.h"

_Static_assert(sizeof(struct refund_command) <= PAYMENT_OP_COMMAND_MAX,
               "a refund command fits the worker's command buffer");
_Static_assert(sizeof(struct refund_params) <= PAYMENT_OP_PARAMS_MAX,
               "a refund's params fit the worker's params buffer");

const struct payment_op refund_payment_op = {
    .name = "refund",
    .command_type = REFUND_COMMAND_TYPE,
    .engine = &refund_op,
    .reconcile = &refund_reconcile,
    .webhook = &refund_webhook,
};
