#include "console_input.h"

#include <ctype.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "charged_assert.h"
#include "charge_command.h"
#include "dead_letter_reason.h"
#include "decimal.h"
#include "provider_outcome.h"
#include "utf8_text.h"

#define API "/console/api/"

/* The request is refused for good: CHARGED_BAD_ITEM, why in err (an
 * answer's text, so never a value of the request's but a name). */
static enum charged_rc refuse(struct charged_error *err, const char *fmt, ...)
{
    va_list ap;
    CHARGED_ASSERT(err && fmt);
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    err->code[0] = '\0';
    return CHARGED_BAD_ITEM;
}

static int intent_id_ok(const char *s, size_t n)
{
    if (n == 0 || n >= PROVIDER_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == '_' || isalnum((unsigned char)s[i])))
            return 0;
    return 1;
}

static int lower_uuid(const char *s, size_t n, char out[37])
{
    char tmp[37];
    CHARGED_ASSERT(out);
    if (n != 36)
        return -1;
    memcpy(tmp, s, 36);
    tmp[36] = '\0';
    if (!charge_command_is_uuid(tmp))
        return -1;
    for (int i = 0; i < 37; i++)
        out[i] = (char)tolower((unsigned char)tmp[i]);
    return 0;
}

static const struct {
    const char *path;
    enum console_route route;
} fixed_routes[] = {
    {API "login", CONSOLE_R_LOGIN},
    {API "logout", CONSOLE_R_LOGOUT},
    {API "session", CONSOLE_R_SESSION},
    {API "overview", CONSOLE_R_OVERVIEW},
    {API "reviews", CONSOLE_R_REVIEWS},
    {API "attempts", CONSOLE_R_FIND},
    {API "dead-letters", CONSOLE_R_LETTERS},
    {API "dead-letters/replay", CONSOLE_R_REPLAY},
    {API "actions", CONSOLE_R_ACTIONS},
    {API "provider-limits", CONSOLE_R_LIMITS},
    {API "provider-limits/set", CONSOLE_R_LIMITS_SET},
};

/* The page's files: a name of letters, digits, '-', '.', not starting with
 * a dot. */
static int asset_name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 48 || s[0] == '.')
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '-' || s[i] == '.'))
            return 0;
    return 1;
}

int console_input_route_writes(enum console_route r)
{
    return r == CONSOLE_R_LOGIN || r == CONSOLE_R_LOGOUT || r == CONSOLE_R_RESOLVE ||
           r == CONSOLE_R_REPLAY || r == CONSOLE_R_STEP_RESOLVE ||
           r == CONSOLE_R_LIMITS_SET;
}

static enum console_route found(struct console_route_match *m, enum console_route r)
{
    CHARGED_ASSERT(m && r != CONSOLE_R_NONE);
    m->route = r;
    m->method = console_input_route_writes(r) ? "POST" : "GET";
    return r;
}

/* "<kind>/<uuid>/resolve", after API "steps/": a step's review. */
static enum console_route step_route(const char *rest, const char *const *kinds,
                                     struct console_route_match *m)
{
    static const char resolve[] = "/resolve";
    CHARGED_ASSERT(kinds);
    for (size_t i = 0; kinds[i]; i++) {
        CHARGED_ASSERT(strlen(kinds[i]) < sizeof(m->kind));
        size_t kn = strlen(kinds[i]), n = strlen(rest);
        if (strncmp(rest, kinds[i], kn) != 0 || rest[kn] != '/')
            continue;
        const char *id = rest + kn + 1;
        size_t idn = n - kn - 1, rn = sizeof(resolve) - 1;
        if (idn <= rn || strcmp(id + idn - rn, resolve) != 0 ||
            lower_uuid(id, idn - rn, m->id) != 0)
            return CONSOLE_R_NONE;
        snprintf(m->kind, sizeof(m->kind), "%s", kinds[i]);
        return found(m, CONSOLE_R_STEP_RESOLVE);
    }
    return CONSOLE_R_NONE;
}

