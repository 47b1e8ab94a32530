/* One look at a claimed attempt or refund: the calls reconcile_look names,
 * and the settlement (reconciler_int.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "attempt_status.h"
#include "card_data.h"
#include "charged_assert.h"
#include "clock.h"
#include "log.h"
#include "metrics.h"
#include "reconcile_look.h"
#include "reconcile_policy.h"
#include "reconciler_int.h"

/* Rows recorded for one look at most: the calls, and the answers lost when
 * the HTTP client re-sent a call itself on a closed pooled connection. */
#define MAX_ROWS OP_LOOK_ROWS_MAX

/* What one look found out, and what follows from it. */
struct look {
    size_t kind;                  /* its operation's, in the table */
    const struct op_reconcile *k; /* the operation's face */
    const void *due;              /* the claimed row, the operation's */
    const char *id;
    int64_t lease_epoch;
    enum attempt_status from; /* as claimed */
    int checks;               /* looks so far */
    /* Log fields: the charge's order (NULL for a refund: left out), and
     * the value of the kind's about_key. */
    const char *order_id, *about;
    struct reconcile_look core; /* the calls' answers, and what they say */
    const char *ops[RECONCILE_LOOK_MAX_CALLS];
    int64_t started[RECONCILE_LOOK_MAX_CALLS];
    struct provider_result lost; /* what a re-sent call's first try left */
    enum attempt_status status;  /* == from: look again later */
    /* A 429 ended it: no look, not counted; looked at again after wait_ms
     * (reconcile_look_throttled_ms). */
    int throttled;
    long long wait_ms;
    char reason[512];
    char ppid[PROVIDER_ID_MAX];
    long long amount; /* the money the decision says moved; 0 none */
    json_t *evidence; /* what the provider said; owned */
};

/* ---- the calls ---- */

/* The look's environment: the reconciler's provider client and limits. */
static struct op_look_env env_of(const struct reconciler *r)
{
    return (struct op_look_env){
        .provider = r->provider,
        .lim =
            {
                .key_retention_ms = r->key_retention_ms,
                .provider_timeout_ms = r->provider_timeout_ms,
                .search_lag_ms = r->search_lag_ms,
                .max_age_ms = r->max_age_ms,
            },
    };
}

static void call_begin(struct reconciler *r)
{
    /* A look's calls are the loop's longest waits, each bounded by
     * PROVIDER_TIMEOUT_MS: liveness counts from the last one. */
    daemon_heartbeat();
    reconciler_keep_leases(r);
    metrics_set(METRIC_PROVIDER_IN_FLIGHT, 1);
}

/* Its answer, its duration and a 429 are counted by the gated client
 * (provider_client.c), as every gated role's are. */
static void call_end(void)
{
    metrics_set(METRIC_PROVIDER_IN_FLIGHT, 0);
}

/* What the provider answered, into the look's evidence; pages: of a list. */
static void note(struct look *l, const char *op, const struct provider_result *res,
                 int pages)
{
    json_t *e = json_pack("{s:s, s:s, s:i, s:i}", "operation", op, "outcome",
                          provider_outcome_name(res->outcome), "http_status",
                          res->http_status, "matches", res->matches);
    if (!e)
        return;
    /* json_object_set_new steals the new values' references. */
    if (pages)
        json_object_set_new(e, "pages", json_integer(pages));
    if (res->intent_status[0])
        json_object_set_new(e, "intent_status", json_string(res->intent_status));
    if (res->provider_payment_id[0])
        json_object_set_new(e, "provider_payment_id",
                            json_string(res->provider_payment_id));
    if (res->decline_code[0])
        json_object_set_new(e, "decline_code", json_string(res->decline_code));
    if (res->error[0])
        json_object_set_new(e, "error", json_string(res->error));
    json_array_append_new(json_object_get(l->evidence, "calls"), e);
}

/* A walk's page as reconcile_policy_list_walk asks for it: each one a call
 * of the loop's (liveness, metrics). */
