/* reconcile_policy: the reconciler's order of evidence, as one table.
 *
 * Pure: no database, no network, no clock. Given an unsettled attempt and
 * what the provider has answered so far in one look, it says which call
 * comes next (a look-up, a charge again under the attempt's key, a walk of
 * the provider's list) or how the look ends: the status (the attempt's own
 * means "look again later"), the reason, and the intent booked on it. The
 * reconciler makes the calls, passes the times and writes the result;
 * docs/reconciler.md is the same table in prose. The list's walk asks the
 * caller's function for each page, so that every walk of a list (the
 * reconciler's, an operator's review) adds the pages up the same way.
 *
 * Only an object proven the attempt's own settles it (ownership.h): the
 * intent by its recorded id, or the answer to the charge again under the
 * attempt's own key. A search or a list only finds objects that name the
 * attempt in their metadata, which anyone may write: they never settle
 * it (past the key's window, a person decides). An authorization's
 * create again answering requires_capture may be the provider's replay,
 * as old as the first execution: it proves the intent ours, not held now,
 * so the intent is retrieved by that id (decision.object_id) and settled
 * on its state now.
 *
 * A refund has its own order of evidence (reconcile_policy_decide_refund)
 * on the same table: the key's window, the rows that settle on what the
 * provider's object says, and the give-up to REQUIRES_REVIEW are one code
 * for both. */
#ifndef CHARGED_RECONCILE_POLICY_H
#define CHARGED_RECONCILE_POLICY_H

#include "attempt_status.h"
#include "provider_outcome.h"

/* Pages of the provider's list (100 intents each) one walk takes at most; a
 * window holding more is looked at again later, never called empty. */
#define RECONCILE_LIST_MAX_PAGES 100
/* How far the provider's clock may be from the database's, which
 * first_sent_at is on: the list's window is widened by this each side. */
#define RECONCILE_LIST_CLOCK_MARGIN_MS (5 * 60 * 1000LL)

struct reconcile_limits {
    long long key_retention_ms;    /* WORKER_KEY_RETENTION_MS */
    long long provider_timeout_ms; /* PROVIDER_TIMEOUT_MS */
    long long search_lag_ms;       /* RECONCILER_SEARCH_LAG_MS */
    long long max_age_ms;          /* RECONCILER_MAX_AGE_MS */
    /* An operation's own settings are its store's (op.h's settings). */
};

/* The attempt as claimed; times on the database's clock at the claim. */
struct reconcile_attempt {
    const char *id;
    enum attempt_status status;      /* UNKNOWN or PROCESSING */
    const char *provider_payment_id; /* "" (or NULL) when none is known */
    long long amount;
    const char *currency;
    long long key_age_ms;    /* now - first_sent_at; < 0: never sent */
    long long first_sent_ms; /* first_sent_at since the epoch; < 0: never sent */
    long long age_ms;        /* now - created_at */
    /* Refunds only (NULL for a charge): the charge's intent, whose refunds
     * are listed, and the noun of the provider's object in reasons. */
    const char *payment_intent;
    const char *object; /* NULL: "intent" */
    /* An authorization (capture_method manual): its intent holds the
     * money (requires_capture) where a charge's takes it. Looked at
     * UNKNOWN or PROCESSING as a charge is, and AUTHORIZED (its id
     * recorded) for the provider's expiry of the hold. */
    int manual;
    /* AUTHORIZED: a void of ours holds it (its cancel is the void's to
     * settle); 0: none, so a cancel of the intent is another's. */
    int void_holds;
};

/* What the provider answered so far in this look; NULL: not asked (yet).
 * Not kept: the caller's results, read during the call only. */
struct reconcile_evidence {
    const struct provider_result *lookup; /* the retrieve, or the search */
    /* Between the claim and this decision, on the caller's monotonic
     * clock: the key has aged by this since key_age_ms. */
    long long lookup_after_ms;
    const struct provider_result *search; /* RECONCILE_SEARCH_OTHERS' answer */
    const struct provider_result *charge;
    const struct provider_result *list; /* the walk, as reconcile_policy_list_fold
                                           made it */
};

