#include "api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <microhttpd.h>
#include <uuid/uuid.h>

#include "http_lender.h"
#include "http_reply.h"
#include "webhook_store.h"
#include "listen_socket.h"
#include "clock.h"
#include "config.h"
#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "op.h"
#include "provider.h"
#include "webhook_event.h"

#define WEBHOOK_PATH   "/v1/webhooks/provider"
#define ATTEMPT_PREFIX "/v1/payment-attempts/"
#define ORDER_PREFIX   "/v1/orders/"
#define ORDER_SUFFIX   "/payment-attempts"
/* The provider in the deduplication key of processed_webhook_events. */
#define WEBHOOK_PROVIDER  "stripe"
#define MAX_SECRETS       8
#define PROBE_INTERVAL_MS 2000
/* Anyone can reach the webhook endpoint: a slow client holds a connection
 * for at most IDLE_TIMEOUT_S between bytes, and one address can hold only
 * API_MAX_CONNECTIONS_PER_IP of API_MAX_CONNECTIONS. */
#define IDLE_TIMEOUT_S 10
/* A body over API_MAX_BODY_BYTES is read and thrown away, up to this much
 * more, before the 413: a server that closes with unread bytes in its
 * socket resets the connection, and the client loses the answer. Beyond
 * it the connection is cut: that much is not worth reading. */
#define DISCARD_MAX_BYTES ((size_t)8 << 20)

struct api {
    config_t *cfg;
    char id[160];
    struct MHD_Daemon *http;
    char *secret_list; /* the config value, cut into secrets[] in place */
    const char *secrets[MAX_SECRETS];
    size_t nsecrets;
    size_t max_body;
    /* One store per listener thread, lent for one request at a time. */
    webhook_store_t **stores;
    size_t nstores;
    http_lender_t *lender;
    webhook_store_t *probe; /* the loop's own, for readiness */
    int64_t next_probe;
    int db_ok;
};

/* One HTTP request's state across libmicrohttpd's calls. */
struct request {
    char *body;
    size_t len, cap;
    size_t seen; /* bytes of body received, kept or not */
    int too_large;
};

static enum MHD_Result reply_json(struct MHD_Connection *c, unsigned status,
                                  json_t *body)
{
    return http_reply_json(c, status, body, NULL);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status,
                                   const char *why)
{
    return reply_json(c, status, json_pack("{s:s}", "error", why));
}

/* A canonical (lower-case) uuid from the `len` bytes at s, or -1. */
static int uuid_from(const char *s, size_t len, char out[37])
{
    char tmp[37];
    uuid_t u;
    if (len != 36)
        return -1;
    memcpy(tmp, s, 36);
    tmp[36] = '\0';
    if (uuid_parse(tmp, u) != 0)
        return -1;
    uuid_unparse_lower(u, out);
    return 0;
}

/* What a status route reads and says: the api's own (an attempt, an
 * order's list) or an operation's (op.h, struct op_status). */
struct status_view {
    const char *id_name;   /* in logs */
    const char *not_uuid;  /* 400 */
    const char *not_found; /* 404 */
    enum charged_rc (*read)(webhook_store_t *, const char *, json_t **,
                            struct charged_error *);
    const struct op_status *op; /* read through webhook_store_one instead */
};

static const struct status_view attempt_view = {
    "payment_attempt_id", "payment attempt id is not a uuid", "no such payment attempt",
    webhook_store_attempt, NULL};
static const struct status_view order_view = {"order_id", "order id is not a uuid",
                                              "no payment attempts for this order",
                                              webhook_store_order, NULL};

/* The status view a path names (the id's bytes in *id, *id_len, and an
 * operation's into *op_view), or NULL. An operation's path is tried
 * before the api's own, in the table's order. */
