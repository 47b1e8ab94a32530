#include "reconciler.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attempt_status.h"
#include "charge_policy.h"
#include "charged_assert.h"
#include "clock.h"
#include "daemon_policy.h"
#include "log.h"
#include "metrics.h"
#include "reconcile_look.h"
#include "reconciler_int.h"

/* Calls one look makes at most (reconcile_look.h), for the lease's check. */
#define MAX_CALLS RECONCILE_LOOK_MAX_CALLS
/* How often the backlog gauges are counted in the database. */
#define BACKLOG_EVERY_MS 5000

/* What the role does, for --help. */
static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged reconciler\n\n"
            "Settles attempts whose outcome is unknown on the provider's evidence,\n"
            "and only on an intent proven the attempt's own: its recorded intent id\n"
            "(looked up), or, with none recorded, the answer to the charge again\n"
            "under the attempt's key while the provider keeps it (409: still\n"
            "executing, look again). An intent found by search or list only names\n"
            "the attempt: past the key's window it goes to REQUIRES_REVIEW; FAILED\n"
            "only when the provider's (consistent) list of the key's window holds\n"
            "none at all, after the key's retention and the search's lag.\n"
            "Looks again on RECONCILER_SCHEDULE_MS; past RECONCILER_MAX_AGE_MS, or on\n"
            "contradictory evidence, the attempt goes to REQUIRES_REVIEW.\n"
            "Refunds left UNKNOWN or PROCESSING alike: by refund id, else the refund\n"
            "again with its key while the provider keeps it; past that, a refund in\n"
            "the intent's list naming it goes to REQUIRES_REVIEW, none is FAILED.\n"
            "SIGTERM: finish the look in hand, hand the rest back, exit 0.\n\n");
    config_print_help(out, CONFIG_ROLE_RECONCILER);
}

/* ---- the schedule ---- */

static enum charged_rc parse_schedule(struct reconciler *r, const char *s,
                                      struct charged_error *err)
{
    r->nschedule = 0;
    while (s && *s) {
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        /* Digits only, at most a year each: the database must be able to add
         * it to now(). */
        if (!isdigit((unsigned char)*s) || end == s || errno || v > 31536000000LL ||
            (*end && (*end != ',' || !end[1])) || r->nschedule == MAX_SCHEDULE) {
            charged_error_set(
                err,
                "RECONCILER_SCHEDULE_MS: expected up to %d comma-separated "
                "durations in ms, each at most a year",
                MAX_SCHEDULE);
            return CHARGED_GIVE_UP;
        }
        r->schedule[r->nschedule++] = v;
        s = *end ? end + 1 : end;
    }
    if (r->nschedule == 0) {
        charged_error_set(err, "RECONCILER_SCHEDULE_MS: empty");
        return CHARGED_GIVE_UP;
    }
    return CHARGED_OK;
}

/* ---- the operations ---- */

const struct op_reconcile *reconciler_face(size_t k)
{
    const struct op_reconcile *f = payment_op_of(k)->reconcile;
    CHARGED_ASSERT(f);
    return f;
}

const void *reconciler_row(const struct reconciler *r, size_t i)
{
    CHARGED_ASSERT(i < r->ndue && r->due[r->on]);
    return (const char *)r->due[r->on] + i * reconciler_face(r->on)->due_size;
}

/* ---- leases ---- */

/* Extends the leases of the batch's attempts from `from` on. */
static void renew_rest(struct reconciler *r, size_t from, size_t n)
{
    struct charged_error err;
    const char *ids[1024];
    int64_t epochs[1024];
    int ours[1024];
    size_t k = 0;
    const struct op_reconcile *f = reconciler_face(r->on);
    CHARGED_ASSERT(from <= n && n <= r->ndue);
    for (size_t i = from; i < n && k < 1024; i++, k++) {
        const int64_t *epoch;
        f->due_lease(reconciler_row(r, i), &ids[k], &epoch);
        epochs[k] = *epoch;
    }
    if (f->renew(r->stores[r->on], ids, epochs, k, r->lease_ms, ours, &err) != 0)
        log_warn("could not renew leases; they may expire", "error", err.message, NULL);
}

