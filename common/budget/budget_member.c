#include "budget_member.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "charged_assert.h"
#include "clock.h"
#include "log.h"
#include "metrics.h"

/* The demand is counted in slots of one refresh period; the last
 * SLOTS of them make the second it reports. */
#define SLOTS   4
#define SLOT_MS (1000 / SLOTS)
/* A refresh meant for another member's lease end comes this long after
 * it, so that the end has passed on the database's clock too. */
#define BUDGET_END_SLACK_MS 5

struct budget_member {
    budget_lease_t *lease; /* NULL: off */
    pthread_mutex_t mu;    /* guards everything below */
    pthread_cond_t cv;
    struct budget_gate gate;
    int asks[SLOTS][BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT];
    long long slot_of[SLOTS]; /* which period each slot counts */
    int waiters[BUDGET_PRIO_COUNT][BUDGET_CLASS_COUNT];
    long long next_refresh_ms;
    struct budget_settings settings; /* as the last refresh read them */
    long long
        raises; /* refreshes whose settings raised a limit (the first one's none) */
    int have_settings;
    unsigned asked;   /* the classes this member ever asked for (1 << class) */
    int failing;      /* the last refresh failed (logged once) */
    int tolerated[3]; /* the last refresh met rows no member wrote, by kind
                         (budget_refresh's rows_unreadable, rows_unread,
                         leases_bounded): logged once per run of them */
    int refreshed;    /* a refresh was tried: there may be a row to delete */
    int stop;
    int thread_on;
    pthread_t thread;
};

void budget_member_ask_init(struct budget_ask *a, enum budget_class c,
                            enum budget_priority p)
{
    CHARGED_ASSERT(a != NULL);
    CHARGED_ASSERT(c >= 0 && c < BUDGET_CLASS_COUNT && p >= 0 && p < BUDGET_PRIO_COUNT);
    memset(a, 0, sizeof(*a));
    a->t.cls = c;
    a->t.prio = p;
}

budget_member_t *budget_member_new(const char *database_url, const char *account,
                                   const char *role, int enabled,
                                   struct charged_error *err)
{
    CHARGED_ASSERT(err != NULL);
    budget_member_t *m = calloc(1, sizeof(*m));
    if (!m) {
        charged_error_set(err, "budget: out of memory");
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    /* The refresher's waits are on the monotonic clock: a step of the
     * wall clock neither stalls nor hurries a refresh. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->cv, &ca);
    pthread_condattr_destroy(&ca);
    budget_gate_init(&m->gate, clock_now_ms());
    if (enabled) {
        m->lease = budget_lease_new(database_url, account, role, BUDGET_LEASE_MS, err);
        if (!m->lease) {
            budget_member_free(m);
            return NULL;
        }
    }
    return m;
}

/* Stops the refreshing thread, if one runs. */
static void stop_thread(budget_member_t *m)
{
    pthread_mutex_lock(&m->mu);
    int on = m->thread_on;
    m->stop = 1;
    m->thread_on = 0;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (on)
        pthread_join(m->thread, NULL);
}

void budget_member_free(budget_member_t *m)
{
    if (!m)
        return;
    stop_thread(m);
    budget_lease_free(m->lease);
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    free(m);
}

int budget_member_enabled(const budget_member_t *m)
{
    return m && m->lease;
}

long long budget_member_settings_raises(budget_member_t *m)
{
    CHARGED_ASSERT(m != NULL);
    if (!m->lease)
        return 0;
    pthread_mutex_lock(&m->mu);
    long long v = m->raises;
    pthread_mutex_unlock(&m->mu);
    CHARGED_ASSERT(v >= 0);
    return v;
}

/* ---- the demand ---- */

/* The slot counting the period of now_ms, emptied when it last counted an
 * older one. Under mu. */
static int slot_now(budget_member_t *m, long long now_ms)
{
    long long period = now_ms / SLOT_MS;
    int s = (int)(period % SLOTS);
    if (m->slot_of[s] != period) {
        memset(m->asks[s], 0, sizeof(m->asks[s]));
        m->slot_of[s] = period;
    }
    return s;
}

/* The last second's asks plus the waiters, in mrps. Under mu. */
static void measure(budget_member_t *m, long long now_ms, struct budget_demand *d)
{
    long long period = now_ms / SLOT_MS;
    memset(d, 0, sizeof(*d));
    for (int s = 0; s < SLOTS; s++) {
        if (m->slot_of[s] <= period - SLOTS)
            continue; /* older than the second */
        for (int p = 0; p < BUDGET_PRIO_COUNT; p++)
            for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
                d->mrps[p][c] += m->asks[s][p][c] * BUDGET_UNIT;
    }
    for (int p = 0; p < BUDGET_PRIO_COUNT; p++)
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
            long long v = d->mrps[p][c] + m->waiters[p][c] * BUDGET_UNIT;
            d->mrps[p][c] = v > BUDGET_DEMAND_MAX_MRPS ? BUDGET_DEMAND_MAX_MRPS : v;
            CHARGED_ASSERT(d->mrps[p][c] >= 0);
        }
}

/* ---- refreshes ---- */

/* A gauge's value: requests/s, -1 for no limit. */
static double rps(long long mrps)
{
    return mrps == BUDGET_UNLIMITED ? -1.0 : (double)mrps / (double)BUDGET_UNIT;
}

static void publish(const struct budget_refresh *r)
{
    const struct budget_settings *s = &r->settings;
    metrics_set(METRIC_PROVIDER_BUDGET, s->global_rps ? (double)s->global_rps : -1.0,
                "global", "limit");
    metrics_set(METRIC_PROVIDER_BUDGET, rps(r->held.global_mrps), "global", "share");
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++) {
        const char *name = budget_class_name((enum budget_class)c);
        metrics_set(METRIC_PROVIDER_BUDGET,
                    s->class_rps[c] ? (double)s->class_rps[c] : -1.0, name, "limit");
        metrics_set(METRIC_PROVIDER_BUDGET, rps(r->held.class_mrps[c]), name, "share");
    }
}

