#include "reconcile_policy.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "charged_assert.h"
#include "card_data.h"
#include "charge_policy.h"
#include "charged_assert.h"
#include "ownership.h"

/* The table: one row per situation of evidence, as docs/reconciler.md tells
 * them. The reason is the row's prefix, then the evidence's detail. */
static const struct reconcile_row rules[] = {
    [RECONCILE_RULE_NONE] = {"none", RECONCILE_KEEPS, 0, RECONCILE_BOOKS_NONE, NULL},
    /* 1. Found: settle on the intent's own status. */
    [RECONCILE_FOUND_SUCCEEDED] = {"found_succeeded", RECONCILE_SETS,
                                   ATTEMPT_STATUS_SUCCEEDED, RECONCILE_BOOKS_INTENT,
                                   NULL},
    [RECONCILE_FOUND_DECLINED] = {"found_declined", RECONCILE_SETS,
                                  ATTEMPT_STATUS_FAILED, RECONCILE_BOOKS_INTENT,
                                  "declined: "},
    [RECONCILE_FOUND_PROCESSING] = {"found_processing", RECONCILE_SETS,
                                    ATTEMPT_STATUS_PROCESSING, RECONCILE_BOOKS_INTENT,
                                    "provider_processing"},
    [RECONCILE_FOUND_OTHER_STATUS] = {"found_other_status", RECONCILE_SETS,
                                      ATTEMPT_STATUS_REQUIRES_REVIEW,
                                      RECONCILE_BOOKS_INTENT, "requires_review: "},
    /* Contradictory evidence. Only a search or a list finds several, and
     * neither proves one ours: none is booked. */
    [RECONCILE_FOUND_SEVERAL] = {"found_several", RECONCILE_SETS,
                                 ATTEMPT_STATUS_REQUIRES_REVIEW, RECONCILE_BOOKS_NONE,
                                 "requires_review: contradictory: "},
    /* Not the attempt's: never booked on it. */
    [RECONCILE_FOUND_NOT_OURS] = {"found_not_ours", RECONCILE_SETS,
                                  ATTEMPT_STATUS_REQUIRES_REVIEW, RECONCILE_BOOKS_NONE,
                                  "requires_review: contradictory: "},
    /* Ours succeeded; others naming the attempt are foreign (anyone may
     * write metadata): ours settles, the others go to the look's note. */
    [RECONCILE_SEARCH_FOUND_OTHERS] = {"search_found_others", RECONCILE_SETS,
                                       ATTEMPT_STATUS_SUCCEEDED, RECONCILE_BOOKS_INTENT,
                                       NULL},
    /* No answer, 5xx, a 404 that is not the provider's: no evidence (a 429
     * is RECONCILE_THROTTLED). */
    [RECONCILE_LOOKUP_FAILED] = {"lookup_failed", RECONCILE_KEEPS, 0,
                                 RECONCILE_BOOKS_NONE, "look-up failed: "},
    [RECONCILE_ID_UNKNOWN] = {"id_unknown", RECONCILE_SETS,
                              ATTEMPT_STATUS_REQUIRES_REVIEW, RECONCILE_BOOKS_NONE,
                              "requires_review: contradictory: "},
    /* 2. Not found inside the key's window: charged again. */
    [RECONCILE_CHARGE_REFUSED] = {"charge_refused", RECONCILE_SETS,
                                  ATTEMPT_STATUS_FAILED, RECONCILE_BOOKS_NONE,
                                  "invalid_request: "},
    [RECONCILE_CHARGE_UNANSWERED] = {"charge_unanswered", RECONCILE_KEEPS, 0,
                                     RECONCILE_BOOKS_NONE, "charged again, unknown: "},
    /* It was charged: no longer a call in flight, an unknown outcome. */
    [RECONCILE_CHARGE_UNANSWERED_PROCESSING] = {"charge_unanswered_processing",
                                                RECONCILE_SETS, ATTEMPT_STATUS_UNKNOWN,
                                                RECONCILE_BOOKS_NONE,
                                                "outcome_unknown: "},
    /* 3. Past the window: the search's "none" is no evidence on its own. */
    [RECONCILE_SEARCH_MAY_LAG] = {"search_may_lag", RECONCILE_KEEPS, 0,
                                  RECONCILE_BOOKS_NONE,
                                  "not found; the search may still lag: looking "
                                  "again"},
    [RECONCILE_NEVER_EXECUTED] = {"never_executed", RECONCILE_SETS,
                                  ATTEMPT_STATUS_FAILED, RECONCILE_BOOKS_NONE,
                                  "never_executed: "},
    [RECONCILE_LIST_FAILED] = {"list_failed", RECONCILE_KEEPS, 0, RECONCILE_BOOKS_NONE,
                               "not found by search; the list failed: "},
    /* Looked at long enough: a human decides. Applies over any row that
     * leaves the attempt's status as it was. */
    [RECONCILE_TOO_OLD] = {"too_old", RECONCILE_SETS, ATTEMPT_STATUS_REQUIRES_REVIEW,
                           RECONCILE_BOOKS_AS_BEFORE, "requires_review: "},
    /* A refund's rows where a charge's words would not fit it. */
    [RECONCILE_FOUND_REFUND_FAILED] = {"found_refund_failed", RECONCILE_SETS,
                                       ATTEMPT_STATUS_FAILED, RECONCILE_BOOKS_INTENT,
                                       "refund failed: "},
    [RECONCILE_REFUND_UNANSWERED] = {"refund_unanswered", RECONCILE_KEEPS, 0,
                                     RECONCILE_BOOKS_NONE, "refunded again, unknown: "},
    [RECONCILE_REFUND_LIST_FAILED] = {"refund_list_failed", RECONCILE_KEEPS, 0,
                                      RECONCILE_BOOKS_NONE,
                                      "the list of the intent's refunds failed: "},
    [RECONCILE_REFUND_NO_INTENT] = {"refund_no_intent", RECONCILE_SETS,
                                    ATTEMPT_STATUS_REQUIRES_REVIEW,
                                    RECONCILE_BOOKS_NONE,
                                    "requires_review: no charge intent to look the "
                                    "refund up on"},
    /* Found only by what names it, past the key's window: never ours
     * without proof, so a person decides on the evidence. */
    [RECONCILE_FOUND_UNPROVEN] = {"found_unproven", RECONCILE_SETS,
                                  ATTEMPT_STATUS_REQUIRES_REVIEW, RECONCILE_BOOKS_NONE,
                                  "requires_review: unproven: "},
    /* 409: our first call under the key still executes: look again (a 429,
     * refused before executing, is RECONCILE_THROTTLED). */
    [RECONCILE_CHARGE_NOT_EXECUTED] = {"charge_not_executed", RECONCILE_KEEPS, 0,
                                       RECONCILE_BOOKS_NONE,
                                       "sent again, not executed: "},
    /* Issue 38: a 429 is not an outage, nor a look: whatever row would
     * have kept the status for want of evidence, the look was throttled
     * (reconcile_decision.throttled). */
    [RECONCILE_THROTTLED] = {"throttled", RECONCILE_KEEPS, 0, RECONCILE_BOOKS_NONE,
                             "throttled, looking again: "},
};
_Static_assert(sizeof(rules) / sizeof(rules[0]) == RECONCILE_RULE__COUNT,
               "one row per rule");

