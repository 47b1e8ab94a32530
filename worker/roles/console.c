#include "console.h"

#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>

#include "attempt_store.h"
#include "card_data.h"
#include "config.h"
#include "console_assets.h"
#include "console_input.h"
#include "console_limits.h"
#include "console_store.h"
#include "console_views.h"
#include "daemon.h"
#include "http_lender.h"
#include "http_reply.h"
#include "listen_socket.h"
#include "log.h"
#include "op.h"

#define PROBE_INTERVAL_MS 2000
/* The longest a resolve's request waits for its share of the provider
 * budget before it is not sent (an operator waits for the page). */
#define CONSOLE_BUDGET_WAIT_MS 5000
/* A slow client holds a connection for at most IDLE_TIMEOUT_S between
 * bytes, and one address holds at most MAX_CONNECTIONS_PER_IP: a few
 * hosts cannot lock the operators out. */
#define IDLE_TIMEOUT_S         10
#define MAX_CONNECTIONS        1024
#define MAX_CONNECTIONS_PER_IP 8
/* A thread per connection: small stacks, so that MAX_CONNECTIONS of them
 * fit (no handler keeps much on its stack; the views are on the heap). */
#define THREAD_STACK_BYTES ((size_t)512 << 10)
#define CSRF_HEADER        "X-CSRF-Token"
/* Nothing but the console's own files runs or loads: no inline script, no
 * inline style, no other origin, no framing. */
#define CSP                                                                            \
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "        \
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

struct console {
    config_t *cfg;
    char id[160];
    struct MHD_Daemon *http;
    /* One set of connections per listener thread, lent for one request. */
    console_views_t **views;
    size_t nviews;
    http_lender_t *lender;
    atomic_int kafka_requests; /* answering from Kafka now (reads_kafka) */
    int kafka_max;
    attempt_store_t *probe; /* the loop's own, for readiness */
    /* One member of the provider budget for every view's resolves. */
    struct daemon_budget budget;
    int64_t next_probe;
    int db_ok;
    long long ttl_s;
    int cookie_secure;
    /* The kinds a step's review may name: the table's reviews' nouns. */
    const char *review_kinds[PAYMENT_OPS_MAX + 1];
};

/* One request's state across libmicrohttpd's calls. */
struct request {
    struct console_route_match m;
    char *body;
    size_t len;
    int too_large;
};

/* Every answer carries the page's security headers; cookie, when not
 * NULL, is a Set-Cookie. */
static enum MHD_Result send_bytes(struct MHD_Connection *c, unsigned status, char *body,
                                  size_t len, enum MHD_ResponseMemoryMode mode,
                                  const char *type, const char *cookie,
                                  const char *allow)
{
    const char *headers[] = {"Content-Security-Policy",
                             CSP,
                             "X-Content-Type-Options",
                             "nosniff",
                             "X-Frame-Options",
                             "DENY",
                             "Referrer-Policy",
                             "no-referrer",
                             "Cross-Origin-Opener-Policy",
                             "same-origin",
                             "Cross-Origin-Resource-Policy",
                             "same-origin",
                             MHD_HTTP_HEADER_SET_COOKIE,
                             cookie,
                             MHD_HTTP_HEADER_ALLOW,
                             allow,
                             NULL};
    return http_reply_with(c, status, body, len, mode, type, headers);
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status,
                                 json_t *body, const char *cookie)
{
    /* Escaped '/' too: no "</script>" ever appears in an answer. */
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_ESCAPE_SLASH) : NULL;
    json_decref(body);
    if (!text)
        return MHD_NO;
    return send_bytes(c, status, text, strlen(text), MHD_RESPMEM_MUST_FREE,
                      "application/json", cookie, NULL);
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status,
                                  const char *why)
{
    /* A refusal may quote the request: no card number goes back in it. */
    char text[512];
    snprintf(text, sizeof(text), "%s", why);
    card_data_mask_loose(text, strlen(text));
    return send_json(c, status, json_pack("{s:s}", "error", text), NULL);
}

