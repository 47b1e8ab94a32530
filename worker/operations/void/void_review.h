/* void_review: an operator's decision on a void in REQUIRES_REVIEW (settled
 * past RECONCILER_MAX_AGE_MS), through step_review (step_review.h: the
 * provider asked first, a contradiction refused unless forced, one
 * transaction with the actor).
 *
 * SUCCEEDED needs the authorization's intent canceled by a request (not the
 * provider's own expiry, cancellation_reason "automatic"), nothing
 * received: the authorization VOIDED as every writer of voids moves it
 * (void_store_move_sql, cause operator), then the void SUCCEEDED with the
 * amount released and void.succeeded. FAILED needs the intent not released
 * by a request: still requires_capture (the 0016 trigger gives the hold
 * back: AUTHORIZED again), expired (the same; the provider released it
 * itself), or captured: then the void's reason is void_after_capture and
 * its authorization goes to REQUIRES_REVIEW (authorization.requires_review),
 * money having moved that no capture of ours recorded. The void publishes
 * void.failed. `chargectl void resolve` decides through here. */
#ifndef CHARGED_VOID_REVIEW_H
#define CHARGED_VOID_REVIEW_H

#include "step_review.h"

extern const struct step_review_kind void_review_kind;

/* void_review_kind's judge: pure, for tests. */
const char *void_review_judge(const struct provider_result *r,
                              enum attempt_status decision,
                              const struct step_review_row *row, char *says,
                              size_t size);

#endif
