/* The capture in every role (op.h): its line of the table. */
#include "capture.h"

#include "capture_command.h"
#include "capture_op.h"
#include "capture_store.h"

_Static_assert(sizeof(struct capture_command) <= PAYMENT_OP_COMMAND_MAX,
               "a capture command fits the worker's command buffer");
_Static_assert(sizeof(struct capture_params) <= PAYMENT_OP_PARAMS_MAX,
               "a capture's params fit the worker's params buffer");

const struct payment_op capture_payment_op = {
    .name = "capture",
    .command_type = CAPTURE_COMMAND_TYPE,
    .engine = &capture_op,
    .reconcile = &capture_reconcile,
    .webhook = &capture_webhook,
};
