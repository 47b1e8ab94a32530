/* provider_outcome: what a payment provider answered, as data: the outcome
 * of a call (what the caller must do next, per the contract's table), the
 * answer's details, and the objects of a list page. Provider-neutral and
 * pure: the policies and the stores take them without the client that
 * fills them in (common/provider, whose backend knows the provider). */
#ifndef CHARGED_PROVIDER_OUTCOME_H
#define CHARGED_PROVIDER_OUTCOME_H

#include <stddef.h>

/* The size of every buffer that holds a provider object's id, here and
 * wherever one is copied: a provider's ids are up to 255 characters (the
 * Stripe backend's are), and one cut short names another object, or none
 * (a list cursor the provider refuses). */
#define PROVIDER_ID_MAX 256

enum provider_outcome {
    PROVIDER_SUCCEEDED = 0,   /* charge confirmed; provider_payment_id set */
    PROVIDER_PROCESSING,      /* accepted, settles later (webhook, lookup) */
    PROVIDER_DECLINED,        /* the card was declined: code, decline_code set */
    PROVIDER_NOT_EXECUTED,    /* 409, 429, refused before sending: retry same key
                                 (a 429 says `throttled`) */
    PROVIDER_UNKNOWN,         /* 5xx, timeout, lost after sending: reconcile */
    PROVIDER_REQUIRES_REVIEW, /* the key reused for another request, or an answer we
                                 cannot place */
    PROVIDER_INVALID,         /* a refused request (400): not executed, final */
    PROVIDER_NOT_FOUND,       /* look-ups only: no such payment intent */
    PROVIDER_AUTHORIZED,      /* a manual-capture payment holds the money:
                                 amount_capturable set, nothing captured yet */
    PROVIDER_OUTCOME__COUNT
};

/* "succeeded", "processing", ... for logs and the provider_calls table. */
const char *provider_outcome_name(enum provider_outcome o);

struct provider_result {
    enum provider_outcome outcome;
    int http_status;          /* 0: no answer */
    int replayed;             /* the provider answered from its idempotency store */
    int throttled;            /* a 429: over the provider's rate limit, nothing executed
                                 (NOT_EXECUTED; a look-up's stays UNKNOWN, no evidence);
                                 it slows the sender, it is no outage. Also a request
                                 the client's gate gave no share in time (not sent) */
    long long retry_after_ms; /* throttled: the provider's Retry-After, bounded
                                 (PROVIDER_RETRY_AFTER_MAX_MS); 0: none given */
    int sent;                 /* request bytes reached the wire */
    int resent;               /* times curl itself sent it again with the same key: a
                                 pooled connection closed without an answer (the
                                 first try may have executed) */
    long latency_ms;
    long long amount;           /* of the intent, when the answer carried one */
    char currency[8];           /* of the intent, lower case as sent; "" when absent */
    char intent_attempt_id[40]; /* the intent's metadata[payment_attempt_id] */
    int matches;                /* look-ups: how many intents were found */
    char provider_payment_id[PROVIDER_ID_MAX];
    char intent_status[32];
    /* Manual capture, of the intent the answer describes (intent_status
     * set): "automatic" or "manual" ("" when the intent did not say); what
     * it still holds for a capture and what was captured (-1 when the
     * intent did not say; 0 in an answer about no intent); why it was
     * canceled ("" when it was not: "automatic" is the provider's own
     * expiry of an authorization). */
    char capture_method[16];
    long long amount_capturable;
    long long amount_received;
    char cancellation_reason[32];
    char code[64];
    char decline_code[64];
    char param[64];  /* error.param: the request parameter the provider faults */
    char error[256]; /* one line: why, when not succeeded; the provider's own
                        message has its ids and quoted values masked */
    int has_more;    /* list: another page follows */
    char list_last_id[PROVIDER_ID_MAX]; /* list: the page's last object
                                           (starting_after) */
};

/* "<code>[ (<param>)]: <error>", or the error alone when the provider gave
 * no code: what a reason quotes of a refused request. */
void provider_outcome_detail(const struct provider_result *res, char *buf, size_t size);

/* The answer a pooled connection lost when the HTTP client sent the
 * request again itself, with the same key: the first try may have
 * executed, so it is recorded as a call of its own, outcome unknown. */
struct provider_result provider_outcome_lost_answer(void);

/* The longest Retry-After honoured: a minute. The provider's word is a
 * hint, not a lease on our slot: a job parked longer than that holds its
 * lease and its partition's commits for nothing (it is asked again then,
 * and parks again if still throttled). */
#define PROVIDER_RETRY_AFTER_MAX_MS 60000LL

/* A Retry-After header's value as milliseconds: delta-seconds (digits
 * only, RFC 9110), bounded to PROVIDER_RETRY_AFTER_MAX_MS; 0 when absent,
 * empty, an HTTP-date or anything else (the sender's own back-off then). */
long long provider_outcome_retry_after_ms(const char *header);

/* The back-off after a 429 that gave no Retry-After: a second, doubled for
 * each throttled answer in a row before it, at most
 * PROVIDER_RETRY_AFTER_MAX_MS. */
#define PROVIDER_THROTTLED_BACKOFF_MS 1000LL

/* How long a caller that asks again after a 429 waits first (the
 * reconciler's look, the auditor's page): the provider's Retry-After
 * (retry_after_ms, already bounded) when it gave one, else the back-off;
 * in_a_row: the throttled answers in a row before this one. Never 0: a 429
 * always slows its sender. */
long long provider_outcome_throttled_wait_ms(long long retry_after_ms, int in_a_row);

/* Does this answer park its job (its slot freed, sent again later with the
 * same key): a 429 (throttled) or a 409 (the key in use by a request still
 * running upstream)? Neither executed; neither says the provider is down. */
int provider_outcome_parks(const struct provider_result *res);

/* A provider id we can store and look up again: letters, digits and '_',
 * and shorter than PROVIDER_ID_MAX. */
int provider_outcome_id_ok(const char *id);

/* One object of a provider's list, as the auditor reads it. Every string
 * is printable ASCII, bounded ("" when absent): a byte that is not is
 * replaced by '?', so that one odd object never stops a page. */

struct provider_listed {
    char id[PROVIDER_ID_MAX];
    char status[32];
    long long amount;
    char currency[8];
    long long created;        /* unix s, the provider's clock */
    int has_attempt_metadata; /* metadata[payment_attempt_id] is a non-empty string */
    char payment_attempt_id[64];
    char order_id[64];
    char refund_id[64];                   /* refunds: metadata[refund_id] */
    char payment_intent[PROVIDER_ID_MAX]; /* refunds: the intent refunded */
    /* intents: as struct provider_result's (-1, "" when absent) */
    char capture_method[16];
    long long amount_capturable;
    long long amount_received;
    char cancellation_reason[32];
};

#define PROVIDER_PAGE_MAX 100

struct provider_page {
    struct provider_listed items[PROVIDER_PAGE_MAX];
    size_t n;
    int has_more;
};

enum provider_list_of { PROVIDER_LIST_INTENTS = 0, PROVIDER_LIST_REFUNDS };

#endif
