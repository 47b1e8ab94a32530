#include "charge_op.h"

#include "charged_assert.h"
#include "op_shared.h"
#include "payment_answer.h"

/* A charge is an operation over payment attempts (op_shared.h) whose
 * money is taken at once. */

struct provider_charge charge_op_request(const struct attempt_params *p,
                                         const char *attempt_id)
{
    return op_attempts_request(p, attempt_id);
}

static void *charge_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    return op_attempts_open(cfg, actor, "charge.requested", 0, err);
}

static const char *charge_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return attempt_status_event_type(status);
}

const struct engine_op charge_op = {
    .name = "charge",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct charge_command),
    .params_size = sizeof(struct attempt_params),
    OP_CALLBACKS_SHARING(charge, op_attempts),
    OP_STORE_CALLBACKS(op_store),
    .decide = payment_answer_decide,
    .outcome = payment_answer_outcome,
    .sets_aside = op_sets_aside,
};
