#include "charge_op.h"

#include <stdio.h>

struct provider_charge charge_op_request(const struct attempt_params *p,
                                         const char *attempt_id)
{
    return (struct provider_charge){
        .idempotency_key = p->idempotency_key,
        .amount = p->amount,
        .currency = p->currency,
        .payment_method = p->payment_method,
        .customer_id = p->customer_id,
        .payment_attempt_id = attempt_id,
        .order_id = p->order_id,
    };
}

struct provider_result charge_op_lost_answer(void)
{
    struct provider_result lost = {.outcome = PROVIDER_UNKNOWN, .sent = 1};
    snprintf(lost.error, sizeof(lost.error),
             "connection closed without an answer; re-sent with the same key");
    return lost;
}
