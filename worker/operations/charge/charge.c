/* The charge in every role (op.h): its line of the table. */
#include "charge.h"

#include "attempt_store.h"
#include "charge_command.h"
#include "charge_op.h"

_Static_assert(sizeof(struct charge_command) <= PAYMENT_OP_COMMAND_MAX,
               "a charge command fits the worker's command buffer");
_Static_assert(sizeof(struct attempt_params) <= PAYMENT_OP_PARAMS_MAX,
               "an attempt's params fit the worker's params buffer");

static enum dead_letter_reason charge_check(const char *id, size_t id_len,
                                            const char *value, size_t len,
                                            const struct charge_command_limits *lim,
                                            struct charged_error *err)
{
    struct charge_command cmd;
    enum dead_letter_reason r = charge_command_parse_as(
        "charge.requested", 0, id, id_len, value, len, lim, &cmd, err);
    charge_command_release(&cmd);
    return r;
}

const struct payment_op charge_payment_op = {
    .name = "charge",
    .command_type = "charge.requested",
    .engine = &charge_op,
    .endpoint_class = BUDGET_CLASS_CREATE,
    .budget_priority = BUDGET_PRIO_CHARGE,
    .reconcile = &charge_reconcile,
    .webhook = &charge_webhook,
    .check = charge_check,
};
