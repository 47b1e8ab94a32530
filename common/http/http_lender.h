/* http_lender: what a listener with a thread pool lends its requests: one
 * of n resources (a store, a set of connections), one per listener thread,
 * for one request at a time; and the count of requests in hand, so that a
 * drain can stop taking new ones and wait for those.
 *
 *   http_lender_t *l = http_lender_new(stores, n);
 *   http_lender_enter(l);            // a request begins
 *   void *st = http_lender_take(l);  // waits for a free one
 *   ...
 *   http_lender_give(l, st);
 *   http_lender_leave(l);            // the answer is queued
 *   ...
 *   left = http_lender_drain(l, daemon, deadline);
 */
#ifndef CHARGED_HTTP_LENDER_H
#define CHARGED_HTTP_LENDER_H

#include <stddef.h>
#include <stdint.h>

#include <microhttpd.h>

typedef struct http_lender http_lender_t;

/* Lends items[0..n-1] (not copied, not freed: the caller's). NULL when out
 * of memory. */
http_lender_t *http_lender_new(void *const *items, size_t n);
void http_lender_free(http_lender_t *l);

/* One of the items, waiting while all are lent. */
void *http_lender_take(http_lender_t *l);
void http_lender_give(http_lender_t *l, void *item);

/* A request begins / its answer is queued. */
void http_lender_enter(http_lender_t *l);
void http_lender_leave(http_lender_t *l);

/* Stops the daemon accepting connections, then waits until no request is
 * in hand, deadline (clock_now_ms) passes or a second signal asks to stop
 * at once. Returns how many requests were still in hand. */
size_t http_lender_drain(http_lender_t *l, struct MHD_Daemon *d, int64_t deadline,
                         int (*stop_now)(void));

#endif
