/* charged_error: the one error contract of charged.
 *
 * A fallible call returns an enum charged_rc and fills a struct
 * charged_error its caller passes: one line to log (secrets redacted) and
 * the failing party's own code. Nothing travels beside them (no
 * thread-local, no errno). Each code says what the caller must do next,
 * never only what went wrong; a call that fails has changed nothing the
 * caller must undo. New codes are added before CHARGED_RC__COUNT; none is
 * ever removed or renumbered (logs and metrics name them). */
#ifndef CHARGED_ERROR_H
#define CHARGED_ERROR_H

#include <stddef.h>

enum charged_rc {
    CHARGED_OK = 0,
    CHARGED_RETRY,      /* a party is unavailable (connection, deadlock,
                           shutdown, timeout, no answer by the deadline) or it
                           was a bug of ours: repeat the whole call later,
                           after a back-off */
    CHARGED_BAD_ITEM,   /* one item of the call is refused: repeating it fails
                           again. Repeat item by item; the item refused alone
                           is dead-lettered */
    CHARGED_WAIT,       /* another session holds what the item needs: nothing
                           written; that item waits and is tried again later */
    CHARGED_NOT_FOUND,  /* no such thing (a status view's attempt, an order) */
    CHARGED_NOT_LEADER, /* another process holds the lead (the relay's lock) */
    CHARGED_REVIEW,     /* only a person can decide: the thing is put in the
                           review queue, never guessed */
    CHARGED_GIVE_UP,    /* repeating can never help (a bad configuration, an
                           input refused for good): stop and say why */
    CHARGED_RC__COUNT
};

/* Why a call failed. Every call empties it first; a failure fills it. */
struct charged_error {
    char message[512]; /* one line, secrets redacted, for the log */
    char code[16];     /* the failing party's code: a SQLSTATE, an HTTP
                          status; "" when it gave none */
};

/* The code's name for a log line: "ok", "retry", "bad_item", ... */
const char *charged_rc_name(enum charged_rc rc);

/* Empties both fields; err may be NULL. */
void charged_error_clear(struct charged_error *err);
/* A failure with a message and no code; err may be NULL. */
void charged_error_set(struct charged_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
