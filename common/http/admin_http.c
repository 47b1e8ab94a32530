#include "admin_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "http_reply.h"
#include "listen_socket.h"
#include "metrics.h"

/* Probes and scrapes are small and rare: a few connections are plenty, and
 * bounding them bounds what clients can hold. One address (a hostile or
 * broken client) may hold at most MAX_PER_ADDRESS of them, so that it
 * cannot starve the kubelet's probes and get a healthy pod restarted. */
#define MAX_CONNECTIONS   64
#define MAX_PER_ADDRESS   8
#define IDLE_TIMEOUT_S    5
#define CONNECTION_MEMORY 16384

struct admin_http {
    struct MHD_Daemon *mhd;
    struct admin_http_handlers h;
    int port;
};

/* MHD's own messages (a refused connection, a failed thread) are warnings. */
static const struct http_reply_log_as mhd_log_as = {"admin listener", "error"};

static enum MHD_Result probe(struct MHD_Connection *c, admin_http_probe_fn fn,
                             void *arg, const char *ok)
{
    char why[200] = "", body[256];
    int good = fn ? fn(arg, why, sizeof(why)) : 1;
    if (good)
        snprintf(body, sizeof(body), "%s\n", why[0] ? why : ok);
    else
        snprintf(body, sizeof(body), "%s\n", why[0] ? why : "not ok");
    return http_reply_text(c, good ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE, body,
                           NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    admin_http_t *a = cls;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;

    /* Answered at the first call, before any request body is read: none of
     * these takes one, and MHD closes the connection after an early answer. */
    int health = !strcmp(url, "/healthz"), ready = !strcmp(url, "/readyz"),
        metrics = !strcmp(url, "/metrics");
    if (!health && !ready && !metrics)
        return http_reply_text(c, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
    if (strcmp(method, MHD_HTTP_METHOD_GET) != 0 &&
        strcmp(method, MHD_HTTP_METHOD_HEAD) != 0)
        return http_reply_text(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed\n",
                               "GET, HEAD");
    if (health)
        return probe(c, a->h.healthz, a->h.arg, "ok");
    if (ready)
        return probe(c, a->h.readyz, a->h.arg, "ready");
    if (a->h.on_scrape)
        a->h.on_scrape(a->h.arg);
    char *text;
    size_t len;
    if (metrics_render(&text, &len) != 0)
        return http_reply_text(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "out of memory\n",
                               NULL);
    return http_reply(c, MHD_HTTP_OK, text, len, MHD_RESPMEM_MUST_FREE,
                      "text/plain; version=0.0.4; charset=utf-8", NULL);
}

enum charged_rc admin_http_start(const char *addr, const struct admin_http_handlers *h,
                                 admin_http_t **out, struct charged_error *err)
{
    int fd = -1;
    enum charged_rc rc;
    admin_http_t *a = calloc(1, sizeof(*a));

    *out = NULL;
    if (!a) {
        charged_error_set(err, "out of memory");
        return CHARGED_RETRY;
    }
    a->h = *h;
    rc = listen_socket_open("ADMIN_ADDR", addr, &fd, &a->port, err);
    if (rc != CHARGED_OK)
        goto fail;
    /* MHD owns fd from here: it closes it when it stops, or on failure. */
    a->mhd = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, on_request, a,
        MHD_OPTION_EXTERNAL_LOGGER, http_reply_log, &mhd_log_as,
        MHD_OPTION_LISTEN_SOCKET, (MHD_socket)fd, MHD_OPTION_CONNECTION_LIMIT,
        (unsigned)MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
        (unsigned)MAX_PER_ADDRESS, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)IDLE_TIMEOUT_S, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)CONNECTION_MEMORY, MHD_OPTION_END);
    if (!a->mhd) {
        charged_error_set(err, "ADMIN_ADDR: cannot start the listener on %s", addr);
        rc = CHARGED_RETRY;
        goto fail;
    }
    *out = a;
    return CHARGED_OK;
fail:
    free(a);
    return rc;
}

int admin_http_port(const admin_http_t *a)
{
    return a->port;
}

void admin_http_free(admin_http_t *a)
{
    if (!a)
        return;
    MHD_stop_daemon(a->mhd);
    free(a);
}