enum reconcile_next {
    RECONCILE_SETTLE = 0,    /* the look is over: see status and reason */
    RECONCILE_RETRIEVE,      /* look-up: GET the intent by the provider's id */
    RECONCILE_SEARCH,        /* look-up: search by metadata[payment_attempt_id] */
    RECONCILE_SEARCH_OTHERS, /* a succeeded intent found by id: does the
                                search know of another? */
    RECONCILE_CHARGE,        /* send again, same key and stored parameters (a
                                refund: the refund) */
    RECONCILE_LIST,          /* walk the provider's list of the key's window (a
                                refund: of the intent's refunds) */
};

/* Which row of the table ended the look. */
enum reconcile_rule {
    RECONCILE_RULE_NONE = 0,                /* a call is next */
    RECONCILE_FOUND_SUCCEEDED,              /* the attempt's intent succeeded */
    RECONCILE_FOUND_DECLINED,               /* ... was declined or canceled */
    RECONCILE_FOUND_PROCESSING,             /* ... is still processing */
    RECONCILE_FOUND_OTHER_STATUS,           /* ... has a status we cannot place */
    RECONCILE_FOUND_SEVERAL,                /* more than one intent for the attempt */
    RECONCILE_FOUND_NOT_OURS,               /* another amount, currency or attempt */
    RECONCILE_SEARCH_FOUND_OTHERS,          /* found by id; the search knows more */
    RECONCILE_LOOKUP_FAILED,                /* no answer, 5xx, 429, a bare 404 */
    RECONCILE_ID_UNKNOWN,                   /* the provider forgot an id it gave */
    RECONCILE_CHARGE_REFUSED,               /* our charge: 400 invalid request */
    RECONCILE_CHARGE_UNANSWERED,            /* our charge: no answer (UNKNOWN) */
    RECONCILE_CHARGE_UNANSWERED_PROCESSING, /* ... for a PROCESSING attempt */
    RECONCILE_SEARCH_MAY_LAG,               /* not found, key past its window, the
                                               search's lag not yet passed */
    RECONCILE_NEVER_EXECUTED,               /* nor in any page of the list */
    RECONCILE_LIST_FAILED,                  /* a page failed, or too many pages */
    RECONCILE_TOO_OLD,                      /* unsettled past max_age_ms */
    RECONCILE_FOUND_REFUND_FAILED,          /* the refund failed or was canceled */
    RECONCILE_REFUND_UNANSWERED,            /* our refund again: no answer */
    RECONCILE_REFUND_LIST_FAILED,           /* a page of the refunds failed */
    RECONCILE_REFUND_NO_INTENT,             /* no charge's intent to list on */
    RECONCILE_FOUND_UNPROVEN,               /* only a search or a list names it:
                                               never ours without proof */
    RECONCILE_CHARGE_NOT_EXECUTED,          /* our call again was not executed
                                               (409: our first still runs; 429) */
    /* An authorization's own intent (a->manual): */
    RECONCILE_FOUND_AUTHORIZED,         /* holds the money (requires_capture) */
    RECONCILE_FOUND_CAPTURED,           /* succeeded: taken where a hold was asked */
    RECONCILE_FOUND_CANCELED,           /* canceled before we knew of the hold */
    RECONCILE_FOUND_EXPIRED,            /* an AUTHORIZED one canceled by the provider
                                           on its own (cancellation_reason automatic) */
    RECONCILE_HOLD_STANDS,              /* an AUTHORIZED one not expired: look later */
    RECONCILE_FOUND_CANCELED_ELSEWHERE, /* an AUTHORIZED one canceled, not
                                           automatic, no void of ours
                                           holding it: another's cancel */
    RECONCILE_HELD_LOOKUP_FAILED,       /* requires_capture again under the key (a
                                           replay proves the intent ours, not its
                                           state); its retrieve failed: id kept */
    RECONCILE_RULE__COUNT
};

