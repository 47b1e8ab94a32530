/* outbox_store: the relay's side of the outbox table.
 *
 * Result events are written to the outbox with the state change that causes
 * them (attempt_store's one writer); the relay reads them in order, marks
 * them published once the broker acknowledged them, and deletes published
 * rows after a retention. One relay publishes at a time: leadership is a
 * session-level advisory lock, released by PostgreSQL the moment the
 * leader's connection ends, so a standby takes over within a poll. Why one:
 * events of one attempt must reach the topic in the order they were
 * written, which concurrent relays over SKIP LOCKED batches cannot promise. */
#ifndef CHARGED_OUTBOX_STORE_H
#define CHARGED_OUTBOX_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "store.h"

typedef struct outbox_store outbox_store_t;

/* Every fallible call returns an enum charged_rc (store.h) and fills err. */

/* Does not connect. NULL and err when database_url cannot be parsed. */
outbox_store_t *outbox_store_new(const char *database_url, struct charged_error *err);
void outbox_store_free(outbox_store_t *st);

/* CHARGED_OK when this process leads (it holds the lock, taking it if free),
 * CHARGED_NOT_LEADER when another does, anything else (with err) when the
 * database cannot be reached: the lock, if held, is gone with the
 * connection. */
enum charged_rc outbox_store_lead(outbox_store_t *st, struct charged_error *err);

/* One unpublished event. Strings are owned by the batch. There is no topic:
 * the relay publishes every event to its own. */
struct outbox_event {
    const char *event_id;
    const char *key;     /* the payment_attempt_id */
    const char *payload; /* JSON text */
};

typedef struct outbox_batch outbox_batch_t;

/* Up to max unpublished events in the order they were written (seq, drawn
 * after the attempt's row was locked, so an attempt's events come in the
 * order of its changes), leaving out every event of an attempt from its
 * first one that waits out a failure (mark_failed) on, in *out (NULL when
 * the call fails; an empty batch is not a failure). */
enum charged_rc outbox_store_fetch(outbox_store_t *st, size_t max, outbox_batch_t **out,
                                   struct charged_error *err);
size_t outbox_batch_count(const outbox_batch_t *b);
const struct outbox_event *outbox_batch_get(const outbox_batch_t *b, size_t i);
void outbox_batch_free(outbox_batch_t *b);

/* Marks the events published. */
enum charged_rc outbox_store_mark_published(outbox_store_t *st,
                                            const char *const *event_ids, size_t n,
                                            struct charged_error *err);

/* The broker refused these events, or did not acknowledge them, while it
 * took others: each is tried again after a back-off (1 s, doubling, at most
 * a minute), and the later events of its attempt wait with it. errors[i]
 * is stored as its last_error. */
enum charged_rc outbox_store_mark_failed(outbox_store_t *st,
                                         const char *const *event_ids,
                                         const char *const *errors, size_t n,
                                         struct charged_error *err);

/* Deletes rows published more than retention_ms ago; *deleted says how many. */
enum charged_rc outbox_store_purge(outbox_store_t *st, long long retention_ms,
                                   long long *deleted, struct charged_error *err);

/* How many rows wait, and the age in ms of the oldest (0 when none). */
enum charged_rc outbox_store_backlog(outbox_store_t *st, long long *count,
                                     long long *oldest_ms, struct charged_error *err);

#endif
