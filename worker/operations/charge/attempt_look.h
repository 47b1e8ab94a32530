/* attempt_look: the reconciler's look at a payment attempt (op.h's struct
 * op_reconcile), for each operation over attempts: a charge's
 * (charge_reconcile.c) and an authorization's (authorize/). One order of
 * evidence and one store; what differs is what the intent's status means
 * (the operation's own order: reconcile_policy_decide_as) and the attempts
 * each claims (attempt_store_new_of: its capture method). */
#ifndef CHARGED_ATTEMPT_LOOK_H
#define CHARGED_ATTEMPT_LOOK_H

#include "op.h"

/* The claimed row (struct attempt_due) into *start, and a look begun on
 * it in order (an operation's own, on attempts of capture_method manual;
 * NULL: the charge's, RECONCILE_KIND_CHARGE). */
void attempt_look_begin(const struct reconcile_order *order,
                        const struct op_look_env *env, const void *row,
                        struct op_look_start *start, struct reconcile_look *core,
                        int64_t claimed_at);
/* A call of the look other than the list: the retrieve, the search, or
 * the attempt's own request again under its key (op_attempts_request: an
 * authorization's as one). */
void attempt_look_call(const struct op_look_env *env, const void *row,
                       enum reconcile_next next, struct provider_result *res);
/* One page of the list of the key's window. */
void attempt_look_page(const struct op_look_env *env, const void *row,
                       const char *after, struct provider_result *page);
/* The settlement, with its calls, by attempt_store_settle; event_type: the
 * result event when not the status's own (NULL). */
enum charged_rc attempt_look_settle(void *store, struct op_settlement *s,
                                    const char *event_type, struct charged_error *err);

/* The log words, stages and metrics of a look at an attempt. */
#define ATTEMPT_LOOK_FACE                                                              \
    .words = {.noun = "attempt",                                                       \
              .id_key = "payment_attempt_id",                                          \
              .about_key = "order_id",                                                 \
              .object_key = "provider_payment_id",                                     \
              .refused = "a settlement"},                                              \
    .stages = {.claim = "claim", .settle = "settle", .backlog = "count backlog"},      \
    .metrics = {.settlements = METRIC_RECONCILER_SETTLEMENTS,                          \
                .backlog = METRIC_RECONCILER_BACKLOG,                                  \
                .oldest = METRIC_RECONCILER_OLDEST},                                   \
    .due_size = sizeof(struct attempt_due), .call = attempt_look_call,                 \
    .page = attempt_look_page

#endif
