#include "engine_int.h"

#include <stdio.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "clock.h"
#include "config.h"
#include "log.h"
#include "metrics.h"

/* ---- calls ---- */

void engine_unpark_jobs(engine_t *eng)
{
    int64_t now = clock_now_ms();
    for (struct job *j = job_list_first(eng->jobs, JOB_PARKED), *next; j; j = next) {
        next = job_next_in_state(j);
        /* Oldest parked first; the first refused for want of a slot ends
         * the round (one refused for not being due does not). */
        if (engine_core_park_gate(&eng->core, eng->jobs, j, now) == ENGINE_NEXT_SKIP &&
            (long long)engine_core_started(eng->jobs) >= eng->core.max_in_flight)
            break;
    }
}

/* The operation's name of a job's call ("charge", "refund", ...). */
static const char *op_name(const engine_t *eng, const struct job *j)
{
    return eng->op->kind_name ? eng->op->kind_name(j->kind) : eng->op->name;
}

/* The provider's endpoint class of a job's call (docs/provider.md), what
 * its throttling is counted under and its budget asked for, and the
 * budget's priority of it: the operation's (engine_op.budget_of). */
static void budget_of(const engine_t *eng, const struct job *j, enum budget_class *cls,
                      enum budget_priority *prio)
{
    CHARGED_ASSERT(eng != NULL && j != NULL && cls != NULL && prio != NULL);
    *cls = BUDGET_CLASS_CREATE;
    *prio = BUDGET_PRIO_CHARGE;
    if (eng->op->budget_of)
        eng->op->budget_of(j->kind, cls, prio);
    CHARGED_ASSERT((unsigned)*cls < BUDGET_CLASS_COUNT &&
                   (unsigned)*prio < BUDGET_PRIO_COUNT);
}

static const char *endpoint_class(const engine_t *eng, const struct job *j)
{
    enum budget_class cls;
    enum budget_priority prio;
    budget_of(eng, j, &cls, &prio);
    return budget_class_name(cls);
}

/* A job has waited for the provider budget ENGINE_BUDGET_LONG_MS: its
 * record says so (waiting_reason provider_budget, written with the turn's
 * other waits by engine_write_waits), so that `chargectl attempt show` and
 * the status API read it as queued, not failed, until its call starts. */
static void engine_budget_waited_long(engine_t *eng, struct job *j, int64_t now)
{
    (void)eng;
    engine_core_wait_budget(j, now, clock_wall_ms());
    log_debug("waiting for the provider budget; queued, not failed", JOB_FIELDS(j),
              "class", budget_class_name(j->budget.t.cls), "priority",
              budget_priority_name(j->budget.t.prio), NULL);
}

/* Asks the budget's gate for j's call: 0, send; 1, it waits (parked for
 * the gate's wait, out of its slot). */
static int budget_waits(engine_t *eng, struct job *j, int64_t now)
{
    if (!j->budget.asked) {
        enum budget_class cls;
        enum budget_priority prio;
        budget_of(eng, j, &cls, &prio);
        budget_member_ask_init(&j->budget, cls, prio);
    }
    long long wait = budget_member_ask(eng->budget, &j->budget, now);
    if (engine_core_budget(eng->jobs, j, wait, now) != ENGINE_NEXT_PARKED)
        return 0;
    if (engine_core_budget_waited_long(j, now))
        engine_budget_waited_long(eng, j, now);
    return 1;
}

/* The breaker is not closed: no job asks the budget until it is (a call
 * asks only once the breaker allowed it), so no job keeps its place among
 * the gate's waiters, parked ones included (a parked job may not even come
 * back to ask while the calls the breaker holds take every slot). Kept,
 * those places count above the breaker's probe (priority charge, below a
 * refund's or a capture's): it then needs 1 + their tokens of a bucket
 * that holds one, is never sent, and the breaker never closes (adversary
 * 38b). A job asks again, from a new ticket, once the breaker lets it. */
static void forget_held(engine_t *eng)
{
    static const enum job_state held[] = {JOB_CALL, JOB_PARKED};
    for (size_t i = 0; i < sizeof(held) / sizeof(held[0]); i++)
        for (struct job *j = job_list_first(eng->jobs, held[i]); j;
             j = job_next_in_state(j))
            budget_member_forget(eng->budget, &j->budget);
    CHARGED_ASSERT(!eng->probe_out || !eng->probe_ask.t.waiting);
}

