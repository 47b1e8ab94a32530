#include "charged_assert.h"

#include <stdio.h>
#include <stdlib.h>

/* s as the inside of a JSON string: an assertion's text may quote. */
static void put_json_text(const char *s)
{
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', stderr);
        if ((unsigned char)*s >= 0x20)
            fputc(*s, stderr);
    }
}

_Noreturn void charged_assert_failed(const char *expr, const char *file, int line,
                                     const char *func)
{
    /* Names of our own code only: no value of a record, so nothing a
     * customer or provider wrote can reach this line. */
    fputs("{\"level\":\"fatal\",\"msg\":\"bug: assertion failed; stopping\","
          "\"assertion\":\"",
          stderr);
    put_json_text(expr);
    fprintf(stderr, "\",\"at\":\"%s:%d\",\"function\":\"%s\"}\n", file, line, func);
    fflush(stderr);
    abort();
}