static const struct status_view *status_route(const char *url, const char **id,
                                              size_t *id_len,
                                              struct status_view *op_view)
{
    size_t n = strlen(url), ap = strlen(ATTEMPT_PREFIX), op = strlen(ORDER_PREFIX),
           os = strlen(ORDER_SUFFIX);
    for (size_t k = 0; k < payment_operations_count; k++) {
        const struct op_status *st = payment_op_of(k)->status;
        size_t sp = st ? strlen(st->path) : 0;
        if (st && !strncmp(url, st->path, sp)) {
            *id = url + sp;
            *id_len = n - sp;
            *op_view = (struct status_view){st->id_name, st->not_uuid, st->not_found,
                                            NULL, st};
            return op_view;
        }
    }
    if (!strncmp(url, ATTEMPT_PREFIX, ap)) {
        *id = url + ap;
        *id_len = n - ap;
        return &attempt_view;
    }
    if (!strncmp(url, ORDER_PREFIX, op) && n > op + os &&
        !strcmp(url + n - os, ORDER_SUFFIX)) {
        *id = url + op;
        *id_len = n - op - os;
        return &order_view;
    }
    return NULL;
}

static enum MHD_Result serve_status(struct api *a, struct MHD_Connection *c,
                                    const struct status_view *v, const char *raw_id,
                                    size_t id_len)
{
    char id[37];
    struct charged_error err;
    json_t *doc = NULL;
    enum charged_rc rc;

    CHARGED_ASSERT(v && (v->read || v->op));
    if (uuid_from(raw_id, id_len, id) != 0)
        return reply_error(c, MHD_HTTP_BAD_REQUEST, v->not_uuid);
    webhook_store_t *st = http_lender_take(a->lender);
    rc = v->op ? webhook_store_one(st, v->op->sql, id, v->op->fields, v->op->nfields,
                                   &doc, &err)
               : v->read(st, id, &doc, &err);
    http_lender_give(a->lender, st);
    if (rc != CHARGED_OK && rc != CHARGED_NOT_FOUND) {
        log_warn("status query failed", v->id_name, id, "error", err.message, NULL);
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "database unavailable");
    }
    if (rc == CHARGED_NOT_FOUND)
        return reply_error(c, MHD_HTTP_NOT_FOUND, v->not_found);
    return reply_json(c, MHD_HTTP_OK, doc);
}

static enum MHD_Result webhook_refused(struct MHD_Connection *c, unsigned status,
                                       const char *result, const char *why)
{
    log_warn("webhook refused", "result", result, "reason", why, NULL);
    metrics_add(METRIC_WEBHOOKS, 1, result);
    return reply_error(c, status, why);
}

static enum MHD_Result serve_webhook(struct api *a, struct MHD_Connection *c,
                                     struct request *rq)
{
    struct webhook_event ev;
    struct webhook_store_result res;
    struct charged_error serr, err;

    if (rq->too_large)
        return webhook_refused(c, MHD_HTTP_CONTENT_TOO_LARGE, "too_large",
                               "body too large");
    const struct provider_backend *be = provider_backend_default();
    const char *sig =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, be->signature_header);
    enum webhook_signature_rc src =
        provider_webhook_verify(be, sig, rq->body ? rq->body : "", rq->len, a->secrets,
                                a->nsecrets, clock_wall_ms() / 1000);
    if (src != WEBHOOK_SIGNATURE_OK)
        return webhook_refused(c, MHD_HTTP_BAD_REQUEST, "bad_signature",
                               webhook_signature_error(src));
    char *payload = NULL;
    if (!rq->body)
        return webhook_refused(c, MHD_HTTP_BAD_REQUEST, "bad_request", "empty body");
    enum charged_rc prc =
        provider_webhook_parse(be, rq->body, rq->len, &ev, &payload, &err);
    if (prc == CHARGED_RETRY) {
        /* Nothing wrong with the body: not stored, so delivered again. */
        metrics_add(METRIC_WEBHOOKS, 1, "error");
        log_error("webhook not stored", "error", err.message, NULL);
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                           "could not store the event; deliver it again");
    }
    if (prc != CHARGED_OK)
        return webhook_refused(c, MHD_HTTP_BAD_REQUEST, "bad_request", err.message);

    webhook_store_t *st = http_lender_take(a->lender);
    int rc = webhook_store_apply(st, WEBHOOK_PROVIDER, &ev, payload, &res, &serr);
    http_lender_give(a->lender, st);
    free(payload);
    if (rc == CHARGED_BAD_ITEM) {
        log_error("webhook refused by the database", "event_id", ev.id, "type", ev.type,
                  "error", serr.message, NULL);
        return webhook_refused(c, MHD_HTTP_BAD_REQUEST, "bad_request",
                               "event refused by the database");
    }
    if (rc != CHARGED_OK) {
        /* Not stored: a 5xx makes the provider deliver it again. */
        metrics_add(METRIC_WEBHOOKS, 1, "error");
        log_error("webhook not stored", "event_id", ev.id, "type", ev.type,
                  "payment_attempt_id", ev.attempt_id[0] ? ev.attempt_id : NULL,
                  "error", serr.message, NULL);
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                           "could not store the event; deliver it again");
    }
    metrics_add(METRIC_WEBHOOKS, 1, res.outcome);
    void (*say)(enum log_level, const char *, ...) = log_write;
    say(!strcmp(res.outcome, "review") || !strcmp(res.outcome, "flagged") ||
                !strcmp(res.outcome, "unmatched") ||
                !strcmp(res.outcome, "needs_review")
            ? LOG_WARN
            : LOG_INFO,
        "webhook event", "event_id", ev.id, "type", ev.type, "payment_attempt_id",
        res.attempt_id[0] ? res.attempt_id : NULL, "refund_id",
        res.refund_id[0] ? res.refund_id : NULL, "order_id",
        res.order_id[0] ? res.order_id : NULL, "provider_payment_id",
        ev.intent_id[0] ? ev.intent_id : NULL, "result", res.outcome, "from",
        res.old_status[0] ? res.old_status : NULL, "to",
        res.new_status[0] ? res.new_status : NULL, "reason", res.reason, NULL);
    return reply_json(c, MHD_HTTP_OK,
                      json_pack("{s:b, s:s}", "received", 1, "result", res.outcome));
}