const char *reconcile_policy_rule_name(enum reconcile_rule rule)
{
    return (unsigned)rule < RECONCILE_RULE__COUNT ? rules[rule].name : NULL;
}

/* An answer that describes an intent (found, or our charge's). An
 * authorized one is an intent in a status a charge never leaves it in: as
 * any other such status, for a person. */
static int is_intent(enum provider_outcome o)
{
    return o == PROVIDER_SUCCEEDED || o == PROVIDER_DECLINED ||
           o == PROVIDER_PROCESSING || o == PROVIDER_REQUIRES_REVIEW ||
           o == PROVIDER_AUTHORIZED;
}

static const char *object_of(const struct reconcile_attempt *a)
{
    CHARGED_ASSERT(a);
    return a->object ? a->object : "intent";
}

/* Is this intent (or refund) the attempt's own? Its amount and currency
 * (when the attempt has one: a refund's is its charge's) must be the
 * attempt's, and its metadata must not name another attempt (ours named
 * in upper case is still ours). A look-up's object must carry them; the
 * answer to our own call, under our key, is judged on the fields it
 * carries (a card error may carry none). Writes why not. */
static int intent_is_ours(const struct reconcile_attempt *a,
                          const struct provider_result *res, int own_answer, char *why,
                          size_t why_size)
{
    CHARGED_ASSERT(a && res && why && why_size > 0);
    const char *obj = object_of(a);
    int has_currency = a->currency != NULL;
    CHARGED_ASSERT(res && why && why_size > 0);
    if (!own_answer && (!res->amount || (has_currency && !res->currency[0])))
        snprintf(why, why_size, "%s %s without amount%s", obj, res->provider_payment_id,
                 has_currency ? " or currency" : "");
    else if (res->amount && res->amount != a->amount)
        snprintf(why, why_size, "%s amount %lld, the attempt's %lld", obj, res->amount,
                 a->amount);
    else if (has_currency && res->currency[0] &&
             strcasecmp(res->currency, a->currency) != 0)
        snprintf(why, why_size, "%s currency %s, the attempt's %s", obj, res->currency,
                 a->currency);
    else if (res->intent_attempt_id[0] &&
             strcasecmp(res->intent_attempt_id, a->id) != 0)
        snprintf(why, why_size, "%s of another attempt (%s)", obj,
                 res->intent_attempt_id);
    else
        return 1;
    return 0;
}

