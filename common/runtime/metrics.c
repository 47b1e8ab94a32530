#include "metrics.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "utf8_text.h"

enum metric_type { METRIC_COUNTER, METRIC_GAUGE, METRIC_HISTOGRAM };

#define MAX_LABELS 2
/* Series kept per family at most, and label value length: label values are
 * meant to be few and short; past these a bug must not eat the memory. */
#define MAX_SERIES      4096
#define MAX_LABEL_VALUE 128

struct metric_family {
    const char *name;
    enum metric_type type;
    const char *help;
    const char *labels[MAX_LABELS]; /* NULL-terminated when fewer */
    const double *buckets;          /* histograms: upper bounds, ascending */
    size_t nbuckets;
};

/* Seconds, from a fast local answer to the provider timeout's maximum. */
static const double provider_buckets[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                          1,     2.5,  5,     10,   30,  60};

/* Seconds a request waited for the provider budget: none (most, with no
 * limit), a fraction of a refresh, a few leases. */
static const double budget_wait_buckets[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,   1,    2.5,   5,    10};

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* The one table. Base units, counters end in _total. */
static const struct metric_family families[METRIC__COUNT] = {
    [METRIC_MESSAGES] = {"charged_messages_total",
                         METRIC_COUNTER,
                         "Charge commands consumed, by what became of them.",
                         {"outcome"}},
    [METRIC_ATTEMPTS] = {"charged_attempts_processed_total",
                         METRIC_COUNTER,
                         "Payment attempts whose outcome this worker persisted, by the "
                         "status persisted.",
                         {"status"}},
    [METRIC_REFUNDS] = {"charged_refunds_processed_total",
                        METRIC_COUNTER,
                        "Refund attempts whose outcome this worker persisted (or "
                        "rejected before any provider call), by that status.",
                        {"status"}},
    [METRIC_PROVIDER_DURATION] = {"charged_provider_request_duration_seconds",
                                  METRIC_HISTOGRAM,
                                  "Duration of provider requests that ended, answered "
                                  "or not.",
                                  {"operation"},
                                  provider_buckets,
                                  N(provider_buckets)},
    [METRIC_PROVIDER_RESPONSES] = {"charged_provider_responses_total",
                                   METRIC_COUNTER,
                                   "Provider requests that ended, by operation and by "
                                   "what the answer means (the outcome class).",
                                   {"operation", "class"}},
    [METRIC_PROVIDER_IN_FLIGHT] = {"charged_provider_calls_in_flight",
                                   METRIC_GAUGE,
                                   "Provider requests sent and not yet ended.",
                                   {NULL}},
    [METRIC_CONSUMER_LAG] = {"charged_consumer_lag_messages",
                             METRIC_GAUGE,
                             "Messages of an assigned partition after the group's "
                             "committed offset, from librdkafka's statistics.",
                             {"topic", "partition"}},
    [METRIC_DEAD_LETTERS] = {"charged_dead_letters_total",
                             METRIC_COUNTER,
                             "Dead letters acknowledged by the broker, by reason code.",
                             {"reason"}},
    [METRIC_REBALANCES] = {"charged_rebalances_total",
                           METRIC_COUNTER,
                           "Consumer group rebalances seen: assign, revoke, lost.",
                           {"kind"}},
    [METRIC_RECONCILER_BACKLOG] = {"charged_reconciler_backlog_attempts",
                                   METRIC_GAUGE,
                                   "Attempts in a status the reconciler settles, "
                                   "counted in the database.",
                                   {"status"}},
    [METRIC_RECONCILER_OLDEST] =
        {"charged_reconciler_oldest_attempt_age_seconds",
         METRIC_GAUGE,
         "Age since it was recorded of the oldest attempt in a "
         "status the reconciler settles; 0 when none.",
         {"status"}},
    [METRIC_RECONCILER_SETTLEMENTS] =
        {"charged_reconciler_settlements_total",
         METRIC_COUNTER,
         "Attempts this reconciler moved to a new status, "
         "by that status.",
         {"status"}},
    [METRIC_OUTBOX_BACKLOG] = {"charged_outbox_backlog_events",
                               METRIC_GAUGE,
                               "Result events in the outbox not yet published (the "
                               "leading relay counts them).",
                               {NULL}},
    [METRIC_OUTBOX_OLDEST] = {"charged_outbox_oldest_event_age_seconds",
                              METRIC_GAUGE,
                              "Age of the oldest unpublished result event; 0 when "
                              "none.",
                              {NULL}},
    [METRIC_OUTBOX_PUBLISHED] = {"charged_outbox_published_total",
                                 METRIC_COUNTER,
                                 "Result events acknowledged by the broker and marked "
                                 "published by this relay.",
                                 {NULL}},
    [METRIC_OUTBOX_FAILURES] = {"charged_outbox_publish_failures_total",
                                METRIC_COUNTER,
                                "Result events the broker refused, or did not "
                                "acknowledge in time, while others were published: "
                                "each waits, with the later events of its attempt.",
                                {NULL}},
    [METRIC_WEBHOOKS] = {"charged_webhook_deliveries_total",
                         METRIC_COUNTER,
                         "Provider webhook deliveries answered, by result.",
                         {"result"}},
    [METRIC_BREAKER_STATE] =
        {"charged_provider_breaker_state",
         METRIC_GAUGE,
         "Provider circuit breaker: 0 closed, 1 half-open, 2 open.",
         {NULL}},
    [METRIC_BREAKER_OPENS] = {"charged_provider_breaker_opens_total",
                              METRIC_COUNTER,
                              "Times the provider circuit breaker opened.",
                              {NULL}},
    [METRIC_READY] = {"charged_ready",
                      METRIC_GAUGE,
                      "1 when /readyz answers 200, else 0.",
                      {NULL}},
    [METRIC_DATABASE_FAILURES] = {"charged_database_failures_total",
                                  METRIC_COUNTER,
                                  "Database steps that failed and were retried after a "
                                  "back-off, by step.",
                                  {"stage"}},
    [METRIC_RECONCILER_REFUND_BACKLOG] = {"charged_reconciler_backlog_refunds",
                                          METRIC_GAUGE,
                                          "Refund attempts in a status the reconciler "
                                          "settles, counted in the database.",
                                          {"status"}},
    [METRIC_RECONCILER_REFUND_OLDEST] =
        {"charged_reconciler_oldest_refund_age_seconds",
         METRIC_GAUGE,
         "Age since it was recorded of the oldest refund attempt in a "
         "status the reconciler settles; 0 when none.",
         {"status"}},
    [METRIC_RECONCILER_REFUND_SETTLEMENTS] =
        {"charged_reconciler_refund_settlements_total",
         METRIC_COUNTER,
         "Refund attempts this reconciler moved to a new status, "
         "by that status.",
         {"status"}},
    [METRIC_AUDIT_FINDINGS] = {"charged_audit_findings_total",
                               METRIC_COUNTER,
                               "Findings recorded by any audit (chargectl audit run "
                               "too), by kind, as the table holds them: it only grows; "
                               "the leading auditor reports it. charged_twice and "
                               "charged_unbooked page.",
                               {"kind"}},
    [METRIC_AUDIT_OBJECTS] = {"charged_audit_objects_total",
                              METRIC_COUNTER,
                              "Provider objects (intent, refund) and ledger rows "
                              "(ledger_row) this auditor matched.",
                              {"object"}},
    [METRIC_AUDIT_WINDOWS] = {"charged_audit_windows_total",
                              METRIC_COUNTER,
                              "Scheduled windows this auditor audited and recorded.",
                              {NULL}},
    [METRIC_AUDIT_WATERMARK_AGE] = {"charged_audit_watermark_age_seconds",
                                    METRIC_GAUGE,
                                    "Age of the watermark: everything the provider "
                                    "made before it is audited (the leading auditor "
                                    "reports it).",
                                    {NULL}},
    [METRIC_AUDIT_PENDING] = {"charged_audit_pending_objects",
                              METRIC_GAUGE,
                              "Provider objects the auditor cannot judge yet (their "
                              "attempt or the object itself is unsettled).",
                              {NULL}},
    [METRIC_CAPTURES] = {"charged_captures_processed_total",
                         METRIC_COUNTER,
                         "Capture attempts whose outcome this worker persisted (or "
                         "rejected before any provider call), by that status.",
                         {"status"}},
    [METRIC_RECONCILER_CAPTURE_BACKLOG] = {"charged_reconciler_backlog_captures",
                                           METRIC_GAUGE,
                                           "Capture attempts in a status the "
                                           "reconciler settles, counted in the "
                                           "database.",
                                           {"status"}},
    [METRIC_RECONCILER_CAPTURE_OLDEST] =
        {"charged_reconciler_oldest_capture_age_seconds",
         METRIC_GAUGE,
         "Age since it was recorded of the oldest capture attempt in a "
         "status the reconciler settles; 0 when none.",
         {"status"}},
    [METRIC_RECONCILER_CAPTURE_SETTLEMENTS] =
        {"charged_reconciler_capture_settlements_total",
         METRIC_COUNTER,
         "Capture attempts this reconciler moved to a new status, "
         "by that status.",
         {"status"}},
    [METRIC_RECONCILER_VOID_BACKLOG] = {"charged_reconciler_backlog_voids",
                                        METRIC_GAUGE,
                                        "Void attempts in a status the reconciler "
                                        "settles, counted in the database.",
                                        {"status"}},
    [METRIC_RECONCILER_VOID_OLDEST] = {"charged_reconciler_oldest_void_age_seconds",
                                       METRIC_GAUGE,
                                       "Age since it was recorded of the oldest void "
                                       "attempt in a status the reconciler settles; 0 "
                                       "when none.",
                                       {"status"}},
    [METRIC_RECONCILER_VOID_SETTLEMENTS] =
        {"charged_reconciler_void_settlements_total",
         METRIC_COUNTER,
         "Void attempts this reconciler moved to a new "
         "status, by that status.",
         {"status"}},
    [METRIC_VOIDS] = {"charged_voids_processed_total",
                      METRIC_COUNTER,
                      "Void attempts whose outcome this worker persisted (or rejected "
                      "before any provider call), by that status.",
                      {"status"}},
    [METRIC_PROVIDER_THROTTLED] = {"charged_provider_throttled_total",
                                   METRIC_COUNTER,
                                   "Provider requests answered 429 (over the rate "
                                   "limit, not executed), by endpoint class.",
                                   {"class"}},
    [METRIC_PROVIDER_BUDGET] =
        {"charged_provider_budget",
         METRIC_GAUGE,
         "The fleet's provider budget as this process last "
         "refreshed it, in requests/s, by endpoint class (global: "
         "the account's): its limit, and the share this process "
         "holds; -1: no limit.",
         {"class", "kind"}},
    [METRIC_PROVIDER_BUDGET_WAIT] = {"charged_provider_budget_wait_seconds",
                                     METRIC_HISTOGRAM,
                                     "How long provider requests waited for the budget "
                                     "before they were sent, by priority.",
                                     {"priority"},
                                     budget_wait_buckets,
                                     N(budget_wait_buckets)},
};

