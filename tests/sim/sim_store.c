#include "sim_store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim_rng.h"

static void *reach(void *arr, size_t *n, size_t idx, size_t elem, int fill)
{
    if (idx < *n)
        return arr;
    size_t ncap = *n ? *n : 64;
    while (ncap <= idx)
        ncap *= 2;
    char *a = realloc(arr, ncap * elem);
    if (!a) {
        fprintf(stderr, "charged-sim: out of memory\n");
        exit(2);
    }
    memset(a + *n * elem, fill, (ncap - *n) * elem);
    *n = ncap;
    return a;
}

static void push(int **arr, size_t *n, size_t *cap, int v)
{
    if (*n == *cap) {
        size_t ncap = *cap ? *cap * 2 : 64;
        int *a = realloc(*arr, ncap * sizeof(int));
        if (!a) {
            fprintf(stderr, "charged-sim: out of memory\n");
            exit(2);
        }
        *arr = a;
        *cap = ncap;
    }
    (*arr)[(*n)++] = v;
}

struct sim_store *sim_store_new(unsigned breaks, struct sim_violation *viol)
{
    struct sim_store *st = calloc(1, sizeof(*st));
    if (!st)
        return NULL;
    st->breaks = breaks;
    st->viol = viol;
    return st;
}

void sim_store_free(struct sim_store *st)
{
    if (!st)
        return;
    free(st->a);
    free(st->key_owner);
    free(st->live_count);
    free(st->r);
    free(st->rkey_owner);
    free(st->due);
    free(st->rdue);
    free(st->s);
    free(st->sdue);
    free(st);
}

struct sim_attempt *sim_store_attempt(struct sim_store *st, int id)
{
    return id >= 0 && (size_t)id < st->na && st->a[id].recorded ? &st->a[id] : NULL;
}

struct sim_refund_row *sim_store_refund(struct sim_store *st, int id)
{
    return id >= 0 && (size_t)id < st->nr && st->r[id].recorded ? &st->r[id] : NULL;
}

struct sim_refund_row *sim_store_step(struct sim_store *st, int id)
{
    return id >= 0 && (size_t)id < st->ns && st->s[id].recorded ? &st->s[id] : NULL;
}

static int fenced(const struct sim_store *st, int row_owner, int64_t row_epoch,
                  enum attempt_status row_status, int owner, int64_t epoch,
                  enum attempt_status expected)
{
    if (st->breaks & SIM_BREAK_EPOCH_FENCE)
        return 1; /* the broken persist: WHERE id = $1, nothing more */
    return row_owner == owner && row_epoch == epoch && row_status == expected;
}

/* Every status change of an attempt: the real transition table, and the
 * one-live-attempt-per-order partial unique index. -1: the statement fails. */
static int set_status(struct sim_store *st, struct sim_attempt *a,
                      enum attempt_status to)
{
    enum attempt_status from = a->status;
    int was_recorded = a->recorded;
    if (was_recorded && from != to && !attempt_status_transition_allowed((int)from, to))
        sim_violate(st->viol, "status-transition", "attempt a%d moved %s -> %s", a->id,
                    attempt_status_name(from), attempt_status_name(to));
    int was_live = was_recorded && attempt_status_is_live(from);
    int live = attempt_status_is_live(to);
    st->live_count =
        reach(st->live_count, &st->norders, (size_t)a->order, sizeof(int), 0);
    if (live && !was_live) {
        if (st->live_count[a->order] > 0 &&
            !(st->breaks & SIM_BREAK_ONE_LIVE_PER_ORDER))
            return -1;
        st->live_count[a->order]++;
    } else if (!live && was_live) {
        st->live_count[a->order]--;
    }
    a->status = to;
    a->updated_at = st->now;
    st->writes++;
    if ((to == ATTEMPT_STATUS_UNKNOWN || to == ATTEMPT_STATUS_PROCESSING) &&
        !a->in_due) {
        a->in_due = 1;
        push(&st->due, &st->ndue, &st->capdue, a->id);
    }
    if (st->on_status && was_recorded)
        st->on_status(st->ctx, a->id);
    return 0;
}

