/* provider_client: the payment provider's API, as every caller uses it:
 * charges (payments), authorizations, captures, voids, refunds and
 * look-ups. A face over the provider seam (provider.h): each call goes to
 * the backend the client was opened with (provider_client_new: the
 * default, "stripe"; the paths, headers and shapes below are that
 * backend's, in common/provider/stripe/).
 *
 * Every answer is classified into what the caller must do next, per the
 * contract's table. Whether a request reached the wire is observed, not
 * guessed: a failed transfer that sent no request byte is NOT_EXECUTED
 * (retry with the same key); one that did is UNKNOWN (reconcile, never
 * FAILED). A 429 is over the provider's rate limit: NOT_EXECUTED (a
 * look-up's UNKNOWN) with `throttled` set and `retry_after_ms` from its
 * Retry-After header (provider_outcome.h); no other answer is throttled.
 * The API key is sent as a bearer token and never logged, stored in
 * a result or written to an error line.
 *
 * Blocking calls (charge, retrieve, search, list) are safe from several threads;
 * they share one connection cache. The asynchronous calls (start, perform,
 * next_done) drive many charges and other operations from one thread on
 * one multi handle; they belong to the thread that uses them. */
#ifndef CHARGED_PROVIDER_CLIENT_H
#define CHARGED_PROVIDER_CLIENT_H

#include <stddef.h>

#include "budget_alloc.h"
#include "charged_error.h"
#include "provider_outcome.h"

/* When a payment's money is taken: at once (a charge), or held by an
 * authorization until a capture takes it or a void releases it. */
enum provider_capture_method {
    PROVIDER_CAPTURE_AUTOMATIC = 0, /* the default: a charge */
    PROVIDER_CAPTURE_MANUAL         /* an authorization */
};

struct provider_charge {
    const char *idempotency_key;
    long long amount;     /* minor units */
    const char *currency; /* ISO 4217; sent in lower case */
    const char *payment_method;
    const char *customer_id; /* sent as `customer`; NULL or "" for none */
    const char *payment_attempt_id;
    const char *order_id;
    enum provider_capture_method capture_method; /* 0: automatic */
};

typedef struct provider_client provider_client_t;

/* A client of the default backend (PROVIDER_BACKEND_DEFAULT; another is
 * provider_client_open's, provider.h). base_url e.g.
 * "http://127.0.0.1:12111"; api_version is pinned with the backend's
 * version header on every request (NULL or "" sends none). Copies all
 * three; the key is wiped from memory by provider_client_free. NULL and
 * err on failure (a configuration error: a bad url, key or version). */
provider_client_t *provider_client_new(const char *base_url, const char *api_key,
                                       const char *api_version, long timeout_ms,
                                       struct charged_error *err);
void provider_client_free(provider_client_t *pc);

/* A gate every request of this client waits on before it is sent: the
 * fleet's provider budget (budget_member_gate). Called with the request's
 * endpoint class (a charge and the breaker's probe: create; a capture or
 * void: capture; a refund: refund; one intent or refund fetched: retrieve;
 * a search: search; a list page: list); 0: send. Else nothing is sent: a
 * blocking call answers NOT_EXECUTED with http_status 0 and the gate's
 * `why` as its error (a list page empty), a start answers CHARGED_RETRY
 * with it. NULL (the default): no gate. The worker sets none: its engine
 * asks the budget itself and parks a job that must wait.
 *
 * A gated client (every role's but the worker's) counts each request it
 * sent once its answer is in, blocking or started, in the process's
 * metrics: charged_provider_responses_total{operation,class} (the
 * operation: charge or authorize, capture, void, refund, probe, retrieve,
 * search, list, retrieve_refund, list_refunds), its duration, and a 429 in
 * charged_provider_throttled_total{class} by endpoint class: the series
 * the worker's engine counts its own answers in, for
 * ChargedProviderThrottled. A request the gate refused is not counted. */
typedef int (*provider_gate_fn)(void *ctx, enum budget_class cls, char *why,
                                size_t why_size);
/* Every arrival is paid for: when the backend sent a request n more times
 * than the gate let it (it re-sent it after a pooled connection closed
 * unanswered: provider_result.resent), charge is called with its class
 * and n once its answer is in (budget_member_gate_charge). NULL: none. */