/* What a found intent says; own_answer: it answered our charge under our
 * key. Only one proven ours (ownership.h) settles the attempt, on m's
 * meanings when an operation brings its own. */
static enum reconcile_rule from_intent(const struct reconcile_meaning *m,
                                       const struct reconcile_attempt *a,
                                       const struct provider_result *res,
                                       int own_answer, char *detail, size_t size)
{
    const struct ownership_claim claim = {
        .recorded_id = a->provider_payment_id,
        .object_id = res->provider_payment_id,
        .own_answer = own_answer,
    };
    char why[128];

    CHARGED_ASSERT(a->id && detail && size > 0);
    if (res->matches > 1) {
        snprintf(detail, size, "%d %ss for one attempt", res->matches, object_of(a));
        return RECONCILE_FOUND_SEVERAL;
    }
    enum ownership_verdict v = ownership_judge(&claim, why, sizeof(why));
    if (v != OWNERSHIP_OURS) {
        snprintf(detail, size, "%s %s (%s): %s", object_of(a),
                 res->provider_payment_id[0] ? res->provider_payment_id : "without id",
                 res->intent_status[0] ? res->intent_status : "no status", why);
        return v == OWNERSHIP_UNPROVEN ? RECONCILE_FOUND_UNPROVEN
                                       : RECONCILE_FOUND_NOT_OURS;
    }
    if (!intent_is_ours(a, res, own_answer, detail, size))
        return RECONCILE_FOUND_NOT_OURS;
    if (m)
        return m->of_intent(a, res, detail, size);
    switch (res->outcome) {
    case PROVIDER_SUCCEEDED:
        return RECONCILE_FOUND_SUCCEEDED;
    case PROVIDER_DECLINED:
        snprintf(detail, size, "%s%s%s", res->code[0] ? res->code : "declined",
                 res->decline_code[0] ? ": " : "", res->decline_code);
        return a->payment_intent ? RECONCILE_FOUND_REFUND_FAILED
                                 : RECONCILE_FOUND_DECLINED;
    case PROVIDER_PROCESSING:
        return RECONCILE_FOUND_PROCESSING;
    default:
        snprintf(detail, size, "%s status '%s'", object_of(a), res->intent_status);
        return RECONCILE_FOUND_OTHER_STATUS;
    }
}

static enum reconcile_rule
by_id(const struct reconcile_meaning *m, const struct reconcile_attempt *a,
      const struct reconcile_evidence *e, enum reconcile_next *next,
      const struct provider_result **intent, char *detail, size_t size);

/* The call again under the key answered what m says it proves only ours
 * (m->replay_proves_ours_only: an authorization's hold). The answer may be
 * the provider's replay, as old as the first execution: it proves the
 * intent ours, not its state now (moved since by anyone). So the intent is
 * retrieved by the id the answer proved ours and settled on what it says
 * now (the look asks for that id: reconcile_decision.object_id). */
