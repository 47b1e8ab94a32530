/* dlq_reader: reads the dead-letter topic and sends letters back, for
 * `chargectl dlq` and the console alike.
 *
 * Reading assigns partitions directly (no group membership) with automatic
 * commits off: it never commits an offset of any group and never removes
 * anything. It reads committed letters only (isolation.level
 * read_committed): a letter of an aborted transaction is not one, and a
 * transaction's markers, which take offsets, are skipped. Replay sends a
 * letter back to the command topic (CHARGE_COMMANDS_TOPIC, the only topic
 * it produces to) with its key, value and original headers plus
 * dlq.replayed_from and dlq.replayed_by;
 * the worker then treats it as any other command, so replaying twice
 * cannot charge twice. card_data_refused letters are never sent: their
 * card digits were masked.
 *
 *   dlq_reader_t *r = dlq_reader_new(cfg, &err);
 *   dlq_reader_read_all(r, &err);
 *   const struct dlq_letter **sel = dlq_reader_select(r, &filters, &n);
 *   ...
 *   free(sel);
 *   dlq_reader_free(r);
 */
#ifndef CHARGED_DLQ_READER_H
#define CHARGED_DLQ_READER_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "charged_error.h"
#include "config.h"

typedef struct dlq_reader dlq_reader_t;

/* Its calls answer in charged_error.h's codes:
 *   CHARGED_RETRY      Kafka did not answer, or the topic is missing; out of
 *                      memory; a send not acknowledged
 *   CHARGED_NOT_FOUND  no letter at that position
 *   CHARGED_BAD_ITEM   replay: a letter cannot be sent (no original topic,
 *                      one other than the command topic, or read by
 *                      dlq_reader_read_newest), or no actor; card_data_refused
 *                      letters named by position the caller refuses itself
 *                      (chargectl does), selected ones are skipped */

/* One dead letter as read; the reader owns it, at the same address until
 * dlq_reader_free (later reads do not move it). */
struct dlq_letter {
    int32_t partition;
    int64_t offset;
    int64_t timestamp_ms;
    const char *key, *value; /* NULL when absent; NUL after the bytes */
    size_t key_len, value_len;
    /* dlq.* headers (NULL when absent) */
    const char *reason, *error, *failed_at, *orig_topic, *orig_partition, *orig_offset;
    char attempt[64], order[64]; /* from the value, else the key; "" */
    int64_t failed_at_ms;        /* dlq.failed_at, else the timestamp */
};

/* What list and replay select: every given filter must match. */
struct dlq_filters {
    const char *reason;  /* a reason code; NULL: any */
    const char *attempt; /* payment_attempt_id; NULL: any */
    const char *order;   /* order_id; NULL: any */
    int have_since, have_until;
    int64_t since_ms, until_ms; /* failed at or after / before */
    int64_t limit;              /* the newest `limit`; 0: all */
};

/* A reader of CHARGE_DLQ_TOPIC on cfg's Kafka (cfg outlives it). NULL with
 * err when the client cannot be made (a bad setting). */
dlq_reader_t *dlq_reader_new(const config_t *cfg, struct charged_error *err);
void dlq_reader_free(dlq_reader_t *r);

/* Reads every letter now in the topic / the one at partition:offset,
 * adding to what was read (a letter read twice is there twice).
 * CHARGED_OK or another rc with err; NOT_FOUND names the position. A
 * read that gets nothing for 10 s is UNREACHABLE. */
enum charged_rc dlq_reader_read_all(dlq_reader_t *r, struct charged_error *err);
enum charged_rc dlq_reader_read_one(dlq_reader_t *r, int32_t partition, int64_t offset,
                                    struct charged_error *err);

/* Reads the letters in the newest max_per_partition offsets of each
 * partition (fewer letters when some are transaction markers), as
 * summaries: the ids are taken from the value, then the value is dropped
 * (value NULL, value_len 0), so memory is bounded by the headers and keys.
 * Such letters cannot be replayed (CHARGED_BAD_ITEM); read them by
 * position for that. */