/* Extends the leases of the attempt looked at and the rest of the batch
 * once a third of a lease has passed: a long look (a list of many pages)
 * must not let them expire under it. */
void reconciler_keep_leases(struct reconciler *r)
{
    if (clock_now_ms() - r->renewed_at <= r->lease_ms / 3)
        return;
    renew_rest(r, r->looking, r->ndue);
    r->renewed_at = clock_now_ms();
}

/* ---- the database, and the calls kept for it ---- */

void reconciler_db_failed(struct reconciler *r, const char *stage, const char *err)
{
    r->next_poll = daemon_db_failed(&r->db, stage, err);
}

void reconciler_db_ok(struct reconciler *r)
{
    daemon_db_ok(&r->db);
}

/* Calls whose look could not be written, kept (bounded) until the database
 * takes them: a charge made must never vanish from provider_calls. */
void reconciler_keep_calls(struct reconciler *r, size_t kind, const char *id,
                           const char *id_key, const struct op_call_row *rows, size_t n)
{
    CHARGED_ASSERT(id && id_key && (rows || n == 0));
    for (size_t i = 0; i < n; i++) {
        if (r->npending == PENDING_MAX) {
            log_warn("provider call log full; call kept in the log line only", id_key,
                     id, NULL);
            continue;
        }
        struct pending_call *p = &r->pending[r->npending++];
        snprintf(p->attempt_id, sizeof(p->attempt_id), "%s", id);
        p->kind = kind;
        p->operation = rows[i].operation;
        p->started_ms = rows[i].started_ms;
        p->res = *rows[i].res;
        p->written_maybe = 0;
    }
    CHARGED_ASSERT(r->npending <= PENDING_MAX);
}

/* Writes n kept calls, each kind's with its operation's store, in the
 * table's order: the first failure's answer. */
static enum charged_rc log_pending(struct reconciler *r, const struct pending_call *p,
                                   size_t n, struct charged_error *err)
{
    struct op_kept_call calls[PENDING_MAX];
    enum charged_rc rc = CHARGED_OK;
    CHARGED_ASSERT(n <= PENDING_MAX);
    for (size_t k = 0; k < payment_operations_count && rc == CHARGED_OK; k++) {
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            if (p[i].kind == k)
                calls[m++] = (struct op_kept_call){.id = p[i].attempt_id,
                                                   .operation = p[i].operation,
                                                   .started_ms = p[i].started_ms,
                                                   .res = &p[i].res,
                                                   .written_maybe = p[i].written_maybe};
        if (m)
            rc = reconciler_face(k)->log_calls(r->stores[k], calls, m, err);
    }
    return rc;
}

/* 0 when nothing waits any more. */
static int flush_pending(struct reconciler *r)
{
    struct charged_error err;
    if (r->npending == 0)
        return 0;
    int rc = log_pending(r, r->pending, r->npending, &err);
    if (rc == CHARGED_RETRY) {
        /* Given up at its deadline, the write may still commit. */
        for (size_t i = 0; i < r->npending; i++)
            r->pending[i].written_maybe = 1;
        reconciler_db_failed(r, "log provider calls", err.message);
        return -1;
    }
    if (rc == CHARGED_OK) {
        r->npending = 0;
        return 0;
    }
    /* One call refused, or held by another session's lock: one by one, so
     * that a refused row alone is dropped and a held one kept for later
     * (a charge made must never vanish from provider_calls). With several
     * kinds among them the statements of the kinds before the last may
     * have committed before a later one failed: those are written again
     * only if absent. */
    size_t last = 0;
    for (size_t i = 0; i < r->npending; i++)
        last = r->pending[i].kind > last ? r->pending[i].kind : last;
    size_t kept = 0;
    for (size_t i = 0; i < r->npending; i++) {
        r->pending[i].written_maybe |= r->pending[i].kind < last;
        rc = log_pending(r, &r->pending[i], 1, &err);
        if (rc == CHARGED_BAD_ITEM)
            log_error("provider call not recorded: the database refused it",
                      "payment_attempt_id", r->pending[i].attempt_id, "error",
                      err.message, NULL);
        else if (rc != CHARGED_OK) {
            r->pending[i].written_maybe |= rc == CHARGED_RETRY;
            r->pending[kept++] = r->pending[i];
        }
    }
    if (kept > 0) {
        char n[32];
        snprintf(n, sizeof(n), "%zu", kept);
        log_warn("provider calls held by another session's lock; kept to write later",
                 "calls", n, NULL);
    }
    r->npending = kept;
    if (rc == CHARGED_RETRY) {
        reconciler_db_failed(r, "log provider calls", err.message);
        return -1;
    }
    return 0;
}

