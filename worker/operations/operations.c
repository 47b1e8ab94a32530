/* The table of operations (op.h): one line an operation. */
#include "op.h"

#include <string.h>

#include "charged_assert.h"

/* Each line names an operation's struct payment_op, defined in its folder. */
#define PAYMENT_OPERATIONS(X)                                                          \
    X(charge_payment_op)                                                               \
    X(refund_payment_op)                                                               \
    X(authorize_payment_op)                                                            \
    X(capture_payment_op)                                                              \
    X(void_payment_op)                                                                 \
    /* (the end of the table: a new operation is one more line above) */

#define DECLARE(op) extern const struct payment_op op;
#define ENTRY(op)   &op,
PAYMENT_OPERATIONS(DECLARE)

const struct payment_op *const payment_operations[] = {PAYMENT_OPERATIONS(ENTRY)};
const size_t payment_operations_count =
    sizeof(payment_operations) / sizeof(payment_operations[0]);
_Static_assert(sizeof(payment_operations) / sizeof(payment_operations[0]) <=
                   PAYMENT_OPS_MAX,
               "PAYMENT_OPS_MAX holds the table");

/* The manual intents' steps apply some events, the charge others: one no
 * line takes is of a type none applies to an intent of its capture method. */
const char payment_ops_unmatched_reason[] =
    "no operation applies this event type to this intent's capture method";

const struct payment_op *payment_op_of(size_t kind)
{
    CHARGED_ASSERT(kind < payment_operations_count);
    const struct payment_op *op = payment_operations[kind];
    /* Every line of the table names an operation with a name and a type. */
    CHARGED_ASSERT(op && op->name && op->command_type);
    return op;
}

void payment_ops_audit_steps(struct audit_step_table *t)
{
    CHARGED_ASSERT(t);
    _Static_assert(PAYMENT_OPS_MAX <= AUDIT_STEP_SETS_MAX, "a set for every operation");
    t->n = 0;
    for (size_t k = 0; k < payment_operations_count; k++)
        if (payment_operations[k]->audit)
            t->sets[t->n++] = payment_operations[k]->audit;
}

void payment_ops_history(struct attempt_history_table *t)
{
    CHARGED_ASSERT(t);
    _Static_assert(PAYMENT_OPS_MAX <= ATTEMPT_HISTORY_STEPS_MAX,
                   "steps of every operation");
    t->n = 0;
    for (size_t k = 0; k < payment_operations_count; k++)
        if (payment_operations[k]->history)
            t->steps[t->n++] = payment_operations[k]->history;
}

size_t payment_ops_reviews(const struct step_review_kind **out)
{
    size_t n = 0;
    CHARGED_ASSERT(out);
    for (size_t k = 0; k < payment_operations_count; k++)
        if (payment_operations[k]->review)
            out[n++] = payment_operations[k]->review;
    return n;
}

const struct step_review_kind *payment_ops_review(const char *noun)
{
    CHARGED_ASSERT(noun);
    for (size_t k = 0; k < payment_operations_count; k++) {
        const struct step_review_kind *r = payment_operations[k]->review;
        if (r && !strcmp(r->noun, noun))
            return r;
    }
    return NULL;
}

int payment_ops_add_settings(void)
{
    for (size_t k = 0; k < payment_operations_count; k++) {
        const struct config_setting *const *s = payment_operations[k]->settings;
        size_t n = 0;
        while (s && s[n])
            n++;
        if (n && config_add_settings(s, n) != 0)
            return -1;
    }
    return 0;
}
