/* reconcile_look: one look of the reconciler's, without I/O.
 *
 * What the reconciler concludes from the provider's answers, as a machine
 * the reconciler (worker/roles/reconciler.c) and the simulation (tests/sim)
 * both run: each step names the next call of the look, in
 * reconcile_policy's order of evidence for a charge or a refund, or ends
 * it with the decision (the status the record settles to, its own meaning
 * "look again later", the reason, the provider's object booked). The
 * caller makes the call and writes the answer where the step says, then
 * steps again. reconcile_look_next_check_ms says when a record is looked
 * at next after its settlement, reconcile_look_throttled_ms when after a
 * look the provider throttled.
 *
 * Pure: no database, no network, no clock (the caller passes its
 * monotonic now). */
#ifndef CHARGED_RECONCILE_LOOK_H
#define CHARGED_RECONCILE_LOOK_H

#include "attempt_status.h"
#include "provider_outcome.h"
#include "reconcile_policy.h"

/* What a look is at: a payment attempt's charge, or a refund; another
 * operation brings its own order of evidence (reconcile_look_begin_order:
 * an authorization's is the charge's with its own meanings,
 * reconcile_policy_decide_as). */
enum reconcile_kind {
    RECONCILE_KIND_CHARGE = 0,
    RECONCILE_KIND_REFUND,
    RECONCILE_KIND__COUNT /* a look begun with an operation's own order */
};

/* An order of evidence: its decision (reconcile_policy_decide's shape),
 * and the name of each call it asks for (NULL: never asked; a look that
 * asks for it ends, the record as it was). */
typedef void (*reconcile_decide_fn)(const struct reconcile_limits *lim,
                                    const struct reconcile_attempt *a,
                                    const struct reconcile_evidence *e,
                                    struct reconcile_decision *out);
struct reconcile_order {
    reconcile_decide_fn decide;
    const char *operation[RECONCILE_LIST + 1];
};

/* Calls one look makes at most: a look-up, then perhaps the call again
 * under the key or a walk of the list (one call, however many pages); or,
 * with no id recorded, the call again, the search, the list. */
#define RECONCILE_LOOK_MAX_CALLS 3

struct reconcile_look {
    enum reconcile_kind kind;
    const struct reconcile_order *order; /* the kind's, or the operation's */
    struct reconcile_limits lim;
    struct reconcile_attempt a; /* its strings are the caller's, kept while
                                   the look lasts */
    long long claimed_at;       /* the caller's monotonic clock at the claim */
    struct provider_result res[RECONCILE_LOOK_MAX_CALLS]; /* the answers */
    int ncalls;
    struct reconcile_evidence e; /* points into res */
};

/* One step of a look: a call to make, or the end. */
struct reconcile_step {
    enum reconcile_next next; /* RECONCILE_SETTLE: over, see dec */
    /* A call: its name for provider_calls, metrics and evidence
     * ("retrieve", "search", "charge", "list"; a refund's
     * "retrieve_refund", "refund", "list_refunds"), its index in res, and
     * where its answer goes before the next step. */
    const char *operation;
    int call;
    struct provider_result *answer;
    /* RECONCILE_SETTLE: the decision; dec.status is the record's own when
     * it stays as it was (looked at, to look again). */
    struct reconcile_decision dec;
};

/* Starts a look at a (kind's order of evidence, lim's times), claimed at
 * claimed_at on the caller's monotonic clock. */
void reconcile_look_begin(struct reconcile_look *l, enum reconcile_kind kind,
                          const struct reconcile_limits *lim,
                          const struct reconcile_attempt *a, long long claimed_at);
/* Starts a look as reconcile_look_begin, in an operation's own order of
 * evidence (kept, not copied: a static table of the operation's). */
void reconcile_look_begin_order(struct reconcile_look *l,
                                const struct reconcile_order *order,
                                const struct reconcile_limits *lim,
                                const struct reconcile_attempt *a,
                                long long claimed_at);

/* The look's next step at now (the caller's monotonic clock, not before
 * claimed_at): the key ages while the look goes on, and each decision, a
 * call again under the key above all, is taken on its age now. A call's
 * answer must be in *out->answer before the next step. */
void reconcile_look_step(struct reconcile_look *l, long long now,
                         struct reconcile_step *out);

/* The wait before a settled record's next look, or -1 for none: one that
 * kept its status (looked at), or was left PROCESSING or UNKNOWN, is
 * looked at again after schedule[checks] (its last entry past its end);
 * checks: the looks so far. */
long long reconcile_look_next_check_ms(enum attempt_status from, enum attempt_status to,
                                       const long long *schedule, int nschedule,
                                       int checks);

/* The wait before the record of a look a 429 ended (dec->throttled) is
 * looked at again: the provider's Retry-After, or the back-off
 * (provider_outcome_throttled_wait_ms; in_a_row: the caller's throttled
 * looks in a row before this one). Such a look was no look: it is not
 * counted among the record's checks, and its schedule does not advance. */
long long reconcile_look_throttled_ms(const struct reconcile_decision *dec,
                                      int in_a_row);

#endif