static const char *asset_type(const char *name)
{
    const char *dot = strrchr(name, '.');
    if (dot && !strcmp(dot, ".html"))
        return "text/html; charset=utf-8";
    if (dot && !strcmp(dot, ".js"))
        return "text/javascript; charset=utf-8";
    if (dot && !strcmp(dot, ".css"))
        return "text/css; charset=utf-8";
    if (dot && !strcmp(dot, ".svg"))
        return "image/svg+xml";
    return "application/octet-stream";
}

static enum MHD_Result serve_asset(struct MHD_Connection *c, const char *name)
{
    for (size_t i = 0; i < console_assets_count; i++)
        if (!strcmp(console_assets[i].name, name))
            return send_bytes(c, MHD_HTTP_OK, (char *)console_assets[i].bytes,
                              console_assets[i].len, MHD_RESPMEM_PERSISTENT,
                              asset_type(name), NULL, NULL);
    return send_error(c, MHD_HTTP_NOT_FOUND, "no such file");
}

/* The session cookie: HttpOnly (no script reads it), SameSite=Strict (no
 * other site's page sends it), Path=/console, Secure unless configured off
 * for plain HTTP on loopback. max_age 0 ends it. */
static void session_cookie(const struct console *cs, const char *sid, long long max_age,
                           char *out, size_t size)
{
    snprintf(out, size, "%s=%s; Path=%s; Max-Age=%lld; HttpOnly; SameSite=Strict%s",
             CONSOLE_COOKIE, sid, CONSOLE_PREFIX, max_age,
             cs->cookie_secure ? "; Secure" : "");
}

static json_t *who_json(const struct console_who *who)
{
    return json_pack("{s:s, s:s, s:s}", "name", who->name, "role",
                     console_role_name(who->role), "csrf_token", who->csrf);
}

static enum MHD_Result serve_login(struct console *cs, console_views_t *v,
                                   struct MHD_Connection *c, struct request *rq)
{
    char secret[CONSOLE_SECRET_MAX], sid[CONSOLE_SECRET_SIZE], cookie[256];
    struct console_who who;
    struct charged_error err;

    if (console_input_login(rq->body, rq->len, secret, &err) != CHARGED_OK)
        return send_error(c, MHD_HTTP_BAD_REQUEST, err.message);
    enum charged_rc rc =
        console_store_login(console_views_store(v), secret, cs->ttl_s, sid, &who, &err);
    OPENSSL_cleanse(secret, sizeof(secret));
    if (rc == CHARGED_NOT_FOUND) {
        log_warn("console: sign-in refused", "reason", "unknown or revoked token",
                 NULL);
        return send_error(c, MHD_HTTP_UNAUTHORIZED, "unknown or revoked token");
    }
    if (rc != CHARGED_OK) {
        log_warn("console: sign-in failed", "error", err.message, NULL);
        return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "database unavailable");
    }
    console_store_record(console_views_store(v), who.name, "login", NULL, "ok", NULL,
                         &err);
    log_info("console: signed in", "actor", who.name, "role",
             console_role_name(who.role), NULL);
    session_cookie(cs, sid, cs->ttl_s, cookie, sizeof(cookie));
    OPENSSL_cleanse(sid, sizeof(sid));
    enum MHD_Result ret = send_json(c, MHD_HTTP_OK, who_json(&who), cookie);
    OPENSSL_cleanse(cookie, sizeof(cookie));
    return ret;
}

/* A state-changing request must come from the console's own page: JSON
 * (a form of another site cannot send it without a preflight nobody
 * answers), from this origin when the browser says where from. */
static const char *foreign_request(struct MHD_Connection *c)
{
    const char *type =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!type || strncasecmp(type, "application/json", 16) != 0)
        return "send the body as application/json";
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (origin) {
        const char *rest = !strncmp(origin, "http://", 7)    ? origin + 7
                           : !strncmp(origin, "https://", 8) ? origin + 8
                                                             : NULL;
        if (!rest || !host || strcmp(rest, host) != 0)
            return "cross-origin request refused";
    }
    return NULL;
}

