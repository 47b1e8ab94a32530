/* The void's parser and its pure decisions (void_command.h). */
#include "void_command.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "card_data.h"
#include "charge_policy.h"
#include "charged_assert.h"
#include "command_fields.h"

/* ---- the command ---- */

static const char *const void_reasons[] = {"requested_by_customer", "duplicate",
                                           "fraudulent", "abandoned"};

/* The members in the order their faults are said (the refund's order: the
 * header, the two ids, the key, then the void's own). */
static enum charged_rc void_fields(json_t *doc, struct void_command *c,
                                   struct charged_error *err)
{
    int known = 0;
    if (command_fields_header(doc, VOID_COMMAND_TYPE, err) ||
        command_fields_uuids(doc, "void_id", c->void_id, "payment_attempt_id",
                             c->payment_attempt_id, err) ||
        command_fields_idempotency_key(doc, c->idempotency_key, err))
        return CHARGED_BAD_ITEM;
    if (command_fields_string(doc, "reason", 1, 1, sizeof(c->reason) - 1, c->reason,
                              sizeof(c->reason), err) == CHARGED_OK)
        for (size_t i = 0; i < sizeof(void_reasons) / sizeof(void_reasons[0]); i++)
            known |= !strcmp(c->reason, void_reasons[i]);
    if (!known) {
        charged_error_set(err, "'reason' must be requested_by_customer, duplicate, "
                               "fraudulent or abandoned");
        return CHARGED_BAD_ITEM;
    }
    return command_fields_metadata(json_object_get(doc, "metadata"), err);
}

/* What decides the void: the same id or key with any of these changed is
 * another void, a conflict (metadata is not: as a refund's). */
static int void_fingerprint(struct void_command *c)
{
    const char *fields[] = {"void", c->void_id, c->payment_attempt_id, c->reason};
    CHARGED_ASSERT(c->void_id[0] && c->reason[0]);
    return command_fields_fingerprint(fields, sizeof(fields) / sizeof(fields[0]),
                                      c->fingerprint);
}

enum dead_letter_reason void_command_parse(const void *key, size_t key_len,
                                           const void *value, size_t value_len,
                                           size_t max_bytes, struct void_command *out,
                                           struct charged_error *err)
{
    json_t *doc = NULL;
    CHARGED_ASSERT(out && err);
    memset(out, 0, sizeof(*out));
    enum dead_letter_reason r =
        command_fields_open(key, key_len, value, value_len, max_bytes, &doc, err);
    if (r == DEAD_LETTER_NONE && void_fields(doc, out, err) != CHARGED_OK)
        r = DEAD_LETTER_SCHEMA_VIOLATION;
    if (r == DEAD_LETTER_NONE)
        r = command_fields_key_is(key, key_len, out->payment_attempt_id, err);
    if (r == DEAD_LETTER_NONE) {
        command_fields_lower(out->void_id);
        command_fields_lower(out->payment_attempt_id);
        out->metadata_json =
            command_fields_metadata_json(json_object_get(doc, "metadata"));
        if (!out->metadata_json || void_fingerprint(out) != 0) {
            charged_error_set(err, "out of memory");
            void_command_release(out);
            r = DEAD_LETTER_SCHEMA_VIOLATION;
        }
    }
    json_decref(doc);
    /* A void taken is whole: its id, key and reason, fingerprinted. */
    CHARGED_ASSERT(r != DEAD_LETTER_NONE ||
                   (out->void_id[0] && out->idempotency_key[0] && out->fingerprint[0]));
    return r;
}

void void_command_release(struct void_command *cmd)
{
    CHARGED_ASSERT(cmd);
    free(cmd->metadata_json);
    cmd->metadata_json = NULL;
}

/* ---- the provider's answer ---- */

const char *void_refusal_code(const struct provider_result *res)
{
    CHARGED_ASSERT(res && res->outcome == PROVIDER_INVALID);
    if (!strcmp(res->intent_status, "succeeded"))
        return "void_after_capture";
    if (!strcmp(res->intent_status, "canceled"))
        return !strcmp(res->cancellation_reason, "automatic") ? "authorization_expired"
                                                              : "authorization_voided";
    return "invalid_request";
}

/* ---- the reconciler's order of evidence ---- */

/* How a look ends: a status (the void's own: look again), a rule, a reason
 * code and the provider's words. */
struct void_verdict {
    enum attempt_status status;
    enum reconcile_rule rule;
    const char *code; /* NULL: no reason (a success) */
    const struct provider_result *res;
};

/* What an answer describing our intent says of the void. own: the answer
 * to the cancel under the void's key (a replay is ours too); otherwise a
 * retrieve of our recorded id. */
