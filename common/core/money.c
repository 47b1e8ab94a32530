#include "money.h"

#include <stdio.h>
#include <string.h>

#include "charged_assert.h"

/* ISO 4217's currencies whose minor unit is not 2 digits. */
static const char EXPONENT_0[] = "BIF CLP DJF GNF ISK JPY KMF KRW PYG RWF UGX UYI VND "
                                 "VUV XAF XOF XPF";
static const char EXPONENT_3[] = "BHD IQD JOD KWD LYD OMR TND";
static const char EXPONENT_4[] = "CLF UYW";

static int listed(const char *list, const char *code)
{
    CHARGED_ASSERT(list && code);
    if (strlen(code) != 3)
        return 0;
    for (const char *p = list; (p = strstr(p, code)); p += 3)
        if ((p == list || p[-1] == ' ') && (p[3] == ' ' || p[3] == '\0'))
            return 1;
    return 0;
}

int money_exponent(const char *currency)
{
    if (!currency)
        return 2;
    if (listed(EXPONENT_0, currency))
        return 0;
    if (listed(EXPONENT_3, currency))
        return 3;
    if (listed(EXPONENT_4, currency))
        return 4;
    return 2;
}

int money_format(char *out, size_t size, long long minor, const char *currency)
{
    static const unsigned long long scale[] = {1, 10, 100, 1000, 10000};
    int e = money_exponent(currency);
    CHARGED_ASSERT(e >= 0 && e < (int)(sizeof(scale) / sizeof(scale[0])));
    CHARGED_ASSERT(out || size == 0);
    /* The magnitude as unsigned: -LLONG_MIN does not fit a long long. */
    unsigned long long m =
        minor < 0 ? 0ULL - (unsigned long long)minor : (unsigned long long)minor;
    unsigned long long whole = m / scale[e], frac = m % scale[e];
    /* The amount is split, not changed: whole units and the minor rest. */
    CHARGED_ASSERT(frac < scale[e] && whole * scale[e] + frac == m);
    const char *sign = minor < 0 ? "-" : "";
    const char *sep = currency && currency[0] ? " " : "";
    const char *code = currency ? currency : "";
    int n =
        e ? snprintf(out, size, "%s%llu.%0*llu%s%s", sign, whole, e, frac, sep, code)
          : snprintf(out, size, "%s%llu%s%s", sign, whole, sep, code);
    if (n < 0 || (size_t)n >= size) {
        if (size)
            out[0] = '\0';
        return -1;
    }
    return n;
}
