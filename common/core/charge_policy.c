#include "charge_policy.h"

#include "charged_assert.h"
#include "retry_tries.h"

/* When an outcome may be sent again with the same key. */
enum retry_rule {
    NEVER,                      /* settle now */
    WHILE_KEY_KEPT,             /* nothing executed upstream: as often as it takes */
    WHILE_RETRIES_AND_KEY_KEPT, /* may have executed: a bounded number of times */
};

/* The table: one row per provider outcome. */
static const struct {
    enum retry_rule retry;
    enum attempt_status status; /* when settled */
    int looked_at;              /* 1: the reconciler looks at it later */
    const char *reason_code;
} rows[] = {
    [PROVIDER_SUCCEEDED] = {NEVER, ATTEMPT_STATUS_SUCCEEDED, 0, NULL},
    /* Accepted; settled later by a webhook or a look-up. The attempt stays
     * PROCESSING: no event. */
    [PROVIDER_PROCESSING] = {NEVER, ATTEMPT_STATUS_PROCESSING, 1,
                             "provider_processing"},
    [PROVIDER_DECLINED] = {NEVER, ATTEMPT_STATUS_FAILED, 0, "declined"},
    /* 409 in use, 429, refused before sending: nothing happened upstream. */
    [PROVIDER_NOT_EXECUTED] = {WHILE_KEY_KEPT, ATTEMPT_STATUS_UNKNOWN, 1,
                               "outcome_unknown"},
    /* 5xx, timeout, lost answer: never FAILED. */
    [PROVIDER_UNKNOWN] = {WHILE_RETRIES_AND_KEY_KEPT, ATTEMPT_STATUS_UNKNOWN, 1,
                          "outcome_unknown"},
    [PROVIDER_REQUIRES_REVIEW] = {NEVER, ATTEMPT_STATUS_REQUIRES_REVIEW, 0,
                                  "requires_review"},
    /* 400 invalid_request_error: validation failures are not executed. */
    [PROVIDER_INVALID] = {NEVER, ATTEMPT_STATUS_FAILED, 0, "invalid_request"},
    /* Look-ups only; a charge never answers it. Unknown, for the reconciler. */
    [PROVIDER_NOT_FOUND] = {NEVER, ATTEMPT_STATUS_UNKNOWN, 1, "outcome_unknown"},
    /* A hold where a charge was asked: the money is neither taken nor
     * refused. A human decides. */
    [PROVIDER_AUTHORIZED] = {NEVER, ATTEMPT_STATUS_REQUIRES_REVIEW, 0,
                             "requires_review"},
};
_Static_assert(sizeof(rows) / sizeof(rows[0]) == PROVIDER_OUTCOME__COUNT,
               "a row for every outcome");

long long charge_policy_key_margin_ms(long long key_retention_ms,
                                      long long provider_timeout_ms)
{
    long long tenth = key_retention_ms / 10;
    return provider_timeout_ms + (tenth < 60000 ? tenth : 60000);
}

int charge_policy_key_window_open(long long key_age_ms, long long key_retention_ms,
                                  long long provider_timeout_ms)
{
    return key_age_ms +
               charge_policy_key_margin_ms(key_retention_ms, provider_timeout_ms) <
           key_retention_ms;
}

struct answer_decision charge_policy_decide(const struct charge_policy *p,
                                            enum provider_outcome outcome, int tries,
                                            int key_window_open, unsigned jitter)
{
    struct answer_decision d = {0};
    CHARGED_ASSERT(p && tries >= 0);
    if ((unsigned)outcome >= sizeof(rows) / sizeof(rows[0]))
        outcome = PROVIDER_REQUIRES_REVIEW; /* an answer we cannot place */
    int again = 0;
    switch (rows[outcome].retry) {
    case NEVER:
        break;
    case WHILE_KEY_KEPT:
        again = key_window_open;
        break;
    case WHILE_RETRIES_AND_KEY_KEPT:
        again = key_window_open && tries <= p->unknown_retries;
        break;
    }
    if (again) {
        d.next = ANSWER_NEXT_RETRY;
        d.retry_in_ms =
            retry_backoff_ms(p->retry_base_ms, p->retry_max_ms, tries, jitter);
        return d;
    }
    d.next = ANSWER_NEXT_SETTLE;
    d.status = rows[outcome].status;
    d.event_type = attempt_status_event_type(d.status);
    d.next_check_ms = rows[outcome].looked_at ? p->first_look_ms : -1;
    d.reason_code = rows[outcome].reason_code;
    /* The worker settles from PROCESSING: every row is a move it may make. */
    CHARGED_ASSERT(
        attempt_status_transition_allowed(ATTEMPT_STATUS_PROCESSING, d.status));
    CHARGED_ASSERT(d.next_check_ms == -1 || d.next_check_ms >= 0);
    return d;
}