typedef void (*provider_charge_fn)(void *ctx, enum budget_class cls, int n);
/* Set both before the client's first request; ctx is handed to both. */
void provider_client_set_gate(provider_client_t *pc, provider_gate_fn gate,
                              provider_charge_fn charge, void *ctx);

/* Blocking. Each of the look-ups below and the charge fills *res, whose
 * outcome is the answer: a verdict on the call (provider_outcome.h), not a
 * charged_rc. They return nothing else. */
void provider_client_charge(provider_client_t *pc, const struct provider_charge *ch,
                            struct provider_result *res);
/* One payment by the provider's id. Look-ups classify an intent by its
 * own status: succeeded SUCCEEDED, processing PROCESSING,
 * requires_payment_method or canceled DECLINED, requires_capture of a
 * manual-capture intent AUTHORIZED, any other REQUIRES_REVIEW; and carry
 * its capture_method, amount_capturable, amount_received and
 * cancellation_reason: the evidence a capture or void is settled on. */
void provider_client_retrieve(provider_client_t *pc, const char *payment_intent_id,
                              struct provider_result *res);
/* The provider's search for the payments whose metadata names the
 * attempt; the result describes the most settled one found (succeeded
 * first). */
void provider_client_search(provider_client_t *pc, const char *payment_attempt_id,
                            struct provider_result *res);

/* One page (100 at most) of the provider's list of payments created in
 * [created_gte, created_lt), newest first, after starting_after.
 * Unlike search the list is consistent, so a walk of every page that finds
 * no intent is evidence of absence. Of the page's intents only those whose
 * metadata[payment_attempt_id] is the attempt's count: `matches` says how
 * many, and the result describes the most settled one (as search); none is
 * NOT_FOUND. has_more and list_last_id say where the next page starts. Any
 * other answer (no answer, 5xx, a 404 whatever its code, not a list) is
 * UNKNOWN or INVALID: no evidence. created_* are unix seconds. */
void provider_client_list(provider_client_t *pc, const char *payment_attempt_id,
                          long long created_gte, long long created_lt,
                          const char *starting_after, struct provider_result *res);

/* Copies provider text bounded, valid UTF-8, with anything shaped like one
 * of the provider's object ids (a customer's, a payment's, a key...) and
 * every quoted value masked: a provider message echoes what it was sent (a
 * customer, a card token) and must not carry it into reasons, events or
 * logs. Every message the client keeps goes through it. */
void provider_client_redact(char *dst, size_t size, const char *src);

/* What a request asked, as the classification of its answer needs it. */
enum provider_lookup {
    PROVIDER_LOOKUP_RETRIEVE = 0,
    PROVIDER_LOOKUP_SEARCH,
    PROVIDER_LOOKUP_LIST
};

/* Which POST an answer answers, when it is not a charge's or a refund's. */
enum provider_operation {
    PROVIDER_OPERATION_NONE = 0,
    PROVIDER_OPERATION_CAPTURE, /* provider_client_start_capture */
    PROVIDER_OPERATION_VOID,    /* provider_client_start_void */
};

struct provider_call {
    int lookup; /* a GET: classify as a look-up of `kind` */
    enum provider_lookup kind;
    enum provider_operation operation; /* a capture's or a void's answer */
    int refund;       /* about a refund: classify as a refund's answer */
    int manual;       /* a charge with capture_method manual: an authorization */
    long long amount; /* a charge's, refund's or capture's (<= 0: all): checked
                         in the answer */
    char currency[8];
    char attempt_id[40]; /* a charge's, a capture's, or the one a list page is
                            searched for (a refund's: its refund_id) */
    char payment_intent[PROVIDER_ID_MAX]; /* a capture's or void's intent */
};

/* The answer to `call` as a result: its HTTP status, the backend's
 * replayed header (the provider answered from its idempotency store; NULL
 * when absent) and its body (NULL when none). What the client
 * does with every answer once the transfer is done; pure, so that tests and
 * the fuzz targets can feed it any answer. Sets http_status, replayed and
 * the classification; leaves the wire's fields (sent, latency) alone. */
void provider_client_classify(const struct provider_call *call, int http_status,
                              const char *replayed, const char *body, size_t body_len,
                              struct provider_result *res);

/* A list page's answer as provider_client_list_page reads it (status 200
 * and a list object, else outcome and error say why, page empty). Pure. */
void provider_client_parse_page(enum provider_list_of what, int http_status,
                                const char *body, size_t body_len,
                                struct provider_page *page,
                                struct provider_result *res);

