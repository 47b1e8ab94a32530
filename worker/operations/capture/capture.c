/* The capture in every role (op.h): its line of the table. */
#include "capture.h"

#include "capture_command.h"
#include "capture_op.h"
#include "capture_review.h"
#include "capture_store.h"

_Static_assert(sizeof(struct capture_command) <= PAYMENT_OP_COMMAND_MAX,
               "a capture command fits the worker's command buffer");
_Static_assert(sizeof(struct capture_params) <= PAYMENT_OP_PARAMS_MAX,
               "a capture's params fit the worker's params buffer");

/* The api's capture object, one member per column of capture_status's
 * query: amount as asked (null: all that was held), captured_amount (null
 * until SUCCEEDED), reason (why, when not SUCCEEDED), provider_payment_id
 * (the authorization's intent). */
static const struct webhook_store_field capture_status_fields[] = {
    {"capture_id", WEBHOOK_FIELD_TEXT},
    {"payment_attempt_id", WEBHOOK_FIELD_TEXT},
    {"order_id", WEBHOOK_FIELD_TEXT},
    {"status", WEBHOOK_FIELD_TEXT},
    {"amount", WEBHOOK_FIELD_INTEGER},
    {"captured_amount", WEBHOOK_FIELD_INTEGER},
    {"currency", WEBHOOK_FIELD_TEXT},
    {"reason", WEBHOOK_FIELD_TEXT},
    {"provider_payment_id", WEBHOOK_FIELD_TEXT},
    {"updated_at", WEBHOOK_FIELD_TEXT},
    {"queued", WEBHOOK_FIELD_JSON},
};

static const struct op_status capture_status = {
    .path = "/v1/captures/",
    .id_name = "capture_id",
    .not_uuid = "capture id is not a uuid",
    .not_found = "no such capture",
    .help = "one capture's status",
    .sql =
        "SELECT id, payment_attempt_id, order_id, status, amount, captured_amount,"
        "  currency, reason, payment_intent,"
        "  to_char(updated_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"'),"
        "  " WEBHOOK_STORE_QUEUED " FROM capture_attempts WHERE id = $1::uuid",
    .fields = capture_status_fields,
    .nfields = sizeof(capture_status_fields) / sizeof(capture_status_fields[0]),
};

static enum dead_letter_reason capture_check(const char *id, size_t id_len,
                                             const char *value, size_t len,
                                             const struct charge_command_limits *lim,
                                             struct charged_error *err)
{
    struct capture_command capture;
    enum dead_letter_reason r =
        capture_command_parse(id, id_len, value, len, lim->max_bytes, &capture, err);
    capture_command_release(&capture);
    return r;
}

const struct payment_op capture_payment_op = {
    .name = "capture",
    .command_type = CAPTURE_COMMAND_TYPE,
    .engine = &capture_op,
    /* A hold's money moved, first of all the provider's calls. */
    .endpoint_class = BUDGET_CLASS_CAPTURE,
    .budget_priority = BUDGET_PRIO_CAPTURE,
    .reconcile = &capture_reconcile,
    .webhook = &capture_webhook,
    .status = &capture_status,
    .audit = &capture_audit,
    .review = &capture_review_kind,
    .history = &capture_history,
    .check = capture_check,
};
