#include "http_lender.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"

struct http_lender {
    pthread_mutex_t lock;
    pthread_cond_t returned;
    void **free_items;
    size_t nfree;
    atomic_int serving;
};

http_lender_t *http_lender_new(void *const *items, size_t n)
{
    http_lender_t *l = calloc(1, sizeof(*l));
    if (!l || !(l->free_items = calloc(n ? n : 1, sizeof(*l->free_items)))) {
        free(l);
        return NULL;
    }
    memcpy(l->free_items, items, n * sizeof(*items));
    l->nfree = n;
    pthread_mutex_init(&l->lock, NULL);
    pthread_cond_init(&l->returned, NULL);
    atomic_init(&l->serving, 0);
    return l;
}

void http_lender_free(http_lender_t *l)
{
    if (!l)
        return;
    pthread_cond_destroy(&l->returned);
    pthread_mutex_destroy(&l->lock);
    free(l->free_items);
    free(l);
}

void *http_lender_take(http_lender_t *l)
{
    pthread_mutex_lock(&l->lock);
    while (l->nfree == 0)
        pthread_cond_wait(&l->returned, &l->lock);
    void *item = l->free_items[--l->nfree];
    pthread_mutex_unlock(&l->lock);
    return item;
}

void http_lender_give(http_lender_t *l, void *item)
{
    pthread_mutex_lock(&l->lock);
    l->free_items[l->nfree++] = item;
    pthread_cond_signal(&l->returned);
    pthread_mutex_unlock(&l->lock);
}

void http_lender_enter(http_lender_t *l)
{
    atomic_fetch_add(&l->serving, 1);
}

void http_lender_leave(http_lender_t *l)
{
    atomic_fetch_sub(&l->serving, 1);
}

size_t http_lender_drain(http_lender_t *l, struct MHD_Daemon *d, int64_t deadline,
                         int (*stop_now)(void))
{
    /* No new connection from now on; requests in hand finish. */
    MHD_socket s = MHD_quiesce_daemon(d);
    if (s != MHD_INVALID_SOCKET)
        close(s);
    while (atomic_load(&l->serving) > 0 && clock_now_ms() < deadline &&
           !(stop_now && stop_now()))
        usleep(10 * 1000);
    return (size_t)atomic_load(&l->serving);
}
