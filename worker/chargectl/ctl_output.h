/* ctl_output: how chargectl prints: aligned tables for people, JSON for
 * scripts. */
#ifndef CHARGED_CTL_OUTPUT_H
#define CHARGED_CTL_OUTPUT_H

#include <stdint.h>
#include <stdio.h>

typedef struct ctl_table ctl_table_t;

/* A table with `ncols` columns named by the NULL-terminated headers. */
ctl_table_t *ctl_table_new(const char *const *headers);
void ctl_table_free(ctl_table_t *t);
/* Adds a row of ncols values (copied; NULL prints as "-"). 0 / -1. */
int ctl_table_add(ctl_table_t *t, const char *const *values);
void ctl_table_print(const ctl_table_t *t, FILE *out);

/* Prints a JSON value (steals the reference) followed by a newline. */
void ctl_print_json(FILE *out, void *json);

#endif