enum sim_record sim_store_record(struct sim_store *st, int id, int order, int key,
                                 long long amount, int manual, int owner,
                                 int64_t lease_ms, int64_t *epoch)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (a)
        return a->key == key && a->order == order && a->amount == amount &&
                       a->manual == manual
                   ? SIM_RECORDED
                   : SIM_RECORD_CONFLICT;
    st->key_owner = reach(st->key_owner, &st->nkeys, (size_t)key, sizeof(int), 0xff);
    if (st->key_owner[key] >= 0)
        return SIM_RECORD_CONFLICT;
    st->a = reach(st->a, &st->na, (size_t)id, sizeof(*st->a), 0);
    a = &st->a[id];
    memset(a, 0, sizeof(*a));
    a->id = id;
    a->order = order;
    a->key = key;
    a->amount = amount;
    a->manual = manual;
    a->lease_owner = SIM_NO_OWNER;
    a->lease_expires = a->first_sent_at = a->next_check_at = SIM_NULL;
    a->intent = SIM_NULL;
    a->created_at = st->now;
    st->key_owner[key] = id;
    /* The insert of a PROCESSING row, claimed; the partial index refuses it
     * when the order has a live attempt, and SQL_INSERT_REJECTED records
     * it REJECTED instead. */
    if (set_status(st, a, ATTEMPT_STATUS_PROCESSING) != 0) {
        set_status(st, a, ATTEMPT_STATUS_REJECTED);
        a->recorded = 1;
        return SIM_RECORD_REJECTED;
    }
    a->recorded = 1;
    a->lease_owner = owner;
    a->lease_expires = st->now + lease_ms;
    a->lease_epoch = 1;
    a->first_sent_at = st->now;
    *epoch = 1;
    return SIM_RECORDED_CLAIMED;
}

enum sim_claim sim_store_claim(struct sim_store *st, int id, int owner,
                               int64_t lease_ms, int64_t *epoch, int64_t *key_age_ms)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (!a)
        return SIM_BUSY;
    int takeover = a->status == ATTEMPT_STATUS_PROCESSING &&
                   a->next_check_at == SIM_NULL && a->lease_owner != SIM_NO_OWNER &&
                   (a->lease_expires < st->now || a->lease_owner == owner);
    if (a->status == ATTEMPT_STATUS_PENDING || takeover) {
        if (set_status(st, a, ATTEMPT_STATUS_PROCESSING) != 0)
            return SIM_BUSY;
        a->lease_owner = owner;
        a->lease_expires = st->now + lease_ms;
        a->lease_epoch++;
        if (a->first_sent_at == SIM_NULL)
            a->first_sent_at = st->now;
        *epoch = a->lease_epoch;
        *key_age_ms = st->now - a->first_sent_at;
        return SIM_CLAIMED;
    }
    int leased = a->lease_owner != SIM_NO_OWNER;
    if (a->status != ATTEMPT_STATUS_PENDING &&
        (a->status != ATTEMPT_STATUS_PROCESSING || !leased))
        return SIM_SETTLED;
    return SIM_BUSY;
}

int sim_store_persist(struct sim_store *st, int id, int owner, int64_t epoch,
                      enum attempt_status to, int intent, int64_t next_check_ms)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (!a || !fenced(st, a->lease_owner, a->lease_epoch, a->status, owner, epoch,
                      ATTEMPT_STATUS_PROCESSING))
        return 0;
    if (set_status(st, a, to) != 0)
        return 0;
    if (intent != SIM_NULL)
        a->intent = intent;
    a->lease_owner = SIM_NO_OWNER;
    a->lease_expires = SIM_NULL;
    a->next_check_at = next_check_ms < 0 ? SIM_NULL : st->now + next_check_ms;
    return 1;
}

int sim_store_renew(struct sim_store *st, int id, int owner, int64_t epoch,
                    int64_t lease_ms)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (!a || a->lease_owner != owner || a->lease_epoch != epoch)
        return 0;
    a->lease_expires = st->now + lease_ms;
    return 1;
}

void sim_store_release(struct sim_store *st, int id, int owner, int64_t epoch,
                       int hand_back)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (!a || a->lease_owner != owner || a->lease_epoch != epoch)
        return;
    if (hand_back) {
        a->lease_owner = SIM_NO_OWNER;
        a->lease_expires = SIM_NULL;
    } else {
        a->lease_expires = st->now;
    }
}