struct walk_page {
    struct reconciler *r;
    const struct look *l;
};

static void walk_page(void *ctx, const char *after, struct provider_result *page)
{
    const struct walk_page *w = ctx;
    const struct op_look_env env = env_of(w->r);
    call_begin(w->r);
    w->l->k->page(&env, w->l->due, after, page);
    call_end();
}

/* Makes the call a step names. A list is asked of the consistent source
 * whether any call under the key executed: every page walked, matched on
 * the metadata (reconcile_policy says what the pages add up to), and one
 * call row for the walk: the page that decided it, with the walk's
 * latency. */
static void make_call(struct reconciler *r, struct look *l,
                      const struct reconcile_step *st)
{
    const int i = st->call;
    int pages = 0;

    CHARGED_ASSERT(i >= 0 && i < RECONCILE_LOOK_MAX_CALLS && st->operation);
    if (st->next != RECONCILE_LIST)
        call_begin(r);
    l->ops[i] = st->operation;
    l->started[i] = clock_wall_ms();
    if (st->next == RECONCILE_LIST) {
        struct walk_page w = {.r = r, .l = l};
        pages = reconcile_policy_list_walk(walk_page, &w, st->answer);
    } else {
        struct op_look_env env = env_of(r);
        if (st->next == RECONCILE_RETRIEVE && st->dec.object_id[0])
            env.object_id = st->dec.object_id;
        l->k->call(&env, l->due, st->next, st->answer);
        call_end();
    }
    note(l, st->operation, st->answer, pages);
}

/* Objects that name the attempt but are not its own (ownership.h): never
 * settled on, kept in the look's evidence and said loudly; the auditor
 * raises them as foreign_intent. */
static void note_foreign(struct look *l, const struct reconcile_decision *dec)
{
    char note[sizeof(dec->note)];
    if (!dec->note[0])
        return;
    card_data_copy_masked(note, sizeof(note), dec->note);
    /* json_object_set_new steals the new string's reference. */
    json_object_set_new(l->evidence, "foreign", json_string(note));
    log_warn("objects name the attempt that are not its own", l->k->words.id_key, l->id,
             "order_id", l->order_id, "detail", note, NULL);
}

/* One look: reconcile_look names each call in turn and, once the evidence
 * suffices, the decision; this makes the calls. */
static void look(struct reconciler *r, struct look *l)
{
    struct reconcile_step st;
    for (;;) {
        reconcile_look_step(&l->core, clock_now_ms(), &st);
        if (st.next == RECONCILE_SETTLE)
            break;
        make_call(r, l, &st);
    }
    l->status = st.dec.status;
    snprintf(l->reason, sizeof(l->reason), "%s", st.dec.reason);
    snprintf(l->ppid, sizeof(l->ppid), "%s", st.dec.provider_payment_id);
    l->amount = st.dec.amount;
    l->throttled = st.dec.throttled;
    if (l->throttled)
        l->wait_ms = reconcile_look_throttled_ms(&st.dec, r->throttled_in_a_row);
    note_foreign(l, &st.dec);
}

/* ---- the settlement ---- */

/* The look's calls as provider_calls records them. */
static size_t rows_of(const struct look *l, struct op_call_row *rows)
{
    size_t n = 0;
    for (int i = 0; i < l->core.ncalls; i++) {
        /* The HTTP client re-sent the call itself after a pooled
         * connection closed unanswered: that lost answer is a call of its
         * own. Room is kept for every answer still to come: lost sends past it
         * are not recorded, the answers always are. */
        size_t keep = (size_t)(l->core.ncalls - i);
        for (int k = 0; k < l->core.res[i].resent && n + keep < MAX_ROWS; k++)
            rows[n++] = (struct op_call_row){l->ops[i], l->started[i], &l->lost};
        CHARGED_ASSERT(n < MAX_ROWS);
        rows[n++] = (struct op_call_row){l->ops[i], l->started[i], &l->core.res[i]};
    }
    return n;
}