static enum reconcile_rule
state_now(const struct reconcile_meaning *m, const struct reconcile_attempt *a,
          const struct reconcile_evidence *e, enum reconcile_next *next,
          const struct provider_result **intent, char *detail, size_t size)
{
    const struct provider_result *c = e->charge;
    CHARGED_ASSERT(m && m->replay_proves_ours_only != RECONCILE_RULE_NONE && c);
    CHARGED_ASSERT(!a->provider_payment_id || !a->provider_payment_id[0]);
    if (!c->provider_payment_id[0]) {
        snprintf(detail, size, "%s", m->replay_without_id);
        return RECONCILE_FOUND_OTHER_STATUS;
    }
    struct reconcile_attempt proven = *a;
    proven.provider_payment_id = c->provider_payment_id;
    enum reconcile_rule rule = by_id(m, &proven, e, next, intent, detail, size);
    if (rule == RECONCILE_LOOKUP_FAILED) {
        *intent = c; /* ours by the replay: its id is recorded */
        return m->replay_lookup_failed;
    }
    return rule;
}

/* The answer to our call again under the attempt's own key (a charge, or
 * a refund): the first execution or its replay, ours either way.
 * `unanswered`: the row when no answer came. */
static enum reconcile_rule
replay(const struct reconcile_meaning *m, const struct reconcile_attempt *a,
       const struct reconcile_evidence *e, enum reconcile_rule unanswered,
       enum reconcile_next *next, const struct provider_result **intent, char *detail,
       size_t size)
{
    CHARGED_ASSERT(unanswered == RECONCILE_CHARGE_UNANSWERED ||
                   unanswered == RECONCILE_REFUND_UNANSWERED);
    const struct provider_result *c = e->charge;
    if (!c) {
        *next = RECONCILE_CHARGE;
        return RECONCILE_RULE_NONE;
    }
    if (is_intent(c->outcome)) {
        *intent = c;
        enum reconcile_rule rule = from_intent(m, a, c, 1, detail, size);
        return m && m->replay_proves_ours_only != RECONCILE_RULE_NONE &&
                       rule == m->replay_proves_ours_only
                   ? state_now(m, a, e, next, intent, detail, size)
                   : rule;
    }
    if (c->outcome == PROVIDER_INVALID) {
        provider_outcome_detail(c, detail, size);
        return RECONCILE_CHARGE_REFUSED;
    }
    snprintf(detail, size, "%s", c->error);
    if (c->outcome == PROVIDER_NOT_EXECUTED)
        return RECONCILE_CHARGE_NOT_EXECUTED;
    return a->status == ATTEMPT_STATUS_PROCESSING
               ? RECONCILE_CHARGE_UNANSWERED_PROCESSING
               : unanswered;
}

/* The attempt's recorded intent, retrieved by its id: ours. Succeeded, the
 * search tells whether others name the attempt: they are foreign (noted,
 * never settled on), ours settles. */
static enum reconcile_rule
by_id(const struct reconcile_meaning *m, const struct reconcile_attempt *a,
      const struct reconcile_evidence *e, enum reconcile_next *next,
      const struct provider_result **intent, char *detail, size_t size)
{
    CHARGED_ASSERT(a->provider_payment_id && a->provider_payment_id[0]);
    const struct provider_result *res = e->lookup;
    if (!res) {
        *next = RECONCILE_RETRIEVE;
        return RECONCILE_RULE_NONE;
    }
    if (is_intent(res->outcome)) {
        enum reconcile_rule rule = from_intent(m, a, res, 0, detail, size);
        *intent = res;
        if (rule != RECONCILE_FOUND_SUCCEEDED)
            return rule;
        if (!e->search) {
            *next = RECONCILE_SEARCH_OTHERS;
            return RECONCILE_RULE_NONE;
        }
        if (e->search->http_status == 200 && e->search->matches > 1) {
            snprintf(detail, size,
                     "%d intents name the attempt; ours is %s, the other %d are "
                     "foreign%s%s",
                     e->search->matches, a->provider_payment_id, e->search->matches - 1,
                     strcmp(e->search->provider_payment_id, a->provider_payment_id)
                         ? ", one of them "
                         : "",
                     strcmp(e->search->provider_payment_id, a->provider_payment_id)
                         ? e->search->provider_payment_id
                         : "");
            return RECONCILE_SEARCH_FOUND_OTHERS;
        }
        return rule;
    }
    if (res->outcome != PROVIDER_NOT_FOUND) {
        snprintf(detail, size, "%s", res->error);
        return RECONCILE_LOOKUP_FAILED;
    }
    snprintf(detail, size, "the provider does not know %s %s", object_of(a),
             a->provider_payment_id);
    return RECONCILE_ID_UNKNOWN;
}

