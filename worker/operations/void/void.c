/* The void in every role (op.h, void.h): its line of the table. */
#include "void.h"

#include "charged_assert.h"
#include "void_command.h"

_Static_assert(sizeof(struct void_command) <= PAYMENT_OP_COMMAND_MAX,
               "a void command fits the worker's command buffer");
_Static_assert(sizeof(struct void_params) <= PAYMENT_OP_PARAMS_MAX,
               "a void's params fit the worker's params buffer");

/* The row of void_status's sql as the api's void object: {"void_id",
 * "payment_attempt_id", "order_id", "status", "void_reason" (as asked),
 * "released_amount" (null until SUCCEEDED), "reason" (why, when not
 * SUCCEEDED), "provider_payment_id" (the authorization's intent),
 * "updated_at"}. */
static json_t *void_object(const PGresult *r)
{
    CHARGED_ASSERT(r && PQntuples(r) == 1);
    json_t *o = json_object();
    if (!o)
        return NULL;
    /* json_object_set_new steals each value's reference. */
    json_object_set_new(o, "void_id", json_string(PQgetvalue(r, 0, 0)));
    json_object_set_new(o, "payment_attempt_id", json_string(PQgetvalue(r, 0, 1)));
    json_object_set_new(o, "order_id", webhook_store_text_or_null(r, 2));
    json_object_set_new(o, "status", json_string(PQgetvalue(r, 0, 3)));
    json_object_set_new(o, "void_reason", json_string(PQgetvalue(r, 0, 4)));
    json_object_set_new(o, "released_amount", webhook_store_integer_or_null(r, 5));
    json_object_set_new(o, "reason", webhook_store_text_or_null(r, 6));
    json_object_set_new(o, "provider_payment_id", webhook_store_text_or_null(r, 7));
    json_object_set_new(o, "updated_at", json_string(PQgetvalue(r, 0, 8)));
    return o;
}

static const struct op_status void_status = {
    .path = "/v1/voids/",
    .id_name = "void_id",
    .not_uuid = "void id is not a uuid",
    .not_found = "no such void",
    .help = "one void's status",
    .sql =
        "SELECT id, payment_attempt_id, order_id, status, void_reason, released_amount,"
        "  reason, payment_intent,"
        "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"
        " FROM void_attempts WHERE id = $1::uuid",
    .object = void_object,
};

const struct payment_op void_payment_op = {
    .name = "void",
    .command_type = VOID_COMMAND_TYPE,
    .engine = &void_engine_op,
    .reconcile = &void_reconcile,
    .webhook = &void_webhook,
    .status = &void_status,
};
