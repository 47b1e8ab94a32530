#include "sim_world.h"

#include <stdarg.h>
#include <stdio.h>

void sim_violate(struct sim_violation *v, const char *rule, const char *fmt, ...)
{
    va_list ap;
    if (v->rule)
        return; /* the first one is the one reported */
    v->rule = rule;
    va_start(ap, fmt);
    vsnprintf(v->detail, sizeof(v->detail), fmt, ap);
    va_end(ap);
}
