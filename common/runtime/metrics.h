/* metrics: the process's Prometheus metrics, in one registry.
 *
 * Every family is a row of one table (metrics.c): name, type, help, label
 * names (0 to 2) and, for histograms, bucket bounds. A role changes a series
 * by its family's key and one label value per label name, in the table's
 * order:
 *
 *   metrics_add(METRIC_MESSAGES, 1, "settled");
 *   metrics_observe(METRIC_PROVIDER_DURATION, 0.042, "charge");
 *
 * A series exists from its first change on; a family nobody changed renders
 * its HELP and TYPE lines only. Label values are bounded, enumerable words
 * (a status, an operation, a partition number): never an attempt or order
 * id, never a secret. Every function is safe from any thread: the admin
 * listener renders while the loop updates. */
#ifndef CHARGED_METRICS_H
#define CHARGED_METRICS_H

#include <stddef.h>

/* Keys of the table in metrics.c; docs/operations.md lists every family. */
enum metric_key {
    METRIC_MESSAGES,                  /* charged_messages_total{outcome} */
    METRIC_ATTEMPTS,                  /* charged_attempts_processed_total{status} */
    METRIC_REFUNDS,                   /* charged_refunds_processed_total{status} */
    METRIC_PROVIDER_DURATION,         /* charged_provider_request_duration_seconds
                                         {operation}, histogram */
    METRIC_PROVIDER_RESPONSES,        /* charged_provider_responses_total
                                         {operation,class} */
    METRIC_PROVIDER_IN_FLIGHT,        /* charged_provider_calls_in_flight */
    METRIC_CONSUMER_LAG,              /* charged_consumer_lag_messages
                                         {topic,partition} */
    METRIC_DEAD_LETTERS,              /* charged_dead_letters_total{reason} */
    METRIC_REBALANCES,                /* charged_rebalances_total{kind} */
    METRIC_RECONCILER_BACKLOG,        /* charged_reconciler_backlog_attempts{status} */
    METRIC_RECONCILER_OLDEST,         /* charged_reconciler_oldest_attempt_age_seconds
                                         {status} */
    METRIC_RECONCILER_SETTLEMENTS,    /* charged_reconciler_settlements_total{status} */
    METRIC_OUTBOX_BACKLOG,            /* charged_outbox_backlog_events */
    METRIC_OUTBOX_OLDEST,             /* charged_outbox_oldest_event_age_seconds */
    METRIC_OUTBOX_PUBLISHED,          /* charged_outbox_published_total */
    METRIC_OUTBOX_FAILURES,           /* charged_outbox_publish_failures_total */
    METRIC_WEBHOOKS,                  /* charged_webhook_deliveries_total{result} */
    METRIC_BREAKER_STATE,             /* charged_provider_breaker_state */
    METRIC_BREAKER_OPENS,             /* charged_provider_breaker_opens_total */
    METRIC_READY,                     /* charged_ready */
    METRIC_DATABASE_FAILURES,         /* charged_database_failures_total{stage} */
    METRIC_RECONCILER_REFUND_BACKLOG, /* charged_reconciler_backlog_refunds{status} */
    METRIC_RECONCILER_REFUND_OLDEST,  /* charged_reconciler_oldest_refund_age_seconds
                                         {status} */
    METRIC_RECONCILER_REFUND_SETTLEMENTS, /* charged_reconciler_refund_settlements_total
                                             {status} */
    METRIC_AUDIT_FINDINGS,                /* charged_audit_findings_total{kind} */
    METRIC_AUDIT_OBJECTS,                 /* charged_audit_objects_total{object} */
    METRIC_AUDIT_WINDOWS,                 /* charged_audit_windows_total */
    METRIC_AUDIT_WATERMARK_AGE,           /* charged_audit_watermark_age_seconds */
    METRIC_AUDIT_PENDING,                 /* charged_audit_pending_objects */
    METRIC_CAPTURES,                      /* charged_captures_processed_total{status} */
    METRIC_RECONCILER_CAPTURE_BACKLOG, /* charged_reconciler_backlog_captures{status} */
    METRIC_RECONCILER_CAPTURE_OLDEST,  /* charged_reconciler_oldest_capture_age_seconds
                                          {status} */
    METRIC_RECONCILER_CAPTURE_SETTLEMENTS, /* charged_reconciler_capture_settlements_total
                                              {status} */
    METRIC_RECONCILER_VOID_BACKLOG, /* charged_reconciler_backlog_voids{status} */
    METRIC_RECONCILER_VOID_OLDEST, /* charged_reconciler_oldest_void_age_seconds{status}
                                    */
    METRIC_RECONCILER_VOID_SETTLEMENTS, /* charged_reconciler_void_settlements_total
                                           {status} */
    METRIC_VOIDS,                       /* charged_voids_processed_total{status} */
    METRIC_PROVIDER_THROTTLED,          /* charged_provider_throttled_total{class} */
    METRIC_PROVIDER_BUDGET,             /* charged_provider_budget{class,kind} */
    METRIC_PROVIDER_BUDGET_WAIT, /* charged_provider_budget_wait_seconds{priority},
                                    histogram */
    METRIC__COUNT
};

/* Counter: adds v (>= 0; a negative v is ignored). Then one
 * `const char *` label value per label name of the family. */
void metrics_add(enum metric_key k, double v, ...);
/* Gauge: sets the series to v. */
void metrics_set(enum metric_key k, double v, ...);
/* Histogram: counts one observation of v. */
void metrics_observe(enum metric_key k, double v, ...);
/* Drops every series of the family (a gauge whose label set went away, as
 * the lag of revoked partitions). */
void metrics_forget(enum metric_key k);

/* The registry in the Prometheus text format 0.0.4, as a malloc'd string
 * (the caller frees it) of *len bytes, NUL-terminated. 0, or -1 when out of
 * memory (then *out is NULL). */
int metrics_render(char **out, size_t *len);

/* The family's metric name, e.g. "charged_messages_total". */
const char *metrics_name(enum metric_key k);

/* Drops every series of every family (tests). */
void metrics_reset(void);

#endif