struct reconcile_decision {
    enum reconcile_next next;
    enum reconcile_rule rule;   /* SETTLE: the row that decided */
    enum attempt_status status; /* SETTLE; the attempt's own: look again */
    char reason[512];           /* SETTLE: valid UTF-8; "" for none */
    /* SETTLE: the intent booked; "" for none */
    char provider_payment_id[PROVIDER_ID_MAX];
    /* SETTLE: the money the provider's object shows moved, when the
     * record keeps it (a capture's amount_received); 0: none. */
    long long amount;
    /* RECONCILE_RETRIEVE: the object to retrieve when it is not the
     * record's recorded one (an authorization's create answered
     * requires_capture under its key: the intent that answer proved
     * ours); "": the record's own. */
    char object_id[PROVIDER_ID_MAX];
    char note[512]; /* SETTLE: what the look saw beside what
                       settled it (foreign objects naming the
                       attempt), for its evidence and log; "" */
};

/* The next step of a look, from the evidence so far. Call it again with
 * each answer added until next is RECONCILE_SETTLE. */
void reconcile_policy_decide(const struct reconcile_limits *lim,
                             const struct reconcile_attempt *a,
                             const struct reconcile_evidence *e,
                             struct reconcile_decision *out);

/* The next step of a look at a refund (a->payment_intent the charge's
 * intent, currency NULL). Only a refund proven ours settles it
 * (ownership.h): by its recorded id (RETRIEVE); else, while the provider
 * keeps the key (the charge's rule), the refund again with the same key
 * (CHARGE; e->charge), whose answer or replay is ours. Past the window,
 * every page of the intent's refunds (LIST, folded by
 * reconcile_policy_list_fold; e->list, e->lookup_after_ms set when it
 * answered): none naming it means nothing executed (FAILED
 * never_executed); one naming it is unproven (REQUIRES_REVIEW). Ours
 * settles on the refund's status (succeeded, failed or canceled, pending
 * or requires_action: PROCESSING). */
void reconcile_policy_decide_refund(const struct reconcile_limits *lim,
                                    const struct reconcile_attempt *a,
                                    const struct reconcile_evidence *e,
                                    struct reconcile_decision *out);

/* "found_succeeded", ...: the rule's name, for tests and logs; NULL out of
 * range. */
const char *reconcile_policy_rule_name(enum reconcile_rule rule);

/* The list's window, unix seconds [*gte, *lt): every call the key could
 * have made ([first_sent, first_sent + retention], no call being sent once
 * the retention has passed), widened each side by the clock margin. */
void reconcile_policy_list_window(long long first_sent_ms, long long key_retention_ms,
                                  long long *gte, long long *lt);

/* Folds one page of a walk of the list into *walk (zeroed before the first
 * page); pages: walked so far, this one included. 1: walk on after
 * page->list_last_id. 0: over, and *walk is the walk's evidence: NOT_FOUND
 * only when every page answered and none held the attempt's intent; the
 * page whose match is the most settled (succeeded > processing > any other
 * > declined; the first of equals), matches summed over the pages,
 * otherwise; UNKNOWN (or the failed page itself) when a page failed or
 * more than RECONCILE_LIST_MAX_PAGES would be needed. Leaves latency_ms to
 * the caller. */
int reconcile_policy_list_fold(struct provider_result *walk,
                               const struct provider_result *page, int pages);

/* Asks for one page of a list, after the object `after` ("" for the
 * first), into *page: a provider_client_list or _list_refunds call. */
typedef void (*reconcile_list_page_fn)(void *ctx, const char *after,
                                       struct provider_result *page);

/* The walk of a whole list: page_of asked page after page, each folded by
 * reconcile_policy_list_fold into *walk, latency_ms the pages' sum. Every
 * caller that takes a list for evidence (the reconciler, an operator's
 * review) walks it so. Returns the pages asked for. */
int reconcile_policy_list_walk(reconcile_list_page_fn page_of, void *ctx,
                               struct provider_result *walk);

#endif
