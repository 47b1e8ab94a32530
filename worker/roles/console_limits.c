#include "console_limits.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"
#include "log.h"
#include "utf8_text.h"

#define ACTION "provider_limits"

static unsigned answer(json_t **body, unsigned status, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    *body = json_pack("{s:s}", "error", text);
    return status;
}

static enum charged_rc refuse(struct charged_error *err, const char *what)
{
    charged_error_set(err, "%s", what);
    return CHARGED_BAD_ITEM;
}

/* A limit: an integer in 0..BUDGET_RPS_MAX. 0, or -1. */
static int rps(json_t *v, long long *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > BUDGET_RPS_MAX)
        return -1;
    *out = (long long)json_integer_value(v);
    return 0;
}

static enum charged_rc parse_classes(json_t *classes, struct budget_change *out,
                                     struct charged_error *err)
{
    const char *k;
    json_t *v;
    char name[41];
    if (!json_is_object(classes))
        return refuse(err, "\"classes\" must be an object of CLASS: N");
    json_object_foreach(classes, k, v)
    {
        int c = budget_class_parse(k);
        if (c < 0) {
            utf8_text_copy(name, sizeof(name), k);
            charged_error_set(err,
                              "no endpoint class \"%s\" (create, capture, refund, "
                              "retrieve, search, list)",
                              name);
            return CHARGED_BAD_ITEM;
        }
        if (rps(v, &out->to.class_rps[c]) != 0)
            return refuse(err, "a class's limit must be a whole number of requests/s, "
                               "0 (no limit) to 1000000");
        out->cls[c] = 1;
    }
    return CHARGED_OK;
}

enum charged_rc console_limits_parse(const char *request, size_t len,
                                     struct budget_change *out,
                                     struct charged_error *err)
{
    json_error_t e;
    const char *k;
    json_t *v;
    enum charged_rc rc = CHARGED_BAD_ITEM;
    CHARGED_ASSERT(out && err);
    memset(out, 0, sizeof(*out));
    charged_error_clear(err);
    json_t *doc =
        request && len ? json_loadb(request, len, JSON_REJECT_DUPLICATES, &e) : NULL;
    if (!json_is_object(doc)) {
        refuse(err, "the body must be a JSON object");
        goto out;
    }
    json_object_foreach(doc, k, v)
    {
        if (!strcmp(k, "classes")) {
            if (parse_classes(v, out, err) != CHARGED_OK)
                goto out;
        } else if (!strcmp(k, "global") || !strcmp(k, "audit_floor")) {
            int g = !strcmp(k, "global");
            if (rps(v, g ? &out->to.global_rps : &out->to.audit_floor_rps) != 0) {
                refuse(err, g ? "\"global\" must be a whole number of requests/s, "
                                "0 (no limit) to 1000000"
                              : "\"audit_floor\" must be a whole number of requests/s");
                goto out;
            }
            *(g ? &out->global : &out->audit_floor) = 1;
        } else {
            char name[41];
            utf8_text_copy(name, sizeof(name), k);
            charged_error_set(err, "unknown member \"%s\"", name);
            goto out;
        }
    }
    int any = out->global || out->audit_floor;
    for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
        any |= out->cls[c];
    if (!any) {
        refuse(err,
               "nothing to change: give \"global\", \"classes\" or \"audit_floor\"");
        goto out;
    }
    rc = CHARGED_OK;
out:
    json_decref(doc);
    return rc;
}

/* The account the fleet draws from (PROVIDER_BUDGET_ACCOUNT, as every
 * role's member joins): "default" here showed and set a budget nobody
 * followed on a fleet configured otherwise (adversary 38f). */
static budget_lease_t *open_budget(const char *database_url, const char *account,
                                   struct charged_error *err)
{
    return budget_lease_new(database_url, account, "console", BUDGET_LEASE_MS, err);
}

unsigned console_limits_show(const char *database_url, const char *account,
                             json_t **body)
{
    struct charged_error err;
    json_t *settings = NULL, *members = NULL;
    unsigned status;
    CHARGED_ASSERT(database_url && account && body);
    budget_lease_t *l = open_budget(database_url, account, &err);
    if (!l)
        return answer(body, 500, "%s", err.message);
    enum charged_rc rc = budget_lease_show(l, &settings, &members, &err);
    if (rc == CHARGED_OK) {
        /* The classes in the order of a member's shares (the page draws
         * them as the budget names them). */
        json_t *names = json_array();
        for (int c = 0; c < BUDGET_CLASS_COUNT; c++)
            json_array_append_new(names, json_string(budget_class_name(c)));
        json_object_set_new(settings, "class_names", names);
        json_object_set_new(settings, "members", members);
        *body = settings;
        status = 200;
    } else {
        log_warn("console: a read failed", "what", "provider limits", "error",
                 err.message, NULL);
        status = answer(body, rc == CHARGED_NOT_FOUND ? 404 : 503,
                        "provider limits unavailable: %s", err.message);
    }
    budget_lease_free(l);
    return status;
}

/* One row of the console's action log; a failure to write it is logged
 * (the change itself is in provider_budget_changes with its actor). */
static void record(console_store_t *cs, const char *actor, const char *account,
                   const char *outcome, json_t *detail)
{
    struct charged_error err;
    char *text = detail ? json_dumps(detail, JSON_COMPACT) : NULL;
    if (console_store_record(cs, actor, ACTION, account, outcome, text, &err) !=
        CHARGED_OK)
        log_error("console: an action was not recorded", "actor", actor, "action",
                  ACTION, "error", err.message, NULL);
    free(text);
}

unsigned console_limits_set(const char *database_url, const char *account,
                            console_store_t *cs, const char *actor, const char *request,
                            size_t len, json_t **body)
{
    struct budget_change change;
    struct charged_error err;
    json_t *after = NULL;
    unsigned status;
    CHARGED_ASSERT(database_url && account && cs && actor && body);
    if (console_limits_parse(request, len, &change, &err) != CHARGED_OK)
        return answer(body, 400, "%s", err.message);
    /* A token's name may be longer than the budget's record of its actor
     * holds: refused rather than cut, so that the record names one token. */
    if (strlen(actor) > BUDGET_NAME_MAX) {
        status = answer(body, 422,
                        "a token name over %d bytes cannot be recorded as the actor of "
                        "a limit change: sign in with a shorter one",
                        BUDGET_NAME_MAX);
        record(cs, actor, account, "refused", *body);
        return status;
    }
    budget_lease_t *l = open_budget(database_url, account, &err);
    if (!l)
        return answer(body, 500, "%s", err.message);
    enum charged_rc rc = budget_lease_set(l, &change, actor, &after, &err);
    budget_lease_free(l);
    if (rc == CHARGED_OK) {
        json_t *detail = json_pack("{s:O}", "after", after);
        record(cs, actor, account, "ok", detail);
        json_decref(detail);
        log_info("console: provider limits set", "actor", actor, NULL);
        *body = after;
        return 200;
    }
    status = rc == CHARGED_BAD_ITEM ? 422 : rc == CHARGED_NOT_FOUND ? 404 : 503;
    status = answer(body, status, "%s", err.message);
    json_t *why = json_pack("{s:O}", "error", json_object_get(*body, "error"));
    record(cs, actor, account, status == 503 ? "failed" : "refused", why);
    json_decref(why);
    return status;
}