enum console_route console_input_route(const char *path, const char *const *kinds,
                                       struct console_route_match *m)
{
    static const char attempts[] = API "attempts/", letters[] = API "dead-letters/",
                      resolve[] = "/resolve", steps[] = API "steps/";
    CHARGED_ASSERT(m);
    memset(m, 0, sizeof(*m));
    m->route = CONSOLE_R_NONE;
    if (!path)
        return CONSOLE_R_NONE;
    size_t n = strlen(path);
    if (!strcmp(path, CONSOLE_PREFIX) || !strcmp(path, CONSOLE_PREFIX "/")) {
        snprintf(m->id, sizeof(m->id), "index.html");
        return found(m, CONSOLE_R_ASSET);
    }
    for (size_t i = 0; i < sizeof(fixed_routes) / sizeof(fixed_routes[0]); i++)
        if (!strcmp(path, fixed_routes[i].path))
            return found(m, fixed_routes[i].route);
    if (!strncmp(path, attempts, sizeof(attempts) - 1)) {
        const char *id = path + sizeof(attempts) - 1;
        size_t idn = n - (sizeof(attempts) - 1), rn = sizeof(resolve) - 1;
        int writes = idn > rn && !strcmp(id + idn - rn, resolve);
        if (lower_uuid(id, writes ? idn - rn : idn, m->id) != 0)
            return CONSOLE_R_NONE;
        return found(m, writes ? CONSOLE_R_RESOLVE : CONSOLE_R_ATTEMPT);
    }
    if (!strncmp(path, steps, sizeof(steps) - 1))
        return step_route(path + sizeof(steps) - 1, kinds, m);
    if (!strncmp(path, letters, sizeof(letters) - 1)) {
        const char *pos = path + sizeof(letters) - 1;
        int32_t p;
        int64_t o;
        if (console_input_position(pos, &p, &o) != 0)
            return CONSOLE_R_NONE;
        snprintf(m->id, sizeof(m->id), "%d:%lld", (int)p, (long long)o);
        return found(m, CONSOLE_R_LETTER);
    }
    if (!strncmp(path, CONSOLE_PREFIX "/", sizeof(CONSOLE_PREFIX)) &&
        asset_name_ok(path + sizeof(CONSOLE_PREFIX))) {
        snprintf(m->id, sizeof(m->id), "%s", path + sizeof(CONSOLE_PREFIX));
        return found(m, CONSOLE_R_ASSET);
    }
    return CONSOLE_R_NONE;
}

/* Parses a JSON object body; NULL with err when it is not one. */
static json_t *object_body(const char *body, size_t len, struct charged_error *err)
{
    json_error_t e;
    if (!body || len == 0) {
        refuse(err, "the body must be a JSON object");
        return NULL;
    }
    if (len > CONSOLE_MAX_BODY) {
        refuse(err, "the body is over %d bytes", CONSOLE_MAX_BODY);
        return NULL;
    }
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &e);
    if (!doc || !json_is_object(doc)) {
        refuse(err, "the body must be a JSON object");
        json_decref(doc);
        return NULL;
    }
    return doc;
}

/* CHARGED_BAD_ITEM with err when doc has a member not in the
 * NULL-terminated known. */
static enum charged_rc only_known(json_t *doc, const char *const *known,
                                  struct charged_error *err)
{
    const char *k;
    json_t *v;
    json_object_foreach(doc, k, v)
    {
        size_t i = 0;
        while (known[i] && strcmp(known[i], k) != 0)
            i++;
        if (!known[i]) {
            /* Quoted as text that reads as it is, cut between characters:
             * a refusal must always be an answer (valid UTF-8). */
            char name[41];
            utf8_text_copy(name, sizeof(name), k);
            return refuse(err, "unknown member \"%s\"", name);
        }
    }
    return CHARGED_OK;
}

/* A string member copied into out (size bytes with its NUL): 1 copied, 0
 * absent, -1 present but not a string or too long. */
static int member_string(json_t *doc, const char *name, char *out, size_t size)
{
    json_t *v = json_object_get(doc, name);
    CHARGED_ASSERT(out && size > 0);
    if (!v)
        return 0;
    if (!json_is_string(v) || json_string_length(v) >= size)
        return -1;
    memcpy(out, json_string_value(v), json_string_length(v));
    out[json_string_length(v)] = '\0';
    if (strlen(out) != json_string_length(v))
        return -1; /* a NUL inside */
    return 1;
}

