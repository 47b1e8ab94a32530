/* psp-sim: a payment provider speaking the subset of Stripe's PaymentIntents
 * API that charged uses, with Stripe's idempotency semantics, injectable
 * faults, Stripe-like rate limits (off by default) and a ledger of what it
 * actually charged.
 *
 * Two listeners: the provider API (/v1/...) and an admin API (ledger, reset,
 * psp_sim_faults, psp_sim_webhooks) on its own port. Delays and stalls suspend the
 * connection and a timer thread resumes it, so thousands of slow requests cost no
 * threads. With --webhook-url, every change of an intent's status becomes a
 * signed event that psp_webhooks delivers from a thread of its own. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <getopt.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "psp_sim.h"
#include "psp_faults.h"
#include "psp_journal.h"
#include "psp_store.h"
#include "psp_webhooks.h"

#define MAX_BODY 65536

static volatile sig_atomic_t stop_requested;

psp_store_t *psp_sim_store;
psp_faults_t *psp_sim_faults;
psp_webhooks_t *psp_sim_webhooks;
psp_limits_t *psp_sim_limits;
static psp_journal_t *journal; /* --state-file; NULL: in memory only */
char *psp_sim_api_keys[PSP_SIM_MAX_KEYS];
size_t psp_sim_napi_keys;

/* ---- timer: resumes suspended connections when they are due ---- */

struct timer_entry {
    int64_t due_ms;
    struct MHD_Connection *conn;
};

static pthread_mutex_t timer_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t timer_cond = PTHREAD_COND_INITIALIZER;
static struct timer_entry *heap;
static pthread_t timer; /* resumes suspended connections: timer_main */
static size_t heap_len, heap_cap;
static int timer_stop;

int64_t psp_sim_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t psp_sim_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void heap_swap(size_t a, size_t b)
{
    struct timer_entry t = heap[a];
    heap[a] = heap[b];
    heap[b] = t;
}

/* Suspends conn and schedules its resumption after delay_ms. */
void psp_sim_suspend_for(struct MHD_Connection *conn, int64_t delay_ms)
{
    MHD_suspend_connection(conn);
    pthread_mutex_lock(&timer_lock);
    if (heap_len == heap_cap) {
        size_t ncap = heap_cap ? heap_cap * 2 : 1024;
        struct timer_entry *n = realloc(heap, ncap * sizeof(*n));
        if (!n) {
            pthread_mutex_unlock(&timer_lock);
            MHD_resume_connection(conn);
            return;
        }
        heap = n;
        heap_cap = ncap;
    }
    size_t i = heap_len++;
    heap[i] = (struct timer_entry){psp_sim_now_ms() + delay_ms, conn};
    while (i > 0 && heap[(i - 1) / 2].due_ms > heap[i].due_ms) {
        heap_swap(i, (i - 1) / 2);
        i = (i - 1) / 2;
    }
    pthread_cond_signal(&timer_cond);
    pthread_mutex_unlock(&timer_lock);
}

static struct MHD_Connection *heap_pop(void)
{
    struct MHD_Connection *c = heap[0].conn;
    heap[0] = heap[--heap_len];
    for (size_t i = 0;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < heap_len && heap[l].due_ms < heap[m].due_ms)
            m = l;
        if (r < heap_len && heap[r].due_ms < heap[m].due_ms)
            m = r;
        if (m == i)
            break;
        heap_swap(i, m);
        i = m;
    }
    return c;
}

static void *timer_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&timer_lock);
    for (;;) {
        if (heap_len == 0) {
            if (timer_stop)
                break;
            pthread_cond_wait(&timer_cond, &timer_lock);
            continue;
        }
        int64_t wait = heap[0].due_ms - psp_sim_now_ms();
        if (wait > 0 && !timer_stop) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += wait / 1000;
            ts.tv_nsec += (wait % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&timer_cond, &timer_lock, &ts);
            continue;
        }
        /* Due (or shutting down: every suspended connection must resume
         * before the daemon stops). */
        MHD_resume_connection(heap_pop());
    }
    pthread_mutex_unlock(&timer_lock);
    return NULL;
}

/* ---- webhooks: every change of an intent's status is an event ---- */

/* The store calls this under its lock, in the order of each intent's
 * changes; queuing never blocks the request that made the change. */
