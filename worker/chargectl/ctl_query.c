#include "ctl_query.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl_output.h"
#include "db.h"
#include "money.h"

/* db_query_json, in the terms of chargectl's messages. */
json_t *ctl_query_json(PGconn *conn, const char *sql, int n, const char *const *p,
                       int *missing, struct charged_error *err)
{
    json_t *j = NULL;
    enum charged_rc rc = db_query_json(conn, sql, n, p, &j, err);

    *missing = rc == CHARGED_NOT_FOUND;
    if (*missing)
        charged_error_set(err, "not found");
    return j;
}

/* "amount@currency": the amount member as money in the currency member's
 * unit ("15.00 EUR"); NULL when the amount is not a whole number. */
static const char *money_cell(json_t *o, const char *k, const char *at, char *buf,
                              size_t size)
{
    char amount_key[64];
    snprintf(amount_key, sizeof(amount_key), "%.*s", (int)(at - k), k);
    json_t *v = json_object_get(o, amount_key);
    if (!json_is_integer(v))
        return ctl_cell(o, amount_key, buf, size);
    const char *cur = json_string_value(json_object_get(o, at + 1));
    if (money_format(buf, size, (long long)json_integer_value(v), cur) < 0)
        snprintf(buf, size, "%lld", (long long)json_integer_value(v));
    return buf;
}

/* A member as text for a table cell. */
const char *ctl_cell(json_t *o, const char *k, char *buf, size_t size)
{
    const char *at = strchr(k, '@');
    if (at)
        return money_cell(o, k, at, buf, size);
    json_t *v = json_object_get(o, k);
    if (!v || json_is_null(v))
        return NULL;
    if (json_is_string(v))
        return json_string_value(v);
    if (json_is_integer(v)) {
        snprintf(buf, size, "%lld", (long long)json_integer_value(v));
        return buf;
    }
    if (json_is_boolean(v))
        return json_is_true(v) ? "true" : "false";
    char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS);
    snprintf(buf, size, "%s", s ? s : "");
    free(s);
    return buf;
}

/* Prints an array of objects as a table of the given members. */
void ctl_print_rows(json_t *rows, const char *const *headers, const char *const *keys)
{
    ctl_table_t *t = ctl_table_new(headers);
    size_t i, ncols = 0;
    json_t *row;
    while (keys[ncols])
        ncols++;
    json_array_foreach(rows, i, row)
    {
        char bufs[8][512];
        const char *vals[8];
        for (size_t c = 0; c < ncols && c < 8; c++)
            vals[c] = ctl_cell(row, keys[c], bufs[c], sizeof(bufs[c]));
        ctl_table_add(t, vals);
    }
    ctl_table_print(t, stdout);
    ctl_table_free(t);
}

void ctl_print_object(json_t *o)
{
    static const char *const money[] = {"amount", "refunded_amount", "refund_reserved",
                                        "captured_amount", NULL};
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v)
    {
        char buf[512], key[64];
        snprintf(key, sizeof(key), "%s", k);
        for (size_t i = 0; money[i]; i++)
            if (!strcmp(k, money[i]))
                snprintf(key, sizeof(key), "%s@currency", k);
        const char *s = ctl_cell(o, key, buf, sizeof(buf));
        printf("%-20s %s\n", k, s ? s : "-");
    }
}
