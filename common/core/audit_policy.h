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
    /* An authorization's steps (issue 37): audit_policy_steps. */
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
     * judged by audit_policy_steps (capture_unbooked), not here. */
    int steps_ours;
};

/* An intent and the steps of the attempt that recorded it as its own (the
 * id charged kept from its own call's answer, or its key's replay): what
 * audit_policy_steps judges. Strings are never NULL ("" when absent). */
struct audit_step_facts {
    int manual;                      /* the provider's capture_method is manual */
    const char *status;              /* the intent's */
    long long amount;                /* what the intent held (authorized) */
    long long amount_received;       /* what its capture took; -1: not said */
    const char *cancellation_reason; /* the provider's; "automatic": it expired */
    /* The attempt that recorded this intent: "" status when none. */
    const char *attempt_status;
    long long attempt_amount;   /* what we authorized */
    long long attempt_captured; /* captured_amount; -1: none */
    long long capture_booked;   /* a SUCCEEDED capture's captured_amount; -1: none */
    long long capture_asked;    /* the most a capture of ours sent asked; -1: none */
    int capture_unsettled;      /* a capture of it PENDING, PROCESSING or UNKNOWN */
    int void_unsettled;         /* a void of it, the same */
    /* Not recorded by any attempt, but its metadata names one of ours that
     * recorded none yet and is unsettled: it may still become ours. */
    int named_unsettled;
};

/* The rules of audit_policy_steps, one result each, in this order. */
enum audit_step_rule {
    AUDIT_STEP_OVER_AUTHORIZED = 0,
    AUDIT_STEP_CAPTURE,
    AUDIT_STEP_VOID,
    AUDIT_STEP_EXPIRED,
    AUDIT_STEP__COUNT
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

/* An authorization's findings: out[rule] for each rule of audit_step_rule
 * (matched when it does not apply). Not manual, or not ours: all matched.
 * Returns 1 when any is pending (the intent is looked at again). */
int audit_policy_steps(const struct audit_step_facts *f,
                       struct audit_result out[AUDIT_STEP__COUNT]);
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