static void on_intent_change(void *ctx, json_t *intent, int64_t at_ms)
{
    const char *type = psp_webhooks_type_for_status(
        json_string_value(json_object_get(intent, "status")));
    if (type)
        psp_webhooks_enqueue(ctx, type, intent, at_ms / 1000, NULL, NULL, 0);
}

/* Refund events (refund.*, charge.refunded) come with their type. */
static void on_store_event(void *ctx, const char *type, json_t *object, int64_t at_ms)
{
    psp_webhooks_enqueue(ctx, type, object, at_ms / 1000, NULL, NULL, 0);
}

/* With --processing-settle-ms an intent settles when it is next read; with
 * webhooks someone must read it when it is due, or its event never comes.
 * At most 100 ms late: the setting can change at run time. */
static pthread_mutex_t settler_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t settler_cond = PTHREAD_COND_INITIALIZER;
static int settler_stop;

static void *settler_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&settler_lock);
    while (!settler_stop) {
        pthread_mutex_unlock(&settler_lock);
        int64_t next = psp_store_settle_due(psp_sim_store, psp_sim_now_ms());
        pthread_mutex_lock(&settler_lock);
        if (settler_stop)
            break;
        int64_t wait = next < 0 || next > 100 ? 100 : next < 1 ? 1 : next;
        int64_t due = psp_sim_now_ms() + wait;
        struct timespec ts = {.tv_sec = due / 1000, .tv_nsec = (due % 1000) * 1000000};
        pthread_cond_timedwait(&settler_cond, &settler_lock, &ts);
    }
    pthread_mutex_unlock(&settler_lock);
    return NULL;
}

/* ---- request helpers ---- */

static void req_free(struct req *r)
{
    if (!r)
        return;
    if (r->executing)
        psp_store_release(psp_sim_store, r->idem_key);
    if (r->charging)
        psp_store_charge_ended(psp_sim_store);
    for (size_t i = 0; i < r->nform; i++) {
        free(r->form[i].k);
        free(r->form[i].v);
    }
    free(r->form);
    free(r->body);
    free(r->idem_key);
    free(r->intent_id);
    json_decref(r->metadata);
    free(r);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    (void)cls;
    (void)conn;
    (void)toe;
    req_free(*con_cls);
    *con_cls = NULL;
}

enum MHD_Result psp_sim_respond(struct MHD_Connection *conn, int status, char *body,
                                int replayed)
{
    return psp_sim_respond_with(conn, status, body,
                                replayed ? "Idempotent-Replayed" : NULL, "true");
}

enum MHD_Result psp_sim_respond_with(struct MHD_Connection *conn, int status,
                                     char *body, const char *name, const char *value)
{
    struct MHD_Response *resp;
    enum MHD_Result rc;

    /* Whatever the answer tells of must be on disk before it is sent. */
    psp_journal_sync(journal);
    if (!body)
        body = strdup("{}");
    resp = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!resp) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/json");
    if (name)
        MHD_add_response_header(resp, name, value);
    rc = MHD_queue_response(conn, (unsigned)status, resp);
    MHD_destroy_response(resp);
    return rc;
}

enum MHD_Result psp_sim_respond_json(struct MHD_Connection *conn, int status, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(j);
    return psp_sim_respond(conn, status, s, 0);
}

