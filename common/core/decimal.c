#include "decimal.h"

#include <stddef.h>

#include "charged_assert.h"

int decimal_parse(const char *s, int64_t max, int64_t *out, const char **rest)
{
    int64_t v = 0;
    const char *p = s;
    CHARGED_ASSERT(out && max >= 0);
    if (!s || *s < '0' || *s > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        int d = *p - '0';
        if (d > max || v > (max - d) / 10) /* v * 10 + d > max, without overflow */
            return -1;
        v = v * 10 + d;
    }
    if (rest)
        *rest = p;
    else if (*p)
        return -1;
    CHARGED_ASSERT(v >= 0 && v <= max); /* the overflow guard held */
    *out = v;
    return 0;
}