/* Appends an upload chunk, keeping nothing past max_body. Returns -1 once
 * more than DISCARD_MAX_BYTES past it came: the connection is to be cut. */
static int take_chunk(struct api *a, struct request *rq, const char *data, size_t n)
{
    rq->seen += n;
    if (rq->too_large)
        return rq->seen > a->max_body + DISCARD_MAX_BYTES ? -1 : 0;
    if (rq->len + n > a->max_body) {
        rq->too_large = 1;
        free(rq->body);
        rq->body = NULL;
        rq->len = rq->cap = 0;
        return 0;
    }
    if (rq->len + n + 1 > rq->cap) {
        size_t cap = rq->cap ? rq->cap : 4096;
        while (cap < rq->len + n + 1)
            cap *= 2;
        char *b = realloc(rq->body, cap);
        if (!b) {
            rq->too_large = 1; /* answered 413; nothing better is possible */
            return 0;
        }
        rq->body = b;
        rq->cap = cap;
    }
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
    rq->body[rq->len] = '\0';
    return 0;
}

/* 1 if the client waits for an answer before it sends its body. */
static int expects_continue(struct MHD_Connection *c)
{
    const char *e =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
    return e && !strcasecmp(e, "100-continue");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **ctx)
{
    struct api *a = cls;
    struct request *rq = *ctx;
    enum MHD_Result ret;
    (void)version;

    if (!rq) {
        const char *id = NULL;
        size_t id_len = 0;
        int webhook = !strcmp(url, WEBHOOK_PATH);
        struct status_view op_view;
        const struct status_view *route =
            webhook ? NULL : status_route(url, &id, &id_len, &op_view);
        if (!webhook && !route)
            return reply_error(c, MHD_HTTP_NOT_FOUND, "no such endpoint");
        const char *allowed = webhook ? MHD_HTTP_METHOD_POST : MHD_HTTP_METHOD_GET;
        if (strcmp(method, allowed) != 0)
            return http_reply_json(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                                   json_pack("{s:s}", "error", "method not allowed"),
                                   allowed);
        if (route) {
            http_lender_enter(a->lender);
            ret = serve_status(a, c, route, id, id_len);
            http_lender_leave(a->lender);
            return ret;
        }
        /* Too large by its Content-Length: answered before the body only
         * when the client waits for that (Expect: 100-continue) or sends
         * more than is worth reading; otherwise read to the end, thrown
         * away, so that the client can read its 413. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long announced = cl ? strtoull(cl, NULL, 10) : 0;
        if (announced > a->max_body &&
            (expects_continue(c) || announced - a->max_body > DISCARD_MAX_BYTES))
            return webhook_refused(c, MHD_HTTP_CONTENT_TOO_LARGE, "too_large",
                                   "body too large");
        if (!(rq = calloc(1, sizeof(*rq))))
            return MHD_NO;
        rq->too_large = announced > a->max_body;
        *ctx = rq;
        return MHD_YES;
    }
    if (*upload_size) {
        int cut = take_chunk(a, rq, upload, *upload_size);
        *upload_size = 0;
        if (cut) {
            log_warn("webhook refused", "result", "too_large", "reason",
                     "body too large; connection closed", NULL);
            metrics_add(METRIC_WEBHOOKS, 1, "too_large");
            return MHD_NO;
        }
        return MHD_YES;
    }
    http_lender_enter(a->lender);
    ret = serve_webhook(a, c, rq);
    http_lender_leave(a->lender);
    return ret;
}

static void on_completed(void *cls, struct MHD_Connection *c, void **ctx,
                         enum MHD_RequestTerminationCode why)
{
    struct request *rq = *ctx;
    (void)cls;
    (void)c;
    (void)why;
    if (rq) {
        free(rq->body);
        free(rq);
        *ctx = NULL;
    }
}

static const struct http_reply_log_as http_log_as = {"http listener", "detail"};

/* Cuts the comma-separated secrets in place. CHARGED_OK, or CHARGED_GIVE_UP
 * with err. */
static enum charged_rc take_secrets(struct api *a, struct charged_error *err)
{
    const char *name = config_name(CONFIG_WEBHOOK_SIGNING_SECRET);
    char *save = NULL;
    a->secret_list = strdup(config_str(a->cfg, CONFIG_WEBHOOK_SIGNING_SECRET));
    if (!a->secret_list) {
        charged_error_set(err, "out of memory");
        return CHARGED_GIVE_UP;
    }
    for (char *s = strtok_r(a->secret_list, ",", &save); s;
         s = strtok_r(NULL, ",", &save)) {
        while (*s == ' ')
            s++;
        size_t n = strlen(s);
        while (n && s[n - 1] == ' ')
            s[--n] = '\0';
        if (n < 8) {
            charged_error_set(err, "%s: every secret needs at least 8 characters",
                              name);
            return CHARGED_GIVE_UP;
        }
        if (a->nsecrets == MAX_SECRETS) {
            charged_error_set(err, "%s: at most %d secrets", name, MAX_SECRETS);
            return CHARGED_GIVE_UP;
        }
        if (log_add_secret(s) != 0) {
            charged_error_set(err, "%s: out of memory", name);
            return CHARGED_GIVE_UP;
        }
        a->secrets[a->nsecrets++] = s;
    }
    if (a->nsecrets == 0) {
        charged_error_set(err, "%s: no secret given", name);
        return CHARGED_GIVE_UP;
    }
    return CHARGED_OK;
}

/* Listens on API_ADDR: CHARGED_OK, or listen_socket_open's code with err
 * (CHARGED_RETRY when the listener cannot start). */
static enum charged_rc listen_http(struct api *a, struct charged_error *err)
{
    const char *addr = config_str(a->cfg, CONFIG_API_ADDR);
    int fd = -1, port = 0;
    enum charged_rc rc = listen_socket_open("API_ADDR", addr, &fd, &port, err);
    if (rc != CHARGED_OK)
        return rc;
    /* The logger comes first: libmicrohttpd logs to stderr, not JSON, until
     * it has seen it. It owns fd from here, also on failure. */
    a->http = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, on_request, a, MHD_OPTION_EXTERNAL_LOGGER, http_reply_log, &http_log_as,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_THREAD_POOL_SIZE,
        (unsigned)a->nstores, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)config_int(a->cfg, CONFIG_API_MAX_CONNECTIONS),
        MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)config_int(a->cfg, CONFIG_API_MAX_CONNECTIONS_PER_IP),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, a, MHD_OPTION_END);
    if (!a->http) {
        charged_error_set(err, "API_ADDR: cannot start the listener on %s", addr);
        return CHARGED_RETRY;
    }
    return CHARGED_OK;
}