/* A value the database refuses (an intent booked for another attempt,
 * say): a human decides, with nothing from outside but the refusal. */
static enum charged_rc settle_for_review(struct reconciler *r, const struct look *l,
                                         struct op_settlement *s,
                                         struct charged_error *err)
{
    char msg[128], why[256];
    snprintf(msg, sizeof(msg), "the database refused %s; settling it for review",
             l->k->words.refused);
    log_error(msg, l->k->words.id_key, l->id, "order_id", l->order_id, "error",
              err->message, NULL);
    snprintf(why, sizeof(why), "requires_review: the database refused %s (sqlstate %s)",
             attempt_status_name(s->status), err->code);
    s->status = ATTEMPT_STATUS_REQUIRES_REVIEW;
    s->reason = why;
    s->object_id = NULL;
    s->next_check_ms = -1;
    return l->k->settle(r->stores[l->kind], s, err);
}

/* The settlement not written: the look's calls are kept to be written
 * later (a call made, a charge perhaps, must never vanish). -1 when the
 * database is away. */
static int not_settled(struct reconciler *r, const struct look *l, enum charged_rc rc,
                       const struct op_call_row *rows, size_t n,
                       const struct charged_error *err)
{
    char msg[128];
    reconciler_keep_calls(r, l->kind, l->id, l->k->words.id_key, rows, n);
    if (rc == CHARGED_WAIT) {
        /* Another session's uncommitted change held the statement: nothing
         * written; our lease expires and the next look decides again. */
        snprintf(msg, sizeof(msg),
                 "%s held by another session's transaction; looking again later",
                 l->k->words.noun);
        log_warn(msg, l->k->words.id_key, l->id, "order_id", l->order_id, NULL);
        return 0;
    }
    if (rc == CHARGED_RETRY) {
        /* Outage: the decision is taken again at the next look. */
        reconciler_db_failed(r, l->k->stages.settle, err->message);
        return -1;
    }
    snprintf(msg, sizeof(msg), "the database refused %s; the lease is left to expire",
             l->k->words.refused);
    log_error(msg, l->k->words.id_key, l->id, "order_id", l->order_id, "error",
              err->message, NULL);
    return 0;
}

/* What a written settlement did, in the log and the settlements' count. */
static void log_settlement(const struct look *l, const struct op_settlement *s,
                           int stays)
{
    const struct op_reconcile *k = l->k;
    const char *from = attempt_status_name(l->from),
               *to = attempt_status_name(s->status);
    char msg[128];
    if (s->settled && !stays)
        metrics_add(k->metrics.settlements, 1, to);
    if (s->busy) {
        /* Nothing waited for the session that holds it; our lease expires
         * and the next look decides again (its calls are recorded). */
        snprintf(msg, sizeof(msg), "%s locked by another session; looking again later",
                 k->words.noun);
        log_warn(msg, k->words.id_key, l->id, "order_id", l->order_id, NULL);
    } else if (!s->settled) {
        log_warn("lease lost before settling; result dropped", k->words.id_key, l->id,
                 "order_id", l->order_id, NULL);
    } else if (stays && l->throttled) {
        char wait[32];
        snprintf(wait, sizeof(wait), "%lld", l->wait_ms);
        log_info("the provider throttled the look; looking again after its wait",
                 k->words.id_key, l->id, "order_id", l->order_id, "status", from,
                 "wait_ms", wait, "reason", l->reason, NULL);
    } else if (stays) {
        log_debug("looked; looking again later", k->words.id_key, l->id, "order_id",
                  l->order_id, "status", from, "reason", l->reason, NULL);
    } else if (s->status == ATTEMPT_STATUS_REQUIRES_REVIEW) {
        snprintf(msg, sizeof(msg), "%s needs review", k->words.noun);
        log_warn(msg, k->words.id_key, l->id, k->words.about_key, l->about, "from",
                 from, "reason", l->reason, NULL);
    } else {
        snprintf(msg, sizeof(msg), "%s settled on the provider's evidence",
                 k->words.noun);
        log_info(msg, k->words.id_key, l->id, k->words.about_key, l->about, "from",
                 from, "status", to, k->words.object_key, l->ppid[0] ? l->ppid : NULL,
                 "reason", l->reason[0] ? l->reason : NULL, NULL);
    }
}

