/* console_views: what the console's JSON endpoints answer, each from the
 * stores chargectl reads and writes (attempt_history, attempt_review,
 * dlq_reader, console_store, audit_store, fleet_status), so that a page and
 * a command never disagree. Every view returns an HTTP status and sets
 * *body to a JSON value (the caller owns it; {"error": "..."} for a 4xx or
 * 5xx); *body is NULL only when out of memory.
 *
 * A console_views_t holds one request's connections: the console lends one
 * to each request at a time. */
#ifndef CHARGED_CONSOLE_VIEWS_H
#define CHARGED_CONSOLE_VIEWS_H

#include <jansson.h>

#include "config.h"
#include "console_input.h"
#include "console_store.h"
#include "provider_client.h"

typedef struct console_views console_views_t;

/* Connects nothing yet; NULL with err on a bad setting. cfg outlives it. */
console_views_t *console_views_new(const config_t *cfg, struct charged_error *err);
void console_views_free(console_views_t *v);
/* Its provider client (the console gates it on the fleet's budget). */
provider_client_t *console_views_provider(console_views_t *v);

/* The console store, for sign-in and sessions. */
console_store_t *console_views_store(console_views_t *v);

unsigned console_views_overview(console_views_t *v, json_t **body);
unsigned console_views_reviews(console_views_t *v, json_t **body);
unsigned console_views_find(console_views_t *v, const char *id, json_t **body);
unsigned console_views_attempt(console_views_t *v, const char *id, json_t **body);
unsigned console_views_letters(console_views_t *v, const struct console_letter_query *q,
                               json_t **body);
unsigned console_views_letter(console_views_t *v, const char *position, json_t **body);
unsigned console_views_actions(console_views_t *v, json_t **body);

/* The three that change something, recorded with who->name as the actor. */
/* session: the request's, looked up again once the provider has answered
 * and before the decision is written (a token revoked meanwhile writes
 * nothing). */
unsigned console_views_resolve(console_views_t *v, const struct console_who *who,
                               const char *session, const char *attempt_id,
                               const struct console_resolve_input *in, json_t **body);
/* The review of an operation's record (kind: the noun of one of the
 * table's reviews, op.h), as console_views_resolve an attempt's
 * (step_review.h). */
unsigned console_views_step_resolve(console_views_t *v, const struct console_who *who,
                                    const char *session, const char *kind,
                                    const char *id,
                                    const struct console_step_resolve_input *in,
                                    json_t **body);
unsigned console_views_replay(console_views_t *v, const struct console_who *who,
                              const struct console_replay_input *in, json_t **body);

#endif
