/* webhook_attempts: the attempts the webhook decisions' unit tests judge
 * events on (test_webhook_event.c; an operation's own:
 * test_authorize_webhook.c), as the database would hold them. */
#ifndef CHARGED_TEST_WEBHOOK_ATTEMPTS_H
#define CHARGED_TEST_WEBHOOK_ATTEMPTS_H

#include "webhook_event.h"

/* Whose the event's intent is, as the database tells it. */
enum owner {
    OURS,     /* we recorded it from our own call's answer */
    UNPROVEN, /* we recorded none: it only names the attempt */
    OTHER,    /* we recorded another one */
    ELSE,     /* it is recorded for another attempt (we recorded none) */
};

#define S_(x)  ATTEMPT_STATUS_##x
#define EV(x)  WEBHOOK_EVIDENCE_##x
#define ACT(x) WEBHOOK_##x

/* The attempt as the database would hold it for `owner`. */
static inline struct webhook_attempt attempt_for(enum attempt_status st,
                                                 enum owner owner)
{
    struct webhook_attempt a = {
        .status = st, .amount = 1999, .currency = "EUR", .updated_at = 1500};
    a.intent_recorded = owner == OURS || owner == OTHER;
    a.intent_differs = owner == OTHER;
    a.intent_elsewhere = owner == ELSE;
    return a;
}

#endif
