#include "psp_journal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

struct psp_journal {
    pthread_mutex_t lock;
    int fd;
    uint64_t written, synced; /* records appended, and of them made durable */
};

/* Replays the file's lines from the start; *good_end gets the offset after
 * the last line kept. 0, or -1 with errbuf. */
static int replay(int fd, psp_journal_replay_fn fn, void *ctx, off_t *good_end,
                  char *errbuf, size_t errbuf_size)
{
    int rfd = dup(fd), rc = -1;
    FILE *in = rfd >= 0 ? fdopen(rfd, "r") : NULL;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long long lineno = 0, bad_line = 0;

    *good_end = 0;
    if (!in) {
        snprintf(errbuf, errbuf_size, "cannot read it: %s", strerror(errno));
        if (rfd >= 0)
            close(rfd);
        return -1;
    }
    while ((n = getline(&line, &cap, in)) > 0) {
        lineno++;
        if (bad_line) {
            snprintf(errbuf, errbuf_size, "line %lld is no JSON record", bad_line);
            goto out;
        }
        json_error_t jerr;
        json_t *rec =
            line[n - 1] == '\n' ? json_loadb(line, (size_t)n, 0, &jerr) : NULL;
        if (!json_is_object(rec)) {
            /* Fatal unless it is the last line: a write torn by a kill. */
            json_decref(rec);
            bad_line = lineno;
            continue;
        }
        int refused = fn(ctx, rec);
        json_decref(rec);
        if (refused) {
            snprintf(errbuf, errbuf_size, "line %lld is a record psp-sim does not know",
                     lineno);
            goto out;
        }
        *good_end += n;
    }
    if (ferror(in)) {
        snprintf(errbuf, errbuf_size, "cannot read it: %s", strerror(errno));
        goto out;
    }
    if (bad_line)
        fprintf(stderr, "psp-sim: --state-file: dropped its torn last line %lld\n",
                bad_line);
    rc = 0;
out:
    free(line);
    fclose(in);
    return rc;
}

psp_journal_t *psp_journal_open(const char *path, psp_journal_replay_fn fn, void *ctx,
                                char *errbuf, size_t errbuf_size)
{
    psp_journal_t *j = calloc(1, sizeof(*j));
    off_t good_end;

    if (!j) {
        snprintf(errbuf, errbuf_size, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&j->lock, NULL);
    j->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (j->fd < 0) {
        snprintf(errbuf, errbuf_size, "cannot open it: %s", strerror(errno));
        goto fail;
    }
    if (replay(j->fd, fn, ctx, &good_end, errbuf, errbuf_size) != 0)
        goto fail;
    /* Appends start on a line of their own, after the last whole record. */
    if (ftruncate(j->fd, good_end) != 0 || fsync(j->fd) != 0) {
        snprintf(errbuf, errbuf_size, "cannot write it: %s", strerror(errno));
        goto fail;
    }
    return j;
fail:
    psp_journal_free(j);
    return NULL;
}

void psp_journal_free(psp_journal_t *j)
{
    if (!j)
        return;
    if (j->fd >= 0)
        close(j->fd);
    pthread_mutex_destroy(&j->lock);
    free(j);
}

/* A change the file cannot keep must not be answered: the books would lose
 * what a client was told. psp-sim stops at once, as a kill would, and the
 * request in flight gets no answer (a line cut short is dropped at the
 * next start). */
static void fail_stop(const char *why)
{
    fprintf(stderr, "psp-sim: --state-file: cannot keep a record (%s); exiting\n", why);
    _exit(1);
}

int psp_journal_append(psp_journal_t *j, json_t *record)
{
    char *text = record ? json_dumps(record, JSON_COMPACT) : NULL;
    size_t len = text ? strlen(text) : 0;
    char *line = text ? realloc(text, len + 2) : NULL;

    json_decref(record);
    if (!line)
        fail_stop("not serialisable");
    line[len++] = '\n';
    pthread_mutex_lock(&j->lock);
    /* One write(2) for the whole line, under the lock: lines never mix. */
    for (size_t done = 0; done < len;) {
        ssize_t n = write(j->fd, line + done, len - done);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            fail_stop(strerror(errno));
        done += (size_t)n;
    }
    j->written++;
    pthread_mutex_unlock(&j->lock);
    free(line);
    return 0;
}

void psp_journal_sync(psp_journal_t *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->lock);
    uint64_t target = j->written;
    int due = j->synced < target;
    pthread_mutex_unlock(&j->lock);
    /* Outside the lock: appends go on meanwhile, and one fsync covers every
     * line written before it, whoever asked. */
    if (!due)
        return;
    int failed = fsync(j->fd) != 0;
    pthread_mutex_lock(&j->lock);
    if (failed)
        fail_stop("fsync failed");
    if (j->synced < target)
        j->synced = target;
    pthread_mutex_unlock(&j->lock);
}
