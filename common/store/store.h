/* store: what every store (attempt_store, outbox_store, webhook_store)
 * answers, so that a role decides what to do next from one vocabulary.
 *
 * Every fallible store call returns an enum store_rc and fills a struct
 * store_error the caller passes: the line to log and the SQLSTATE of the
 * statement that failed. Nothing travels beside them (no thread-local). A
 * call that fails has changed nothing the caller must undo. New codes are
 * added last; none is ever removed or renumbered. */
#ifndef CHARGED_STORE_H
#define CHARGED_STORE_H

enum store_rc {
    STORE_OK = 0,
    STORE_RETRY,      /* the database is unavailable (connection, deadlock,
                         shutdown, timeout) or it was a bug of ours: repeat
                         the whole call later, after a back-off */
    STORE_DATA,       /* the database refused a value of the call: repeating
                         it fails again; repeat item by item to find it */
    STORE_LOCKED,     /* another session's uncommitted change held the
                         statement past its lock_timeout: nothing written;
                         the item waits and is tried again later */
    STORE_NOT_FOUND,  /* no such row (a status view's attempt or order) */
    STORE_NOT_LEADER, /* another process holds the lead (the relay's lock) */
};

/* Why a call failed. Every call empties it first; a failure fills it. */
struct store_error {
    char message[512]; /* one line, secrets redacted, for the log */
    char sqlstate[6];  /* the failed statement's SQLSTATE; "" when the server
                          gave none (unreachable, or no statement failed) */
};

/* Empties both fields. */
void store_error_clear(struct store_error *err);
/* A failure that is not a statement's: the message, and no SQLSTATE. */
void store_error_set(struct store_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
