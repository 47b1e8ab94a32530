/* psp_admin: the admin API (ledger, reset, faults, settings, settlements,
 * injections, webhooks), on its own port without auth. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include "psp_sim.h"

/* ---- the admin API ---- */

/* "<prefix><id><suffix>" -> <id> (a copy) when id is not empty and holds
 * no '/', else NULL. */
static char *path_id(const char *url, const char *prefix, const char *suffix)
{
    size_t pl = strlen(prefix), sl = strlen(suffix), n = strlen(url);
    if (n <= pl + sl || strncmp(url, prefix, pl) != 0 ||
        strcmp(url + n - sl, suffix) != 0)
        return NULL;
    char *id = strndup(url + pl, n - pl - sl);
    if (id && strchr(id, '/')) {
        free(id);
        return NULL;
    }
    return id;
}

/* POST /refunds/<id>/settle {"status":"succeeded"|"failed",
 * "failure_reason":...} */
static enum MHD_Result settle_refund(struct req *r, const char *id)
{
    struct psp_answer ans = {0};
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr), *v;
    json_t *why = json_object_get(body, "failure_reason");
    const char *k, *reason = json_string_value(why);
    size_t n = reason ? strlen(reason) : 0;

    if (!json_is_object(body)) {
        json_decref(body);
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                     "body must be a JSON object");
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "status") && strcmp(k, "failure_reason")) {
            json_decref(body);
            return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                         "members: status, failure_reason");
        }
    }
    /* It goes into every answer about the refund: Stripe's shape only. */
    if (why && !json_is_null(why) &&
        (n < 1 || n > 64 ||
         strspn(reason, "abcdefghijklmnopqrstuvwxyz0123456789_") != n)) {
        json_decref(body);
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                     "failure_reason must be 1..64 of a-z, 0-9 and _");
    }
    psp_store_refund_settle(psp_sim_store, id,
                            json_string_value(json_object_get(body, "status")), reason,
                            psp_sim_now_ms(), &ans);
    json_decref(body);
    return psp_sim_respond(r->conn, ans.status, ans.body, 0);
}

/* POST /intents/<id>/settle {"status":..., "decline_code":...} */
static enum MHD_Result settle_intent(struct req *r, const char *id)
{
    char err[256];
    struct psp_settlement set;
    struct psp_answer ans = {0};
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);

    if (!body || psp_settlement_parse(body, &set, err, sizeof(err)) != 0) {
        json_decref(body);
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                     body ? err : "body is not JSON");
    }
    psp_store_settle(psp_sim_store, id, &set, psp_sim_now_ms(), &ans);
    json_decref(body);
    return psp_sim_respond(r->conn, ans.status, ans.body, 0);
}

/* The admin calls whose JSON body the store checks itself. */
enum store_call { CALL_INJECT_INTENTS, CALL_INJECT_REFUND, CALL_AMEND };

static enum MHD_Result with_json_body(struct req *r, enum store_call call,
                                      const char *id)
{
    struct psp_answer ans = {0};
    json_error_t jerr;
    json_t *body;

    if (r->too_large)
        return psp_sim_respond_error(r->conn, 413, "invalid_request_error",
                                     "Request too large.");
    if (!(body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr)))
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                     "body is not JSON");
    switch (call) {
    case CALL_INJECT_INTENTS:
        psp_store_inject_intents(psp_sim_store, body, psp_sim_now_ms(), &ans);
        break;
    case CALL_INJECT_REFUND:
        psp_store_inject_refund(psp_sim_store, body, psp_sim_now_ms(), &ans);
        break;
    case CALL_AMEND:
        psp_store_amend(psp_sim_store, id, body, psp_sim_now_ms(), &ans);
        break;
    }
    json_decref(body);
    return psp_sim_respond(r->conn, ans.status, ans.body, 0);
}

/* PUT /<name> {"<member>": <integer in min..max>}: one delay setting. */
static enum MHD_Result put_ms(struct req *r, const char *member, json_int_t min,
                              json_int_t max, void (*set)(psp_store_t *, int64_t))
{
    json_error_t jerr;
    json_t *cfg = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
    json_t *ms = json_object_get(cfg, member);
    if (!json_is_integer(ms) || json_integer_value(ms) < min ||
        json_integer_value(ms) > max) {
        char err[160];
        snprintf(err, sizeof(err), "body must be {\"%s\": <integer %lld..%lld>}",
                 member, (long long)min, (long long)max);
        json_decref(cfg);
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error", err);
    }
    set(psp_sim_store, json_integer_value(ms));
    json_decref(cfg);
    return psp_sim_respond_json(r->conn, 200, json_pack("{s:b}", "ok", 1));
}

