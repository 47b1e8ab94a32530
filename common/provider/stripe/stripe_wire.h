/* stripe_wire: the Stripe backend's client and its transfers over
 * libcurl (stripe_http.c), for the backend's files that send. */
#ifndef CHARGED_STRIPE_WIRE_H
#define CHARGED_STRIPE_WIRE_H

#include <pthread.h>
#include <stddef.h>

#include <curl/curl.h>
#include <jansson.h>

#include "stripe_internal.h"

/* One request in flight: its handle, what it wrote and what came back. */
struct stripe_xfer {
    CURL *easy;
    struct curl_slist *headers;
    char *body;   /* form body sent */
    char *answer; /* body received */
    size_t answer_len;
    size_t bytes_out; /* request bytes curl reported sent */
    int sends;        /* times the request's headers went out */
    void *opaque;
    struct provider_call call; /* what was asked: how the answer is classified */
    /* In the client's list of async transfers: unlinked in O(1) when done
     * (a walk of it per answer was quadratic with thousands in flight). */
    struct stripe_xfer *next, *prev;
};

/* The backend's client (the `impl` of struct provider_backend). */
struct stripe_client {
    char *base_url;
    char *auth_header;    /* "Authorization: Bearer ..." */
    char *version_header; /* "Stripe-Version: ...", or NULL */
    long timeout_ms;
    CURLSH *share;
    pthread_mutex_t share_locks[CURL_LOCK_DATA_LAST];
    CURLM *multi;
    struct stripe_xfer *async; /* started, unfinished or untaken */
    size_t in_flight;
};

/* ---- stripe_http.c ---- */

void *stripe_open(const char *base_url, const char *api_key, const char *api_version,
                  long timeout_ms, struct charged_error *err);
void stripe_close(void *impl);
/* A transfer to url, with the client's headers; body (taken: owned by the
 * transfer, or freed) makes it a POST. with_share: the blocking calls'
 * connection cache. NULL when out of memory. */
struct stripe_xfer *stripe_xfer_new(struct stripe_client *pc, const char *url,
                                    char *body, int with_share);
void stripe_xfer_free(struct stripe_xfer *x);
/* Appends "&name=escaped(value)" to a growing form body. 0 / -1. */
int stripe_form_add(char **body, size_t *len, const char *name, const char *value);
/* A POST of body (taken) to the base url and path, with an Idempotency-Key
 * the caller has checked. NULL with err on failure. */
struct stripe_xfer *stripe_post_xfer(struct stripe_client *pc, const char *path,
                                     char *body, const char *idempotency_key,
                                     int with_share, struct charged_error *err);
/* Turns a finished transfer into a result. */
void stripe_finish(struct stripe_xfer *x, CURLcode cc, struct provider_result *res);
/* A throttled answer's Retry-After into res->retry_after_ms (bounded). */
void stripe_retry_after(struct stripe_xfer *x, struct provider_result *res);
/* A blocking GET of url classified as a look-up of `kind`: *res says. */
void stripe_lookup(struct stripe_client *pc, const char *url, enum provider_lookup kind,
                   int refund, const char *attempt_id, struct provider_result *res);
/* A blocking GET's JSON object (stripe_answer_json), or NULL with res set. */
json_t *stripe_get_json(struct stripe_client *pc, const char *url,
                        struct provider_result *res);
/* Hands x to the multi handle: CHARGED_OK, or CHARGED_RETRY with err (x is
 * freed). */
enum charged_rc stripe_start_async(struct stripe_client *pc, struct stripe_xfer *x,
                                   void *opaque, struct charged_error *err);
void stripe_perform(void *impl, int timeout_ms, const int *wake_fds, size_t n_wake);
int stripe_next_done(void *impl, struct provider_result *res, void **opaque);
size_t stripe_in_flight(const void *impl);
void stripe_abandon_all(void *impl);

#endif