/* Rows no member wrote, as a refresh tolerated them: one line per kind when
 * it appears (not per refresh: they may last a lease, or come back while
 * someone keeps writing them). Called under mu; logging is thread-safe. */
static void tell_tolerated(budget_member_t *m, const struct budget_refresh *r)
{
    static const char *const what[3] = {
        "provider budget: rows of provider_budget_members no member wrote could not "
        "be read; each counts as holding the whole limit until its lease (bounded "
        "to 2 s) ends",
        "provider budget: more rows of provider_budget_members than an allocation "
        "divides among; those not read count as holding the whole limit (this "
        "member takes nothing more) until their leases (bounded to 2 s) end",
        "provider budget: leases of provider_budget_members longer than a member "
        "writes were bounded to 2 s from now"};
    int count[3] = {r->rows_unreadable, r->rows_unread, r->leases_bounded};
    for (int k = 0; k < 3; k++) {
        if (count[k] > 0 && !m->tolerated[k]) {
            char n[16];
            snprintf(n, sizeof(n), "%d", count[k]);
            log_warn(what[k], "member", budget_lease_member(m->lease), "rows", n, NULL);
        }
        m->tolerated[k] = count[k] > 0;
    }
}

/* One refresh: the demand read under mu, the lease refreshed without it
 * (a PostgreSQL transaction), its share handed to the gate under it,
 * valid from the clock read before the refresh. */
static enum charged_rc refresh(budget_member_t *m, struct charged_error *err)
{
    struct budget_demand d;
    struct budget_refresh r;
    long long before = clock_now_ms();
    pthread_mutex_lock(&m->mu);
    measure(m, before, &d);
    m->next_refresh_ms = before + BUDGET_REFRESH_MS;
    m->refreshed = 1;
    pthread_mutex_unlock(&m->mu);

