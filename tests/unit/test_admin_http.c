/* Unit tests of common/http/admin_http: the three paths and their answers over
 * real HTTP (libcurl against a listener on a port the kernel picked), the
 * methods and paths it refuses, addresses it cannot use, and clients that
 * connect and say nothing. */
#include <check.h>
#include <curl/curl.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "admin_http.h"
#include "http_client.h"
#include "metrics.h"
#include "test_env.h"

/* What the probes answer; the test sets them. */
struct probes {
    volatile int healthy, ready, scrapes;
};

static int healthz(void *arg, char *why, size_t why_size)
{
    struct probes *p = arg;
    if (!p->healthy)
        snprintf(why, why_size, "stalled: the loop has not turned for 31000 ms");
    return p->healthy;
}

static int readyz(void *arg, char *why, size_t why_size)
{
    struct probes *p = arg;
    if (!p->ready)
        snprintf(why, why_size, "not ready: database unreachable");
    return p->ready;
}

static void on_scrape(void *arg)
{
    struct probes *p = arg;
    p->scrapes++;
    metrics_set(METRIC_READY, p->ready);
}

static admin_http_t *start(struct probes *p)
{
    struct charged_error err;
    admin_http_t *a = NULL;
    const struct admin_http_handlers h = {healthz, readyz, on_scrape, p};
    int rc = admin_http_start("127.0.0.1:0", &h, &a, &err);
    ck_assert_msg(rc == CHARGED_OK, "start: %s", err.message);
    ck_assert_int_gt(admin_http_port(a), 0);
    return a;
}

static void request(const admin_http_t *a, const char *method, const char *path,
                    struct http_answer *ans)
{
    CURLcode cc = http_client_request(admin_http_port(a), method, path, ans);
    ck_assert_msg(cc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(cc));
}

START_TEST(healthz_and_readyz_answer_what_the_probes_say)
{
    struct probes p = {1, 1, 0};
    struct http_answer *ans = malloc(sizeof(*ans));
    admin_http_t *a = start(&p);

    request(a, "GET", "/healthz", ans);
    ck_assert_int_eq(ans->status, 200);
    ck_assert_str_eq(ans->body, "ok\n");
    ck_assert_str_eq(ans->content_type, "text/plain; charset=utf-8");
    request(a, "GET", "/readyz", ans);
    ck_assert_int_eq(ans->status, 200);
    ck_assert_str_eq(ans->body, "ready\n");

    p.healthy = 0;
    p.ready = 0;
    request(a, "GET", "/healthz", ans);
    ck_assert_int_eq(ans->status, 503);
    ck_assert_str_eq(ans->body, "stalled: the loop has not turned for 31000 ms\n");
    request(a, "GET", "/readyz", ans);
    ck_assert_int_eq(ans->status, 503);
    ck_assert_str_eq(ans->body, "not ready: database unreachable\n");
    /* A query string does not change the path. */
    request(a, "GET", "/readyz?verbose=1", ans);
    ck_assert_int_eq(ans->status, 503);
    admin_http_free(a);
    free(ans);
}
END_TEST

START_TEST(metrics_are_the_registry_in_text_format)
{
    struct probes p = {1, 0, 0};
    struct http_answer *ans = malloc(sizeof(*ans));
    metrics_reset();
    metrics_add(METRIC_MESSAGES, 3, "settled");
    admin_http_t *a = start(&p);

    request(a, "GET", "/metrics", ans);
    ck_assert_int_eq(ans->status, 200);
    ck_assert_str_eq(ans->content_type, "text/plain; version=0.0.4; charset=utf-8");
    ck_assert_ptr_nonnull(
        strstr(ans->body, "\ncharged_messages_total{outcome=\"settled\"} 3\n"));
    /* on_scrape ran before the rendering: charged_ready is what /readyz says. */
    ck_assert_int_eq(p.scrapes, 1);
    ck_assert_ptr_nonnull(strstr(ans->body, "\ncharged_ready 0\n"));
    p.ready = 1;
    request(a, "GET", "/metrics", ans);
    ck_assert_ptr_nonnull(strstr(ans->body, "\ncharged_ready 1\n"));
    char *text;
    size_t len;
    ck_assert_int_eq(metrics_render(&text, &len), 0);
    ck_assert_str_eq(ans->body, text);
    free(text);

    /* HEAD: the same status and headers, no body. */
    request(a, "HEAD", "/metrics", ans);
    ck_assert_int_eq(ans->status, 200);
    ck_assert_uint_eq(ans->len, 0);
    ck_assert_str_eq(ans->content_type, "text/plain; version=0.0.4; charset=utf-8");
    request(a, "HEAD", "/readyz", ans);
    ck_assert_int_eq(ans->status, 200);
    ck_assert_uint_eq(ans->len, 0);
    admin_http_free(a);
    free(ans);
    metrics_reset();
}
END_TEST

