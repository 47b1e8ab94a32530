/* str_index: a hash index from strings to ints, built once per batch and
 * looked up once per item: a statement's answer rows by id, a batch's
 * items by id. Matching n items against n rows by scanning was the top of
 * the worker's profile at a few thousand charges a batch (quadratic).
 *
 * Keys are not copied: they must outlive the index. A key may be added
 * more than once; its entries come back most recently added first. */
#ifndef CHARGED_STR_INDEX_H
#define CHARGED_STR_INDEX_H

#include <stddef.h>

typedef struct str_index str_index_t;

/* An index for up to `capacity` entries; NULL when out of memory. */
str_index_t *str_index_new(size_t capacity);
void str_index_free(str_index_t *ix);
/* Adds key -> value: 0, or -1 when the index is at its capacity. */
int str_index_add(str_index_t *ix, const char *key, int value);
/* The handle of key's most recent entry, or -1. */
int str_index_find(const str_index_t *ix, const char *key);
/* The handle of the entry of the same key added before `entry`, or -1. */
int str_index_next(const str_index_t *ix, int entry);
int str_index_value(const str_index_t *ix, int entry);

#endif
