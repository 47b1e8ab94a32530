/* Unit tests of common/http/http_reply: the logger writes each libmicrohttpd
 * message as one log line without its line break, and the replies carry
 * their body, status, type and headers over real HTTP (libcurl against a
 * libmicrohttpd daemon on a port the kernel picked). */
#include <check.h>
#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

#include "http_client.h"
#include "http_reply.h"
#include "log.h"
#include "test_env.h"

static const struct http_reply_log_as as = {"test listener", "detail"};

static void log_through(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    http_reply_log((void *)&as, fmt, ap);
    va_end(ap);
}

/* What the logger wrote for fmt (one argument, s), parsed: the only line. */
static json_t *logged(const char *fmt, const char *s)
{
    char path[] = "/tmp/test_http_reply_XXXXXX", text[4096];
    int fd = mkstemp(path), saved = dup(STDERR_FILENO);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    fflush(stderr);
    dup2(fd, STDERR_FILENO);
    log_through(fmt, s);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
    close(fd);
    ck_assert_int_gt(n, 0);
    text[n] = '\0';
    char *nl = strchr(text, '\n');
    ck_assert_msg(nl && nl[1] == '\0', "want one line, got %s", text);
    json_t *line = json_loads(text, 0, NULL);
    ck_assert_msg(line != NULL, "not JSON: %s", text);
    ck_assert_str_eq(json_string_value(json_object_get(line, "level")), "warn");
    ck_assert_str_eq(json_string_value(json_object_get(line, "msg")), "test listener");
    return line;
}

static const char *detail(json_t *line)
{
    return json_string_value(json_object_get(line, "detail"));
}

START_TEST(the_logger_writes_one_line_without_the_line_break)
{
    log_init("test_http_reply", LOG_INFO);
    json_t *l = logged("Failed to accept connection: %s\n", "too many");
    ck_assert_str_eq(detail(l), "Failed to accept connection: too many");
    json_decref(l);
    l = logged("Error %s\r\n", "on a CRLF line");
    ck_assert_str_eq(detail(l), "Error on a CRLF line");
    json_decref(l);
    /* Anything after a break in the middle is not a second line. */
    l = logged("first%s", "\r{\"level\":\"info\"}\nsecond\n");
    ck_assert_str_eq(detail(l), "first");
    json_decref(l);
    /* A long message is cut, not lost. */
    char big[2000];
    memset(big, 'x', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    l = logged("%s\n", big);
    ck_assert_int_eq(strlen(detail(l)), 511);
    json_decref(l);
}
END_TEST

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)cls;
    (void)method;
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)con_cls;
    if (!strcmp(url, "/json"))
        return http_reply_json(c, MHD_HTTP_OK, json_pack("{s:s,s:i}", "a", "b", "n", 7),
                               NULL);
    if (!strcmp(url, "/json-405"))
        return http_reply_json(c, MHD_HTTP_METHOD_NOT_ALLOWED,
                               json_pack("{s:s}", "error", "method not allowed"),
                               "POST");
    if (!strcmp(url, "/no-json"))
        return http_reply_json(c, MHD_HTTP_OK, NULL, NULL);
    if (!strcmp(url, "/freed")) {
        char *body = strdup("taken over\n");
        return http_reply(c, MHD_HTTP_ACCEPTED, body, strlen(body),
                          MHD_RESPMEM_MUST_FREE, "text/x-test", NULL);
    }
    return http_reply_text(c, MHD_HTTP_NOT_FOUND, "not found\n", NULL);
}

/* GETs path; returns curl's code (the answer in ans when CURLE_OK). */
static CURLcode get(int port, const char *path, struct http_answer *ans)
{
    return http_client_request(port, "GET", path, ans);
}

START_TEST(replies_carry_status_type_and_headers)
{
    log_init("test_http_reply", LOG_OFF);
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO, 0, NULL, NULL, on_request, NULL,
        MHD_OPTION_EXTERNAL_LOGGER, http_reply_log, &as, MHD_OPTION_END);
    ck_assert_ptr_nonnull(d);
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    ck_assert_ptr_nonnull(info);
    int port = info->port;
    struct http_answer *ans = malloc(sizeof(*ans));

    ck_assert_int_eq(get(port, "/json", ans), CURLE_OK);
    ck_assert_int_eq(ans->status, 200);
    ck_assert_str_eq(ans->body, "{\"a\":\"b\",\"n\":7}");
    ck_assert_str_eq(ans->content_type, "application/json");
    ck_assert_str_eq(ans->cache_control, "no-store");
    ck_assert_str_eq(ans->allow, "");

    ck_assert_int_eq(get(port, "/json-405", ans), CURLE_OK);
    ck_assert_int_eq(ans->status, 405);
    ck_assert_str_eq(ans->body, "{\"error\":\"method not allowed\"}");
    ck_assert_str_eq(ans->allow, "POST");

    ck_assert_int_eq(get(port, "/elsewhere", ans), CURLE_OK);
    ck_assert_int_eq(ans->status, 404);
    ck_assert_str_eq(ans->body, "not found\n");
    ck_assert_str_eq(ans->content_type, "text/plain; charset=utf-8");
    ck_assert_str_eq(ans->cache_control, "no-store");

    /* Under valgrind a body not freed by the response is a leak. */
    ck_assert_int_eq(get(port, "/freed", ans), CURLE_OK);
    ck_assert_int_eq(ans->status, 202);
    ck_assert_str_eq(ans->body, "taken over\n");
    ck_assert_str_eq(ans->content_type, "text/x-test");

    /* No body to send (json_pack out of memory): the connection is dropped. */
    ck_assert_int_ne(get(port, "/no-json", ans), CURLE_OK);
    ck_assert_int_eq(ans->status, 0);

    MHD_stop_daemon(d);
    free(ans);
}
END_TEST

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("http_reply");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, the_logger_writes_one_line_without_the_line_break);
    tcase_add_test(tc, replies_carry_status_type_and_headers);
    suite_add_tcase(s, tc);
    int rc = test_env_run_suite(s);
    curl_global_cleanup();
    return rc;
}