/* Past the key's window no call of ours can still execute, and the replay
 * proves nothing more. The search (which lags) and then the consistent
 * list say whether any intent names the attempt: none at all is
 * never_executed; one is unproven, for a person. */
static enum reconcile_rule
past_window(const struct reconcile_meaning *m, const struct reconcile_limits *lim,
            const struct reconcile_attempt *a, const struct reconcile_evidence *e,
            long long age, enum reconcile_next *next,
            const struct provider_result **intent, char *detail, size_t size)
{
    CHARGED_ASSERT(age >= 0);
    const struct provider_result *res = e->lookup, *li = e->list;
    if (!res) {
        *next = RECONCILE_SEARCH;
        return RECONCILE_RULE_NONE;
    }
    if (is_intent(res->outcome)) {
        *intent = res;
        return from_intent(m, a, res, 0, detail, size);
    }
    if (res->outcome != PROVIDER_NOT_FOUND) {
        snprintf(detail, size, "%s", res->error);
        return RECONCILE_LOOKUP_FAILED;
    }
    if (age < lim->key_retention_ms + lim->search_lag_ms || a->first_sent_ms < 0)
        return RECONCILE_SEARCH_MAY_LAG;
    /* Search lags, by more than anyone can promise: only the consistent
     * list says that nothing executed. */
    if (!li) {
        /* The list's window is the first call's: there was one. */
        CHARGED_ASSERT(a->first_sent_ms >= 0);
        *next = RECONCILE_LIST;
        return RECONCILE_RULE_NONE;
    }
    if (li->outcome == PROVIDER_NOT_FOUND) {
        snprintf(detail, size,
                 "not in the provider's list of the key's window, nor found by "
                 "search, at the key's age of %lld ms, past its retention (%lld ms) "
                 "and the search's lag (%lld ms)",
                 age, lim->key_retention_ms, lim->search_lag_ms);
        return RECONCILE_NEVER_EXECUTED;
    }
    if (is_intent(li->outcome)) {
        *intent = li;
        return from_intent(m, a, li, 0, detail, size);
    }
    snprintf(detail, size, "%s", li->error);
    return RECONCILE_LIST_FAILED;
}

/* The key's age on the database's clock at the claim, plus the time the
 * look has taken since; never sent counts as new. */
static long long key_age(const struct reconcile_attempt *a,
                         const struct reconcile_evidence *e)
{
    /* Measured on the caller's monotonic clock since the claim. */
    CHARGED_ASSERT(e->lookup_after_ms >= 0);
    return (a->key_age_ms < 0 ? 0 : a->key_age_ms) + e->lookup_after_ms;
}

/* The order of evidence: by the recorded id when there is one; else,
 * while the provider keeps the key, the charge again under it (its answer
 * or replay is ours; a 409 says our first call still executes); past the
 * window, what names the attempt (past_window). Sets *next to a call
 * still to make, or fills detail and *intent (the answer settled on) and
 * returns the row. */
static enum reconcile_rule
classify(const struct reconcile_meaning *m, const struct reconcile_limits *lim,
         const struct reconcile_attempt *a, const struct reconcile_evidence *e,
         enum reconcile_next *next, const struct provider_result **intent, char *detail,
         size_t size)
{
    CHARGED_ASSERT(lim && a && e && a->id);
    /* Only an unsettled attempt is looked at (reconcile_attempt), or a
     * settled one its operation looks at, by its recorded id. */
    CHARGED_ASSERT(a->status == ATTEMPT_STATUS_UNKNOWN ||
                   a->status == ATTEMPT_STATUS_PROCESSING ||
                   (m && a->status == m->looks_at_settled && a->provider_payment_id &&
                    a->provider_payment_id[0]));
    long long age = key_age(a, e);

    *next = RECONCILE_SETTLE;
    *intent = NULL;
    if (a->provider_payment_id && a->provider_payment_id[0])
        return by_id(m, a, e, next, intent, detail, size);
    if (charge_policy_key_window_open(age, lim->key_retention_ms,
                                      lim->provider_timeout_ms))
        return replay(m, a, e, RECONCILE_CHARGE_UNANSWERED, next, intent, detail, size);
    return past_window(m, lim, a, e, age, next, intent, detail, size);
}

/* Reasons quote the provider: cut on a character boundary, never inside,
 * and masked again as a whole (card_data_copy_masked): two of the
 * provider's texts side by side ("code: decline_code") must not make the
 * groups of one card number between them. */
