/* webhook_event: what a provider webhook says, and what it does to an
 * attempt or a refund.
 *
 * The event is provider-neutral: the provider's backend parses its own
 * shape into it (provider.h, parse_event; the Stripe backend's is
 * stripe_webhook_parse), keeping what the decisions need. The decision is
 * a pure table: evidence (succeeded, failed, processing) x the
 * attempt's status x whether the event's intent is the attempt's own
 * (ownership.h: the intent we recorded from our own call's answer; an
 * intent that merely names the attempt in its metadata is not) -> apply a
 * new status, flag for review, or record and ignore. The rules:
 *   - an intent not proven ours never moves the attempt: its success (it
 *     could be money) is flagged loudly, its failure or processing is
 *     recorded and ignored; an UNKNOWN attempt is made due for the
 *     reconciler at once, whose charge again under our key proves it;
 *   - success evidence settles PROCESSING or UNKNOWN as SUCCEEDED;
 *   - failure evidence settles PROCESSING or UNKNOWN as FAILED;
 *   - processing evidence moves UNKNOWN to PROCESSING (it was received);
 *   - evidence that contradicts a final state makes it REQUIRES_REVIEW,
 *     never flips it: success for a FAILED attempt, a success for another
 *     intent or amount, failure newer than a SUCCEEDED attempt's success;
 *   - evidence older than the state it would undo (processing after
 *     succeeded, a failure dated before the success) is recorded, ignored. */
#ifndef CHARGED_WEBHOOK_EVENT_H
#define CHARGED_WEBHOOK_EVENT_H

#include <stddef.h>
#include <stdint.h>

#include "attempt_status.h"
#include "provider_outcome.h"

enum webhook_evidence {
    WEBHOOK_EVIDENCE_NONE = 0,   /* an event type we do not act on */
    WEBHOOK_EVIDENCE_SUCCEEDED,  /* a charge succeeded */
    WEBHOOK_EVIDENCE_FAILED,     /* a charge failed or was canceled */
    WEBHOOK_EVIDENCE_PROCESSING, /* a charge is processing */
    WEBHOOK_EVIDENCE_REFUND,     /* about refunds: see refunds[] */
    WEBHOOK_EVIDENCE_AUTHORIZED, /* a manual-capture payment holds the money
                                    (amount_capturable): no charge's evidence,
                                    an authorization's */
    WEBHOOK_EVIDENCE__COUNT
};

/* A refund the provider's event describes (a refund object, or one of the
 * refunds of a charge the event lists). */
struct webhook_refund {
    char id[PROVIDER_ID_MAX]; /* the provider's refund id */
    char status[64];
    long long amount;                     /* -1 when absent */
    char currency[8];                     /* upper case; "" when absent */
    char payment_intent[PROVIDER_ID_MAX]; /* the charge's; "" when absent */
    char refund_id[37];  /* our refund id, from its metadata; "" when absent
                            or not a uuid */
    char attempt_id[37]; /* our payment attempt id, likewise */
    char failure_reason[128];
};

/* An event about a charge's refunds lists at most this many: the provider
 * pages a charge's refunds list and never lists more than 100 in one page.
 * One with more is refused (400). */
#define WEBHOOK_REFUNDS_MAX 100

struct webhook_event {
    char id[PROVIDER_ID_MAX]; /* the provider's event id */
    char type[128];           /* the provider's event type, as it names it */
    int64_t created;          /* unix seconds */
    enum webhook_evidence evidence;
    char intent_id[PROVIDER_ID_MAX]; /* the charge's provider id */
    char intent_status[64];          /* the charge's status, the provider's word */
    long long amount;                /* -1 when absent */
    char currency[8];                /* upper case; "" when absent */
    char attempt_id[37];             /* our payment attempt id, from the charge's
                                        metadata; "" when absent or not a uuid */
    char decline_code[128];          /* the charge's last decline, when failed */
    /* Manual capture, as the intent says: "automatic" or "manual" (""
     * when it does not); what it holds and what was captured (-1 when
     * absent); why it was canceled ("" when not: "automatic" is the
     * provider's expiry of an authorization; a void's reason otherwise).
     * A canceled authorization is FAILED evidence for a charge, as every
     * canceled intent; these say it was a hold released. */
    char capture_method[16];
    long long amount_capturable;
    long long amount_received;
    char cancellation_reason[32];
    size_t nrefunds; /* WEBHOOK_EVIDENCE_REFUND: the refunds named */
    struct webhook_refund refunds[WEBHOOK_REFUNDS_MAX];
};

/* A backend's parse_event answers in charged_error.h's codes: CHARGED_OK;
 * CHARGED_BAD_ITEM, the body is refused (400, never delivered again);
 * CHARGED_RETRY when memory ran out: nothing is known to be wrong with the
 * body, so it is not refused but not stored (5xx), and the provider
 * delivers it again. */

/* The attempt as the database holds it, locked, and what the database
 * knows about the event's intent (compared there, whatever their length). */
struct webhook_attempt {
    enum attempt_status status;
    long long amount;
    char currency[4];
    int64_t updated_at;       /* unix seconds of the last change, floored */
    int intent_recorded;      /* we recorded an intent from our own call */
    int intent_differs;       /* it has an intent, and not the event's */
    int intent_elsewhere;     /* the event's intent is another attempt's,
                                 or booked for one */
    int order_has_other_live; /* another attempt of its order is live */
};

