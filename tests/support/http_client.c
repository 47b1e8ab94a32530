#include "http_client.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include <check.h>

static size_t on_body(char *data, size_t size, size_t n, void *arg)
{
    struct http_answer *a = arg;
    size_t len = size * n, room = sizeof(a->body) - 1 - a->len;
    memcpy(a->body + a->len, data, len < room ? len : room);
    a->len += len < room ? len : room;
    a->body[a->len] = '\0';
    return len;
}

static void header(const char *line, const char *name, char *out, size_t out_size)
{
    size_t n = strlen(name);
    if (!strncasecmp(line, name, n) && line[n] == ':' && line[n + 1] == ' ')
        snprintf(out, out_size, "%s", line + n + 2);
}

static size_t on_header(char *data, size_t size, size_t n, void *arg)
{
    struct http_answer *a = arg;
    size_t len = size * n;
    char line[256];
    snprintf(line, sizeof(line), "%.*s", (int)(len < 255 ? len : 255), data);
    line[strcspn(line, "\r\n")] = '\0';
    header(line, "Content-Type", a->content_type, sizeof(a->content_type));
    header(line, "Cache-Control", a->cache_control, sizeof(a->cache_control));
    header(line, "Allow", a->allow, sizeof(a->allow));
    return len;
}

CURLcode http_client_request(int port, const char *method, const char *path,
                             struct http_answer *ans)
{
    char url[128];
    CURL *c = curl_easy_init();
    ck_assert_ptr_nonnull(c);
    memset(ans, 0, sizeof(*ans));
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, path);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, ans);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, ans);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else if (!strcmp(method, "POST"))
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, "x=1");
    else if (strcmp(method, "GET") != 0)
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    CURLcode cc = curl_easy_perform(c);
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &ans->status);
    curl_easy_cleanup(c);
    return cc;
}
