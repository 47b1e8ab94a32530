/* The reconcilers and the api's webhook path of the simulation
 * (sim_actors.h): reconcile_look's looks as reconciler_look.c runs them,
 * and the webhook decisions, over the models. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_status.h"
#include "authorize_policy.h"
#include "capture.h"
#include "reconcile_policy.h"
#include "sim_actors.h"
#include "void_command.h"
#include "webhook_event.h"

/* ---- a reconciler: reconcile_look's look, as worker/roles/reconciler_look.c
 * runs it, one provider call a step ---- */

static const long long schedule_ms[] = {1000, 5000, 15000, 30000};
#define NSCHEDULE ((int)(sizeof(schedule_ms) / sizeof(schedule_ms[0])))

/* The model's provider never expires an authorization (no automatic
 * cancel): AUTHORIZED attempts are not on the reconciler's queue, and the
 * look's limits do not say when a hold lapses (that is the authorization's
 * own setting, its store's). */

/* The limits the look decides on; the broken key margin: the policy's
 * margin is the timeout plus a tenth of the retention (at most 60 s), and a
 * timeout of minus that tenth makes it 0. */
static struct reconcile_limits rec_limits(const struct world *w)
{
    struct reconcile_limits lim = {w->set.key_retention_ms, w->set.provider_timeout_ms,
                                   w->set.search_lag_ms, w->set.max_age_ms};
    if (w->breaks & SIM_BREAK_KEY_MARGIN) {
        int64_t tenth = w->set.key_retention_ms / 10;
        lim.provider_timeout_ms = -(tenth < 60000 ? tenth : 60000);
    }
    return lim;
}

/* capture_reconcile.c's order of evidence (a static table there): the
 * capture's own decision, capture_look_decide. */
static const struct reconcile_order sim_capture_order = {
    .decide = capture_look_decide,
    .operation = {[RECONCILE_RETRIEVE] = "retrieve", [RECONCILE_CHARGE] = "capture"},
};

/* The claimed record as reconcile_look reads it (reconciler_look.c's
 * charge_begin and refund_begin, and the steps' own). */
static void rec_begin(struct world *w, struct look *l)
{
    const struct reconcile_limits lim = rec_limits(w);
    struct reconcile_attempt ra = {
        .id = l->name,
        .status = l->status,
        .provider_payment_id = l->object,
        .key_age_ms = l->key_age_ms,
        .first_sent_ms = l->first_sent_ms,
        .age_ms = l->age_ms,
    };
    if (l->step) {
        /* capture_reconcile.c's capture_begin, void_reconcile.c's. */
        snprintf(l->name, sizeof(l->name), "s%d", l->id);
        if (l->intent != SIM_NULL)
            snprintf(l->object, sizeof(l->object), "pi_%d", l->intent);
        ra.amount = l->asked;
        ra.first_sent_ms = -1;
        reconcile_look_begin_order(&l->core,
                                   l->step == SIM_STEP_CAPTURE ? &sim_capture_order
                                                               : &void_look_order,
                                   &lim, &ra, l->claimed_at);
        return;
    }
    if (!l->refund) {
        sim_attempt_name(l->id, l->name, sizeof(l->name));
        if (l->intent != SIM_NULL)
            snprintf(l->object, sizeof(l->object), "pi_%d", l->intent);
        ra.amount = sim_store_attempt(w->store, l->id)->amount;
        ra.currency = "EUR";
    } else {
        snprintf(l->name, sizeof(l->name), "r%d", l->id);
        if (l->prefund != SIM_NULL)
            snprintf(l->object, sizeof(l->object), "re_%d", l->prefund);
        if (l->intent != SIM_NULL)
            snprintf(l->intent_name, sizeof(l->intent_name), "pi_%d", l->intent);
        ra.amount = sim_store_refund(w->store, l->id)->amount;
        ra.payment_intent = l->intent_name;
        ra.object = "refund";
    }
    if (l->manual && !l->refund)
        reconcile_look_begin_order(&l->core, &authorize_look_order, &lim, &ra,
                                   l->claimed_at);
    else
        reconcile_look_begin(&l->core,
                             l->refund ? RECONCILE_KIND_REFUND : RECONCILE_KIND_CHARGE,
                             &lim, &ra, l->claimed_at);
}