    enum charged_rc rc = budget_lease_refresh(m->lease, &d, &r, err);
    pthread_mutex_lock(&m->mu);
    if (rc == CHARGED_OK) {
        CHARGED_ASSERT(r.lease_ms > 0);
        long long after = clock_now_ms();
        struct budget_share spend = r.held;
        budget_share_spendable(&r.settings, &spend);
        budget_gate_set_share(&m->gate, &spend, before + r.lease_ms, after);
        if (m->have_settings &&
            budget_settings_raised(&m->settings, &r.settings, m->asked))
            m->raises++;
        m->settings = r.settings;
        m->have_settings = 1;
        tell_tolerated(m, &r);
        /* Another member's lease ends before the next refresh (it died or
         * stalls): refresh just after, when its share is free. Counted
         * from after the call, which is later than the database's now(). */
        long long at = after + r.others_end_in_ms + BUDGET_END_SLACK_MS;
        if (r.others_end_in_ms >= 0 && at < m->next_refresh_ms)
            m->next_refresh_ms = at;
    }
    int was_failing = m->failing;
    m->failing = rc != CHARGED_OK;
    pthread_mutex_unlock(&m->mu);
    if (rc == CHARGED_OK)
        publish(&r);
    if (rc != CHARGED_OK && !was_failing)
        log_warn("provider budget: refresh failed; the share is kept until its lease "
                 "ends, then nothing is sent until a refresh succeeds",
                 "member", budget_lease_member(m->lease), "error", err->message, NULL);
    else if (rc == CHARGED_OK && was_failing)
        log_info("provider budget: refreshed again", "member",
                 budget_lease_member(m->lease), NULL);
    return rc;
}

enum charged_rc budget_member_refresh(budget_member_t *m, struct charged_error *err)
{
    CHARGED_ASSERT(m != NULL && err != NULL);
    charged_error_clear(err);
    if (!m->lease)
        return CHARGED_OK;
    return refresh(m, err);
}

static void *refresher(void *arg)
{
    budget_member_t *m = arg;
    struct charged_error err;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        long long now = clock_now_ms();
        if (now < m->next_refresh_ms) {
            long long at = m->next_refresh_ms; /* clock_now_ms: CLOCK_MONOTONIC */
            struct timespec ts = {.tv_sec = at / 1000, .tv_nsec = at % 1000 * 1000000};
            pthread_cond_timedwait(&m->cv, &m->mu, &ts);
            continue;
        }
        pthread_mutex_unlock(&m->mu);
        refresh(m, &err); /* no lock across the database */
        pthread_mutex_lock(&m->mu);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

enum charged_rc budget_member_start(budget_member_t *m, struct charged_error *err)
{
    CHARGED_ASSERT(m != NULL && err != NULL);
    if (!m->lease)
        return CHARGED_OK;
    pthread_mutex_lock(&m->mu);
    CHARGED_ASSERT(!m->thread_on); /* one thread */
    m->stop = 0;
    int rc = pthread_create(&m->thread, NULL, refresher, m);
    m->thread_on = rc == 0;
    pthread_mutex_unlock(&m->mu);
    if (rc != 0) {
        charged_error_set(err, "budget: cannot start the refreshing thread");
        return CHARGED_RETRY;
    }
    return CHARGED_OK;
}

/* ---- asks ---- */

long long budget_member_ask(budget_member_t *m, struct budget_ask *a, long long now_ms)
{
    CHARGED_ASSERT(m != NULL && a != NULL);
    if (!m->lease)
        return 0;
    enum budget_priority p = a->t.prio;
    enum budget_class c = a->t.cls;
    pthread_mutex_lock(&m->mu);
    if (!a->asked) {
        m->asks[slot_now(m, now_ms)][p][c]++;
        m->asked |= 1u << c;
        a->asked = 1;
        a->first_ms = now_ms;
    }
    int was_waiting = a->t.waiting;
    long long wait = budget_gate_ask(&m->gate, &a->t, now_ms);
    m->waiters[p][c] += a->t.waiting - was_waiting;
    CHARGED_ASSERT(m->waiters[p][c] >= 0);
    pthread_mutex_unlock(&m->mu);
    if (wait == 0) {
        metrics_observe(METRIC_PROVIDER_BUDGET_WAIT,
                        (double)(now_ms - a->first_ms) / 1e3, budget_priority_name(p));
        a->asked = 0; /* the ask may serve the next request */
    }
    return wait;
}

void budget_member_charge(budget_member_t *m, enum budget_class c,
                          enum budget_priority p, int n)
{
    CHARGED_ASSERT(m != NULL && n >= 0);
    CHARGED_ASSERT((unsigned)c < BUDGET_CLASS_COUNT && (unsigned)p < BUDGET_PRIO_COUNT);
    if (!m->lease || n == 0)
        return;
    long long now = clock_now_ms();
    pthread_mutex_lock(&m->mu);
    m->asks[slot_now(m, now)][p][c] += n; /* the demand is what arrives */
    for (int left = n; left > 0; left -= BUDGET_GATE_CHARGE_MAX)
        budget_gate_charge(
            &m->gate, c, left < BUDGET_GATE_CHARGE_MAX ? left : BUDGET_GATE_CHARGE_MAX,
            now);
    pthread_mutex_unlock(&m->mu);
}

void budget_member_forget(budget_member_t *m, struct budget_ask *a)
{
    CHARGED_ASSERT(m != NULL && a != NULL);
    a->asked = 0;
    if (!m->lease || !a->t.waiting)
        return;
    pthread_mutex_lock(&m->mu);
    budget_gate_forget(&m->gate, &a->t);
    m->waiters[a->t.prio][a->t.cls]--;
    CHARGED_ASSERT(m->waiters[a->t.prio][a->t.cls] >= 0 && !a->t.waiting);
    pthread_mutex_unlock(&m->mu);
}

static void sleep_ms(long long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000};
    nanosleep(&ts, NULL);
}