static int csrf_matches(struct MHD_Connection *c, const struct console_who *who)
{
    const char *got = MHD_lookup_connection_value(c, MHD_HEADER_KIND, CSRF_HEADER);
    size_t n = strlen(who->csrf);
    return got && n > 0 && strlen(got) == n && CRYPTO_memcmp(got, who->csrf, n) == 0;
}

struct letter_args {
    struct console_letter_query q;
    struct charged_error why;
    int bad;
};

static enum MHD_Result take_letter_arg(void *cls, enum MHD_ValueKind kind,
                                       const char *key, const char *value)
{
    struct letter_args *a = cls;
    (void)kind;
    if (!a->bad && console_input_letter_param(key, value, &a->q, &a->why) != CHARGED_OK)
        a->bad = 1;
    return MHD_YES;
}

/* A signed-in request: who asks decides what may be answered. */
static enum MHD_Result serve_signed_in(struct console *cs, console_views_t *v,
                                       struct MHD_Connection *c, struct request *rq,
                                       const struct console_who *who, const char *sid)
{
    char cookie[256];
    struct charged_error err;
    json_t *body = NULL;
    unsigned status;

    switch (rq->m.route) {
    case CONSOLE_R_SESSION:
        return send_json(c, MHD_HTTP_OK, who_json(who), NULL);
    case CONSOLE_R_LOGOUT:
        /* A session that could not be ended is not called ended. */
        if (console_store_logout(console_views_store(v), sid, &err) != CHARGED_OK) {
            log_warn("console: sign-out failed", "actor", who->name, "error",
                     err.message, NULL);
            return send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                              "could not end the session; try again");
        }
        console_store_record(console_views_store(v), who->name, "logout", NULL, "ok",
                             NULL, &err);
        session_cookie(cs, "", 0, cookie, sizeof(cookie));
        return send_json(c, MHD_HTTP_OK, json_pack("{s:b}", "signed_out", 1), cookie);
    case CONSOLE_R_OVERVIEW:
        status = console_views_overview(v, &body);
        break;
    case CONSOLE_R_REVIEWS:
        status = console_views_reviews(v, &body);
        break;
    case CONSOLE_R_FIND: {
        char id[PROVIDER_ID_MAX];
        const char *raw = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "id");
        if (console_input_find_id(raw, id, &err) != CHARGED_OK)
            return send_error(c, MHD_HTTP_BAD_REQUEST, err.message);
        status = console_views_find(v, id, &body);
        break;
    }
    case CONSOLE_R_ATTEMPT:
        status = console_views_attempt(v, rq->m.id, &body);
        break;
    case CONSOLE_R_RESOLVE: {
        struct console_resolve_input in;
        if (console_input_resolve(rq->body, rq->len, rq->m.id, &in, &err) != CHARGED_OK)
            return send_error(c, MHD_HTTP_BAD_REQUEST, err.message);
        status = console_views_resolve(v, who, sid, rq->m.id, &in, &body);
        break;
    }
    case CONSOLE_R_STEP_RESOLVE: {
        struct console_step_resolve_input in;
        if (console_input_step_resolve(rq->body, rq->len, rq->m.id, &in, &err) !=
            CHARGED_OK)
            return send_error(c, MHD_HTTP_BAD_REQUEST, err.message);
        status =
            console_views_step_resolve(v, who, sid, rq->m.kind, rq->m.id, &in, &body);
        break;
    }
    case CONSOLE_R_LETTERS: {
        struct letter_args a;
        memset(&a, 0, sizeof(a));
        MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, take_letter_arg, &a);
        if (a.bad)
            return send_error(c, MHD_HTTP_BAD_REQUEST, a.why.message);
        status = console_views_letters(v, &a.q, &body);
        break;
    }
    case CONSOLE_R_LETTER:
        status = console_views_letter(v, rq->m.id, &body);
        break;
    case CONSOLE_R_REPLAY: {
        struct console_replay_input *in = malloc(sizeof(*in));
        if (!in)
            return MHD_NO;
        if (console_input_replay(rq->body, rq->len, in, &err) != CHARGED_OK) {
            free(in);
            return send_error(c, MHD_HTTP_BAD_REQUEST, err.message);
        }
        status = console_views_replay(v, who, in, &body);
        free(in);
        break;
    }
    case CONSOLE_R_ACTIONS:
        status = console_views_actions(v, &body);
        break;
    case CONSOLE_R_LIMITS:
        status = console_limits_show(
            config_str(cs->cfg, CONFIG_DATABASE_URL),
            config_str(cs->cfg, CONFIG_PROVIDER_BUDGET_ACCOUNT), &body);
        break;
    case CONSOLE_R_LIMITS_SET:
        status = console_limits_set(config_str(cs->cfg, CONFIG_DATABASE_URL),
                                    config_str(cs->cfg, CONFIG_PROVIDER_BUDGET_ACCOUNT),
                                    console_views_store(v), who->name, rq->body,
                                    rq->len, &body);
        break;
    default:
        return send_error(c, MHD_HTTP_NOT_FOUND, "no such endpoint");
    }
    return send_json(c, status, body, NULL);
}