/* Asynchronous charges. start() copies what it needs from ch; `opaque` comes
 * back with the result. CHARGED_OK, or with err and nothing started:
 * CHARGED_BAD_ITEM when the request cannot be sent (no usable idempotency
 * key or id: sending it again fails again), CHARGED_RETRY when memory ran
 * out or the transfer cannot start.
 *
 * A charge with capture_method manual is an authorization: the answer
 * that the payment holds the money (Stripe's requires_capture) is
 * AUTHORIZED, with amount_capturable; one that says the money was taken
 * (succeeded), or an intent of the other capture method, is
 * REQUIRES_REVIEW. For an automatic charge a hold is REQUIRES_REVIEW, as
 * every status a charge should not end in. Either way the intent must be
 * the one asked for (amount, currency, attempt), else REQUIRES_REVIEW. */
enum charged_rc provider_client_start_charge(provider_client_t *pc,
                                             const struct provider_charge *ch,
                                             void *opaque, struct charged_error *err);

/* The capture of an authorized payment: all of what it holds (amount <= 0)
 * or part, once; the rest is released. The provider's capture takes no
 * metadata here (psp-sim refuses any parameter but the amount), so the
 * attempt is not sent: it is checked in the answer (the intent's
 * metadata names it, else REQUIRES_REVIEW). */
struct provider_capture {
    const char *idempotency_key;
    const char *payment_intent;     /* the authorization's provider id */
    long long amount;               /* minor units; <= 0: all that is capturable */
    const char *payment_attempt_id; /* the authorization's attempt */
};

/* The void of an authorized (or otherwise uncaptured) payment. */
struct provider_void {
    const char *idempotency_key;
    const char *payment_intent; /* the authorization's provider id */
    const char *reason;         /* requested_by_customer|duplicate|fraudulent|abandoned;
                                   NULL or "": none sent */
};

/* Asynchronous capture and void, through perform/next_done like a charge:
 * the same headers, timeouts, wire rule (nothing sent: NOT_EXECUTED; sent,
 * no answer: UNKNOWN) and redaction. Copy what they need. CHARGED_OK, or
 * CHARGED_BAD_ITEM / CHARGED_RETRY with err as start_charge's (no usable
 * key or intent id, out of memory): nothing started.
 *
 * Their answers fill the result from the intent (provider_payment_id,
 * intent_status, amount, currency, capture_method, amount_capturable,
 * amount_received, cancellation_reason):
 *   capture: the intent succeeded: SUCCEEDED, amount_received what was
 *     captured; processing: PROCESSING; another intent, another attempt's,
 *     another amount captured than asked, or any other status:
 *     REQUIRES_REVIEW;
 *   void: the intent canceled: SUCCEEDED, cancellation_reason set; another
 *     intent or any other status: REQUIRES_REVIEW;
 *   both: refused in the intent's state (Stripe's 400
 *     payment_intent_unexpected_state: captured already, voided, expired)
 *     or beyond what it holds (amount_too_large): INVALID, code the
 *     provider's, and intent_status and cancellation_reason from the
 *     intent the refusal carries (canceled with "automatic": the
 *     authorization expired); no such intent (404 resource_missing):
 *     INVALID; other answers as a charge's (the key reused for another
 *     request: REQUIRES_REVIEW; 409, 429, 401, 403, another 404:
 *     NOT_EXECUTED; 5xx: UNKNOWN). */
enum charged_rc provider_client_start_capture(provider_client_t *pc,
                                              const struct provider_capture *c,
                                              void *opaque, struct charged_error *err);
enum charged_rc provider_client_start_void(provider_client_t *pc,
                                           const struct provider_void *v, void *opaque,
                                           struct charged_error *err);

/* A refund of part or all of one succeeded charge. */
struct provider_refund {
    const char *idempotency_key;
    const char *payment_intent;     /* the charge's provider id */
    long long amount;               /* minor units */
    const char *reason;             /* requested_by_customer|duplicate|fraudulent */
    const char *refund_id;          /* sent as metadata[refund_id] */
    const char *payment_attempt_id; /* sent as metadata[payment_attempt_id] */
};