/* ---- the loop ---- */

/* Hands back the claims of a batch cut short (stopping): a peer may look. */
static void release_rest(struct reconciler *r, size_t from, size_t n)
{
    struct charged_error err;
    const struct op_reconcile *f = reconciler_face(r->on);
    CHARGED_ASSERT(from <= n && n <= r->ndue);
    for (size_t i = from; i < n; i++) {
        const char *id;
        const int64_t *epoch;
        f->due_lease(reconciler_row(r, i), &id, &epoch);
        if (f->hand_back(r->stores[r->on], &id, epoch, 1, &err))
            log_warn("could not release lease; it will expire", f->words.id_key, id,
                     "error", err.message, NULL);
    }
}

/* Claims a batch of the records of kind k due for a look and settles
 * each. *n: how many were claimed. -1 when the round stops here (the
 * database failed, or stopping); 1 when a 429 ended a look (issue 38: the
 * provider said slower, so the rest is handed back, for after
 * r->throttled_ms).
 *
 * Unless the 429 may be one object's alone (adversary 38j: one card the
 * provider throttles by itself, its charges set aside by the workers and
 * first in the queue, stopped every other look for up to a minute at a
 * time): the first 429 of a batch about an object (op_look_start.object)
 * stops only that object's looks, handed back unlooked; the round goes on
 * with the others. A 429 about another object is the account's, and so is
 * the first when no other object's look followed it (adversary 38k: one
 * card on every record hammered the account's limit, 30 requests/s at
 * 1/s). */
static int look_at_batch(struct reconciler *r, size_t k, size_t *n)
{
    struct charged_error err;
    const struct op_reconcile *f = reconciler_face(k);
    long long hot_wait = 0;
    int other_looked = 0;

    *n = 0;
    r->skip_object = NULL;
    int rc = f->claim_due(r->stores[k], r->due[k], (size_t)r->batch, n, r->lease_ms,
                          r->stale_ms, &err);
    if (rc != CHARGED_OK) {
        reconciler_db_failed(r, f->stages.claim, err.message);
        return -1;
    }
    /* The batch's rows are r->batch long: a store claims no more. */
    CHARGED_ASSERT(*n <= (size_t)r->batch);
    reconciler_db_ok(r);
    int64_t claimed_at = clock_now_ms();
    r->on = k;
    r->ndue = *n;
    r->renewed_at = claimed_at;
    for (size_t i = 0; i < *n; i++) {
        if (daemon_stopping()) {
            release_rest(r, i, *n);
            return -1;
        }
        r->looking = i;
        reconciler_keep_leases(r);
        if (reconciler_look_at(r, i, claimed_at) != 0) {
            release_rest(r, i + 1, *n);
            return -1;
        }
        if (r->look_skipped)
            continue;
        if (r->throttled_ms > 0 && !r->skip_object && r->look_object &&
            r->look_object[0]) {
            r->skip_object = r->look_object; /* into the batch's row */
            hot_wait = r->throttled_ms;
            r->throttled_ms = 0;
            continue;
        }
        if (r->throttled_ms > 0) {
            release_rest(r, i + 1, *n);
            return 1;
        }
        other_looked |= r->skip_object != NULL;
    }
    if (r->skip_object && !other_looked) {
        r->throttled_ms = hot_wait;
        return 1;
    }
    return 0;
}

