#include "payment_answer.h"

#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "card_data.h"
#include "charge_policy.h"
#include "charged_assert.h"

struct answer_decision payment_answer_decide(int kind, const struct engine_policy *p,
                                             enum provider_outcome outcome,
                                             int may_replay, int tries,
                                             int key_window_open, unsigned jitter)
{
    CHARGED_ASSERT(kind >= 0 && tries >= 0);
    /* A charge's, refund's or void's replayed answer is as final as the
     * first: succeeded stays succeeded. */
    (void)may_replay;
    const struct charge_policy cp = {
        .unknown_retries = p->unknown_retries,
        .retry_base_ms = p->retry_base_ms,
        .retry_max_ms = p->retry_max_ms,
        .first_look_ms = p->first_look_ms,
    };
    struct answer_decision d =
        charge_policy_decide(&cp, outcome, tries, key_window_open, jitter);
    /* The table sends again only while the key is kept. */
    CHARGED_ASSERT(d.next == ANSWER_NEXT_SETTLE || key_window_open);
    return d;
}

/* The decision's reason code with the provider's own words. */
static void reason_of(const struct provider_result *r, const struct answer_decision *d,
                      char *reason, size_t reason_size)
{
    reason[0] = '\0';
    if (!d->reason_code)
        return;
    if (r->outcome == PROVIDER_DECLINED)
        snprintf(reason, reason_size, "%s: %s%s%s", d->reason_code,
                 r->code[0] ? r->code : "declined", r->decline_code[0] ? ": " : "",
                 r->decline_code);
    else if (r->outcome == PROVIDER_INVALID) {
        /* The provider's code and param, and its message as the client
         * masked it: never what it echoes of the request. */
        char detail[400];
        provider_outcome_detail(r, detail, sizeof(detail));
        snprintf(reason, reason_size, "%s: %s", d->reason_code, detail);
    } else if (r->error[0])
        snprintf(reason, reason_size, "%s: %s", d->reason_code, r->error);
    else
        snprintf(reason, reason_size, "%s", d->reason_code);
    /* Each text was masked as it came in; side by side ("code:
     * decline_code") two of them must not make one card number. */
    card_data_mask_loose(reason, strlen(reason));
}

static char *evidence_of(const struct provider_result *r, int calls)
{
    json_t *e = json_pack("{s:s, s:i, s:b, s:i, s:I}", "outcome",
                          provider_outcome_name(r->outcome), "http_status",
                          r->http_status, "replayed", r->replayed, "calls", calls,
                          "latency_ms", (json_int_t)r->latency_ms);
    if (!e)
        return NULL;
    if (r->provider_payment_id[0])
        json_object_set_new(e, "provider_payment_id",
                            json_string(r->provider_payment_id));
    if (r->code[0])
        json_object_set_new(e, "code", json_string(r->code));
    if (r->decline_code[0])
        json_object_set_new(e, "decline_code", json_string(r->decline_code));
    char *s = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    return s;
}

char *payment_answer_outcome(int kind, const struct provider_result *res,
                             const struct answer_decision *d, int calls, char *reason,
                             size_t reason_size, const char **provider_id)
{
    /* Only a settlement has an outcome; one of a call that may have
     * executed is never FAILED. */
    CHARGED_ASSERT(kind >= 0 && d->next == ANSWER_NEXT_SETTLE && reason_size > 0);
    CHARGED_ASSERT(d->status != ATTEMPT_STATUS_FAILED ||
                   res->outcome == PROVIDER_DECLINED ||
                   res->outcome == PROVIDER_INVALID);
    reason_of(res, d, reason, reason_size);
    *provider_id = res->provider_payment_id;
    return evidence_of(res, calls);
}
