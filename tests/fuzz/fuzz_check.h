/* fuzz_check: what the fuzz targets share: a property that must hold, and
 * the input cut into parts.
 *
 * A broken property aborts, so that libFuzzer reports it as a crash and
 * keeps the input. */
#ifndef CHARGED_FUZZ_CHECK_H
#define CHARGED_FUZZ_CHECK_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(cond)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "%s:%d: property broken: %s\n", __FILE__, __LINE__,        \
                    #cond);                                                            \
            abort();                                                                   \
        }                                                                              \
    } while (0)

/* The next part of the input, up to the first '\n' (or the rest); *data and
 * *size move past it and its newline. */
static inline const uint8_t *fuzz_next_line(const uint8_t **data, size_t *size,
                                            size_t *len)
{
    const uint8_t *start = *data;
    const uint8_t *nl = *size ? memchr(start, '\n', *size) : NULL;
    *len = nl ? (size_t)(nl - start) : *size;
    *data += nl ? *len + 1 : *len;
    *size -= nl ? *len + 1 : *len;
    return start;
}

/* A malloc'd NUL-terminated copy of n bytes: what a C-string API is given. */
static inline char *fuzz_strndup(const uint8_t *s, size_t n)
{
    char *c = malloc(n + 1);
    if (!c)
        abort();
    if (n)
        memcpy(c, s, n);
    c[n] = '\0';
    return c;
}

/* A malloc'd copy of exactly n bytes, unterminated: what a (pointer,
 * length) API is given, so that a read past the end is ASan's to see. */
static inline void *fuzz_memdup(const uint8_t *s, size_t n)
{
    void *c = malloc(n ? n : 1);
    if (!c)
        abort();
    if (n)
        memcpy(c, s, n);
    return c;
}

#endif