struct series {
    char *values[MAX_LABELS];
    double value;      /* counter, gauge; histogram: the sum */
    uint64_t count;    /* histogram */
    uint64_t *buckets; /* histogram: per bucket, not cumulative */
};

struct family_state {
    struct series *s;
    size_t n, cap;
    int overflow_logged;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct family_state state[METRIC__COUNT];

static size_t nlabels(const struct metric_family *f)
{
    size_t n = 0;
    while (n < MAX_LABELS && f->labels[n])
        n++;
    return n;
}

static void series_release(struct series *s)
{
    for (size_t i = 0; i < MAX_LABELS; i++)
        free(s->values[i]);
    free(s->buckets);
}

/* A label value as exposed: at most MAX_LABEL_VALUE bytes, cut on a
 * character boundary, invalid UTF-8 replaced by '?' (the format requires
 * UTF-8; escaping is left to rendering). */
static void label_value(char *dst, const char *src)
{
    size_t o = 0, n = strlen(src);
    for (size_t i = 0; i < n;) {
        size_t l = utf8_text_seq_len((const unsigned char *)src + i, n - i);
        if (l == 0) {
            if (o + 1 > MAX_LABEL_VALUE)
                break;
            dst[o++] = '?';
            i++;
            continue;
        }
        if (o + l > MAX_LABEL_VALUE)
            break;
        memcpy(dst + o, src + i, l);
        o += l;
        i += l;
    }
    dst[o] = '\0';
}

/* The series of these label values, created when new; NULL when out of
 * memory or over MAX_SERIES. Called with the lock held. */
static struct series *find(enum metric_key k, const char *const *values)
{
    const struct metric_family *f = &families[k];
    struct family_state *fs = &state[k];
    size_t nl = nlabels(f);