/* What a route is called in the action log. */
static const char *action_name(enum console_route r)
{
    switch (r) {
    case CONSOLE_R_RESOLVE:
    case CONSOLE_R_STEP_RESOLVE:
        return "resolve";
    case CONSOLE_R_REPLAY:
        return "replay";
    case CONSOLE_R_LOGOUT:
        return "logout";
    case CONSOLE_R_LIMITS_SET:
        return "provider_limits";
    default:
        return "request";
    }
}

/* A signed-in operator's action refused at the door is an action too: it
 * goes to the log with its actor, then the 403. */
static enum MHD_Result refuse_action(console_views_t *v, struct MHD_Connection *c,
                                     const struct request *rq,
                                     const struct console_who *who, const char *why)
{
    struct charged_error err;
    json_t *detail = json_pack("{s:s}", "why", why);
    char *text = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
    log_warn("console: action refused", "actor", who->name, "action",
             action_name(rq->m.route), "reason", why, NULL);
    if (console_store_record(console_views_store(v), who->name,
                             action_name(rq->m.route), rq->m.id[0] ? rq->m.id : NULL,
                             "forbidden", text, &err) != CHARGED_OK)
        log_error("console: an action was not recorded", "actor", who->name, "error",
                  err.message, NULL);
    free(text);
    json_decref(detail);
    return send_error(c, MHD_HTTP_FORBIDDEN, why);
}

/* Routes that read Kafka, which may take its timeouts to answer while it is
 * down: at most half the threads serve them at once, so that the review
 * queue and the attempts, which need only the database, always have one. */
static int reads_kafka(enum console_route r)
{
    return r == CONSOLE_R_OVERVIEW || r == CONSOLE_R_LETTERS || r == CONSOLE_R_LETTER ||
           r == CONSOLE_R_REPLAY;
}

static enum MHD_Result serve(struct console *cs, struct MHD_Connection *c,
                             struct request *rq)
{
    char sid[CONSOLE_SECRET_MAX], cookie[256];
    struct console_who who;
    struct charged_error err;
    enum MHD_Result ret;
    const char *foreign = NULL;
    int kafka = 0;