static void rec_claim(struct world *w, struct reconciler *r)
{
    struct look *l = &r->l;
    int64_t epoch;
    int id = sim_store_claim_due(w->store, r->id, 2 * w->set.lease_ms, w->set.stale_ms,
                                 &epoch);
    int refund = 0, step = 0;
    if (id < 0) {
        id = sim_store_refund_claim_due(w->store, r->id, 2 * w->set.lease_ms,
                                        w->set.stale_ms, &epoch);
        refund = 1;
    }
    if (id < 0) {
        id = sim_store_step_claim_due(w->store, r->id, 2 * w->set.lease_ms,
                                      w->set.stale_ms, &epoch);
        refund = 0, step = 1;
    }
    if (id < 0) {
        r->next_poll = w->now + 500;
        return;
    }
    memset(l, 0, sizeof(*l)); /* large: only when a look starts */
    l->active = 1;
    l->refund = refund;
    l->id = id;
    l->epoch = epoch;
    l->claimed_at = r->renewed_at = w->now;
    if (step) {
        struct sim_refund_row *f = sim_store_step(w->store, id);
        l->step = f->kind;
        l->status = f->status;
        l->intent = f->intent;
        l->asked = f->amount;
        l->key_age_ms = f->first_sent_at == SIM_NULL ? -1 : w->now - f->first_sent_at;
        l->age_ms = w->now - f->created_at;
    } else if (!refund) {
        struct sim_attempt *a = sim_store_attempt(w->store, id);
        l->status = a->status;
        l->intent = a->intent;
        l->manual = a->manual;
        l->key_age_ms = a->first_sent_at == SIM_NULL ? -1 : w->now - a->first_sent_at;
        l->first_sent_ms = a->first_sent_at == SIM_NULL ? -1 : a->first_sent_at;
        l->age_ms = w->now - a->created_at;
    } else {
        struct sim_refund_row *f = sim_store_refund(w->store, id);
        l->status = f->status;
        l->intent = f->intent;
        l->prefund = f->prefund;
        l->key_age_ms = f->first_sent_at == SIM_NULL ? -1 : w->now - f->first_sent_at;
        l->first_sent_ms = f->first_sent_at == SIM_NULL ? -1 : f->first_sent_at;
        l->age_ms = w->now - f->created_at;
    }
    if (w->breaks & SIM_BREAK_KEY_WINDOW)
        l->key_age_ms = -1; /* the broken look: every key counts as new */
    rec_begin(w, l);
    sim_note(w, r->id, A_REC_CLAIM, id, refund + 2 * l->step);
}

static void rec_settle(struct world *w, struct reconciler *r,
                       const struct reconcile_decision *dec)
{
    struct look *l = &r->l;
    int checks;
    int obj = dec->provider_payment_id[0] ? id_of(dec->provider_payment_id) : SIM_NULL;
    if (l->step)
        checks = sim_store_step(w->store, l->id)->reconcile_checks;
    else if (!l->refund)
        checks = sim_store_attempt(w->store, l->id)->reconcile_checks;
    else
        checks = sim_store_refund(w->store, l->id)->reconcile_checks;
    int stays = dec->status == l->status;
    /* A look a 429 ended is no look (reconciler_look.c): after its wait,
     * not the schedule's, and not counted (restored below). */
    int64_t next = dec->throttled
                       ? reconcile_look_throttled_ms(dec, 0)
                       : reconcile_look_next_check_ms(l->status, dec->status,
                                                      schedule_ms, NSCHEDULE, checks);
    int ok = l->step     ? sim_store_step_settle(w->store, l->id, l->status, r->id,
                                                 l->epoch, dec->status, dec->amount, next)
             : l->refund ? sim_store_refund_settle(w->store, l->id, l->status, r->id,
                                                   l->epoch, dec->status, obj, next)
                         : sim_store_settle(w->store, l->id, l->status, r->id, l->epoch,
                                            dec->status, obj, next);
    if (ok && dec->throttled) {
        if (l->step)
            sim_store_step(w->store, l->id)->reconcile_checks = checks;
        else if (!l->refund)
            sim_store_attempt(w->store, l->id)->reconcile_checks = checks;
        else
            sim_store_refund(w->store, l->id)->reconcile_checks = checks;
    }
    sim_note(w, r->id, A_REC_SETTLE, l->id, ok ? (long long)dec->status : -1);
    w->rec_settled += ok && !stays;
    w->rec_never_executed += ok && dec->rule == RECONCILE_NEVER_EXECUTED;
    l->active = 0;
}

