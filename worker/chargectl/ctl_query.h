/* ctl_query: chargectl's reads of JSON the database builds, and their
 * printing as tables. */
#ifndef CHARGED_CTL_QUERY_H
#define CHARGED_CTL_QUERY_H

#include <stddef.h>

#include <jansson.h>
#include <libpq-fe.h>

#include "charged_error.h"

/* Runs a one-row, one-column JSON query; returns the parsed value (the
 * caller owns it), or NULL with err ("not found" and *missing set when there
 * is no row). */
json_t *ctl_query_json(PGconn *conn, const char *sql, int n, const char *const *p,
                       int *missing, struct charged_error *err);

/* A member as text for a table cell (NULL for null or absent); buf holds
 * what is not a string. A key "amount@currency" writes the amount member
 * as money in the currency member's unit ("15.00 EUR", common/core/money). */
const char *ctl_cell(json_t *o, const char *k, char *buf, size_t size);

/* Prints an array of objects as a table of the given members (at most 8),
 * on stdout. */
void ctl_print_rows(json_t *rows, const char *const *headers, const char *const *keys);

/* Prints each member of o on a line of its own ("key  value"), its amounts
 * (amount, refunded_amount, refund_reserved) as money in its currency. */
void ctl_print_object(json_t *o);

#endif