    if (rq->m.route == CONSOLE_R_ASSET)
        return serve_asset(c, rq->m.id);
    if (rq->too_large)
        return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "body too large");
    int writes = console_input_route_writes(rq->m.route);
    if (writes)
        foreign = foreign_request(c);
    if (rq->m.route == CONSOLE_R_LOGIN && foreign) {
        /* Nobody is signed in yet: recorded as anonymous, where from. */
        console_views_t *lv = http_lender_take(cs->lender);
        const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
        json_t *detail = json_pack("{s:s, s:s?}", "why", foreign, "origin", origin);
        char *text = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
        if (text)
            card_data_mask_loose(text, strlen(text));
        log_warn("console: sign-in refused", "reason", foreign, NULL);
        if (console_store_record(console_views_store(lv), "anonymous", "login", NULL,
                                 "forbidden", text, &err) != CHARGED_OK)
            log_error("console: an action was not recorded", "action", "login", "error",
                      err.message, NULL);
        free(text);
        json_decref(detail);
        http_lender_give(cs->lender, lv);
        return send_error(c, MHD_HTTP_FORBIDDEN, foreign);
    }
    console_views_t *v = http_lender_take(cs->lender);
    sid[0] = '\0';
    if (rq->m.route == CONSOLE_R_LOGIN) {
        ret = serve_login(cs, v, c, rq);
        goto out;
    }
    if (console_input_cookie(MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Cookie"),
                             sid) != 0) {
        ret = send_error(c, MHD_HTTP_UNAUTHORIZED, "sign in first");
        goto out;
    }
    enum charged_rc rc = console_store_session(console_views_store(v), sid, &who, &err);
    if (rc == CHARGED_NOT_FOUND) {
        /* Expired, signed out, or its token revoked: the cookie goes too. */
        session_cookie(cs, "", 0, cookie, sizeof(cookie));
        ret = send_json(
            c, MHD_HTTP_UNAUTHORIZED,
            json_pack("{s:s}", "error", "session expired or revoked: sign in again"),
            cookie);
        goto out;
    }
    if (rc != CHARGED_OK) {
        log_warn("console: session look-up failed", "error", err.message, NULL);
        ret = send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "database unavailable");
        goto out;
    }
    if (foreign) {
        ret = refuse_action(v, c, rq, &who, foreign);
        goto out;
    }
    if (writes && !csrf_matches(c, &who)) {
        ret = refuse_action(v, c, rq, &who, "missing or wrong CSRF token");
        goto out;
    }
    if (writes && rq->m.route != CONSOLE_R_LOGOUT &&
        who.role != CONSOLE_ROLE_OPERATOR) {
        ret = refuse_action(v, c, rq, &who,
                            "a viewer's token cannot change anything: ask an operator");
        goto out;
    }
    /* Counted once signed in: no one without a session takes a slot. */
    if (reads_kafka(rq->m.route)) {
        if (atomic_fetch_add(&cs->kafka_requests, 1) >= cs->kafka_max) {
            atomic_fetch_sub(&cs->kafka_requests, 1);
            ret = send_error(c, MHD_HTTP_SERVICE_UNAVAILABLE,
                             "dead letters are being read for others right now; try "
                             "again in a moment");
            goto out;
        }
        kafka = 1;
    }
    ret = serve_signed_in(cs, v, c, rq, &who, sid);
out:
    OPENSSL_cleanse(sid, sizeof(sid));
    http_lender_give(cs->lender, v);
    if (kafka)
        atomic_fetch_sub(&cs->kafka_requests, 1);
    return ret;
}

static int take_chunk(struct request *rq, const char *data, size_t n)
{
    if (rq->too_large || rq->len + n > CONSOLE_MAX_BODY) {
        rq->too_large = 1;
        free(rq->body);
        rq->body = NULL;
        rq->len = 0;
        return 0;
    }
    char *b = realloc(rq->body, rq->len + n + 1);
    if (!b)
        return -1;
    rq->body = b;
    memcpy(rq->body + rq->len, data, n);
    rq->len += n;
    rq->body[rq->len] = '\0';
    return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **ctx)
{
    static const char not_allowed[] = "{\"error\":\"method not allowed\"}";
    struct console *cs = cls;
    struct request *rq = *ctx;
    enum MHD_Result ret;
    (void)version;

    if (!rq) {
        struct console_route_match m;
        if (!strcmp(url, "/")) {
            const char *headers[] = {MHD_HTTP_HEADER_LOCATION, CONSOLE_PREFIX "/",
                                     NULL};
            return http_reply_with(c, MHD_HTTP_FOUND, (char *)"", 0,
                                   MHD_RESPMEM_PERSISTENT, "text/plain; charset=utf-8",
                                   headers);
        }
        if (console_input_route(url, cs->review_kinds, &m) == CONSOLE_R_NONE)
            return send_error(c, MHD_HTTP_NOT_FOUND, "no such endpoint");
        if (strcmp(method, m.method) != 0)
            return send_bytes(c, MHD_HTTP_METHOD_NOT_ALLOWED, (char *)not_allowed,
                              sizeof(not_allowed) - 1, MHD_RESPMEM_PERSISTENT,
                              "application/json", NULL, m.method);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
                                                     MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > CONSOLE_MAX_BODY)
            return send_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "body too large");
        if (!(rq = calloc(1, sizeof(*rq))))
            return MHD_NO;
        rq->m = m;
        *ctx = rq;
        return MHD_YES;
    }
    if (*upload_size) {
        int failed = take_chunk(rq, upload, *upload_size);
        *upload_size = 0;
        return failed ? MHD_NO : MHD_YES;
    }
    http_lender_enter(cs->lender);
    ret = serve(cs, c, rq);
    http_lender_leave(cs->lender);
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