enum MHD_Result psp_sim_respond_error(struct MHD_Connection *conn, int status,
                                      const char *type, const char *message)
{
    return psp_sim_respond_json(
        conn, status,
        json_pack("{s:{s:s, s:s}}", "error", "type", type, "message", message));
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn,
                                  const char *url, const char *method,
                                  const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    int admin = cls != NULL;
    struct req *r = *con_cls;
    (void)version;

    if (!r) {
        r = calloc(1, sizeof(*r));
        if (!r)
            return MHD_NO;
        r->conn = conn;
        *con_cls = r;
        return MHD_YES;
    }
    switch (r->state) {
    case ST_RECEIVING:
        break;
    case ST_DELAYED:
        return psp_sim_execute_and_answer(r);
    case ST_STALLED:
        return MHD_NO; /* the client has given up by now; hang up */
    }
    if (*upload_data_size) {
        if (r->len + *upload_data_size > MAX_BODY) {
            r->too_large = 1;
        } else {
            char *n = realloc(r->body, r->len + *upload_data_size + 1);
            if (!n)
                return MHD_NO;
            r->body = n;
            memcpy(r->body + r->len, upload_data, *upload_data_size);
            r->len += *upload_data_size;
            r->body[r->len] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    /* Ids in a changing request's URL go into the state file, which is
     * JSON: such a URL that is not UTF-8 names nothing psp-sim could hold.
     * (A GET keeps nothing of it, and answers 404 for the id as it is.) */
    if (strcmp(method, "GET") != 0 && !psp_sim_utf8(url))
        return psp_sim_respond_error(conn, 404, "invalid_request_error",
                                     "Unrecognized request URL: not UTF-8.");
    return admin ? psp_sim_admin_api(r, url, method)
                 : psp_sim_provider_api(r, url, method);
}

/* ---- start-up ---- */

static void on_signal(int sig)
{
    (void)sig;
    stop_requested = 1;
}

int psp_sim_parse_long(const char *s, long min, long max, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/* A probability: a number in 0..1. */
static int parse_rate(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= 0 && v <= 1))
        return -1;
    *out = v;
    return 0;
}

/* KIND=P[@TARGET][#TIMES] */
static int parse_fault(const char *spec)
{
    char buf[512], *eq, *at, *hash, *end;
    long times = -1;
    int kind;
    double p;

    snprintf(buf, sizeof(buf), "%s", spec);
    eq = strchr(buf, '=');
    if (!eq)
        return -1;
    *eq = '\0';
    kind = psp_fault_parse(buf);
    hash = strchr(eq + 1, '#');
    if (hash) {
        *hash = '\0';
        if (psp_sim_parse_long(hash + 1, 0, LONG_MAX, &times) != 0)
            return -1;
    }
    at = strchr(eq + 1, '@');
    if (at)
        *at++ = '\0';
    errno = 0;
    p = strtod(eq + 1, &end);
    if (kind < 0 || errno || end == eq + 1 || *end || p < 0 || p > 1)
        return -1;
    int is_pm = at && !strncmp(at, "pm_", 3);
    return psp_faults_add(psp_sim_faults, (enum psp_fault_kind)kind, p,
                          at && !is_pm ? at : NULL, is_pm ? at : NULL, times);
}

/* The long name of the option whose getopt value is val. */
static const char *flag_name(const struct option *opts, int val)
{
    for (; opts->name; opts++)
        if (opts->val == val)
            return opts->name;
    return "?";
}

static int replay_record(void *ctx, json_t *record)
{
    return psp_store_replay(ctx, record);
}

static void journal_record(void *ctx, json_t *record)
{
    psp_journal_append(ctx, record);
}

/* Bound ports as libmicrohttpd reports them: with --port 0 the kernel chose. */
static unsigned bound_port(struct MHD_Daemon *d)
{
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return info ? info->port : 0;
}

/* What the command line asked for. */
struct flags {
    const char *host;
    long port, admin_port, retention, threads;
    long max_conn, seed, latency, jitter, stall;
    long search_lag, settle, refund_settle, auth_expiry;
    long wh_retry, wh_retry_max, wh_timeout, wh_queue;
    double wh_duplicate, wh_reorder;
    const char *wh_url, *wh_secret, *state_file;
    int secret_from_flag, key_from_flag;
    const char *fault_specs[64];
    int nfaults;
    struct psp_limits_config limits; /* --rate-limit... */
};

static const struct option opts[] = {
    {"host", required_argument, NULL, 'H'},
    {"port", required_argument, NULL, 'p'},
    {"admin-port", required_argument, NULL, 'a'},
    {"api-key", required_argument, NULL, 'k'},
    {"key-retention-ms", required_argument, NULL, 'r'},
    {"threads", required_argument, NULL, 't'},
    {"max-connections", required_argument, NULL, 'c'},
    {"seed", required_argument, NULL, 's'},
    {"latency-ms", required_argument, NULL, 'l'},
    {"latency-jitter-ms", required_argument, NULL, 'j'},
    {"stall-ms", required_argument, NULL, 'S'},
    {"fault", required_argument, NULL, 'f'},
    {"search-lag-ms", required_argument, NULL, 'L'},
    {"processing-settle-ms", required_argument, NULL, 'P'},
    {"refund-settle-ms", required_argument, NULL, 'R'},
    {"authorization-expiry-ms", required_argument, NULL, 'X'},
    {"webhook-url", required_argument, NULL, 'U'},
    {"webhook-secret", required_argument, NULL, 'W'},
    {"webhook-duplicate-rate", required_argument, NULL, 'D'},
    {"webhook-reorder-rate", required_argument, NULL, 'O'},
    {"webhook-retry-ms", required_argument, NULL, 'B'},
    {"webhook-retry-max-ms", required_argument, NULL, 'M'},
    {"webhook-timeout-ms", required_argument, NULL, 'T'},
    {"webhook-queue-max", required_argument, NULL, 'Q'},
    {"state-file", required_argument, NULL, 'J'},
    {"rate-limit", required_argument, NULL, 'G'},
    {"rate-limit-class", required_argument, NULL, 'C'},
    {"rate-limit-retry-after", no_argument, NULL, 'A'},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

/* A numeric flag c: -1 when taken, else 2 (said on stderr). Ports are 0
 * (the kernel picks) to 65535, counts go to libmicrohttpd as unsigned, and
 * delays stop at a day so that now + delay cannot overflow. */
static int take_number(int c, struct flags *f, const char *arg, const char *given)
{
    const struct {
        int val;
        long *target, min, max;
    } nums[] = {
        {'p', &f->port, 0, 65535},
        {'a', &f->admin_port, 0, 65535},
        {'r', &f->retention, 0, LONG_MAX},
        {'t', &f->threads, 1, 1024},
        {'c', &f->max_conn, 1, 1000000},
        {'s', &f->seed, 0, LONG_MAX},
        {'l', &f->latency, 0, 86400000},
        {'j', &f->jitter, 0, 86400000},
        {'S', &f->stall, 0, 86400000},
        {'L', &f->search_lag, 0, 86400000},
        {'P', &f->settle, 0, 86400000},
        {'R', &f->refund_settle, 0, 86400000},
        {'B', &f->wh_retry, 1, 86400000},
        {'M', &f->wh_retry_max, 1, 86400000},
        {'T', &f->wh_timeout, 1, 86400000},
        {'Q', &f->wh_queue, 1, 10000000},
        {'X', &f->auth_expiry, 1, PSP_AUTHORIZATION_EXPIRY_MAX_MS},
    };
    size_t i;
    for (i = 0; i < sizeof(nums) / sizeof(nums[0]) && nums[i].val != c; i++)
        ;
    if (i == sizeof(nums) / sizeof(nums[0])) {
        fprintf(stderr, "psp-sim: bad option '%s' (see psp-sim --help)\n", given);
        return 2;
    }
    if (psp_sim_parse_long(arg, nums[i].min, nums[i].max, nums[i].target) != 0) {
        char range[64];
        if (nums[i].max == LONG_MAX)
            snprintf(range, sizeof(range), ">= %ld", nums[i].min);
        else
            snprintf(range, sizeof(range), "in %ld..%ld", nums[i].min, nums[i].max);
        fprintf(stderr, "psp-sim: --%s: '%s' is not an integer %s\n",
                flag_name(opts, c), arg, range);
        return 2;
    }
    return -1;
}

/* --rate-limit N[:BURST], --rate-limit-class CLASS=N[:BURST]: -1 when
 * taken, else 2 (said on stderr). */
static int take_limit(int c, struct flags *f, const char *arg)
{
    char err[200], name[32];
    const char *eq = strchr(arg, '=');
    struct psp_limit *target = &f->limits.global;
    int cls;

    if (c == 'C') {
        snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - arg) : 0, arg);
        if (!eq || (cls = psp_limits_class_parse(name)) < 0) {
            fprintf(stderr,
                    "psp-sim: --rate-limit-class: '%s' is not CLASS=N[:BURST] with "
                    "CLASS one of create, capture, refund, retrieve, search, list\n",
                    arg);
            return 2;
        }
        target = &f->limits.classes[cls];
        arg = eq + 1;
    }
    if (psp_limits_parse_spec(arg, target, err, sizeof(err)) != 0) {
        fprintf(stderr, "psp-sim: --%s: %s (requests/s, 0..%ld)\n", flag_name(opts, c),
                err, PSP_LIMITS_RATE_MAX);
        return 2;
    }
    return -1;
}

