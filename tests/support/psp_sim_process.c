#include "psp_sim_process.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <check.h>
#include <curl/curl.h>

#include "test_env.h"

int psp_sim_free_port(void)
{
    struct sockaddr_in sa = {0};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

struct buf {
    char *p;
    size_t n;
};

static size_t on_data(char *ptr, size_t size, size_t nmemb, void *u)
{
    struct buf *b = u;
    size_t n = size * nmemb;
    char *q = realloc(b->p, b->n + n + 1);
    if (!q)
        return 0;
    b->p = q;
    memcpy(b->p + b->n, ptr, n);
    b->n += n;
    b->p[b->n] = '\0';
    return n;
}

/* Returns the HTTP status, or 0 when nothing answered; *out gets the body. */
static long admin_request(struct psp_sim_process *p, const char *method,
                          const char *path, const char *body, char **out)
{
    char url[256];
    struct buf b = {0};
    long status = 0;
    CURL *e = curl_easy_init();
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", p->admin_port, path);
    curl_easy_setopt(e, CURLOPT_URL, url);
    curl_easy_setopt(e, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(e, CURLOPT_WRITEDATA, &b);
    if (body)
        curl_easy_setopt(e, CURLOPT_POSTFIELDS, body);
    if (curl_easy_perform(e) == CURLE_OK)
        curl_easy_getinfo(e, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(e);
    if (out)
        *out = b.p;
    else
        free(b.p);
    return status;
}

void psp_sim_start(struct psp_sim_process *p, const char *const *extra_args)
{
    const char *argv[64];
    char port[16], admin[16];
    int n = 0;

    p->port = psp_sim_free_port();
    p->admin_port = psp_sim_free_port();
    snprintf(port, sizeof(port), "%d", p->port);
    snprintf(admin, sizeof(admin), "%d", p->admin_port);
    snprintf(p->base_url, sizeof(p->base_url), "http://127.0.0.1:%d", p->port);
    argv[n++] = PSP_SIM_PATH;
    argv[n++] = "--port";
    argv[n++] = port;
    argv[n++] = "--admin-port";
    argv[n++] = admin;
    argv[n++] = "--api-key";
    argv[n++] = PSP_SIM_TEST_KEY;
    for (int i = 0; extra_args && extra_args[i] && n < 62; i++)
        argv[n++] = extra_args[i];
    argv[n] = NULL;

    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    long long deadline = test_env_now_ms() + 10000;
    for (;;) {
        if (admin_request(p, "GET", "/health", NULL, NULL) == 200)
            return;
        int st;
        ck_assert_msg(waitpid(p->pid, &st, WNOHANG) == 0, "psp-sim exited at start");
        ck_assert_msg(test_env_now_ms() < deadline, "psp-sim did not answer in 10 s");
        struct timespec ts = {0, 20 * 1000000};
        nanosleep(&ts, NULL);
    }
}

void psp_sim_stop(struct psp_sim_process *p)
{
    int st;
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGTERM);
    waitpid(p->pid, &st, 0);
    p->pid = 0;
}

json_t *psp_sim_admin(struct psp_sim_process *p, const char *method, const char *path,
                      const char *body)
{
    char *out = NULL;
    json_error_t jerr;
    long st = admin_request(p, method, path, body, &out);
    ck_assert_msg(st == 200, "psp-sim admin %s %s answered %ld: %s", method, path, st,
                  out ? out : "");
    json_t *j = json_loads(out, 0, &jerr);
    free(out);
    ck_assert_msg(j != NULL, "psp-sim admin answer is not JSON");
    return j;
}

size_t psp_sim_charges(struct psp_sim_process *p)
{
    json_t *l = psp_sim_admin(p, "GET", "/ledger", NULL);
    size_t n = json_array_size(json_object_get(l, "charges"));
    json_decref(l);
    return n;
}

size_t psp_sim_charges_for_key(struct psp_sim_process *p, const char *key)
{
    json_t *l = psp_sim_admin(p, "GET", "/ledger", NULL), *c;
    size_t i, n = 0;
    json_array_foreach(json_object_get(l, "charges"), i, c)
    {
        const char *k = json_string_value(json_object_get(c, "idempotency_key"));
        if (k && !strcmp(k, key))
            n++;
    }
    json_decref(l);
    return n;
}
