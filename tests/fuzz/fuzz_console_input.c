/* Fuzz target: what a request to the console says (common/core/
 * console_input): its route, its JSON bodies, its query parameters and its
 * cookie, as the console's JSON endpoints take them.
 *
 * Input: the first line picks the parser and gives its first argument (a
 * path, a parameter "name=value", a cookie header, the attempt id of a
 * resolve); the rest is the body.
 *
 * Properties: a route is one of the table's, with the method its kind
 * takes and an id that means what it says (a canonical UUID, a position
 * that parses again, a file name without a slash); every refusal says why;
 * an accepted body holds only what its checks allow (a succeeded decision
 * names an intent, a failed one a reason, force confirms the attempt, a
 * replay lists 1..500 distinct positions). */
#include <ctype.h>
#include <strings.h>

#include "charge_command.h"
#include "console_input.h"
#include "fuzz_check.h"
#include "utf8_text.h"

static char *text(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);
    if (!s)
        abort();
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static void check_secret(const char *s)
{
    size_t n = strlen(s);
    FUZZ_CHECK(n >= 8 && n < CONSOLE_SECRET_MAX);
    for (size_t i = 0; i < n; i++)
        FUZZ_CHECK(isalnum((unsigned char)s[i]) || s[i] == '_' || s[i] == '-');
}

static void check_lower_uuid(const char *s)
{
    FUZZ_CHECK(charge_command_is_uuid(s));
    for (const char *p = s; *p; p++)
        FUZZ_CHECK(!(*p >= 'A' && *p <= 'Z'));
}

/* The kinds the operations' reviews name (the table's, in the console). */
static const char *const review_kinds[] = {"capture", "void", "authorization", NULL};

static void route(const char *path)
{
    struct console_route_match m;
    enum console_route r = console_input_route(path, review_kinds, &m);
    FUZZ_CHECK(r == m.route && r >= CONSOLE_R_NONE && r <= CONSOLE_R_LIMITS_SET);
    if (r == CONSOLE_R_NONE)
        return;
    FUZZ_CHECK(memchr(m.id, '\0', sizeof(m.id)));
    FUZZ_CHECK(!strcmp(m.method, console_input_route_writes(r) ? "POST" : "GET"));
    if (r == CONSOLE_R_ATTEMPT || r == CONSOLE_R_RESOLVE || r == CONSOLE_R_STEP_RESOLVE)
        check_lower_uuid(m.id);
    FUZZ_CHECK((r == CONSOLE_R_STEP_RESOLVE) == (m.kind[0] != '\0'));
    if (r == CONSOLE_R_LETTER) {
        int32_t p;
        int64_t o;
        FUZZ_CHECK(console_input_position(m.id, &p, &o) == 0 && p >= 0 && o >= 0);
    }
    if (r == CONSOLE_R_ASSET)
        FUZZ_CHECK(m.id[0] && m.id[0] != '.' && !strchr(m.id, '/'));
}

static void resolve(const char *attempt, const uint8_t *body, size_t n)
{
    struct console_resolve_input in;
    struct charged_error why = {0};
    if (console_input_resolve((const char *)body, n, attempt, &in, &why) != 0) {
        FUZZ_CHECK(why.message[0]);
        return;
    }
    FUZZ_CHECK(memchr(in.reason, '\0', sizeof(in.reason)));
    FUZZ_CHECK(utf8_text_valid(in.reason, strlen(in.reason)));
    for (const char *p = in.reason; *p; p++)
        FUZZ_CHECK((unsigned char)*p >= 0x20 && *p != 0x7f);
    if (in.failed)
        FUZZ_CHECK(in.reason[0] && !in.intent_id[0]);
    else
        FUZZ_CHECK(in.intent_id[0]);
    for (const char *p = in.intent_id; *p; p++)
        FUZZ_CHECK(isalnum((unsigned char)*p) || *p == '_');
    if (in.force)
        FUZZ_CHECK(!strcasecmp(in.confirm, attempt));
}

/* A step's decision, from the same body as an attempt's. */
static void step_resolve(const char *id, const uint8_t *body, size_t n)
{
    struct console_step_resolve_input in;
    struct charged_error why = {0};
    if (console_input_step_resolve((const char *)body, n, id, &in, &why) != 0) {
        FUZZ_CHECK(why.message[0]);
        return;
    }
    FUZZ_CHECK(in.reason[0] && utf8_text_valid(in.reason, strlen(in.reason)));
    FUZZ_CHECK(!strcmp(in.decision, "SUCCEEDED") || !strcmp(in.decision, "FAILED") ||
               !strcmp(in.decision, "AUTHORIZED") || !strcmp(in.decision, "VOIDED"));
    if (in.force)
        FUZZ_CHECK(!strcasecmp(in.confirm, id));
}

static void replay(const uint8_t *body, size_t n)
{
    struct console_replay_input *in = malloc(sizeof(*in));
    struct charged_error why = {0};
    if (!in)
        abort();
    if (console_input_replay((const char *)body, n, in, &why) != 0) {
        FUZZ_CHECK(why.message[0] && in->n == 0);
    } else {
        FUZZ_CHECK(in->n >= 1 && in->n <= CONSOLE_MAX_POSITIONS);
        FUZZ_CHECK(in->dry_run == 0 || in->dry_run == 1);
        for (size_t i = 0; i < in->n; i++) {
            FUZZ_CHECK(in->partition[i] >= 0 && in->offset[i] >= 0);
            for (size_t k = 0; k < i; k++)
                FUZZ_CHECK(in->partition[k] != in->partition[i] ||
                           in->offset[k] != in->offset[i]);
        }
    }
    free(in);
}

static void letter_param(const char *arg)
{
    struct console_letter_query q;
    struct charged_error why = {0};
    char *eq = strchr(arg, '=');
    memset(&q, 0, sizeof(q));
    if (eq)
        *eq = '\0';
    if (console_input_letter_param(arg, eq ? eq + 1 : NULL, &q, &why) != 0) {
        FUZZ_CHECK(why.message[0]);
        return;
    }
    FUZZ_CHECK(q.limit >= 0 && q.limit <= 1000);
    if (q.attempt[0])
        check_lower_uuid(q.attempt);
    if (q.order[0])
        check_lower_uuid(q.order);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    size_t n;
    if (size < 1)
        return 0;
    uint8_t which = data[0] % 7;
    data++;
    size--;
    const uint8_t *line = fuzz_next_line(&data, &size, &n);
    char *arg = text(line, n);
    struct charged_error why = {0};
    char secret[CONSOLE_SECRET_MAX], id[PROVIDER_ID_MAX];
    switch (which) {
    case 0:
        route(arg);
        break;
    case 1:
        if (console_input_login((const char *)data, size, secret, &why) == 0)
            check_secret(secret);
        else
            FUZZ_CHECK(why.message[0] && secret[0] == '\0');
        break;
    case 2:
        resolve(arg, data, size);
        step_resolve(arg, data, size);
        break;
    case 3:
        replay(data, size);
        break;
    case 4:
        letter_param(arg);
        break;
    case 5:
        if (console_input_cookie(arg, secret) == 0)
            check_secret(secret);
        break;
    case 6:
        if (console_input_find_id(arg, id, &why) == 0)
            FUZZ_CHECK(id[0] &&
                       (charge_command_is_uuid(id) || strlen(id) < PROVIDER_ID_MAX));
        else
            FUZZ_CHECK(why.message[0]);
        break;
    }
    free(arg);
    return 0;
}