/* The budget's settings changed (an operator raised or lowered the
 * limits): the pace starts afresh, so that the fleet follows the new
 * limits within a refresh (issue 38: within 2 s each way). A pace cut by
 * 429s under the old limits (to 1/s at worst, then about +1/s a second)
 * kept a worker at 5-7 req/s for seconds after the budget and the
 * provider went from 2 to 100 (adversary 38b). A 429 under the new
 * limits cuts it again, as the first did. */
static void engine_follow_budget(engine_t *eng, int64_t now)
{
    long long v = budget_member_settings_raises(eng->budget);
    if (v == eng->budget_raises)
        return;
    char was[32];
    snprintf(was, sizeof(was), "%.1f", provider_pace_limit(&eng->pace));
    eng->budget_raises = v;
    if (provider_pace_restart(&eng->pace, now))
        log_info("provider budget settings changed; the pace starts afresh",
                 "pace_per_s_was", was, NULL);
    else
        log_info(
            "provider budget settings raised; the pace stays: the provider did not "
            "follow the last raise, or the one before is being judged",
            "pace_per_s", was, NULL);
}

void engine_start_calls(engine_t *eng)
{
    struct charged_error err;
    int64_t now = clock_now_ms(), wall = clock_wall_ms();
    engine_follow_budget(eng, now);
    eng->waits_paced = 0;
    for (struct job *j = job_list_first(eng->jobs, JOB_CALL), *next; j; j = next) {
        next = job_next_in_state(j);
        enum engine_next gate = engine_core_call_gate(&eng->core, eng->jobs, j, now);
        if (gate == ENGINE_NEXT_RELEASE || gate == ENGINE_NEXT_KEY_CLOSED)
            budget_member_forget(eng->budget, &j->budget);
        if (gate == ENGINE_NEXT_RELEASE)
            engine_release_lease(eng, j);
        if (gate == ENGINE_NEXT_KEY_CLOSED)
            log_warn("idempotency key may be forgotten by the provider; not sending",
                     JOB_FIELDS(j), NULL);
        if (gate != ENGINE_NEXT_SEND)
            continue;
        /* Over this process's pace (429s lowered it): every call waits,
         * in its slot, no try counted; the loop wakes when there is room.
         * Each due one is still walked, so that one held a second says
         * why on its record (docs/states.md, "Waiting"): it never asks the
         * budget nor gets a 429 of its own that would say it. */
        if (provider_pace_next_ms(&eng->pace, now) > now) {
            provider_pace_held(&eng->pace);
            eng->waits_paced += (size_t)engine_core_wait_paced(j, now, wall);
            continue;
        }
        /* Not closed: the job waits as it is, its lease renewed, no try
         * counted, until the breaker's own probes close it. It stops
         * asking the budget meanwhile, so its ticket goes (forget_held). */
        if (!provider_breaker_allow(eng->breaker, now, &j->ticket)) {
            budget_member_forget(eng->budget, &j->budget);
            continue;
        }
        /* The fleet's budget: over this process's share the job parks for
         * the gate's wait, its slot freed, as a throttled one does. */
        if (budget_waits(eng, j, now)) {
            provider_breaker_cancel(eng->breaker, &j->ticket);
            continue;
        }
        int paced = provider_pace_take(&eng->pace, now);
        CHARGED_ASSERT(paced); /* there was room a moment ago, at the same now */
        /* The claimed record's parameters, never the message's. */
        j->call_started_ms = clock_wall_ms();
        j->call_sent_ms = now;
        if (eng->op->start_call(eng->op_state, eng->provider, j->params, j->command, j,
                                &err) != CHARGED_OK) {
            provider_breaker_cancel(eng->breaker, &j->ticket);
            log_error("cannot start provider call", JOB_FIELDS(j), "error", err.message,
                      NULL);
            engine_core_call_not_started(&eng->core, j, now);
            continue;
        }
        engine_core_call_started(eng->jobs, j);
        engine_core_wait_ends(j); /* written by engine_write_waits */
        /* The call is out: its answer comes back through the client. */
        CHARGED_ASSERT(provider_client_in_flight(eng->provider) > 0);
    }
}

