#include "http_reply.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"

void http_reply_log(void *cls, const char *fmt, va_list ap)
{
    const struct http_reply_log_as *as = cls;
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    /* Up to the first CR too, so that no bare CR reaches a log line. */
    line[strcspn(line, "\r\n")] = '\0';
    log_warn(as->msg, as->field, line, NULL);
}

enum MHD_Result http_reply_with(struct MHD_Connection *c, unsigned status, char *body,
                                size_t len, enum MHD_ResponseMemoryMode mode,
                                const char *content_type, const char *const *headers)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, mode);
    if (!r) {
        if (mode == MHD_RESPMEM_MUST_FREE)
            free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    for (size_t i = 0; headers && headers[i]; i += 2)
        if (headers[i + 1])
            MHD_add_response_header(r, headers[i], headers[i + 1]);
    enum MHD_Result rc = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return rc;
}

enum MHD_Result http_reply(struct MHD_Connection *c, unsigned status, char *body,
                           size_t len, enum MHD_ResponseMemoryMode mode,
                           const char *content_type, const char *allow)
{
    const char *headers[] = {MHD_HTTP_HEADER_ALLOW, allow, NULL};
    return http_reply_with(c, status, body, len, mode, content_type, headers);
}

enum MHD_Result http_reply_text(struct MHD_Connection *c, unsigned status,
                                const char *text, const char *allow)
{
    return http_reply(c, status, (char *)text, strlen(text), MHD_RESPMEM_MUST_COPY,
                      "text/plain; charset=utf-8", allow);
}

enum MHD_Result http_reply_json(struct MHD_Connection *c, unsigned status, json_t *body,
                                const char *allow)
{
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text)
        return MHD_NO;
    return http_reply(c, status, text, strlen(text), MHD_RESPMEM_MUST_FREE,
                      "application/json", allow);
}
