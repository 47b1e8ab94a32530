#include "store.h"

#include <stdarg.h>
#include <stdio.h>

void store_error_clear(struct store_error *err)
{
    err->message[0] = '\0';
    err->sqlstate[0] = '\0';
}

void store_error_set(struct store_error *err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    err->sqlstate[0] = '\0';
}
