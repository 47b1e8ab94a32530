/* reconcile_answers: the provider's answers of the reconciler's unit tests
 * (test_reconcile_policy.c, an operation's own order of evidence:
 * test_authorize_look.c), written as docs/reconciler.md has them, and the
 * limits they are judged with. */
#ifndef CHARGED_TEST_RECONCILE_ANSWERS_H
#define CHARGED_TEST_RECONCILE_ANSWERS_H

#include <stdio.h>
#include <string.h>

#include "reconcile_policy.h"

#define ATT      "00000000-0000-4000-8000-000000000001"
#define RET_MS   86400000LL /* WORKER_KEY_RETENTION_MS: a day */
#define LAG_MS   3600000LL  /* RECONCILER_SEARCH_LAG_MS */
#define MAX_AGE  604800000LL
#define MARGIN   70000LL /* the worker's margin: the timeout + a tenth, at most 60 s */
#define WINDOW   (RET_MS - MARGIN) /* the key's age from which nothing is sent */
#define PAST_LAG (RET_MS + LAG_MS) /* the key's age from which the list is asked */

static const struct reconcile_limits lim = {.key_retention_ms = RET_MS,
                                            .provider_timeout_ms = 10000,
                                            .search_lag_ms = LAG_MS,
                                            .max_age_ms = MAX_AGE};

/* What the provider answered, as provider_client classifies it. */
struct answer {
    enum provider_outcome outcome;
    int http_status, matches;
    long long amount;
    const char *currency, *attempt_id, *ppid, *intent_status;
    const char *code, *decline_code, *param, *error;
    const char *cancellation_reason;
    int throttled; /* a 429 */
    long long retry_after_ms;
};

/* An intent found (or our charge's), with the attempt's amount, currency and
 * id unless a row says otherwise. */
#define INTENT_HTTP(o, st, pi, http)                                                   \
    .outcome = o, .http_status = http, .intent_status = st, .ppid = pi
#define INTENT(o, st, pi) INTENT_HTTP(o, st, pi, 200)
#define OURS              .amount = 1000, .currency = "usd", .attempt_id = ATT
#define ONE               .matches = 1
#define A(...)            (&(const struct answer){__VA_ARGS__})

#define PAID      A(INTENT(PROVIDER_SUCCEEDED, "succeeded", "pi_1"), OURS, ONE)
#define NOT_FOUND A(.outcome = PROVIDER_NOT_FOUND, .http_status = 200)
#define NO_ANSWER A(.outcome = PROVIDER_UNKNOWN, .error = "timeout after 10000 ms")
/* A 429 (issue 38): a look-up's (UNKNOWN) and a call's again under the key
 * (NOT_EXECUTED), with the provider's Retry-After (0: none given). */
#define THROTTLED_AS(o, ra)                                                            \
    A(.outcome = o, .http_status = 429, .throttled = 1, .retry_after_ms = ra,          \
      .error = "answered 429")
#define THROTTLED(ra)      THROTTLED_AS(PROVIDER_UNKNOWN, ra)
#define THROTTLED_CALL(ra) THROTTLED_AS(PROVIDER_NOT_EXECUTED, ra)
/* A hold: the intent of an authorization, requires_capture. */
#define HELD A(INTENT(PROVIDER_AUTHORIZED, "requires_capture", "pi_h"), OURS, ONE)

/* The answer a into *res, as the provider client fills it. */
static inline void fill(struct provider_result *res, const struct answer *a)
{
    memset(res, 0, sizeof(*res));
    res->outcome = a->outcome;
    res->http_status = a->http_status;
    res->matches = a->matches;
    res->amount = a->amount;
    res->throttled = a->throttled;
    res->retry_after_ms = a->retry_after_ms;
#define COPY(field, value)                                                             \
    snprintf(res->field, sizeof(res->field), "%s", value ? value : "")
    COPY(currency, a->currency);
    COPY(intent_attempt_id, a->attempt_id);
    COPY(provider_payment_id, a->ppid);
    COPY(intent_status, a->intent_status);
    COPY(code, a->code);
    COPY(decline_code, a->decline_code);
    COPY(param, a->param);
    COPY(error, a->error);
    COPY(cancellation_reason, a->cancellation_reason);
#undef COPY
}

#endif
