/* charge_policy: what follows a provider's answer to a charge, as one table.
 *
 * Pure: no clock, no I/O. Given the answer's outcome, how many tries of its
 * kind were made, and whether the key is still inside the provider's
 * retention window, it says whether to send again (and after how long) or
 * to settle the attempt (its status, its result event, and when the
 * reconciler should first look at it). The worker applies the decision.
 * The reconciler settles by its own rules (what a status lookup answers) and
 * shares only the key-window checks below, so that neither sends under a key
 * the provider may have forgotten. */
#ifndef CHARGED_CHARGE_POLICY_H
#define CHARGED_CHARGE_POLICY_H

#include "answer_decision.h"
#include "attempt_status.h"
#include "provider_outcome.h"

struct charge_policy {
    int unknown_retries;     /* sends again after an unknown outcome */
    long long retry_base_ms; /* first back-off */
    long long retry_max_ms;  /* back-off cap */
    long long first_look_ms; /* an unknown or processing outcome waits this long
                                for the reconciler's first look (a webhook may
                                settle it before) */
};

/* tries: sends of this kind so far (not executed, or unknown), including
 * the one just answered. key_window_open: another send would still reach
 * the provider while it remembers the key. jitter: any number that differs
 * between attempts (spreads their retries). */
struct answer_decision charge_policy_decide(const struct charge_policy *p,
                                            enum provider_outcome outcome, int tries,
                                            int key_window_open, unsigned jitter);

/* The margin kept before the provider's key retention: one call's time on
 * the wire, and clock differences between the database and the provider (a
 * tenth of the retention, at most 60 s). */
long long charge_policy_key_margin_ms(long long key_retention_ms,
                                      long long provider_timeout_ms);

/* May a call under a key this old (ms since first sent, database clock) be
 * sent? Not once the provider may have forgotten the key: a POST could
 * then charge a second time. */
int charge_policy_key_window_open(long long key_age_ms, long long key_retention_ms,
                                  long long provider_timeout_ms);

#endif