static void set_reason(struct reconcile_decision *d, const char *prefix,
                       const char *detail)
{
    char tmp[1024];
    CHARGED_ASSERT(d && detail);
    if (!prefix) {
        d->reason[0] = '\0';
        return;
    }
    snprintf(tmp, sizeof(tmp), "%s%s", prefix, detail);
    card_data_copy_masked(d->reason, sizeof(d->reason), tmp);
}

/* The row of rule: the table's, or m's own past it. */
static const struct reconcile_row *row_of(const struct reconcile_meaning *m,
                                          enum reconcile_rule rule)
{
    /* A row ended the look: never "none", always one of a table's. */
    CHARGED_ASSERT(rule > RECONCILE_RULE_NONE);
    if (rule < RECONCILE_RULE__COUNT)
        return &rules[rule];
    CHARGED_ASSERT(m && m->rows && (size_t)(rule - RECONCILE_RULE__COUNT) < m->nrows);
    return &m->rows[rule - RECONCILE_RULE__COUNT];
}

/* The throttled answer (a 429) among the look's, the one with the longest
 * Retry-After; NULL: none. */
static const struct provider_result *
throttled_answer(const struct reconcile_evidence *e)
{
    const struct provider_result *all[] = {e->lookup, e->search, e->charge, e->list};
    const struct provider_result *t = NULL;
    for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++)
        if (all[i] && all[i]->throttled &&
            (!t || all[i]->retry_after_ms > t->retry_after_ms))
            t = all[i];
    return t;
}

void reconcile_policy_mark_throttled(const struct reconcile_attempt *a,
                                     const struct reconcile_evidence *e,
                                     struct reconcile_decision *dec)
{
    CHARGED_ASSERT(a && e && dec && dec->next == RECONCILE_SETTLE);
    const struct provider_result *t = throttled_answer(e);
    if (!t || dec->status != a->status)
        return;
    dec->throttled = 1;
    dec->retry_after_ms = t->retry_after_ms;
    CHARGED_ASSERT(dec->retry_after_ms >= 0);
}

/* The decision from the row that ended the look, for a charge and a refund
 * alike (m: an operation's meanings, NULL none): its status, reason and
 * booking, a throttled look's wait, and the give-up past max_age_ms. */
static void finish(const struct reconcile_meaning *m,
                   const struct reconcile_limits *lim,
                   const struct reconcile_attempt *a,
                   const struct reconcile_evidence *e, enum reconcile_rule rule,
                   const struct provider_result *intent, char *detail,
                   size_t detail_size, struct reconcile_decision *out)
{
    const struct provider_result *t = throttled_answer(e);
    if (t && row_of(m, rule)->how == RECONCILE_KEEPS) {
        /* No evidence because the provider said "slower": not a look. */
        snprintf(detail, detail_size, "%s", t->error);
        rule = RECONCILE_THROTTLED;
        out->throttled = 1;
        out->retry_after_ms = t->retry_after_ms;
    }
    const struct reconcile_row *row = row_of(m, rule);
    CHARGED_ASSERT(lim && row->name);
    out->rule = rule;
    out->status = row->how == RECONCILE_KEEPS ? a->status : row->status;
    set_reason(out, row->reason, detail);
    if (!row->reason)
        /* A row with no reason (a success) keeps what else it saw. */
        card_data_copy_masked(out->note, sizeof(out->note), detail);
    if (row->books == RECONCILE_BOOKS_INTENT && intent)
        snprintf(out->provider_payment_id, sizeof(out->provider_payment_id), "%s",
                 intent->provider_payment_id);
    /* Only an unsettled record gives up: a settled one its operation looks
     * at (a hold, for its expiry) is settled however old. */
    if (out->status == a->status &&
        (a->status == ATTEMPT_STATUS_UNKNOWN ||
         a->status == ATTEMPT_STATUS_PROCESSING) &&
        a->age_ms > lim->max_age_ms) {
        /* Settles nothing, and has been looked at long enough. */
        snprintf(detail, detail_size, "still unsettled after %lld ms; last: %s",
                 a->age_ms, out->reason);
        out->rule = RECONCILE_TOO_OLD;
        out->throttled = 0; /* settled: no look follows */
        out->retry_after_ms = 0;
        out->status = rules[RECONCILE_TOO_OLD].status;
        set_reason(out, rules[RECONCILE_TOO_OLD].reason, detail);
    }
    /* What settles is a move the status may make; what keeps it, stays. */
    CHARGED_ASSERT((unsigned)out->status < ATTEMPT_STATUS__COUNT);
    CHARGED_ASSERT(out->status == a->status ||
                   attempt_status_transition_allowed((int)a->status, out->status));
    /* Only a look that kept the status waits out a throttle. */
    CHARGED_ASSERT(!out->throttled || out->status == a->status);
}