/* One page of the list is the whole walk here (the models' lists are
 * short), folded as reconcile_policy_list_walk folds each. */
static struct provider_result rec_walk(const struct provider_result *page)
{
    struct provider_result walk = {0};
    reconcile_policy_list_fold(&walk, page, 1);
    return walk;
}

/* A charge's call, as reconciler_look.c's charge_call and charge_page make it;
 * 1 when its answer is lost. */
static int rec_call(struct world *w, struct look *l, const struct reconcile_step *st)
{
    struct sim_attempt *a = sim_store_attempt(w->store, l->id);
    int lost = 0;
    switch (st->next) {
    case RECONCILE_RETRIEVE:
        /* The recorded intent, or the one a replayed hold proved ours. */
        *st->answer = sim_provider_retrieve(
            w->prov, st->dec.object_id[0] ? id_of(st->dec.object_id) : l->intent);
        break;
    case RECONCILE_SEARCH:
    case RECONCILE_SEARCH_OTHERS:
        *st->answer = sim_provider_search(w->prov, l->id);
        break;
    case RECONCILE_CHARGE:
        *st->answer = sim_provider_charge(w->prov, a->key, a->id, a->order, a->amount,
                                          a->manual, &lost);
        w->charges_sent++;
        w->rec_charges++;
        break;
    case RECONCILE_LIST: {
        long long gte, lt;
        reconcile_policy_list_window(l->first_sent_ms, w->set.key_retention_ms, &gte,
                                     &lt);
        struct provider_result page = sim_provider_list(w->prov, l->id, gte, lt);
        if (w->breaks & SIM_BREAK_LIST_SKIPPED) /* the list not asked */
            page = (struct provider_result){.outcome = PROVIDER_NOT_FOUND,
                                            .http_status = 200};
        *st->answer = rec_walk(&page);
        break;
    }
    case RECONCILE_SETTLE:
        break;
    }
    return lost;
}

/* A refund's call, as reconciler_look.c's refund_call and refund_page. */
static int rec_call_refund(struct world *w, struct look *l,
                           const struct reconcile_step *st)
{
    struct sim_refund_row *f = sim_store_refund(w->store, l->id);
    int lost = 0;
    if (st->next == RECONCILE_RETRIEVE) {
        *st->answer = sim_provider_retrieve_refund(w->prov, l->prefund);
    } else if (st->next == RECONCILE_LIST) {
        struct provider_result page =
            sim_provider_list_refunds(w->prov, l->intent, l->id);
        *st->answer = rec_walk(&page);
    } else {
        *st->answer =
            sim_provider_refund(w->prov, f->key, l->intent, f->id, f->amount, &lost);
        w->charges_sent++;
    }
    return lost;
}

/* A capture's or void's call, as capture_reconcile.c's and
 * void_reconcile.c's: the step again under its key, or the intent by our
 * recorded id. */
static int rec_call_step(struct world *w, struct look *l,
                         const struct reconcile_step *st)
{
    struct sim_refund_row *f = sim_store_step(w->store, l->id);
    int lost = 0;
    if (st->next == RECONCILE_CHARGE) {
        *st->answer =
            l->step == SIM_STEP_CAPTURE
                ? sim_provider_capture(w->prov, f->key, l->intent, f->amount, &lost)
                : sim_provider_cancel(w->prov, f->key, l->intent, &lost);
        w->charges_sent++;
    } else {
        *st->answer = sim_provider_retrieve(w->prov, l->intent);
    }
    return lost;
}