static const struct http_reply_log_as http_log_as = {"console listener", "detail"};

static enum charged_rc listen_http(struct console *cs, struct charged_error *err)
{
    const char *addr = config_str(cs->cfg, CONFIG_CONSOLE_ADDR);
    int fd = -1, port = 0;
    enum charged_rc rc = listen_socket_open("CONSOLE_ADDR", addr, &fd, &port, err);
    if (rc != CHARGED_OK)
        return rc;
    /* A thread per connection, not a pool: a request that waits on Kafka's
     * timeouts holds its own connection only, never the others a pool
     * thread would poll; CONSOLE_THREADS bounds the requests answered at
     * once (the lender), MAX_CONNECTIONS the threads. */
    cs->http = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC |
            MHD_USE_ERROR_LOG,
        0, NULL, NULL, on_request, cs, MHD_OPTION_EXTERNAL_LOGGER, http_reply_log,
        &http_log_as, MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS_PER_IP,
        MHD_OPTION_THREAD_STACK_SIZE, THREAD_STACK_BYTES, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_NOTIFY_COMPLETED, on_completed, cs,
        MHD_OPTION_END);
    if (!cs->http) {
        charged_error_set(err, "CONSOLE_ADDR: cannot start the listener on %s", addr);
        return CHARGED_RETRY;
    }
    /* The port actually bound, for CONSOLE_ADDR's port 0 (tests). */
    char listen[96];
    snprintf(listen, sizeof(listen), "%d", port);
    log_info("console listener started", "addr", addr, "port", listen, NULL);
    return CHARGED_OK;
}

static int64_t console_step(void *state, int64_t now)
{
    struct console *cs = state;
    struct charged_error err;
    if (now < cs->next_probe)
        return cs->next_probe;
    cs->next_probe = now + PROBE_INTERVAL_MS;
    int ok = attempt_store_ping(cs->probe, &err) == CHARGED_OK;
    if (ok != cs->db_ok)
        ok ? log_info("database reachable", NULL)
           : log_warn("database unreachable", "error", err.message, NULL);
    cs->db_ok = ok;
    return cs->next_probe;
}

static const char *console_not_ready(void *state)
{
    const struct console *cs = state;
    return cs->db_ok == 1 ? NULL : "database unreachable";
}

/* A second SIGTERM: give up the requests in hand. */
static int second_signal(void)
{
    return daemon_stopping() >= 2;
}

static size_t console_drain(void *state, int64_t deadline)
{
    struct console *cs = state;
    return http_lender_drain(cs->lender, cs->http, deadline, second_signal);
}

static void teardown(struct console *cs)
{
    if (!cs)
        return;
    if (cs->http)
        MHD_stop_daemon(cs->http);
    for (size_t i = 0; cs->views && i < cs->nviews; i++)
        console_views_free(cs->views[i]);
    free(cs->views);
    if (cs->budget.member)
        daemon_budget_leave(&cs->budget);
    http_lender_free(cs->lender);
    attempt_store_free(cs->probe);
    config_free(cs->cfg);
    free(cs);
}

static void console_finish(void *state, int flush_ms)
{
    (void)flush_ms;
    log_info("console stopped", NULL);
    teardown(state);
}

