/* audit_run: one audit of a window of the provider's books against the
 * ledger, for `charged auditor` (scheduled windows) and `chargectl audit
 * run` (on demand).
 *
 * Streaming: one page of 100 provider objects is in memory at a time, and
 * a batch of ledger rows; whatever a window holds, memory does not grow
 * with it. The provider's list is the evidence: intents then refunds
 * created in the window are each copied, judged by audit_policy and, when
 * they do not match, recorded as a finding; then the ledger rows booked in
 * the window whose object the copy does not confirm are looked up one by
 * one on the provider (a ledger row whose intent was created in another
 * window is confirmed that way, not called missing). Nothing is concluded
 * from a failed call: the audit stops and is done again whole, which
 * records nothing twice. A throttled call (429) is no failure: it is asked
 * again after the provider's Retry-After or a back-off, within the hooks'
 * bound (issue 38: a 429 slows the auditor, never stops it). */
#ifndef CHARGED_AUDIT_RUN_H
#define CHARGED_AUDIT_RUN_H

#include <stddef.h>

#include "audit_store.h"
#include "provider_client.h"

struct audit_run_hooks {
    void (*heartbeat)(void); /* after each page: the loop is alive; NULL: none */
    int (*stopping)(void);   /* non-zero: give up the audit now; NULL: never */
    /* A request the provider throttled (429) is asked again after its
     * Retry-After, or the back-off when it gave none
     * (provider_outcome_throttled_wait_ms), while the waits for that one
     * request add up to at most this; past it, the audit fails as for a
     * request with no answer. 0 (or no hooks): never asked again. */
    long long throttled_wait_ms;
};

/* What one audit observed and recorded. */
struct audit_run_result {
    struct audit_verdict verdict;       /* counts and findings observed */
    long long fresh[AUDIT_KIND__COUNT]; /* findings recorded for the first time */
    long long verdict_id;               /* the verdict's row; 0 when not recorded */
};

/* Each takes the rules of the operations whose steps act on the provider's
 * manual intents (struct audit_step_table: the operations table's,
 * payment_ops_audit_steps). */

/* Audits [start, end) (unix s) and, when it completed, records its verdict
 * (scheduled: as the watermark's next window; *recorded 0 when another
 * auditor recorded it first). CHARGED_OK, or CHARGED_RETRY with err (the
 * store or the provider failed, or the role is stopping): nothing
 * concluded of the objects not yet judged, no verdict; the window is
 * audited again later. */
enum charged_rc audit_run_window(provider_client_t *pc, audit_store_t *st,
                                 long long start, long long end, int scheduled,
                                 const char *auditor,
                                 const struct audit_step_table *steps,
                                 const struct audit_run_hooks *hooks,
                                 struct audit_run_result *out, int *recorded,
                                 struct charged_error *err);

/* Looks again, on the provider's word, at up to max objects that could not
 * be judged before; adds what it finds to out->fresh and out->verdict's
 * findings. CHARGED_OK, or CHARGED_RETRY with err: the rest is looked at
 * next time. */
enum charged_rc audit_run_pending(provider_client_t *pc, audit_store_t *st, size_t max,
                                  const struct audit_step_table *steps,
                                  const struct audit_run_hooks *hooks,
                                  struct audit_run_result *out,
                                  struct charged_error *err);

#endif