void reconcile_policy_decide(const struct reconcile_limits *lim,
                             const struct reconcile_attempt *a,
                             const struct reconcile_evidence *e,
                             struct reconcile_decision *out)
{
    reconcile_policy_decide_as(NULL, lim, a, e, out);
}

void reconcile_policy_decide_as(const struct reconcile_meaning *m,
                                const struct reconcile_limits *lim,
                                const struct reconcile_attempt *a,
                                const struct reconcile_evidence *e,
                                struct reconcile_decision *out)
{
    char detail[768] = "";
    const struct provider_result *intent;

    CHARGED_ASSERT(lim && a && e && out);
    CHARGED_ASSERT(!m || m->of_intent);
    memset(out, 0, sizeof(*out));
    enum reconcile_rule rule =
        classify(m, lim, a, e, &out->next, &intent, detail, sizeof(detail));
    /* Either a call is next, or a row decided: never both, never neither. */
    CHARGED_ASSERT((out->next == RECONCILE_SETTLE) == (rule != RECONCILE_RULE_NONE));
    if (out->next == RECONCILE_SETTLE)
        finish(m, lim, a, e, rule, intent, detail, sizeof(detail), out);
    else if (out->next == RECONCILE_RETRIEVE &&
             (!a->provider_payment_id || !a->provider_payment_id[0])) {
        /* Only an answer that proves the intent ours, not its state
         * (state_now), retrieves beyond a recorded id: by that id. */
        CHARGED_ASSERT(m && e->charge && e->charge->provider_payment_id[0]);
        snprintf(out->object_id, sizeof(out->object_id), "%s",
                 e->charge->provider_payment_id);
    }
}

/* A refund's order of evidence (reconcile_policy_decide_refund says it). */
static enum reconcile_rule
classify_refund(const struct reconcile_limits *lim, const struct reconcile_attempt *a,
                const struct reconcile_evidence *e, enum reconcile_next *next,
                const struct provider_result **found, char *detail, size_t size)
{
    const struct provider_result *res;
    CHARGED_ASSERT(lim && a && e && a->id);
    CHARGED_ASSERT(a->status == ATTEMPT_STATUS_UNKNOWN ||
                   a->status == ATTEMPT_STATUS_PROCESSING);
    long long age = key_age(a, e);

    *next = RECONCILE_SETTLE;
    *found = NULL;
    if (a->provider_payment_id && a->provider_payment_id[0]) {
        if (!(res = e->lookup)) {
            *next = RECONCILE_RETRIEVE;
            return RECONCILE_RULE_NONE;
        }
        if (is_intent(res->outcome)) {
            *found = res;
            return from_intent(NULL, a, res, 0, detail, size);
        }
        if (res->outcome == PROVIDER_NOT_FOUND) {
            snprintf(detail, size, "the provider does not know refund %s",
                     a->provider_payment_id);
            return RECONCILE_ID_UNKNOWN;
        }
        snprintf(detail, size, "%s", res->error);
        return RECONCILE_LOOKUP_FAILED;
    }
    if (!a->payment_intent || !a->payment_intent[0])
        return RECONCILE_REFUND_NO_INTENT;
    if (charge_policy_key_window_open(age, lim->key_retention_ms,
                                      lim->provider_timeout_ms))
        return replay(NULL, a, e, RECONCILE_REFUND_UNANSWERED, next, found, detail,
                      size);
    /* Past the window: the list is consistent, so none naming the refund
     * means none executed; one naming it is unproven. */
    if (!(res = e->list)) {
        *next = RECONCILE_LIST;
        return RECONCILE_RULE_NONE;
    }
    if (is_intent(res->outcome)) {
        *found = res;
        return from_intent(NULL, a, res, 0, detail, size);
    }
    if (res->outcome != PROVIDER_NOT_FOUND) {
        snprintf(detail, size, "%s", res->error);
        return RECONCILE_REFUND_LIST_FAILED;
    }
    snprintf(detail, size,
             "not in the provider's list of the intent's refunds, at the key's age "
             "of %lld ms, past its retention (%lld ms)",
             age, lim->key_retention_ms);
    return RECONCILE_NEVER_EXECUTED;
}