/* SQL_CLAIM_DUE's WHERE, for a row of either table. */
static int due_now(int64_t now, enum attempt_status s, int owner, int64_t expires,
                   int64_t next_check, int64_t stale_ms)
{
    if (next_check != SIM_NULL && next_check > now)
        return 0;
    int open = s == ATTEMPT_STATUS_UNKNOWN || s == ATTEMPT_STATUS_PROCESSING;
    return (open && owner == SIM_NO_OWNER) ||
           (s == ATTEMPT_STATUS_UNKNOWN && owner != SIM_NO_OWNER && expires < now) ||
           (s == ATTEMPT_STATUS_PROCESSING && owner != SIM_NO_OWNER &&
            expires < now - stale_ms);
}

int sim_store_claim_due(struct sim_store *st, int owner, int64_t lease_ms,
                        int64_t stale_ms, int64_t *epoch)
{
    int best = -1;
    int64_t best_at = 0;
    for (size_t k = 0; k < st->ndue;) {
        struct sim_attempt *a = &st->a[st->due[k]];
        if (a->status != ATTEMPT_STATUS_UNKNOWN &&
            a->status != ATTEMPT_STATUS_PROCESSING) {
            a->in_due = 0;
            st->due[k] = st->due[--st->ndue];
            continue;
        }
        k++;
        if (!due_now(st->now, a->status, a->lease_owner, a->lease_expires,
                     a->next_check_at, stale_ms))
            continue;
        /* ORDER BY next_check_at NULLS FIRST, id */
        int64_t at = a->next_check_at == SIM_NULL ? INT64_MIN : a->next_check_at;
        if (best < 0 || at < best_at || (at == best_at && a->id < best)) {
            best = a->id;
            best_at = at;
        }
    }
    if (best < 0)
        return -1;
    struct sim_attempt *a = &st->a[best];
    a->lease_owner = owner;
    a->lease_expires = st->now + lease_ms;
    a->lease_epoch++;
    if (a->next_check_at == SIM_NULL)
        a->next_check_at = st->now;
    *epoch = a->lease_epoch;
    return best;
}

int sim_store_settle(struct sim_store *st, int id, enum attempt_status expected,
                     int owner, int64_t epoch, enum attempt_status to, int intent,
                     int64_t next_check_ms)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (!a ||
        !fenced(st, a->lease_owner, a->lease_epoch, a->status, owner, epoch, expected))
        return 0;
    if (set_status(st, a, to) != 0)
        return 0;
    if (intent != SIM_NULL)
        a->intent = intent;
    a->lease_owner = SIM_NO_OWNER;
    a->lease_expires = SIM_NULL;
    a->reconcile_checks++;
    a->next_check_at = next_check_ms < 0 ? SIM_NULL : st->now + next_check_ms;
    return 1;
}

int sim_store_webhook_settle(struct sim_store *st, int id, enum attempt_status to,
                             int intent)
{
    struct sim_attempt *a = sim_store_attempt(st, id);
    if (!a || set_status(st, a, to) != 0)
        return 0;
    if (a->intent == SIM_NULL)
        a->intent = intent;
    a->lease_owner = SIM_NO_OWNER;
    a->lease_expires = SIM_NULL;
    a->lease_epoch++;
    if (to == ATTEMPT_STATUS_PROCESSING) {
        if (a->next_check_at == SIM_NULL)
            a->next_check_at = st->now;
    } else {
        a->next_check_at = SIM_NULL;
    }
    return 1;
}

/* ---- refunds ---- */

/* A refund's status change, with the trigger refund_attempts_money and the
 * CHECK refunded <= reserved <= amount. -1: the statement fails. */