START_TEST(other_methods_and_paths_are_refused)
{
    static const char *const methods[] = {"POST", "PUT", "DELETE", "PATCH", "OPTIONS"};
    static const char *const paths[] = {"/healthz", "/readyz", "/metrics"};
    struct probes p = {1, 1, 0};
    struct http_answer *ans = malloc(sizeof(*ans));
    admin_http_t *a = start(&p);

    for (size_t m = 0; m < sizeof(methods) / sizeof(methods[0]); m++)
        for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
            request(a, methods[m], paths[i], ans);
            ck_assert_msg(ans->status == 405, "%s %s: %ld", methods[m], paths[i],
                          ans->status);
            ck_assert_str_eq(ans->allow, "GET, HEAD");
        }
    static const char *const unknown[] = {"/", "/health", "/metrics/", "/readyz/x",
                                          "/HEALTHZ"};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        request(a, "GET", unknown[i], ans);
        ck_assert_msg(ans->status == 404, "GET %s: %ld", unknown[i], ans->status);
        request(a, "POST", unknown[i], ans);
        ck_assert_msg(ans->status == 404, "POST %s: %ld", unknown[i], ans->status);
    }
    /* Still serving after all that. */
    request(a, "GET", "/healthz", ans);
    ck_assert_int_eq(ans->status, 200);
    admin_http_free(a);
    free(ans);
}
END_TEST

START_TEST(bad_and_taken_addresses_are_told_apart)
{
    struct charged_error err;
    struct probes p = {1, 1, 0};
    const struct admin_http_handlers h = {healthz, readyz, NULL, &p};
    admin_http_t *a = NULL, *b = NULL;

    ck_assert_int_eq(admin_http_start("9400", &h, &a, &err), CHARGED_GIVE_UP);
    ck_assert_ptr_null(a);
    ck_assert_str_eq(err.message, "ADMIN_ADDR: '9400' is not host:port");
    ck_assert_int_eq(admin_http_start("no-such-host.invalid:9400", &h, &a, &err),
                     CHARGED_GIVE_UP);
    ck_assert_ptr_nonnull(strstr(err.message, "cannot resolve 'no-such-host.invalid'"));

    a = start(&p);
    char taken[64];
    snprintf(taken, sizeof(taken), "127.0.0.1:%d", admin_http_port(a));
    ck_assert_int_eq(admin_http_start(taken, &h, &b, &err), CHARGED_RETRY);
    ck_assert_ptr_null(b);
    char want[128];
    snprintf(want, sizeof(want), "ADMIN_ADDR: cannot listen on %s: %s", taken,
             strerror(EADDRINUSE));
    ck_assert_str_eq(err.message, want);
    admin_http_free(a);
    admin_http_free(NULL);

    /* IPv6 loopback, in brackets, when the machine has it. */
    int rc = admin_http_start("[::1]:0", &h, &a, &err);
    if (rc == CHARGED_OK) {
        ck_assert_int_gt(admin_http_port(a), 0);
        admin_http_free(a);
    } else {
        ck_assert_int_eq(rc, CHARGED_RETRY);
    }
}
END_TEST

/* A connection from 127.0.0.2: another address than the probes' (the
 * listener limits what one address may hold). */
static int connect_idle(int port)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    struct sockaddr_in from = {.sin_family = AF_INET};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    from.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1);
    int s = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(s, 0);
    ck_assert_int_eq(bind(s, (struct sockaddr *)&from, sizeof(from)), 0);
    ck_assert_int_eq(connect(s, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return s;
}

START_TEST(silent_clients_neither_block_others_nor_stay_forever)
{
    struct probes p = {1, 1, 0};
    struct http_answer *ans = malloc(sizeof(*ans));
    admin_http_t *a = start(&p);
    int idle[8];

    /* Connected, a request half sent, then nothing. */
    for (int i = 0; i < 8; i++) {
        idle[i] = connect_idle(admin_http_port(a));
        if (i % 2)
            ck_assert_int_eq(send(idle[i], "GET /metr", 9, 0), 9);
    }
    request(a, "GET", "/healthz", ans);
    ck_assert_int_eq(ans->status, 200);
    /* The listener hangs up on them after its idle timeout (5 s). */
    long long deadline = test_env_now_ms() + 30000;
    for (int i = 0; i < 8; i++) {
        char c;
        struct pollfd pfd = {idle[i], POLLIN, 0};
        int left = (int)(deadline - test_env_now_ms());
        ck_assert_msg(left > 0 && poll(&pfd, 1, left) == 1,
                      "idle connection %d still open after 30 s", i);
        ck_assert_int_le(recv(idle[i], &c, 1, 0), 0);
        close(idle[i]);
    }
    admin_http_free(a);
    free(ans);
}
END_TEST

int main(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    Suite *s = suite_create("admin_http");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, healthz_and_readyz_answer_what_the_probes_say);
    tcase_add_test(tc, metrics_are_the_registry_in_text_format);
    tcase_add_test(tc, other_methods_and_paths_are_refused);
    tcase_add_test(tc, bad_and_taken_addresses_are_told_apart);
    tcase_add_test(tc, silent_clients_neither_block_others_nor_stay_forever);
    suite_add_tcase(s, tc);
    int rc = test_env_run_suite(s);
    curl_global_cleanup();
    return rc;
}