void sim_rec_step(struct world *w, struct reconciler *r)
{
    struct look *l = &r->l;
    struct reconcile_step st;
    if (!l->active) {
        if (w->now >= r->next_poll)
            rec_claim(w, r);
        return;
    }
    if (w->now < l->busy_until)
        return; /* inside a call: the provider has not answered yet */
    /* reconciler_look.c measures the look's time before each decision, and
     * makes the call it names at once; the broken look: no time passed. */
    reconcile_look_step(&l->core,
                        w->breaks & SIM_BREAK_KEY_WINDOW ? l->claimed_at : w->now, &st);
    if (st.next == RECONCILE_SETTLE) {
        rec_settle(w, r, &st.dec);
        return;
    }
    int lost = l->step     ? rec_call_step(w, l, &st)
               : l->refund ? rec_call_refund(w, l, &st)
                           : rec_call(w, l, &st);
    l->busy_until =
        w->now + (lost ? w->set.provider_timeout_ms : 5 + st.answer->latency_ms);
    sim_note(w, r->id, A_REC_CALL, l->id, (l->refund ? 100 : 0) + st.next);
}

/* ---- webhooks: the api's path (webhook_store_apply) ---- */

/* A refund's event (apply_refund of webhook_store.c): one refund named. */
static void refund_webhook(struct world *w, const struct sim_webhook *h)
{
    const struct sim_prefund *f = &w->prov->refunds[h->intent];
    struct sim_refund_row *row = sim_store_refund(w->store, f->refund);
    w->webhooks++;
    if (!row) {
        sim_note(w, -1, A_WEBHOOK, h->event_id, -1);
        return;
    }
    struct webhook_refund r = {.amount = f->amount};
    snprintf(r.id, sizeof(r.id), "re_%d", h->intent);
    snprintf(r.status, sizeof(r.status), "succeeded");
    snprintf(r.currency, sizeof(r.currency), "EUR");
    snprintf(r.payment_intent, sizeof(r.payment_intent), "pi_%d", f->intent);
    snprintf(r.refund_id, sizeof(r.refund_id), "r%d", f->refund);
    struct webhook_refund_row wr = {
        .status = row->status,
        .amount = row->amount,
        .currency = "EUR",
        .intent_differs = row->intent != SIM_NULL && row->intent != f->intent,
        .provider_id_recorded = row->prefund != SIM_NULL,
        .provider_id_differs = row->prefund != SIM_NULL && row->prefund != h->intent,
        .provider_id_elsewhere = 0,
    };
    struct webhook_refund_decision d;
    webhook_refund_decide(&r, &wr, &d);
    int ok = d.action == WEBHOOK_REFUND_APPLY &&
             sim_store_refund_webhook_settle(w->store, row->id, d.status, h->intent);
    w->webhook_applied += ok;
    sim_note(w, -1, A_WEBHOOK, 1000000 + row->id, d.action * 10 + ok);
}