/* --api-key: the first replaces the default, more add accounts. -1 when
 * taken, else 2 (said on stderr, never the key). */
static int take_key(struct flags *f, const char *arg)
{
    if (!f->key_from_flag) {
        free(psp_sim_api_keys[0]);
        psp_sim_api_keys[0] = NULL;
        psp_sim_napi_keys = 0;
        f->key_from_flag = 1;
    }
    for (size_t i = 0; i < psp_sim_napi_keys; i++) {
        if (!strcmp(psp_sim_api_keys[i], arg)) {
            fprintf(stderr, "psp-sim: --api-key: the same key given twice\n");
            return 2;
        }
    }
    if (psp_sim_napi_keys == PSP_SIM_MAX_KEYS) {
        fprintf(stderr, "psp-sim: --api-key: at most %d of them\n", PSP_SIM_MAX_KEYS);
        return 2;
    }
    psp_sim_api_keys[psp_sim_napi_keys++] = strdup(arg);
    return -1;
}

/* One flag c: -1 when taken, else the exit status (0 after --help, 2 for
 * bad usage, said on stderr). */
static int take_flag(int c, struct flags *f, const char *given)
{
    switch (c) {
    case 'H':
        f->host = optarg;
        return -1;
    case 'k':
        return take_key(f, optarg);
    case 'G':
    case 'C':
        return take_limit(c, f, optarg);
    case 'A':
        f->limits.retry_after = 1;
        return -1;
    case 'U':
        f->wh_url = optarg;
        return -1;
    case 'J':
        f->state_file = optarg;
        return -1;
    case 'W':
        f->wh_secret = optarg;
        f->secret_from_flag = 1;
        return -1;
    case 'D':
    case 'O':
        if (parse_rate(optarg, c == 'D' ? &f->wh_duplicate : &f->wh_reorder) == 0)
            return -1;
        fprintf(stderr, "psp-sim: --%s: '%s' is not a number in 0..1\n",
                flag_name(opts, c), optarg);
        return 2;
    case 'f':
        if (f->nfaults < 64) {
            f->fault_specs[f->nfaults++] = optarg;
            return -1;
        }
        fprintf(stderr, "psp-sim: --fault: at most 64 of them\n");
        return 2;
    case 'h':
        psp_sim_usage(stdout);
        return 0;
    case ':':
        fprintf(stderr, "psp-sim: --%s needs a value (see psp-sim --help)\n",
                flag_name(opts, optopt));
        return 2;
    default:
        return take_number(c, f, optarg, given);
    }
}