/* The listener's threads answer the requests; the loop only probes the
 * database, every PROBE_INTERVAL_MS. */
static int64_t api_step(void *state, int64_t now)
{
    struct api *a = state;
    struct charged_error err;
    if (now < a->next_probe)
        return a->next_probe;
    a->next_probe = now + PROBE_INTERVAL_MS;
    int ok = webhook_store_ping(a->probe, &err) == CHARGED_OK;
    if (ok != a->db_ok)
        ok ? log_info("database reachable", NULL)
           : log_warn("database unreachable", "error", err.message, NULL);
    a->db_ok = ok;
    return a->next_probe;
}

/* Ready while the database answers: every request needs it. */
static const char *api_not_ready(void *state)
{
    const struct api *a = state;
    return a->db_ok == 1 ? NULL : "database unreachable";
}

/* A second SIGTERM: give up the requests in hand. */
static int second_signal(void)
{
    return daemon_stopping() >= 2;
}

static size_t api_drain(void *state, int64_t deadline)
{
    struct api *a = state;
    return http_lender_drain(a->lender, a->http, deadline, second_signal);
}

static void teardown(struct api *a)
{
    if (!a)
        return;
    if (a->http)
        MHD_stop_daemon(a->http);
    for (size_t i = 0; a->stores && i < a->nstores; i++)
        webhook_store_free(a->stores[i]);
    free(a->stores);
    http_lender_free(a->lender);
    webhook_store_free(a->probe);
    free(a->secret_list);
    config_free(a->cfg);
    free(a);
}