    for (size_t i = 0; i < fs->n; i++) {
        size_t l = 0;
        while (l < nl && !strcmp(fs->s[i].values[l], values[l]))
            l++;
        if (l == nl)
            return &fs->s[i];
    }
    if (fs->n >= MAX_SERIES) {
        if (!fs->overflow_logged)
            log_error("bug: too many series in a metric family; new ones dropped",
                      "metric", f->name, NULL);
        fs->overflow_logged = 1;
        return NULL;
    }
    if (fs->n == fs->cap) {
        size_t ncap = fs->cap ? fs->cap * 2 : 8;
        struct series *ns = realloc(fs->s, ncap * sizeof(*ns));
        if (!ns)
            return NULL;
        fs->s = ns;
        fs->cap = ncap;
    }
    struct series s = {0};
    for (size_t l = 0; l < nl; l++)
        if (!(s.values[l] = strdup(values[l])))
            goto oom;
    if (f->type == METRIC_HISTOGRAM &&
        !(s.buckets = calloc(f->nbuckets, sizeof(uint64_t))))
        goto oom;
    fs->s[fs->n] = s;
    return &fs->s[fs->n++];
oom:
    series_release(&s);
    return NULL;
}

enum op { OP_ADD, OP_SET, OP_OBSERVE };

static void update(enum metric_key k, enum op op, double v, va_list ap)
{
    char vbuf[MAX_LABELS][MAX_LABEL_VALUE + 1];
    const char *values[MAX_LABELS] = {0};
    if ((unsigned)k >= METRIC__COUNT)
        return;
    const struct metric_family *f = &families[k];
    size_t nl = nlabels(f);
    for (size_t l = 0; l < nl; l++) {
        const char *v = va_arg(ap, const char *);
        label_value(vbuf[l], v ? v : "");
        values[l] = vbuf[l];
    }
    if (op == OP_ADD && !(v >= 0))
        return; /* counters only go up */
    pthread_mutex_lock(&lock);
    struct series *s = find(k, values);
    if (s) {
        if (op == OP_ADD) {
            s->value += v;
        } else if (op == OP_SET) {
            s->value = v;
        } else if (f->type == METRIC_HISTOGRAM) {
            size_t b = 0;
            while (b < f->nbuckets && v > f->buckets[b])
                b++;
            if (b < f->nbuckets)
                s->buckets[b]++;
            s->value += v;
            s->count++;
        }
    }
    pthread_mutex_unlock(&lock);
}

void metrics_add(enum metric_key k, double v, ...)
{
    va_list ap;
    va_start(ap, v);
    update(k, OP_ADD, v, ap);
    va_end(ap);
}

void metrics_set(enum metric_key k, double v, ...)
{
    va_list ap;
    va_start(ap, v);
    update(k, OP_SET, v, ap);
    va_end(ap);
}

void metrics_observe(enum metric_key k, double v, ...)
{
    va_list ap;
    va_start(ap, v);
    update(k, OP_OBSERVE, v, ap);
    va_end(ap);
}

static void forget_locked(enum metric_key k)
{
    struct family_state *fs = &state[k];
    for (size_t i = 0; i < fs->n; i++)
        series_release(&fs->s[i]);
    free(fs->s);
    memset(fs, 0, sizeof(*fs));
}

void metrics_forget(enum metric_key k)
{
    if ((unsigned)k >= METRIC__COUNT)
        return;
    pthread_mutex_lock(&lock);
    forget_locked(k);
    pthread_mutex_unlock(&lock);
}

void metrics_reset(void)
{
    pthread_mutex_lock(&lock);
    for (int k = 0; k < METRIC__COUNT; k++)
        forget_locked((enum metric_key)k);
    pthread_mutex_unlock(&lock);
}

const char *metrics_name(enum metric_key k)
{
    return (unsigned)k < METRIC__COUNT ? families[k].name : NULL;
}

/* ---- the text format ---- */

struct buf {
    char *p;
    size_t len, cap;
    int failed;
};

static void put(struct buf *b, const char *s, size_t n)
{
    if (b->failed)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t ncap = b->cap ? b->cap : 4096;
        while (b->len + n + 1 > ncap)
            ncap *= 2;
        char *np = realloc(b->p, ncap);
        if (!np) {
            b->failed = 1;
            return;
        }
        b->p = np;
        b->cap = ncap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(struct buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* HELP text escapes backslash and newline; label values also the double
 * quote. */
static void put_escaped(struct buf *b, const char *s, int quote)
{
    for (; *s; s++) {
        if (*s == '\\')
            puts_(b, "\\\\");
        else if (*s == '\n')
            puts_(b, "\\n");
        else if (quote && *s == '"')
            puts_(b, "\\\"");
        else
            put(b, s, 1);
    }
}

/* The shortest text that reads back as the same double, as Prometheus
 * writes them: 1, 500, 0.25, 1e+21, +Inf, NaN. */
static void put_number(struct buf *b, double v)
{
    char t[40];
    if (isnan(v)) {
        puts_(b, "NaN");
        return;
    }
    if (isinf(v)) {
        puts_(b, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v > -1e15 && v < 1e15 && v == (double)(long long)v) {
        snprintf(t, sizeof(t), "%lld", (long long)v); /* 500, never 5e+02 */
        puts_(b, t);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(t, sizeof(t), "%.*g", prec, v);
        if (strtod(t, NULL) == v)
            break;
    }
    puts_(b, t);
}

static void put_u64(struct buf *b, uint64_t v)
{
    char t[32];
    snprintf(t, sizeof(t), "%llu", (unsigned long long)v);
    puts_(b, t);
}

/* {a="x",b="y"[,le="..."]}, or nothing without labels. */
static void put_labels(struct buf *b, const struct metric_family *f,
                       const struct series *s, const char *le)
{
    size_t nl = nlabels(f);
    if (nl == 0 && !le)
        return;
    puts_(b, "{");
    for (size_t l = 0; l < nl; l++) {
        if (l)
            puts_(b, ",");
        puts_(b, f->labels[l]);
        puts_(b, "=\"");
        put_escaped(b, s->values[l], 1);
        puts_(b, "\"");
    }
    if (le) {
        if (nl)
            puts_(b, ",");
        puts_(b, "le=\"");
        puts_(b, le);
        puts_(b, "\"");
    }
    puts_(b, "}");
}

static void render_histogram(struct buf *b, const struct metric_family *f,
                             const struct series *s)
{
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= f->nbuckets; i++) {
        struct buf le = {0};
        if (i < f->nbuckets) {
            cumulative += s->buckets[i];
            put_number(&le, f->buckets[i]);
        } else {
            cumulative = s->count;
            puts_(&le, "+Inf");
        }
        puts_(b, f->name);
        puts_(b, "_bucket");
        put_labels(b, f, s, le.failed ? "+Inf" : le.p);
        free(le.p);
        puts_(b, " ");
        put_u64(b, cumulative);
        puts_(b, "\n");
    }
    puts_(b, f->name);
    puts_(b, "_sum");
    put_labels(b, f, s, NULL);
    puts_(b, " ");
    put_number(b, s->value);
    puts_(b, "\n");
    puts_(b, f->name);
    puts_(b, "_count");
    put_labels(b, f, s, NULL);
    puts_(b, " ");
    put_u64(b, s->count);
    puts_(b, "\n");
}

int metrics_render(char **out, size_t *len)
{
    static const char *const type_names[] = {"counter", "gauge", "histogram"};
    struct buf b = {0};

    pthread_mutex_lock(&lock);
    for (int k = 0; k < METRIC__COUNT; k++) {
        const struct metric_family *f = &families[k];
        const struct family_state *fs = &state[k];
        puts_(&b, "# HELP ");
        puts_(&b, f->name);
        puts_(&b, " ");
        put_escaped(&b, f->help, 0);
        puts_(&b, "\n# TYPE ");
        puts_(&b, f->name);
        puts_(&b, " ");
        puts_(&b, type_names[f->type]);
        puts_(&b, "\n");
        for (size_t i = 0; i < fs->n; i++) {
            if (f->type == METRIC_HISTOGRAM) {
                render_histogram(&b, f, &fs->s[i]);
                continue;
            }
            puts_(&b, f->name);
            put_labels(&b, f, &fs->s[i], NULL);
            puts_(&b, " ");
            put_number(&b, fs->s[i].value);
            puts_(&b, "\n");
        }
    }
    pthread_mutex_unlock(&lock);
    if (b.failed) {
        free(b.p);
        *out = NULL;
        *len = 0;
        return -1;
    }
    *out = b.p;
    *len = b.len;
    return 0;
}
