#include "auditor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "audit_run.h"
#include "audit_store.h"
#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "op.h"
#include "provider_client.h"

struct auditor {
    config_t *cfg;
    char id[160];
    provider_client_t *provider;
    struct daemon_budget budget; /* its walks draw from the fleet's, last */
    audit_store_t *store;
    struct audit_step_table steps; /* the operations' rules */
    long long window_s, lag_ms, poll_ms, from_unix, pending_batch, provider_timeout_ms;
    int64_t next_poll;
    struct daemon_db db;
    int leading;
};

/* What the role does, for --help. */
static void usage(FILE *out)
{
    fprintf(
        out,
        "usage: charged auditor\n\n"
        "Proves from the provider's own books that nothing was charged twice.\n"
        "Walks the provider's list of payment intents and refunds window by window\n"
        "of creation time (AUDITOR_WINDOW_MS), each once it ended AUDITOR_LAG_MS\n"
        "ago, and matches every object against the ledger, and every ledger row of\n"
        "the window against the provider: charged_twice, charged_unbooked,\n"
        "booked_not_charged, amount_mismatch, currency_mismatch, unknown_intent,\n"
        "refund_unbooked, refunded_over_charge, booked_foreign, foreign_intent and,\n");
    /* The kinds of the operations' rules, each its own words. */
    struct audit_step_table steps;
    payment_ops_audit_steps(&steps);
    for (size_t s = 0; s < steps.n; s++)
        fputs(steps.sets[s]->help, out);
    fprintf(out,
            " are recorded once each,\n"
            "with a verdict per window\n"
            "(chargectl audit list). What depends on an unsettled attempt is judged\n"
            "again once it settles. Restarts resume at the\n"
            "watermark; one auditor leads (a PostgreSQL advisory lock), others stand\n"
            "by. SIGTERM: the window in hand is given up and audited again later.\n\n");
    config_print_help(out, CONFIG_ROLE_AUDITOR);
}

static void forget_watermark(void)
{
    metrics_forget(METRIC_AUDIT_WATERMARK_AGE);
    metrics_forget(METRIC_AUDIT_PENDING);
    metrics_forget(METRIC_AUDIT_FINDINGS);
}

/* The findings as the table holds them, every kind (0 included), whoever
 * recorded them (chargectl audit run too): a restart neither loses nor
 * repeats one, and an alert sees each kind from its first finding. */
static int report_findings(struct auditor *a, struct charged_error *err)
{
    long long counts[AUDIT_KIND__COUNT];
    if (audit_store_findings_by_kind(a->store, counts, err) != CHARGED_OK)
        return -1;
    for (int k = 0; k < AUDIT_KIND__COUNT; k++)
        metrics_set(METRIC_AUDIT_FINDINGS, (double)counts[k],
                    audit_kind_name((enum audit_kind)k));
    return 0;
}

static int64_t store_failed(struct auditor *a, const char *stage, const char *err)
{
    a->next_poll = daemon_db_failed(&a->db, stage, err);
    if (a->leading)
        forget_watermark();
    a->leading = 0;
    return a->next_poll;
}

static void log_verdict(const struct audit_run_result *res, int recorded)
{
    char window[96], counts[160], found[32];
    char from[40], to[40];
    long long total = 0;
    for (int k = 0; k < AUDIT_KIND__COUNT; k++)
        total += res->verdict.findings[k];
    clock_rfc3339(res->verdict.start * 1000, from, sizeof(from));
    clock_rfc3339(res->verdict.end * 1000, to, sizeof(to));
    snprintf(window, sizeof(window), "%s/%s", from, to);
    snprintf(counts, sizeof(counts),
             "intents=%lld refunds=%lld ledger_rows=%lld pending=%lld",
             res->verdict.intents, res->verdict.refunds, res->verdict.ledger_rows,
             res->verdict.pending);
    snprintf(found, sizeof(found), "%lld", total);
    log_write(total ? LOG_WARN : LOG_INFO,
              recorded ? "window audited"
                       : "window audited; another auditor recorded it first",
              "window", window, "seen", counts, "findings", found, NULL);
}

static int stopping(void)
{
    return daemon_stopping() > 0;
}

/* The leader audits every due window in turn, then looks again at what it
 * could not judge yet; a standby waits for the lead. */