static void api_finish(void *state, int flush_ms)
{
    (void)flush_ms;
    log_info("api stopped", NULL);
    teardown(state);
}

static enum charged_rc setup(struct api *a, struct charged_error *err)
{
    const char *url = config_str(a->cfg, CONFIG_DATABASE_URL);
    if (take_secrets(a, err) != CHARGED_OK)
        return CHARGED_GIVE_UP;
    a->max_body = (size_t)config_int(a->cfg, CONFIG_API_MAX_BODY_BYTES);
    a->nstores = (size_t)config_int(a->cfg, CONFIG_API_THREADS);
    a->stores = calloc(a->nstores, sizeof(*a->stores));
    if (!a->stores)
        goto oom;
    /* Does not connect: started while the database is down, it is not
     * ready until the probe reaches it. */
    if (!(a->probe = webhook_store_new(url, err)))
        return CHARGED_GIVE_UP;
    for (size_t i = 0; i < a->nstores; i++) {
        if (!(a->stores[i] = webhook_store_new(url, err)))
            return CHARGED_GIVE_UP;
    }
    if (!(a->lender = http_lender_new((void *const *)a->stores, a->nstores)))
        goto oom;
    return listen_http(a, err);
oom:
    charged_error_set(err, "out of memory");
    return CHARGED_RETRY;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged api\n\n"
            "Serves, on API_ADDR:\n"
            "  POST " WEBHOOK_PATH "  the provider's webhooks: signature checked\n"
            "      (Stripe-Signature, 300 s tolerance), deduplicated on the event id,\n"
            "      applied in one transaction; 200 only after the commit\n"
            "  GET  " ATTEMPT_PREFIX "<id>             one attempt's status\n"
            "  GET  " ORDER_PREFIX "<order_id>" ORDER_SUFFIX "  an order's attempts\n");
    for (size_t k = 0; k < payment_operations_count; k++) {
        const struct op_status *st = payment_op_of(k)->status;
        if (st)
            fprintf(out, "  GET  %s<%s>  %s\n", st->path, st->id_name, st->help);
    }
    fprintf(out, "SIGTERM: stop accepting, finish the requests in hand, exit 0.\n\n");
    config_print_help(out, CONFIG_ROLE_API);
}

static enum charged_rc api_start(config_t *cfg, const char *id, void **state,
                                 struct charged_error *err)
{
    struct api *a = calloc(1, sizeof(*a));
    if (!a) {
        config_free(cfg);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    a->cfg = cfg;
    snprintf(a->id, sizeof(a->id), "%s", id);
    a->db_ok = -1;
    enum charged_rc rc = setup(a, err);
    if (rc != CHARGED_OK) {
        teardown(a);
        return rc;
    }
    log_info("api started", "api", a->id, "listen", config_str(cfg, CONFIG_API_ADDR),
             NULL);
    *state = a;
    return CHARGED_OK;
}

const struct daemon_role_desc api_role = {
    .name = "api",
    .config_role = CONFIG_ROLE_API,
    .usage = usage,
    .start = api_start,
    .step = api_step,
    .not_ready = api_not_ready,
    .drain = api_drain,
    .finish = api_finish,
};
