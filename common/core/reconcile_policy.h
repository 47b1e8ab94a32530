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
 * it (past the key's window, a person decides).
 *
 * An operation whose order of evidence is the charge's but whose intent
 * means something else (an authorization's holds the money) brings its
 * meanings and its own rows (struct reconcile_meaning,
 * reconcile_policy_decide_as); the order, the ownership and the give-up
 * stay here, one code for all.
 *
 * A refund has its own order of evidence (reconcile_policy_decide_refund)
 * on the same table: the key's window, the rows that settle on what the
 * provider's object says, and the give-up to REQUIRES_REVIEW are one code
 * for both. */
#ifndef CHARGED_RECONCILE_POLICY_H
#define CHARGED_RECONCILE_POLICY_H

#include <stddef.h>

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
    /* A settled record looked at (reconcile_meaning.looks_at_settled): a
     * step of another operation of ours holds it, and its own look
     * settles what the provider did for it (an authorization's void, its
     * cancel); 0: none. Read by the operation's meanings only. */
    int step_holds;
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
    RECONCILE_LOOKUP_FAILED,                /* no answer, 5xx, a bare 404 */
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
                                               (409: our first still runs) */
    RECONCILE_THROTTLED,                    /* a 429 left the look without
                                               evidence: not a look (throttled) */
    /* An operation's own rows are numbered from here on
     * (reconcile_meaning.rows). */
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
    /* SETTLE, RECONCILE_THROTTLED: the provider throttled a call (429)
     * and the look ended on no evidence. It was no look: the record is
     * looked at again after retry_after_ms (the longest Retry-After of
     * its answers; 0: none given, the sender backs off), its checks not
     * counted, its schedule not advanced (reconcile_look_throttled_ms). */
    int throttled;
    long long retry_after_ms;
};

/* The next step of a look, from the evidence so far. Call it again with
 * each answer added until next is RECONCILE_SETTLE. */
void reconcile_policy_decide(const struct reconcile_limits *lim,
                             const struct reconcile_attempt *a,
                             const struct reconcile_evidence *e,
                             struct reconcile_decision *out);

/* A row of an order of evidence: how the look it ends settles. */
struct reconcile_row {
    const char *name; /* "found_succeeded": for tests and docs */
    enum reconcile_row_status {
        RECONCILE_KEEPS, /* the attempt's own: look again later */
        RECONCILE_SETS,  /* the row's status */
    } how;
    enum attempt_status status; /* RECONCILE_SETS */
    /* Whether the decision books the intent it settled on. */
    enum reconcile_row_books {
        RECONCILE_BOOKS_NONE,
        RECONCILE_BOOKS_INTENT,    /* the intent's id, when the answer carried one */
        RECONCILE_BOOKS_AS_BEFORE, /* whatever the look's own row booked */
    } books;
    const char *reason; /* the reason's prefix, then the detail; NULL: none */
};

/* What an intent proven the attempt's own means to an operation whose
 * order of evidence is the charge's but whose intent means something else
 * (an authorization's: worker/operations/authorize/). Pure, as the rest. */
struct reconcile_meaning {
    /* The row that res, the attempt's own intent, ends the look on, and
     * the detail of its reason. */
    enum reconcile_rule (*of_intent)(const struct reconcile_attempt *a,
                                     const struct provider_result *res, char *detail,
                                     size_t size);
    /* Its own rows, numbered from RECONCILE_RULE__COUNT. */
    const struct reconcile_row *rows;
    size_t nrows;
    /* A settled status the operation still looks at, by the recorded id
     * and however old (its meanings say what the provider's own move of
     * it settles to); ATTEMPT_STATUS_UNKNOWN: none. */
    enum attempt_status looks_at_settled;
    /* The row of_intent ends on that the answer to the call again under
     * the key proves only ours, not the intent's state now (the
     * provider's replay is as old as the first execution): the intent is
     * retrieved by the id the answer names (decision.object_id) and
     * settled on what it says now; RECONCILE_RULE_NONE: none. Then the
     * row when that retrieve fails (the id kept, looked at again), and
     * the detail when that answer names no intent. */
    enum reconcile_rule replay_proves_ours_only, replay_lookup_failed;
    const char *replay_without_id;
};

/* reconcile_policy_decide, with an operation's meanings of the intent
 * (m; NULL: a charge's). */
void reconcile_policy_decide_as(const struct reconcile_meaning *m,
                                const struct reconcile_limits *lim,
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

/* Issue 38: a decision that keeps the record's status (a->status: looked
 * at, to look again) on a look the provider throttled (a 429 among e's
 * answers) is throttled: dec->throttled and dec->retry_after_ms (the
 * longest Retry-After) set, its rule and reason as they are. The charge's,
 * the refund's and an authorization's orders end such a look on
 * RECONCILE_THROTTLED themselves; reconcile_look_step marks an
 * operation's own order's decision so. */
void reconcile_policy_mark_throttled(const struct reconcile_attempt *a,
                                     const struct reconcile_evidence *e,
                                     struct reconcile_decision *dec);

/* "found_succeeded", ...: the rule's name, for tests and logs; NULL out of
 * range (an operation's own rows are named by its meanings). */
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
