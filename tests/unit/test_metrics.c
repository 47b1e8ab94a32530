/* Unit tests of common/runtime/metrics: the Prometheus text format 0.0.4 as
 * rendered (HELP/TYPE of every family, escaping, histograms cumulative with
 * +Inf, _sum and _count), and updates from several threads at once. */
#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"
#include "test_env.h"

static char *render(void)
{
    char *text = NULL;
    size_t len = 0;
    ck_assert_int_eq(metrics_render(&text, &len), 0);
    ck_assert_ptr_nonnull(text);
    ck_assert_uint_eq(strlen(text), len);
    return text;
}

/* The line of the exposition that starts with `prefix` followed by a space,
 * its value parsed; fails the test when there is none. */
static double value_of(const char *text, const char *series)
{
    size_t n = strlen(series);
    for (const char *p = text; p && *p;
         p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, series, n) && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    ck_abort_msg("no line for %s in:\n%s", series, text);
    return 0;
}

static int has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; p && *p;
         p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, line, n) && (p[n] == '\n' || p[n] == '\0'))
            return 1;
    return 0;
}

START_TEST(every_family_has_help_and_type_and_no_series_until_changed)
{
    static const char *const names[] = {
        "charged_messages_total",
        "charged_attempts_processed_total",
        "charged_refunds_processed_total",
        "charged_provider_request_duration_seconds",
        "charged_provider_responses_total",
        "charged_provider_calls_in_flight",
        "charged_consumer_lag_messages",
        "charged_dead_letters_total",
        "charged_rebalances_total",
        "charged_reconciler_backlog_attempts",
        "charged_reconciler_oldest_attempt_age_seconds",
        "charged_reconciler_settlements_total",
        "charged_outbox_backlog_events",
        "charged_outbox_oldest_event_age_seconds",
        "charged_outbox_published_total",
        "charged_outbox_publish_failures_total",
        "charged_webhook_deliveries_total",
        "charged_provider_breaker_state",
        "charged_provider_breaker_opens_total",
        "charged_ready",
        "charged_database_failures_total",
        "charged_reconciler_backlog_refunds",
        "charged_reconciler_oldest_refund_age_seconds",
        "charged_reconciler_refund_settlements_total",
        "charged_audit_findings_total",
        "charged_audit_objects_total",
        "charged_audit_windows_total",
        "charged_audit_watermark_age_seconds",
        "charged_audit_pending_objects",
        "charged_captures_processed_total",
        "charged_reconciler_backlog_captures",
        "charged_reconciler_oldest_capture_age_seconds",
        "charged_reconciler_capture_settlements_total",
        "charged_reconciler_backlog_voids",
        "charged_reconciler_oldest_void_age_seconds",
        "charged_reconciler_void_settlements_total",
        "charged_voids_processed_total",
        "charged_provider_throttled_total",
        "charged_provider_budget",
        "charged_provider_budget_wait_seconds",
    };
    metrics_reset();
    ck_assert_uint_eq(sizeof(names) / sizeof(names[0]), METRIC__COUNT);
    char *text = render();
    for (int k = 0; k < METRIC__COUNT; k++) {
        char line[200];
        ck_assert_str_eq(metrics_name((enum metric_key)k), names[k]);
        snprintf(line, sizeof(line), "# HELP %s ", names[k]);
        ck_assert_msg(strstr(text, line), "no HELP for %s", names[k]);
        snprintf(line, sizeof(line), "# TYPE %s %s", names[k],
                 k == METRIC_PROVIDER_DURATION || k == METRIC_PROVIDER_BUDGET_WAIT
                     ? "histogram"
                 : strstr(names[k], "_total") ? "counter"
                                              : "gauge");
        ck_assert_msg(has_line(text, line), "want '%s' in:\n%s", line, text);
    }
    /* Nothing but comment lines. */
    for (const char *p = text; *p; p = strchr(p, '\n') + 1)
        ck_assert_msg(*p == '#', "a series before any change: %.60s", p);
    free(text);
}
END_TEST

START_TEST(counters_add_and_never_go_down)
{
    metrics_reset();
    metrics_add(METRIC_MESSAGES, 1, "settled");
    metrics_add(METRIC_MESSAGES, 2, "settled");
    metrics_add(METRIC_MESSAGES, 1, "rejected");
    metrics_add(METRIC_MESSAGES, -5, "settled");
    metrics_add(METRIC_OUTBOX_PUBLISHED, 500);
    metrics_add(METRIC_PROVIDER_RESPONSES, 1, "charge", "succeeded");
    char *text = render();
    ck_assert(has_line(text, "charged_messages_total{outcome=\"settled\"} 3"));
    ck_assert(has_line(text, "charged_messages_total{outcome=\"rejected\"} 1"));
    ck_assert(has_line(text, "charged_outbox_published_total 500"));
    ck_assert(has_line(text, "charged_provider_responses_total{operation=\"charge\","
                             "class=\"succeeded\"} 1"));
    free(text);
}
END_TEST