static int refund_set_status(struct sim_store *st, struct sim_refund_row *r,
                             enum attempt_status to)
{
    enum attempt_status from = r->status;
    if (r->recorded && from != to && !attempt_status_transition_allowed((int)from, to))
        sim_violate(st->viol, "status-transition", "refund r%d moved %s -> %s", r->id,
                    attempt_status_name(from), attempt_status_name(to));
    if (r->recorded && from == ATTEMPT_STATUS_SUCCEEDED && to != from)
        return -1; /* the trigger: SUCCEEDED stays so */
    struct sim_attempt *c = sim_store_attempt(st, r->charge);
    if (to == ATTEMPT_STATUS_SUCCEEDED && from != to) {
        if (!c)
            return -1;
        if (c->refunded_amount + r->amount > c->refund_reserved &&
            !(st->breaks & SIM_BREAK_REFUND_RESERVATION))
            return -1; /* the CHECK */
        c->refunded_amount += r->amount;
    } else if ((to == ATTEMPT_STATUS_FAILED || to == ATTEMPT_STATUS_REJECTED) &&
               r->reserved) {
        c->refund_reserved -= r->amount;
        r->reserved = 0;
    }
    r->status = to;
    st->writes++;
    if (st->on_refund_status)
        st->on_refund_status(st->ctx, r->id);
    if ((to == ATTEMPT_STATUS_UNKNOWN || to == ATTEMPT_STATUS_PROCESSING) &&
        !r->in_due) {
        r->in_due = 1;
        push(&st->rdue, &st->nrdue, &st->caprdue, r->id);
    }
    return 0;
}

enum sim_record sim_store_refund_record(struct sim_store *st, int id, int charge,
                                        int key, long long amount)
{
    struct sim_refund_row *r = sim_store_refund(st, id);
    if (r)
        return r->key == key && r->charge == charge && r->amount == amount
                   ? SIM_RECORDED
                   : SIM_RECORD_CONFLICT;
    st->rkey_owner = reach(st->rkey_owner, &st->nrkeys, (size_t)key, sizeof(int), 0xff);
    if (st->rkey_owner[key] >= 0)
        return SIM_RECORD_CONFLICT;
    st->r = reach(st->r, &st->nr, (size_t)id, sizeof(*st->r), 0);
    r = &st->r[id];
    memset(r, 0, sizeof(*r));
    r->id = id;
    r->charge = charge;
    r->key = key;
    r->amount = amount;
    r->status = ATTEMPT_STATUS_PENDING;
    r->lease_owner = SIM_NO_OWNER;
    r->lease_expires = r->first_sent_at = r->next_check_at = SIM_NULL;
    r->intent = r->prefund = SIM_NULL;
    r->created_at = st->now;
    r->recorded = 1;
    st->rkey_owner[key] = id;
    return SIM_RECORDED;
}

enum sim_claim sim_store_refund_claim(struct sim_store *st, int id, int owner,
                                      int64_t lease_ms, int64_t *epoch,
                                      int64_t *key_age_ms, int *intent)
{
    struct sim_refund_row *r = sim_store_refund(st, id);
    if (!r)
        return SIM_BUSY;
    int takeover = r->status == ATTEMPT_STATUS_PROCESSING &&
                   r->next_check_at == SIM_NULL && r->lease_owner != SIM_NO_OWNER &&
                   r->lease_expires < st->now;
    if (r->status == ATTEMPT_STATUS_PENDING) {
        struct sim_attempt *c = sim_store_attempt(st, r->charge);
        if (c && (c->status == ATTEMPT_STATUS_PENDING ||
                  c->status == ATTEMPT_STATUS_PROCESSING))
            return SIM_BUSY; /* behind its charge: waits for it to settle */
        /* 0016's CHECK: an authorization's refunds are bound by what its
         * capture took (nothing before it), a charge's by its amount. */
        long long bound = c && c->manual && !(st->breaks & SIM_BREAK_REFUND_CAPTURED)
                              ? c->captured_amount
                          : c ? c->amount
                              : 0;
        int within = c && c->refund_reserved + r->amount <= bound;
        if (st->breaks & SIM_BREAK_REFUND_RESERVATION)
            within = c != NULL; /* the broken claim: no reservation at all */
        r->lease_epoch++;
        if (!c || c->status != ATTEMPT_STATUS_SUCCEEDED || !within) {
            refund_set_status(st, r, ATTEMPT_STATUS_REJECTED);
            return SIM_SETTLED;
        }
        if (!(st->breaks & SIM_BREAK_REFUND_RESERVATION)) {
            c->refund_reserved += r->amount;
            r->reserved = 1;
        }
        r->intent = c->intent;
        refund_set_status(st, r, ATTEMPT_STATUS_PROCESSING);
    } else if (takeover) {
        r->lease_epoch++;
    } else {
        int leased = r->lease_owner != SIM_NO_OWNER;
        return r->status != ATTEMPT_STATUS_PROCESSING || !leased ? SIM_SETTLED
                                                                 : SIM_BUSY;
    }
    r->lease_owner = owner;
    r->lease_expires = st->now + lease_ms;
    if (r->first_sent_at == SIM_NULL)
        r->first_sent_at = st->now;
    *epoch = r->lease_epoch;
    *key_age_ms = st->now - r->first_sent_at;
    *intent = r->intent;
    return SIM_CLAIMED;
}