/* The command line into f: -1, or the exit status. */
static int parse_flags(int argc, char **argv, struct flags *f)
{
    int c, rc;

    opterr = 0; /* we say it ourselves, in one line */
    /* The leading ':' makes a missing value ':' (optopt names the flag). */
    while ((c = getopt_long(argc, argv, ":h", opts, NULL)) != -1)
        if ((rc = take_flag(c, f, argv[optind - 1])) >= 0)
            return rc;
    int empty_key = 0;
    for (size_t i = 0; i < psp_sim_napi_keys; i++)
        empty_key |= !psp_sim_api_keys[i] || !*psp_sim_api_keys[i];
    if (optind != argc || empty_key) {
        if (optind != argc)
            fprintf(stderr, "psp-sim: unexpected argument '%s'\n", argv[optind]);
        else
            fprintf(stderr, "psp-sim: %s must not be empty\n",
                    f->key_from_flag ? "--api-key" : "PSP_SIM_API_KEY");
        return 2;
    }
    /* Never the secret itself in these lines. */
    if (f->wh_secret && !*f->wh_secret) {
        fprintf(stderr, "psp-sim: %s must not be empty\n",
                f->secret_from_flag ? "--webhook-secret" : "PSP_SIM_WEBHOOK_SECRET");
        return 2;
    }
    if (f->wh_url && !f->wh_secret) {
        fprintf(stderr, "psp-sim: --webhook-url needs a signing secret "
                        "(--webhook-secret or PSP_SIM_WEBHOOK_SECRET)\n");
        return 2;
    }
    return -1;
}

/* The store (its books replayed from --state-file) and the faults, as the
 * flags say: -1, or the exit status. */