enum charged_rc dlq_reader_read_newest(dlq_reader_t *r, int64_t max_per_partition,
                                       struct charged_error *err);

/* The offsets the partitions held at the last successful read_all or
 * read_newest (the letters in the topic, plus any transaction markers),
 * against which dlq_reader_count says how many were read; 0 before. */
int64_t dlq_reader_total(const dlq_reader_t *r);

/* Reads the letters at partitions[i]:offsets[i] (i < n), each partition's
 * positions in as few reads as they allow, adding to what was read; a
 * position named twice is read once. letters (NULL, or n of them) gets
 * letters[i], the letter at position i. Every position is checked before
 * any is read; one with no letter is CHARGED_NOT_FOUND with err naming
 * the first such in the order given (and letters not to be used). */
enum charged_rc dlq_reader_read_positions(dlq_reader_t *r, const int32_t *partitions,
                                          const int64_t *offsets, size_t n,
                                          const struct dlq_letter **letters,
                                          struct charged_error *err);

/* The letters read so far, in the order read. */
size_t dlq_reader_count(const dlq_reader_t *r);
const struct dlq_letter *dlq_reader_letter(const dlq_reader_t *r, size_t i);

/* The letters that pass f, oldest first (failed_at, then position), the
 * newest f->limit; a malloc'd array of *n (the caller frees it, not the
 * letters), NULL when out of memory. */
const struct dlq_letter **dlq_reader_select(const dlq_reader_t *r,
                                            const struct dlq_filters *f, size_t *n);

/* "PARTITION:OFFSET", digits only, each within its type. 0 / -1. */
int dlq_position_parse(const char *s, int32_t *partition, int64_t *offset);

/* The letter's one-line summary: position, partition, offset, failed_at,
 * reason, payment_attempt_id, order_id, error, original {topic, partition,
 * offset}; card numbers masked (card_data_mask_loose), as it is printed and
 * shown. */
json_t *dlq_letter_summary_json(const struct dlq_letter *l);
/* The whole letter: the summary plus timestamp_ms, headers ([name, value]
 * pairs), key and value (parsed JSON when it is JSON, a string, or
 * {"hex": ...}). With mask_card_digits, every card number in the key, the
 * value and the header values is masked (card_data_mask) first. */
json_t *dlq_letter_json(const dlq_reader_t *r, const struct dlq_letter *l,
                        int mask_card_digits);

/* One letter's replay: what was (or with dry_run would be) sent. */
struct dlq_replay_item {
    const struct dlq_letter *letter;
    int skipped;          /* card_data_refused: not sent */
    int sent;             /* acknowledged by Kafka */
    int32_t to_partition; /* where it landed, when sent */
    int64_t to_offset;
    char error[160]; /* why it was not sent, or "" */
};

/* Sends letters[0..n-1] back (dry_run: sends nothing), with dlq.replayed_by
 * = actor (NULL or "": CHARGED_BAD_ITEM). items[i] (n of them, filled
 * by the call) tells each one's fate. A letter without an original
 * topic, with one other than CHARGE_COMMANDS_TOPIC, or read as a summary
 * refuses the whole call before anything is sent (CHARGED_BAD_ITEM with
 * err naming the letter and the topic); a send not acknowledged within
 * 30 s is CHARGED_RETRY with the items saying which, as is a send
 * Kafka refused. */
enum charged_rc dlq_reader_replay(dlq_reader_t *r,
                                  const struct dlq_letter *const *letters, size_t n,
                                  const char *actor, int dry_run,
                                  struct dlq_replay_item *items,
                                  struct charged_error *err);

/* The message a replay of l sends: {"topic", "key", "value", "headers"},
 * card digits masked as in dlq_letter_json when mask_card_digits (for a
 * preview on screen). */
json_t *dlq_replay_message_json(const dlq_reader_t *r, const struct dlq_letter *l,
                                const char *actor, int mask_card_digits);

#endif
