/* The capture in every role (op.h): its line of the table. */
#include "capture.h"

#include "capture_command.h"
#include "charged_assert.h"
#include "capture_op.h"
#include "capture_store.h"

_Static_assert(sizeof(struct capture_command) <= PAYMENT_OP_COMMAND_MAX,
               "a capture command fits the worker's command buffer");
_Static_assert(sizeof(struct capture_params) <= PAYMENT_OP_PARAMS_MAX,
               "a capture's params fit the worker's params buffer");

/* The row of capture_status's sql as the api's capture object:
 * {"capture_id", "payment_attempt_id", "order_id", "status", "amount" (as
 * asked; null: all that was held), "captured_amount" (null until
 * SUCCEEDED), "currency", "reason" (why, when not SUCCEEDED),
 * "provider_payment_id" (the authorization's intent), "updated_at"}. */
static json_t *capture_object(const PGresult *r)
{
    CHARGED_ASSERT(r && PQntuples(r) == 1);
    json_t *o = json_object();
    if (!o)
        return NULL;
    /* json_object_set_new steals each value's reference. */
    json_object_set_new(o, "capture_id", json_string(PQgetvalue(r, 0, 0)));
    json_object_set_new(o, "payment_attempt_id", json_string(PQgetvalue(r, 0, 1)));
    json_object_set_new(o, "order_id", webhook_store_text_or_null(r, 2));
    json_object_set_new(o, "status", json_string(PQgetvalue(r, 0, 3)));
    json_object_set_new(o, "amount", webhook_store_integer_or_null(r, 4));
    json_object_set_new(o, "captured_amount", webhook_store_integer_or_null(r, 5));
    json_object_set_new(o, "currency", webhook_store_text_or_null(r, 6));
    json_object_set_new(o, "reason", webhook_store_text_or_null(r, 7));
    json_object_set_new(o, "provider_payment_id", webhook_store_text_or_null(r, 8));
    json_object_set_new(o, "updated_at", json_string(PQgetvalue(r, 0, 9)));
    return o;
}

static const struct op_status capture_status = {
    .path = "/v1/captures/",
    .id_name = "capture_id",
    .not_uuid = "capture id is not a uuid",
    .not_found = "no such capture",
    .help = "one capture's status",
    .sql =
        "SELECT id, payment_attempt_id, order_id, status, amount, captured_amount,"
        "  currency, reason, payment_intent,"
        "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        " FROM capture_attempts WHERE id = $1::uuid",
    .object = capture_object,
};

const struct payment_op capture_payment_op = {
    .name = "capture",
    .command_type = CAPTURE_COMMAND_TYPE,
    .engine = &capture_op,
    .reconcile = &capture_reconcile,
    .webhook = &capture_webhook,
    .status = &capture_status,
};