int sim_store_refund_persist(struct sim_store *st, int id, int owner, int64_t epoch,
                             enum attempt_status to, int prefund, int64_t next_check_ms)
{
    struct sim_refund_row *r = sim_store_refund(st, id);
    if (!r || !fenced(st, r->lease_owner, r->lease_epoch, r->status, owner, epoch,
                      ATTEMPT_STATUS_PROCESSING))
        return 0;
    if (prefund != SIM_NULL)
        r->prefund = prefund;
    if (refund_set_status(st, r, to) != 0)
        return 0;
    r->lease_owner = SIM_NO_OWNER;
    r->lease_expires = SIM_NULL;
    r->next_check_at = next_check_ms < 0 ? SIM_NULL : st->now + next_check_ms;
    return 1;
}

int sim_store_refund_webhook_settle(struct sim_store *st, int id,
                                    enum attempt_status to, int prefund)
{
    struct sim_refund_row *r = sim_store_refund(st, id);
    if (!r || refund_set_status(st, r, to) != 0)
        return 0;
    if (r->prefund == SIM_NULL)
        r->prefund = prefund;
    r->lease_owner = SIM_NO_OWNER;
    r->lease_expires = SIM_NULL;
    r->lease_epoch++;
    if (to == ATTEMPT_STATUS_PROCESSING) {
        if (r->next_check_at == SIM_NULL)
            r->next_check_at = st->now;
    } else {
        r->next_check_at = SIM_NULL;
    }
    return 1;
}

static int row_renew(struct sim_store *st, struct sim_refund_row *r, int owner,
                     int64_t epoch, int64_t lease_ms)
{
    if (!r || r->lease_owner != owner || r->lease_epoch != epoch)
        return 0;
    r->lease_expires = st->now + lease_ms;
    return 1;
}

static void row_release(struct sim_store *st, struct sim_refund_row *r, int owner,
                        int64_t epoch, int hand_back)
{
    if (!r || r->lease_owner != owner || r->lease_epoch != epoch)
        return;
    if (hand_back) {
        r->lease_owner = SIM_NO_OWNER;
        r->lease_expires = SIM_NULL;
    } else {
        r->lease_expires = st->now;
    }
}

/* SQL_CLAIM_DUE over one table of rows and its queue. */
static int row_claim_due(struct sim_store *st, struct sim_refund_row *rows, int *due,
                         size_t *ndue, int owner, int64_t lease_ms, int64_t stale_ms,
                         int64_t *epoch)
{
    for (size_t k = 0; k < *ndue;) {
        struct sim_refund_row *r = &rows[due[k]];
        if (r->status != ATTEMPT_STATUS_UNKNOWN &&
            r->status != ATTEMPT_STATUS_PROCESSING) {
            r->in_due = 0;
            due[k] = due[--*ndue];
            continue;
        }
        k++;
        if (!due_now(st->now, r->status, r->lease_owner, r->lease_expires,
                     r->next_check_at, stale_ms))
            continue;
        r->lease_owner = owner;
        r->lease_expires = st->now + lease_ms;
        r->lease_epoch++;
        if (r->next_check_at == SIM_NULL)
            r->next_check_at = st->now;
        *epoch = r->lease_epoch;
        return r->id;
    }
    return -1;
}

int sim_store_refund_renew(struct sim_store *st, int id, int owner, int64_t epoch,
                           int64_t lease_ms)
{
    return row_renew(st, sim_store_refund(st, id), owner, epoch, lease_ms);
}

