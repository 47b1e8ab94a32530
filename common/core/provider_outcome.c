#include "provider_outcome.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "charged_assert.h"

/* Whatever provider_outcome_id_ok passes fits every id buffer, the
 * result's included. */
_Static_assert(sizeof(((struct provider_result *)0)->provider_payment_id) ==
                   PROVIDER_ID_MAX,
               "one size for provider ids");

static const char *outcome_names[] = {
    "succeeded",       "processing", "declined",  "not_executed", "unknown",
    "requires_review", "invalid",    "not_found", "authorized",
};
_Static_assert(sizeof(outcome_names) / sizeof(outcome_names[0]) ==
                   PROVIDER_OUTCOME__COUNT,
               "a name for every outcome");

const char *provider_outcome_name(enum provider_outcome o)
{
    /* Every outcome has a name: a value outside the enum is a broken result. */
    CHARGED_ASSERT((size_t)o < sizeof(outcome_names) / sizeof(outcome_names[0]));
    return outcome_names[o];
}

void provider_outcome_detail(const struct provider_result *res, char *buf, size_t size)
{
    CHARGED_ASSERT(res != NULL && buf != NULL && size > 0);
    if (!res->code[0])
        snprintf(buf, size, "%s", res->error);
    else if (res->param[0])
        snprintf(buf, size, "%s (%s): %s", res->code, res->param, res->error);
    else
        snprintf(buf, size, "%s: %s", res->code, res->error);
}

struct provider_result provider_outcome_lost_answer(void)
{
    struct provider_result lost = {.outcome = PROVIDER_UNKNOWN, .sent = 1};
    snprintf(lost.error, sizeof(lost.error),
             "connection closed without an answer; re-sent with the same key");
    return lost;
}

int provider_outcome_id_ok(const char *id)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n >= PROVIDER_ID_MAX)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)id[i]) && id[i] != '_')
            return 0;
    return 1;
}

long long provider_outcome_retry_after_ms(const char *header)
{
    long long s = 0;
    const char *p = header;
    if (!p)
        return 0;
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p < '0' || *p > '9')
        return 0;
    for (; *p >= '0' && *p <= '9'; p++)
        if (s <= PROVIDER_RETRY_AFTER_MAX_MS / 1000)
            s = s * 10 + (*p - '0');
    while (*p == ' ' || *p == '\t')
        p++;
    if (*p)
        return 0; /* not delta-seconds: an HTTP-date, or junk */
    long long ms =
        s * 1000 > PROVIDER_RETRY_AFTER_MAX_MS ? PROVIDER_RETRY_AFTER_MAX_MS : s * 1000;
    CHARGED_ASSERT(ms >= 0 && ms <= PROVIDER_RETRY_AFTER_MAX_MS);
    return ms;
}

long long provider_outcome_throttled_wait_ms(long long retry_after_ms, int in_a_row)
{
    CHARGED_ASSERT(retry_after_ms >= 0 &&
                   retry_after_ms <= PROVIDER_RETRY_AFTER_MAX_MS);
    CHARGED_ASSERT(in_a_row >= 0);
    if (retry_after_ms > 0)
        return retry_after_ms;
    long long ms = PROVIDER_THROTTLED_BACKOFF_MS;
    for (int i = 0; i < in_a_row && ms < PROVIDER_RETRY_AFTER_MAX_MS; i++)
        ms *= 2;
    ms = ms < PROVIDER_RETRY_AFTER_MAX_MS ? ms : PROVIDER_RETRY_AFTER_MAX_MS;
    CHARGED_ASSERT(ms >= PROVIDER_THROTTLED_BACKOFF_MS);
    return ms;
}

int provider_outcome_parks(const struct provider_result *res)
{
    CHARGED_ASSERT(res != NULL);
    return res->outcome == PROVIDER_NOT_EXECUTED &&
           (res->throttled || res->http_status == 409);
}