static void on_call_done(engine_t *eng, struct job *j)
{
    /* Only a job with a call out is answered. */
    CHARGED_ASSERT(j->state == JOB_CALLING || j->state == JOB_CALLING_FENCED);
    CHARGED_ASSERT(j->res.resent >= 0);
    char status[8];
    int64_t now = clock_now_ms();

    snprintf(status, sizeof(status), "%d", j->res.http_status);
    const char *op = op_name(eng, j);
    metrics_observe(METRIC_PROVIDER_DURATION, j->res.latency_ms / 1000.0, op);
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, op,
                provider_outcome_name(j->res.outcome));
    for (int i = 0; i < j->res.resent; i++) {
        /* curl re-sent the request itself after a pooled connection closed
         * unanswered: record that lost answer as a call of its own. */
        struct provider_result lost = provider_outcome_lost_answer();
        engine_log_call(eng, j, &lost);
        j->calls++;
    }
    /* ... and pay for every arrival: the gate let one request through. */
    enum budget_class cls;
    enum budget_priority prio;
    budget_of(eng, j, &cls, &prio);
    budget_member_charge(eng->budget, cls, prio, j->res.resent);
    engine_log_call(eng, j, &j->res);
    if (j->res.throttled)
        metrics_add(METRIC_PROVIDER_THROTTLED, 1, endpoint_class(eng, j));
    enum provider_breaker_answer answer = provider_breaker_classify(j->res.http_status);
    uint64_t opens = provider_breaker_opens(eng->breaker);
    int calls = 0, failures = 0;
    provider_breaker_window(eng->breaker, now, &calls, &failures);
    provider_breaker_record(eng->breaker, &j->ticket, answer, now);
    if (provider_breaker_opens(eng->breaker) != opens) {
        /* The window that opened it, this call included, for its log line. */
        eng->breaker_opened_calls = calls + 1;
        eng->breaker_opened_failures = failures + (answer != PROVIDER_BREAKER_SUCCESS);
    }
    if (answer != PROVIDER_BREAKER_SUCCESS)
        snprintf(eng->breaker_error, sizeof(eng->breaker_error), "%s",
                 j->res.error[0] ? j->res.error : status);
    int outage = 0;
    enum engine_next next = engine_core_answered(
        &eng->core, eng->jobs, j, answer == PROVIDER_BREAKER_FAILURE,
        provider_breaker_opens(eng->breaker) != opens, &outage, now);
    /* An answer paces (provider_pace.h): 429s that overrun the account's
     * rate while calls wait cut it, unless they are about objects that got
     * nothing else. Waiting: held back, parked, over capacity. */
    if (j->res.http_status != 0) {
        const struct pace_answer a = {
            .throttled = j->res.throttled,
            .object = provider_pace_object(
                eng->op->object_of ? eng->op->object_of(j->kind, j->params) : NULL),
            .sent_ms = j->call_sent_ms};
        provider_pace_answer(&eng->pace, &a,
                             job_list_count(eng->jobs, JOB_BACKLOG) +
                                 job_list_count(eng->jobs, JOB_CALL) +
                                 job_list_count(eng->jobs, JOB_PARKED),
                             now);
    }
    /* A run of 429s that keeps it ENGINE_BUDGET_LONG_MS is said on its
     * record (engine_write_waits); any other answer ends the run. */
    if (next != ENGINE_NEXT_FENCED)
        engine_core_wait_answered(j, next == ENGINE_NEXT_PARKED && j->res.throttled,
                                  next == ENGINE_NEXT_PARKED ? j->next_at - now : 0,
                                  now, clock_wall_ms());
    log_info("provider answered", JOB_FIELDS(j), "outcome",
             provider_outcome_name(j->res.outcome), "http_status", status, "replayed",
             j->res.replayed ? "true" : "false", "error",
             j->res.error[0] ? j->res.error : NULL, "outage", outage ? "true" : NULL,
             NULL);
#ifdef CHARGED_FAILPOINTS
    if (j->res.outcome == PROVIDER_SUCCEEDED) {
        /* after_charge, after_refund: the operation executed, nothing
         * persisted yet. */
        char point[48];
        snprintf(point, sizeof(point), "after_%s", op);
        FAILPOINT(point);
    }