void sim_webhook_step(struct world *w)
{
    static struct webhook_event
        ev; /* large (its refunds): kept, not zeroed each time */
    struct sim_webhook h;
    if (!sim_provider_next_webhook(w->prov, &h))
        return;
    if ((size_t)h.event_id >= w->nseen) {
        size_t was = w->nseen;
        w->seen_events = sim_grow(w->seen_events, &w->nseen, (size_t)h.event_id + 1, 1);
        memset(w->seen_events + was, 0, w->nseen - was); /* never read unset bytes */
    }
    if (w->seen_events[h.event_id] == 1) {
        sim_note(w, -1, A_WEBHOOK, h.event_id, -2); /* duplicate: already processed */
        return;
    }
    w->seen_events[h.event_id] = 1;
    if (h.evidence == SIM_EV_REFUND) {
        refund_webhook(w, &h);
        return;
    }
    const struct sim_intent *in = &w->prov->intents[h.intent];
    struct sim_attempt *a = sim_store_attempt(w->store, in->attempt);
    w->webhooks++;
    if (!a) {
        sim_note(w, -1, A_WEBHOOK, h.event_id, -1); /* unmatched: kept for review */
        return;
    }
    ev.evidence = h.evidence == SIM_EV_SUCCEEDED    ? WEBHOOK_EVIDENCE_SUCCEEDED
                  : h.evidence == SIM_EV_FAILED     ? WEBHOOK_EVIDENCE_FAILED
                  : h.evidence == SIM_EV_AUTHORIZED ? WEBHOOK_EVIDENCE_AUTHORIZED
                                                    : WEBHOOK_EVIDENCE_PROCESSING;
    /* An authorization's events (amount_capturable_updated, payment_failed)
     * carry the intent's manual-capture fields. */
    snprintf(ev.capture_method, sizeof(ev.capture_method), "%s",
             in->manual ? "manual" : "automatic");
    ev.amount_capturable = h.evidence == SIM_EV_AUTHORIZED ? in->amount : 0;
    ev.amount_received = -1;
    ev.cancellation_reason[0] = '\0';
    ev.created = h.created / 1000;
    snprintf(ev.intent_id, sizeof(ev.intent_id), "pi_%d", h.intent);
    ev.amount = in->amount;
    snprintf(ev.currency, sizeof(ev.currency), "EUR");
    sim_attempt_name(in->attempt, ev.attempt_id, sizeof(ev.attempt_id));
    ev.nrefunds = 0;
    struct webhook_attempt wa = {
        .status = a->status,
        .amount = a->amount,
        .currency = "EUR",
        .updated_at = a->updated_at / 1000,
        .intent_recorded = a->intent != SIM_NULL,
        .intent_differs = a->intent != SIM_NULL && a->intent != h.intent,
        .intent_elsewhere = 0,
        .order_has_other_live = w->store->live_count[a->order] -
                                    (attempt_status_is_live(a->status) ? 1 : 0) >
                                0,
    };
    struct webhook_decision d;
    /* The api's routing: a manual intent's events are the authorization's. */
    if (in->manual)
        authorize_event_decide(&ev, &wa, &d);
    else
        webhook_event_decide(&ev, &wa, &d);
    int ok = 0;
    if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW)
        ok = sim_store_webhook_settle(w->store, a->id, d.status,
                                      d.action == WEBHOOK_APPLY ? h.intent : SIM_NULL);
    sim_note(w, -1, A_WEBHOOK, a->id, d.action * 10 + ok);
    w->webhook_applied += ok;
}

/* Another client of the provider account charges with metadata naming an
 * attempt of ours (issue 34): its event only names the attempt, whatever
 * the attempt's state, and must never move it. Its intent is not one the
 * model's provider made for us (no id of ours is that large). */
#define SIM_FOREIGN_INTENT (1 << 30)

void sim_foreign_webhook(struct world *w)
{
    static struct webhook_event ev; /* large: kept, not zeroed each time */
    if (w->next_attempt == 0)
        return;
    int id = (int)sim_rng_below(&w->rng, (uint64_t)w->next_attempt);
    struct sim_attempt *a = sim_store_attempt(w->store, id);
    if (!a)
        return;
    ev.evidence = sim_rng_below(&w->rng, 2) ? WEBHOOK_EVIDENCE_SUCCEEDED
                                            : WEBHOOK_EVIDENCE_FAILED;
    ev.created = w->now / 1000;
    snprintf(ev.intent_id, sizeof(ev.intent_id), "pi_%d", SIM_FOREIGN_INTENT + id);
    ev.amount = a->amount;
    snprintf(ev.currency, sizeof(ev.currency), "EUR");
    sim_attempt_name(id, ev.attempt_id, sizeof(ev.attempt_id));
    ev.nrefunds = 0;
    struct webhook_attempt wa = {
        .status = a->status,
        .amount = a->amount,
        .currency = "EUR",
        .updated_at = a->updated_at / 1000,
        .intent_recorded = a->intent != SIM_NULL,
        .intent_differs = a->intent != SIM_NULL,
    };
    if (w->breaks & SIM_BREAK_OWNERSHIP) {
        /* The rule dropped: metadata naming the attempt taken as ours. */
        wa.intent_recorded = 1;
        wa.intent_differs = 0;
    }
    struct webhook_decision d;
    webhook_event_decide(&ev, &wa, &d);
    w->foreign++;
    sim_note(w, -1, A_WEBHOOK, id, 100 + d.action);
    if (d.action == WEBHOOK_APPLY || d.action == WEBHOOK_REVIEW)
        sim_violate(&w->viol, "settled-by-foreign",
                    "attempt a%d (%s) moved to %s by intent %s that only names it", id,
                    attempt_status_name(a->status), attempt_status_name(d.status),
                    ev.intent_id);
}
