#include "traceparent.h"

#include <string.h>

#include "charged_assert.h"

/* n lower-case hex digits at s, not all '0' when nonzero is set. */
static int hex_field(const char *s, size_t n, int nonzero)
{
    int zero = 1;
    CHARGED_ASSERT(s && n > 0);
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')))
            return 0;
        if (c != '0')
            zero = 0;
    }
    return !(nonzero && zero);
}

int traceparent_parse(const void *value, size_t len, char *out)
{
    const char *s = value;
    CHARGED_ASSERT(out);
    out[0] = '\0';
    /* version-trace_id-parent_id-flags at 0, 3, 36 and 53 */
    if (!s || len != TRACEPARENT_LEN || s[2] != '-' || s[35] != '-' || s[52] != '-')
        return 0;
    if (s[0] != '0' || s[1] != '0' || !hex_field(s + 3, 32, 1) ||
        !hex_field(s + 36, 16, 1) || !hex_field(s + 53, 2, 0))
        return 0;
    memcpy(out, s, TRACEPARENT_LEN);
    out[TRACEPARENT_LEN] = '\0';
    return 1;
}
