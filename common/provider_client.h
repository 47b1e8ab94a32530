/* provider_client: the payment provider's PaymentIntents API over libcurl.
 *
 * Every answer is classified into what the caller must do next, per the
 * contract's table. Whether a request reached the wire is observed, not
 * guessed: a failed transfer that sent no request byte is NOT_EXECUTED
 * (retry with the same key); one that did is UNKNOWN (reconcile, never
 * FAILED). The API key is sent as a bearer token and never logged, stored in
 * a result or written to an error line.
 *
 * Blocking calls (charge, retrieve, search, list) are safe from several threads;
 * they share one connection cache. The asynchronous calls (start, perform,
 * next_done) drive many charges from one thread on one multi handle; they
 * belong to the thread that uses them. */
#ifndef CHARGED_PROVIDER_CLIENT_H
#define CHARGED_PROVIDER_CLIENT_H

#include <stddef.h>

enum provider_outcome {
    PROVIDER_SUCCEEDED = 0,   /* charge confirmed; provider_payment_id set */
    PROVIDER_PROCESSING,      /* accepted, settles later (webhook, lookup) */
    PROVIDER_DECLINED,        /* 402 card_error: code, decline_code set */
    PROVIDER_NOT_EXECUTED,    /* 409, 429, refused before sending: retry same key */
    PROVIDER_UNKNOWN,         /* 5xx, timeout, lost after sending: reconcile */
    PROVIDER_REQUIRES_REVIEW, /* 400 idempotency_error, or an answer we cannot place */
    PROVIDER_INVALID,         /* 400 invalid_request_error: not executed, final */
    PROVIDER_NOT_FOUND,       /* look-ups only: no such payment intent */
};

/* "succeeded", "processing", ... for logs and the provider_calls table. */
const char *provider_outcome_name(enum provider_outcome o);

struct provider_charge {
    const char *idempotency_key;
    long long amount;     /* minor units */
    const char *currency; /* ISO 4217; sent in lower case */
    const char *payment_method;
    const char *customer_id; /* sent as `customer`; NULL or "" for none */
    const char *payment_attempt_id;
    const char *order_id;
};

struct provider_result {
    enum provider_outcome outcome;
    int http_status; /* 0: no answer */
    int replayed;    /* Idempotent-Replayed: true */
    int sent;        /* request bytes reached the wire */
    int resent;      /* times curl itself sent it again with the same key: a
                        pooled connection closed without an answer (the
                        first try may have executed) */
    long latency_ms;
    long long amount;           /* of the intent, when the answer carried one */
    char currency[8];           /* of the intent, lower case as sent; "" when absent */
    char intent_attempt_id[40]; /* the intent's metadata[payment_attempt_id] */
    int matches;                /* look-ups: how many intents were found */
    char provider_payment_id[96];
    char intent_status[32];
    char code[64];
    char decline_code[64];
    char param[64];        /* error.param: the request parameter the provider faults */
    char error[256];       /* one line: why, when not succeeded; the provider's own
                              message has its ids and quoted values masked */
    int has_more;          /* list: another page follows */
    char list_last_id[96]; /* list: the page's last intent (starting_after) */
};

typedef struct provider_client provider_client_t;

/* base_url e.g. "http://127.0.0.1:12111"; api_version is pinned with a
 * Stripe-Version header on every request (NULL or "" sends none). Copies
 * all three; the key is wiped from memory by provider_client_free. NULL and
 * errbuf on failure. */
provider_client_t *provider_client_new(const char *base_url, const char *api_key,
                                       const char *api_version, long timeout_ms,
                                       char *errbuf, size_t errbuf_size);
void provider_client_free(provider_client_t *pc);

/* Blocking. Always fill *res; return 0 (the outcome says what happened). */
int provider_client_charge(provider_client_t *pc, const struct provider_charge *ch,
                           struct provider_result *res);
/* GET /v1/payment_intents/<id>. */
int provider_client_retrieve(provider_client_t *pc, const char *payment_intent_id,
                             struct provider_result *res);
/* GET /v1/payment_intents/search by metadata['payment_attempt_id']; the
 * result describes the most settled intent found (succeeded first). */
int provider_client_search(provider_client_t *pc, const char *payment_attempt_id,
                           struct provider_result *res);

/* GET /v1/payment_intents?created[gte]=..&created[lt]=..&limit=100
 * [&starting_after=..]: one page of the provider's list, newest first.
 * Unlike search the list is consistent, so a walk of every page that finds
 * no intent is evidence of absence. Of the page's intents only those whose
 * metadata[payment_attempt_id] is the attempt's count: `matches` says how
 * many, and the result describes the most settled one (as search); none is
 * NOT_FOUND. has_more and list_last_id say where the next page starts. Any
 * other answer (no answer, 5xx, not a list) is UNKNOWN or INVALID: no
 * evidence. created_* are unix seconds. */
int provider_client_list(provider_client_t *pc, const char *payment_attempt_id,
                         long long created_gte, long long created_lt,
                         const char *starting_after, struct provider_result *res);

/* "<code>[ (<param>)]: <error>", or the error alone when the provider gave
 * no code: what a reason quotes of a refused request. */
void provider_client_error_detail(const struct provider_result *res, char *buf,
                                  size_t size);

/* Copies provider text bounded, valid UTF-8, with anything shaped like a
 * provider object id (cus_..., pi_..., pm_..., sk_..., ...) and every
 * quoted value masked: a provider message echoes what it was sent (a
 * customer, a card token) and must not carry it into reasons, events or
 * logs. Every message the client keeps goes through it. */
void provider_client_redact(char *dst, size_t size, const char *src);

/* Asynchronous charges. start() copies what it needs from ch; `opaque` comes
 * back with the result. 0 / -1 with errbuf. */
int provider_client_start_charge(provider_client_t *pc,
                                 const struct provider_charge *ch, void *opaque,
                                 char *errbuf, size_t errbuf_size);
/* Asynchronous POST /v1/payment_intents that the provider must refuse
 * before executing it (amount 0, no payment method, not confirmed), done
 * through next_done like a charge. It charges nothing: the worker's provider
 * breaker asks with it whether the endpoint charges go to answers (any
 * answer but 429 or 5xx; a 400 is the expected one). */
int provider_client_start_probe(provider_client_t *pc, void *opaque, char *errbuf,
                                size_t errbuf_size);
/* Moves transfers forward, waiting at most timeout_ms for activity. */
void provider_client_perform(provider_client_t *pc, int timeout_ms);
/* Takes one finished transfer: returns 1 and fills *res / *opaque, or 0. */
int provider_client_next_done(provider_client_t *pc, struct provider_result *res,
                              void **opaque);
/* Charges started and not yet taken by next_done. */
size_t provider_client_in_flight(const provider_client_t *pc);
/* Abandons every unfinished asynchronous charge (shutdown). */
void provider_client_abandon_all(provider_client_t *pc);

#endif