/* A batch of each operation's, in the table's order. */
static void look_at_due(struct reconciler *r, int64_t now)
{
    int full = 0;

    if (now < r->next_poll)
        return;
    if (flush_pending(r) != 0)
        return;
    for (size_t k = 0; k < payment_operations_count; k++) {
        size_t n = 0;
        if (!payment_op_of(k)->reconcile)
            continue;
        int rc = look_at_batch(r, k, &n);
        if (rc < 0)
            return;
        if (rc > 0) {
            /* Throttled: every kind waits, its calls as the look's. */
            r->next_poll = clock_now_ms() + r->throttled_ms;
            return;
        }
        full |= (long long)n >= r->batch;
    }
    /* A full batch: more may be due at once. */
    r->next_poll = !full ? clock_now_ms() + r->poll_ms : 0;
}

/* Every BACKLOG_EVERY_MS: how many attempts wait for a look, and how old
 * the oldest is, per status (one indexed count; with several reconcilers
 * each reports the same numbers). */
static void count_backlog(struct reconciler *r, int64_t now)
{
    static const enum attempt_status statuses[] = {ATTEMPT_STATUS_UNKNOWN,
                                                   ATTEMPT_STATUS_PROCESSING};
    long long counts[2], oldest[2];
    struct charged_error err;
    if (now < r->next_backlog || (r->db.backoff_ms && now < r->next_poll))
        return; /* not due, or the database is being waited for */
    r->next_backlog = now + BACKLOG_EVERY_MS;
    for (size_t k = 0; k < payment_operations_count; k++) {
        const struct op_reconcile *f = payment_op_of(k)->reconcile;
        if (!f)
            continue;
        if (f->backlog(r->stores[k], statuses, 2, counts, oldest, &err) != CHARGED_OK) {
            reconciler_db_failed(r, f->stages.backlog, err.message);
            return;
        }
        for (int i = 0; i < 2; i++) {
            const char *name = attempt_status_name(statuses[i]);
            metrics_set(f->metrics.backlog, (double)counts[i], name);
            metrics_set(f->metrics.oldest, oldest[i] / 1000.0, name);
        }
    }
}

/* Next due: the next poll for due attempts, or the backlog's count if it
 * comes first (while the database is backed off from, it waits for the
 * poll too). */
static int64_t reconciler_step(void *state, int64_t now)
{
    struct reconciler *r = state;
    count_backlog(r, now);
    look_at_due(r, clock_now_ms());
    if (r->db.backoff_ms)
        return r->next_poll;
    return daemon_policy_earliest(r->next_poll, r->next_backlog);
}

/* Ready: the database answers (the reconciler's work is all in it). */
static const char *reconciler_not_ready(void *state)
{
    struct reconciler *r = state;
    return daemon_db_not_ready(&r->db);
}

/* Nothing is in flight between steps: each step settles its batch or hands
 * the rest back. */
static size_t reconciler_drain(void *state, int64_t deadline)
{
    (void)state;
    (void)deadline;
    return 0;
}

static void teardown(struct reconciler *r)
{
    daemon_budget_leave(&r->budget);
    provider_client_free(r->provider);
    for (size_t k = 0; k < payment_operations_count; k++) {
        if (r->stores[k])
            reconciler_face(k)->store_free(r->stores[k]);
        free(r->due[k]);
    }
    config_free(r->cfg);
    free(r);
}

static void reconciler_finish(void *state, int flush_ms)
{
    (void)flush_ms;
    teardown(state);
}

