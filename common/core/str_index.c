#include "str_index.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "charged_assert.h"

struct str_entry {
    const char *key;
    uint64_t hash;
    int value;
    int next; /* the entry before it in its bucket, or -1 */
};

struct str_index {
    size_t capacity, n, mask;
    int *heads; /* a bucket's most recent entry, or -1 */
    struct str_entry *entries;
};

/* FNV-1a: ids are short, and this needs no seed (nothing here is an
 * attacker's choice of many colliding keys beyond one batch). */
static uint64_t hash_of(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ULL;
    return h;
}

str_index_t *str_index_new(size_t capacity)
{
    str_index_t *ix = calloc(1, sizeof(*ix));
    size_t buckets = 16;
    while (buckets < 2 * capacity)
        buckets *= 2;
    if (!ix || !(ix->heads = malloc(buckets * sizeof(*ix->heads))) ||
        !(ix->entries = calloc(capacity ? capacity : 1, sizeof(*ix->entries)))) {
        str_index_free(ix);
        return NULL;
    }
    for (size_t b = 0; b < buckets; b++)
        ix->heads[b] = -1;
    ix->capacity = capacity;
    ix->mask = buckets - 1;
    return ix;
}

void str_index_free(str_index_t *ix)
{
    if (!ix)
        return;
    free(ix->heads);
    free(ix->entries);
    free(ix);
}

int str_index_add(str_index_t *ix, const char *key, int value)
{
    CHARGED_ASSERT(ix != NULL && key != NULL);
    if (ix->n >= ix->capacity)
        return -1;
    uint64_t h = hash_of(key);
    size_t b = (size_t)h & ix->mask;
    int e = (int)ix->n++;
    ix->entries[e] =
        (struct str_entry){.key = key, .hash = h, .value = value, .next = ix->heads[b]};
    ix->heads[b] = e;
    return 0;
}

/* The first entry from `e` on (down its bucket) whose key is key. */
static int match_from(const str_index_t *ix, int e, uint64_t h, const char *key)
{
    for (; e >= 0; e = ix->entries[e].next)
        if (ix->entries[e].hash == h && !strcmp(ix->entries[e].key, key))
            return e;
    return -1;
}

int str_index_find(const str_index_t *ix, const char *key)
{
    CHARGED_ASSERT(ix != NULL && key != NULL);
    uint64_t h = hash_of(key);
    return match_from(ix, ix->heads[(size_t)h & ix->mask], h, key);
}

int str_index_next(const str_index_t *ix, int entry)
{
    CHARGED_ASSERT(ix != NULL && entry >= 0 && (size_t)entry < ix->n);
    const struct str_entry *e = &ix->entries[entry];
    return match_from(ix, e->next, e->hash, e->key);
}

int str_index_value(const str_index_t *ix, int entry)
{
    CHARGED_ASSERT(ix != NULL && entry >= 0 && (size_t)entry < ix->n);
    return ix->entries[entry].value;
}
