#include "charged_error.h"

#include <stdarg.h>
#include <stdio.h>

#include "charged_assert.h"

static const char *const names[CHARGED_RC__COUNT] = {
    [CHARGED_OK] = "ok",
    [CHARGED_RETRY] = "retry",
    [CHARGED_BAD_ITEM] = "bad_item",
    [CHARGED_WAIT] = "wait",
    [CHARGED_NOT_FOUND] = "not_found",
    [CHARGED_NOT_LEADER] = "not_leader",
    [CHARGED_REVIEW] = "review",
    [CHARGED_GIVE_UP] = "give_up",
};

const char *charged_rc_name(enum charged_rc rc)
{
    CHARGED_ASSERT((unsigned)rc < CHARGED_RC__COUNT);
    return names[rc];
}

void charged_error_clear(struct charged_error *err)
{
    if (!err)
        return;
    err->message[0] = '\0';
    err->code[0] = '\0';
}

void charged_error_set(struct charged_error *err, const char *fmt, ...)
{
    va_list ap;
    if (!err)
        return;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    err->code[0] = '\0';
}
