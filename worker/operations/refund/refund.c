/* The refund in every role (op.h): its line of the table. */
#include "refund.h"

#include <stdlib.h>

#include "charged_assert.h"
#include "refund_command.h"
#include "refund_op.h"
#include "refund_store.h"

_Static_assert(sizeof(struct refund_command) <= PAYMENT_OP_COMMAND_MAX,
               "a refund command fits the worker's command buffer");
_Static_assert(sizeof(struct refund_params) <= PAYMENT_OP_PARAMS_MAX,
               "a refund's params fit the worker's params buffer");

/* The row of refund_status's sql as the api's refund object: {"refund_id",
 * "payment_attempt_id", "order_id", "status", "amount", "currency",
 * "refund_reason" (as requested), "reason" (why, when not SUCCEEDED),
 * "provider_refund_id", "updated_at"}. */
static json_t *refund_object(const PGresult *r)
{
    CHARGED_ASSERT(r && PQntuples(r) == 1);
    json_t *o = json_object();
    if (!o)
        return NULL;
    /* json_object_set_new steals each value's reference. */
    json_object_set_new(o, "refund_id", json_string(PQgetvalue(r, 0, 0)));
    json_object_set_new(o, "payment_attempt_id", json_string(PQgetvalue(r, 0, 1)));
    json_object_set_new(o, "order_id", webhook_store_text_or_null(r, 2));
    json_object_set_new(o, "status", json_string(PQgetvalue(r, 0, 3)));
    json_object_set_new(o, "amount",
                        json_integer(strtoll(PQgetvalue(r, 0, 4), NULL, 10)));
    json_object_set_new(o, "currency", webhook_store_text_or_null(r, 5));
    json_object_set_new(o, "refund_reason", json_string(PQgetvalue(r, 0, 6)));
    json_object_set_new(o, "reason", webhook_store_text_or_null(r, 7));
    json_object_set_new(o, "provider_refund_id", webhook_store_text_or_null(r, 8));
    json_object_set_new(o, "updated_at", json_string(PQgetvalue(r, 0, 9)));
    return o;
}

static const struct op_status refund_status = {
    .path = "/v1/refunds/",
    .id_name = "refund_id",
    .not_uuid = "refund id is not a uuid",
    .not_found = "no such refund",
    .help = "one refund's status",
    .sql =
        "SELECT id, payment_attempt_id, order_id, status, amount, currency,"
        "  refund_reason, reason, provider_refund_id,"
        "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        " FROM refund_attempts WHERE id = $1::uuid",
    .object = refund_object,
};

const struct payment_op refund_payment_op = {
    .name = "refund",
    .command_type = REFUND_COMMAND_TYPE,
    .engine = &refund_op,
    .reconcile = &refund_reconcile,
    .webhook = &refund_webhook,
    .status = &refund_status,
};
