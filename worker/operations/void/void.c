/* The void in every role (op.h, void.h): its line of the table. */
#include "void.h"

#include "void_command.h"
#include "void_review.h"

_Static_assert(sizeof(struct void_command) <= PAYMENT_OP_COMMAND_MAX,
               "a void command fits the worker's command buffer");
_Static_assert(sizeof(struct void_params) <= PAYMENT_OP_PARAMS_MAX,
               "a void's params fit the worker's params buffer");

/* The api's void object, one member per column of void_status's query:
 * void_reason as asked, released_amount (null until SUCCEEDED), reason
 * (why, when not SUCCEEDED), provider_payment_id (the authorization's
 * intent). */
static const struct webhook_store_field void_status_fields[] = {
    {"void_id", WEBHOOK_FIELD_TEXT},     {"payment_attempt_id", WEBHOOK_FIELD_TEXT},
    {"order_id", WEBHOOK_FIELD_TEXT},    {"status", WEBHOOK_FIELD_TEXT},
    {"void_reason", WEBHOOK_FIELD_TEXT}, {"released_amount", WEBHOOK_FIELD_INTEGER},
    {"reason", WEBHOOK_FIELD_TEXT},      {"provider_payment_id", WEBHOOK_FIELD_TEXT},
    {"updated_at", WEBHOOK_FIELD_TEXT},  {"queued", WEBHOOK_FIELD_JSON},
};

static const struct op_status void_status = {
    .path = "/v1/voids/",
    .id_name = "void_id",
    .not_uuid = "void id is not a uuid",
    .not_found = "no such void",
    .help = "one void's status",
    .sql =
        "SELECT id, payment_attempt_id, order_id, status, void_reason, released_amount,"
        "  reason, payment_intent,"
        "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
        "  " WEBHOOK_STORE_QUEUED " FROM void_attempts WHERE id = $1::uuid",
    .fields = void_status_fields,
    .nfields = sizeof(void_status_fields) / sizeof(void_status_fields[0]),
};

static enum dead_letter_reason void_check(const char *id, size_t id_len,
                                          const char *value, size_t len,
                                          const struct charge_command_limits *lim,
                                          struct charged_error *err)
{
    struct void_command voided;
    enum dead_letter_reason r =
        void_command_parse(id, id_len, value, len, lim->max_bytes, &voided, err);
    void_command_release(&voided);
    return r;
}

const struct payment_op void_payment_op = {
    .name = "void",
    .command_type = VOID_COMMAND_TYPE,
    .engine = &void_engine_op,
    /* The intent's cancel: the capture's class and priority. */
    .endpoint_class = BUDGET_CLASS_CAPTURE,
    .budget_priority = BUDGET_PRIO_CAPTURE,
    .reconcile = &void_reconcile,
    .webhook = &void_webhook,
    .status = &void_status,
    .audit = &void_audit,
    .review = &void_review_kind,
    .history = &void_history,
    .check = void_check,
};