START_TEST(gauges_set_and_forget)
{
    metrics_reset();
    metrics_set(METRIC_CONSUMER_LAG, 7, "commands", "0");
    metrics_set(METRIC_CONSUMER_LAG, 3, "commands", "0");
    metrics_set(METRIC_CONSUMER_LAG, 12, "commands", "11");
    metrics_set(METRIC_PROVIDER_IN_FLIGHT, 4);
    metrics_set(METRIC_OUTBOX_OLDEST, 0.25);
    char *text = render();
    ck_assert(has_line(
        text, "charged_consumer_lag_messages{topic=\"commands\",partition=\"0\"} 3"));
    ck_assert(has_line(
        text, "charged_consumer_lag_messages{topic=\"commands\",partition=\"11\"} 12"));
    ck_assert(has_line(text, "charged_provider_calls_in_flight 4"));
    ck_assert(has_line(text, "charged_outbox_oldest_event_age_seconds 0.25"));
    free(text);
    metrics_forget(METRIC_CONSUMER_LAG);
    text = render();
    ck_assert_ptr_null(strstr(text, "charged_consumer_lag_messages{"));
    ck_assert(has_line(text, "charged_provider_calls_in_flight 4"));
    free(text);
}
END_TEST

START_TEST(label_values_are_escaped)
{
    metrics_reset();
    metrics_add(METRIC_DEAD_LETTERS, 1, "a\"b\\c\nd");
    metrics_add(METRIC_DEAD_LETTERS, 1, NULL);
    char *text = render();
    ck_assert_msg(
        has_line(text, "charged_dead_letters_total{reason=\"a\\\"b\\\\c\\nd\"} 1"),
        "%s", text);
    ck_assert(has_line(text, "charged_dead_letters_total{reason=\"\"} 1"));
    free(text);
}
END_TEST

START_TEST(label_values_are_utf8_and_bounded)
{
    char longv[400];
    metrics_reset();
    metrics_add(METRIC_REBALANCES, 1, "caf\xc3\xa9 \xff!");
    memset(longv, 'x', sizeof(longv) - 1);
    longv[sizeof(longv) - 1] = '\0';
    metrics_add(METRIC_REBALANCES, 1, longv);
    metrics_add(METRIC_REBALANCES, 1, longv); /* the same series again */
    char *text = render();
    ck_assert(has_line(text, "charged_rebalances_total{kind=\"caf\xc3\xa9 ?!\"} 1"));
    char want[300];
    snprintf(want, sizeof(want), "charged_rebalances_total{kind=\"%.128s\"} 2", longv);
    ck_assert_msg(has_line(text, want), "%s", text);
    free(text);
}
END_TEST

START_TEST(numbers_are_written_as_prometheus_reads_them)
{
    metrics_reset();
    metrics_set(METRIC_RECONCILER_BACKLOG, 0.1, "UNKNOWN");
    metrics_set(METRIC_RECONCILER_BACKLOG, 1e21, "PROCESSING");
    metrics_set(METRIC_RECONCILER_OLDEST, 1.0 / 0.0, "UNKNOWN");
    metrics_set(METRIC_RECONCILER_OLDEST, 0.0 / 0.0, "PROCESSING");
    metrics_set(METRIC_BREAKER_STATE, 2);
    metrics_set(METRIC_OUTBOX_BACKLOG, 123456789012.0);
    char *text = render();
    ck_assert(
        has_line(text, "charged_reconciler_backlog_attempts{status=\"UNKNOWN\"} 0.1"));
    ck_assert(has_line(
        text, "charged_reconciler_backlog_attempts{status=\"PROCESSING\"} 1e+21"));
    ck_assert(has_line(
        text,
        "charged_reconciler_oldest_attempt_age_seconds{status=\"UNKNOWN\"} +Inf"));
    ck_assert(has_line(
        text,
        "charged_reconciler_oldest_attempt_age_seconds{status=\"PROCESSING\"} NaN"));
    ck_assert(has_line(text, "charged_provider_breaker_state 2"));
    ck_assert(has_line(text, "charged_outbox_backlog_events 123456789012"));
    free(text);
}
END_TEST

