/* Fuzz target: the traceparent header reader (common/core/traceparent).
 * Properties: a value it takes is exactly the bytes given, 55 of them, in
 * the version-00 shape; anything else leaves out empty. */
#include "fuzz_check.h"
#include "traceparent.h"

static int lower_hex(const char *s, size_t n, int nonzero)
{
    int zero = 1;
    for (size_t i = 0; i < n; i++) {
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
        zero &= s[i] == '0';
    }
    return !nonzero || !zero;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char out[TRACEPARENT_LEN + 1];
    memset(out, 'x', sizeof(out));
    int ok = traceparent_parse(size ? data : NULL, size, out);
    if (!ok) {
        FUZZ_CHECK(out[0] == '\0');
        return 0;
    }
    FUZZ_CHECK(size == TRACEPARENT_LEN && strlen(out) == TRACEPARENT_LEN);
    FUZZ_CHECK(memcmp(out, data, TRACEPARENT_LEN) == 0);
    FUZZ_CHECK(out[0] == '0' && out[1] == '0' && out[2] == '-' && out[35] == '-' &&
               out[52] == '-');
    FUZZ_CHECK(lower_hex(out + 3, 32, 1) && lower_hex(out + 36, 16, 1) &&
               lower_hex(out + 53, 2, 0));
    return 0;
}
