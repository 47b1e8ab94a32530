/* admin_http: the admin listener of a charged daemon, on ADMIN_ADDR.
 *
 *   GET /healthz   200 "ok" while the process is live, 503 and why not
 *   GET /readyz    200 "ready" while it should get work, 503 and why not
 *   GET /metrics   the metrics registry, Prometheus text format 0.0.4
 *
 * HEAD is answered like GET without a body; any other method on these
 * paths is 405, any other path 404. libmicrohttpd serves it from a thread
 * of its own, with a bounded number of connections, a timeout on idle ones
 * and a small request memory, so a slow or hostile client costs that thread
 * a connection slot at most, never the role's loop. The listener never
 * touches the role's state: the probes below read thread-safe snapshots,
 * and /metrics renders the registry, which has its own lock. */
#ifndef CHARGED_ADMIN_HTTP_H
#define CHARGED_ADMIN_HTTP_H

#include <stddef.h>

#include "charged_error.h"

typedef struct admin_http admin_http_t;

/* A probe: 1 when healthy (or ready), 0 when not, with a short plain-text
 * reason in why (one line, no secret). Called from the listener's thread. */
typedef int (*admin_http_probe_fn)(void *arg, char *why, size_t why_size);

struct admin_http_handlers {
    admin_http_probe_fn healthz;
    admin_http_probe_fn readyz;
    void (*on_scrape)(void *arg); /* before /metrics renders; may be NULL */
    void *arg;
};

/* Listens on addr ("host:port"; "[v6]:port"; port 0: one the kernel picks)
 * and serves from its own thread until admin_http_free. Copies h. Fills
 * *out, or returns with one line in err: CHARGED_GIVE_UP when addr is not
 * host:port or the host resolves to nothing (a configuration error),
 * CHARGED_RETRY when bind or listen is refused (port taken, no permission)
 * or the thread cannot start. */
enum charged_rc admin_http_start(const char *addr, const struct admin_http_handlers *h,
                                 admin_http_t **out, struct charged_error *err);

/* The port it listens on (the kernel's pick for port 0). */
int admin_http_port(const admin_http_t *a);

/* Stops serving (waits for the thread) and frees. NULL does nothing. */
void admin_http_free(admin_http_t *a);

#endif
