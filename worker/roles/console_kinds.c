#include "console_kinds.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "attempt_status.h"
#include "charged_assert.h"
#include "op.h"

/* "Captures, voids and authorizations" of the nouns, in their order: the
 * page's headings as they were written before the table served them. */
static void heading_of(const char *const *nouns, size_t n, char *buf, size_t size)
{
    size_t used = 0;
    CHARGED_ASSERT(buf && size > 0);
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%s%ss",
                         i == 0       ? ""
                         : i + 1 == n ? " and "
                                      : ", ",
                         nouns[i]);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    buf[0] = (char)toupper((unsigned char)buf[0]);
}

/* A kind's choices as [value, label]: ["succeeded", "SUCCEEDED: ..."]. */
static json_t *decisions_of(const struct step_review_kind *k)
{
    json_t *out = json_array();
    for (const struct step_review_choice *c = k->choices; out && c && c->says; c++) {
        char value[24], label[200];
        const char *name = attempt_status_name(c->decision);
        CHARGED_ASSERT(k->decisions & (1u << c->decision));
        size_t i = 0;
        for (; name[i] && i + 1 < sizeof(value); i++)
            value[i] = (char)tolower((unsigned char)name[i]);
        value[i] = '\0';
        snprintf(label, sizeof(label), "%s: %s", name, c->says);
        json_array_append_new(out, json_pack("[s, s]", value, label));
    }
    return out;
}

json_t *console_kinds_reviews(void)
{
    const struct step_review_kind *r[PAYMENT_OPS_MAX];
    const char *nouns[PAYMENT_OPS_MAX] = {0};
    char heading[256];
    size_t n = payment_ops_reviews(r);
    CHARGED_ASSERT(n > 0 && n <= PAYMENT_OPS_MAX);
    /* Ranked as chargectl --help lists them, the order they were added in. */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && r[j]->cli_rank < r[j - 1]->cli_rank; j--) {
            const struct step_review_kind *x = r[j];
            r[j] = r[j - 1];
            r[j - 1] = x;
        }
    json_t *kinds = json_object();
    for (size_t i = 0; i < n; i++) {
        nouns[i] = r[i]->noun;
        json_object_set_new(kinds, r[i]->noun,
                            json_pack("{s:s, s:s, s:o}", "holder", r[i]->holder,
                                      "holder_status", r[i]->holder_status_key,
                                      "decisions", decisions_of(r[i])));
    }
    heading_of(nouns, n, heading, sizeof(heading));
    return json_pack("{s:s, s:s, s:o}", "heading", heading, "holder", r[0]->holder,
                     "kinds", kinds);
}

/* A row's member shown as an amount: the number, `whole` when null, "-"
 * when the kind has none or the row lacks it. */
static json_t *amount_of(json_t *row, const char *member, const char *whole)
{
    json_t *v = member ? json_object_get(row, member) : NULL;
    if (!v)
        return json_string("-");
    if (json_is_null(v))
        return json_string(whole ? whole : "-");
    return json_incref(v);
}

/* The reason members of a row that say something, joined with " · ";
 * null when none does. */
static json_t *reason_of(json_t *row, const char *const *members)
{
    char buf[2048] = "";
    size_t used = 0;
    for (size_t i = 0; members && members[i] && used < sizeof(buf); i++) {
        const char *s = json_string_value(json_object_get(row, members[i]));
        if (!s || !s[0])
            continue;
        int w = snprintf(buf + used, sizeof(buf) - used, "%s%s", used ? " · " : "", s);
        if (w < 0)
            break;
        used += (size_t)w;
    }
    return buf[0] ? json_string(buf) : json_null();
}

static json_t *step_row(const struct attempt_history_steps *s, json_t *row)
{
    return json_pack("{s:s, s:O?, s:O?, s:o, s:o, s:o, s:O?, s:O?, s:O?}", "kind",
                     s->noun, "id", json_object_get(row, s->id_key), "status",
                     json_object_get(row, "status"), "amount",
                     amount_of(row, s->asked_member, s->asked_whole), "taken",
                     amount_of(row, s->taken_member, NULL), "reason",
                     reason_of(row, s->reason_members), "created_at",
                     json_object_get(row, "created_at"), "updated_at",
                     json_object_get(row, "updated_at"), "transitions",
                     json_object_get(row, "transitions"));
}

void console_kinds_steps(json_t *doc, const struct attempt_history_table *t)
{
    const char *nouns[ATTEMPT_HISTORY_STEPS_MAX] = {0};
    const char *taken = NULL;
    char heading[256];
    CHARGED_ASSERT(doc && t);
    CHARGED_ASSERT(t->n <= ATTEMPT_HISTORY_STEPS_MAX);
    json_t *steps = json_array();
    for (size_t i = 0; i < t->n; i++) {
        const struct attempt_history_steps *s = t->steps[i];
        json_t *rows = json_object_get(doc, s->key);
        nouns[i] = s->noun;
        if (!taken)
            taken = s->taken_head;
        for (size_t j = 0; steps && j < json_array_size(rows); j++)
            json_array_append_new(steps, step_row(s, json_array_get(rows, j)));
    }
    heading_of(nouns, t->n, heading, sizeof(heading));
    json_object_set_new(doc, "steps", steps);
    json_object_set_new(
        doc, "steps_view",
        json_pack("{s:s, s:s}", "heading", heading, "taken", taken ? taken : "Taken"));
}
