/* audit_policy: what the auditor concludes about one provider object or
 * one ledger row, from the facts the store gathered about it.
 *
 * Pure: no database, no network, no clock. The store answers, for each
 * object the provider listed, what charged has of it (the ledger row booked
 * on it, the attempt its metadata names, another charge of that attempt or
 * order); this module says which finding that is, or that the object
 * matches, or that it cannot be judged yet (pending: looked at again next
 * cycle). docs/auditor.md is the same table in prose. */
#ifndef CHARGED_AUDIT_POLICY_H
#define CHARGED_AUDIT_POLICY_H

#include <stddef.h>

/* Of the operations' rules (struct audit_steps), at most: columns of
 * the step statement, rules, and operations with rules. */
#define AUDIT_STEP_COLUMNS_MAX 8
#define AUDIT_STEP_RULES_MAX   8
#define AUDIT_STEP_SETS_MAX    8

/* Finding kinds, as stored and in metrics; new ones are added last. */
enum audit_kind {
    AUDIT_CHARGED_TWICE = 0,
    AUDIT_CHARGED_UNBOOKED,
    AUDIT_BOOKED_NOT_CHARGED,
    AUDIT_AMOUNT_MISMATCH,
    AUDIT_CURRENCY_MISMATCH,
    AUDIT_UNKNOWN_INTENT,
    AUDIT_REFUND_UNBOOKED,
    AUDIT_REFUNDED_OVER_CHARGE,
    AUDIT_BOOKED_FOREIGN, /* booked for an attempt or refund it is not (ownership) */
    AUDIT_FOREIGN_INTENT, /* names an attempt of ours whose intent it is not */
    /* Of the operations' rules about a manual intent's steps
     * (audit_policy_steps: the capture's and the void's, issue 37). */
    AUDIT_CAPTURED_OVER_AUTHORIZED,       /* received more than held or asked */
    AUDIT_CAPTURE_UNBOOKED,               /* captured; our books show no such capture */
    AUDIT_VOID_UNBOOKED,                  /* released by a cancel; we are not VOIDED */
    AUDIT_AUTHORIZATION_EXPIRED_UNVOIDED, /* the hold lapsed on the customer's card */
    AUDIT_KIND__COUNT
};

/* "charged_twice", ...; NULL out of range. */
const char *audit_kind_name(enum audit_kind k);
/* The kind of a name; -1 when none. */
int audit_kind_parse(const char *name);

enum audit_outcome {
    AUDIT_MATCHED = 0, /* the ledger and the provider agree */
    AUDIT_FINDING,     /* kind says which */
    AUDIT_PENDING,     /* not decidable yet: look again */
};

struct audit_result {
    enum audit_outcome outcome;
    enum audit_kind kind;
    const char *detail; /* a static phrase for the finding's detail */
    /* A finding (or pending) about the money, on an intent that is also
     * another client's use of our attempt's metadata: record
     * AUDIT_FOREIGN_INTENT too. */
    int also_foreign;
};

/* One listed intent and what charged has of it. Strings are never NULL
 * ("" when absent). */
struct audit_intent_facts {
    const char *status;       /* the provider's: succeeded, processing, ... */
    long long amount;         /* the provider's */
    const char *currency;     /* the provider's, lower case */
    int has_attempt_metadata; /* metadata[payment_attempt_id] is present */
    /* The ledger's charge row booked on this intent, if any. */
    int booked;
    long long booked_amount;
    const char *booked_currency; /* upper case, as the ledger keeps it */
    /* The attempt its metadata names: "" when we have none. */
    const char *attempt_status;
    /* Another provider charge of that attempt booked in the ledger. */
    int attempt_booked_other;
    /* Another SUCCEEDED attempt of the metadata's order, on another intent. */
    int order_booked_other;
    /* An earlier succeeded intent of the same attempt or order among the
     * provider's objects already seen (neither booked, say). */
    int earlier_twin;
    /* Whose intent it is (ownership.h), for the attempt it is judged for:
     * the booking's when booked, else the one its metadata names. */
    const char *object_id;           /* the intent's id */
    const char *attempt_recorded_id; /* the id that attempt recorded from its
                                        own call's answer (or booked): "" none */
    int recorded_elsewhere;          /* the intent is recorded for another attempt */
    int names_another;               /* its metadata names another attempt or order */
    /* An attempt of its metadata's order is unsettled: it may still succeed
     * on an intent of its own, which makes this one a second charge. */
    int order_unsettled;
    /* Booked: an unbooked succeeded intent in the copy names only its order
     * (made before this charge, or before its attempt, and judged then). */
    int order_only_twin;
    /* An authorization (capture_method manual): its money is what the
     * provider received at the capture (amount_received), not its amount
     * (what it held), for a booking's comparisons. */
    int manual;
    long long amount_received; /* -1: not said */
    /* Manual, and recorded by an attempt of ours: its money, unbooked, is
     * judged by the operations' rules (audit_policy_steps), not here. */
    int steps_ours;
};

/* An intent and the attempt that recorded it as its own (the id charged
 * kept from its own call's answer, or its key's replay): what
 * audit_policy_steps judges with the rules of the operations whose steps
 * act on it (struct audit_steps). Strings are never NULL ("" when absent). */
