/* Fuzz target: the breaker's gauge read from a worker's /metrics text
 * (common/kafka/fleet_status, fleet_status_parse_breaker): the body comes
 * from whatever answers at a configured URL. Properties: the value is -1, 0,
 * 1 or 2, only bytes within the length are read (the copy has no NUL after
 * it), a state needs the gauge's name in the body, and a good "2" line after
 * any body is found whatever came before it. */
#include "fleet_status.h"
#include "fuzz_check.h"

#define NAME      "charged_provider_breaker_state"
#define OPEN_LINE "\n" NAME " 2\n"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exactly size bytes on the heap: ASan sees a read past them. */
    char *body = malloc(size ? size : 1);
    FUZZ_CHECK(body != NULL);
    if (size)
        memcpy(body, data, size);
    int s = fleet_status_parse_breaker(body, size);
    FUZZ_CHECK(s >= -1 && s <= 2);
    if (s >= 0)
        FUZZ_CHECK(size >= sizeof(NAME) - 1 &&
                   memmem(body, size, NAME, sizeof(NAME) - 1) != NULL);
    free(body);

    size_t n = size + sizeof(OPEN_LINE) - 1;
    char *with_open = malloc(n);
    FUZZ_CHECK(with_open != NULL);
    if (size)
        memcpy(with_open, data, size);
    memcpy(with_open + size, OPEN_LINE, sizeof(OPEN_LINE) - 1);
    FUZZ_CHECK(fleet_status_parse_breaker(with_open, n) == 2);
    free(with_open);
    return 0;
}