void sim_store_refund_release(struct sim_store *st, int id, int owner, int64_t epoch,
                              int hand_back)
{
    row_release(st, sim_store_refund(st, id), owner, epoch, hand_back);
}

int sim_store_refund_claim_due(struct sim_store *st, int owner, int64_t lease_ms,
                               int64_t stale_ms, int64_t *epoch)
{
    return row_claim_due(st, st->r, st->rdue, &st->nrdue, owner, lease_ms, stale_ms,
                         epoch);
}

int sim_store_refund_settle(struct sim_store *st, int id, enum attempt_status expected,
                            int owner, int64_t epoch, enum attempt_status to,
                            int prefund, int64_t next_check_ms)
{
    struct sim_refund_row *r = sim_store_refund(st, id);
    if (!r ||
        !fenced(st, r->lease_owner, r->lease_epoch, r->status, owner, epoch, expected))
        return 0;
    if (prefund != SIM_NULL)
        r->prefund = prefund;
    if (refund_set_status(st, r, to) != 0)
        return 0;
    r->lease_owner = SIM_NO_OWNER;
    r->lease_expires = SIM_NULL;
    r->reconcile_checks++;
    r->next_check_at = next_check_ms < 0 ? SIM_NULL : st->now + next_check_ms;
    return 1;
}

/* ---- captures and voids: migrations 0016-0018's hold ---- */

/* The hold given back (a step that failed, or was refused). */
static void hold_give_back(struct sim_attempt *a, const struct sim_refund_row *r)
{
    if (a && a->held_kind == r->kind && a->held_id == r->id)
        a->held_kind = a->held_id = 0;
}

/* A step's success moves its authorization (the trigger
 * authorization_steps_hold and capture_store's SQL_BOOK): only while the
 * step holds it; a capture makes it SUCCEEDED with what it took (once:
 * capture_attempts_one_per_authorization), a void VOIDED. -1: refused. */
static int step_success(struct sim_store *st, struct sim_refund_row *r,
                        struct sim_attempt *a)
{
    unsigned broken = st->breaks & (SIM_BREAK_CAPTURE_HOLD | SIM_BREAK_VOID_HOLD);
    if (!a || (!broken && (a->held_kind != r->kind || a->held_id != r->id)))
        return -1;
    if (r->kind == SIM_STEP_VOID) {
        if (a->status == ATTEMPT_STATUS_VOIDED)
            return 0;
        if (set_status(st, a, ATTEMPT_STATUS_VOIDED) != 0)
            return -1;
    } else {
        if (r->captured < 1 || r->captured > a->amount ||
            (a->captures_succeeded > 0 && !(st->breaks & SIM_BREAK_CAPTURE_HOLD)))
            return -1;
        a->captured_amount = r->captured;
        a->captures_succeeded++;
        if (a->status != ATTEMPT_STATUS_SUCCEEDED &&
            set_status(st, a, ATTEMPT_STATUS_SUCCEEDED) != 0)
            return -1;
    }
    hold_give_back(a, r);
    return 0;
}

/* A capture's or void's status change: the transition table, the
 * trigger's hold and money. -1: the statement fails. */
static int step_set_status(struct sim_store *st, struct sim_refund_row *r,
                           enum attempt_status to)
{
    enum attempt_status from = r->status;
    if (r->recorded && from != to && !attempt_status_transition_allowed((int)from, to))
        sim_violate(st->viol, "status-transition", "%s s%d moved %s -> %s",
                    r->kind == SIM_STEP_CAPTURE ? "capture" : "void", r->id,
                    attempt_status_name(from), attempt_status_name(to));
    if (r->recorded && from == ATTEMPT_STATUS_SUCCEEDED && to != from)
        return -1; /* SUCCEEDED stays so */
    struct sim_attempt *a = sim_store_attempt(st, r->charge);
    if (to == ATTEMPT_STATUS_SUCCEEDED && from != to) {
        if (step_success(st, r, a) != 0)
            return -1;
    } else if (to == ATTEMPT_STATUS_FAILED || to == ATTEMPT_STATUS_REJECTED) {
        hold_give_back(a, r);
    }
    r->status = to;
    st->writes++;
    if (st->on_step_status && r->recorded)
        st->on_step_status(st->ctx, r->id);
    if ((to == ATTEMPT_STATUS_UNKNOWN || to == ATTEMPT_STATUS_PROCESSING) &&
        !r->in_due) {
        r->in_due = 1;
        push(&st->sdue, &st->nsdue, &st->capsdue, r->id);
    }
    return 0;
}