/* A boolean member: 1/0, or -1 when present and not a boolean; absent is
 * `absent`. */
static int member_bool(json_t *doc, const char *name, int absent)
{
    json_t *v = json_object_get(doc, name);
    if (!v)
        return absent;
    return json_is_boolean(v) ? json_is_true(v) : -1;
}

static int secret_ok(const char *s)
{
    size_t n = strlen(s);
    if (n < 8 || n >= CONSOLE_SECRET_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-'))
            return 0;
    return 1;
}

enum charged_rc console_input_login(const char *body, size_t len,
                                    char secret[CONSOLE_SECRET_MAX],
                                    struct charged_error *err)
{
    static const char *const known[] = {"token", NULL};
    enum charged_rc rc = CHARGED_BAD_ITEM;
    CHARGED_ASSERT(secret);
    json_t *doc = object_body(body, len, err);
    if (!doc || only_known(doc, known, err) != CHARGED_OK)
        goto out;
    if (member_string(doc, "token", secret, CONSOLE_SECRET_MAX) != 1 ||
        !secret_ok(secret)) {
        refuse(err, "\"token\" must be a console token (cct_...)");
        goto out;
    }
    rc = CHARGED_OK;
out:
    json_decref(doc);
    if (rc != CHARGED_OK)
        memset(secret, 0, CONSOLE_SECRET_MAX);
    return rc;
}

/* "force" and "confirm": force needs confirm to repeat id (the `noun` the
 * path names). 0, or -1 refused. */
static int forced(json_t *doc, const char *id, const char *noun, int *force,
                  char *confirm, size_t confirm_size, struct charged_error *err)
{
    if ((*force = member_bool(doc, "force", 0)) < 0)
        return refuse(err, "\"force\" must be true or false"), -1;
    int got = member_string(doc, "confirm", confirm, confirm_size);
    if (got < 0)
        return refuse(err, "\"confirm\" must be the %s", noun), -1;
    if (*force && (got != 1 || !id || strcasecmp(confirm, id)))
        return refuse(err,
                      "\"force\" resolves over the provider's objection: "
                      "confirm it by giving the %s as \"confirm\"",
                      noun),
               -1;
    return 0;
}

enum charged_rc console_input_step_resolve(const char *body, size_t len, const char *id,
                                           struct console_step_resolve_input *out,
                                           struct charged_error *err)
{
    static const char *const known[] = {"decision", "reason", "force", "confirm", NULL};
    static const char *const decisions[] = {"succeeded", "failed", "authorized",
                                            "voided", NULL};
    enum charged_rc rc = CHARGED_BAD_ITEM;
    CHARGED_ASSERT(out);
    memset(out, 0, sizeof(*out));
    json_t *doc = object_body(body, len, err);
    if (!doc || only_known(doc, known, err) != CHARGED_OK)
        goto out;
    int d = member_string(doc, "decision", out->decision, sizeof(out->decision)) == 1
                ? 0
                : -1;
    while (d >= 0 && decisions[d] && strcmp(decisions[d], out->decision) != 0)
        d++;
    if (d < 0 || !decisions[d]) {
        refuse(err, "\"decision\" must be \"succeeded\", \"failed\", "
                    "\"authorized\" or \"voided\"");
        goto out;
    }
    for (char *p = out->decision; *p; p++)
        *p = (char)toupper((unsigned char)*p);
    int got = member_string(doc, "reason", out->reason, sizeof(out->reason));
    if (got != 1 || !utf8_text_line(out->reason, CONSOLE_MAX_REASON)) {
        refuse(err, "\"reason\" is required: 1..%d bytes of UTF-8 on one line",
               CONSOLE_MAX_REASON);
        goto out;
    }
    if (forced(doc, id, "id", &out->force, out->confirm, sizeof(out->confirm), err) !=
        0)
        goto out;
    rc = CHARGED_OK;
out:
    json_decref(doc);
    return rc;
}

enum charged_rc console_input_resolve(const char *body, size_t len,
                                      const char *attempt_id,
                                      struct console_resolve_input *out,
                                      struct charged_error *err)
{
    static const char *const known[] = {"decision", "payment_intent_id", "reason",
                                        "force",    "confirm",           NULL};
    char decision[16];
    enum charged_rc rc = CHARGED_BAD_ITEM;
    int got;
    CHARGED_ASSERT(out);
    memset(out, 0, sizeof(*out));
    json_t *doc = object_body(body, len, err);
    if (!doc || only_known(doc, known, err) != CHARGED_OK)
        goto out;
    if (member_string(doc, "decision", decision, sizeof(decision)) != 1 ||
        (strcmp(decision, "succeeded") != 0 && strcmp(decision, "failed") != 0)) {
        refuse(err, "\"decision\" must be \"succeeded\" or \"failed\"");
        goto out;
    }
    out->failed = !strcmp(decision, "failed");
    got =
        member_string(doc, "payment_intent_id", out->intent_id, sizeof(out->intent_id));
    if (got < 0 ||
        (got == 1 && !intent_id_ok(out->intent_id, strlen(out->intent_id)))) {
        refuse(err, "\"payment_intent_id\" must be a provider payment id "
                    "(letters, digits and _)");
        goto out;
    }
    if (out->failed && got == 1) {
        refuse(err, "\"payment_intent_id\" is for a succeeded decision only");
        goto out;
    }
    if (!out->failed && got != 1) {
        refuse(
            err,
            "a succeeded decision names the intent that paid: \"payment_intent_id\"");
        goto out;
    }
    got = member_string(doc, "reason", out->reason, sizeof(out->reason));
    if (got < 0 || (got == 1 && !utf8_text_line(out->reason, CONSOLE_MAX_REASON))) {
        refuse(err, "\"reason\" must be 1..%d bytes of UTF-8 on one line",
               CONSOLE_MAX_REASON);
        goto out;
    }
    if (out->failed && got != 1) {
        refuse(err, "a failed decision needs a \"reason\": how you know no "
                    "money moved");
        goto out;
    }
    if (forced(doc, attempt_id, "attempt id", &out->force, out->confirm,
               sizeof(out->confirm), err) != 0)
        goto out;
    rc = CHARGED_OK;
out:
    json_decref(doc);
    return rc;
}

enum charged_rc console_input_replay(const char *body, size_t len,
                                     struct console_replay_input *out,
                                     struct charged_error *err)
{
    static const char *const known[] = {"positions", "dry_run", NULL};
    enum charged_rc rc = CHARGED_BAD_ITEM;
    CHARGED_ASSERT(out);
    memset(out, 0, sizeof(*out));
    json_t *doc = object_body(body, len, err);
    if (!doc || only_known(doc, known, err) != CHARGED_OK)
        goto out;
    json_t *dry = json_object_get(doc, "dry_run");
    if (!json_is_boolean(dry)) {
        refuse(err, "\"dry_run\" must be true (preview) or false (send)");
        goto out;
    }
    out->dry_run = json_is_true(dry);
    json_t *list = json_object_get(doc, "positions");
    size_t n = json_array_size(list);
    if (!json_is_array(list) || n == 0 || n > CONSOLE_MAX_POSITIONS) {
        refuse(err, "\"positions\" must list 1..%d letters as \"P:O\"",
               CONSOLE_MAX_POSITIONS);
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(list, i));
        if (!s || console_input_position(s, &out->partition[i], &out->offset[i]) != 0) {
            refuse(err, "positions[%zu] is not PARTITION:OFFSET", i);
            goto out;
        }
        for (size_t k = 0; k < i; k++)
            if (out->partition[k] == out->partition[i] &&
                out->offset[k] == out->offset[i]) {
                refuse(err, "positions[%zu] repeats %d:%lld", i, (int)out->partition[i],
                       (long long)out->offset[i]);
                goto out;
            }
    }
    out->n = n;
    CHARGED_ASSERT(out->n >= 1 && out->n <= CONSOLE_MAX_POSITIONS);
    rc = CHARGED_OK;
out:
    json_decref(doc);
    if (rc != CHARGED_OK)
        out->n = 0;
    return rc;
}