/* A delay in 0..86400000 ms. */
static enum MHD_Result put_delay(struct req *r, const char *member,
                                 void (*set)(psp_store_t *, int64_t))
{
    return put_ms(r, member, 0, 86400000, set);
}

/* As the intent would be had it entered `status`: crafted events may
 * contradict what psp-sim knows. */
static void override_status(json_t *pi, const char *status)
{
    const char *now = json_string_value(json_object_get(pi, "status"));
    if (now && !strcmp(now, status))
        return;
    json_object_set_new(pi, "status", json_string(status));
    if (!strcmp(status, "requires_payment_method")) {
        if (!json_is_object(json_object_get(pi, "last_payment_error")))
            json_object_set_new(pi, "last_payment_error",
                                json_pack("{s:s, s:s, s:s, s:s}", "type", "card_error",
                                          "code", "card_declined", "decline_code",
                                          "generic_decline", "message",
                                          "Your card was declined."));
    } else {
        json_object_set_new(pi, "last_payment_error", json_null());
    }
    if (!strcmp(status, "canceled"))
        json_object_set_new(pi, "canceled_at", json_integer(psp_sim_now_ms() / 1000));
}

/* Event ids go into logs: printable ASCII without spaces, 1..255. */
static int event_id_valid(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] <= 0x20 || s[i] >= 0x7f)
            return 0;
    return n >= 1 && n <= 255;
}

/* POST /webhooks/emit {"intent":"pi_..." or "object":{...}, "type":...,
 * "created":<unix>, "id":"evt_..."}: a crafted event, queued as any other. */
static enum MHD_Result emit_event(struct req *r)
{
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
    json_t *pi = NULL, *v, *object = json_object_get(body, "object");
    json_t *intent = json_object_get(body, "intent");
    const char *k, *type = json_string_value(json_object_get(body, "type"));
    const char *status = psp_webhooks_status_for_type(type), *id = NULL;
    json_int_t created = psp_sim_now_ms() / 1000;
    char err[200] = "", evt[300];
    int http = 400;
    enum MHD_Result rc;

    if (!json_is_object(body)) {
        snprintf(err, sizeof(err), "body must be a JSON object");
        goto out;
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "intent") && strcmp(k, "object") && strcmp(k, "type") &&
            strcmp(k, "created") && strcmp(k, "id")) {
            snprintf(err, sizeof(err), "unknown member '%.64s'", k);
            goto out;
        }
    }
    if (!status) {
        snprintf(err, sizeof(err),
                 "type must be payment_intent.succeeded, payment_intent.processing, "
                 "payment_intent.payment_failed, payment_intent.canceled or "
                 "payment_intent.amount_capturable_updated");
        goto out;
    }
    if ((v = json_object_get(body, "created")) != NULL) {
        if (!json_is_integer(v) || json_integer_value(v) < 0) {
            snprintf(err, sizeof(err),
                     "created must be an integer >= 0 (unix seconds)");
            goto out;
        }
        created = json_integer_value(v);
    }
    if ((v = json_object_get(body, "id")) != NULL &&
        !event_id_valid(id = json_string_value(v))) {
        snprintf(err, sizeof(err),
                 "id must be 1..255 printable ASCII characters without spaces");
        goto out;
    }
    if (!intent == !object || (intent && !json_is_string(intent)) ||
        (object && !json_is_object(object))) {
        snprintf(err, sizeof(err),
                 "give either intent (a payment intent id) or object (a PaymentIntent "
                 "object)");
        goto out;
    }
    if (object) {
        pi = json_incref(object); /* sent as given, about any intent */
    } else {
        struct psp_answer ans = {0};
        psp_store_retrieve(psp_sim_store, json_string_value(intent), psp_sim_now_ms(),
                           &ans);
        if (ans.status != 200) {
            json_decref(body);
            return psp_sim_respond(r->conn, ans.status, ans.body, 0);
        }
        pi = json_loads(ans.body, 0, &jerr);
        free(ans.body);
        if (!pi) {
            http = 500;
            snprintf(err, sizeof(err), "out of memory");
            goto out;
        }
        override_status(pi, status);
    }
    switch (psp_webhooks_enqueue(psp_sim_webhooks, type, pi, created, id, evt,
                                 sizeof(evt))) {
    case PSP_WH_QUEUED: {
        /* type points into body: the answer is made before body goes. */
        json_t *ans = json_pack("{s:s, s:s}", "id", evt, "type", type);
        json_decref(pi);
        json_decref(body);
        return psp_sim_respond_json(r->conn, 200, ans);
    }
    case PSP_WH_DISABLED:
        http = 409;
        snprintf(err, sizeof(err),
                 "psp-sim runs without --webhook-url: it sends no events");
        break;
    case PSP_WH_DROPPED:
        http = 503;
        snprintf(err, sizeof(err), "the webhook queue is full: the event was dropped");
        break;
    }
