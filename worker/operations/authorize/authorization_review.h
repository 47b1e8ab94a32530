/* authorization_review: an operator's decision on an authorization (a
 * payment attempt of capture_method manual) in REQUIRES_REVIEW: captured
 * behind our back (by no capture of ours), a void that found it captured
 * (void_after_capture), or anything else automation could not place.
 * Through step_review (step_review.h: the provider asked first for the
 * intent charged recorded, a contradiction refused unless forced, one
 * transaction with the actor). The decisions are what the intent shows:
 *
 *   SUCCEEDED   succeeded, amount_received 1..the authorization's: the
 *               attempt SUCCEEDED with captured_amount = amount_received
 *               and the ledger's charge row (no event: an authorization's
 *               SUCCEEDED is a capture's, and no capture of ours did it);
 *   AUTHORIZED  requires_capture, amount_capturable >= 1: held again
 *               (authorization.succeeded), for a capture or a void;
 *   VOIDED      canceled, nothing received: released (reason `expired`
 *               when the provider's own expiry did it, else `voided`;
 *               authorization.failed: no money is held for the order);
 *   FAILED      never held: requires_payment_method or canceled, nothing
 *               received (authorization.failed).
 *
 * A step that holds the authorization keeps its hold through AUTHORIZED;
 * SUCCEEDED, VOIDED and FAILED spend it (migration 0016's trigger): such a
 * step is then resolved on its own (capture_review, void_review). A
 * charge (capture_method automatic) is not an authorization: its review is
 * attempt_review's. `chargectl authorization resolve` decides through
 * here. */
#ifndef CHARGED_AUTHORIZATION_REVIEW_H
#define CHARGED_AUTHORIZATION_REVIEW_H

#include "step_review.h"

extern const struct step_review_kind authorization_review_kind;

/* authorization_review_kind's judge: pure, for tests. */
const char *authorization_review_judge(const struct provider_result *r,
                                       enum attempt_status decision,
                                       const struct step_review_row *row, char *says,
                                       size_t size);

#endif