/* An RFC 3339 UTC time or a duration: its characters only, checked for
 * meaning by the caller. */
static int time_text_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n >= 40)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || s[i] == ':' || s[i] == '-' ||
              s[i] == '.' || s[i] == '+'))
            return 0;
    return 1;
}

enum charged_rc console_input_letter_param(const char *name, const char *value,
                                           struct console_letter_query *q,
                                           struct charged_error *err)
{
    CHARGED_ASSERT(q);
    if (!name)
        return refuse(err, "a parameter without a name");
    if (!value)
        value = "";
    if (!strcmp(name, "reason")) {
        if (dead_letter_reason_parse(value) < 0)
            return refuse(err, "unknown reason code");
        snprintf(q->reason, sizeof(q->reason), "%s", value);
        return CHARGED_OK;
    }
    if (!strcmp(name, "attempt") || !strcmp(name, "order")) {
        char *to = name[0] == 'a' ? q->attempt : q->order;
        if (lower_uuid(value, strlen(value), to) != 0)
            return refuse(err, "%s must be a UUID", name);
        return CHARGED_OK;
    }
    if (!strcmp(name, "since") || !strcmp(name, "until")) {
        if (!time_text_ok(value))
            return refuse(err,
                          "%s must be an RFC 3339 UTC time or a duration (30s, 15m, "
                          "2h, 7d)",
                          name);
        snprintf(name[0] == 's' ? q->since : q->until, sizeof(q->since), "%s", value);
        return CHARGED_OK;
    }
    if (!strcmp(name, "limit")) {
        size_t n = strlen(value);
        long long v = 0;
        if (n == 0 || n > 4)
            return refuse(err, "limit must be a whole number 1..1000");
        for (size_t i = 0; i < n; i++) {
            if (!isdigit((unsigned char)value[i]))
                return refuse(err, "limit must be a whole number 1..1000");
            v = v * 10 + (value[i] - '0');
        }
        if (v < 1 || v > 1000)
            return refuse(err, "limit must be a whole number 1..1000");
        q->limit = v;
        return CHARGED_OK;
    }
    return refuse(err, "unknown parameter");
}

