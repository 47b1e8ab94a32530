#include "store.h"

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