/* Settles one look, whatever it found: a status change, or the next look. */
static int settle(struct reconciler *r, struct look *l)
{
    struct charged_error err;
    struct op_call_row rows[MAX_ROWS];
    size_t n = rows_of(l, rows);
    /* The look's status, past RECONCILER_MAX_AGE_MS too, is the policy's. */
    int stays = l->status == l->from;
    char *evidence = json_dumps(l->evidence, JSON_COMPACT);
    struct op_settlement s = {
        .id = l->id,
        .lease_epoch = l->lease_epoch,
        .expected = l->from,
        .status = l->status,
        .reason = l->reason[0] ? l->reason : NULL,
        .object_id = l->ppid,
        .evidence_json = evidence,
        .amount = l->amount,
        /* A throttled look was none: its wait, not the schedule's next. */
        .next_check_ms =
            l->throttled ? l->wait_ms
                         : reconcile_look_next_check_ms(l->from, l->status, r->schedule,
                                                        r->nschedule, l->checks),
        .throttled = l->throttled,
        .rows = rows,
        .nrows = n,
    };
    enum charged_rc rc = l->k->settle(r->stores[l->kind], &s, &err);
    if (rc == CHARGED_BAD_ITEM && s.status != ATTEMPT_STATUS_REQUIRES_REVIEW)
        rc = settle_for_review(r, l, &s, &err);
    free(evidence);
    if (rc != CHARGED_OK)
        return not_settled(r, l, rc, rows, n, &err);
    reconciler_db_ok(r);
    log_settlement(l, &s, stays);
    return 0;
}

int reconciler_look_at(struct reconciler *r, size_t i, int64_t claimed_at)
{
    const struct op_look_env env = env_of(r);
    struct op_look_start start;
    struct look l = {.kind = r->on, .k = reconciler_face(r->on)};

    CHARGED_ASSERT(i < r->ndue);
    l.due = reconciler_row(r, i);
    l.k->begin(&env, l.due, &start, &l.core, claimed_at);
    l.id = start.id;
    l.lease_epoch = start.lease_epoch;
    l.from = start.from;
    l.checks = start.checks;
    l.order_id = start.order_id;
    l.about = start.about;
    r->look_object = start.object;
    r->look_skipped = 0;
    if (r->skip_object && start.object && !strcmp(r->skip_object, start.object)) {
        /* Its object was throttled in this round: back unlooked, due as
         * it was (reconciler.c's look_at_batch). */
        const char *id;
        const int64_t *epoch;
        struct charged_error err;
        l.k->due_lease(l.due, &id, &epoch);
        if (l.k->hand_back(r->stores[r->on], &id, epoch, 1, &err))
            log_warn("could not release lease; it will expire", l.k->words.id_key, id,
                     "error", err.message, NULL);
        r->look_skipped = 1;
        r->throttled_ms = 0;
        return 0;
    }
    l.lost = provider_outcome_lost_answer();
    l.evidence = json_pack("{s:[]}", "calls");
    look(r, &l);
    int failed = settle(r, &l);
    json_decref(l.evidence);
    /* Throttled looks in a row lengthen the back-off; any other resets it
     * (bounded: the back-off stops growing long before). */
    r->throttled_ms = l.throttled ? l.wait_ms : 0;
    r->throttled_in_a_row =
        l.throttled ? (r->throttled_in_a_row < 64 ? r->throttled_in_a_row + 1
                                                  : r->throttled_in_a_row)
                    : 0;
    CHARGED_ASSERT(!l.throttled || r->throttled_ms > 0);
    return failed;
}