static int64_t auditor_step(void *state, int64_t now)
{
    struct auditor *a = state;
    struct charged_error err;
    struct audit_window w;
    struct audit_run_result res;
    /* A throttled request is asked again within one provider timeout, the
     * longest a request may wait (its budget share too). */
    const struct audit_run_hooks hooks = {daemon_heartbeat, stopping,
                                          a->provider_timeout_ms};
    struct charged_error why;
    int recorded = 0;

    if (now < a->next_poll || !daemon_db_due(&a->db))
        return a->next_poll;
    int rc = audit_store_lead(a->store, &err);
    if (rc != CHARGED_OK && rc != CHARGED_NOT_LEADER)
        return store_failed(a, "lead", err.message);
    daemon_db_reached(&a->db);
    int lead = rc == CHARGED_OK;
    if (lead != a->leading)
        log_info(lead ? "leading: auditing the provider's books"
                      : "standing by: another auditor audits",
                 "auditor", a->id, NULL);
    if (!lead && a->leading)
        forget_watermark();
    a->leading = lead;
    if (!lead) {
        daemon_db_ok(&a->db);
        return a->next_poll = now + a->poll_ms;
    }
    if (audit_store_next_window(a->store, a->from_unix, a->window_s, a->lag_ms, &w,
                                &err) != CHARGED_OK)
        return store_failed(a, "next window", err.message);
    metrics_set(METRIC_AUDIT_WATERMARK_AGE, w.watermark_age_ms / 1000.0);
    if (w.due) {
        if (audit_run_window(a->provider, a->store, w.start, w.end, 1, a->id, &a->steps,
                             &hooks, &res, &recorded, &why) != CHARGED_OK) {
            /* Done again whole: what was recorded stays recorded once. */
            if (!stopping())
                log_warn("window not audited; auditing it again", "error", why.message,
                         NULL);
            return a->next_poll = clock_now_ms() + a->poll_ms;
        }
        log_verdict(&res, recorded);
        if (recorded)
            metrics_add(METRIC_AUDIT_WINDOWS, 1);
        if (report_findings(a, &err) != 0)
            return store_failed(a, "findings", err.message);
        daemon_db_ok(&a->db);
        /* Behind: the next window may be due already. */
        return DAEMON_NOW;
    }
    long long pending = 0;
    if (audit_run_pending(a->provider, a->store, (size_t)a->pending_batch, &a->steps,
                          &hooks, &res, &why) != CHARGED_OK)
        log_warn("pending objects not looked at", "error", why.message, NULL);
    if (audit_store_pending_count(a->store, &pending, &err) != CHARGED_OK)
        return store_failed(a, "pending count", err.message);
    if (report_findings(a, &err) != 0)
        return store_failed(a, "findings", err.message);
    metrics_set(METRIC_AUDIT_PENDING, (double)pending);
    daemon_db_ok(&a->db);
    /* Wake when the window ends its lag, or at the next poll. */
    int64_t due = now + (w.end * 1000 + a->lag_ms - w.now_ms);
    a->next_poll = now + a->poll_ms;
    if (due > now && due < a->next_poll)
        a->next_poll = due;
    return a->next_poll;
}

static const char *auditor_not_ready(void *state)
{
    struct auditor *a = state;
    return daemon_db_not_ready(&a->db);
}

/* Nothing is in flight between steps: an audit interrupted is done again. */
static size_t auditor_drain(void *state, int64_t deadline)
{
    (void)state;
    (void)deadline;
    return 0;
}

static void teardown(struct auditor *a)
{
    audit_store_free(a->store);
    daemon_budget_leave(&a->budget);
    provider_client_free(a->provider);
    config_free(a->cfg);
    free(a);
}

static void auditor_finish(void *state, int flush_ms)
{
    (void)flush_ms;
    teardown(state);
}

static enum charged_rc setup(void *state, config_t *cfg, const char *id,
                             struct charged_error *err)
{
    struct auditor *a = state;
    a->cfg = cfg;
    snprintf(a->id, sizeof(a->id), "%s", id);
    long long window_ms = config_int(a->cfg, CONFIG_AUDITOR_WINDOW_MS);
    if (window_ms % 1000 != 0) {
        charged_error_set(
            err,
            "AUDITOR_WINDOW_MS must be whole seconds (the provider's creation times "
            "are): %lld",
            window_ms);
        return CHARGED_GIVE_UP;
    }
    a->window_s = window_ms / 1000;
    a->lag_ms = config_int(a->cfg, CONFIG_AUDITOR_LAG_MS);
    a->poll_ms = config_int(a->cfg, CONFIG_AUDITOR_POLL_MS);
    a->from_unix = config_int(a->cfg, CONFIG_AUDITOR_FROM);
    a->pending_batch = config_int(a->cfg, CONFIG_AUDITOR_PENDING_BATCH);
    a->provider_timeout_ms = config_int(a->cfg, CONFIG_PROVIDER_TIMEOUT_MS);
    payment_ops_audit_steps(&a->steps);
    a->provider = provider_client_new(config_str(a->cfg, CONFIG_PROVIDER_BASE_URL),
                                      config_str(a->cfg, CONFIG_PROVIDER_API_KEY),
                                      config_str(a->cfg, CONFIG_PROVIDER_API_VERSION),
                                      a->provider_timeout_ms, err);
    if (!a->provider)
        return CHARGED_GIVE_UP;
    /* Its walks come last of every priority (with the budget's audit
     * floor); a page waits at most one provider timeout, then is not
     * audited this time. */
    enum charged_rc rc =
        daemon_budget_join(&a->budget, a->cfg, "auditor", BUDGET_PRIO_AUDIT,
                           a->provider_timeout_ms, a->provider, err);
    if (rc != CHARGED_OK)
        return rc;
    a->store = audit_store_new(config_str(a->cfg, CONFIG_DATABASE_URL), err);
    if (!a->store)
        return CHARGED_GIVE_UP;
    return CHARGED_OK;
}

const struct daemon_role_desc auditor_role = {
    .name = "auditor",
    .config_role = CONFIG_ROLE_AUDITOR,
    .usage = usage,
    .state_size = sizeof(struct auditor),
    .setup = setup,
    .step = auditor_step,
    .not_ready = auditor_not_ready,
    .drain = auditor_drain,
    .finish = auditor_finish,
};
