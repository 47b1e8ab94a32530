#include "ctl_output.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "clock.h"

struct ctl_table {
    size_t ncols, nrows, cap;
    char **cells; /* row-major, row 0 the headers */
    size_t *width;
};

ctl_table_t *ctl_table_new(const char *const *headers)
{
    ctl_table_t *t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    while (headers[t->ncols])
        t->ncols++;
    t->width = calloc(t->ncols, sizeof(size_t));
    if (!t->width || ctl_table_add(t, headers) != 0) {
        ctl_table_free(t);
        return NULL;
    }
    return t;
}

void ctl_table_free(ctl_table_t *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nrows * t->ncols; i++)
        free(t->cells[i]);
    free(t->cells);
    free(t->width);
    free(t);
}

int ctl_table_add(ctl_table_t *t, const char *const *values)
{
    if (t->nrows == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        char **c = realloc(t->cells, ncap * t->ncols * sizeof(*c));
        if (!c)
            return -1;
        t->cells = c;
        t->cap = ncap;
    }
    for (size_t i = 0; i < t->ncols; i++) {
        const char *v = values[i] && *values[i] ? values[i] : "-";
        char *copy = strdup(v);
        if (!copy)
            return -1;
        /* One line per row: fold control characters. */
        for (char *p = copy; *p; p++)
            if ((unsigned char)*p < 0x20)
                *p = ' ';
        t->cells[t->nrows * t->ncols + i] = copy;
        if (strlen(copy) > t->width[i])
            t->width[i] = strlen(copy);
    }
    t->nrows++;
    return 0;
}

void ctl_table_print(const ctl_table_t *t, FILE *out)
{
    for (size_t r = 0; r < t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *v = t->cells[r * t->ncols + c];
            if (c + 1 == t->ncols)
                fprintf(out, "%s", v);
            else
                fprintf(out, "%-*s  ", (int)t->width[c], v);
        }
        fputc('\n', out);
    }
}

void ctl_print_json(FILE *out, void *json)
{
    char *s = json_dumps(json, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    if (s)
        fprintf(out, "%s\n", s);
    free(s);
    json_decref(json);
}