void reconcile_policy_decide_refund(const struct reconcile_limits *lim,
                                    const struct reconcile_attempt *a,
                                    const struct reconcile_evidence *e,
                                    struct reconcile_decision *out)
{
    char detail[768] = "";
    const struct provider_result *found;

    CHARGED_ASSERT(lim && a && e && out);
    memset(out, 0, sizeof(*out));
    enum reconcile_rule rule =
        classify_refund(lim, a, e, &out->next, &found, detail, sizeof(detail));
    CHARGED_ASSERT((out->next == RECONCILE_SETTLE) == (rule != RECONCILE_RULE_NONE));
    /* A refund is never searched for: no search of refunds exists. */
    CHARGED_ASSERT(out->next != RECONCILE_SEARCH &&
                   out->next != RECONCILE_SEARCH_OTHERS);
    if (out->next == RECONCILE_SETTLE)
        finish(NULL, lim, a, e, rule, found, detail, sizeof(detail), out);
}

void reconcile_policy_list_window(long long first_sent_ms, long long key_retention_ms,
                                  long long *gte, long long *lt)
{
    CHARGED_ASSERT(gte && lt && key_retention_ms >= 0);
    *gte = (first_sent_ms - RECONCILE_LIST_CLOCK_MARGIN_MS) / 1000;
    *lt =
        (first_sent_ms + key_retention_ms + RECONCILE_LIST_CLOCK_MARGIN_MS) / 1000 + 1;
    CHARGED_ASSERT(*gte < *lt); /* the window holds the first send: never empty */
}

/* How settled a match is, as the client ranks a page's: 0 the most. */
static int settled_rank(enum provider_outcome o)
{
    return o == PROVIDER_SUCCEEDED    ? 0
           : o == PROVIDER_PROCESSING ? 1
           : o == PROVIDER_DECLINED   ? 3
                                      : 2;
}

int reconcile_policy_list_fold(struct provider_result *walk,
                               const struct provider_result *page, int pages)
{
    CHARGED_ASSERT(walk && page && pages >= 1);
    if (page->outcome == PROVIDER_UNKNOWN || page->outcome == PROVIDER_INVALID ||
        page->outcome == PROVIDER_NOT_EXECUTED) {
        *walk = *page; /* no evidence, whatever earlier pages held */
        return 0;
    }
    int matches = walk->matches + page->matches;
    /* The most settled match of every page: a declined intent on one page
     * must not hide a succeeded one on a later page from a review asking
     * whether money moved. */
    if (walk->matches == 0 || (page->matches > 0 && settled_rank(page->outcome) <
                                                        settled_rank(walk->outcome)))
        *walk = *page;
    walk->matches = matches;
    CHARGED_ASSERT(walk->matches >= page->matches);
    if (!page->has_more)
        return 0;
    if (pages >= RECONCILE_LIST_MAX_PAGES) {
        memset(walk, 0, sizeof(*walk));
        walk->outcome = PROVIDER_UNKNOWN;
        snprintf(walk->error, sizeof(walk->error),
                 "more than %d pages of intents in the window",
                 RECONCILE_LIST_MAX_PAGES);
        return 0;
    }
    return 1;
}

int reconcile_policy_list_walk(reconcile_list_page_fn page_of, void *ctx,
                               struct provider_result *walk)
{
    struct provider_result page;
    char after[sizeof(page.list_last_id)] = "";
    long latency = 0;
    int pages = 0;

    CHARGED_ASSERT(page_of && walk);
    memset(walk, 0, sizeof(*walk));
    for (;;) {
        memset(&page, 0, sizeof(page));
        page_of(ctx, after, &page);
        pages++;
        latency += page.latency_ms;
        if (!reconcile_policy_list_fold(walk, &page, pages))
            break;
        snprintf(after, sizeof(after), "%s", page.list_last_id);
    }
    walk->latency_ms = latency;
    /* The fold ends every walk by RECONCILE_LIST_MAX_PAGES. */
    CHARGED_ASSERT(pages >= 1 && pages <= RECONCILE_LIST_MAX_PAGES);
    return pages;
}
