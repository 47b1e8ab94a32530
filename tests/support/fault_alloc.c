#include "fault_alloc.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>
#include <openssl/crypto.h>

void *__real_malloc(size_t size);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void __real_free(void *p);

void *__wrap_malloc(size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
char *__wrap_strdup(const char *s);
char *__wrap_strndup(const char *s, size_t n);
void __wrap_free(void *p);

json_t *__real_json_loadb(const char *buf, size_t len, size_t flags,
                          json_error_t *error);
json_t *__wrap_json_loadb(const char *buf, size_t len, size_t flags,
                          json_error_t *error);
char *__real_json_dumps(const json_t *json, size_t flags);
char *__wrap_json_dumps(const json_t *json, size_t flags);

/* Live pointers, open addressing; a slot that held one is a tombstone so
 * that probing goes on past it. Kept inverted: a pointer held here would
 * hide its leak from valgrind and LeakSanitizer. */
#define TRACK_SLOTS (1u << 16)
#define TOMBSTONE   ((uintptr_t)1)

static uintptr_t tracked[TRACK_SLOTS];
static int armed;
static pthread_t armed_thread;
static long fail_at_n, count, failed, live;
static int persistent_fail, overflow, inside_jansson;

static size_t slot_of(const void *p)
{
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15u;
    return (size_t)(h >> 7) & (TRACK_SLOTS - 1);
}

static void track(void *p)
{
    uintptr_t hidden = ~(uintptr_t)p;
    size_t i = slot_of(p);
    for (size_t probes = 0; probes < TRACK_SLOTS;
         probes++, i = (i + 1) & (TRACK_SLOTS - 1)) {
        if (!tracked[i] || tracked[i] == TOMBSTONE) {
            tracked[i] = hidden;
            live++;
            return;
        }
    }
    overflow = 1;
}

static void untrack(void *p)
{
    uintptr_t hidden = ~(uintptr_t)p;
    size_t i = slot_of(p);
    for (size_t probes = 0; probes < TRACK_SLOTS && tracked[i];
         probes++, i = (i + 1) & (TRACK_SLOTS - 1)) {
        if (tracked[i] == hidden) {
            tracked[i] = TOMBSTONE;
            live--;
            return;
        }
    }
}

/* Only the thread that armed is counted: librdkafka's threads allocate
 * through OpenSSL too, at times of their own. */
static int counting(void)
{
    return armed && pthread_equal(pthread_self(), armed_thread);
}

static int countable(void)
{
    return counting() && !inside_jansson;
}

/* Counts one allocation; 1 when it is to fail. */
static int should_fail(void)
{
    if (!countable())
        return 0;
    count++;
    if (fail_at_n > 0 &&
        (count == fail_at_n || (persistent_fail && count > fail_at_n))) {
        failed++;
        return 1;
    }
    return 0;
}

static void *tracked_result(void *p)
{
    if (p && counting())
        track(p);
    return p;
}

void *__wrap_malloc(size_t size)
{
    return should_fail() ? NULL : tracked_result(__real_malloc(size));
}

void *__wrap_calloc(size_t n, size_t size)
{
    return should_fail() ? NULL : tracked_result(__real_calloc(n, size));
}

void *__wrap_realloc(void *p, size_t size)
{
    void *np;
    if (!p)
        return __wrap_malloc(size);
    if (size == 0) {
        __wrap_free(p);
        return NULL;
    }
    if (should_fail())
        return NULL; /* p stays valid, as realloc promises */
    np = __real_realloc(p, size);
    if (np && counting()) {
        untrack(p);
        track(np);
    }
    return np;
}

char *__wrap_strdup(const char *s)
{
    size_t n = strlen(s) + 1;
    char *c = __wrap_malloc(n);
    if (c)
        memcpy(c, s, n);
    return c;
}

char *__wrap_strndup(const char *s, size_t n)
{
    size_t l = strnlen(s, n);
    char *c = __wrap_malloc(l + 1);
    if (c) {
        memcpy(c, s, l);
        c[l] = '\0';
    }
    return c;
}

void __wrap_free(void *p)
{
    if (p && counting())
        untrack(p);
    __real_free(p);
}

/* jansson's parser ignores a failed allocation while it reads a token and
 * goes on with the byte dropped ("payment_intent.x" read as
 * "payment_intentx"; jansson issue 362), and its encoder can drop a key
 * the same way: answers no caller can check. So a parse or a dump is one
 * allocation here, failing the way jansson documents (NULL, and for a
 * parse json_error_out_of_memory); what it allocates inside is tracked,
 * never failed. */
json_t *__wrap_json_loadb(const char *buf, size_t len, size_t flags,
                          json_error_t *error)
{
    json_t *j;
    if (should_fail()) {
        if (error) {
            memset(error, 0, sizeof(*error));
            error->line = error->column = -1;
            snprintf(error->text, sizeof(error->text), "out of memory");
            error->text[JSON_ERROR_TEXT_LENGTH - 1] = (char)json_error_out_of_memory;
        }
        return NULL;
    }
    inside_jansson = 1;
    j = __real_json_loadb(buf, len, flags, error);
    inside_jansson = 0;
    return j;
}

char *__wrap_json_dumps(const json_t *json, size_t flags)
{
    char *s;
    if (should_fail())
        return NULL;
    inside_jansson = 1;
    s = __real_json_dumps(json, flags);
    inside_jansson = 0;
    return s;
}

/* OpenSSL keeps caches it allocated on first use: counted and failed, but
 * not tracked, or every cache entry would read as a leak. */
static void *ssl_malloc(size_t size, const char *file, int line)
{
    (void)file;
    (void)line;
    return should_fail() ? NULL : __real_malloc(size);
}

static void *ssl_realloc(void *p, size_t size, const char *file, int line)
{
    (void)file;
    (void)line;
    if (p && size && should_fail())
        return NULL;
    if (!p && should_fail())
        return NULL;
    return __real_realloc(p, size);
}

static void ssl_free(void *p, const char *file, int line)
{
    (void)file;
    (void)line;
    __real_free(p);
}

int fault_alloc_install(void)
{
    json_set_alloc_funcs(__wrap_malloc, __wrap_free);
    return CRYPTO_set_mem_functions(ssl_malloc, ssl_realloc, ssl_free) ? 0 : -1;
}

void fault_alloc_arm(long fail_at, int persistent)
{
    memset(tracked, 0, sizeof(tracked));
    fail_at_n = fail_at;
    persistent_fail = persistent;
    count = failed = live = 0;
    overflow = 0;
    armed_thread = pthread_self();
    armed = 1;
}

struct fault_alloc_result fault_alloc_disarm(void)
{
    struct fault_alloc_result r = {count, failed, live, overflow};
    armed = 0;
    return r;
}