enum sim_record sim_store_step_record(struct sim_store *st, int id, int kind,
                                      int attempt, int key, long long amount)
{
    struct sim_refund_row *r = sim_store_step(st, id);
    if (r)
        return r->key == key && r->charge == attempt && r->amount == amount &&
                       r->kind == kind
                   ? SIM_RECORDED
                   : SIM_RECORD_CONFLICT;
    st->s = reach(st->s, &st->ns, (size_t)id, sizeof(*st->s), 0);
    r = &st->s[id];
    memset(r, 0, sizeof(*r));
    r->kind = kind;
    r->id = id;
    r->charge = attempt;
    r->key = key;
    r->amount = amount;
    r->status = ATTEMPT_STATUS_PENDING;
    r->lease_owner = SIM_NO_OWNER;
    r->lease_expires = r->first_sent_at = r->next_check_at = SIM_NULL;
    r->intent = r->prefund = SIM_NULL;
    r->created_at = st->now;
    r->recorded = 1;
    return SIM_RECORDED;
}

/* The claim's verdict on a PENDING step (capture_store's and void_store's
 * SQL_CLAIM): NULL it takes the hold, "" it waits (its authorization's
 * first answer is not in yet), else the reason it is REJECTED. The
 * --break rules drop one check each, for captures. */
static const char *step_refusal(const struct sim_store *st,
                                const struct sim_refund_row *r,
                                const struct sim_attempt *a)
{
    int capture = r->kind == SIM_STEP_CAPTURE;
    int once = !capture || !(st->breaks & SIM_BREAK_CAPTURE_HOLD);
    int voids = !capture || !(st->breaks & SIM_BREAK_VOID_HOLD);
    if (!a)
        return "attempt_unknown";
    if (!a->manual)
        return "not_authorized";
    if (a->status == ATTEMPT_STATUS_SUCCEEDED && once)
        return capture ? "already_captured" : "void_after_capture";
    if (a->status == ATTEMPT_STATUS_VOIDED && voids)
        return capture ? "capture_after_void" : "authorization_voided";
    if (a->held_kind == SIM_STEP_VOID && voids)
        return capture ? "capture_after_void" : "authorization_held";
    if (a->held_kind == SIM_STEP_CAPTURE && once)
        return "authorization_held";
    if ((a->status == ATTEMPT_STATUS_PENDING ||
         a->status == ATTEMPT_STATUS_PROCESSING) &&
        st->now - r->created_at < 300000) /* CAPTURE_ORDER_WINDOW, VOID_ORDER_WINDOW */
        return "";
    if (a->status != ATTEMPT_STATUS_AUTHORIZED &&
        !(a->status == ATTEMPT_STATUS_SUCCEEDED && !once) &&
        !(a->status == ATTEMPT_STATUS_VOIDED && !voids))
        return "not_authorized";
    if (capture && r->amount > a->amount && !(st->breaks & SIM_BREAK_CAPTURE_AMOUNT))
        return "amount_over_authorized";
    return NULL;
}

enum sim_claim sim_store_step_claim(struct sim_store *st, int id, int owner,
                                    int64_t lease_ms, int64_t *epoch,
                                    int64_t *key_age_ms, int *intent)
{
    struct sim_refund_row *r = sim_store_step(st, id);
    if (!r)
        return SIM_BUSY;
    int takeover = r->status == ATTEMPT_STATUS_PROCESSING &&
                   r->next_check_at == SIM_NULL && r->lease_owner != SIM_NO_OWNER &&
                   r->lease_expires < st->now;
    if (r->status == ATTEMPT_STATUS_PENDING) {
        struct sim_attempt *a = sim_store_attempt(st, r->charge);
        const char *why = step_refusal(st, r, a);
        if (why && !why[0])
            return SIM_BUSY;
        r->lease_epoch++;
        if (why) {
            r->reason = why;
            step_set_status(st, r, ATTEMPT_STATUS_REJECTED);
            return SIM_SETTLED;
        }
        a->held_kind = r->kind; /* the hold, in the claim's statement */
        a->held_id = r->id;
        r->intent = a->intent;
        step_set_status(st, r, ATTEMPT_STATUS_PROCESSING);
    } else if (takeover) {
        r->lease_epoch++;
    } else {
        int leased = r->lease_owner != SIM_NO_OWNER;
        return r->status != ATTEMPT_STATUS_PROCESSING || !leased ? SIM_SETTLED
                                                                 : SIM_BUSY;
    }
    r->lease_owner = owner;
    r->lease_expires = st->now + lease_ms;
    if (r->first_sent_at == SIM_NULL)
        r->first_sent_at = st->now;
    *epoch = r->lease_epoch;
    *key_age_ms = st->now - r->first_sent_at;
    *intent = r->intent;
    return SIM_CLAIMED;
}