/* Refund answers fill struct provider_result so: outcome from the refund's
 * status (succeeded: SUCCEEDED; pending, requires_action: PROCESSING;
 * failed, canceled: DECLINED with code the provider's reason, else
 * "refund_failed" / "refund_canceled"; any other: REQUIRES_REVIEW),
 * provider_payment_id the refund's provider id, intent_status its status,
 * intent_attempt_id the refund_id its metadata names, amount and currency
 * its own. Other answers are classified as a charge's (a refused request:
 * INVALID; the key reused for another request: REQUIRES_REVIEW; 409, 429:
 * NOT_EXECUTED; 5xx, lost after sending: UNKNOWN); a 404 saying the object
 * is missing is INVALID on the POST (no such payment), NOT_FOUND on a
 * retrieve. */

/* An asynchronous refund through perform/next_done like a charge (headers,
 * key, wire rule, redaction), naming the
 * payment, amount, reason, and refund_id and payment_attempt_id in its
 * metadata. A 2xx refund whose amount or refund_id is not the one asked
 * for is REQUIRES_REVIEW. Copies what it needs. CHARGED_OK, or
 * CHARGED_BAD_ITEM / CHARGED_RETRY with err as start_charge's: nothing
 * started. */
enum charged_rc provider_client_start_refund(provider_client_t *pc,
                                             const struct provider_refund *r,
                                             void *opaque, struct charged_error *err);
/* Blocking: one refund by the provider's id. */
void provider_client_retrieve_refund(provider_client_t *pc, const char *refund_id,
                                     struct provider_result *res);
/* Blocking: one page (100 at most) of a payment's refunds, after
 * starting_after; only refunds whose metadata names `refund_id` count
 * (matches), the result describing the most settled one (succeeded >
 * pending > any other > failed); none NOT_FOUND; has_more/list_last_id as
 * provider_client_list. A 404 (say, the provider does not have the
 * payment, or no longer) is UNKNOWN: the list looked at nothing. */
void provider_client_list_refunds(provider_client_t *pc, const char *payment_intent,
                                  const char *refund_id, const char *starting_after,
                                  struct provider_result *res);

/* Blocking: one page of every intent (or refund) created in [created_gte,
 * created_lt) (unix s), newest first, 100 at most, after starting_after
 * (NULL or "": the first page). res->outcome is SUCCEEDED when *page holds
 * the page; anything else (no answer, 4xx, 5xx, not a list, an object
 * without id or of another type) is UNKNOWN or INVALID with res->error,
 * and page->n is 0: no evidence of anything. */
void provider_client_list_page(provider_client_t *pc, enum provider_list_of what,
                               long long created_gte, long long created_lt,
                               const char *starting_after, struct provider_page *page,
                               struct provider_result *res);

/* Blocking: one object (a payment or a refund) by id into *obj.
 * res->outcome SUCCEEDED: *obj holds it; NOT_FOUND: the provider answered
 * that it does not have it; anything else: no evidence. */
void provider_client_fetch(provider_client_t *pc, enum provider_list_of what,
                           const char *id, struct provider_listed *obj,
                           struct provider_result *res);

/* An asynchronous POST to the charge endpoint that the provider must
 * refuse before executing it (amount 0, no payment method, not confirmed), done
 * through next_done like a charge. It charges nothing: the worker's provider
 * breaker asks with it whether the endpoint charges go to answers (any
 * answer but 429 or 5xx; a 400 is the expected one). CHARGED_OK, or
 * CHARGED_RETRY with err: nothing started. */
enum charged_rc provider_client_start_probe(provider_client_t *pc, void *opaque,
                                            struct charged_error *err);
/* Moves transfers forward, waiting at most timeout_ms for activity. */
void provider_client_perform(provider_client_t *pc, int timeout_ms);
/* The same, in one wait with other sources: it also ends when one of the
 * n_wake fds (at most PROVIDER_WAKE_FDS_MAX) can be read, and waits its
 * timeout with nothing in flight. A loop's only wait (the worker's). */
#define PROVIDER_WAKE_FDS_MAX 4
void provider_client_wait(provider_client_t *pc, int timeout_ms, const int *wake_fds,
                          size_t n_wake);
/* Takes one finished transfer: returns 1 and fills *res / *opaque, or 0. */
int provider_client_next_done(provider_client_t *pc, struct provider_result *res,
                              void **opaque);
/* Transfers (charges, captures, voids, refunds, probes) started and not yet taken by
 * next_done. */
size_t provider_client_in_flight(const provider_client_t *pc);
/* Abandons every unfinished asynchronous transfer (shutdown). */
void provider_client_abandon_all(provider_client_t *pc);

#endif
