/* psp_webhooks: the simulated provider's webhook deliveries — Stripe-shaped
 * events about payment intents, POSTed to one URL and signed as Stripe signs
 * them, at least once.
 *
 * One thread delivers. An event is retried with a doubling back-off until
 * the receiver answers 2xx; any other answer, a connection error or a
 * timeout is a failure. Optionally, as real providers do, an acknowledged
 * event is sent once more later (duplicate rate), and an event is held back
 * until the one queued behind it has been sent (reorder rate); both are
 * decided by a hash of (seed, the event's ordinal), so a run with the same
 * seed and the same events repeats them. Queuing never blocks: when the
 * bounded queue is full the event is dropped and counted.
 *
 * Signature, computed at each send: Stripe-Signature: t=<unix>,v1=<hex>,
 * the hex HMAC-SHA256 of "<t>.<body>" keyed with the signing secret; during
 * a rotation that keeps the old secret, a second v1 with the old one. The
 * secrets never leave this module: not in logs, errors or answers.
 * Thread-safe. */
#ifndef PSP_WEBHOOKS_H
#define PSP_WEBHOOKS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

typedef struct psp_webhooks psp_webhooks_t;

/* Strings are copied. */
struct psp_webhooks_config {
    const char *url;       /* http:// or https://; NULL: events are neither kept
                              nor sent */
    const char *secret;    /* signing secret, required with url */
    double duplicate_rate; /* 0..1 */
    double reorder_rate;   /* 0..1 */
    int64_t retry_ms;      /* first back-off after a failure, then doubling */
    int64_t retry_max_ms;  /* ... up to this */
    int64_t timeout_ms;    /* one delivery's limit, connecting included */
    size_t queue_max;      /* deliveries waiting or in flight, at most */
    uint64_t seed;
};

/* 0 / -1 with errbuf (a bad url or a missing secret). The url is checked
 * only for its scheme; errbuf never holds the secret. */
int psp_webhooks_check_config(const struct psp_webhooks_config *cfg, char *errbuf,
                              size_t errbuf_size);

/* Starts the delivery thread when cfg->url is set (curl_global_init must
 * have run). NULL when out of memory or the thread cannot start. */
psp_webhooks_t *psp_webhooks_new(const struct psp_webhooks_config *cfg);
/* Stops the thread (a delivery in flight is abandoned within about a
 * second, whatever the timeout), drops what is pending and wipes the
 * secrets. Logs how many deliveries were still pending. */
void psp_webhooks_free(psp_webhooks_t *w);

/* Event types and the intent status each stands for:
 * payment_intent.succeeded / succeeded, .processing / processing,
 * .payment_failed / requires_payment_method, .canceled / canceled,
 * .amount_capturable_updated / requires_capture (an authorization).
 * NULL when there is none. */
const char *psp_webhooks_type_for_status(const char *status);
const char *psp_webhooks_status_for_type(const char *type);

enum psp_webhooks_queued {
    PSP_WH_QUEUED = 0,
    PSP_WH_DISABLED, /* no url: nothing is sent */
    PSP_WH_DROPPED,  /* the queue is full (counted in "dropped") */
};

/* Queues the event {"id","object":"event","type","created","livemode":false,
 * "data":{"object":intent}}. intent is borrowed and serialised before this
 * returns; id NULL: a new unique evt_ id. id_out (may be NULL) gets the id. */
enum psp_webhooks_queued psp_webhooks_enqueue(psp_webhooks_t *w, const char *type,
                                              json_t *intent, int64_t created_s,
                                              const char *id, char *id_out,
                                              size_t id_out_size);

/* From now on deliveries are signed with secret; keep_old: also with the
 * one in use until now (one secret is kept at most besides the new one).
 * -1 with errbuf when secret is empty. */
int psp_webhooks_rotate(psp_webhooks_t *w, const char *secret, int keep_old,
                        char *errbuf, size_t errbuf_size);

/* {"url","pending","delivered","sends","failures","duplicates","reordered",
 *  "dropped","events","signing_secrets"} (new reference; no secret). */
json_t *psp_webhooks_stats_json(psp_webhooks_t *w);
/* The last `limit` events queued, oldest first: {"events":[{"id","type",
 * "intent","created","attempts","acknowledged"}]} (new reference). */
json_t *psp_webhooks_events_json(psp_webhooks_t *w, size_t limit);

/* Drops every pending delivery and zeroes the counters and the events list
 * (a delivery in flight is still made, then forgotten). URL and secrets
 * stay. */
void psp_webhooks_reset(psp_webhooks_t *w);

#endif