out:
    rc = psp_sim_respond_error(r->conn, http, "invalid_request_error", err);
    json_decref(pi);
    json_decref(body);
    return rc;
}

/* POST /webhook-secret {"secret":"...","keep_old":true|false}. Nothing
 * about the body is echoed: it holds a secret. */
static enum MHD_Result rotate_secret(struct req *r)
{
    json_error_t jerr;
    json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr), *v;
    json_t *keep = json_object_get(body, "keep_old");
    const char *k;
    char err[160] = "";

    if (!json_is_object(body)) {
        snprintf(err, sizeof(err), "body must be a JSON object");
        goto out;
    }
    json_object_foreach(body, k, v)
    {
        if (strcmp(k, "secret") && strcmp(k, "keep_old")) {
            snprintf(err, sizeof(err), "unknown member '%.64s'", k);
            goto out;
        }
    }
    if (keep && !json_is_boolean(keep)) {
        snprintf(err, sizeof(err), "keep_old must be true or false");
        goto out;
    }
    if (psp_webhooks_rotate(psp_sim_webhooks,
                            json_string_value(json_object_get(body, "secret")),
                            json_is_true(keep), err, sizeof(err)) != 0)
        goto out;
    json_decref(body);
    json_t *stats = psp_webhooks_stats_json(psp_sim_webhooks);
    json_t *ans = json_pack("{s:b, s:O}", "ok", 1, "signing_secrets",
                            json_object_get(stats, "signing_secrets"));
    json_decref(stats);
    return psp_sim_respond_json(r->conn, 200, ans);
out:
    json_decref(body);
    return psp_sim_respond_error(r->conn, 400, "invalid_request_error", err);
}

/* GET /webhooks/events?limit=N (1..1000, default 100) */
static enum MHD_Result list_events(struct req *r)
{
    const char *s =
        MHD_lookup_connection_value(r->conn, MHD_GET_ARGUMENT_KIND, "limit");
    long limit = 100;
    if (s && psp_sim_parse_long(s, 1, 1000, &limit) != 0)
        return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                     "limit must be an integer in 1..1000");
    return psp_sim_respond_json(
        r->conn, 200, psp_webhooks_events_json(psp_sim_webhooks, (size_t)limit));
}

/* GET /rate-limits, and PUT /rate-limits with the whole configuration
 * (psp_limits_config_from_json): all of it at once, or nothing. */
static enum MHD_Result rate_limits(struct req *r, int put)
{
    char err[256];
    json_error_t jerr;
    struct psp_limits_config cfg;

    if (put && r->too_large)
        return psp_sim_respond_error(r->conn, 413, "invalid_request_error",
                                     "Request too large.");
    if (put) {
        json_t *body = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
        int rc = body ? psp_limits_config_from_json(body, &cfg, err, sizeof(err)) : -1;
        if (!body)
            snprintf(err, sizeof(err), "body is not JSON");
        json_decref(body);
        if (rc != 0)
            return psp_sim_respond_error(r->conn, 400, "invalid_request_error", err);
        psp_limits_set(psp_sim_limits, &cfg, psp_sim_mono_ms());
    }
    return psp_sim_respond_json(
        r->conn, 200,
        psp_limits_json(psp_sim_limits, psp_sim_mono_ms(), psp_sim_now_ms()));
}

/* The store's ledger, its counters with what the limiter throttled. */
static json_t *ledger(void)
{
    json_t *l = psp_store_ledger_json(psp_sim_store, psp_sim_now_ms());
    json_object_set_new(json_object_get(l, "counters"), "throttled",
                        psp_limits_throttled_json(psp_sim_limits));
    return l;
}