static struct void_verdict from_intent(const struct reconcile_attempt *a,
                                       const struct provider_result *res, int own)
{
    CHARGED_ASSERT(a && res);
    struct void_verdict v = {a->status, RECONCILE_FOUND_OTHER_STATUS, NULL, res};
    const char *st = res->intent_status;
    int automatic = !strcmp(res->cancellation_reason, "automatic");
    if (own && res->outcome == PROVIDER_SUCCEEDED)
        v = (struct void_verdict){ATTEMPT_STATUS_SUCCEEDED, RECONCILE_FOUND_SUCCEEDED,
                                  NULL, res};
    else if (own && res->outcome == PROVIDER_INVALID)
        v = (struct void_verdict){ATTEMPT_STATUS_FAILED, RECONCILE_CHARGE_REFUSED,
                                  void_refusal_code(res), res};
    else if (!own && !strcmp(st, "canceled"))
        v = automatic
                ? (struct void_verdict){ATTEMPT_STATUS_FAILED, RECONCILE_FOUND_DECLINED,
                                        "authorization_expired", res}
                : (struct void_verdict){ATTEMPT_STATUS_SUCCEEDED,
                                        RECONCILE_FOUND_SUCCEEDED, NULL, res};
    else if (!own && !strcmp(st, "requires_capture"))
        v = (struct void_verdict){ATTEMPT_STATUS_FAILED, RECONCILE_NEVER_EXECUTED,
                                  "never_executed", res};
    else if (!own && !strcmp(st, "succeeded"))
        v = (struct void_verdict){ATTEMPT_STATUS_FAILED, RECONCILE_FOUND_DECLINED,
                                  "void_after_capture", res};
    else
        v = (struct void_verdict){ATTEMPT_STATUS_REQUIRES_REVIEW,
                                  RECONCILE_FOUND_OTHER_STATUS, "requires_review", res};
    return v;
}

/* An answer that is no evidence (no answer, 409, 429, a 5xx, a failed
 * look-up): look again; an own cancel unanswered while PROCESSING is in
 * doubt (UNKNOWN), as a charge's. */
static struct void_verdict no_evidence(const struct reconcile_attempt *a,
                                       const struct provider_result *res, int own)
{
    CHARGED_ASSERT(a && res);
    if (res->outcome == PROVIDER_REQUIRES_REVIEW)
        return (struct void_verdict){ATTEMPT_STATUS_REQUIRES_REVIEW,
                                     RECONCILE_FOUND_NOT_OURS, "requires_review", res};
    if (!own && res->outcome == PROVIDER_NOT_FOUND)
        return (struct void_verdict){ATTEMPT_STATUS_REQUIRES_REVIEW,
                                     RECONCILE_ID_UNKNOWN, "requires_review", res};
    if (own && res->outcome == PROVIDER_NOT_EXECUTED)
        return (struct void_verdict){a->status, RECONCILE_CHARGE_NOT_EXECUTED,
                                     "not_executed", res};
    if (own)
        return (struct void_verdict){ATTEMPT_STATUS_UNKNOWN,
                                     a->status == ATTEMPT_STATUS_PROCESSING
                                         ? RECONCILE_CHARGE_UNANSWERED_PROCESSING
                                         : RECONCILE_CHARGE_UNANSWERED,
                                     "outcome_unknown", res};
    return (struct void_verdict){a->status, RECONCILE_LOOKUP_FAILED, "lookup_failed",
                                 res};
}

static int describes_intent(enum provider_outcome o)
{
    return o == PROVIDER_SUCCEEDED || o == PROVIDER_INVALID || o == PROVIDER_DECLINED ||
           o == PROVIDER_AUTHORIZED || o == PROVIDER_PROCESSING;
}

static void void_look_decide(const struct reconcile_limits *lim,
                             const struct reconcile_attempt *a,
                             const struct reconcile_evidence *e,
                             struct reconcile_decision *out)
{
    CHARGED_ASSERT(lim && a && e && out);
    /* Only a void in doubt is looked at, on the intent we recorded. */
    CHARGED_ASSERT(a->status == ATTEMPT_STATUS_UNKNOWN ||
                   a->status == ATTEMPT_STATUS_PROCESSING);
    memset(out, 0, sizeof(*out));
    long long age = (a->key_age_ms < 0 ? 0 : a->key_age_ms) + e->lookup_after_ms;
    int own = charge_policy_key_window_open(age, lim->key_retention_ms,
                                            lim->provider_timeout_ms);
    const struct provider_result *res = own ? e->charge : e->lookup;
    if (!res) {
        out->next = own ? RECONCILE_CHARGE : RECONCILE_RETRIEVE;
        return;
    }
    int intent = own ? describes_intent(res->outcome)
                     : res->outcome != PROVIDER_NOT_FOUND && res->intent_status[0] &&
                           res->outcome != PROVIDER_UNKNOWN;
    struct void_verdict v =
        intent ? from_intent(a, res, own) : no_evidence(a, res, own);
    if (v.status == a->status && a->age_ms > lim->max_age_ms)
        v = (struct void_verdict){ATTEMPT_STATUS_REQUIRES_REVIEW, RECONCILE_TOO_OLD,
                                  "requires_review: still unsettled", res};
    char detail[400], tmp[512];
    provider_outcome_detail(res, detail, sizeof(detail));
    if (v.code)
        snprintf(tmp, sizeof(tmp), "%s: intent %s, %s", v.code,
                 res->intent_status[0] ? res->intent_status : "unknown", detail);
    card_data_copy_masked(out->reason, sizeof(out->reason), v.code ? tmp : "");
    out->next = RECONCILE_SETTLE;
    out->rule = v.rule;
    out->status = v.status;
    if (v.status == ATTEMPT_STATUS_SUCCEEDED)
        snprintf(out->provider_payment_id, sizeof(out->provider_payment_id), "%s",
                 a->provider_payment_id);
    /* A move is one the void's status may make; a stay stays. */
    CHARGED_ASSERT(out->status == a->status ||
                   attempt_status_transition_allowed((int)a->status, out->status));
}

const struct reconcile_order void_look_order = {
    .decide = void_look_decide,
    .operation = {[RECONCILE_CHARGE] = "void", [RECONCILE_RETRIEVE] = "retrieve"},
};
