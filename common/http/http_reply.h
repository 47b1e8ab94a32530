/* http_reply: what every libmicrohttpd listener of charged shares: its
 * logger, and how an answer is queued (JSON or plain text, never cached).
 *
 *   static const struct http_reply_log_as as = {"http listener", "detail"};
 *   MHD_start_daemon(..., MHD_OPTION_EXTERNAL_LOGGER, http_reply_log, &as, ...);
 *   return http_reply_json(c, MHD_HTTP_OK, json_pack(...), NULL);
 *
 * Every function returns what libmicrohttpd's request handler returns:
 * MHD_NO (out of memory: the connection is dropped) or what
 * MHD_queue_response said. */
#ifndef CHARGED_HTTP_REPLY_H
#define CHARGED_HTTP_REPLY_H

#include <stdarg.h>
#include <stddef.h>

#include <jansson.h>
#include <microhttpd.h>

/* How a listener's library messages are logged: one warn line, `msg` its
 * message, the library's text in the field `field`. */
struct http_reply_log_as {
    const char *msg;
    const char *field;
};

/* A libmicrohttpd external logger; cls is a const struct http_reply_log_as
 * that outlives the daemon. Writes one line: the text is cut at its first
 * CR or LF (the library ends each message with one), and at 511 bytes. */
void http_reply_log(void *cls, const char *fmt, va_list ap);

/* Queues body (len bytes of content_type) with Cache-Control: no-store;
 * allow, when not NULL, is the Allow header of a 405. With
 * MHD_RESPMEM_MUST_FREE the body is taken over, also on failure. */
enum MHD_Result http_reply(struct MHD_Connection *c, unsigned status, char *body,
                           size_t len, enum MHD_ResponseMemoryMode mode,
                           const char *content_type, const char *allow);

/* As http_reply, with more headers: name, value pairs ending in a NULL
 * name; a pair whose value is NULL is left out. */
enum MHD_Result http_reply_with(struct MHD_Connection *c, unsigned status, char *body,
                                size_t len, enum MHD_ResponseMemoryMode mode,
                                const char *content_type, const char *const *headers);

/* Queues a copy of text as text/plain; charset=utf-8. */
enum MHD_Result http_reply_text(struct MHD_Connection *c, unsigned status,
                                const char *text, const char *allow);

/* Queues body as compact application/json. Steals the reference to body
 * (NULL, as json_pack gives when out of memory, is MHD_NO). */
enum MHD_Result http_reply_json(struct MHD_Connection *c, unsigned status, json_t *body,
                                const char *allow);

#endif
