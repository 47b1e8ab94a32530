/* The refund in every role (op.h): its line of the table. */
#include "refund.h"

#include "refund_command.h"
#include "refund_op.h"
#include "refund_store.h"

_Static_assert(sizeof(struct refund_command) <= PAYMENT_OP_COMMAND_MAX,
               "a refund command fits the worker's command buffer");
_Static_assert(sizeof(struct refund_params) <= PAYMENT_OP_PARAMS_MAX,
               "a refund's params fit the worker's params buffer");

/* The api's refund object, one member per column of refund_status's
 * query: refund_reason as asked, reason (why, when not SUCCEEDED);
 * order_id, currency and provider_refund_id null when unknown. */
static const struct webhook_store_field refund_status_fields[] = {
    {"refund_id", WEBHOOK_FIELD_TEXT},
    {"payment_attempt_id", WEBHOOK_FIELD_TEXT},
    {"order_id", WEBHOOK_FIELD_TEXT},
    {"status", WEBHOOK_FIELD_TEXT},
    {"amount", WEBHOOK_FIELD_INTEGER},
    {"currency", WEBHOOK_FIELD_TEXT},
    {"refund_reason", WEBHOOK_FIELD_TEXT},
    {"reason", WEBHOOK_FIELD_TEXT},
    {"provider_refund_id", WEBHOOK_FIELD_TEXT},
    {"updated_at", WEBHOOK_FIELD_TEXT},
    {"queued", WEBHOOK_FIELD_JSON},
};

static const struct op_status refund_status = {
    .path = "/v1/refunds/",
    .id_name = "refund_id",
    .not_uuid = "refund id is not a uuid",
    .not_found = "no such refund",
    .help = "one refund's status",
    .sql =
        "SELECT id, payment_attempt_id, order_id, status, amount, currency,"
        "  refund_reason, reason, provider_refund_id,"
        "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
        "  " WEBHOOK_STORE_QUEUED " FROM refund_attempts WHERE id = $1::uuid",
    .fields = refund_status_fields,
    .nfields = sizeof(refund_status_fields) / sizeof(refund_status_fields[0]),
};

static enum dead_letter_reason refund_check(const char *id, size_t id_len,
                                            const char *value, size_t len,
                                            const struct charge_command_limits *lim,
                                            struct charged_error *err)
{
    struct refund_command refund;
    enum dead_letter_reason r =
        refund_command_parse(id, id_len, value, len, lim->max_bytes, &refund, err);
    refund_command_release(&refund);
    return r;
}

const struct payment_op refund_payment_op = {
    .name = "refund",
    .command_type = REFUND_COMMAND_TYPE,
    .engine = &refund_op,
    .endpoint_class = BUDGET_CLASS_REFUND,
    .budget_priority = BUDGET_PRIO_REFUND,
    .reconcile = &refund_reconcile,
    .webhook = &refund_webhook,
    .status = &refund_status,
    .check = refund_check,
};