enum webhook_action {
    WEBHOOK_IGNORE = 0, /* record the event; the attempt stays as it is */
    WEBHOOK_APPLY,      /* move the attempt to `status` */
    WEBHOOK_REVIEW,     /* move it to REQUIRES_REVIEW (status says so) */
    WEBHOOK_FLAG,       /* contradiction that cannot move the attempt (it is
                           REJECTED or PENDING, or FAILED while its order has
                           another live attempt): record for review, loudly */
    WEBHOOK_UNPROVEN,   /* a success that only names an attempt whose own
                           call is in flight or unknown: recorded, never
                           applied; its own call or the reconciler's replay
                           settles it, the auditor judges the intent */
    WEBHOOK_ACTION__COUNT
};

struct webhook_decision {
    enum webhook_action action;
    enum attempt_status status; /* the new one, for APPLY and REVIEW */
    const char *reason;         /* static text: why */
    int check_now;              /* an UNKNOWN attempt named by an object not
                                   proven ours: due for the reconciler now */
};

void webhook_event_decide(const struct webhook_event *ev,
                          const struct webhook_attempt *a, struct webhook_decision *d);

/* Is ev the provider's own cancel of an authorization (its expiry:
 * canceled, cancellation_reason "automatic")? */
int webhook_event_is_expiry(const struct webhook_event *ev);

/* An operation's meanings of the events about its attempts' intents (an
 * authorization's: worker/operations/authorize/), decided by
 * webhook_event_decide_as on the rules every decision shares: only the
 * attempt's own intent (ownership.h, as above) moves it; one not proven
 * ours is recorded and ignored (a success flagged), an UNKNOWN attempt
 * made due for the reconciler at once; its own intent of another amount
 * or currency is flagged, never applied; a failed attempt whose order has
 * another live one never becomes live again. */
struct webhook_meaning {
    /* Whether ev is the operation's own evidence; any other event is
     * decided as a charge's (webhook_event_decide). */
    int (*takes)(const struct webhook_event *ev);
    /* What ev, about the attempt's own intent of its amount and currency,
     * does to it: d set (webhook_decision_set). */
    void (*of_ours)(const struct webhook_event *ev, const struct webhook_attempt *a,
                    struct webhook_decision *d);
    /* The flag's reason of its own intent of another amount or currency. */
    const char *other_charge;
};

/* What ev does to the attempt a, on m's meanings. */
void webhook_event_decide_as(const struct webhook_meaning *m,
                             const struct webhook_event *ev,
                             const struct webhook_attempt *a,
                             struct webhook_decision *d);

/* Sets d: action, the status it leaves (the new one for APPLY and
 * REVIEW), reason (static text); check_now cleared. */
void webhook_decision_set(struct webhook_decision *d, enum webhook_action action,
                          enum attempt_status status, const char *reason);

/* "applied", "review", "ignored", "flagged", "unproven": the outcome recorded for the
 * event and counted in metrics. */
const char *webhook_action_name(enum webhook_action a);

/* The refund as the database holds it, locked. */
struct webhook_refund_row {
    enum attempt_status status;
    long long amount;
    char currency[4];          /* "" when unknown */
    int intent_differs;        /* it names the charge's intent, not the event's */
    int provider_id_recorded;  /* we recorded a provider refund id from our call */
    int provider_id_differs;   /* it has a provider refund id, not the event's */
    int provider_id_elsewhere; /* the event's re_ id is another refund's */
};

enum webhook_refund_action {
    WEBHOOK_REFUND_IGNORE = 0,   /* record the event; the refund stays */
    WEBHOOK_REFUND_APPLY,        /* move the refund to `status` */
    WEBHOOK_REFUND_NEEDS_REVIEW, /* contradicts what we hold: never applied,
                                    recorded as needs_review for a person */
    WEBHOOK_REFUND_UNPROVEN      /* a success that only names a refund whose own
                                    call is in flight or unknown: recorded,
                                    never applied, no one told (its own call
                                    or the reconciler's replay settles it) */
};

struct webhook_refund_decision {
    enum webhook_refund_action action;
    enum attempt_status status; /* the new one, for APPLY */
    const char *reason;         /* static text: why */
    int check_now;              /* an UNKNOWN refund named by a refund not
                                   proven ours: due for the reconciler now */
};

/* The provider's refund status as ours: succeeded SUCCEEDED, failed and
 * canceled FAILED, pending and requires_action PROCESSING; -1 for any
 * other. */
int webhook_refund_status(const char *provider_status);

/* What one refund of an event does to the refund row it names. Only a
 * refund proven ours (ownership.h: its id is the one we recorded from our
 * own call's answer, on our charge's intent) moves the row; one that merely
 * names it is recorded (a success as needs_review), never applied, and no
 * reservation is given back on it. The rules for ours: success settles PROCESSING or
 * UNKNOWN as SUCCEEDED; failure settles them as FAILED; pending moves UNKNOWN to
 * PROCESSING; what SUCCEEDED already says, or anything older than a settled state
 * (pending after succeeded), is ignored; failure of a SUCCEEDED refund, success of a
 * FAILED or REJECTED one, or a success for another intent, amount, currency or provider
 * refund is needs_review: what is refunded only grows, and only on evidence that is
 * about this refund. A PENDING refund was not sent yet: its own call will see the
 * answer. */
void webhook_refund_decide(const struct webhook_refund *r,
                           const struct webhook_refund_row *row,
                           struct webhook_refund_decision *d);

#endif