#endif
    if (next == ENGINE_NEXT_FENCED) {
        log_warn("lease lost during the call; result left to the new owner",
                 JOB_FIELDS(j), NULL);
        return;
    }
    if (next == ENGINE_NEXT_SET_ASIDE) {
        char ms[32];
        snprintf(ms, sizeof(ms), "%lld", j->decision.next_check_ms);
        log_info("throttled by the provider; set aside for the reconciler",
                 JOB_FIELDS(j), "look_in_ms", ms, NULL);
    }
    if (next == ENGINE_NEXT_PARKED) {
        char ms[32], pace[32];
        snprintf(ms, sizeof(ms), "%lld", (long long)(j->next_at - now));
        snprintf(pace, sizeof(pace), "%.1f", provider_pace_limit(&eng->pace));
        log_info(j->res.throttled
                     ? "throttled by the provider; parked, slot freed"
                     : "idempotency key in use upstream; parked, slot freed",
                 JOB_FIELDS(j), "retry_in_ms", ms, "pace_per_s", pace, NULL);
    }
    if (j->res.outcome == PROVIDER_NOT_EXECUTED &&
        (j->res.http_status == 401 || j->res.http_status == 403 ||
         j->res.http_status == 404))
        log_error("the provider refused our credentials or URL; retrying",
                  JOB_FIELDS(j), "http_status", status, NULL);
    /* Detached, a retry is not ours: the next owner of the partition sends
     * again with the same key once our lease is gone. */
    if (next == ENGINE_NEXT_RELEASE)
        engine_release_lease(eng, j);
}

/* The probe's answer: any answer but 429 or 5xx (a 400 for the refused
 * request is the expected one) shows a charge endpoint that answers. */
static void probe_done(engine_t *eng, const struct provider_result *res)
{
    CHARGED_ASSERT(eng->probe_out); /* one probe at a time, and it was out */
    char status[16];
    int64_t now = clock_now_ms();
    enum provider_breaker_answer a = provider_breaker_classify(res->http_status);
    /* Half-open, a 429 is still nothing but 429s: the breaker counts it as
     * a failure (provider_breaker.h). */
    if (a == PROVIDER_BREAKER_THROTTLED)
        metrics_add(METRIC_PROVIDER_THROTTLED, 1, "create");
    snprintf(status, sizeof(status), "%d", res->http_status);
    eng->probe_out = 0;
    budget_member_charge(eng->budget, ENGINE_PROBE_CLASS, ENGINE_PROBE_PRIORITY,
                         res->resent);
    provider_breaker_record(eng->breaker, &eng->probe_ticket, a, now);
    if (a != PROVIDER_BREAKER_SUCCESS)
        snprintf(eng->breaker_error, sizeof(eng->breaker_error), "%s",
                 res->error[0] ? res->error : status);
    metrics_observe(METRIC_PROVIDER_DURATION, (double)res->latency_ms / 1000.0,
                    "probe");
    const char *what = a == PROVIDER_BREAKER_SUCCESS ? "answered" : "failure";
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, "probe", what);
    log_info("provider breaker probe answered", "http_status", status, "answer", what,
             "error",
             a != PROVIDER_BREAKER_SUCCESS && res->error[0] ? res->error : NULL, NULL);
}

void engine_collect_calls(engine_t *eng, int wait_ms)
{
    struct provider_result res;
    void *op;
    provider_client_perform(eng->provider, wait_ms);
    while (provider_client_next_done(eng->provider, &res, &op)) {
        if (op == &eng->probe_tag) {
            probe_done(eng, &res);
            continue;
        }
        struct job *j = op;
        CHARGED_ASSERT(j != NULL);
        j->res = res;
        on_call_done(eng, j);
    }
}

/* ---- the breaker ---- */

/* Asks the budget's gate for the probe: 0, send; 1, it waits (not sent
 * before probe_at). The breaker stays half-open until a probe answers. */
