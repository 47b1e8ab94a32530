/* stripe_internal: what the Stripe backend's files share, and nothing
 * outside common/provider/stripe/ includes.
 *
 * stripe_http.c     the client, its transfers over libcurl (the wire rule:
 *                   nothing sent is NOT_EXECUTED, sent without an answer is
 *                   UNKNOWN), the asynchronous loop and blocking GETs;
 * stripe_requests.c what each call sends: PaymentIntents and Refunds paths,
 *                   form bodies, search query syntax; and the backend's
 *                   table, struct provider_backend;
 * stripe_classify.c an answer as a result (the contract's table over
 *                   Stripe's error shape), and redaction of its text;
 * stripe_page.c     list pages and single objects, as the auditor reads them;
 * stripe_event.c    a webhook event into core's struct webhook_event;
 * stripe_signature.c the Stripe-Signature header.
 * The client and its transfers are stripe_wire.h's: only the files that
 * use libcurl include it. */
#ifndef CHARGED_STRIPE_INTERNAL_H
#define CHARGED_STRIPE_INTERNAL_H

#include <stddef.h>

#include <jansson.h>

#include "provider.h"

/* ---- stripe_requests.c ---- */

void stripe_charge(void *impl, const struct provider_charge *ch,
                   struct provider_result *res);
enum charged_rc stripe_start_charge(void *impl, const struct provider_charge *ch,
                                    void *opaque, struct charged_error *err);
enum charged_rc stripe_start_refund(void *impl, const struct provider_refund *r,
                                    void *opaque, struct charged_error *err);
enum charged_rc stripe_start_capture(void *impl, const struct provider_capture *c,
                                     void *opaque, struct charged_error *err);
enum charged_rc stripe_start_void(void *impl, const struct provider_void *v,
                                  void *opaque, struct charged_error *err);
enum charged_rc stripe_start_probe(void *impl, void *opaque, struct charged_error *err);
void stripe_retrieve(void *impl, const char *payment_intent_id,
                     struct provider_result *res);
void stripe_search(void *impl, const char *payment_attempt_id,
                   struct provider_result *res);
void stripe_list(void *impl, const char *payment_attempt_id, long long created_gte,
                 long long created_lt, const char *starting_after,
                 struct provider_result *res);
void stripe_list_refunds(void *impl, const char *payment_intent, const char *refund_id,
                         const char *starting_after, struct provider_result *res);
void stripe_retrieve_refund(void *impl, const char *refund_id,
                            struct provider_result *res);
void stripe_list_page(void *impl, enum provider_list_of what, long long created_gte,
                      long long created_lt, const char *starting_after,
                      struct provider_page *page, struct provider_result *res);
void stripe_fetch(void *impl, enum provider_list_of what, const char *id,
                  struct provider_listed *obj, struct provider_result *res);

/* ---- stripe_classify.c ---- */

/* Provider text, bounded, valid UTF-8, card numbers masked. */
void stripe_copy_str(char *dst, size_t size, const char *src);
void stripe_classify(const struct provider_call *call, int http_status,
                     const char *replayed, const char *body, size_t body_len,
                     struct provider_result *res);
void stripe_redact(char *dst, size_t size, const char *src);

/* ---- stripe_page.c ---- */

/* A GET's answer, parsed, not classified: the JSON object of a 200 (the
 * caller decrefs it), or NULL with res->outcome and res->error set. */
json_t *stripe_answer_json(int http, const char *body, size_t body_len,
                           struct provider_result *res);
/* One listed object into *obj; -1 when it is not an object of `what` with
 * an id. */
int stripe_read_listed(json_t *o, enum provider_list_of what,
                       struct provider_listed *obj);
/* A list page's JSON into *page, or res->outcome INVALID and no page. */
void stripe_read_page(json_t *doc, enum provider_list_of what,
                      struct provider_page *page, struct provider_result *res);
void stripe_parse_page(enum provider_list_of what, int http_status, const char *body,
                       size_t body_len, struct provider_page *page,
                       struct provider_result *res);

#endif
