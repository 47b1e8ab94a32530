/* psp_journal: psp-sim's --state-file, an append-only file of JSON records,
 * one a line, so that its books survive a restart (a SIGKILL included).
 *
 * What a record says is the store's business (psp_store_replay); this
 * module only keeps them: open replays the file, append writes a line with
 * one write(2), sync makes every line written so far durable (one fsync for
 * all of them: the answers waiting on it share it). Thread-safe. */
#ifndef PSP_JOURNAL_H
#define PSP_JOURNAL_H

#include <stddef.h>

#include <jansson.h>

typedef struct psp_journal psp_journal_t;

/* Called for each record of the file, in order; record is borrowed. Returns
 * 0, or -1 to refuse the file (an operation it does not know). */
typedef int (*psp_journal_replay_fn)(void *ctx, json_t *record);

/* Opens path (created when missing), replays its records through fn, then
 * appends after them. A last line that is cut short or is no JSON (a write
 * torn by a kill) is dropped, and cut from the file. NULL with errbuf on
 * failure: the file cannot be opened or written, or a line before the last
 * is no JSON, or fn refused a record. */
psp_journal_t *psp_journal_open(const char *path, psp_journal_replay_fn fn, void *ctx,
                                char *errbuf, size_t errbuf_size);
void psp_journal_free(psp_journal_t *j);

/* Appends record (taken) as one line; returns 0. When it cannot be
 * serialised (NULL, a string that is no UTF-8) or written, psp-sim exits 1
 * at once, as a kill would: no answer may tell of a change the file lost. */
int psp_journal_append(psp_journal_t *j, json_t *record);

/* Returns once every record appended before the call is on disk (fsync
 * failing: exits 1, as append does). NULL: no journal, nothing to do. */
void psp_journal_sync(psp_journal_t *j);

#endif