/* A fenced write of a step's outcome: the worker's persist (expected
 * PROCESSING) or the reconciler's settle. */
static int step_write(struct sim_store *st, struct sim_refund_row *r,
                      enum attempt_status expected, int owner, int64_t epoch,
                      enum attempt_status to, long long captured, int64_t next_check_ms)
{
    if (!r ||
        !fenced(st, r->lease_owner, r->lease_epoch, r->status, owner, epoch, expected))
        return 0;
    if (captured > 0 && r->status != ATTEMPT_STATUS_SUCCEEDED)
        r->captured = captured;
    if (step_set_status(st, r, to) != 0)
        return 0;
    r->lease_owner = SIM_NO_OWNER;
    r->lease_expires = SIM_NULL;
    r->next_check_at = next_check_ms < 0 ? SIM_NULL : st->now + next_check_ms;
    return 1;
}

int sim_store_step_persist(struct sim_store *st, int id, int owner, int64_t epoch,
                           enum attempt_status to, long long captured,
                           int64_t next_check_ms)
{
    return step_write(st, sim_store_step(st, id), ATTEMPT_STATUS_PROCESSING, owner,
                      epoch, to, captured, next_check_ms);
}

int sim_store_step_settle(struct sim_store *st, int id, enum attempt_status expected,
                          int owner, int64_t epoch, enum attempt_status to,
                          long long captured, int64_t next_check_ms)
{
    struct sim_refund_row *r = sim_store_step(st, id);
    int ok = step_write(st, r, expected, owner, epoch, to, captured, next_check_ms);
    if (ok)
        r->reconcile_checks++;
    return ok;
}

int sim_store_step_renew(struct sim_store *st, int id, int owner, int64_t epoch,
                         int64_t lease_ms)
{
    return row_renew(st, sim_store_step(st, id), owner, epoch, lease_ms);
}

void sim_store_step_release(struct sim_store *st, int id, int owner, int64_t epoch,
                            int hand_back)
{
    row_release(st, sim_store_step(st, id), owner, epoch, hand_back);
}

int sim_store_step_claim_due(struct sim_store *st, int owner, int64_t lease_ms,
                             int64_t stale_ms, int64_t *epoch)
{
    return row_claim_due(st, st->s, st->sdue, &st->nsdue, owner, lease_ms, stale_ms,
                         epoch);
}

uint64_t sim_store_hash(const struct sim_store *st, uint64_t h)
{
    h = sim_hash_mix(h, st->writes);
    for (size_t i = 0; i < st->na; i++)
        if (st->a[i].recorded)
            h = sim_hash_mix(h, (uint64_t)st->a[i].status << 40 ^
                                    (uint64_t)st->a[i].lease_epoch << 8 ^
                                    (uint64_t)(st->a[i].intent + 1));
    for (size_t i = 0; i < st->nr; i++)
        if (st->r[i].recorded)
            h = sim_hash_mix(h, (uint64_t)st->r[i].status << 40 ^
                                    (uint64_t)st->r[i].lease_epoch);
    for (size_t i = 0; i < st->ns; i++)
        if (st->s[i].recorded)
            h = sim_hash_mix(h, (uint64_t)st->s[i].status << 40 ^
                                    (uint64_t)st->s[i].lease_epoch << 8 ^
                                    (uint64_t)st->s[i].captured);
    return h;
}