enum MHD_Result psp_sim_admin_api(struct req *r, const char *url, const char *method)
{
    char err[256], *target;
    if (!strcmp(url, "/health"))
        return psp_sim_respond_json(r->conn, 200, json_pack("{s:b}", "ok", 1));
    if (!strcmp(url, "/ledger") && !strcmp(method, "GET"))
        return psp_sim_respond_json(r->conn, 200, ledger());
    if (!strcmp(url, "/reset") && !strcmp(method, "POST")) {
        psp_store_reset(psp_sim_store);
        psp_webhooks_reset(psp_sim_webhooks);
        psp_limits_reset(psp_sim_limits, psp_sim_mono_ms());
        return psp_sim_respond_json(r->conn, 200, json_pack("{s:b}", "reset", 1));
    }
    if (!strcmp(url, "/faults") && !strcmp(method, "GET"))
        return psp_sim_respond_json(r->conn, 200, psp_faults_json(psp_sim_faults));
    if (!strcmp(url, "/faults") && (!strcmp(method, "PUT") || !strcmp(method, "POST") ||
                                    !strcmp(method, "DELETE"))) {
        json_error_t jerr;
        json_t *cfg = !strcmp(method, "DELETE")
                          ? json_object()
                          : json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
        if (!cfg)
            return psp_sim_respond_error(r->conn, 400, "invalid_request_error",
                                         "body is not JSON");
        int rc = psp_faults_configure(psp_sim_faults, cfg, err, sizeof(err));
        json_decref(cfg);
        if (rc != 0)
            return psp_sim_respond_error(r->conn, 400, "invalid_request_error", err);
        return psp_sim_respond_json(r->conn, 200, psp_faults_json(psp_sim_faults));
    }
    if (!strcmp(url, "/rate-limits") &&
        (!strcmp(method, "GET") || !strcmp(method, "PUT")))
        return rate_limits(r, !strcmp(method, "PUT"));
    if (!strcmp(url, "/retention") && !strcmp(method, "PUT")) {
        json_error_t jerr;
        json_t *cfg = json_loadb(r->body ? r->body : "", r->len, 0, &jerr);
        json_t *ms = json_object_get(cfg, "key_retention_ms");
        if (!json_is_integer(ms) || json_integer_value(ms) < 0) {
            json_decref(cfg);
            return psp_sim_respond_error(
                r->conn, 400, "invalid_request_error",
                "body must be {\"key_retention_ms\": <integer >= 0>}");
        }
        psp_store_set_retention(psp_sim_store, json_integer_value(ms));
        json_decref(cfg);
        return psp_sim_respond_json(r->conn, 200, json_pack("{s:b}", "ok", 1));
    }
    if (!strcmp(url, "/search-lag") && !strcmp(method, "PUT"))
        return put_delay(r, "search_lag_ms", psp_store_set_search_lag);
    if (!strcmp(url, "/processing-settle") && !strcmp(method, "PUT"))
        return put_delay(r, "processing_settle_ms", psp_store_set_processing_settle);
    if (!strcmp(url, "/webhooks") && !strcmp(method, "GET"))
        return psp_sim_respond_json(r->conn, 200,
                                    psp_webhooks_stats_json(psp_sim_webhooks));
    if (!strcmp(url, "/webhooks/events") && !strcmp(method, "GET"))
        return list_events(r);
    if (!strcmp(url, "/webhooks/emit") && !strcmp(method, "POST"))
        return emit_event(r);
    if (!strcmp(url, "/webhook-secret") && !strcmp(method, "POST"))
        return rotate_secret(r);
    if (!strcmp(url, "/authorization-expiry") && !strcmp(method, "PUT"))
        return put_ms(r, "authorization_expiry_ms", 1, PSP_AUTHORIZATION_EXPIRY_MAX_MS,
                      psp_store_set_authorization_expiry);
    if (!strcmp(url, "/refund-settle") && !strcmp(method, "PUT"))
        return put_delay(r, "refund_settle_ms", psp_store_set_refund_settle);
    if (!strcmp(url, "/inject/intents") && !strcmp(method, "POST"))
        return with_json_body(r, CALL_INJECT_INTENTS, NULL);
    if (!strcmp(url, "/inject/refunds") && !strcmp(method, "POST"))
        return with_json_body(r, CALL_INJECT_REFUND, NULL);
    if (!strcmp(method, "POST") &&
        (target = path_id(url, "/refunds/", "/settle")) != NULL) {
        enum MHD_Result rc = settle_refund(r, target);
        free(target);
        return rc;
    }
    if (!strcmp(method, "POST") &&
        (target = path_id(url, "/intents/", "/settle")) != NULL) {
        enum MHD_Result rc = settle_intent(r, target);
        free(target);
        return rc;
    }
    if (!strcmp(method, "POST") &&
        (target = path_id(url, "/intents/", "/amend")) != NULL) {
        enum MHD_Result rc = with_json_body(r, CALL_AMEND, target);
        free(target);
        return rc;
    }
    if (!strcmp(method, "DELETE") && (target = path_id(url, "/intents/", "")) != NULL) {
        struct psp_answer ans = {0};
        psp_store_delete(psp_sim_store, target, &ans);
        free(target);
        return psp_sim_respond(r->conn, ans.status, ans.body, 0);
    }
    return psp_sim_respond_error(r->conn, 404, "invalid_request_error",
                                 "no such admin endpoint");
}