START_TEST(histograms_are_cumulative_with_inf_sum_and_count)
{
    static const struct {
        const char *le;
        double want;
    } buckets[] = {{"0.005", 1}, {"0.01", 1}, {"0.025", 3}, {"0.05", 3}, {"0.1", 3},
                   {"0.25", 3},  {"0.5", 3},  {"1", 3},     {"2.5", 3},  {"5", 4},
                   {"10", 5},    {"30", 5},   {"60", 5},    {"+Inf", 6}};
    metrics_reset();
    metrics_observe(METRIC_PROVIDER_DURATION, 0.003, "charge");
    metrics_observe(METRIC_PROVIDER_DURATION, 0.02, "charge");
    metrics_observe(METRIC_PROVIDER_DURATION, 0.025, "charge"); /* on a bound: le */
    metrics_observe(METRIC_PROVIDER_DURATION, 5, "charge");
    metrics_observe(METRIC_PROVIDER_DURATION, 7, "charge");
    metrics_observe(METRIC_PROVIDER_DURATION, 100, "charge");
    metrics_observe(METRIC_PROVIDER_DURATION, 0.5, "search");
    char *text = render();
    for (size_t i = 0; i < sizeof(buckets) / sizeof(buckets[0]); i++) {
        char series[160];
        snprintf(
            series, sizeof(series),
            "charged_provider_request_duration_seconds_bucket{operation=\"charge\","
            "le=\"%s\"}",
            buckets[i].le);
        ck_assert_msg(value_of(text, series) == buckets[i].want, "%s: want %g\n%s",
                      series, buckets[i].want, text);
    }
    ck_assert_double_eq_tol(
        value_of(text,
                 "charged_provider_request_duration_seconds_sum{operation=\"charge\"}"),
        112.048, 1e-9);
    ck_assert(has_line(
        text,
        "charged_provider_request_duration_seconds_count{operation=\"charge\"} 6"));
    ck_assert(has_line(text,
                       "charged_provider_request_duration_seconds_bucket{operation="
                       "\"search\",le=\"0.25\"} 0"));
    ck_assert(has_line(text,
                       "charged_provider_request_duration_seconds_bucket{operation="
                       "\"search\",le=\"0.5\"} 1"));
    ck_assert(has_line(
        text,
        "charged_provider_request_duration_seconds_count{operation=\"search\"} 1"));
    /* _bucket lines come first, then _sum, then _count. */
    const char *inf = strstr(text, "le=\"+Inf\"");
    const char *sum = strstr(text, "_sum{operation=\"charge\"}");
    const char *count = strstr(text, "_count{operation=\"charge\"}");
    ck_assert(inf && sum && count && inf < sum && sum < count);
    free(text);
}
END_TEST

#define THREADS 4
#define ADDS    20000

static void *adder(void *arg)
{
    const char *label = arg;
    for (int i = 0; i < ADDS; i++) {
        metrics_add(METRIC_ATTEMPTS, 1, label);
        metrics_observe(METRIC_PROVIDER_DURATION, 0.01, "charge");
        if (i % 1000 == 0)
            metrics_forget(METRIC_CONSUMER_LAG);
        metrics_set(METRIC_CONSUMER_LAG, i, "t", label);
    }
    return NULL;
}

static volatile int stop_rendering;

static void *renderer(void *arg)
{
    int *renders = arg;
    while (!stop_rendering) {
        char *text = NULL;
        size_t len;
        ck_assert_int_eq(metrics_render(&text, &len), 0);
        free(text);
        (*renders)++;
    }
    return NULL;
}

START_TEST(updates_from_many_threads_while_rendering)
{
    static const char *labels[THREADS] = {"SUCCEEDED", "FAILED", "UNKNOWN",
                                          "SUCCEEDED"};
    pthread_t t[THREADS], r;
    int renders = 0;
    metrics_reset();
    stop_rendering = 0;
    ck_assert_int_eq(pthread_create(&r, NULL, renderer, &renders), 0);
    for (int i = 0; i < THREADS; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, adder, (void *)labels[i]), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    stop_rendering = 1;
    pthread_join(r, NULL);
    ck_assert_int_gt(renders, 0);
    char *text = render();
    ck_assert_double_eq(
        value_of(text, "charged_attempts_processed_total{status=\"SUCCEEDED\"}"),
        2 * ADDS);
    ck_assert_double_eq(
        value_of(text, "charged_attempts_processed_total{status=\"FAILED\"}"), ADDS);
    ck_assert_double_eq(
        value_of(
            text,
            "charged_provider_request_duration_seconds_count{operation=\"charge\"}"),
        THREADS * ADDS);
    free(text);
    metrics_reset();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_family_has_help_and_type_and_no_series_until_changed);
    tcase_add_test(tc, counters_add_and_never_go_down);
    tcase_add_test(tc, gauges_set_and_forget);
    tcase_add_test(tc, label_values_are_escaped);
    tcase_add_test(tc, label_values_are_utf8_and_bounded);
    tcase_add_test(tc, numbers_are_written_as_prometheus_reads_them);
    tcase_add_test(tc, histograms_are_cumulative_with_inf_sum_and_count);
    tcase_add_test(tc, updates_from_many_threads_while_rendering);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