static int open_books(const struct flags *f)
{
    char err[256];

    psp_sim_store = psp_store_new(f->retention);
    if (f->state_file) {
        /* The books as they were (no webhook is queued for them: no observer
         * yet), less what was in flight; then this run's changes follow. */
        journal = psp_journal_open(f->state_file, replay_record, psp_sim_store, err,
                                   sizeof(err));
        if (!journal) {
            fprintf(stderr, "psp-sim: --state-file: '%s': %s\n", f->state_file, err);
            return 1;
        }
        psp_store_set_journal(psp_sim_store, journal_record, journal);
        psp_store_release_reserved(psp_sim_store);
    }
    /* The flags of this run win over the settings replayed. */
    psp_store_set_retention(psp_sim_store, f->retention);
    psp_store_set_search_lag(psp_sim_store, f->search_lag);
    psp_store_set_processing_settle(psp_sim_store, f->settle);
    psp_store_set_refund_settle(psp_sim_store, f->refund_settle);
    psp_store_set_authorization_expiry(psp_sim_store, f->auth_expiry);
    psp_sim_faults = psp_faults_new((uint64_t)f->seed);
    psp_faults_set_latency(psp_sim_faults, f->latency, f->jitter);
    psp_faults_set_stall(psp_sim_faults, f->stall);
    for (int i = 0; i < f->nfaults; i++) {
        if (parse_fault(f->fault_specs[i]) != 0) {
            fprintf(stderr, "psp-sim: --fault: '%s' is not KIND=P[@TARGET][#TIMES]\n",
                    f->fault_specs[i]);
            return 2;
        }
    }
    psp_sim_limits = psp_limits_new(psp_sim_napi_keys);
    psp_limits_set(psp_sim_limits, &f->limits, psp_sim_mono_ms());
    return -1;
}

/* Both listeners, as the flags say; until SIGTERM or SIGINT once both
 * listen. 0, or 1 when they cannot listen. Signals: blocked in every thread,
 * taken by sigsuspend only. */
static int listen_until_stopped(const struct flags *f, struct sockaddr_in *sa,
                                struct sockaddr_in *asa, const sigset_t *old)
{
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_USE_TURBO;
    int rc = 1;
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)f->port, NULL, NULL, on_request, NULL, MHD_OPTION_SOCK_ADDR,
        sa, MHD_OPTION_THREAD_POOL_SIZE, (unsigned)f->threads,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)f->max_conn,
        MHD_OPTION_CONNECTION_TIMEOUT, 300u, MHD_OPTION_LISTEN_BACKLOG_SIZE, 4096u,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    struct MHD_Daemon *ad = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL, (uint16_t)f->admin_port, NULL,
        NULL, on_request, (void *)1, MHD_OPTION_SOCK_ADDR, asa,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_END);
    unsigned bound = d ? bound_port(d) : 0, admin_bound = ad ? bound_port(ad) : 0;
    if (!bound || !admin_bound) {
        fprintf(stderr, "psp-sim: cannot listen on %s:%ld / %s:%ld\n", f->host, f->port,
                f->host, f->admin_port);
    } else {
        /* Both sockets listen already: whoever reads this line may connect.
         * It is the only thing written to stdout (logs go to stderr). */
        printf("psp-sim listening port=%u admin_port=%u\n", bound, admin_bound);
        fflush(stdout);
        fprintf(stderr, "psp-sim: listening on http://%s:%u (admin http://%s:%u)\n",
                f->host, bound, f->host, admin_bound);
        while (!stop_requested)
            sigsuspend(old);
        rc = 0;
    }
    /* Every suspended connection must resume before the daemon stops. */
    pthread_mutex_lock(&timer_lock);
    timer_stop = 1;
    pthread_cond_signal(&timer_cond);
    pthread_mutex_unlock(&timer_lock);
    pthread_join(timer, NULL);
    if (d)
        MHD_stop_daemon(d);
    if (ad)
        MHD_stop_daemon(ad);
    return rc;
}

/* Threads, webhooks and listeners; everything stopped again on return. 0,
 * or 1. */
static int serve(const struct flags *f, const struct psp_webhooks_config *whc,
                 struct sockaddr_in *sa, struct sockaddr_in *asa)
{
    pthread_t settler;
    int settler_started = 0, rc = 1;
    sigset_t block, old;

