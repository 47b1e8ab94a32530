/* console_kinds: the operations' parts of the console's page, served as
 * data (issue 37): the page (console_web/app.js) draws them and names no
 * operation. Each comes from the table (op.h): a review's decisions and
 * words (struct step_review_kind), an authorization's steps as one list
 * (struct attempt_history_steps), and the headings made of their nouns. */
#ifndef CHARGED_CONSOLE_KINDS_H
#define CHARGED_CONSOLE_KINDS_H

#include <jansson.h>

#include "attempt_history.h"

/* The review queue's view of the table's reviews: {"heading", "holder",
 * "kinds": {noun: {"holder", "holder_status", "decisions": [[value,
 * label], ...]}}}; NULL when out of memory. */
json_t *console_kinds_reviews(void);

/* Adds to an attempt's story doc (attempt_history_read's with t) "steps",
 * its steps of every operation of t as one list, each {kind, id, status,
 * amount, taken, reason, created_at, updated_at, transitions} (an amount
 * a number in the attempt's currency, or a word), and "steps_view",
 * {"heading", "taken"}. */
void console_kinds_steps(json_t *doc, const struct attempt_history_table *t);

#endif