static enum charged_rc setup(struct console *cs, struct charged_error *err)
{
    cs->ttl_s = config_int(cs->cfg, CONFIG_CONSOLE_SESSION_TTL_S);
    const struct step_review_kind *r[PAYMENT_OPS_MAX];
    size_t nr = payment_ops_reviews(r);
    for (size_t i = 0; i < nr; i++)
        cs->review_kinds[i] = r[i]->noun;
    cs->review_kinds[nr] = NULL;
    cs->cookie_secure = (int)config_int(cs->cfg, CONFIG_CONSOLE_COOKIE_SECURE);
    cs->nviews = (size_t)config_int(cs->cfg, CONFIG_CONSOLE_THREADS);
    cs->kafka_max = cs->nviews > 1 ? (int)cs->nviews / 2 : 1;
    cs->views = calloc(cs->nviews, sizeof(*cs->views));
    if (!cs->views) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    if (!(cs->probe = attempt_store_new(config_str(cs->cfg, CONFIG_DATABASE_URL),
                                        "charged-console", err)))
        return CHARGED_GIVE_UP;
    for (size_t i = 0; i < cs->nviews; i++) {
        if (!(cs->views[i] = console_views_new(cs->cfg, err)))
            return CHARGED_GIVE_UP;
        /* A resolve's look-ups draw from the fleet's budget; one waits at
         * most CONSOLE_BUDGET_WAIT_MS, then says why it was not sent. */
        enum charged_rc rc =
            i == 0 ? daemon_budget_join(&cs->budget, cs->cfg, "console",
                                        BUDGET_PRIO_LOOKUP, CONSOLE_BUDGET_WAIT_MS,
                                        console_views_provider(cs->views[0]), err)
                   : CHARGED_OK;
        if (rc != CHARGED_OK)
            return rc;
        provider_client_set_gate(console_views_provider(cs->views[i]),
                                 budget_member_gate, budget_member_gate_charge,
                                 &cs->budget.caller);
    }
    if (!(cs->lender = http_lender_new((void *const *)cs->views, cs->nviews))) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    return listen_http(cs, err);
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: charged console\n\n"
            "Serves the operator console on CONSOLE_ADDR, apart from the api's\n"
            "webhook listener so that it can stay internal:\n"
            "  GET  " CONSOLE_PREFIX "/                the page (compiled in)\n"
            "  POST " CONSOLE_PREFIX "/api/login       sign in with a token from\n"
            "                                 chargectl console token add\n"
            "  GET  " CONSOLE_PREFIX
            "/api/...         overview, reviews, attempts, dead\n"
            "                                 letters, actions (docs/console.md)\n"
            "  POST " CONSOLE_PREFIX "/api/...         resolve a review, replay dead\n"
            "                                 letters: operators only, with the\n"
            "                                 session's " CSRF_HEADER " header\n"
            "SIGTERM: stop accepting, finish the requests in hand, exit 0.\n\n");
    config_print_help(out, CONFIG_ROLE_CONSOLE);
}

static enum charged_rc console_start(config_t *cfg, const char *id, void **state,
                                     struct charged_error *err)
{
    struct console *cs = calloc(1, sizeof(*cs));
    if (!cs) {
        config_free(cfg);
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    cs->cfg = cfg;
    snprintf(cs->id, sizeof(cs->id), "%s", id);
    cs->db_ok = -1;
    atomic_init(&cs->kafka_requests, 0);
    enum charged_rc rc = setup(cs, err);
    if (rc != CHARGED_OK) {
        teardown(cs);
        return rc;
    }
    log_info("console started", "console", cs->id, "listen",
             config_str(cfg, CONFIG_CONSOLE_ADDR), NULL);
    *state = cs;
    return CHARGED_OK;
}

const struct daemon_role_desc console_role = {
    .name = "console",
    .config_role = CONFIG_ROLE_CONSOLE,
    .usage = usage,
    .start = console_start,
    .step = console_step,
    .not_ready = console_not_ready,
    .drain = console_drain,
    .finish = console_finish,
};