    /* Every thread started from here on inherits the blocked signals; only
     * sigsuspend takes them. */
    signal(SIGPIPE, SIG_IGN);
    sigemptyset(&block);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGINT);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    struct sigaction act = {0};
    act.sa_handler = on_signal;
    sigaction(SIGTERM, &act, NULL);
    sigaction(SIGINT, &act, NULL);
    pthread_create(&timer, NULL, timer_main, NULL);
    psp_sim_webhooks = psp_webhooks_new(whc);
    if (!psp_sim_webhooks) {
        fprintf(stderr, "psp-sim: cannot start webhook deliveries\n");
        pthread_mutex_lock(&timer_lock);
        timer_stop = 1;
        pthread_cond_signal(&timer_cond);
        pthread_mutex_unlock(&timer_lock);
        pthread_join(timer, NULL);
        free(heap);
        return 1;
    }
    if (f->wh_url) {
        psp_store_set_observer(psp_sim_store, on_intent_change, psp_sim_webhooks);
        psp_store_set_event_observer(psp_sim_store, on_store_event, psp_sim_webhooks);
        settler_started = pthread_create(&settler, NULL, settler_main, NULL) == 0;
    }
    rc = listen_until_stopped(f, sa, asa, &old);
    free(heap);
    if (settler_started) {
        pthread_mutex_lock(&settler_lock);
        settler_stop = 1;
        pthread_cond_signal(&settler_cond);
        pthread_mutex_unlock(&settler_lock);
        pthread_join(settler, NULL);
    }
    /* No request runs any more: nothing queues from here on. */
    psp_store_set_observer(psp_sim_store, NULL, NULL);
    psp_store_set_event_observer(psp_sim_store, NULL, NULL);
    psp_webhooks_free(psp_sim_webhooks);
    return rc;
}

static void free_keys(void)
{
    for (size_t i = 0; i < psp_sim_napi_keys; i++)
        free(psp_sim_api_keys[i]);
    psp_sim_napi_keys = 0;
}

int main(int argc, char **argv)
{
    struct flags f = {
        .host = "127.0.0.1",
        .port = 12111,
        .admin_port = 12112,
        .retention = 86400000L,
        .threads = 2,
        .max_conn = 8192,
        .seed = 1,
        .stall = 30000,
        .auth_expiry = PSP_AUTHORIZATION_EXPIRY_MS,
        .wh_retry = 100,
        .wh_retry_max = 2000,
        .wh_timeout = 5000,
        .wh_queue = 100000,
        .wh_secret = getenv("PSP_SIM_WEBHOOK_SECRET"),
    };
    struct sockaddr_in sa = {0}, asa = {0};
    char err[256];
    int rc;

    psp_sim_api_keys[0] = getenv("PSP_SIM_API_KEY") ? strdup(getenv("PSP_SIM_API_KEY"))
                                                    : strdup("sk_test_charged");
    psp_sim_napi_keys = 1;
    if ((rc = parse_flags(argc, argv, &f)) >= 0) {
        free_keys();
        return rc;
    }
    struct psp_webhooks_config whc = {
        .url = f.wh_url,
        .secret = f.wh_secret,
        .duplicate_rate = f.wh_duplicate,
        .reorder_rate = f.wh_reorder,
        .retry_ms = f.wh_retry,
        .retry_max_ms = f.wh_retry_max,
        .timeout_ms = f.wh_timeout,
        .queue_max = (size_t)f.wh_queue,
        .seed = (uint64_t)f.seed,
    };
    if (psp_webhooks_check_config(&whc, err, sizeof(err)) != 0) {
        fprintf(stderr, "psp-sim: --webhook-url: %s\n", err);
        free_keys();
        return 2;
    }
    /* Before any thread: curl's global set-up is not thread-safe. */
    curl_global_init(CURL_GLOBAL_DEFAULT);
    rc = open_books(&f);
    sa.sin_family = asa.sin_family = AF_INET;
    if (rc < 0 && inet_pton(AF_INET, f.host, &sa.sin_addr) != 1) {
        fprintf(stderr, "psp-sim: --host: '%s' is not an IPv4 address\n", f.host);
        rc = 2;
    }
    if (rc < 0) {
        asa.sin_addr = sa.sin_addr;
        sa.sin_port = htons((uint16_t)f.port);
        asa.sin_port = htons((uint16_t)f.admin_port);
        rc = serve(&f, &whc, &sa, &asa);
    }
    psp_faults_free(psp_sim_faults);
    psp_limits_free(psp_sim_limits);
    psp_store_free(psp_sim_store);
    psp_journal_free(journal);
    free_keys();
    curl_global_cleanup();
    return rc;
}