struct audit_step_facts {
    int manual;                      /* the provider's capture_method is manual */
    const char *status;              /* the intent's */
    long long amount;                /* what the intent held */
    long long amount_received;       /* what the provider took of it; -1: not said */
    const char *cancellation_reason; /* the provider's; "automatic": it expired */
    /* The attempt that recorded this intent: "" status when none. */
    const char *attempt_status;
    long long attempt_amount; /* what we asked to hold */
    /* Not recorded by any attempt, but its metadata names one of ours that
     * recorded none yet and is unsettled: it may still become ours. */
    int named_unsettled;
    /* The operations' own facts of the attempt: their columns of the step
     * statement (audit_steps.columns), in the table's order. */
    long long columns[AUDIT_STEP_COLUMNS_MAX];
};

/* ---- an operation's rules about the intents its steps act on ---- */

/* One rule: a finding kind it may record, judged on the facts. */
struct audit_step_rule {
    /* Judged whoever recorded the intent, and while the provider still
     * holds it (1); else only once it is ours and no longer held. */
    int any_owner;
    /* The result; cols: its operation's columns; ours: an attempt of
     * ours recorded the intent. */
    struct audit_result (*judge)(const struct audit_step_facts *f,
                                 const long long *cols, int ours);
    /* A finding's ledger amount: what our books hold against the
     * provider's (-1: none). NULL: none. */
    long long (*books)(const struct audit_step_facts *f, const long long *cols);
    int money; /* a finding's provider amount is what the provider took */
    int error; /* a fresh finding is logged as an error (money), else a warning */
};

/* An operation's rules (struct payment_op's audit): the columns its facts
 * need, each an SQL expression of the step statement over `r`, the
 * attempt that recorded the intent (all NULL when none), answering a
 * bigint (a flag as 0 or 1); and its rules, judged in order. */
struct audit_steps {
    const char *help; /* its part of `charged auditor --help`'s list of kinds */
    /* Its findings' kinds, and whose intents its rules judge
     * ("authorizations", the same for every operation's): `chargectl
     * audit --help`'s list. */
    const enum audit_kind *kinds;
    size_t nkinds;
    const char *of;
    const char *const *columns;
    size_t ncolumns;
    const struct audit_step_rule *rules;
    size_t nrules;
};

/* The rules of every operation of the table that has some, in its order. */
struct audit_step_table {
    const struct audit_steps *sets[AUDIT_STEP_SETS_MAX];
    size_t n;
};

/* One listed refund and what charged has of it. */
struct audit_refund_facts {
    const char *status; /* succeeded, pending, requires_action, failed, canceled */
    long long amount;
    const char *currency;
    /* The refund attempt booked on this provider refund, if any. */
    int booked;
    long long booked_amount;
    /* The refund attempt its metadata names: "" when we have none. */
    const char *refund_status;
    /* Booked: the intent the booking's charge is on, the intent the refund
     * is on, and whether its metadata names another refund. */
    const char *booked_intent;
    const char *object_intent;
    int names_another;
};

/* One ledger row of a window, and what the provider said of its object
 * (NULL status: the provider does not have it: 404). */
struct audit_ledger_facts {
    const char *provider_status;
    long long provider_amount;
    const char *provider_currency;
    long long amount;
    const char *currency;
};

struct audit_result audit_policy_intent(const struct audit_intent_facts *f);

/* The findings of the table's rules about a manual intent: out[i] for
 * its i-th rule, counting the sets in order (matched when it does not
 * apply); *n of them. Not manual: all matched. Returns 1 when any is
 * pending (the intent is looked at again). */
int audit_policy_steps(const struct audit_step_facts *f,
                       const struct audit_step_table *t,
                       struct audit_result out[AUDIT_STEP_RULES_MAX], size_t *n);

/* A rule's results (struct audit_step_rule's judge). */
struct audit_result audit_result_matched(void);
struct audit_result audit_result_pending(const char *why);
struct audit_result audit_result_finding(enum audit_kind k, const char *why);
/* A step of the attempt, or the attempt, may still settle on the
 * provider's evidence (the reconciler or a webhook will): 1. One in
 * review waits for a person, and is not waited for. */
int audit_policy_step_grace(const char *attempt_status, int step_unsettled);
struct audit_result audit_policy_refund(const struct audit_refund_facts *f);

/* The order-only intent of a booked one's facts (order_only_twin), judged
 * from the booked side: a second charge of an order now paid, whichever of
 * the two was judged first. A finding, or matched when there is none. */
struct audit_result audit_policy_order_twin(const struct audit_intent_facts *f);
struct audit_result audit_policy_ledger(const struct audit_ledger_facts *f);

/* The succeeded refunds of one charge add up past the charge (the ledger's
 * amount when it booked the charge, else the provider's own): 1. */
int audit_policy_over_refunded(long long refunded_total, long long charge_amount);

/* Case-insensitive comparison of two ISO 4217 codes: 1 when equal. */
int audit_policy_same_currency(const char *a, const char *b);

#endif