int budget_member_wait(budget_member_t *m, enum budget_class c, enum budget_priority p,
                       long long max_wait_ms, int (*stop)(void))
{
    CHARGED_ASSERT(m != NULL && max_wait_ms >= 0);
    struct budget_ask a;
    struct charged_error err;
    budget_member_ask_init(&a, c, p);
    long long start = clock_now_ms();
    for (;;) {
        long long now = clock_now_ms();
        long long wait = budget_member_ask(m, &a, now);
        if (wait == 0)
            return 0;
        if (now - start >= max_wait_ms || (stop && stop()))
            break;
        /* A one-shot caller refreshes itself: its demand, now counted, is
         * what gives it a share. */
        pthread_mutex_lock(&m->mu);
        int own = !m->thread_on && now >= m->next_refresh_ms;
        pthread_mutex_unlock(&m->mu);
        if (own) {
            refresh(m, &err);
            continue;
        }
        long long left = start + max_wait_ms - now;
        sleep_ms(wait < left ? wait : left);
    }
    budget_member_forget(m, &a);
    return -1;
}

enum charged_rc budget_member_join(const config_t *cfg, const char *role, int thread,
                                   budget_member_t **out, struct charged_error *err)
{
    CHARGED_ASSERT(cfg != NULL && role != NULL && out != NULL && err != NULL);
    *out = budget_member_new(config_str(cfg, CONFIG_DATABASE_URL),
                             config_str(cfg, CONFIG_PROVIDER_BUDGET_ACCOUNT), role,
                             config_int(cfg, CONFIG_PROVIDER_BUDGET) != 0, err);
    if (!*out)
        return CHARGED_GIVE_UP;
    if (!thread || !(*out)->lease)
        return CHARGED_OK;
    struct charged_error first;
    if (budget_member_refresh(*out, &first) == CHARGED_OK)
        log_info("provider budget joined", "member", budget_lease_member((*out)->lease),
                 "role", role, "account",
                 config_str(cfg, CONFIG_PROVIDER_BUDGET_ACCOUNT), NULL);
    return budget_member_start(*out, err);
}

int budget_member_gate(void *caller, enum budget_class cls, char *why, size_t why_size)
{
    const struct budget_caller *c = caller;
    CHARGED_ASSERT(c != NULL && c->member != NULL && why != NULL && why_size > 0);
    if (budget_member_wait(c->member, cls, c->prio, c->max_wait_ms, c->stop) == 0)
        return 0;
    if (c->stop && c->stop())
        snprintf(why, why_size, "provider budget: not sent, stopping");
    else
        snprintf(why, why_size,
                 "provider budget: no share for a %s request (%s) within %lld ms: the "
                 "limit is taken by requests of a higher priority or is 0 (chargectl "
                 "provider limits show)",
                 budget_priority_name(c->prio), budget_class_name(cls), c->max_wait_ms);
    return -1;
}

void budget_member_gate_charge(void *caller, enum budget_class cls, int n)
{
    const struct budget_caller *c = caller;
    CHARGED_ASSERT(c != NULL && c->member != NULL);
    budget_member_charge(c->member, cls, c->prio, n);
}

void budget_member_leave(budget_member_t *m)
{
    struct charged_error err;
    if (!m || !m->lease)
        return;
    stop_thread(m);
    if (!m->refreshed)
        return; /* never a member: no row */
    if (budget_lease_leave(m->lease, &err) != CHARGED_OK)
        log_warn("provider budget: could not leave; the share ends with its lease",
                 "member", budget_lease_member(m->lease), "error", err.message, NULL);
}
