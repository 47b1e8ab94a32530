/* capture_review: an operator's decision on a capture in REQUIRES_REVIEW
 * (settled past RECONCILER_MAX_AGE_MS, or captured at the provider while
 * its authorization could not be booked as its own), through step_review
 * (step_review.h: the provider asked first, a contradiction refused unless
 * forced, one transaction with the actor).
 *
 * SUCCEEDED needs the authorization's intent succeeded with amount_received
 * the capture's (what it asked, or at most what was authorized): the
 * authorization is booked as every writer books it (capture_store_book:
 * SUCCEEDED with captured_amount, its transition, the ledger's charge row;
 * or found booked with that amount already), then the capture SUCCEEDED
 * and capture.succeeded. FAILED needs the intent not captured (still
 * requires_capture, or canceled, amount_received 0): the capture FAILED
 * with the operator's reason and capture.failed; the 0016 trigger gives the
 * hold back, so the authorization is AUTHORIZED again for a later step.
 * `chargectl capture resolve` decides through here. */
#ifndef CHARGED_CAPTURE_REVIEW_H
#define CHARGED_CAPTURE_REVIEW_H

#include "step_review.h"

extern const struct step_review_kind capture_review_kind;

/* capture_review_kind's judge: pure, for tests. */
const char *capture_review_judge(const struct provider_result *r,
                                 enum attempt_status decision,
                                 const struct step_review_row *row, char *says,
                                 size_t size);

#endif
