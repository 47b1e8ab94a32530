/* The stores' deadline (store.h) against a fake PostgreSQL on loopback: it
 * speaks just enough of the protocol to open a session, answers a given
 * number of statements per session, then goes silent with the connection
 * open, as a frozen server does (the kernel still acknowledges what the
 * client sends). A call then costs one deadline, says so, closes its
 * session and is not repeated on a new one; the next call opens a new
 * session. No stack needed. */
#include <check.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "attempt_store.h"
#include "store.h"
#include "test_env.h"
#include "webhook_store.h"

#define CLIENTS_MAX 8
#define TIMEOUT_MS  200 /* the deadline is this and STORE_DEADLINE_GRACE_MS */

struct client {
    int fd;
    int started;  /* the startup message was answered */
    int answered; /* statements answered */
    int executes; /* Execute messages since the last Sync */
    unsigned char buf[65536];
    size_t len;
};

/* A server that answers `answers` statements of each session, then none. */
struct fake_pg {
    int listen_fd, port, answers;
    pthread_t thread;
    struct client clients[CLIENTS_MAX];
    atomic_int sessions, closed, statements, stop;
};

static struct fake_pg pg;
static char url[256];
static struct charged_error err;

static void send_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0)
            return;
        c += w;
        n -= (size_t)w;
    }
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Handles whole messages in c->buf: the startup (refusing SSL and GSS
 * encryption), then for each Sync the answer of the statements run with
 * parameters before it (no rows), while answers last. */
static void serve(struct client *c)
{
    static const unsigned char hello[] = {'R', 0, 0, 0, 8, 0,  0, 0, 0, /* auth ok */
                                          'Z', 0, 0, 0, 5, 'I'};
    static const unsigned char answer[] = {'1', 0,   0,   0,   4, /* ParseComplete */
                                           '2', 0,   0,   0,   4, /* BindComplete */
                                           'n', 0,   0,   0,   4, /* NoData */
                                           'C', 0,   0,   0,   13,  'S', 'E',
                                           'L', 'E', 'C', 'T', ' ', '0', 0,
                                           'Z', 0,   0,   0,   5,   'I'};
    for (;;) {
        size_t head = c->started ? 5 : 4;
        if (c->len < head)
            return;
        size_t n = be32(c->buf + (c->started ? 1 : 0)) + (c->started ? 1 : 0);
        if (n < head || n > sizeof(c->buf))
            n = c->len; /* not ours to understand: dropped */
        if (c->len < n)
            return;
        if (!c->started) {
            uint32_t code = n >= 8 ? be32(c->buf + 4) : 0;
            if (code == 80877103 || code == 80877104) { /* SSL, GSS encryption */
                send_all(c->fd, "N", 1);
            } else {
                send_all(c->fd, hello, sizeof(hello));
                c->started = 1;
            }
        } else if (c->buf[0] == 'E') {
            c->executes++;
        } else if (c->buf[0] == 'S') {
            /* A Sync closes a pipeline of one statement or more (db.h: a
             * statement that starts a transaction goes with its settings):
             * each is answered, then ReadyForQuery once. */
            atomic_fetch_add(&pg.statements, 1);
            if (c->answered < pg.answers) {
                for (int i = 0; i < c->executes; i++)
                    send_all(c->fd, answer, sizeof(answer) - 6);
                send_all(c->fd, answer + sizeof(answer) - 6, 6);
                c->answered++;
            }
            c->executes = 0;
        }
        memmove(c->buf, c->buf + n, c->len - n);
        c->len -= n;
    }
}

