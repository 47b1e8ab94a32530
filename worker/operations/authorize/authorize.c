/* authorize: an authorization in every role (op.h), its line of the table.
 *
 * An authorization.requested carries a charge's fields. It is recorded as a
 * payment attempt with capture_method manual and sent as an intent with
 * capture_method=manual, through the stages a charge uses
 * (op_attempts, op_shared.h): what differs is what the provider's answer
 * means and which events say it. The answer that the money is held
 * (requires_capture) makes the attempt AUTHORIZED, the order's live
 * attempt; nothing is booked, as no money moved (a capture books it). A
 * decline is FAILED, a lost answer UNKNOWN (never FAILED), as a charge's.
 * Each outcome is published as authorization.*. Its look
 * (authorize_look.c) settles an UNKNOWN one on its own intent, and the
 * provider's expiry of a hold (VOIDED expired); its webhooks
 * (authorize_webhook.c) the hold, a failure and the expiry. */
#include "op.h"

#include "attempt_store.h"
#include "authorization_review.h"
#include "authorize.h"
#include "charge_command.h"
#include "charged_assert.h"
#include "op_shared.h"
#include "payment_answer.h"

static void *authorize_open(config_t *cfg, const char *actor, struct charged_error *err)
{
    return op_attempts_open(cfg, actor, "authorization.requested", 1, err);
}

static const char *authorize_event_type(int kind, enum attempt_status status)
{
    (void)kind;
    return attempt_status_authorization_event_type(status);
}

/* A charge's table (payment_answer_decide), but for the hold: AUTHORIZED
 * is the authorization's success. Money taken where it was to be held is
 * no outcome an authorization may settle on by itself (the database
 * refuses SUCCEEDED without a capture): a person looks. A hold answered
 * when the answer may be a replay (a retry, a record sent before this
 * claim, or the provider's Idempotent-Replayed) proves the intent ours,
 * not held now: UNKNOWN with its id recorded, and the reconciler's look
 * retrieves it at once (first look). Not retrieved here: the engine makes
 * one call per answer, and the look already settles on the intent by its
 * id (captured since: REQUIRES_REVIEW; canceled: FAILED). */
static struct answer_decision authorize_decide(int kind, const struct engine_policy *p,
                                               enum provider_outcome outcome,
                                               int may_replay, int tries,
                                               int key_window_open, unsigned jitter)
{
    if (outcome == PROVIDER_SUCCEEDED)
        outcome = PROVIDER_REQUIRES_REVIEW;
    struct answer_decision d = payment_answer_decide(kind, p, outcome, may_replay,
                                                     tries, key_window_open, jitter);
    if (outcome == PROVIDER_AUTHORIZED && may_replay)
        d = (struct answer_decision){.next = ANSWER_NEXT_SETTLE,
                                     .status = ATTEMPT_STATUS_UNKNOWN,
                                     .next_check_ms = p->first_look_ms,
                                     .reason_code = AUTHORIZE_REPLAYED_HOLD};
    else if (outcome == PROVIDER_AUTHORIZED)
        d = (struct answer_decision){.next = ANSWER_NEXT_SETTLE,
                                     .status = ATTEMPT_STATUS_AUTHORIZED,
                                     .next_check_ms = -1};
    /* An authorization settles as a hold, a failure, in doubt or for a
     * person: never as money taken. */
    CHARGED_ASSERT(d.next != ANSWER_NEXT_SETTLE ||
                   d.status != ATTEMPT_STATUS_SUCCEEDED);
    CHARGED_ASSERT(
        d.next != ANSWER_NEXT_SETTLE ||
        attempt_status_transition_allowed(ATTEMPT_STATUS_PROCESSING, d.status));
    return d;
}

static const struct engine_op authorize_op = {
    .name = "authorize",
    OP_PAYMENT_TOPICS,
    .command_size = sizeof(struct charge_command),
    .params_size = sizeof(struct attempt_params),
    OP_CALLBACKS_SHARING(authorize, op_attempts),
    OP_STORE_CALLBACKS(op_store),
    .decide = authorize_decide,
    .outcome = payment_answer_outcome,
    .sets_aside = op_sets_aside,
};

/* A charge's fields, held. */
static enum dead_letter_reason authorize_check(const char *id, size_t id_len,
                                               const char *value, size_t len,
                                               const struct charge_command_limits *lim,
                                               struct charged_error *err)
{
    struct charge_command cmd;
    enum dead_letter_reason r = charge_command_parse_as(
        "authorization.requested", 1, id, id_len, value, len, lim, &cmd, err);
    charge_command_release(&cmd);
    return r;
}

static const struct config_setting *const authorize_settings[] = {
    &authorize_expiry_setting, NULL};

const struct payment_op authorize_payment_op = {
    .name = "authorize",
    .command_type = "authorization.requested",
    .engine = &authorize_op,
    /* A create, as a charge's, at a charge's priority. */
    .endpoint_class = BUDGET_CLASS_CREATE,
    .budget_priority = BUDGET_PRIO_CHARGE,
    /* Its attempts are payment_attempts of capture_method manual: the
     * charge's look and webhooks leave them to these. */
    .reconcile = &authorize_reconcile,
    .webhook = &authorize_webhook,
    .review = &authorization_review_kind,
    .settings = authorize_settings,
    .check = authorize_check,
};
