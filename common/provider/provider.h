/* provider: the seam between charged and a payment provider's API.
 *
 * A backend is one table of functions, `struct provider_backend`, the way
 * curl's TLS backends (`struct Curl_ssl`) and git's ref stores (`struct
 * ref_storage_be`) are: everything that knows a provider's paths, headers,
 * error shapes, object ids and event names lives behind it, in its own
 * folder (stripe/ is the only one). Callers never see it: they call
 * provider_client_* (provider_client.h), which dispatches to the backend
 * the client was opened with, and the api verifies and parses webhooks
 * through provider_webhook_* below. What a backend hands back is core's,
 * provider-neutral: struct provider_result and the list objects
 * (provider_outcome.h), struct webhook_event (webhook_event.h).
 *
 * Each entry has the contract of the provider_client_* function of the
 * same name (provider_client.h), with the backend's own client (`impl`,
 * from open) in place of the client. Every entry is set: a backend that
 * could not do one would answer it as an unknown outcome, never crash. */
#ifndef CHARGED_PROVIDER_H
#define CHARGED_PROVIDER_H

#include <stddef.h>
#include <stdint.h>

#include "provider_client.h"
#include "webhook_event.h"

/* The backend provider_client_new opens: the only one there is. */
#define PROVIDER_BACKEND_DEFAULT "stripe"

/* How far a webhook's signed timestamp may be from now, either way. */
#define WEBHOOK_SIGNATURE_TOLERANCE_S 300

/* Why a webhook delivery was refused; 0 is success. A verdict on the
 * delivery, not an error of a call: the api answers each with its own 400
 * line, and nothing is retried, so it stays an enum of its own rather than
 * a charged_rc (one that would only ever be CHARGED_BAD_ITEM). */
enum webhook_signature_rc {
    WEBHOOK_SIGNATURE_OK = 0,
    WEBHOOK_SIGNATURE_MISSING,   /* no header, or empty */
    WEBHOOK_SIGNATURE_MALFORMED, /* not the backend's signature shape */
    WEBHOOK_SIGNATURE_STALE,     /* signed more than the tolerance in the past */
    WEBHOOK_SIGNATURE_FUTURE,    /* signed more than the tolerance ahead */
    WEBHOOK_SIGNATURE_MISMATCH,  /* no signature matches any secret */
};

/* A short lowercase phrase for rc, safe to answer to anyone. */
const char *webhook_signature_error(enum webhook_signature_rc rc);

struct provider_backend {
    const char *name; /* "stripe" */

    /* The client: base_url, api_key, api_version and timeout_ms as
     * provider_client_new takes them. NULL with err on failure. */
    void *(*open)(const char *base_url, const char *api_key, const char *api_version,
                  long timeout_ms, struct charged_error *err);
    void (*close)(void *impl);

    /* Sending: a blocking charge, and the asynchronous starts. */
    void (*charge)(void *impl, const struct provider_charge *ch,
                   struct provider_result *res);
    enum charged_rc (*start_charge)(void *impl, const struct provider_charge *ch,
                                    void *opaque, struct charged_error *err);
    enum charged_rc (*start_refund)(void *impl, const struct provider_refund *r,
                                    void *opaque, struct charged_error *err);
    enum charged_rc (*start_capture)(void *impl, const struct provider_capture *c,
                                     void *opaque, struct charged_error *err);
    enum charged_rc (*start_void)(void *impl, const struct provider_void *v,
                                  void *opaque, struct charged_error *err);
    enum charged_rc (*start_probe)(void *impl, void *opaque, struct charged_error *err);

    /* The asynchronous transfers' loop: moves them forward, waiting at
     * most timeout_ms for one of them, or for one of the n_wake fds to be
     * readable (with wake fds, it waits with nothing in flight too). */
    void (*perform)(void *impl, int timeout_ms, const int *wake_fds, size_t n_wake);
    int (*next_done)(void *impl, struct provider_result *res, void **opaque);
    size_t (*in_flight)(const void *impl);
    void (*abandon_all)(void *impl);

    /* Look-ups, blocking. */
    void (*retrieve)(void *impl, const char *payment_id, struct provider_result *res);
    void (*search)(void *impl, const char *payment_attempt_id,
                   struct provider_result *res);
    void (*list)(void *impl, const char *payment_attempt_id, long long created_gte,
                 long long created_lt, const char *starting_after,
                 struct provider_result *res);
    void (*list_refunds)(void *impl, const char *payment_id, const char *refund_id,
                         const char *starting_after, struct provider_result *res);
    void (*retrieve_refund)(void *impl, const char *refund_id,
                            struct provider_result *res);
    void (*list_page)(void *impl, enum provider_list_of what, long long created_gte,
                      long long created_lt, const char *starting_after,
                      struct provider_page *page, struct provider_result *res);
    void (*fetch)(void *impl, enum provider_list_of what, const char *id,
                  struct provider_listed *obj, struct provider_result *res);

    /* Pure: an answer as a result, a list page, provider text made safe. */
    void (*classify)(const struct provider_call *call, int http_status,
                     const char *replayed, const char *body, size_t body_len,
                     struct provider_result *res);
    void (*parse_page)(enum provider_list_of what, int http_status, const char *body,
                       size_t body_len, struct provider_page *page,
                       struct provider_result *res);
    void (*redact)(char *dst, size_t size, const char *src);

    /* Webhooks: the HTTP header that carries the signature, its check (at
     * unix time now_s, against any of nsecrets secrets), and an event's
     * body into core's struct webhook_event (webhook_event.h has the
     * contract: CHARGED_OK; CHARGED_BAD_ITEM with a line safe to answer
     * (the body is refused); CHARGED_RETRY when memory ran out;
     * `normalized` the event as stored, malloc'd, or NULL not wanted). */
    const char *signature_header;
    enum webhook_signature_rc (*verify)(const char *header, const char *body,
                                        size_t body_len, const char *const *secrets,
                                        size_t nsecrets, int64_t now_s);
    enum charged_rc (*parse_event)(const char *body, size_t len,
                                   struct webhook_event *ev, char **normalized,
                                   struct charged_error *err);
};

/* The backend named `name`, or NULL when there is none of that name. */
const struct provider_backend *provider_backend_find(const char *name);
/* The backend of PROVIDER_BACKEND_DEFAULT. */
const struct provider_backend *provider_backend_default(void);

/* A client on the backend `be` (provider_client_new opens the default). */
provider_client_t *provider_client_open(const struct provider_backend *be,
                                        const char *base_url, const char *api_key,
                                        const char *api_version, long timeout_ms,
                                        struct charged_error *err);

/* Is the webhook delivery whose `be->signature_header` is `header` (NULL
 * when absent) authentic and fresh? */
enum webhook_signature_rc provider_webhook_verify(const struct provider_backend *be,
                                                  const char *header, const char *body,
                                                  size_t body_len,
                                                  const char *const *secrets,
                                                  size_t nsecrets, int64_t now_s);
/* The event the delivery carries, as be->parse_event. */
enum charged_rc provider_webhook_parse(const struct provider_backend *be,
                                       const char *body, size_t len,
                                       struct webhook_event *ev, char **normalized,
                                       struct charged_error *err);

#endif