static void *run(void *arg)
{
    (void)arg;
    while (!atomic_load(&pg.stop)) {
        struct pollfd p[CLIENTS_MAX + 1];
        p[0] = (struct pollfd){.fd = pg.listen_fd, .events = POLLIN};
        for (int i = 0; i < CLIENTS_MAX; i++)
            p[i + 1] = (struct pollfd){.fd = pg.clients[i].fd, .events = POLLIN};
        if (poll(p, CLIENTS_MAX + 1, 20) <= 0)
            continue;
        if (p[0].revents & POLLIN) {
            int fd = accept(pg.listen_fd, NULL, NULL);
            for (int i = 0; fd >= 0 && i < CLIENTS_MAX; i++)
                if (pg.clients[i].fd < 0) {
                    pg.clients[i] = (struct client){.fd = fd};
                    atomic_fetch_add(&pg.sessions, 1);
                    fd = -1;
                }
            if (fd >= 0)
                close(fd);
        }
        for (int i = 0; i < CLIENTS_MAX; i++) {
            struct client *c = &pg.clients[i];
            if (c->fd < 0 || !(p[i + 1].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t r = recv(c->fd, c->buf + c->len, sizeof(c->buf) - c->len, 0);
            if (r <= 0) {
                close(c->fd);
                c->fd = -1;
                atomic_fetch_add(&pg.closed, 1);
                continue;
            }
            c->len += (size_t)r;
            serve(c);
        }
    }
    return NULL;
}

static void start(int answers)
{
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof(a);

    memset(&pg, 0, sizeof(pg));
    pg.answers = answers;
    for (int i = 0; i < CLIENTS_MAX; i++)
        pg.clients[i].fd = -1;
    pg.listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(pg.listen_fd, 0);
    ck_assert_int_eq(bind(pg.listen_fd, (struct sockaddr *)&a, sizeof(a)), 0);
    ck_assert_int_eq(listen(pg.listen_fd, 16), 0);
    ck_assert_int_eq(getsockname(pg.listen_fd, (struct sockaddr *)&a, &alen), 0);
    pg.port = ntohs(a.sin_port);
    snprintf(
        url, sizeof(url),
        "postgresql://charged@127.0.0.1:%d/charged?sslmode=disable&gssencmode=disable",
        pg.port);
    ck_assert_int_eq(pthread_create(&pg.thread, NULL, run, NULL), 0);
    store_set_timeout_ms(TIMEOUT_MS);
}

static void stop(void)
{
    atomic_store(&pg.stop, 1);
    pthread_join(pg.thread, NULL);
    for (int i = 0; i < CLIENTS_MAX; i++)
        if (pg.clients[i].fd >= 0)
            close(pg.clients[i].fd);
    close(pg.listen_fd);
    store_set_timeout_ms(STORE_TIMEOUT_DEFAULT_MS);
}

/* Until the fake has seen `n` sessions closed, or 10 s pass. */
static int closed_within(int n)
{
    long long deadline = test_env_now_ms() + 10000;
    while (atomic_load(&pg.closed) < n && test_env_now_ms() < deadline) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&pg.closed) >= n;
}

static attempt_store_t *attempt_store(void)
{
    attempt_store_t *st = attempt_store_new(url, "w1", &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    return st;
}

/* The deadline's message: the store's timeout and the grace. */
static void assert_given_up(const struct charged_error *e)
{
    char want[96];
    snprintf(want, sizeof(want), "did not answer within %d ms",
             TIMEOUT_MS + STORE_DEADLINE_GRACE_MS);
    ck_assert_msg(strstr(e->message, want) != NULL, "error '%s' does not say '%s'",
                  e->message, want);
    ck_assert_str_eq(e->code, "");
}

/* The fake is a server the stores can work with, so that what the other
 * tests see is the silence, not the fake. */
START_TEST(a_server_that_answers_is_reached)
{
    start(1000);
    attempt_store_t *st = attempt_store();
    ck_assert_msg(attempt_store_ping(st, &err) == CHARGED_OK, "%s", err.message);
    ck_assert_msg(attempt_store_ping(st, &err) == CHARGED_OK, "%s", err.message);
    ck_assert_int_eq(atomic_load(&pg.sessions), 1);
    attempt_store_free(st);
    stop();
}
END_TEST

/* The session is opened (no statement: its settings go with each
 * transaction, db.h), then the ping meets silence: CHARGED_RETRY at the
 * deadline, the session closed; the next call opens a new one and meets
 * the same. */
START_TEST(a_silent_server_costs_one_deadline_and_the_session)
{
    start(0);
    attempt_store_t *st = attempt_store();
    ck_assert_int_eq(attempt_store_ping(st, &err), CHARGED_RETRY);
    assert_given_up(&err);
    ck_assert_msg(closed_within(1), "the session given up was not closed");
    ck_assert_int_eq(atomic_load(&pg.sessions), 1);
    ck_assert_int_eq(attempt_store_ping(st, &err), CHARGED_RETRY);
    assert_given_up(&err);
    ck_assert_int_eq(atomic_load(&pg.sessions), 2);
    attempt_store_free(st);
    stop();
}
END_TEST

/* A call of several statements: its first given up, no other is sent. */
START_TEST(a_call_given_up_sends_nothing_more)
{
    struct charge_command c = {.amount = 100};
    snprintf(c.payment_attempt_id, sizeof(c.payment_attempt_id), "%s",
             "00000000-0000-4000-8000-000000000001");
    snprintf(c.order_id, sizeof(c.order_id), "%s",
             "10000000-0000-4000-8000-000000000001");
    snprintf(c.idempotency_key, sizeof(c.idempotency_key), "attempt:1");
    struct attempt_record_item item = {.cmd = &c};

    start(0);
    attempt_store_t *st = attempt_store();
    ck_assert_int_eq(attempt_store_record(st, &item, 1, 0, &err), CHARGED_RETRY);
    assert_given_up(&err);
    ck_assert_msg(closed_within(1), "the session given up was not closed");
    ck_assert_int_eq(atomic_load(&pg.sessions), 1);
    ck_assert_int_eq(atomic_load(&pg.statements), 1);
    attempt_store_free(st);
    stop();
}
END_TEST

/* A status query is repeated once on a new session when the server closed
 * the old one; not when the server is silent, which would cost a second
 * deadline. */
START_TEST(a_status_query_given_up_is_not_repeated)
{
    start(0);
    webhook_store_t *st = webhook_store_new(url, &err);
    ck_assert_msg(st != NULL, "%s", err.message);
    json_t *doc = NULL;
    ck_assert_int_eq(
        webhook_store_attempt(st, "00000000-0000-4000-8000-000000000001", &doc, &err),
        CHARGED_RETRY);
    assert_given_up(&err);
    ck_assert_ptr_null(doc);
    ck_assert_msg(closed_within(1), "the session given up was not closed");
    ck_assert_int_eq(atomic_load(&pg.sessions), 1);
    ck_assert_int_eq(atomic_load(&pg.statements), 1);
    webhook_store_free(st);
    stop();
}
END_TEST

/* A server that goes silent right after the session's startup costs one
 * deadline too: the first statement's, which carries the settings. */
START_TEST(a_server_silent_while_the_session_opens_costs_one_deadline)
{
    start(0);
    attempt_store_t *st = attempt_store();
    ck_assert_int_eq(attempt_store_ping(st, &err), CHARGED_RETRY);
    assert_given_up(&err);
    ck_assert_msg(closed_within(1), "the session given up was not closed");
    attempt_store_free(st);
    stop();
}
END_TEST

int main(void)
{
    Suite *s = suite_create("store_deadline");
    TCase *tc = tcase_create("store_deadline");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, a_server_that_answers_is_reached);
    tcase_add_test(tc, a_silent_server_costs_one_deadline_and_the_session);
    tcase_add_test(tc, a_call_given_up_sends_nothing_more);
    tcase_add_test(tc, a_status_query_given_up_is_not_repeated);
    tcase_add_test(tc, a_server_silent_while_the_session_opens_costs_one_deadline);
    suite_add_tcase(s, tc);
    return test_env_run_suite(s);
}