static enum charged_rc setup(void *state, config_t *cfg, const char *id,
                             struct charged_error *err)
{
    struct reconciler *r = state;
    r->cfg = cfg;
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->batch = config_int(r->cfg, CONFIG_RECONCILER_BATCH);
    r->lease_ms = config_int(r->cfg, CONFIG_RECONCILER_LEASE_MS);
    r->poll_ms = config_int(r->cfg, CONFIG_RECONCILER_POLL_MS);
    r->max_age_ms = config_int(r->cfg, CONFIG_RECONCILER_MAX_AGE_MS);
    r->search_lag_ms = config_int(r->cfg, CONFIG_RECONCILER_SEARCH_LAG_MS);
    r->stale_ms = config_int(r->cfg, CONFIG_RECONCILER_STALE_LEASE_MS);
    r->key_retention_ms = config_int(r->cfg, CONFIG_WORKER_KEY_RETENTION_MS);
    r->provider_timeout_ms = config_int(r->cfg, CONFIG_PROVIDER_TIMEOUT_MS);
    /* A provider call is the longest a step waits between heartbeats. */
    long long stall_ms = config_int(r->cfg, CONFIG_HEALTH_STALL_MS);
    if (stall_ms <= r->provider_timeout_ms) {
        charged_error_set(
            err,
            "HEALTH_STALL_MS: %lld does not outlast one provider call "
            "(PROVIDER_TIMEOUT_MS %lld): a slow provider would look like a "
            "stuck reconciler",
            stall_ms, r->provider_timeout_ms);
        return CHARGED_GIVE_UP;
    }
    if (parse_schedule(r, config_str(r->cfg, CONFIG_RECONCILER_SCHEDULE_MS), err) !=
        CHARGED_OK)
        return CHARGED_GIVE_UP;
    /* One look makes two calls at most, a walk of the list apart (which
     * renews the lease as it goes); the lease must outlast them, or a peer
     * could look at the same attempt meanwhile. */
    if (r->lease_ms <= 2 * MAX_CALLS * r->provider_timeout_ms) {
        charged_error_set(
            err,
            "RECONCILER_LEASE_MS: %lld does not outlast a look's calls (%lld ms); "
            "raise it or lower PROVIDER_TIMEOUT_MS",
            r->lease_ms, 2 * MAX_CALLS * r->provider_timeout_ms);
        return CHARGED_GIVE_UP;
    }
    if (r->key_retention_ms <=
        charge_policy_key_margin_ms(r->key_retention_ms, r->provider_timeout_ms)) {
        charged_error_set(
            err, "WORKER_KEY_RETENTION_MS: %lld leaves no time to call the provider",
            r->key_retention_ms);
        return CHARGED_GIVE_UP;
    }
    for (size_t k = 0; k < payment_operations_count; k++)
        if (payment_op_of(k)->reconcile &&
            !(r->due[k] = calloc((size_t)r->batch, reconciler_face(k)->due_size))) {
            charged_error_set(err, "out of memory");
            return CHARGED_RETRY;
        }
    r->provider = provider_client_new(config_str(r->cfg, CONFIG_PROVIDER_BASE_URL),
                                      config_str(r->cfg, CONFIG_PROVIDER_API_KEY),
                                      config_str(r->cfg, CONFIG_PROVIDER_API_VERSION),
                                      r->provider_timeout_ms, err);
    if (!r->provider)
        return CHARGED_GIVE_UP;
    /* Its calls settle UNKNOWN: look-ups, after every money-moving write.
     * A call waits for its share at most one provider timeout: a call and
     * its wait fit the lease's two timeouts a call (above). */
    enum charged_rc rc =
        daemon_budget_join(&r->budget, r->cfg, "reconciler", BUDGET_PRIO_LOOKUP,
                           r->provider_timeout_ms, r->provider, err);
    if (rc != CHARGED_OK)
        return rc;
    /* Does not connect: started while the database is down, it waits. The
     * look's limits and an operation's own settings say what its store
     * claims. */
    const struct reconcile_limits lim = {
        .key_retention_ms = r->key_retention_ms,
        .provider_timeout_ms = r->provider_timeout_ms,
        .search_lag_ms = r->search_lag_ms,
        .max_age_ms = r->max_age_ms,
    };
    for (size_t k = 0; k < payment_operations_count; k++)
        if (payment_op_of(k)->reconcile &&
            !(r->stores[k] = reconciler_face(k)->store_new(
                  config_str(r->cfg, CONFIG_DATABASE_URL), r->id, &lim, r->cfg, err)))
            return CHARGED_GIVE_UP;
    return CHARGED_OK;
}

const struct daemon_role_desc reconciler_role = {
    .name = "reconciler",
    .config_role = CONFIG_ROLE_RECONCILER,
    .usage = usage,
    .state_size = sizeof(struct reconciler),
    .setup = setup,
    .step = reconciler_step,
    .not_ready = reconciler_not_ready,
    .drain = reconciler_drain,
    .finish = reconciler_finish,
};
