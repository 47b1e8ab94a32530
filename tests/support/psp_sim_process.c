#include "psp_sim_process.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
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

/* Bind, read the port, close: for tests that need a port where nothing
 * listens (a refused connection). psp-sim itself binds port 0. */
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

/* Reads psp-sim's first stdout line ("psp-sim listening port=N admin_port=M")
 * into p before deadline_ms. Returns NULL, or why not (line gets what came). */
static const char *read_ports(struct psp_sim_process *p, int fd, long long deadline_ms,
                              char *line, size_t size)
{
    size_t n = 0;

    line[0] = '\0';
    while (!strchr(line, '\n')) {
        long long left = deadline_ms - test_env_now_ms();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (left <= 0)
            return "psp-sim did not print its ports in 10 s";
        if (n == size - 1)
            return "psp-sim's first line is too long";
        int pr = poll(&pfd, 1, (int)left);
        if (pr <= 0) {
            if (pr < 0 && errno != EINTR)
                return "poll failed";
            continue;
        }
        ssize_t got = read(fd, line + n, size - 1 - n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return "psp-sim exited before it listened";
        n += (size_t)got;
        line[n] = '\0';
    }
    if (sscanf(line, "psp-sim listening port=%d admin_port=%d", &p->port,
               &p->admin_port) != 2 ||
        p->port <= 0 || p->admin_port <= 0)
        return "psp-sim's first line does not name its ports";
    return NULL;
}

void psp_sim_start(struct psp_sim_process *p, const char *const *extra_args)
{
    const char *argv[64];
    int n = 0, out[2];

    /* Port 0: psp-sim binds what the kernel picks and says which, so no
     * other process can take a port between our choosing and its binding. */
    argv[n++] = PSP_SIM_PATH;
    argv[n++] = "--port";
    argv[n++] = "0";
    argv[n++] = "--admin-port";
    argv[n++] = "0";
    argv[n++] = "--api-key";
    argv[n++] = PSP_SIM_TEST_KEY;
    for (int i = 0; extra_args && extra_args[i] && n < 62; i++)
        argv[n++] = extra_args[i];
    argv[n] = NULL;

    ck_assert_int_eq(pipe(out), 0);
    fcntl(out[0], F_SETFD, FD_CLOEXEC);
    p->pid = fork();
    ck_assert_int_ge(p->pid, 0);
    if (p->pid == 0) {
        dup2(out[1], STDOUT_FILENO);
        close(out[0]);
        close(out[1]);
        if (p->stderr_path) {
            int fd = open(p->stderr_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
            if (fd < 0)
                _exit(127);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        for (int i = 0; p->env && p->env[i]; i++)
            putenv((char *)p->env[i]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(out[1]);
    char line[256];
    const char *why =
        read_ports(p, out[0], test_env_now_ms() + 10000, line, sizeof(line));
    /* That line is all psp-sim writes to stdout (it ignores SIGPIPE), and
     * its logs keep going to our stderr. */
    close(out[0]);
    snprintf(p->first_line, sizeof(p->first_line), "%s", line);
    if (why) {
        int st;
        kill(p->pid, SIGKILL);
        waitpid(p->pid, &st, 0);
        p->pid = 0;
        ck_abort_msg("%s (it printed: %s)", why, line);
    }
    snprintf(p->base_url, sizeof(p->base_url), "http://127.0.0.1:%d", p->port);
    ck_assert_msg(admin_request(p, "GET", "/health", NULL, NULL) == 200,
                  "psp-sim does not answer on its admin port %d", p->admin_port);
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