static int probe_waits(engine_t *eng, int64_t now)
{
    if (!eng->probe_ask.asked)
        budget_member_ask_init(&eng->probe_ask, ENGINE_PROBE_CLASS,
                               ENGINE_PROBE_PRIORITY);
    long long wait = budget_member_ask(eng->budget, &eng->probe_ask, now);
    CHARGED_ASSERT(wait >= 0);
    eng->probe_at = now + wait;
    return wait > 0;
}

/* Half-open and no probe out: asks the charge endpoint, with a request the
 * provider refuses before executing it, one probe at a time. It must test
 * what the worker needs: a probe that looked an intent up kept the breaker
 * open while charges worked and look-ups failed. A probe is a request like
 * any other: it waits for the fleet's budget. */
static void start_probe(engine_t *eng, int64_t now)
{
    struct charged_error err;
    if (eng->probe_out || now < eng->probe_at ||
        !provider_breaker_allow_probe(eng->breaker, now, &eng->probe_ticket))
        return;
    if (probe_waits(eng, now)) {
        provider_breaker_cancel(eng->breaker, &eng->probe_ticket);
        return;
    }
    if (provider_client_start_probe(eng->provider, &eng->probe_tag, &err) !=
        CHARGED_OK) {
        provider_breaker_cancel(eng->breaker, &eng->probe_ticket);
        log_error("cannot start the provider breaker's probe", "error", err.message,
                  NULL);
        return;
    }
    eng->probe_out = 1;
}

/* Acts on the breaker: logs each change of state, probes while half-open,
 * and keeps the assigned partitions paused while it is not closed. */
void engine_breaker_sync(engine_t *eng)
{
    char n[32], calls[32], ms[32], flying[32];
    int64_t now = clock_now_ms();
    enum provider_breaker_state st = provider_breaker_state(eng->breaker, now);
    uint64_t opens = provider_breaker_opens(eng->breaker);
    CHARGED_ASSERT(opens >= eng->breaker_opens); /* opens are counted, never undone */

    if (opens != eng->breaker_opens) {
        int first = eng->breaker_seen == PROVIDER_BREAKER_CLOSED;
        snprintf(n, sizeof(n), "%d", first ? eng->breaker_opened_failures : 1);
        snprintf(calls, sizeof(calls), "%d", first ? eng->breaker_opened_calls : 1);
        snprintf(ms, sizeof(ms), "%lld",
                 config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_OPEN_MS));
        snprintf(flying, sizeof(flying), "%zu",
                 provider_client_in_flight(eng->provider));
        log_warn(first ? "provider breaker opened: no new provider calls"
                       : "provider breaker opened again: a probe failed",
                 "breaker_state", "open", "failures", n, "calls", calls, "error",
                 eng->breaker_error, "open_ms", ms, "calls_in_flight", flying, NULL);
        /* Counted once an outage: a failed probe opening it again is the
         * same outage, not a new one (flapping is closed -> open again). */
        if (first)
            metrics_add(METRIC_BREAKER_OPENS, 1);
        eng->breaker_opens = opens;
        eng->breaker_seen = PROVIDER_BREAKER_OPEN;
    }
    if (st != eng->breaker_seen) {
        if (st == PROVIDER_BREAKER_HALF_OPEN) {
            snprintf(n, sizeof(n), "%lld",
                     config_int(eng->cfg, CONFIG_PROVIDER_BREAKER_PROBES));
            log_info("provider breaker half-open: probing the charge endpoint, one at "
                     "a time",
                     "breaker_state", "half_open", "probes", n, NULL);
        } else if (st == PROVIDER_BREAKER_CLOSED) {
            log_info("provider breaker closed: the provider answers again",
                     "breaker_state", "closed", NULL);
        }
        eng->breaker_seen = st;
    }
    /* The gauge is the state as of this turn. */
    metrics_set(METRIC_BREAKER_STATE, (double)st);
    if (st != PROVIDER_BREAKER_CLOSED)
        forget_held(eng);
    else /* no probe asks while closed: its ticket, if any, is stale */
        budget_member_forget(eng->budget, &eng->probe_ask);
    if (st == PROVIDER_BREAKER_HALF_OPEN)
        start_probe(eng, now);
    engine_paused_lag(eng, now);
    int pause = st != PROVIDER_BREAKER_CLOSED;
    if (pause != eng->paused)
        engine_set_paused(eng, pause);
}