enum charged_rc console_input_find_id(const char *value, char out[PROVIDER_ID_MAX],
                                      struct charged_error *err)
{
    size_t n = value ? strlen(value) : 0;
    CHARGED_ASSERT(out);
    if (n == 36 && lower_uuid(value, n, out) == 0)
        return CHARGED_OK;
    if (value && intent_id_ok(value, n)) {
        memcpy(out, value, n + 1);
        return CHARGED_OK;
    }
    return refuse(err,
                  "give an attempt id, an order id (UUIDs) or a payment intent id");
}

int console_input_cookie(const char *header, char out[CONSOLE_SECRET_MAX])
{
    const size_t name_len = sizeof(CONSOLE_COOKIE) - 1;
    const char *p = header;
    CHARGED_ASSERT(out);
    while (p && *p) {
        while (*p == ' ' || *p == ';')
            p++;
        const char *end = strchr(p, ';');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n > name_len && !strncmp(p, CONSOLE_COOKIE, name_len) &&
            p[name_len] == '=') {
            size_t vn = n - name_len - 1;
            if (vn >= CONSOLE_SECRET_MAX)
                return -1;
            memcpy(out, p + name_len + 1, vn);
            out[vn] = '\0';
            return secret_ok(out) ? 0 : -1;
        }
        p = end;
    }
    return -1;
}

int console_input_position(const char *s, int32_t *partition, int64_t *offset)
{
    const char *rest;
    int64_t p, o;
    CHARGED_ASSERT(partition && offset);
    if (decimal_parse(s, INT32_MAX, &p, &rest) != 0 || *rest != ':' ||
        decimal_parse(rest + 1, INT64_MAX, &o, NULL) != 0)
        return -1;
    *partition = (int32_t)p;
    *offset = o;
    return 0;
}
