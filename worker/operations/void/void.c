/* The void in every role (op.h, void.h): its line of the table. */
#include "void.h"

#include "void_command.h"

_Static_assert(sizeof(struct void_command) <= PAYMENT_OP_COMMAND_MAX,
               "a void command fits the worker's command buffer");
_Static_assert(sizeof(struct void_params) <= PAYMENT_OP_PARAMS_MAX,
               "a void's params fit the worker's params buffer");

const struct payment_op void_payment_op = {
    .name = "void",
    .command_type = VOID_COMMAND_TYPE,
    .engine = &void_engine_op,
    .reconcile = &void_reconcile,
    .webhook = &void_webhook,
};
