#include "store.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

/* Read by every statement, from any thread (the api's). */
static _Atomic long long timeout_ms = STORE_TIMEOUT_DEFAULT_MS;

void store_set_timeout_ms(long long ms)
{
    atomic_store(&timeout_ms, ms > 0 ? ms : STORE_TIMEOUT_DEFAULT_MS);
}

long long store_timeout_ms(void)
{
    return atomic_load(&timeout_ms);
}

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
